#!/usr/bin/env python3
# Copyright 2026 The ckptd Authors.
"""Checks the structure of the tree (README "Layout", docs/durability.md):

  - no C++ include cycle anywhere in the tree (project headers only);
  - includes point down the data flow: each room (a top-level folder, or a
    folder of daemon/) includes only the rooms ROOM_DEPS allows it.
    service/ is the front door: nothing but daemon_main.cc includes it. No
    stage includes the save orchestrator (daemon/save/); the front door
    and the metrics room reach it only through its public facade
    (daemon/save/checkpoint_manager.h). A new edge between rooms is a
    decision: add it to ROOM_DEPS with the reason, or move the code;
  - no source file under LIMITED_DIRS over 900 lines, and no function
    there over 80 lines, except declarative tables (ALLOWED_LONG below);
  - no test source (tests/**/*.cc) over 1,000 lines.

Usage: scripts/check_structure.py [ROOT]   (exit 1 and one line per finding)
Also run by tests/python/test_code_structure.py.
"""

import os
import re
import sys

MAX_FILE_LINES = 900
MAX_FUNCTION_LINES = 80
MAX_TEST_FILE_LINES = 1000
# The folders whose files and functions are held to the limits above.
LIMITED_DIRS = ("daemon", "format", "client", "cli", "shm", "proto")
ORCHESTRATOR = "daemon/save"
ORCHESTRATOR_FACADE = "daemon/save/checkpoint_manager.h"
FRONT_DOOR = "daemon/service"
# Which rooms each room may include (besides itself). Rooms are top-level
# folders and the folders of daemon/; "daemon" is the daemon's root
# (daemon_main, config, options). A save flows service -> save (the
# orchestrator) -> staging -> plan -> write -> commit (-> cluster); a
# restore service -> restore -> commit/tier/arena. types/ holds the plain
# structs the stages hand each other; arena/ the arenas both paths reach.
ROOM_DEPS = {
    "common": set(),
    "format": {"common"},
    "shm": {"common"},
    "proto": {"common", "format"},
    "client": {"common", "format", "proto", "shm"},
    "cli": {"client", "common", "format"},
    "daemon": {"*"},  # daemon_main wires every room together
    "daemon/service": {"common", "format", "proto", "shm", "daemon/save", "daemon/restore"},
    "daemon/save": {"common", "format", "shm", "daemon", "daemon/types", "daemon/arena",
                    "daemon/staging", "daemon/plan", "daemon/write", "daemon/commit",
                    "daemon/cluster", "daemon/tier"},
    "daemon/types": {"format"},
    "daemon/arena": {"common", "shm", "daemon/types"},
    "daemon/staging": {"common", "format", "shm", "daemon/types"},
    # the coordinator's answer (cluster/cluster.h) is a plan's input
    "daemon/plan": {"common", "daemon/types", "daemon/cluster"},
    "daemon/write": {"common", "format", "daemon/types", "daemon/tier"},
    "daemon/commit": {"common", "format", "daemon/types"},
    # replicas of a node's share are held in the receiving daemon's memory
    # tier, and served to restores through its ShareSource interface
    "daemon/cluster": {"common", "format", "proto", "daemon/types", "daemon/commit",
                       "daemon/tier"},
    "daemon/restore": {"common", "format", "shm", "daemon/arena", "daemon/commit", "daemon/tier"},
    "daemon/tier": {"common", "shm"},
    # /metrics and /healthz read the orchestrators' queries
    "daemon/metrics": {"common", "daemon/save", "daemon/restore", "daemon/tier"},
}
# Declarative tables: one entry per option / metric, long by nature.
ALLOWED_LONG = {
    ("daemon/config.cc", "OptionSpecs"),
    ("daemon/metrics/daemon_metrics.cc", "DaemonMetrics::DaemonMetrics"),
    ("daemon/config.cc", "Specs"),
}
SOURCE_DIRS = ("common", "format", "shm", "proto", "client", "daemon", "cli", "tests", "bench")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(root):
    for top in SOURCE_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = [d for d in dirnames if not d.startswith(("build", "."))]
            for name in filenames:
                if name.endswith((".h", ".cc")):
                    path = os.path.join(dirpath, name)
                    yield os.path.relpath(path, root).replace(os.sep, "/")


