"""Imports run one way: a module imports its own level and the levels below it, never above.

Every import is read with ``ast``: top-level ones, ones inside functions, relative ones.
The notebooks (jupytext .py and the .ipynb code cells) sit above everything and import no
``workbench.cli*`` module. ``train/`` stands apart: it may import the bottom level, and no
module outside ``train/`` imports it.
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
    ("analysis and sim", ["analysis", "sim"]),
    ("viz", ["viz"]),
    ("report and cli", ["report", "generate", "cli*"]),
]
TRAIN = "train"
NOTEBOOKS = len(LEVELS)  # above every level


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
