"""Imports run one way: a module imports its own level and the levels below it, never above,
and no imports run in a circle.

Every import is read with ``ast``: top-level ones, ones inside functions, relative ones
(``from . import x`` names the submodule ``x`` where there is one, else the package). Within a
level, the packages (and top modules) of that level may import each other, but one way only;
the modules of one package likewise. The notebooks (jupytext .py and the .ipynb code cells) sit
above everything and import no ``workbench.cli*`` module. ``train/`` stands apart: it may import
the bottom level, and no module outside ``train/`` imports it.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "workbench"

# Bottom to top. An entry names a module or a package of workbench/ ("cli*": every cli module).
# The bottom holds what every level may use: model plumbing, hook points, family facts, sizes,
# settings, file writes, the shipped data's paths.
LEVELS = [
    ("plumbing", ["__init__", "arrays", "model", "hooks", "randmodel", "fsutil", "checks", "families", "sizes", "config",
                  "data", "cuda"]),
    ("store", ["store"]),
    ("io", ["io"]),
    ("arena", ["arena"]),
    ("routing", ["routing"]),
    ("engine", ["engine"]),
    ("trace", ["trace"]),
    ("sim", ["sim"]),  # the request stream, replay and virtual time of a trace
    ("analysis", ["analysis"]),  # tables from traces; it uses sim (bounds and the ledger replay policies)
    ("viz", ["viz"]),
    ("report and cli", ["report", "generate", "demo", "cli*"]),
]
TRAIN = "train"
NOTEBOOKS = len(LEVELS)  # above every level

# Import circles still allowed, each the set of its modules (none: keep it that way).
KNOWN_CYCLES: set = set()


def level_of(module: str) -> int | None:
    """Level of a dotted ``workbench.…`` module; None for train/ (apart)."""
    parts = module.split(".")[1:] or ["__init__"]
    head = parts[0]
    if head == TRAIN:
        return None
    for i, (_, names) in enumerate(LEVELS):
        for name in names:
            if head == name or (name.endswith("*") and head.startswith(name[:-1])):
                return i
    raise AssertionError(f"module {module} is in no level: add it to LEVELS in tests/test_imports.py")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(dotted: str) -> bool:
    p = ROOT.joinpath(*dotted.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def imported(tree: ast.AST, module: str, is_package: bool):
    """(line, imported workbench module) for every import in ``tree``, nested ones included."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            subs = {f"{target}.{a.name}" for a in node.names}  # ``from pkg import submodule``
            for name in sorted({s if is_module(s) else target for s in subs}):
                yield node.lineno, name


def workbench_imports(tree, module="notebook", is_package=False):
    for line, target in imported(tree, module, is_package):
        if target == "workbench" or target.startswith("workbench."):
            yield line, target


def import_graph() -> dict[str, dict[str, str]]:
    """module -> {imported workbench module: "path:line" of its first import}, for every module
    of workbench/ (train/ included); imports of names that are no module of the tree are left out."""
    paths = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}
    graph = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(), str(path))
        edges = graph[module] = {}
        for line, target in workbench_imports(tree, module, path.name == "__init__.py"):
            if target in paths and target != module:
                edges.setdefault(target, f"{path.relative_to(ROOT)}:{line}")
    return graph


def cycles(graph: dict[str, dict]) -> list[list[str]]:
    """The import circles of ``graph``: each strongly connected component of two or more modules,
    sorted (Tarjan's algorithm)."""
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
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def describe(graph: dict[str, dict[str, str]], comp: list[str]) -> str:
    """One circle through ``comp``, from its first module back to it, each arrow with where it is
    written; then the component's other modules, if any."""
    start, inside = comp[0], set(comp)
    came = {start: None}
    queue = [start]
    while queue:  # breadth first: the shortest way from start back to start
        v = queue.pop(0)
        for w in sorted(graph[v]):
            if w == start:
                path = [v]
                while came[path[-1]] is not None:
                    path.append(came[path[-1]])
                path = path[::-1] + [start]
                arrows = " -> ".join(f"{b} ({graph[a][b]})" for a, b in zip(path, path[1:]))
                rest = sorted(inside - set(path))
                return f"{start} -> {arrows}" + (f"; also in this circle: {', '.join(rest)}" if rest else "")
            if w in inside and w not in came:
                came[w] = v
                queue.append(w)
    raise AssertionError(f"{comp} is no circle")


def test_no_import_cycles():
    graph = import_graph()
    known = {frozenset(c) for c in KNOWN_CYCLES}
    bad = [describe(graph, comp) for comp in cycles(graph) if frozenset(comp) not in known]
    assert not bad, ("import circles (move the shared piece into a module both import, or let one side "
                     "import the other only):\n" + "\n".join(bad))


