"""PMTL's end of run: what a shared (voted) fine-tuning setting could buy over every client's own choice.

Issue 32, item 1 (PMTL part), measured before anything is built. Per (m, seed): one private PMTL
run at the population study's settings (``benchmarks/results/pmtl_population.md``: the CLI defaults
with ``--clients-per-round min(200, m)``; synthetic data, ε = 1, seeded noise: a reproducible research simulation
that protects nobody) with ``finetune="none"``, its trained models saved; then, from these, each
client's own data and public parameters only, every candidate of ``finetune="auto"``
(:mod:`privmtl.federated.finish`): the trained model, local training
(:func:`~privmtl.federated.local.train_local`, as the end of run calls it) and the billboard
fine-tuned at *each* point of :data:`~privmtl.federated.finish.AUTO_FINETUNE_EPOCHS` x
:data:`~privmtl.federated.finish.AUTO_FINETUNE_LRS` separately (the model of a grid point does not
depend on the grid it is trained in). Every candidate is scored per client on its validation and
test splits, and these rules are compared on the pooled test accuracy:

``today``
    ``finetune="auto"``: each client picks its best billboard grid point on its own validation
    split, then its best of {trained, local, that fine-tuned billboard} (public order, ties to the
    later: :func:`~privmtl.federated.local.client_better`);
``vote-grid (<tally>)``
    the grid point of the EXACT (noise-free) vote of the clients' own billboard-grid winners;
    each client still picks among {trained, local, the billboard fine-tuned at that point};
``vote-all (<tally>)``
    the EXACT vote of the clients' own winners among all six candidates (trained, local, the
    four grid points); every client takes the winner;
``every client <candidate>`` and ``pooled-val best``
    references (not private): each candidate for all clients, and the one of them with the best
    pooled validation accuracy (the earlier, not covered, pooled rule restricted to this grid).

Tallies: ``ties-later`` (a client's winner by the end of run's own tie-break: ties go to the
later candidate, so a client whose candidates tie votes for the last), ``unique`` (only clients
with one strict winner vote), ``split`` (a client's vote is shared equally among its tied best
candidates: still L1/L2 sensitivity <= 1). Clients without validation data abstain.

Run from the repository root (one process, one torch thread):
``OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python research/pmtl_finetune_vote.py --m 3000 --seed 0``
Appends one row per (m, seed, ε) to ``research/results/pmtl_finetune_vote.jsonl``.

``--wide`` (:func:`measure_wide`): the same oracle over a larger public billboard grid
(:data:`WIDE_EPOCHS` x :data:`WIDE_LRS`), with ``--dump FILE.npz`` of every client's scores;
``--tallies FILE.npz`` (:func:`tallies`): vote tallies other than the built one, on those scores.
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

import numpy as np
import torch
from _common import RESULTS, append_jsonl, trained_once

from privmtl.experiments.pmtl import run_pmtl
from privmtl.federated.algorithms import client_scores
from privmtl.federated.finish import (
    AUTO_FINETUNE_EPOCHS,
    AUTO_FINETUNE_LRS,
    auto_plan,
    stack_trained,
)
from privmtl.federated.local import client_better, train_local

OUT = RESULTS / "pmtl_finetune_vote.jsonl"


def _pick(val_c: np.ndarray, val_l: np.ndarray, order: list[int]) -> np.ndarray:
    """Each client's choice among the candidates ``order`` (indices; public order, ties to the
    later): the finish's rule."""
    k = val_c.shape[0]
    best = np.full(k, order[0])
    bc, bl = val_c[:, order[0]].copy(), val_l[:, order[0]].copy()
    for j in order[1:]:
        better = client_better(val_c[:, j], val_l[:, j], bc, bl)
        best[better] = j
        bc = np.where(better, val_c[:, j], bc)
        bl = np.where(better, val_l[:, j], bl)
    return best


