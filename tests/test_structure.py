"""Sizes a newcomer can read: the engine module under 500 lines, no function of engine/, arena/ or
sim/ over 80 lines, no class there over 25 methods (its workbench base classes' methods counted)."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "workbench"
DIRS = ("engine", "arena", "sim")
MAX_FUNCTION, MAX_METHODS, MAX_ENGINE = 80, 25, 500


def _trees():
    for d in DIRS:
        for path in sorted((PKG / d).rglob("*.py")):
            yield path.relative_to(PKG.parent), ast.parse(path.read_text())


def _defs(node):
    return [b for b in node.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_the_engine_module_is_short():
    n = len((PKG / "engine" / "engine.py").read_text().splitlines())
    assert n < MAX_ENGINE, f"workbench/engine/engine.py has {n} lines; move a mechanism into a module of its own"


def test_no_long_function():
    long = [f"{path}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)" for path, tree in _trees()
            for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > MAX_FUNCTION]
    assert not long, "functions over 80 lines (split them into named steps):\n" + "\n".join(long)


def test_no_large_class():
    classes = {n.name: (path, n) for path, tree in _trees() for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}

    def methods(name, seen=()):
        if name not in classes or name in seen:
            return set()
        _, node = classes[name]
        own = {d.name for d in _defs(node)}
        for base in node.bases:
            if isinstance(base, ast.Name):
                own |= methods(base.id, seen + (name,))
        return own

    large = [f"{path}:{node.lineno} {name} ({len(methods(name))} methods)" for name, (path, node) in classes.items()
             if len(methods(name)) > MAX_METHODS]
    assert not large, "classes over 25 methods (give a part of their state a class of its own):\n" + "\n".join(large)


def test_the_checks_can_fail():
    tree = ast.parse("class A:\n" + "".join(f"    def m{i}(self):\n        pass\n" for i in range(MAX_METHODS + 1)))
    assert len(_defs(tree.body[0])) > MAX_METHODS
