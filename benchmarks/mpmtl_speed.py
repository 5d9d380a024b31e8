"""Seconds per iteration of the private MP-MTL low-rank estimator, and how the cost grows in m and d.

Random least-squares tasks (n_i = 20 unit-norm rows each), Gaussian covariance mechanism at ε = 1.
Per-iteration time = (fit with T = 1 + k iterations − fit with T = 1) / k, after a warm-up fit, so data
validation and privacy planning are excluded. One BLAS thread (the machine is shared; multithreaded
LAPACK is erratic under load). Writes ``results/mpmtl_speed.md`` and ``results/mpmtl_speed.json``.

Run: ``OPENBLAS_NUM_THREADS=1 python benchmarks/mpmtl_speed.py``
"""

from __future__ import annotations

import json
import math
import time

import numpy as np
from _common import RESULTS, machine_info, markdown_table
from threadpoolctl import threadpool_limits

from privmtl.linear.mpmtl import MPMTLLowRank

GRID = [(1000, 1000), (3000, 1000), (10000, 1000), (10000, 100), (10000, 300)]
N_PER_TASK = 20
EXTRA = {100: 30, 300: 12}  # extra iterations per d (default 3): enough work to time reliably
REPEATS = 2  # the smaller of two differences (robust to a background blip)


def seconds_per_iteration(m: int, d: int) -> float:
    rng = np.random.default_rng(0)
    Xs = [rng.standard_normal((N_PER_TASK, d)) for _ in range(m)]
    Xs = [x / np.linalg.norm(x, axis=1, keepdims=True) for x in Xs]
    ys = [x @ rng.standard_normal(d) for x in Xs]
    extra = EXTRA.get(d, 3)
    diffs = []
    for rep in range(REPEATS + 1):
        times = {}
        for T in (1, 1 + extra):
            est = MPMTLLowRank(
                lam=0.1,
                clip=1.0,
                iterations=T,
                epsilon=1.0,
                random_state=0,
                noise_source="seeded",
                # the paper's Algorithm 2 (the estimator's defaults add an STL start and a refit)
                init="zeros",
                refit_lam=None,
                eigen_fix="shift",
            )
            t0 = time.perf_counter()
            est.fit(Xs, ys)
            times[T] = time.perf_counter() - t0
        if rep > 0:  # the first pass warms up
            diffs.append((times[1 + extra] - times[1]) / extra)
    return min(diffs)


def main() -> None:
    import os

    load_before = os.getloadavg()[0]
    rows = []
    with threadpool_limits(1):
        for m, d in GRID:
            s = seconds_per_iteration(m, d)
            rows.append({"m": m, "d": d, "n_i": N_PER_TASK, "seconds_per_iteration": s})
            print(rows[-1], flush=True)
    by = {(r["m"], r["d"]): r["seconds_per_iteration"] for r in rows}
    slope_m = math.log(by[(10000, 1000)] / by[(1000, 1000)]) / math.log(10)
    slope_d = math.log(by[(10000, 1000)] / by[(10000, 100)]) / math.log(10)
    table = [[r["m"], r["d"], f"{r['seconds_per_iteration']:.3f}"] for r in rows]
    text = [
        "# MP-MTL low-rank: seconds per iteration (one BLAS thread)",
        "",
        markdown_table(["m tasks", "d features", "s / iteration"], table),
        "",
        f"Empirical growth: ∝ m^{slope_m:.2f} at d = 1000 (m from 1 000 to 10 000) and ∝ d^{slope_d:.2f} at "
        "m = 10 000 (d from 100 to 1 000). Per iteration: one d×d eigendecomposition (O(d³)), W̃W̃ᵀ and M·W̃ "
        "(O(d²m)), batched gradients (O(m·n_i·d)).",
        "",
        f"Machine: {machine_info()}; 1-minute load average {load_before:.2f} before the run "
        f"and {os.getloadavg()[0]:.2f} after it (2 cores; this benchmark uses one).",
        "",
        "Reproduce: `OPENBLAS_NUM_THREADS=1 python benchmarks/mpmtl_speed.py`",
    ]
    (RESULTS / "mpmtl_speed.md").write_text("\n".join(text) + "\n")
    (RESULTS / "mpmtl_speed.json").write_text(json.dumps(rows, indent=2))
    print("\n".join(text))


if __name__ == "__main__":
    main()
