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
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from typing import Any

import numpy as np
import torch
from _common import RESULTS, append_jsonl

from privmtl.data.registry import load_federated
from privmtl.experiments.pmtl import run_pmtl
from privmtl.federated.algorithms import client_scores
from privmtl.federated.finish import (
    AUTO_FINETUNE_EPOCHS,
    AUTO_FINETUNE_LRS,
    auto_plan,
    stack_trained,
)
from privmtl.federated.local import client_better, train_local
from privmtl.federated.models import DEFAULT_MODEL, make_model
from privmtl.federated.saved import load_models

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
    with tempfile.TemporaryDirectory() as tmp:
        out = run_pmtl(
            num_clients=m, epsilon=eps, noise_source="seeded", seed=seed, finetune="none",
            save_models=tmp, show_progress=False, threads=1, clients_per_round=q,
        )  # fmt: skip
        _, glob, pers = load_models(tmp)
    t_run = time.time() - t0
    cfg = out["config"]
    ds = load_federated("synthetic", seed=seed, num_clients=m)
    net = make_model(DEFAULT_MODEL, ds, seed)
    buffers = {n: b.detach() for n, b in net.named_buffers()}
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


def built(m: int, seed: int, eps: float | None, q: int, select: str) -> dict[str, Any]:
    """One run of ``privmtl pmtl`` as built, at the study's settings: ``finetune_select``
    ``"vote"`` (the recorded vote) or ``"client"`` (today's default)."""
    t0 = time.time()
    out = run_pmtl(
        num_clients=m, epsilon=eps, noise_source="seeded", seed=seed, show_progress=False,
        threads=1, clients_per_round=q, finetune_select=select,
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
    a = ap.parse_args()
    torch.set_num_threads(1)
    q = a.q or min(200, a.m)
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
