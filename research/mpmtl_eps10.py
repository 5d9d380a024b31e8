"""MP-MTL private low-rank at ε = 10: where the gap to non-private trace-norm MTL lies (issue 32).

One process, **seeded noise** (a numpy Generator seeded with the seed: a rerun draws the same
noise; research simulation only, it protects nobody). For synthetic low-rank tasks (the split
``privmtl mpmtl --data synthetic-lowrank`` uses), seeds 0-4, it runs the low-rank refit pipeline
of :class:`~privmtl.linear.mpmtl.MPMTLLowRank` written out with the library's own pieces
(``plan_covariance_releases``, ``symmetric_gaussian_noise`` through the schedule, ``local_ridge``,
``select_ridge_per_task``, ``refit_with_metric``) so that each stage can be changed alone:

* ``T`` releases (the budget split evenly by the planner's Gaussian calibration, ``alpha=0``):
  release t is the covariance of the tasks' clipped current models (t = 0: their own ridge models,
  per-task LOO weight; t > 0: their refit models of step t-1), every task refits after each;
* the cut of the released spectrum: ``max(2σ√d, τ e)`` with e the estimation-noise edge
  (:func:`~privmtl.linear.eigen_floor.estimation_noise_edge`), a fixed τ of the vote's grid;
* the metric's power ``p``: ``D ∝ max(Λ - cut, 0)^p + floor`` (p = 1/2 is the trace norm's
  variational metric, the product's; p = 1 is the metric of a Gaussian prior with the released
  covariance, i.e. empirical-Bayes generalized ridge);
* ``noiseless``: the same pipeline with no noise (ε = ∞; the cut is then τ e alone).

Further stages: ``candidates`` (on the product's own release, every (τ, p) scored as the floor
vote scores it, with its test nMSE), ``product`` (``MPMTLLowRank`` at its defaults with
``refit_power`` 0.5, 1 or ``auto``; ``--secure`` for secure noise; ``--eps inf`` non-private) and
``rule`` (the discarded linear rule p = 1/2 + 1/2 max(0, 1 - 2σ√d/e)).

Every harness row: ε (target of the releases; the vote of the product is not held here, the fixed τ is
the one the vote elects at ε = 10 on this data), δ = min(1e-5, 1/(100 m)), add/remove one whole
task, every task in every release, RDP accountant (dp-accounting), noise seeded.

``OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python research/mpmtl_eps10.py --stage decompose``
Appends to ``research/results/mpmtl_eps10.jsonl``; ``--table`` prints the tables.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict

import numpy as np
import scipy.linalg
from _common import RESULTS

from privmtl.data.registry import data_protocol, load_mpmtl_data, target_offsets
from privmtl.linear.common import PreparedTasks, _clip_columns, resolve_delta
from privmtl.linear.eigen_floor import estimation_noise_edge, floored_shift
from privmtl.linear.local import (
    best_ridge,
    local_ridge,
    refit_with_metric,
    ridge_cv_losses,
    select_ridge_per_task,
    variational_factor,
)
from privmtl.linear.metrics import nmse
from privmtl.linear.mpmtl import MPMTLLowRank, MPMTLRefit
from privmtl.linear.spec import SPEC
from privmtl.privacy.covariance import plan_covariance_releases
from privmtl.privacy.noise import NumpySeededNoise

OUT = RESULTS / "mpmtl_eps10.jsonl"
REFIT_FLOOR = 1e-3  # the product's refit_floor (tau = refit_floor K sqrt(m), sqrt(Λ) units)


def metric(Sigma, cut, power, floor, hard=False):
    """``A = D^(1/2)``, ``D ∝ max(Λ - cut, 0)^p + floor^(2p)``, mean eigenvalue 1 (p = 1/2: the
    product's :func:`~privmtl.linear.local.variational_factor`)."""
    vals, U = scipy.linalg.eigh(Sigma, check_finite=False, driver="evd")
    lam = np.where(vals > cut, vals, 0.0) if hard else np.maximum(vals - cut, 0.0)
    Dv = lam**power + floor ** (2 * power)
    if not Dv.mean() > 0:
        return np.eye(Sigma.shape[0]), 0
    return (U * np.sqrt(Dv / Dv.mean())) @ U.T, int(np.sum(lam > 0))


def pipeline(batch, *, eps, T, tau, power, seed, K=1.0, top=None, hard=False):
    """The refit pipeline with T releases; returns the final models and a per-release record."""
    m, d = batch.n_tasks, batch.n_features
    delta = resolve_delta(None, m)
    sched = plan_covariance_releases(
        epsilon=eps,
        delta=delta,
        iterations=T,
        clip=K,
        dim=d,
        accountant=SPEC.accountant,
        alpha=0.0,
        eigen_fix="none",
    )
    noise = NumpySeededNoise(np.random.default_rng(seed))
    edge = estimation_noise_edge(K, m, d)
    floor = REFIT_FLOOR * K * math.sqrt(m)
    rho = select_ridge_per_task(batch, "squared", seed=seed)
    W = local_ridge(batch, "squared", rho)
    rec = []
    for t in range(T):
        Wc = _clip_columns(W, K)
        cov = Wc @ Wc.T
        Sigma = np.asarray(sched.noisy(t, cov, noise), dtype=np.float64)
        Sigma = 0.5 * (Sigma + Sigma.T)
        std = sched.per_release[t] if sched.noise == "gaussian" else 0.0
        cut = max(2.0 * std * math.sqrt(d), tau * edge)
        if top is not None:  # keep the top-r directions of the release, whatever their value
            vals = np.sort(np.linalg.eigvalsh(Sigma))[::-1]
            cut = max(cut, 0.5 * (vals[top - 1] + vals[top]))
        A, kept = metric(Sigma, cut, power, floor, hard)
        rho = select_ridge_per_task(batch, "squared", A=A, seed=seed)
        W = refit_with_metric(batch, "squared", rho, A)
        rec.append({"std": std, "cut": cut, "kept": kept})
    eps_rep = sched.guarantee.epsilon if sched.noise == "gaussian" else None
    return W, rec, eps_rep


def split(data, seed):
    scaling, _ = data_protocol(data, "auto", None, method="lowrank")
    train, test = load_mpmtl_data(data, seed=seed, method="lowrank")
    offsets = target_offsets(train, scaling)
    ys = [y - o for y, o in zip(train.y, offsets, strict=True)]
    batch = PreparedTasks(list(train.X), ys, loss="squared").batch

    def score(W):
        pred = [x @ W[:, i] + o for i, (x, o) in enumerate(zip(test.X, offsets, strict=True))]
        return float(nmse(list(test.y), pred))

    return batch, score


STAGES = {
    # the cut as a hard threshold (eigenvalues above it kept unshrunk) against the soft one
    "hard": [
        (eps, 1, 0.5, p, None, hard)
        for eps in (0.3, 1.0, 3.0, 10.0)
        for p in (0.5, 1.0)
        for hard in (False, True)
    ],
    # (name, eps list, T, tau, power, top)
    "decompose": [
        (eps, T, tau, p, None)
        for eps in (10.0, None)
        for T in (1, 2, 3)
        for tau in (0.0, 0.5)
        for p in (0.5, 1.0)
    ],
}
STAGES["decompose"] = [(*v, False) for v in STAGES["decompose"]]


PRODUCT_EPS = (0.01, 0.1, 0.3, 1.0, 3.0, 10.0)


def run_product(data, seeds, powers, eps_list, noise_source):
    """``MPMTLLowRank`` at its defaults (the floor vote included) with ``refit_power`` p."""
    for seed in seeds:
        batch, score = split(data, seed)
        prepared = _prepared(batch)
        for eps in eps_list:
            for p in powers:
                t0 = time.time()
                est = MPMTLLowRank(
                    epsilon=eps,
                    random_state=seed,
                    noise_source=noise_source,
                    refit=MPMTLRefit(refit_power=p),
                ).fit(prepared)
                f = est.eigen_floor_
                row = {
                    "data": data,
                    "seed": seed,
                    "stage": "product",
                    "eps": eps,
                    "power": p,
                    "nmse": score(est.coef_),
                    "reported_eps": None if eps is None else est.privacy_.epsilon,
                    "power_used": est.refit_power_,
                    "delta": est.delta_,
                    "noise": est.noise_source_,
                    "floor": None if f is None else {k: f.get(k) for k in FLOOR_KEYS},
                    "seconds": round(time.time() - t0, 2),
                }
                with OUT.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                print(json.dumps({k: row[k] for k in ("data", "seed", "eps", "power", "nmse")}))


def run_candidates(data, seeds, eps_list, powers):
    """On the product's own release (p = 1/2, the vote at its defaults): every (τ, p) of the
    floor grid x ``powers``, each task's own score of it (least LOO error over its ridge weights,
    what the vote scores) and its test nMSE. Post-processing of one release: the rows tell which
    candidate the tasks' exact vote would pick and what it scores."""
    for seed in seeds:
        batch, score = split(data, seed)
        prepared = _prepared(batch)
        m = batch.n_tasks
        for eps in eps_list:
            est = MPMTLLowRank(epsilon=eps, random_state=seed, noise_source="seeded").fit(prepared)
            st, f = est.state_, est.eigen_floor_
            cands, scores, nm = [], [], []
            for tau in f["grid"]:
                for p in powers:
                    A = variational_factor(
                        st.last_release,
                        penalty="lowrank",
                        shift=floored_shift(st.last_shift, tau * f["edge"]),
                        floor=est.refit_floor * est.clip * math.sqrt(m),
                        power=p,
                    )
                    table = ridge_cv_losses(batch, "squared", A=A, seed=seed)
                    W = refit_with_metric(batch, "squared", best_ridge(table), A)
                    cands.append([tau, p])
                    scores.append(table.min(axis=0))
                    nm.append(score(W))
            S = np.stack(scores, axis=1)  # (m, candidates)
            best = np.argmin(S, axis=1)
            row = {
                "data": data,
                "seed": seed,
                "stage": "candidates",
                "eps": eps,
                "product_nmse": score(est.coef_),
                "floor": {k: f.get(k) for k in FLOOR_KEYS},
                "candidates": cands,
                "candidate_nmse": nm,
                "exact_counts": np.bincount(best, minlength=len(cands)).tolist(),
                "noise": "seeded",
            }
            with OUT.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(json.dumps({k: row[k] for k in ("seed", "eps", "product_nmse", "exact_counts")}))
            print("   ", [f"{c}:{v:.4f}" for c, v in zip(cands, nm, strict=True)])


def linear_rule_power(est):
    """The research variant ``p = 1/2 + 1/2 max(0, 1 - r)``, r = 2σ√d / e, read off a fit's
    release (σ from its ledger; public): power 1 without noise, 1/2 from r = 1 on, no jump."""
    d, m = est.n_features_in_, est.coef_.shape[1]
    std = est.ledger_.records[0]["params"]["noise_std"] if est.ledger_.records else 0.0
    r = 2.0 * std * math.sqrt(d) / estimation_noise_edge(est.clip, m, d)
    return 0.5 + 0.5 * max(0.0, 1.0 - r), r


def run_rule(data, seeds, eps_list):
    """The product at the linear rule's power (variant ``linear``)."""
    for seed in seeds:
        batch, score = split(data, seed)
        prepared = _prepared(batch)
        for eps in eps_list:
            kw = {"epsilon": eps, "random_state": seed, "noise_source": "seeded"}
            probe = MPMTLLowRank(**kw, refit=MPMTLRefit(refit_power=0.5)).fit(prepared)
            p, r = linear_rule_power(probe)
            est = MPMTLLowRank(**kw, refit=MPMTLRefit(refit_power=p)).fit(prepared)
            row = {
                "data": data,
                "seed": seed,
                "stage": "product",
                "eps": eps,
                "power": "linear",
                "power_used": p,
                "edge_ratio": r,
                "nmse": score(est.coef_),
                "reported_eps": est.privacy_.epsilon,
                "delta": est.delta_,
                "noise": "seeded",
            }
            with OUT.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(json.dumps({k: row[k] for k in ("data", "seed", "eps", "power_used", "nmse")}))


FLOOR_KEYS = ("mode", "floor", "cut", "privacy_cut", "noisy_counts", "vote_epsilon")


def _prepared(batch):
    """The batch's tasks as :class:`PreparedTasks` (unpadded rows)."""
    n = batch.n.astype(int)
    Xs = [batch.X[i, : n[i]] for i in range(batch.n_tasks)]
    ys = [batch.y[i, : n[i]] for i in range(batch.n_tasks)]
    return PreparedTasks(Xs, ys, loss="squared")


def run(data, seeds, stage):
    for seed in seeds:
        batch, score = split(data, seed)
        for eps, T, tau, p, top, hard in STAGES[stage]:
            t0 = time.time()
            W, rec, eps_rep = pipeline(
                batch, eps=eps, T=T, tau=tau, power=p, seed=seed, top=top, hard=hard
            )
            row = {
                "data": data,
                "seed": seed,
                "stage": stage,
                "eps": eps,
                "T": T,
                "tau": tau,
                "power": p,
                "top": top,
                "hard": hard,
                "nmse": score(W),
                "reported_eps": eps_rep,
                "releases": rec,
                "noise": "seeded" if eps is not None else "none",
                "seconds": round(time.time() - t0, 2),
            }
            with OUT.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps({k: row[k] for k in ("seed", "eps", "T", "tau", "power", "nmse")}))


