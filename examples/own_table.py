"""Your own multi-task table (CSV or Parquet) through the command line, from Python.

The table has one row per example: a ``task`` column, numeric feature columns and a ``y`` target.
This script writes a small synthetic one and runs ``privmtl mpmtl --data table`` on it; on your
data, run the same command in a shell with ``--data-path yourfile.csv``.

Run: ``python examples/own_table.py`` (``PRIVMTL_EXAMPLE_SMALL=1`` for a quick version).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from privmtl.cli import main as privmtl

SMALL = os.environ.get("PRIVMTL_EXAMPLE_SMALL") == "1"


def write_table(path: Path, *, n_tasks: int, rows: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    shared = rng.normal(size=5)
    frames = []
    for t in range(n_tasks):
        X = rng.normal(size=(rows, 5))
        w = shared + 0.3 * rng.normal(size=5)
        y = X @ w + 0.1 * rng.normal(size=rows)
        frame = pd.DataFrame(X, columns=[f"x{j}" for j in range(5)])
        frame.insert(0, "task", f"site-{t}")
        frame["y"] = y
        frames.append(frame)
    pd.concat(frames).to_csv(path, index=False)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tasks.csv"
        write_table(path, n_tasks=10 if SMALL else 50, rows=40)
        args = ["mpmtl", "--data", "table", "--data-path", str(path), "--method", "lowrank"]
        args += ["--epsilon", "3", "--reproducible-noise"]  # seeded: a simulation
        if SMALL:
            args += ["--no-tune", "--iterations", "3"]
        return privmtl(args)


if __name__ == "__main__":
    raise SystemExit(main())
