"""Feature scaling of a federated table, measured on scikit-learn's digits (``results/digits_scaling.md``).

The table: the 1 797 8x8 digit images of :func:`sklearn.datasets.load_digits` (64 pixel columns
``p0`` .. ``p63``, values 0..16, and ``label``) dealt to 20 label-skewed clients. **Skew rule**: for
every digit class, its rows are shuffled and cut among the 20 clients in proportions drawn from
Dirichlet(α, ..., α) (one draw per class; ``--alpha``, 0.5 by default, 0.1 for a stronger skew),
with ``numpy.random.default_rng(--table-seed)``; the whole deal is redrawn until every client holds
at least 30 rows. A client thus sees a few digits
often and others rarely or never, and many pixel columns barely vary on its training rows. The
table is written to ``--csv`` (default ``$PRIVMTL_CACHE_DIR/digits-20-clients.csv``, outside the
repository) and every run reads it as any user's table would (``load_federated_table``).

Every run is :func:`privmtl.experiments.pmtl.run_pmtl` at the CLI's defaults (``--data table
--model logreg --epsilon 2``), except ``noise_source="seeded"`` so that every number can be
reproduced; the comparison is (PMTL, private FedAvg, local-all) x scalings x seeds 0-2:

    python benchmarks/digits_table.py              # runs what the log lacks, then writes the report
    python benchmarks/digits_table.py --report     # the report only
    privmtl pmtl --data table --data-path ~/.cache/privmtl/digits-20-clients.csv \\
        --client-column client --label-column label --model logreg --epsilon 2 --scaling none

Variants other than the CLI's ``--scaling`` values are this script's own (they patch the table
loader's per-client transform; each still reads only the client's own training rows): the clip
bound of ``per-client-clipped`` at 5 and 10 instead of :data:`SCALING_CLIP` (3), and the
alternatives tried first (``EXPLORE``), run at seed 0 for PMTL only and α = 0.5.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from _common import RESULTS, append_jsonl, load_jsonl, machine_info, markdown_table, mean_std

import privmtl.data.federated_table as table
from privmtl.data.multitask import standardization

LOG = RESULTS / "digits_scaling.jsonl"  # one row per run, its table's α under "alpha"
REPORT = RESULTS / "digits_scaling.md"
SUMMARY = RESULTS / "digits_scaling.json"
N_CLIENTS = 20
MIN_ROWS = 30
METHODS = ("pmtl", "fedavg", "local-all")
SEEDS = (0, 1, 2)

Transform = Callable[[np.ndarray], np.ndarray]


def build_table(path: Path, alpha: float, seed: int = 0) -> Path:
    """Write the 20-client digits table (see the module docstring for the skew rule)."""
    import pandas as pd
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(seed)
    client = np.empty(len(y), dtype=int)
    while True:
        for c in range(10):
            idx = rng.permutation(np.flatnonzero(y == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(N_CLIENTS, alpha)))[:-1] * len(idx)).astype(int)
            for k, part in enumerate(np.split(idx, cuts)):
                client[part] = k
        if np.bincount(client, minlength=N_CLIENTS).min() >= MIN_ROWS:
            break
    frame = pd.DataFrame(X, columns=[f"p{j}" for j in range(X.shape[1])])
    frame.insert(0, "client", [f"c{k:02d}" for k in client])
    frame["label"] = y
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    return path


# ---- this script's own variants (each fits on one client's training rows only) ----


def _clip_bound(bound: float) -> Callable[[np.ndarray, str], Transform]:
    def fit(x: np.ndarray, scaling: str) -> Transform:
        mean, scale = standardization(x)
        return lambda z: np.clip((z - mean) / scale, -bound, bound)

    return fit


def _train_range(x: np.ndarray, scaling: str) -> Transform:
    """Clip each raw column to the client's training range, then standardize."""
    mean, scale = standardization(x)
    lo, hi = x.min(0), x.max(0)
    return lambda z: (np.clip(z, lo, hi) - mean) / scale