def _ms(v):
    return f"{np.mean(v):.4f} ± {np.std(v, ddof=1) if len(v) > 1 else 0.0:.4f}"


def product_table(rows):
    """The product's estimator (floor vote at its defaults) by power, data, ε and noise."""
    cells = defaultdict(dict)
    for r in rows:
        if r.get("stage") == "product":
            cells[(r["data"], r["noise"], str(r["power"]), r["eps"])][r["seed"]] = r["nmse"]
    for data in sorted({k[0] for k in cells}):
        for noise in ("seeded", "none", "secure"):
            keys = [k for k in cells if k[0] == data and k[1] == noise]
            if not keys:
                continue
            eps_cols = sorted({k[3] for k in keys}, key=lambda e: math.inf if e is None else e)
            head = ["∞" if e is None else f"{e:g}" for e in eps_cols]
            print(f"\n{data}, noise {noise} (nMSE mean ± sd over seeds; n = seeds)\n")
            print("| refit_power | " + " | ".join(f"ε = {h}" for h in head) + " | n |")
            print("|---" * (len(eps_cols) + 2) + "|")
            for power in ("0.5", "1.0", "step r<=1", "linear", "auto"):
                row = [cells.get((data, noise, power, e), {}) for e in eps_cols]
                if not any(row):
                    continue
                n = max(len(c) for c in row)
                out = [_ms(list(c.values())) if c else "–" for c in row]
                print(f"| {power} | " + " | ".join(out) + f" | {n} |")
            for power in ("1.0", "step r<=1", "linear", "auto"):
                diffs = []
                for e in eps_cols:
                    a = cells.get((data, noise, power, e), {})
                    b = cells.get((data, noise, "0.5", e), {})
                    common = sorted(set(a) & set(b))
                    d = [a[s] - b[s] for s in common]
                    better = sum(x < 0 for x in d)
                    diffs.append(f"{np.mean(d):+.4f} ({better}/{len(d)} better)" if d else "–")
                print(f"| {power} − 0.5, paired | " + " | ".join(diffs) + " | |")


