"""Per-task intercepts of the linear models, measured on scikit-learn's diabetes (``results/diabetes_tasks.md``).

The table: the 442 patients of :func:`sklearn.datasets.load_diabetes` (``scaled=False``: raw
units, disease progression ``y`` with mean 152), split into 6 tasks by sex (2 values) x age
tercile (ages up to the 1/3 quantile, up to the 2/3 quantile, above), as a clinic might group its
patients. Features: the 9 columns other than sex (age stays a feature). Written to ``--csv``
(default ``$PRIVMTL_CACHE_DIR/diabetes-tasks.csv``, outside the repository).

For seeds 0-4, each run is ``privmtl mpmtl --data table --method stl-l2`` at its defaults (70/30
split per task, per-task standardization, per-task leave-one-out λ) through
:func:`privmtl.experiments.mpmtl.run_mpmtl`, compared with scikit-learn's ``RidgeCV`` (its
default alphas and efficient leave-one-out, ``fit_intercept=True``) fitted per task on the same
standardized training rows; the same ``stl-l2`` on the table with 152 subtracted from every
target; and ``stl-l2`` without the per-task intercepts (the models before intercepts were fitted:
the appended column of ones was penalized like any feature)::

    python benchmarks/diabetes_tasks.py
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from _common import RESULTS, machine_info, markdown_table, mean_std

import privmtl.experiments.mpmtl as mp

REPORT = RESULTS / "diabetes_tasks.md"
SUMMARY = RESULTS / "diabetes_tasks.json"
SEEDS = (0, 1, 2, 3, 4)
SHIFT = 152.0


def build_table(path: Path, shift: float = 0.0) -> Path:
    """Write the diabetes task table (see the module docstring), targets minus ``shift``."""
    from sklearn.datasets import load_diabetes

    frame = load_diabetes(as_frame=True, scaled=False).frame
    tercile = np.searchsorted(np.quantile(frame["age"], [1 / 3, 2 / 3]), frame["age"], side="left")
    frame.insert(
        0, "task", [f"sex{int(s)}-age{t}" for s, t in zip(frame["sex"], tercile, strict=True)]
    )
    frame = frame.drop(columns="sex").rename(columns={"target": "y"})
    frame["y"] = frame["y"] - shift
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    return path


def _stl(csv: Path, seed: int) -> dict[str, Any]:
    return mp.run_mpmtl(
        data="table",
        method="stl-l2",
        data_path=csv,
        task_column="task",
        target_column="y",
        seed=seed,
    )


def _ridgecv(csv: Path, seed: int) -> float:
    from sklearn.linear_model import RidgeCV

    from privmtl.linear.metrics import nmse

    train, test = mp.load_mpmtl_data(
        "table", data_path=csv, seed=seed, task_column="task", target_column="y"
    )
    preds = []
    for Xtr, ytr, Xte in zip(train.X, train.y, test.X, strict=True):
        preds.append(RidgeCV(fit_intercept=True).fit(Xtr, ytr).predict(Xte))
    return float(nmse(list(test.y), preds))


def main() -> None:
    default = Path(os.environ.get("PRIVMTL_CACHE_DIR", Path.home() / ".cache" / "privmtl"))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", type=Path, default=default / "diabetes-tasks.csv")
    args = p.parse_args()
    csv = build_table(args.csv)
    shifted = build_table(args.csv.with_name(args.csv.stem + "-shifted.csv"), SHIFT)
    rows = []
    for seed in SEEDS:
        ours = _stl(csv, seed)
        moved = _stl(shifted, seed)
        with mock.patch.object(
            mp, "target_offsets", lambda train, scaling: np.zeros(train.n_tasks)
        ):
            before = _stl(csv, seed)["nmse"]
            before_moved = _stl(shifted, seed)["nmse"]
        rows.append(
            {
                "seed": seed,
                "stl-l2": ours["nmse"],
                "stl-l2, targets - 152": moved["nmse"],
                "RidgeCV per task": _ridgecv(csv, seed),
                "stl-l2 without intercepts": before,
                "stl-l2 without intercepts, targets - 152": before_moved,
            }
        )
    cols = list(rows[0])[1:]
    means = {c: mean_std(r[c] for r in rows)[0] for c in cols}
    SUMMARY.write_text(
        json.dumps({"machine": machine_info(), "rows": rows, "mean": means}, indent=1) + "\n"
    )
    table = [[r["seed"], *(f"{r[c]:.4f}" for c in cols)] for r in rows]
    table.append(["mean", *(f"**{means[c]:.4f}**" for c in cols)])
    gap = means["stl-l2"] - means["RidgeCV per task"]
    text = "\n".join(
        [
            "# Linear models with per-task intercepts: diabetes split into 6 tasks",
            "",
            "`python benchmarks/diabetes_tasks.py` (the table and the runs are described in its "
            "docstring). Test nMSE (pooled MSE over the pooled target variance), 70/30 split of "
            "each task's rows by the seed.",
            "",
            markdown_table(["seed", *cols], table),
            "",
            f"`stl-l2` minus per-task `RidgeCV`: {gap:+.4f} nMSE (mean over seeds 0-4). Shifting "
            "every target by 152 changes `stl-l2`'s nMSE by at most "
            f"{max(abs(r['stl-l2'] - r['stl-l2, targets - 152']) for r in rows):.1e}.",
            "",
        ]
    )
    REPORT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
