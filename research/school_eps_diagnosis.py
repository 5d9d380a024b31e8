"""Why does MP-MTL low-rank (defaults) on School get worse from ε = 1 to ε = 10? (issue 32)

One process, seeds 0-4, seeded noise (research simulation: the same draws on a rerun). For every
seed and ε it fits the product's default estimator (``MPMTLLowRank`` with the run's settings:
T = 1, K = 1, ``eigen_fix="denoise"``, per-task CV refit) on the School split that ``privmtl
mpmtl --data school`` uses, records its nMSE and the release's statistics (noise std σ per entry,
the denoise threshold 2σ√d, the number of eigen-directions the refit metric keeps), and then
reuses the *same* noisy release with other eigenvalue thresholds (post-processing, no privacy
cost): a threshold held fixed across ε, public ranks, and no threshold. ``eps=inf`` is the same
pipeline without noise (``epsilon=None``). STL (``stl-l2``, per-task CV) and non-private
trace-norm MTL (``mtl-trace``, pooled CV) come from ``run_mpmtl`` on the same seeds.

Run from the repository root:
``OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python research/school_eps_diagnosis.py [--baselines]``
Writes ``research/results/school_eps_diagnosis.jsonl`` (one row per seed x ε x variant);
``--data synthetic-lowrank`` writes ``..._synthetic-lowrank.jsonl``, ``--gd-only`` (the default and
the Gavish-Donoho cut at ε in {1, 3, 10, ∞}) ``..._gd.jsonl``; ``--table`` prints a log's tables.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import scipy.linalg
from _common import RESULTS

from privmtl.data.registry import data_protocol, load_mpmtl_data, target_offsets
from privmtl.linear.common import PreparedTasks
from privmtl.linear.local import refit_with_metric, select_ridge_per_task, variational_factor
from privmtl.linear.metrics import nmse
from privmtl.linear.mpmtl import MPMTLLowRank

EPSILONS = (0.1, 0.3, 1.0, 3.0, 10.0, math.inf)
SEEDS = range(5)
#: fixed absolute eigenvalue thresholds (units of W~W~^T, whose trace is <= m K^2 = 139)
FIXED_TAUS = (8.0, 16.0, 32.0, 48.0)
RANKS = (1, 2, 3, 5)
OUT = RESULTS / "school_eps_diagnosis.jsonl"


def out_path(data: str) -> Path:
    """The results log of ``data`` (School: :data:`OUT`)."""
    return OUT if data == "school" else RESULTS / f"school_eps_diagnosis_{data}.jsonl"


def refit_nmse(est, batch, Sigma, shift, *, rank=None, seed, test, offsets):
    """nMSE of the default refit built from ``Sigma`` with eigenvalue shift ``shift`` (and, when
    ``rank`` is set, only the top ``rank`` eigenvalues kept)."""
    K, m = est.clip, batch.n_tasks
    S = Sigma
    if rank is not None:
        vals, U = scipy.linalg.eigh(Sigma)
        keep = np.zeros_like(vals)
        keep[-rank:] = np.maximum(vals[-rank:], 0.0)
        S = (U * keep) @ U.T
        shift = None
    A = variational_factor(
        S, penalty="lowrank", shift=shift, floor=est.refit_floor * K * math.sqrt(m)
    )
    rho = select_ridge_per_task(batch, "squared", A=A, seed=seed)
    W = refit_with_metric(batch, "squared", rho, A)
    pred = [x @ W[:, i] + o for i, (x, o) in enumerate(zip(test.X, offsets, strict=True))]
    return float(nmse(list(test.y), pred))


def kept_rank(Sigma, shift):
    vals = scipy.linalg.eigvalsh(Sigma)
    return int(np.sum(vals + (0.0 if shift is None else shift) > 0))


def table(log: Path) -> None:
    """Print the markdown table (variant x ε, nMSE mean ± sd over seeds) of the log ``log``."""
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    eps_order = [str(e) if not math.isinf(e) else "inf" for e in EPSILONS]
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    cell: dict[tuple[str, str], list[float]] = {}
    kept: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        key = (r["variant"], str(r["eps"]))
        cell.setdefault(key, []).append(r["nmse"])
        if "kept" in r and not r["variant"].startswith("rank"):
            kept.setdefault(key, []).append(r["kept"])
    print("| variant | " + " | ".join(f"ε = {e}" for e in eps_order) + " |")
    print("|---|" + "---|" * len(eps_order))
    for v in variants:
        if any((v, "n/a") == k for k in cell):
            vals = cell[(v, "n/a")]
            print(
                f"| {v} (n = {len(vals)}) | {np.mean(vals):.4f} ± {np.std(vals, ddof=1) if len(vals) > 1 else 0:.4f} (any ε) |"
            )
            continue
        out = []
        for e in eps_order:
            vals = cell.get((v, e), [])
            if not vals:
                out.append("—")
                continue
            sd = np.std(vals, ddof=1) if len(vals) > 1 else 0.0
            k = kept.get((v, e))
            ks = f" [{np.mean(k):.1f}]" if k else ""
            out.append(f"{np.mean(vals):.4f} ± {sd:.4f}{ks}")
        print(f"| {v} | " + " | ".join(out) + " |")
    n = len({r["seed"] for r in rows})
    print(f"\n(seeds: {n}; [k]: mean number of eigen-directions the refit metric keeps)\n")
    print(
        "| ε | σ per entry | threshold 2σ√d | ‖E‖_F / ‖W~W~ᵀ‖_F | top eigenvalues of the release |"
    )
    print("|---|---|---|---|---|")
    for e in eps_order:
        rs = [r for r in rows if r["variant"] == "default" and str(r["eps"]) == e]
        if rs:
            top = np.mean([r["eig_top"] for r in rs], axis=0)
            print(
                f"| {e} | {np.mean([r['sigma'] for r in rs]):.3f} | "
                f"{np.mean([r['threshold'] for r in rs]):.2f} | {np.mean([r['nsr'] for r in rs]):.3f} | "
                + ", ".join(f"{v:.1f}" for v in top)
                + " |"
            )
    print("\nPaired per seed (same split), difference of nMSE, mean ± sd (seeds where both ran):\n")
    print("| variant | ε=10 − ε=1 | ε=3 − ε=1 | ε=∞ − ε=1 | seeds with ε=10 > ε=1 |")
    print("|---|---|---|---|---|")
    by = {(r["variant"], str(r["eps"]), r["seed"]): r["nmse"] for r in rows}
    for v in variants:
        cols, worse = [], 0
        for e in ("10.0", "3.0", "inf"):
            ds = [
                by[(v, e, sd)] - by[(v, "1.0", sd)]
                for sd in range(n)
                if (v, e, sd) in by and (v, "1.0", sd) in by
            ]
            if e == "10.0":
                worse = sum(d > 0 for d in ds)
            cols.append(
                f"{np.mean(ds):+.4f} ± {np.std(ds, ddof=1) if len(ds) > 1 else 0:.4f}"
                if ds
                else "—"
            )
        if cols[0] != "—":
            print(f"| {v} | " + " | ".join(cols) + f" | {worse}/{n} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", action="store_true", help="only print the table of the results")
    ap.add_argument("--baselines", action="store_true", help="also stl-l2 and mtl-trace")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--data", default="school", help="school or synthetic-lowrank")
    ap.add_argument(
        "--gd-only",
        action="store_true",
        help="only the default and the Gavish-Donoho cut, ε in {1, 3, 10, ∞}, to a _gd log",
    )
    args = ap.parse_args()
    out = out_path(args.data)
    if args.gd_only:
        out = out.with_name(out.stem + "_gd.jsonl")
    if args.table:
        table(out)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("")
    scaling, _ = data_protocol(args.data, "auto", None, method="lowrank")

    def emit(row):
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    for seed in range(args.seeds):
        t0 = time.time()
        train, test = load_mpmtl_data(args.data, seed=seed, method="lowrank")
        offsets = target_offsets(train, scaling)
        Xs = list(train.X)
        ys = [y - o for y, o in zip(train.y, offsets, strict=True)]
        batch = PreparedTasks(Xs, ys, loss="squared").batch
        d = batch.n_features
        clean = None
        for eps in (1.0, 3.0, 10.0, math.inf) if args.gd_only else EPSILONS:
            est = MPMTLLowRank(
                epsilon=None if math.isinf(eps) else eps,
                random_state=seed,
                noise_source="seeded",
            ).fit(Xs, ys)
            pred = [p + o for p, o in zip(est.predict(list(test.X)), offsets, strict=True)]
            st = est.state_
            Sigma, shift = st.last_release, st.last_shift
            if clean is None and math.isinf(eps):
                clean = Sigma
            sigma = 0.0 if est.epsilons_ is None or math.isinf(eps) else float(est.epsilons_[0])
            base = {
                "seed": seed,
                "eps": "inf" if math.isinf(eps) else eps,
                "sigma": sigma,
                "threshold": 0.0 if shift is None else -shift,
                "kept": kept_rank(Sigma, shift),
                "nsr": float(st.noise_to_signal[0]),
                "eig_top": [float(v) for v in scipy.linalg.eigvalsh(Sigma)[::-1][:6]],
            }
            emit({**base, "variant": "default", "nmse": float(nmse(list(test.y), pred))})
            kw = {"seed": seed, "test": test, "offsets": offsets}
            emit(
                {
                    **base,
                    "variant": "no-threshold (clip at 0)",
                    "nmse": refit_nmse(est, batch, Sigma, 0.0, **kw),
                }
            )
            # public edge of pure estimation noise: m unit-norm models spread isotropically in d
            # dimensions give W~W~^T eigenvalues up to about K^2 (sqrt(m) + sqrt(d))^2 / d
            mp_edge = est.clip**2 * (math.sqrt(batch.n_tasks) + math.sqrt(d)) ** 2 / d
            thr = max(mp_edge, 0.0 if shift is None else -shift)
            emit(
                {
                    **base,
                    "variant": "threshold max(2σ√d, MP edge)",
                    "mp_edge": mp_edge,
                    "kept": kept_rank(Sigma, -thr),
                    "nmse": refit_nmse(est, batch, Sigma, -thr, **kw),
                }
            )
            # Gavish-Donoho hard threshold with unknown noise level, read off the release itself
            # (post-processing): singular values of W~ below omega(beta) * their median are noise
            vals = np.maximum(scipy.linalg.eigvalsh(Sigma), 0.0)
            beta = min(d, batch.n_tasks) / max(d, batch.n_tasks)
            omega = 0.56 * beta**3 - 0.95 * beta**2 + 1.82 * beta + 1.43
            gd = float((omega * np.median(np.sqrt(vals))) ** 2)
            thr = max(gd, 0.0 if shift is None else -shift)
            emit(
                {
                    **base,
                    "variant": "threshold max(2σ√d, Gavish-Donoho from the release)",
                    "gd": gd,
                    "kept": kept_rank(Sigma, -thr),
                    "nmse": refit_nmse(est, batch, Sigma, -thr, **kw),
                }
            )
            if args.gd_only:
                continue
            for tau in FIXED_TAUS:
                thr = max(tau, 0.0 if shift is None else -shift)
                emit(
                    {
                        **base,
                        "variant": f"threshold max(2σ√d, {tau:g})",
                        "kept": kept_rank(Sigma, -thr),
                        "nmse": refit_nmse(est, batch, Sigma, -thr, **kw),
                    }
                )
            if args.gd_only:
                continue
            for r in RANKS:
                emit(
                    {
                        **base,
                        "variant": f"rank {r}",
                        "nmse": refit_nmse(est, batch, Sigma, None, rank=r, **kw),
                    }
                )
            emit(
                {
                    **base,
                    "variant": "identity metric (STL ridge, per-task CV)",
                    "nmse": refit_nmse(est, batch, np.zeros((d, d)), None, **kw),
                }
            )
        if args.baselines:
            from privmtl.experiments.mpmtl import run_mpmtl

            for method in ("stl-l2", "mtl-trace"):
                r = run_mpmtl(data=args.data, method=method, seed=seed)
                emit({"seed": seed, "eps": "n/a", "variant": method, "nmse": r["nmse"]})
        print(f"# seed {seed}: {time.time() - t0:.0f}s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