def _tally(val_c: np.ndarray, cols: list[int], has_val: np.ndarray, how: str, pick: np.ndarray):
    """Exact vote counts over ``cols`` (in their order)."""
    counts = np.zeros(len(cols))
    sub = val_c[:, cols]
    top = sub.max(axis=1, keepdims=True)
    tied = sub == top
    for i in np.flatnonzero(has_val):
        if how == "ties-later":
            counts[cols.index(int(pick[i]))] += 1
        elif how == "unique":
            if tied[i].sum() == 1:
                counts[int(np.argmax(tied[i]))] += 1
        else:  # split
            counts += tied[i] / tied[i].sum()
    return counts


def measure(m: int, seed: int, eps: float | None, q: int) -> dict[str, Any]:
    t0 = time.time()
    once = trained_once(m, seed, eps, q)
    out, glob, pers, t_run = once["out"], once["glob"], once["pers"], once["seconds"]
    ds, net, buffers = once["ds"], once["net"], once["buffers"]
    cfg = out["config"]
    plan = auto_plan(
        "pmtl", None, float(out.get("noise_std") or 0.0), float(cfg["clip"]),
        int(out["released_dim"]), int(cfg["rounds"]),
    )  # fmt: skip
    bs = int(cfg["batch_size"])
    kw: dict[str, Any] = {"batch_size": bs, "seed": seed, "select": "client", "scores": False}
    names = ["trained", "local"]
    models = [stack_trained(pers, glob, m), train_local(ds, net, **kw).personalized_params]
    begin = copy.deepcopy(net)
    begin.load_state_dict({**begin.state_dict(), **glob})
    grid = [(e, lr) for e in AUTO_FINETUNE_EPOCHS for lr in AUTO_FINETUNE_LRS]
    for e, lr in grid:
        tuned = train_local(ds, begin, epochs=(e,), lrs=(lr,), **kw)
        names.append(f"bb_e{e}_lr{lr}")
        models.append(tuned.personalized_params)
    val_x, val_y = ds.split("val")
    test_x, test_y = ds.split("test")
    vc, vl, tc = [], [], []
    for p in models:
        c, loss = client_scores(net, p, buffers, val_x, val_y)
        vc.append(c)
        vl.append(loss)
        tc.append(client_scores(net, p, buffers, test_x, test_y)[0])
    val_c, val_l, test_c = (np.stack(a, axis=1) for a in (vc, vl, tc))
    n_test = float(sum(len(y) for y in test_y))
    n_val = np.array([len(y) for y in val_y])
    has_val = n_val > 0
    rows = np.arange(m)

    def acc(choice: np.ndarray) -> float:
        return float(test_c[rows, choice].sum() / n_test)

    bbcols = list(range(2, 2 + len(grid)))
    bb_pick = _pick(val_c, val_l, bbcols)  # train_local's per-client choice, ties to the later
    pos = {"trained": 0, "local": 1}
    res: dict[str, Any] = {}
    # today: trained, local, the client's own bb choice, in the plan's order
    today_val_c = np.stack([val_c[:, 0], val_c[:, 1], val_c[rows, bb_pick]], axis=1)
    today_val_l = np.stack([val_l[:, 0], val_l[:, 1], val_l[rows, bb_pick]], axis=1)
    order3 = [{"trained": 0, "local": 1, "billboard-finetune": 2}[n] for n in plan.names]
    pick3 = _pick(today_val_c, today_val_l, order3)
    today = np.where(pick3 == 2, bb_pick, pick3)
    res["today"] = acc(today)
    counts_today = {n: int((pick3 == order3[i]).sum()) for i, n in enumerate(plan.names)}
    votes: dict[str, Any] = {}
    for how in ("ties-later", "unique", "split"):
        cnt = _tally(val_c, bbcols, has_val, how, bb_pick)
        w = bbcols[int(np.argmax(cnt))]
        order = [pos[n] if n in pos else w for n in plan.names]
        res[f"vote-grid ({how})"] = acc(_pick(val_c, val_l, order))
        votes[f"grid {how}"] = {"counts": cnt.round(2).tolist(), "winner": names[w]}
        allcols = [pos[n] for n in plan.names if n in pos] + bbcols
        all_pick = _pick(val_c, val_l, allcols)
        cnt = _tally(val_c, allcols, has_val, how, all_pick)
        w = allcols[int(np.argmax(cnt))]
        res[f"vote-all ({how})"] = acc(np.full(m, w))
        votes[f"all {how}"] = {
            "counts": dict(zip([names[c] for c in allcols], cnt.round(2).tolist(), strict=True)),
            "winner": names[w],
        }
    for j, n in enumerate(names):
        res[f"every client {n}"] = acc(np.full(m, j))
    best_val = int(np.argmax(val_c.sum(axis=0)))
    res["pooled-val best"] = acc(np.full(m, best_val))
    return {
        "m": m, "seed": seed, "eps": eps, "delta": out.get("delta"), "clients_per_round": q,
        "trained_test_accuracy_run": out.get("test_accuracy"),
        "plan": list(plan.names), "grid": [list(g) for g in grid],
        "clients_per_candidate_today": counts_today,
        "clients_with_val": int(has_val.sum()), "median_val": float(np.median(n_val)),
        "pooled_val_accuracy": dict(zip(names, (val_c.sum(0) / n_val.sum()).round(4).tolist(),
                                        strict=True)),
        "pooled_val_best": names[best_val],
        "accuracy": {k: round(v, 5) for k, v in res.items()},
        "votes": votes, "seconds_run": round(t_run, 1), "seconds": round(time.time() - t0, 1),
    }  # fmt: skip


