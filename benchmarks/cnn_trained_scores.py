"""Per-writer validation and test scores of the models a FEMNIST-105 CNN run saved: ``python
benchmarks/cnn_trained_scores.py --seed S --models DIR --out FILE.jsonl`` (DIR: ``--save-models``
of ``privmtl pmtl --data femnist-leaf --model cnn --seed S --finetune none``, i.e. PMTL's trained
candidate). Appends one row in the format of ``benchmarks/cnn_local_epochs.py`` with
``"candidate": "trained"``, so that ``benchmarks/cnn_local_choice.py`` replays the end of run's
choice between the trained model and any local-training scheme on the same trained models.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from privmtl.data.registry import load_federated
from privmtl.experiments.pmtl import make_model
from privmtl.federated.saved import load_models
from privmtl.federated.scoring import client_scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", type=Path, required=True)
    ap.add_argument("--data-path", default=None)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    ds = load_federated("femnist-leaf", data_path=args.data_path, seed=args.seed)
    net = make_model("cnn", ds, args.seed)
    _, _, pers = load_models(args.models)
    assert pers is not None, "the folder holds no personalized models"
    val_x, val_y = ds.split("val")
    test_x, test_y = ds.split("test")
    vc, vl = client_scores(net, pers, {}, val_x, val_y)
    tc, _ = client_scores(net, pers, {}, test_x, test_y)
    row = {
        "seed": args.seed, "candidate": "trained", "lr": None, "epochs": None,
        "val_correct": vc.tolist(), "val_loss": vl.tolist(), "test_correct": tc.tolist(),
        "val_n": [len(v) for v in val_y], "test_n": [len(t) for t in test_y],
        "models": str(args.models),
    }  # fmt: skip
    with args.out.open("a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