def table():
    rows = [json.loads(x) for x in OUT.read_text().splitlines() if x.strip()]
    product_table(rows)
    print("\nHarness (the pipeline written out; fixed τ, no vote):\n")
    cells = defaultdict(list)
    for r in rows:
        if "T" in r:
            key = (
                r["data"],
                r["eps"],
                r["T"],
                r["tau"],
                r["power"],
                r.get("top"),
                bool(r.get("hard")),
            )
            cells[key].append(r["nmse"])
    print("| data | ε | T | τ | p | top | hard cut | nMSE mean ± sd | n |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in sorted(cells, key=lambda k: tuple(str(x) for x in k)):
        v = cells[key]
        sd = np.std(v, ddof=1) if len(v) > 1 else 0.0
        eps = "∞" if key[1] is None else f"{key[1]:g}"
        print(
            f"| {key[0]} | {eps} | {key[2]} | {key[3]:g} | {key[4]:g} | {key[5]} | {bool(key[6])} | "
            f"{np.mean(v):.4f} ± {sd:.4f} | {len(v)} |"
        )


def _power(text):
    """``--powers``: a number, or ``auto`` (the product's rule)."""
    return text if text == "auto" else float(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--data", default="synthetic-lowrank")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2, 3, 4])
    ap.add_argument(
        "--stage", default="decompose", choices=[*sorted(STAGES), "product", "candidates", "rule"]
    )
    ap.add_argument("--powers", type=_power, nargs="*", default=[0.5, 1.0])
    ap.add_argument("--eps", type=float, nargs="*", default=list(PRODUCT_EPS))
    ap.add_argument("--secure", action="store_true", help="product stage: secure noise")
    args = ap.parse_args()
    if args.table:
        table()
        return
    OUT.parent.mkdir(parents=True, exist_ok=True)
    if args.stage == "product":
        noise = "secure" if args.secure else "seeded"
        eps_list = [None if math.isinf(e) else e for e in args.eps]  # inf: non-private
        run_product(args.data, args.seeds, args.powers, eps_list, noise)
        return
    if args.stage == "rule":
        run_rule(args.data, args.seeds, args.eps)
        return
    if args.stage == "candidates":
        run_candidates(args.data, args.seeds, args.eps, args.powers)
        return
    run(args.data, args.seeds, args.stage)


if __name__ == "__main__":
    main()
