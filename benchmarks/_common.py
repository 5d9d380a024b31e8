"""Shared helpers of the benchmark scripts: resumable JSONL logs, machine info, markdown tables."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from privmtl.io import append_jsonl as append_jsonl  # re-exported for the benchmark scripts
from privmtl.io import load_jsonl as load_jsonl

RESULTS = Path(__file__).resolve().parent / "results"


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    import torch

    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or "unknown",
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": np.__version__,
    }


def mean_std(values: Iterable[float]) -> tuple[float, float, int]:
    arr = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if arr.size == 0:
        return math.nan, math.nan, 0
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0, int(arr.size)


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def run_privmtl(args: list[str], what: str) -> tuple[dict[str, Any], float]:
    """``privmtl *args`` (which must print one JSON object) in a subprocess with one thread.

    Returns the JSON and the wall seconds; a failed run raises naming ``what``.
    """
    cmd = [sys.executable, "-c", "import sys; from privmtl.cli import main; sys.exit(main())"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout), time.perf_counter() - t0


def run_pmtl_seed(
    argv: list[str], seed: int, data_path: str | Path, what: str
) -> tuple[dict[str, Any], float]:
    """``privmtl pmtl *argv --seed seed --json --quiet --threads 1 --data-path data_path``
    (:func:`run_privmtl`): one seeded run of a benchmark's argument list."""
    return run_privmtl(
        ["pmtl", *argv, "--seed", str(seed), "--json", "--quiet", "--threads", "1",
         "--data-path", str(data_path)],
        what,
    )  # fmt: skip


def drop_options(argv: list[str], names: Iterable[str]) -> list[str]:
    """``argv`` without the options ``names`` (each with its value, when it takes one)."""
    names = set(names)
    out: list[str] = []
    i = 0
    while i < len(argv):
        takes_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        if argv[i] not in names:
            out += argv[i : i + 1 + takes_value]
        i += 1 + takes_value
    return out


def seeds_parser(description: str, seeds: str = "0,1,2") -> Any:
    """The command line of a resumable benchmark: ``--data-path``, ``--seeds``, ``--report``."""
    import argparse

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--data-path")
    p.add_argument("--seeds", default=seeds)
    p.add_argument("--report", action="store_true")
    return p


def seeds_main(parser: Any, run: Any, report: Any) -> None:
    """Parse ``parser``'s arguments, then print ``report()`` (``--report``) or ``run(args)``
    (which needs ``--data-path``)."""
    args = parser.parse_args()
    if args.report:
        print(report())
        return
    if not args.data_path:
        parser.error("--data-path is required to run")
    run(args)
