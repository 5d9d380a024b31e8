"""The research scripts' helpers: those of ``benchmarks/_common.py``, with their own results folder.

A research script runs as ``python research/NAME.py``, so ``from _common import ...`` finds this
module; it loads the benchmarks' helpers by path (one home for them) and points :data:`RESULTS`
at ``research/results``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
