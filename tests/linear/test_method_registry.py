"""The linear methods are objects: the registry alone names them, the run reads their declarations."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import privmtl
from privmtl.exceptions import InvalidParameterError
from privmtl.linear.methods import (
    BUILTIN_LINEAR_METHODS,
    RUN_SETTINGS,
    LinearMethod,
    linear_method,
    register_linear_method,
)

SRC = Path(privmtl.__file__).parent
REGISTRY = Path("linear") / "methods.py"
NAMES = set(BUILTIN_LINEAR_METHODS)


def _strings(node: ast.AST) -> set[str]:
    return {
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel != REGISTRY:
            yield rel, ast.parse(path.read_text())


def test_no_module_level_table_names_a_linear_method_outside_the_registry():
    tables = (ast.Dict, ast.Tuple, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
    hits = [
        f"{rel}:{node.lineno}: {sorted(_strings(node.value) & NAMES)}"
        for rel, tree in _modules()
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        and isinstance(node.value, tables)
        and _strings(node.value) & NAMES
    ]
    assert hits == []


def test_no_method_name_is_compared_outside_the_registry():
    """A Compare counts when one side is a linear method name (a string constant or a tuple of
    them) and the other side's source mentions ``method`` or ``name``. (An estimator's
    ``penalty``, the structure of its algorithm, is not a method name.)"""
    hits = []
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            for i, side in enumerate(sides):
                literal = isinstance(side, ast.Constant | ast.Tuple | ast.List | ast.Set)
                if not (literal and _strings(side) & NAMES):
                    continue
                others = " ".join(ast.unparse(s) for j, s in enumerate(sides) if j != i)
                if "method" in others or "name" in others:
                    hits.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert hits == []


@pytest.mark.parametrize("name", sorted(NAMES))
def test_every_declared_setting_is_a_parameter_of_the_estimator(name):
    method = linear_method(name)
    assert set(method.settings) <= set(RUN_SETTINGS)
    assert set(method.settings) <= set(method.parameters())
    if method.default_iterations is not None:
        assert method.make().get_params()["iterations"] == method.default_iterations


def test_an_unknown_estimator_parameter_is_refused_by_name():
    from privmtl.experiments.mpmtl import run_mpmtl

    with pytest.raises(InvalidParameterError, match=r"extra_params.*'stl-l2'.*no_such"):
        run_mpmtl(data="synthetic-lowrank", method="stl-l2", tune="none",
                  extra_params={"no_such": 1})  # fmt: skip


def test_a_projection_asked_for_without_a_search_is_the_projection():
    """``final_step="projection"`` with no search runs the paper's projected output (its
    ``refit_lam=None`` reaches the estimator instead of being dropped as a None)."""
    from privmtl.experiments.mpmtl import run_mpmtl

    out = run_mpmtl(data="synthetic-lowrank", method="lowrank", epsilon=1.0, tune="none",
                    final_step="projection", noise_source="seeded", seed=0)  # fmt: skip
    assert out["final_step"] == "projection"
    assert out["params"]["refit_lam"] is None


class _Ridge(LinearMethod):
    name = "my-ridge"
    estimator = "privmtl.linear.stl:STLRidge"
    grid = [{"lam": [0.1, 1.0]}]  # noqa: RUF012


def test_a_registered_own_method_runs_and_its_declarations_are_read():
    from privmtl.experiments.mpmtl import run_mpmtl

    out = run_mpmtl(data="synthetic-lowrank", method=_Ridge, tune="covered", iterations=3)
    assert out["method"] == "my-ridge"
    assert out["tuned"] and np.isfinite(out["nmse"])
    assert out["params"]["lam"] in (0.1, 1.0)
    assert linear_method("my-ridge") is _Ridge


def test_an_own_method_may_not_take_a_builtin_name():
    class Clash(LinearMethod):
        name = "lowrank"
        estimator = "privmtl.linear.stl:STLRidge"

    with pytest.raises(InvalidParameterError, match="must not be one of privmtl's methods"):
        register_linear_method(Clash)
    with pytest.raises(InvalidParameterError, match="subclass of"):
        register_linear_method(object)
