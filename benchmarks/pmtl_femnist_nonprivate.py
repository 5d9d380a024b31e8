"""Non-private PMTL on FEMNIST-105 (CNN, 300 rounds, 20 clients per round, λ = 0.1, no clipping).

Compares the two client messages: Algorithm 1 as printed (``delta``: w_k^new − w_k^old) and the
authors' code (``offset``: w_k^new − w̃). Appends to ``results/pmtl_femnist_nonprivate.jsonl`` and
writes ``results/pmtl_femnist_nonprivate.md``. One torch thread (the machine is shared).

Run: ``python benchmarks/pmtl_femnist_nonprivate.py [--report]``
"""

import sys
import time

from _common import RESULTS, append_jsonl

from privmtl.experiments.pmtl import load_federated, make_model
from privmtl.federated.config import TrainConfig
from privmtl.federated.engine import train


def report() -> None:
    from _common import load_jsonl, markdown_table

    rows = load_jsonl(RESULTS / "pmtl_femnist_nonprivate.jsonl")
    table = [
        [r["server_update"], r["rounds"], r["clients_per_round"], r["lam"],
         f"{r['test_accuracy']:.4f}", f"{r['mean_client_accuracy']:.4f}",
         f"{r['global_test_accuracy']:.4f}",
         ", ".join(f"{t + 1}: {v:.3f}" for t, v in r["val_history"]),
         f"{r['seconds_per_round']:.2f}"]
        for r in rows
    ]  # fmt: skip
    text = [
        "# Non-private PMTL on FEMNIST-105 (CNN, seed 0)",
        "",
        "Personalized models' test accuracy pooled over the 1 685 test images; the global model's for",
        "comparison; validation accuracy of the personalized models every 50 rounds.",
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
                "val acc by round",
                "s/round",
            ],
            table,
        ),
        "",
        "`delta` (Algorithm 1 as printed) moves the billboard m/q = 5.25 times faster than the mean of",
        "the personalized models and diverges after ~50 rounds; `offset` (the authors' code) trains.",
        "",
        "Reproduce: `python benchmarks/pmtl_femnist_nonprivate.py`",
    ]
    (RESULTS / "pmtl_femnist_nonprivate.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))


if "--report" in sys.argv:
    report()
    sys.exit(0)
ds = load_federated("femnist-leaf", data_path="../shared/data/femnist-leaf", seed=0)
for upd in ["delta", "offset"]:
    cfg = TrainConfig(
        method="pmtl",
        rounds=300,
        clients_per_round=20,
        lr=0.1,
        batch_size=10,
        lam=0.1,
        clip=None,
        noise_std=0.0,
        sampling="poisson",
        seed=0,
        threads=1,
        progress=False,
        server_update=upd,
        eval_every=50,
    )
    t = time.time()
    r = train(ds, make_model("cnn", ds, 0), cfg)
    row = {
        "group": "nonprivate-300r",
        "method": "pmtl",
        "server_update": upd,
        "rounds": 300,
        "clients_per_round": 20,
        "lam": 0.1,
        "clip": None,
        "epsilon": None,
        "seed": 0,
        "test_accuracy": r.test_accuracy,
        "mean_client_accuracy": r.mean_client_accuracy,
        "global_test_accuracy": r.accuracies["test"]["global"]["accuracy"],
        "val_history": [
            (h["round"], h.get("val_accuracy")) for h in r.history if "val_accuracy" in h
        ],
        "seconds_per_round": r.seconds_per_round,
        "seconds": time.time() - t,
    }
    append_jsonl(RESULTS / "pmtl_femnist_nonprivate.jsonl", row)
    print(row, flush=True)
report()
