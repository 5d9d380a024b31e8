"""Per-client validation and test scores of the CNN's local training after every epoch count of a
long grid, on FEMNIST-105 (needs ``../shared/data``): what an end of run that trains fewer epochs
would score, measured against the default grid (:data:`~privmtl.federated.local.LOCAL_EPOCHS` x
:data:`~privmtl.federated.local.LOCAL_LRS`) on the same models.

``python benchmarks/cnn_local_epochs.py --seed S --lr LR --epochs 1 2 ... 100 --out FILE.jsonl``
trains every writer alone from the run's initial model (``make_model("cnn", ds, S)``) at step
size ``LR`` (``--solver sgd`` or ``adam``) for ``max(epochs)`` epochs (the minibatches of
:func:`~privmtl.federated.local.train_local` with ``seed=S``; one torch thread) and appends one
row per epoch count: every writer's correct validation predictions, validation loss and correct
test predictions. ``benchmarks/cnn_local_choice.py`` replays any per-client choice from the rows.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from privmtl.data.registry import load_federated
from privmtl.experiments.pmtl import make_model
from privmtl.federated.end_of_run.local_grid import _train_grid
from privmtl.federated.scoring import client_scores
from privmtl.federated.spec import SPEC


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--solver", choices=("sgd", "adam"), default="sgd")
    ap.add_argument("--epochs", type=int, nargs="+", required=True)
    ap.add_argument("--data-path", default=None)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ds = load_federated("femnist-leaf", data_path=args.data_path, seed=args.seed)
    net = make_model("cnn", ds, args.seed)
    init = {n: p.detach().clone() for n, p in net.named_parameters()}
    buffers = {n: b.detach() for n, b in net.named_buffers()}
    grid = [(e, args.lr) for e in sorted(set(args.epochs))]
    t0 = time.perf_counter()
    models = _train_grid(
        net, buffers, init, ds, grid, SPEC.batch_size, args.seed, 64, True,
        adam=args.solver == "adam",
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    val_x, val_y = ds.split("val")
    test_x, test_y = ds.split("test")
    with args.out.open("a") as f:
        for (e, lr), params in zip(grid, models, strict=True):
            vc, vl = client_scores(net, params, buffers, val_x, val_y)
            tc, _ = client_scores(net, params, buffers, test_x, test_y)
            row = {
                "seed": args.seed, "solver": args.solver, "lr": lr, "epochs": e,
                "val_correct": vc.tolist(), "val_loss": vl.tolist(), "test_correct": tc.tolist(),
                "val_n": [len(v) for v in val_y], "test_n": [len(t) for t in test_y],
                "train_seconds": seconds, "epochs_trained": max(args.epochs),
                "command": "python benchmarks/cnn_local_epochs.py --seed "
                f"{args.seed} --solver {args.solver} --lr {args.lr} "
                f"--epochs {' '.join(map(str, args.epochs))}",
            }  # fmt: skip
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
