"""Replay the end of run's per-client choices on FEMNIST-105 from the rows of
``benchmarks/cnn_local_epochs.py`` (and ``benchmarks/cnn_trained_scores.py``):
``python benchmarks/cnn_local_choice.py ROWS.jsonl ...`` prints a Markdown table.

A local scheme is a solver and a list of ``(epochs, lr)`` points in public order; every writer
keeps the point with the most correct predictions on its own validation split, ties to the later
(:func:`~privmtl.federated.local.client_better`): ``--method local-all``. With the trained rows of
a PMTL run, each writer then chooses between its trained model and that local model, ties to the
local one (``finetune="auto"``'s order where the billboard carries no clear signal, as at ε = 1):
the default PMTL run's end of run. The cost of a scheme is the epochs it trains: per step size
the largest number of epochs (one run per step size; the others are snapshots of it).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

import numpy as np

from privmtl.federated.local import ADAM_EPOCHS, ADAM_LRS, LOCAL_EPOCHS, LOCAL_LRS, client_better

Scheme = tuple[str, list[tuple[int, float]]]
SCHEMES: dict[str, Scheme] = {
    "SGD grid (10, 30, 100) x (0.03, 0.1) (before)": (
        "sgd", [(e, lr) for e in LOCAL_EPOCHS for lr in LOCAL_LRS]
    ),
    "Adam (15, 20) x 0.003 (now: ADAM_EPOCHS x ADAM_LRS)": (
        "adam", [(e, lr) for e in ADAM_EPOCHS for lr in ADAM_LRS]
    ),
    "Adam (10, 15) x 0.003": ("adam", [(10, 0.003), (15, 0.003)]),
    "Adam 10 x 0.003": ("adam", [(10, 0.003)]),
    "Adam 15 x 0.003": ("adam", [(15, 0.003)]),
    "Adam 20 x 0.003": ("adam", [(20, 0.003)]),
    "Adam (10, 15, 20) x 0.003": ("adam", [(10, 0.003), (15, 0.003), (20, 0.003)]),
    "Adam (12, 20) x 0.003": ("adam", [(12, 0.003), (20, 0.003)]),
    "Adam (10, 20) x 0.003": ("adam", [(10, 0.003), (20, 0.003)]),
    "SGD 15 x 0.1": ("sgd", [(15, 0.1)]),
    "SGD 20 x 0.1": ("sgd", [(20, 0.1)]),
    "SGD (10, 15, 20) x 0.1": ("sgd", [(10, 0.1), (15, 0.1), (20, 0.1)]),
    "SGD 30 x 0.1": ("sgd", [(30, 0.1)]),
    "SGD (10, 30) x (0.03, 0.1)": ("sgd", [(e, lr) for e in (10, 30) for lr in LOCAL_LRS]),
}  # fmt: skip


def load(paths: list[str]) -> tuple[dict[int, dict], dict[int, dict]]:
    """Per seed: the local rows by ``(solver, epochs, lr)``, and the trained row."""
    local: dict[int, dict] = defaultdict(dict)
    trained: dict[int, dict] = {}
    for path in paths:
        for line in open(path):
            r = json.loads(line)
            if r.get("candidate") == "trained":
                trained[r["seed"]] = r
            elif "clients" not in r:  # whole-population rows only
                local[r["seed"]][(r.get("solver", "sgd"), r["epochs"], r["lr"])] = r
    return local, trained


def _arrays(r: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.array(r["val_correct"], float),
        np.array(r["val_loss"], float),
        np.array(r["test_correct"], float),
    )


def choose(rows: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every writer's choice among ``rows`` (public order): its validation correct count and loss
    and its test correct count."""
    best_c, best_l, test = _arrays(rows[0])
    for r in rows[1:]:
        c, loss, t = _arrays(r)
        better = client_better(c, loss, best_c, best_l)
        best_c, best_l = np.where(better, c, best_c), np.where(better, loss, best_l)
        test = np.where(better, t, test)
    return best_c, best_l, test


def accuracy(test: np.ndarray, r: dict) -> tuple[float, float]:
    n = np.array(r["test_n"], float)
    return float(test.sum() / n.sum()), float(np.mean(test[n > 0] / n[n > 0]))


def cost(points: list[tuple[int, float]]) -> int:
    most: dict[float, int] = {}
    for e, lr in points:
        most[lr] = max(most.get(lr, 0), e)
    return sum(most.values())


def main(paths: list[str]) -> None:
    local, trained = load(paths)
    seeds = sorted(local)
    head = " | ".join(f"seed {s}" for s in seeds)
    print(f"| scheme | epochs trained | end of run | {head} | mean ± sd |")
    print("|---|---|---|" + "---|" * (len(seeds) + 1))
    for name, (solver, points) in SCHEMES.items():
        for pmtl in (False, True):
            accs = []
            for s in seeds:
                keys = [(solver, e, lr) for e, lr in points]
                if not all(k in local[s] for k in keys) or (pmtl and s not in trained):
                    accs.append(float("nan"))
                    continue
                c, loss, t = choose([local[s][k] for k in keys])
                if pmtl:
                    tc, tl, tt = _arrays(trained[s])
                    t = np.where(client_better(c, loss, tc, tl), t, tt)
                accs.append(accuracy(t, local[s][keys[0]])[0])
            if pmtl and all(np.isnan(accs)):
                continue
            got = [a for a in accs if not np.isnan(a)]
            cells = " | ".join("–" if np.isnan(a) else f"{a:.4f}" for a in accs)
            spread = f"{np.mean(got):.4f} ± {np.std(got, ddof=1):.4f}" if len(got) > 1 else "–"
            kind = "PMTL (trained or local)" if pmtl else "local-all"
            print(f"| {name} | {cost(points)} | {kind} | {cells} | {spread} (n={len(got)}) |")


if __name__ == "__main__":
    main(sys.argv[1:])