def include_graph(root, files):
    graph = {}
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        graph[f] = [inc for inc in INCLUDE.findall(text) if os.path.exists(os.path.join(root, inc))]
    return graph


def find_cycles(graph):
    """Every elementary cycle found by DFS (one per back edge)."""
    cycles, state, stack = [], {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    sys.setrecursionlimit(10000)
    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def strip_code(text):
    """Comments, strings and char literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + (m.group(1) if m else "") + '"', i)
            end = n if end < 0 else end + len(m.group(1) if m else "") + 2
            out.append("\n" * text.count("\n", i, end))
            i = end
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(" ")
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def long_functions(text):
    """(name, first line, lines) of every function body, by brace matching.

    A block opened in namespace or class scope whose header has a '(' is a
    function; blocks inside functions (lambdas, loops) count toward it.
    """
    code = strip_code(text)
    found, stack, header_start, line = [], [], 0, 1
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
        elif c in ";{}":
            header = code[header_start:i]
            if c == "{":
                outer = stack[-1][0] if stack else "namespace"
                words = header.strip()
                if outer in ("namespace", "class"):
                    if re.search(r"\b(namespace|extern)\b", words) and "(" not in words:
                        kind = "namespace"
                    elif re.search(r"\b(class|struct|union|enum)\b", words) and "(" not in words:
                        kind = "class"
                    elif "(" in words and not words.endswith("="):
                        kind = "function"
                    else:
                        kind = "other"
                else:
                    kind = "other"
                name = ""
                if kind == "function":
                    m = re.search(r"([~\w:]+)\s*\([^()]*(\([^()]*\)[^()]*)*\)[^()]*$", words, re.S)
                    tail = words.split("(")[0].split()
                    name = m.group(1) if m else (tail[-1] if tail else "?")
                stack.append((kind, line - header.strip().count("\n"), name))
            elif c == "}" and stack:
                kind, start, name = stack.pop()
                if kind == "function":
                    found.append((name, start, line - start + 1))
            header_start = i + 1
    return found


def room(path):
    """The room of a source path: its top folder, or daemon/FOLDER."""
    parts = path.split("/")
    if parts[0] == "daemon":
        return "daemon/" + parts[1] if len(parts) > 2 else "daemon"
    return parts[0]


def include_problems(f, includes):
    problems = []
    here = room(f)
    allowed = ROOM_DEPS.get(here)
    if allowed is None or "*" in allowed:
        return problems
    for inc in includes:
        there = room(inc)
        if there == here or there not in ROOM_DEPS:
            continue
        if there not in allowed:
            problems.append(f"{f}: {here}/ may not include {there}/ ({inc})")
        elif there == ORCHESTRATOR and inc != ORCHESTRATOR_FACADE:
            problems.append(f"{f}: reaches into the orchestrator past its facade ({inc})")
    return problems


def size_problems(f, text):
    problems = []
    n = text.count("\n")
    if n > MAX_FILE_LINES:
        problems.append(f"{f}: {n} lines (at most {MAX_FILE_LINES})")
    for name, start, length in long_functions(text):
        short = name.split("::")[-1]
        if length > MAX_FUNCTION_LINES and not any(
                f == af and (name == an or short == an) for af, an in ALLOWED_LONG):
            problems.append(f"{f}:{start}: {name} is {length} lines "
                            f"(at most {MAX_FUNCTION_LINES})")
    return problems


def check(root):
    problems = []
    files = sorted(sources(root))
    graph = include_graph(root, files)
    for cycle in find_cycles(graph):
        problems.append("include cycle: " + " -> ".join(cycle))
    for f in files:
        top = f.split("/")[0]
        if top != "tests":
            problems += include_problems(f, graph[f])
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        if top in LIMITED_DIRS:
            problems += size_problems(f, text)
        elif top == "tests" and f.endswith(".cc") and text.count("\n") > MAX_TEST_FILE_LINES:
            problems.append(f"{f}: {text.count(chr(10))} lines (a test file: at most "
                            f"{MAX_TEST_FILE_LINES})")
    return problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    problems = check(os.path.abspath(root))
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} structure problem(s)", file=sys.stderr)
        return 1
    print("structure ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
