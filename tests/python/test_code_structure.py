# Copyright 2026 The ckptd Authors.
"""The daemon's structure (README "Layout"): scripts/check_structure.py finds
no C++ include cycle, no stage including the orchestrator, no daemon file over
900 lines and no daemon function over 80 (declarative tables excepted)."""

import os
import subprocess
import sys
import textwrap

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "check_structure.py")


def run(root):
    return subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True,
                          timeout=120)


def test_the_tree_has_the_structure():
    proc = run(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "structure ok" in proc.stdout


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))


def test_the_checker_finds_each_kind_of_problem(tmp_path):
    root = str(tmp_path)
    # An include cycle, a stage including the orchestrator, a long function
    # and a long file.
    write(root, "common/a.h", '#include "common/b.h"\n')
    write(root, "common/b.h", '#include "common/a.h"\n')
    write(root, "daemon/save/checkpoint_manager.h", "// orchestrator\n")
    write(root, "daemon/write/w.cc", '#include "daemon/save/checkpoint_manager.h"\n')
    body = "\n".join(f"  x += {i};" for i in range(90))
    write(root, "daemon/plan/p.cc",
          "namespace n {\nint Long(int x) {\n" + body + "\n  return x;\n}\n}  // namespace n\n")
    write(root, "daemon/big.cc", "// line\n" * 901)
    proc = run(root)
    out = proc.stdout
    assert proc.returncode == 1
    assert "include cycle: common/a.h -> common/b.h -> common/a.h" in out, out
    assert "daemon/write/w.cc: a stage includes the orchestrator" in out, out
    assert "daemon/plan/p.cc:2: Long is 93 lines" in out, out
    assert "daemon/big.cc: 901 lines" in out, out
