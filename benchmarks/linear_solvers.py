"""Certified solvers of the trace-norm and l2,1 estimators on School, against the previous FISTA.

School as in MALSAR's experiments: 30% of each school's students for training (seed 0), unit-norm
rows, and each task's rows (features and target) scaled by sqrt(n_i), so that privmtl's
per-task-mean objective ``sum_i (1/n_i) 0.5 ||X_i w_i - y_i||^2 + rho h(W)`` equals MALSAR's
summed one ``0.5 ||X_i w_i - y_i||^2``. For every rho in {0.1, 1, 10, 100}:

* ``default``: the estimator with default settings (``solver="auto"`` = ADMM with cached
  per-task eigendecompositions, stop at relative duality gap 1e-8);
* ``fista``: the previous solver (FISTA with adaptive restart, one global step ``1/L``), run with
  the same certificate and stop, capped at its previous default ``max_iter=5000``.

Timing: the two solvers run interleaved (paired) ``--repeats`` times on a shared machine; the
table reports the median seconds. Example (the committed results)::

    python benchmarks/linear_solvers.py --data-path PATH/TO/school.mat
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np
from _common import RESULTS, machine_info

from privmtl.data.readers import load_school
from privmtl.linear import L21MTL, TraceNormMTL

RHOS = (0.1, 1.0, 10.0, 100.0)


def school_malsar(path: str | None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The MALSAR-scaled School training split (see the module docstring)."""
    full = load_school(path).normalize_rows()
    train, _ = full.train_test_split(0.3, random_state=0)
    Xs = [np.sqrt(len(y)) * np.asarray(x) for x, y in zip(train.X, train.y, strict=True)]
    ys = [np.sqrt(len(y)) * np.asarray(y) for y in train.y]
    return Xs, ys


def run(cls: type, rho: float, Xs, ys, **params) -> tuple[float, int, float, float]:
    """(seconds, iterations, relative duality gap, objective) of one fit."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        est = cls(lam=rho, **params).fit(Xs, ys)
        dt = time.perf_counter() - t0
    obj = float(est.objective_[-1])
    return dt, est.n_iter_, est.dual_gap_ / abs(obj), obj


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-path", default=None)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    Xs, ys = school_malsar(args.data_path)
    n = [len(y) for y in ys]
    lines = [
        "# Linear solvers on School (MALSAR split and scaling)",
        "",
        f"m = {len(Xs)} tasks, d = {Xs[0].shape[1]} features, n_i = {min(n)}..{max(n)} training "
        f"rows. Machine: " + ", ".join(f"{k} {v}" for k, v in machine_info().items()) + ".",
        "",
        "Command: `python benchmarks/linear_solvers.py --data-path PATH/TO/school.mat`",
        "",
        "`default`: estimator defaults (ADMM, stop at relative duality gap 1e-8). `fista`: the "
        "previous solver (FISTA, global step 1/L) with the same stop, capped at max_iter = 5000. "
        f"Seconds: median of {args.repeats} paired, interleaved runs. Relative gap: "
        "`dual_gap_ / objective` (an upper bound on the relative suboptimality). Excess "
        "objective: FISTA's objective minus the certified default's, relative.",
        "",
        "| penalty | rho | default iters | default s | default rel. gap "
        "| fista iters | fista s | fista rel. gap | fista rel. excess objective |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, cls in (("trace", TraceNormMTL), ("l2,1", L21MTL)):
        for rho in RHOS:
            new, old = [], []
            for _ in range(args.repeats):
                new.append(run(cls, rho, Xs, ys))
                old.append(run(cls, rho, Xs, ys, solver="proximal-gradient", max_iter=5000))
            tn = statistics.median(r[0] for r in new)
            to = statistics.median(r[0] for r in old)
            row = (
                f"| {name} | {rho:g} | {new[0][1]} | {tn:.2f} | {new[0][2]:.1e} "
                f"| {old[0][1]} | {to:.2f} | {old[0][2]:.1e} "
                f"| {(old[0][3] - new[0][3]) / abs(new[0][3]):.1e} |"
            )
            print(row, flush=True)
            lines.append(row)
    out = RESULTS / "linear_solvers.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
