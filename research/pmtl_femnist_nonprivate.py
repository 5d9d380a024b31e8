"""Non-private PMTL on FEMNIST-105 (CNN, 300 rounds, 20 clients per round, λ = 0.1, no clipping).

Compares the two client messages: Algorithm 1 as printed (``delta``: w_k^new − w_k^old) and the
authors' code (``offset``: w_k^new − w̃). Appends to ``results/pmtl_femnist_nonprivate.jsonl`` and
writes ``results/pmtl_femnist_nonprivate.md``. One torch thread (the machine is shared).

Run: ``python research/pmtl_femnist_nonprivate.py [--report]``
"""

import sys
import time

import torch
from _common import RESULTS, append_jsonl, load_jsonl

from privmtl.experiments.pmtl import load_federated, make_model
from privmtl.federated.config import TrainConfig
from privmtl.federated.engine import train
from privmtl.federated.finetune import finetune


def report() -> None:
    from _common import load_jsonl, markdown_table

    rows = load_jsonl(RESULTS / "pmtl_femnist_nonprivate.jsonl")
    table = [
        [r["server_update"], r["rounds"], r["clients_per_round"], r["lam"],
         f"{r['test_accuracy']:.4f}", f"{r['mean_client_accuracy']:.4f}",
         f"{r['global_test_accuracy']:.4f}",
         ", ".join(f"{k}: {v:.4f}" for k, v in r.get("finetune_test_accuracy", {}).items()) or "–",
         ", ".join(f"{t + 1}: {v:.3f}" for t, v in r["val_history"]),
         f"{r['seconds_per_round']:.2f}"]
        for r in rows
    ]  # fmt: skip
    text = [
        "# Non-private PMTL on FEMNIST-105 (CNN, seed 0)",
        "",
        "Personalized models' test accuracy pooled over the 1 685 test images; the global model's for",
        "comparison; test accuracy after one local epoch of fine-tuning (post-processing) from the",
        "personalized or the global model; validation accuracy of the personalized models every",
        "50 rounds.",
        "",
        markdown_table(
            [
                "client message",
                "T",
                "q",
                "λ",
                "test acc (personalized)",
                "mean client acc",
                "test acc (global)",
                "after 1 epoch of local fine-tuning (start + objective)",
                "val acc by round",
                "s/round",
            ],
            table,
        ),
        "",
        "`delta` (Algorithm 1 as printed) moves the billboard m/q = 5.25 times faster than the mean of",
        "the personalized models and diverges after ~50 rounds; `offset` (the authors' code) trains.",
        "With λ = 1 and 500 rounds the personalized models reach 0.779 (≥ 0.75; the paper reports 0.83",
        "with 205 clients); the global model of the same run (the billboard) is higher still, 0.829:",
        "on FEMNIST's 105 writers a stronger pull towards the mean helps, and one local epoch of",
        "fine-tuning does not add accuracy.",
        "",
        "Reproduce: `python research/pmtl_femnist_nonprivate.py`",
    ]
    (RESULTS / "pmtl_femnist_nonprivate.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))


if "--report" in sys.argv:
    report()
    sys.exit(0)
#: (client message, rounds, clients per round, λ); rows already in the jsonl are skipped.
SETTINGS = [
    ("delta", 300, 20, 0.1),
    ("offset", 300, 20, 0.1),
    # towards the paper's 0.83: personalized models held closer to the billboard, more rounds
    ("offset", 500, 20, 1.0),
]


def _done(row: dict, setting: tuple) -> bool:
    upd, rounds, q, lam = setting
    return (row["server_update"], row["rounds"], row["clients_per_round"], row["lam"]) == (
        upd, rounds, q, lam
    )  # fmt: skip


torch.set_num_threads(1)
ds = load_federated("femnist-leaf", data_path="../shared/data/femnist-leaf", seed=0)
for setting in SETTINGS:
    if any(_done(r, setting) for r in load_jsonl(RESULTS / "pmtl_femnist_nonprivate.jsonl")):
        continue
    upd, rounds, q, lam = setting
    cfg = TrainConfig(
        method="pmtl",
        rounds=rounds,
        clients_per_round=q,
        lr=0.1,
        batch_size=10,
        lam=lam,
        clip=None,
        noise_std=0.0,
        sampling="poisson",
        seed=0,
        threads=1,
        progress=True,
        server_update=upd,
        eval_every=50,
    )
    t = time.time()
    net = make_model("cnn", ds, 0)
    r = train(ds, net, cfg)
    ft = {}
    for name, start in (("vanilla", "personalized"), ("mr", "personalized"), ("vanilla", "global")):
        _, acc = finetune(r, ds, net, method=name, start=start, epochs=1, lr=0.1, batch_size=10,
                          lam=lam, seed=0)  # fmt: skip
        ft[f"{start} + {name}"] = acc["test"]["accuracy"]
    row = {
        "group": f"nonprivate-{rounds}r",
        "method": "pmtl",
        "server_update": upd,
        "rounds": rounds,
        "clients_per_round": q,
        "lam": lam,
        "clip": None,
        "epsilon": None,
        "seed": 0,
        "test_accuracy": r.test_accuracy,
        "mean_client_accuracy": r.mean_client_accuracy,
        "global_test_accuracy": r.accuracies["test"]["global"]["accuracy"],
        "finetune_test_accuracy": ft,
        "val_history": [
            (h["round"], h.get("val_accuracy")) for h in r.history if "val_accuracy" in h
        ],
        "seconds_per_round": r.seconds_per_round,
        "seconds": time.time() - t,
    }
    append_jsonl(RESULTS / "pmtl_femnist_nonprivate.jsonl", row)
    print(row, flush=True)
report()