def test_known_cycles_are_still_there():
    found = {frozenset(comp) for comp in cycles(import_graph())}
    gone = [c for c in sorted(KNOWN_CYCLES) if frozenset(c) not in found]
    assert not gone, f"no longer a circle (delete it from KNOWN_CYCLES in tests/test_imports.py): {gone}"


def unit_of(module: str) -> str:
    """The package or top module of workbench/ that ``module`` belongs to (its LEVELS entry)."""
    return (module.split(".")[1:] or ["__init__"])[0]


def test_packages_of_one_level_import_each_other_one_way():
    graph = import_graph()
    units: dict[str, dict[str, str]] = {}  # unit -> {unit of the same level it imports: where}
    for module, edges in graph.items():
        mine = unit_of(module)
        units.setdefault(mine, {})
        for target, where in edges.items():
            theirs = unit_of(target)
            if theirs != mine and level_of(module) is not None and level_of(module) == level_of(target):
                units[mine].setdefault(theirs, where)
    bad = [describe(units, comp) for comp in cycles(units)]
    assert not bad, "packages of one level import each other both ways:\n" + "\n".join(bad)


def test_cycle_finder_catches_a_cycle():
    graph = {"a": {"b": "a.py:1"}, "b": {"c": "b.py:2", "d": "b.py:3"}, "c": {"a": "c.py:4"}, "d": {"b": "d.py:5"},
             "e": {"a": "e.py:6"}}
    assert cycles(graph) == [["a", "b", "c", "d"]]
    assert describe(graph, ["a", "b", "c", "d"]) == "a -> b (a.py:1) -> c (b.py:2) -> a (c.py:4); also in this circle: d"
    assert cycles({"a": {"b": ""}, "b": {}}) == []
    # ``from . import x`` names the submodule x, else the package; a lazy import inside a function counts
    tree = ast.parse("def f():\n    from . import pack, not_a_module\n")
    assert list(workbench_imports(tree, "workbench.store.cache", False)) == [(2, "workbench.store"), (2, "workbench.store.pack")]
    assert "workbench.store.pack" in import_graph()["workbench.store.cache"]  # resolve_store's lazy import


def test_every_module_imports_its_own_level_and_below():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        module = module_name(path)
        mine = level_of(module)
        tree = ast.parse(path.read_text(), str(path))
        for line, target in workbench_imports(tree, module, path.name == "__init__.py"):
            theirs = level_of(target)
            where = f"{path.relative_to(ROOT)}:{line}"
            if mine is None:  # train/: itself and the bottom level only
                if theirs not in (None, 0):
                    bad.append(f"{where} imports {target}: train/ may import only the bottom level")
            elif theirs is None:
                bad.append(f"{where} imports {target}: nothing outside train/ imports train/")
            elif theirs > mine:
                bad.append(f"{where} imports {target} ({LEVELS[theirs][0]}), above its level ({LEVELS[mine][0]})")
    assert not bad, "imports that run back up:\n" + "\n".join(bad)


def notebook_sources():
    for path in sorted((ROOT / "notebooks").glob("*.py")):
        yield path, [(1, path.read_text())]
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        yield path, [(i, "".join(c["source"])) for i, c in enumerate(cells, 1) if c["cell_type"] == "code"]


def test_notebooks_import_no_cli_module():
    bad, seen = [], 0
    for path, cells in notebook_sources():
        for cell, src in cells:
            lines = [line for line in src.splitlines() if not line.lstrip().startswith(("%", "!"))]
            tree = ast.parse("\n".join(lines), str(path))
            for line, target in workbench_imports(tree):
                seen += 1
                assert level_of(target) is not None, f"{path.name}: notebooks do not import train/ ({target})"
                if target.split(".")[1].startswith("cli"):
                    where = f"{path.relative_to(ROOT)}:{line}" if path.suffix == ".py" else f"{path.name} cell {cell} line {line}"
                    bad.append(f"{where} imports {target}")
    assert seen, "no notebook imports were found: the notebook reader is broken"
    assert not bad, "notebooks import cli modules (use the library module the CLI uses):\n" + "\n".join(bad)


def test_level_table_catches_an_upward_import():
    tree = ast.parse("def f():\n    from ..engine.engine import Engine\n")
    (line, target), = workbench_imports(tree, "workbench.store.pack", False)
    assert (line, target) == (2, "workbench.engine.engine")
    assert level_of(target) > level_of("workbench.store.pack")
