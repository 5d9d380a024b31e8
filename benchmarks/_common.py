"""Shared helpers of the benchmark scripts: resumable JSONL logs, machine info, markdown tables."""

from __future__ import annotations

import math
import os
import platform
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
