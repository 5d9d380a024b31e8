"""The ServerApp's and the SuperLink's peak memory while they take the nodes' scores.

Runs ``privmtl flower local --num-supernodes 4`` (synthetic logreg, ``--m`` clients, ``--rounds``
rounds, ``--epsilon 1 --finetune none``, seed 0) with the package from ``--src`` (a checkout's
``src``: this tree's by default; another commit's to compare) and records each process role's
peak resident memory (:class:`flower_scale.TreeMonitor`), test accuracy and ε, labelled
``--label``. Appends to ``results/flower_score_memory.jsonl`` and rewrites
``results/flower_score_memory.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from _common import RESULTS, append_jsonl, load_jsonl, machine_info, markdown_table
from flower_scale import run_one

JSONL = RESULTS / "flower_score_memory.jsonl"
MD = RESULTS / "flower_score_memory.md"


def report() -> None:
    rows = load_jsonl(JSONL)
    head = [
        "finished (UTC)", "label", "m", "rounds", "exit", "ServerApp peak RSS MB",
        "SuperLink peak RSS MB", "tree peak RSS GB", "test accuracy", "ε",
    ]  # fmt: skip
    table = [
        [
            r["finished"][:19], r["label"], r["m"], r["rounds"], r["exit_code"],
            max(r["processes"].get("serverapp", [0])), max(r["processes"].get("superlink", [0])),
            f"{r['peak_rss_gb']:.2f}", f"{r.get('test_accuracy', float('nan')):.12g}",
            f"{r.get('epsilon', float('nan')):.12g}",
        ]
        for r in rows
    ]  # fmt: skip
    MD.write_text(
        "# The ServerApp's and SuperLink's peak memory with the nodes' scores\n\n"
        "Produced by `python benchmarks/flower_score_memory.py --label L [--src PATH]` "
        "(`privmtl flower local --num-supernodes 4`, synthetic logreg, seed 0, "
        "`--epsilon 1 --finetune none`): each role's peak resident memory, sampled every "
        "second. *before*: the nodes' per-client scores as JSON lists; *after*: as arrays "
        "in the reply.\n\n" + markdown_table(head, table) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"))
    parser.add_argument("--label", default="after")
    parser.add_argument("--report-only", action="store_true")
    ns = parser.parse_args()
    if not ns.report_only:
        os.environ["PYTHONPATH"] = ns.src
        flags = ["--epsilon", "1", "--finetune", "none"]
        with tempfile.TemporaryDirectory(prefix="privmtl-score-memory-") as tmp:
            row = run_one("flower", ns.m, ns.rounds, flags, Path(tmp) / "w")
        row.update(
            label=ns.label, src=ns.src, machine=machine_info(),
            finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )  # fmt: skip
        append_jsonl(JSONL, row)
        print(json.dumps({k: row.get(k) for k in ("label", "exit_code", "processes")}))
    report()


if __name__ == "__main__":
    main()
