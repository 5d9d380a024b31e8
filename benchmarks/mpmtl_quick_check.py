"""Acceptance check of the MP-MTL low-rank estimator against its baselines.

School (MALSAR school.mat; 30% of every school's students for training, rows scaled to unit
length, delta = 1/(m log m), hyper-parameters by 5-fold CV on the training split with the
DEFAULT_GRIDS, means over seeds):

* private low-rank (Gaussian covariance mechanism) has lower nMSE than STL-l2 at eps = 10;
* ... and lower nMSE than DP-MTRL and DP-AGGR at eps = 0.1, 1, 10.

Synthetic low-rank data (make_lowrank_tasks, m = 320, n_i = 30, d = 30):

* at eps = 10 its nMSE is within 25% of non-private trace-norm MTL;
* at eps = 0.01 it is no more than 5% worse than STL-l2.

Run: ``python benchmarks/mpmtl_quick_check.py [--seeds 0 1 2 3 4] [--skip-school]
[--skip-synthetic] [--school PATH] [--json OUT]``. BLAS is limited to one thread (the tuning
loops are many small problems; on a shared 2-core machine multithreaded LAPACK is much slower).
Tuning is not charged to the privacy budget (as in the paper).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import warnings
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from privmtl.linear.selection import PRIVATE_METHODS, make_estimator, tune_method

SCHOOL_EPS = (0.1, 1.0, 10.0)


def tuned_score(method: str, train: Any, test: Any, seed: int, **fixed: Any) -> tuple[float, dict]:
    """Tune ``method`` by 5-fold CV on ``train`` (tune_method), refit, return (test score, best)."""
    best, _ = tune_method(method, train.X, train.y, n_splits=5, random_state=seed, **fixed)
    params = {**fixed, **best}
    if method in PRIVATE_METHODS:
        params["random_state"] = seed
    est = make_estimator(method, **params).fit(train.X, train.y)
    return float(est.score(test.X, test.y)), best


def school(seeds: list[int], path: str | None) -> dict[str, list[float]]:
    from privmtl.data.readers import load_school

    data = load_school(path)
    res: dict[str, list[float]] = {}
    for seed in seeds:
        tr, te = data.train_test_split(0.3, random_state=seed)
        tr, te = tr.normalize_rows(), te.normalize_rows()
        t0 = time.perf_counter()
        s, b = tuned_score("stl-l2", tr, te, seed)
        res.setdefault("stl-l2", []).append(s)
        print(f"[school seed {seed}] stl-l2 {s:.4f} {b} ({time.perf_counter() - t0:.1f}s)")
        for eps in SCHOOL_EPS:
            for method, extra in (
                ("lowrank", {"noise": "gaussian"}),
                ("dp-mtrl", {}),
                ("dp-aggr", {}),
            ):
                t0 = time.perf_counter()
                s, b = tuned_score(method, tr, te, seed, epsilon=eps, **extra)
                res.setdefault(f"{method}@{eps:g}", []).append(s)
                print(
                    f"[school seed {seed}] {method} eps={eps:g} {s:.4f} {b} "
                    f"({time.perf_counter() - t0:.1f}s)",
                    flush=True,
                )
    return res


def synthetic(seeds: list[int]) -> dict[str, list[float]]:
    from privmtl.data.synthetic import make_lowrank_tasks

    res: dict[str, list[float]] = {}
    for seed in seeds:
        tr, te = make_lowrank_tasks(random_state=seed)
        for method, fixed in (
            ("mtl-trace", {}),
            ("stl-l2", {}),
            ("lowrank", {"epsilon": 10.0}),
            ("lowrank", {"epsilon": 0.01}),
        ):
            t0 = time.perf_counter()
            s, b = tuned_score(method, tr, te, seed, **fixed)
            key = method + (f"@{fixed['epsilon']:g}" if fixed else "")
            res.setdefault(key, []).append(s)
            print(
                f"[synthetic seed {seed}] {key} {s:.4f} {b} ({time.perf_counter() - t0:.1f}s)",
                flush=True,
            )
    return res


def perf(m: int, d: int, n: int, iterations: int) -> None:
    """Seconds per iteration of MPMTLLowRank (Gaussian, eps = 1) on random data of size m, d, n."""
    from privmtl.linear.mpmtl import MPMTLLowRank

    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    Xs = [rng.standard_normal((n, d)) for _ in range(m)]
    Xs = [x / np.linalg.norm(x, axis=1, keepdims=True) for x in Xs]
    ys = [x @ rng.standard_normal(d) for x in Xs]
    print(f"[perf] data m={m} d={d} n={n}: {time.perf_counter() - t0:.1f}s", flush=True)
    for T in (1, 1, 1 + iterations):  # the first fit warms up (imports, allocations)
        est = MPMTLLowRank(lam=0.1, clip=1.0, iterations=T, epsilon=1.0, random_state=0)
        t0 = time.perf_counter()
        est.fit(Xs, ys)
        elapsed = time.perf_counter() - t0
        print(f"[perf] fit with T={T}: {elapsed:.1f}s", flush=True)
        if T == 1:
            base = elapsed
    print(f"[perf] seconds per iteration: {(elapsed - base) / iterations:.2f}")


def report(school_res: dict[str, list[float]], syn_res: dict[str, list[float]]) -> dict[str, Any]:
    sch = {k: float(np.mean(v)) for k, v in school_res.items()}
    syn = {k: float(np.mean(v)) for k, v in syn_res.items()}
    checks: dict[str, Any] = {}
    if school_res:
        checks["school: lowrank@10 < stl-l2"] = (
            sch["lowrank@10"],
            sch["stl-l2"],
            sch["lowrank@10"] < sch["stl-l2"],
        )
        for eps in SCHOOL_EPS:
            lr = sch[f"lowrank@{eps:g}"]
            for base in ("dp-mtrl", "dp-aggr"):
                b = sch[f"{base}@{eps:g}"]
                checks[f"school: lowrank@{eps:g} < {base}@{eps:g}"] = (lr, b, lr < b)
    if syn_res:
        a, b = syn["lowrank@10"], syn["mtl-trace"]
        checks["synthetic: lowrank@10 <= 1.25 x mtl-trace"] = (a, b, a <= 1.25 * b)
        a, b = syn["lowrank@0.01"], syn["stl-l2"]
        checks["synthetic: lowrank@0.01 <= 1.05 x stl-l2"] = (a, b, a <= 1.05 * b)
    print("\nmeans:")
    for k, v in school_res.items():
        print(f"  school    {k:16s} {np.mean(v):.4f} ± {np.std(v):.4f}  {np.round(v, 4).tolist()}")
    for k, v in syn_res.items():
        print(f"  synthetic {k:16s} {np.mean(v):.4f} ± {np.std(v):.4f}  {np.round(v, 4).tolist()}")
    print("\nacceptance:")
    for k, (a, b, ok) in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {k}: {a:.4f} vs {b:.4f}")
    return {
        "school": sch,
        "synthetic": syn,
        "checks": {k: [float(a), float(b), bool(ok)] for k, (a, b, ok) in checks.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--skip-school", action="store_true")
    ap.add_argument("--skip-synthetic", action="store_true")
    ap.add_argument(
        "--school",
        default=os.environ.get("PRIVMTL_SCHOOL_PATH", "/work/shared/data/school/school.mat"),
    )
    ap.add_argument("--json", default=None, help="write the means and checks to this file")
    ap.add_argument(
        "--perf",
        type=int,
        nargs=3,
        metavar=("M", "D", "N"),
        default=None,
        help="only time MPMTLLowRank per iteration on random data (BLAS threads as set by the "
        "environment, e.g. OPENBLAS_NUM_THREADS=1: on a loaded shared machine multithreaded "
        "LAPACK is erratic)",
    )
    args = ap.parse_args()
    if args.perf:
        perf(*args.perf, iterations=3)
        return
    warnings.simplefilter("ignore")  # convergence warnings of baselines during tuning
    t0 = time.perf_counter()
    with threadpool_limits(1):
        school_res = {} if args.skip_school else school(args.seeds, args.school)
        syn_res = {} if args.skip_synthetic else synthetic(args.seeds)
    out = report(school_res, syn_res)
    out["seeds"] = args.seeds
    out["seconds"] = time.perf_counter() - t0
    print(f"\ntotal {out['seconds']:.0f}s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                out,
                f,
                indent=2,
                default=lambda o: o if not isinstance(o, float) else (None if math.isnan(o) else o),
            )


if __name__ == "__main__":
    main()
