"""The shape of the `ckptd` Python package (client/python/ckptd/): no import
cycle among its modules, and no module over MAX_LINES lines.

The import graph is read from the source with `ast` (nothing is imported):
every `import` / `from ... import` statement counts, the ones inside
functions too, since a lazy import that closes a cycle is still a cycle
(cluster.py once imported checkpoint.py inside discover_cluster while
checkpoint.py imported cluster.py at the top). `from . import name` is an
edge to the module `name` where there is one, else to the package's
`__init__` (a name defined there). Imports built at run time
(importlib.import_module, __import__) are not seen.
"""
import ast
import pathlib

PACKAGE_DIR = pathlib.Path(__file__).resolve().parents[2] / "client" / "python" / "ckptd"
MAX_LINES = 900


def package_modules(pkg_dir):
    """{dotted module name: path} of every .py file under pkg_dir; the
    package is named after its directory, `__init__.py` is the package."""
    pkg_dir = pathlib.Path(pkg_dir)
    out = {}
    for path in sorted(pkg_dir.rglob("*.py")):
        parts = [pkg_dir.name, *path.relative_to(pkg_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imported(node, module, is_package, modules):
    """The package modules one import statement of `module` names."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
        # `import pkg.a.b` runs pkg, pkg.a and pkg.a.b: the deepest is the edge.
        return {max((m for m in modules if n == m or n.startswith(m + ".")), key=len,
                    default=None) for n in names} - {None}
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        if node.level > 1:
            base = base[:-(node.level - 1)]
        base = ".".join(base + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    if base not in modules:
        return set()
    out = set()
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        out.add(sub if sub in modules else base)
    return out


def import_graph(pkg_dir):
    """{module: {imported package module: line of the first such import}}."""
    modules = package_modules(pkg_dir)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _imported(node, name, path.name == "__init__.py", modules):
                    if target != name:
                        edges[target] = min(edges.get(target, node.lineno), node.lineno)
        graph[name] = edges
    return graph


def strongly_connected(graph):
    """Tarjan's strongly connected components of `graph`, each a sorted list."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def find_cycles(pkg_dir):
    """One line per import cycle (strongly connected component of more than
    one module): a closed path through it with the file:line of each import,
    e.g. "ckptd.a -> ckptd.b (a.py:3) -> ckptd.a (b.py:12)"."""
    graph = import_graph(pkg_dir)
    modules = package_modules(pkg_dir)
    reports = []
    for comp in strongly_connected(graph):
        if len(comp) < 2:
            continue
        members, start = set(comp), comp[0]
        # The shortest path start -> ... -> start inside the component (BFS).
        prev, frontier, last = {start: None}, [start], None
        while frontier and last is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w == start:
                        last = v
                        break
                    if w in members and w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if last is not None:
                    break
            frontier = nxt
        back = []
        while last != start:
            back.append(last)
            last = prev[last]
        path = [start] + back[::-1] + [start]
        steps = [path[0]]
        for a, b in zip(path, path[1:]):
            steps.append(f"{b} ({modules[a].name}:{graph[a][b]})")
        reports.append(" -> ".join(steps) + f"   [component: {', '.join(comp)}]")
    return reports


def test_no_import_cycle_in_the_package():
    assert PACKAGE_DIR.is_dir(), PACKAGE_DIR
    graph = import_graph(PACKAGE_DIR)
    assert "ckptd.cluster" in graph and graph["ckptd"], graph   # the graph was read
    cycles = find_cycles(PACKAGE_DIR)
    assert not cycles, "import cycles in the ckptd package:\n" + "\n".join(cycles)


def test_every_module_is_short():
    modules = package_modules(PACKAGE_DIR)
    assert len(modules) > 5, modules
    long = {name: n for name, path in modules.items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by responsibility): {long}"


def _write_package(root, files):
    pkg = root / "pkg"
    pkg.mkdir()
    for name, text in files.items():
        (pkg / name).write_text(text)
    return pkg


def test_cycle_finder_sees_lazy_imports(tmp_path):
    """The checker itself: a cycle closed by an import inside a function is
    reported with both import lines; an acyclic module beside it is not."""
    pkg = _write_package(tmp_path, {
        "__init__.py": "from .a import run\n",
        "a.py": "import os\n\nfrom . import b\n\n\ndef run():\n    return b.f()\n",
        "b.py": "def f():\n    from .a import run\n    return run\n",
        "c.py": "from .b import f\nfrom pkg import a\n",
    })
    graph = import_graph(pkg)
    assert graph["pkg"] == {"pkg.a": 1}
    assert graph["pkg.a"] == {"pkg.b": 3}
    assert graph["pkg.b"] == {"pkg.a": 2}
    assert graph["pkg.c"] == {"pkg.b": 1, "pkg.a": 2}
    cycles = find_cycles(pkg)
    assert cycles == ["pkg.a -> pkg.b (a.py:3) -> pkg.a (b.py:2)   [component: pkg.a, pkg.b]"]


def test_cycle_finder_sees_a_module_reaching_back_into_the_package(tmp_path):
    """`from . import name` of a name that is not a module imports the
    package's __init__, which imports the module: a cycle of three."""
    pkg = _write_package(tmp_path, {
        "__init__.py": "VERSION = 1\nfrom .api import save\n",
        "api.py": "from ._impl import save\n",
        "_impl.py": "from . import VERSION\n\n\ndef save():\n    return VERSION\n",
    })
    cycles = find_cycles(pkg)
    assert len(cycles) == 1, cycles
    assert cycles[0].startswith("pkg -> pkg.api (__init__.py:2) -> pkg._impl (api.py:1) -> "
                                "pkg (_impl.py:1)"), cycles
