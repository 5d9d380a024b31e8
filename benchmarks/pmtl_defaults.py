"""PMTL and private FedAvg on FEMNIST-105 at the CLI's defaults (``results/pmtl_defaults.md``).

Every run is ``privmtl pmtl`` with only data, model, method, rounds, clients per round, ε and seed
given; everything else is the CLI default of the version that ran it (each row records
``defaults`` and its exact ``command``). The noise comes from the secure source, as by default:
the runs are not bit-reproducible (the seed fixes data splits, model initialisation and client
sampling). Resumable: finished (group, method, seed) rows of the current defaults are skipped.

    python benchmarks/pmtl_defaults.py --data-path ../shared/data/femnist-leaf --seeds 0
    python benchmarks/pmtl_defaults.py --report
"""

from __future__ import annotations

import argparse
from typing import Any

from _common import (
    RESULTS,
    append_jsonl,
    load_jsonl,
    markdown_table,
    run_pmtl_seed,
    seeds_main,
    seeds_parser,
)

from privmtl.privacy.release import billboard_noise_and_bound

LOG = RESULTS / "pmtl_defaults.jsonl"
DEFAULTS = "ditto+auto"
"""The CLI defaults measured now (``--server-update ditto``, ``--finetune auto``); rows without
the field ran at the earlier ones (``offset``, no fine-tuning)."""
#: --paper-delta: the committed rows ran at the PMTL paper's delta = 1/m (the earlier default)
BASE = ["--data", "femnist-leaf", "--model", "cnn", "--clients-per-round", "20", "--paper-delta"]
#: group -> (method, extra arguments)
RUNS: dict[str, list[tuple[str, list[str]]]] = {
    "ε = 2, 100 rounds": [
        ("pmtl", ["--rounds", "100", "--epsilon", "2"]),
        ("fedavg", ["--rounds", "100", "--epsilon", "2"]),
    ],
    "non-private, 300 rounds": [("pmtl", ["--rounds", "300"])],
}


def _argv(method: str, extra: list[str]) -> list[str]:
    return [*BASE[:4], "--method", method, *BASE[4:], *extra]


def run(args: argparse.Namespace) -> None:
    done = {
        (r.get("group"), r["method"], r["seed"])
        for r in load_jsonl(LOG)
        if r.get("defaults") == DEFAULTS
    }
    for seed in [int(s) for s in args.seeds.split(",")]:
        for group, runs in RUNS.items():
            for method, extra in runs:
                if (group, method, seed) in done:
                    continue
                argv = _argv(method, extra)
                out, seconds = run_pmtl_seed(
                    argv, seed, args.data_path, f"{group} {method} seed {seed}"
                )
                row = {
                    "defaults": DEFAULTS,
                    "group": group,
                    "wall_seconds": seconds,
                    "command": "privmtl pmtl " + " ".join(argv) + f" --seed {seed} --json "
                    "--data-path DIR",
                    **{k: v for k, v in out.items() if k != "epsilon_per_round"},
                }
                append_jsonl(LOG, row)
                print(f"{group} {method} seed {seed}: {out['test_accuracy']:.4f}", flush=True)


def report() -> str:
    rows = [r for r in load_jsonl(LOG) if r.get("defaults") == DEFAULTS]
    table = []
    for r in rows:
        auto: dict[str, Any] = r.get("finetune_auto") or {}
        table.append(
            [
                r["group"],
                r["method"],
                r["seed"],
                r["server_update"] if r["method"] == "pmtl" else "–",
                r["lam"] if r["method"] == "pmtl" else "–",
                "{:.3g} / {:g}".format(  # the finetune-auto rule: noise of the T releases vs Tγ
                    *billboard_noise_and_bound(
                        r["noise_std"] or 0.0, r["clip"], r["released_dim"], r["rounds"]
                    )
                ),
                auto.get("chosen", "–"),
                f"{r['pre_finetune_test_accuracy']:.4f}",
                f"**{r['test_accuracy']:.4f}**",
                f"{r['val_accuracy']:.4f}",
                f"{r['wall_seconds']:.0f}",
            ]
        )
    header = [
        "group", "method", "seed", "message", "λ", "σ√(kT) / Tγ", "finetune auto",
        "trained models test acc", "test acc (CLI answer)", "val acc", "s",
    ]  # fmt: skip
    return markdown_table(header, table)


def main() -> None:
    seeds_main(seeds_parser(__doc__.split("\n")[0], seeds="0"), run, report)


if __name__ == "__main__":
    main()
