"""A fixed set of seeded runs of every method of both families gives the numbers it gave.

The numbers (accuracies, nMSE, ε, σ, ε per round) are committed in ``golden_results.json`` beside
this file, computed with one BLAS thread (numerical libraries split sums by thread count, and a
tuned or noisy fit can turn a last-bit difference into another choice); a refactoring must leave every one of them bit for bit (floats compared exactly). A
change that means to move them regenerates the file and says why in its commit:
``python tests/experiments/test_golden_runs.py --write``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

GOLDEN = Path(__file__).with_name("golden_results.json")

PMTL_METHODS = ("pmtl", "fedavg", "fedprox", "local", "joint-dp", "pp-sgd", "local-all", "fedrep")
MPMTL_METHODS = (
    "lowrank", "groupsparse", "lowrank-sparse", "stl-l2", "stl-l1", "mtl-trace", "mtl-l21",
    "mtrl", "average", "dp-mtrl", "dp-aggr",
)  # fmt: skip
PMTL_KEYS = (
    "test_accuracy", "mean_client_accuracy", "val_accuracy", "global_test_accuracy", "epsilon",
    "noise_std", "epsilon_per_round",
)  # fmt: skip
MPMTL_KEYS = ("nmse", "auc", "epsilon", "delta")


def _pmtl(method: str) -> dict[str, Any]:
    from privmtl.experiments.pmtl import run_pmtl

    out = run_pmtl(
        data="synthetic", num_clients=12, model="logreg", method=method, rounds=3,
        clients_per_round=6, epsilon=None if method == "local" else 2.0, noise_source="seeded",
        seed=0, show_progress=False, threads=1, baseline=False,
        shared_params=("linear.weight",) if method == "fedrep" else None,  # logreg: one layer
    )  # fmt: skip
    return {k: out[k] for k in PMTL_KEYS if k in out}


def _mpmtl(method: str) -> dict[str, Any]:
    from privmtl.experiments.mpmtl import run_mpmtl

    private = method in ("lowrank", "groupsparse", "lowrank-sparse", "dp-mtrl", "dp-aggr")
    out = run_mpmtl(
        data="synthetic-lowrank", method=method, epsilon=1.0 if private else None, tune=False,
        iterations=3, noise_source="seeded", seed=0,
    )  # fmt: skip
    return {k: out[k] for k in MPMTL_KEYS if k in out}


RUNS = {
    **{f"pmtl/{m}": (lambda m=m: _pmtl(m)) for m in PMTL_METHODS},
    **{f"mpmtl/{m}": (lambda m=m: _mpmtl(m)) for m in MPMTL_METHODS},
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_seeded_run_gives_its_committed_numbers(name):
    golden = json.loads(GOLDEN.read_text())
    assert name in golden, f"no committed numbers for {name}: regenerate {GOLDEN.name}"
    assert _one_thread(RUNS[name]) == golden[name]


def _one_thread(run: Any) -> dict[str, Any]:
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        return run()


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python tests/experiments/test_golden_runs.py --write")
    results = {name: _one_thread(run) for name, run in sorted(RUNS.items())}
    GOLDEN.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN} ({len(results)} runs)")
