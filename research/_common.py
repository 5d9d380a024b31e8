"""The research scripts' helpers: those of ``benchmarks/_common.py``, with their own results folder.

A research script runs as ``python research/NAME.py``, so ``from _common import ...`` finds this
module; it loads the benchmarks' helpers by path (one home for them) and points :data:`RESULTS`
at ``research/results``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location(
    "privmtl_benchmarks_common", _HERE.parent / "benchmarks" / "_common.py"
)
assert _spec is not None and _spec.loader is not None
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)

append_jsonl = _bench.append_jsonl
drop_options = _bench.drop_options
load_jsonl = _bench.load_jsonl
machine_info = _bench.machine_info
markdown_table = _bench.markdown_table
mean_std = _bench.mean_std
run_pmtl_seed = _bench.run_pmtl_seed
run_privmtl = _bench.run_privmtl
seeds_main = _bench.seeds_main
seeds_parser = _bench.seeds_parser

RESULTS = _HERE / "results"
"""Where the research scripts' logs, tables and plots are kept."""


def trained_once(m: int, seed: int, eps: float | None, q: int, **run: Any) -> dict[str, Any]:
    """One seeded ``run_pmtl`` of the synthetic federation with ``finetune="none"`` (``run``: its
    other options, e.g. ``method``, ``rounds``), its saved models loaded back, and what scoring
    them needs: ``out`` (the run's result), ``glob`` and ``pers`` (its global and personalized
    models), ``ds``, ``net`` and ``buffers`` (the data and the model of the run's seed) and
    ``seconds`` (the run and the loading)."""
    import tempfile
    import time

    from privmtl.data.registry import load_federated
    from privmtl.experiments.pmtl import run_pmtl
    from privmtl.federated.models import DEFAULT_MODEL, make_model
    from privmtl.federated.saved import load_models

    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        out = run_pmtl(
            num_clients=m, epsilon=eps, noise_source="seeded", seed=seed, finetune="none",
            save_models=tmp, show_progress=False, threads=1, clients_per_round=q, **run,
        )  # fmt: skip
        _, glob, pers = load_models(tmp)
    seconds = time.time() - t0
    ds = load_federated("synthetic", seed=seed, num_clients=m)
    net = make_model(DEFAULT_MODEL, ds, seed)
    buffers = {n: b.detach() for n, b in net.named_buffers()}
    return {"out": out, "glob": glob, "pers": pers, "ds": ds, "net": net, "buffers": buffers,
            "seconds": seconds}  # fmt: skip
