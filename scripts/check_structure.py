#!/usr/bin/env python3
# Copyright 2026 The ckptd Authors.
"""Checks the daemon's structure (README "Layout", docs/durability.md):

  - no C++ include cycle anywhere in the tree (project headers only);
  - no stage folder of the daemon (staging/, plan/, write/, commit/,
    cluster/) includes the orchestrator (checkpoint_manager*.h): stages hand
    back plain structs, only the orchestrator changes state; the front door
    (service/: the gRPC service and the arena socket) calls the
    orchestrator's public API (checkpoint_manager.h), never its inside;
  - no file under daemon/ over 900 lines;
  - no function under daemon/ over 80 lines, except declarative tables
    (ALLOWED_LONG below).

Usage: scripts/check_structure.py [ROOT]   (exit 1 and one line per finding)
Also run by tests/python/test_code_structure.py.
"""

import os
import re
import sys

MAX_FILE_LINES = 900
MAX_FUNCTION_LINES = 80
STAGES = ("staging", "plan", "write", "commit", "cluster")
ORCHESTRATOR_HEADERS = ("daemon/save/checkpoint_manager.h", "daemon/save/checkpoint_manager_impl.h")
FRONT_DOOR = "service"
# Declarative tables: one entry per option / metric, long by nature.
ALLOWED_LONG = {
    ("daemon/config.cc", "OptionSpecs"),
    ("daemon/metrics/daemon_metrics.cc", "DaemonMetrics::DaemonMetrics"),
    ("daemon/config.cc", "Specs"),
}
SOURCE_DIRS = ("common", "format", "shm", "client", "daemon", "cli", "tests", "bench")
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


def check(root):
    problems = []
    files = sorted(sources(root))
    graph = include_graph(root, files)
    for cycle in find_cycles(graph):
        problems.append("include cycle: " + " -> ".join(cycle))
    for f in files:
        parts = f.split("/")
        if parts[0] != "daemon":
            continue
        if len(parts) > 2 and parts[1] in STAGES:
            for inc in graph[f]:
                if inc in ORCHESTRATOR_HEADERS:
                    problems.append(f"{f}: a stage includes the orchestrator ({inc})")
        if len(parts) > 2 and parts[1] == FRONT_DOOR:
            for inc in graph[f]:
                if inc == ORCHESTRATOR_HEADERS[1]:
                    problems.append(f"{f}: the front door includes the orchestrator's inside ({inc})")
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        n = text.count("\n")
        if n > MAX_FILE_LINES:
            problems.append(f"{f}: {n} lines (at most {MAX_FILE_LINES})")
        if f.endswith(".cc") or f.endswith(".h"):
            for name, start, length in long_functions(text):
                short = name.split("::")[-1]
                if length > MAX_FUNCTION_LINES and not any(
                        f == af and (name == an or short == an) for af, an in ALLOWED_LONG):
                    problems.append(f"{f}:{start}: {name} is {length} lines "
                                    f"(at most {MAX_FUNCTION_LINES})")
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