def _range_floor(x: np.ndarray, scaling: str) -> Transform:
    """Standard deviation floored at a quarter of the column's training range."""
    mean, scale = standardization(x)
    span = x.max(0) - x.min(0)
    scale = np.where(span > 0, np.maximum(scale, span / 4), scale)
    return lambda z: (z - mean) / scale


def _sparse_unscaled(x: np.ndarray, scaling: str) -> Transform:
    """Columns where one value fills >= 90% of the training rows are left as they are."""
    mean, scale = standardization(x)
    mode = np.array([np.unique(col, return_counts=True)[1].max() / len(col) for col in x.T])
    keep = mode >= 0.9
    mean, scale = np.where(keep, 0.0, mean), np.where(keep, 1.0, scale)
    return lambda z: (z - mean) / scale


def _max_abs(x: np.ndarray, scaling: str) -> Transform:
    """Each column divided by its largest training magnitude (no centring)."""
    s = np.abs(x).max(0)
    s = np.where(s > 0, s, 1.0)
    return lambda z: z / s


def _scale_only(x: np.ndarray, scaling: str) -> Transform:
    """Divided by the training standard deviation, not centred."""
    _, scale = standardization(x)
    return lambda z: z / scale


#: variant -> (the --scaling value, or None with the patched transform)
VARIANTS: dict[str, tuple[str, Callable[[np.ndarray, str], Transform] | None]] = {
    "none": ("none", None),
    "per-client": ("per-client", None),
    "per-client-clipped (±3, the default)": ("per-client-clipped", None),
    "per-client-clipped at ±5": ("per-client", _clip_bound(5.0)),
    "per-client-clipped at ±10": ("per-client", _clip_bound(10.0)),
}
DEFAULT_LABEL = "per-client-clipped (±3, the default)"
EXPLORE: dict[str, tuple[str, Callable[[np.ndarray, str], Transform] | None]] = {
    "raw values clipped to the training range, then standardized": ("per-client", _train_range),
    "std floored at range/4": ("per-client", _range_floor),
    "columns >= 90% one value left unscaled": ("per-client", _sparse_unscaled),
    "max-abs (no centring)": ("per-client", _max_abs),
    "std only (no centring)": ("per-client", _scale_only),
}


@contextmanager
def _patched(fit: Callable[[np.ndarray, str], Transform] | None) -> Iterator[None]:
    original = table.client_scaling
    if fit is not None:
        table.client_scaling = lambda x, scaling: fit(np.asarray(x, np.float64), scaling)  # type: ignore[assignment]
    try:
        yield
    finally:
        table.client_scaling = original


def _run(
    csv: Path, alpha: float, variant: str, spec: tuple[str, Any], method: str, seed: int
) -> dict[str, Any]:
    from privmtl.experiments.pmtl import run_pmtl

    scaling, fit = spec
    with _patched(fit):
        out = run_pmtl(
            data="table", data_path=csv, client_column="client", label_column="label",
            model="logreg", method=method, epsilon=2.0, seed=seed, scaling=scaling,
            noise_source="seeded", show_progress=False, threads=1,
        )  # fmt: skip
    return {
        "variant": variant, "scaling": scaling, "method": method, "seed": seed,
        "test_accuracy": out["test_accuracy"], "global_test_accuracy": out.get("global_test_accuracy"),
        "epsilon": out["epsilon"], "delta": out["delta"], "covered": out.get("covered"),
        "alpha": alpha,
    }  # fmt: skip


def run_all(csv: Path, alpha: float) -> None:
    done = {(r["alpha"], r["variant"], r["method"], r["seed"]) for r in load_jsonl(LOG)}
    jobs = [(v, s, m, seed) for v, s in VARIANTS.items() for m in METHODS for seed in SEEDS]
    if alpha == 0.5:
        jobs += [(v, s, "pmtl", 0) for v, s in EXPLORE.items()]
    for variant, spec, method, seed in jobs:
        if (alpha, variant, method, seed) in done:
            continue
        row = _run(csv, alpha, variant, spec, method, seed)
        print(json.dumps(row), flush=True)
        append_jsonl(LOG, row)