WIDE_EPOCHS = (3, 10, 30, 100)
"""Epochs of the larger billboard grid measured by :func:`measure_wide` (a superset of
:data:`~privmtl.federated.finish.AUTO_FINETUNE_EPOCHS`, and of local-all's epochs)."""
WIDE_LRS = (0.003, 0.01, 0.03, 0.1)
"""Step sizes of the larger billboard grid (a superset of today's and of local-all's)."""


def measure_wide(
    m: int,
    seed: int,
    eps: float | None,
    q: int,
    draws: int = 2000,
    block: int = 2000,
    dump: str | None = None,
) -> dict[str, Any]:
    """The oracle over a larger public billboard grid (:data:`WIDE_EPOCHS` x :data:`WIDE_LRS`).

    One run with ``finetune="none"`` as :func:`measure`; then every client's trained model, its
    local training and the billboard fine-tuned at every point of the larger grid (one run of
    ``max(epochs)`` epochs per step size, snapshots at each number of epochs: the model of a
    point is the same as in any grid holding it), scored per client a block of clients at a
    time. Rules on the pooled test accuracy: every client on each single candidate; the exact
    split vote (shared among tied best candidates, sensitivity 1) over today's six candidates and
    over the larger list; and the same votes with the built vote's Gaussian noise
    (:func:`~privmtl.privacy.selection.plan_vote` at 5 % of ε), ``draws`` times from a fixed
    generator: the mean accuracy and how often each candidate wins. ``dump``: also save every
    client's validation and test scores of every candidate there (``.npz``) for other tallies.
    """
    from privmtl.federated.blocks import client_blocks
    from privmtl.federated.finish import FINETUNE_VOTE_SHARE, FINETUNE_VOTERS
    from privmtl.federated.local import _train_grid
    from privmtl.federated.spec import resolve_delta
    from privmtl.privacy.selection import client_vote_shares, plan_vote

    t0 = time.time()
    once = trained_once(m, seed, eps, q)
    out, glob, pers, t_run = once["out"], once["glob"], once["pers"], once["seconds"]
    ds, net, buffers = once["ds"], once["net"], once["buffers"]
    cfg = out["config"]
    bs = int(cfg["batch_size"])
    kw: dict[str, Any] = {"batch_size": bs, "seed": seed, "select": "client", "scores": False}
    trained = stack_trained(pers, glob, m)
    local = train_local(ds, net, **kw).personalized_params
    assert local is not None
    begin = copy.deepcopy(net)
    begin.load_state_dict({**begin.state_dict(), **glob})
    init = {n: p.detach().clone() for n, p in begin.named_parameters()}
    grid = [(e, lr) for e in WIDE_EPOCHS for lr in WIDE_LRS]
    names = ["trained", "local"] + [f"bb_e{e}_lr{lr:g}" for e, lr in grid]
    val_c = np.zeros((m, len(names)))
    val_l = np.zeros((m, len(names)))
    test_c = np.zeros((m, len(names)))
    t1 = time.time()
    for pos in client_blocks(m, block):
        part = ds.subset(pos.tolist())
        rows = torch.from_numpy(pos)
        tuned = _train_grid(
            begin, buffers, init, part, grid, bs, seed, 64, True, pos.tolist(), None, None
        )
        cands = [{n: p[rows] for n, p in trained.items()}, {n: p[rows] for n, p in local.items()}]
        val_x, val_y = part.split("val")
        test_x, test_y = part.split("test")
        for j, p in enumerate(cands + tuned):
            c, loss = client_scores(net, p, buffers, val_x, val_y)
            val_c[pos, j], val_l[pos, j] = c, loss
            test_c[pos, j] = client_scores(net, p, buffers, test_x, test_y)[0]
    t_grid = time.time() - t1
    n_test = float(sum(len(y) for y in ds.split("test")[1]))
    n_val = np.array([len(y) for y in ds.split("val")[1]])
    has_val = n_val > 0
    acc_single = test_c.sum(axis=0) / n_test
    today = ["trained", "local"] + [
        f"bb_e{e}_lr{lr:g}" for e in AUTO_FINETUNE_EPOCHS for lr in AUTO_FINETUNE_LRS
    ]
    lists = {
        "today's six": [names.index(n) for n in today],
        "larger": list(range(len(names))),
        "larger billboard only": list(range(2, len(names))),
    }
    delta = float(resolve_delta(None, m)[0])
    plan = plan_vote(
        min(m, FINETUNE_VOTERS), epsilon=eps, delta=delta, share=FINETUNE_VOTE_SHARE,
        accountant=str(cfg.get("accountant", "rdp")), relation=str(cfg.get("relation", "add-remove")),
    )  # fmt: skip
    rng = np.random.default_rng([seed, 2026])
    votes: dict[str, Any] = {}
    for label, cols in lists.items():
        sub = np.where(has_val[:, None] & np.isfinite(val_l[:, cols]), val_c[:, cols], np.nan)
        counts = client_vote_shares(sub).sum(axis=0)
        w = cols[int(np.argmax(counts))]
        noisy = counts[None, :] + rng.normal(0.0, plan.noise_std, (draws, len(cols)))
        wins = np.array(cols)[np.argmax(noisy, axis=1)]
        votes[label] = {
            "exact_counts": dict(zip([names[c] for c in cols], counts.round(1).tolist(), strict=True)),
            "exact_winner": names[w], "exact_accuracy": round(float(acc_single[w]), 5),
            "noisy_mean_accuracy": round(float(acc_single[wins].mean()), 5),
            "noisy_wins": {names[c]: int((wins == c).sum()) for c in sorted(set(wins.tolist()))},
        }  # fmt: skip
    if dump:
        np.savez_compressed(
            dump, names=np.array(names), val_c=val_c, val_l=val_l, test_c=test_c, n_val=n_val,
            n_test=np.array([len(y) for y in ds.split("test")[1]]), noise_std=plan.noise_std,
        )  # fmt: skip
    best_val = int(np.argmax(val_c.sum(axis=0)))
    return {
        "variant": "oracle larger grid", "m": m, "seed": seed, "eps": eps, "delta": out.get("delta"),
        "clients_per_round": q, "epsilon_reported": out.get("epsilon"),
        "trained_test_accuracy_run": out.get("test_accuracy"),
        "grid": [list(g) for g in grid], "vote_noise_std": plan.noise_std, "noisy_draws": draws,
        "accuracy_every_client": dict(zip(names, acc_single.round(5).tolist(), strict=True)),
        "pooled_val_accuracy": dict(zip(names, (val_c.sum(0) / n_val.sum()).round(4).tolist(),
                                        strict=True)),
        "pooled_val_best": names[best_val],
        "pooled_val_best_accuracy": round(float(acc_single[best_val]), 5),
        "votes": votes, "seconds_run": round(t_run, 1), "seconds_grid": round(t_grid, 1),
        "seconds": round(time.time() - t0, 1),
    }  # fmt: skip


