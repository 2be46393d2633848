# Copyright 2026 The ckptd Authors.
"""The tree's structure (README "Layout"): scripts/check_structure.py finds
no C++ include cycle, no include against the data flow (nothing below the
front door includes it, no stage includes the orchestrator, the front door
reaches the orchestrator only through its facade), no file over 900 lines
and no function over 80 in daemon/, format/, client/, cli/, shm/ and proto/
(declarative tables excepted), and no test file over 1,000 lines."""

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
    # An include cycle, includes against the data flow, long functions and
    # long files in each limited folder, and a long test file.
    write(root, "common/a.h", '#include "common/b.h"\n')
    write(root, "common/b.h", '#include "common/a.h"\n')
    write(root, "daemon/save/checkpoint_manager.h", "// orchestrator\n")
    write(root, "daemon/save/intake.h", "// orchestrator inside\n")
    write(root, "daemon/service/paths.h", "// front door\n")
    write(root, "daemon/staging/s.h", "// a stage\n")
    write(root, "daemon/write/w.cc", '#include "daemon/save/checkpoint_manager.h"\n')
    write(root, "daemon/commit/c.cc", '#include "daemon/service/paths.h"\n')
    write(root, "daemon/restore/r.cc", '#include "daemon/staging/s.h"\n')
    write(root, "daemon/service/s.cc", '#include "daemon/save/intake.h"\n'
          '#include "daemon/save/checkpoint_manager.h"\n')
    write(root, "format/f.cc", '#include "daemon/staging/s.h"\n')
    body = "\n".join(f"  x += {i};" for i in range(90))
    long_fn = "namespace n {\nint Long(int x) {\n" + body + "\n  return x;\n}\n}  // namespace n\n"
    for d in ("daemon/plan", "format/zip", "client", "cli"):
        write(root, f"{d}/p.cc", long_fn)
    write(root, "daemon/big.cc", "// line\n" * 901)
    write(root, "format/pickle/big.h", "// line\n" * 901)
    write(root, "tests/format/big_test.cc", "// line\n" * 1001)
    write(root, "tests/format/ok_test.cc", "// line\n" * 900 + long_fn)
    proc = run(root)
    out = proc.stdout
    assert proc.returncode == 1
    assert "include cycle: common/a.h -> common/b.h -> common/a.h" in out, out
    assert "daemon/write/w.cc: daemon/write/ may not include daemon/save/" in out, out
    assert "daemon/commit/c.cc: daemon/commit/ may not include daemon/service/" in out, out
    assert "daemon/restore/r.cc: daemon/restore/ may not include daemon/staging/" in out, out
    assert "daemon/service/s.cc: reaches into the orchestrator past its facade " \
        "(daemon/save/intake.h)" in out, out
    assert out.count("daemon/service/s.cc") == 1, out
    assert "format/f.cc: format/ may not include daemon/staging/" in out, out
    for d in ("daemon/plan", "format/zip", "client", "cli"):
        assert f"{d}/p.cc:2: Long is 93 lines" in out, out
    assert "daemon/big.cc: 901 lines" in out, out
    assert "format/pickle/big.h: 901 lines" in out, out
    assert "tests/format/big_test.cc: 1001 lines (a test file: at most 1000)" in out, out
    assert "ok_test" not in out, out