def _table(rows: list[dict[str, Any]], summary: dict[str, Any]) -> list[str]:
    acc: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        acc.setdefault((r["variant"], r["method"]), []).append(r["test_accuracy"])
    table_rows = []
    for variant in [*VARIANTS, *EXPLORE]:
        if not any((variant, m) in acc for m in METHODS):
            continue
        cells: list[Any] = [variant]
        for method in METHODS:
            vals = acc.get((variant, method), [])
            mean, _std, n = mean_std(vals)
            summary.setdefault(variant, {})[method] = {"mean": mean, "n": n, "values": vals}
            cells.append(
                "–" if n == 0 else " / ".join(f"{v:.3f}" for v in vals) + f" (mean {mean:.3f})"
            )
        table_rows.append(cells)
    best = {m: max(summary[v][m]["mean"] for v in ("none", "per-client")) for m in METHODS}
    default = summary[DEFAULT_LABEL]
    gaps = {m: default[m]["mean"] - best[m] for m in METHODS}
    summary["default_minus_best_of_none_and_per_client"] = gaps
    gap_text = ", ".join(f"{m}: {100 * g:+.1f} points" for m, g in gaps.items())
    return [
        markdown_table(["scaling", *METHODS], table_rows),
        "",
        f"Default ({DEFAULT_LABEL}) minus the best of `none` and `per-client` (3-seed means): "
        f"{gap_text}.",
        "",
    ]


def report() -> str:
    rows = load_jsonl(LOG)
    summary: dict[str, Any] = {"machine": machine_info(), "rows": rows, "mean": {}}
    text = [
        "# Feature scaling of a federated table: digits, 20 label-skewed clients",
        "",
        "`python benchmarks/digits_table.py --alpha A` (the table, its skew rule and the exact runs "
        "are in the script's docstring; every row of `digits_scaling.jsonl` is one run). Logistic "
        "regression, ε = 2, δ at the default, every other option at the CLI's default, seeded "
        "noise. Test accuracy pooled over the clients' test rows, seeds 0 / 1 / 2 (the seed also "
        "draws each client's train/validation/test split). Every scaling reads only the client's "
        "own training split.",
        "",
        "At ε = 2 with 20 clients the released models are weak (the billboard's own test accuracy "
        "is `global_test_accuracy` in the log), and `--finetune auto` lets every client keep its "
        "best candidate on its own validation split, local training included: PMTL, private FedAvg "
        "and local-all then mostly end with the same per-client models, hence equal columns.",
        "",
    ]
    for alpha in sorted({r["alpha"] for r in rows}, reverse=True):
        text += [f"## α = {alpha:g}", ""]
        text += _table(
            [r for r in rows if r["alpha"] == alpha], summary["mean"].setdefault(str(alpha), {})
        )
    text += [
        "Variants below the clip rows were tried first, at seed 0, for PMTL only, at α = 0.5. The "
        "clip at ±3 was chosen as the default: the best 3-seed mean of the clip bounds for every "
        "method at α = 0.5 (and again at α = 0.1, run after the choice), and a bound on every "
        "feature whatever its unit.",
        "",
        "Neither table reproduces the split first reported, where `none` beat `per-client` by about 4 "
        "points (0.894 against 0.851 to 0.857); its skew rule is not recorded. On both tables here "
        "`per-client` is at least as good as `none`, and the clipped default is at least as good "
        "as both. The clip's mechanism is measurable on the α = 0.5 table: with `per-client`, "
        "test features reach 34 standard deviations (0.16% of test values beyond 5).",
        "",
    ]
    SUMMARY.write_text(json.dumps(summary, indent=1) + "\n")
    return "\n".join(text)


def main() -> None:
    default_csv = Path(os.environ.get("PRIVMTL_CACHE_DIR", Path.home() / ".cache" / "privmtl"))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", type=Path, help="default: $PRIVMTL_CACHE_DIR/digits-20-clients-<α>.csv")
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--table-seed", type=int, default=0)
    p.add_argument("--report", action="store_true")
    args = p.parse_args()
    if not args.report:
        csv = args.csv or default_csv / f"digits-20-clients-{args.alpha:g}.csv"
        build_table(csv, args.alpha, args.table_seed)
        run_all(csv, args.alpha)
    text = report()
    REPORT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