def tallies(
    path: str, draws: int = 2000, seed: int = 0, shares: tuple[float, ...] = (0.05, 0.1, 0.2)
) -> dict[str, Any]:
    """Other vote tallies over the per-client scores saved by :func:`measure_wide` (``dump``),
    each with Gaussian noise for (share·ε, δ) as the built vote plans it
    (:func:`~privmtl.privacy.selection.plan_vote`, ε = 1, δ of the population; σ scaled by the
    tally's L2 sensitivity), for each of ``shares`` (0.05: the built vote's), ``draws`` times
    from a fixed generator; the pooled test accuracy of the winner (exact and mean ± sd over the
    noisy draws). The rounds are not re-run: a larger share also costs the rounds' noise.

    ``split``
        the built vote: a client's one vote shared among its tied best (sensitivity 1);
    ``approval``
        one vote for each of a client's tied best (sensitivity √K);
    ``score``
        a client's validation accuracy of every candidate (each in [0, 1]; sensitivity √K);
    ``centred score``
        the same less the client's mean over the candidates (the same winner without noise:
        every client's row moves by a constant; each row's L2 norm is at most √K / 2).

    Each over three public candidate lists: today's six, the larger list and today's six plus
    the larger grid's points of 30 and 100 epochs (the local-all epochs).
    """
    from privmtl.federated.spec import resolve_delta
    from privmtl.privacy.selection import client_vote_shares, plan_vote

    z = np.load(path)
    names = [str(n) for n in z["names"]]
    val_c, val_l, test_c = z["val_c"], z["val_l"], z["test_c"]
    n_val = z["n_val"]
    m = len(n_val)
    delta = float(resolve_delta(None, m)[0])
    sigmas = {
        sh: plan_vote(min(m, 10_000), epsilon=1.0, delta=delta, share=sh).noise_std for sh in shares
    }
    acc = test_c.sum(axis=0) / float(z["n_test"].sum())
    has = (n_val > 0)[:, None]
    today = ["trained", "local"] + [
        f"bb_e{e}_lr{lr:g}" for e in AUTO_FINETUNE_EPOCHS for lr in AUTO_FINETUNE_LRS
    ]
    lists = {
        "today's six": [names.index(n) for n in today],
        "larger": list(range(len(names))),
        "today's six + 30/100 epochs": sorted(
            {names.index(n) for n in today}
            | {j for j, n in enumerate(names) if n.startswith(("bb_e30_", "bb_e100_"))}
        ),
    }
    rng = np.random.default_rng([seed, 2027])
    out: dict[str, Any] = {}
    for label, cols in lists.items():
        k = len(cols)
        ok = has & np.isfinite(val_l[:, cols])
        sc = np.where(ok, val_c[:, cols], np.nan)
        frac = np.where(ok, val_c[:, cols] / np.maximum(n_val, 1)[:, None], 0.0)
        top = np.nanmax(np.where(ok, sc, -np.inf), axis=1, keepdims=True)
        rows = {
            "split": (client_vote_shares(sc), 1.0),
            "approval": (np.where(ok, (sc == top).astype(float), 0.0), float(np.sqrt(k))),
            "score": (frac, float(np.sqrt(k))),
            "centred score": (
                np.where(ok, frac - frac.mean(axis=1, keepdims=True), 0.0),
                float(np.sqrt(k)) / 2,
            ),
        }
        res: dict[str, Any] = {}
        for how, (contrib, sens) in rows.items():
            counts = contrib.sum(axis=0)
            w = cols[int(np.argmax(counts))]
            res[how] = {
                "sensitivity": round(sens, 3), "exact_winner": names[w],
                "exact_accuracy": round(float(acc[w]), 5),
            }  # fmt: skip
            for sh, sigma in sigmas.items():
                noisy = counts[None, :] + rng.normal(0.0, sigma * sens, (draws, k))
                wins = np.array(cols)[np.argmax(noisy, axis=1)]
                res[how][f"share {sh:g}"] = {
                    "noise_std": round(sigma * sens, 1),
                    "noisy_mean_accuracy": round(float(acc[wins].mean()), 5),
                    "noisy_sd_accuracy": round(float(acc[wins].std()), 5),
                }
        out[label] = res
    return {
        "variant": "tallies larger grid", "scores": path, "draws": draws, "delta": delta,
        "accountant": "rdp", "relation": "add-remove", "noise": "seeded run (a simulation)",
        "tallies": out,
    }  # fmt: skip


