"""Layers import downward only, the CLI defines no experiment, constants have one home."""

from __future__ import annotations

import ast
from pathlib import Path

import privmtl

SRC = Path(privmtl.__file__).parent


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        yield path.relative_to(SRC), ast.parse(path.read_text())


def _imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def test_only_the_cli_imports_the_cli():
    offenders = [
        str(rel)
        for rel, tree in _modules()
        # ``python -m privmtl`` (__main__.py) is the command itself: the top of the layers
        if rel.parts[0] not in ("cli", "__main__.py")
        and any(m.startswith("privmtl.cli") for m in _imports(tree))
    ]
    assert offenders == []


def test_cli_defines_no_experiment():
    runners = [
        f"{rel}:{node.name}"
        for rel, tree in _modules()
        if rel.parts[0] == "cli"
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and node.name.startswith("run_")
        and node.name != "run_cli"
    ]
    assert runners == []


def test_relations_declared_once():
    homes = [
        str(rel)
        for rel, tree in _modules()
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "RELATIONS" for t in node.targets)
    ]
    assert homes == ["privacy/guarantee.py"]
