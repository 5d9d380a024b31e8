"""The runner runs a method object: the trainer round by round, a whole-run loop, or a user
method's own ``fit``; the method classes import no backend."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import privmtl
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.config import TrainConfig
from privmtl.federated.methods import BUILTIN_METHODS, PPSGD, Clusters, JointDP, Method
from privmtl.federated.methods.pmtl import PMTL
from privmtl.federated.runner import fit, runs_rounds

WHOLE_RUNS = {"joint-dp", "pp-sgd", "local-all", "clusters"}


def test_the_whole_run_methods_are_the_ones_the_trainer_does_not_run_as_they_are():
    cfg = TrainConfig()
    rounds = {name for name, cls in BUILTIN_METHODS.items() if runs_rounds(cls(cfg))}
    assert rounds == set(BUILTIN_METHODS) - WHOLE_RUNS


def test_a_subclass_runs_its_parents_loop():
    class Blocks(JointDP):
        name = "blocks-of-my-own"

    assert not runs_rounds(Blocks(TrainConfig()))


def test_a_method_with_its_own_loop_is_run_by_it():
    class OwnLoop(PMTL):
        name = "own-loop"

        def fit(self, dataset, model, **run):
            return ("ran", dataset, model, run)

    method = OwnLoop(TrainConfig())
    assert not runs_rounds(method)
    assert fit(method, "data", "model", rounds=2) == ("ran", "data", "model", {"rounds": 2})


def test_clusters_need_their_clusters():
    with pytest.raises(InvalidParameterError, match="'clusters' parameter is required"):
        fit(Clusters(TrainConfig()), None, None)


def test_the_methods_package_imports_no_backend():
    """The method objects are the lowest floor of the engine: nothing in ``federated/methods``
    imports the trainer, the whole runs or the runner, not even inside a function."""
    above = (
        "privmtl.federated.trainer",
        "privmtl.federated.baselines",
        "privmtl.federated.clusters",
        "privmtl.federated.engine",
        "privmtl.federated.end_of_run",
        "privmtl.federated.runner",
    )
    root = Path(privmtl.__file__).parent / "federated" / "methods"
    found = [
        f"{path.name}: {node.module}"
        for path in sorted(root.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(above)
    ]
    assert found == []
    assert not hasattr(Method, "fit") and not hasattr(PPSGD, "fit")