def built(m: int, seed: int, eps: float | None, q: int, select: str) -> dict[str, Any]:
    """One run of ``privmtl pmtl`` as built, at the study's settings: ``finetune_select``
    ``"vote"`` (the recorded vote) or ``"client"`` (every client's own choice), with the SGD
    grids' candidates this study measured (``local_solver="sgd"``)."""
    t0 = time.time()
    out = run_pmtl(
        num_clients=m, epsilon=eps, noise_source="seeded", seed=seed, show_progress=False,
        threads=1, clients_per_round=q, finetune_select=select, local_solver="sgd",
    )  # fmt: skip
    auto = out["finetune_auto"]
    return {
        "variant": f"built finetune_select={select}", "m": m, "seed": seed, "eps": eps,
        "clients_per_round": q, "delta": out["delta"], "epsilon": out["epsilon"],
        "noise_std": out["noise_std"], "test_accuracy": out["test_accuracy"],
        "pre_finetune_test_accuracy": out.get("pre_finetune_test_accuracy"),
        "select": auto["select"], "vote": auto.get("vote"),
        "clients_per_candidate": auto["clients_per_candidate"],
        "seconds": round(time.time() - t0, 1),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eps", type=float, default=1.0, help="ε; 0: non-private")
    ap.add_argument(
        "--check", action="store_true", help="also run the CLI default (finetune='auto') once"
    )
    ap.add_argument("--q", type=int, help="clients per round (default: the study's min(200, m))")
    ap.add_argument(
        "--built", choices=["vote", "client"], help="run the CLI as built with this selection"
    )
    ap.add_argument("--wide", action="store_true", help="the oracle over the larger billboard grid")
    ap.add_argument("--dump", help="--wide: save the per-client scores to this .npz")
    ap.add_argument("--tallies", help="compare vote tallies on a --dump file")
    a = ap.parse_args()
    if a.tallies:
        row = {"m": a.m, "seed": a.seed, "eps": a.eps, **tallies(a.tallies)}
        append_jsonl(OUT, row)
        print(row)
        return
    torch.set_num_threads(1)
    q = a.q or min(200, a.m)
    if a.wide:
        row = measure_wide(a.m, a.seed, a.eps or None, q, dump=a.dump)
        append_jsonl(OUT, row)
        print(row)
        return
    if a.built:
        row = built(a.m, a.seed, a.eps or None, q, a.built)
        append_jsonl(OUT, row)
        print(row)
        return
    row = measure(a.m, a.seed, a.eps or None, q)
    if a.check:  # the reconstruction of ``today`` against the end of run itself
        out = run_pmtl(
            num_clients=a.m, epsilon=a.eps or None, noise_source="seeded", seed=a.seed,
            show_progress=False, threads=1, clients_per_round=q,
        )  # fmt: skip
        row["check_default_test_accuracy"] = out["test_accuracy"]
        row["check_clients_per_candidate"] = out["finetune_auto"]["clients_per_candidate"]
    append_jsonl(OUT, row)
    print(row)


if __name__ == "__main__":
    main()
