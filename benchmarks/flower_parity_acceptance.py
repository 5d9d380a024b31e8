"""The parity acceptance of the two transports: ``privmtl pmtl`` and ``privmtl flower local`` with the same flags.

Runs ``privmtl pmtl --json`` and ``privmtl flower local --num-supernodes 3 --json`` with the flags
of the acceptance (``--data synthetic --model logreg --clients-per-round 6 --epsilon 2 --seed 0
--reproducible-noise``, 8 rounds; every other setting at the product default, including
``finetune="auto"``) and compares the resolved ``config`` of the two (the keys both report and
the values that differ), ε and the test accuracy (after each run's end-of-run finish) and the
accuracy of the released global model. Checks: at least 10 shared keys, none differing, ε within
1e-6, test accuracy within 0.01.

Appends to ``results/flower_parity.jsonl`` and writes ``results/flower_parity.md``; exits with
status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import RESULTS, append_jsonl, load_jsonl, machine_info, markdown_table

FLAGS = [
    "--data", "synthetic", "--model", "logreg", "--clients-per-round", "6", "--epsilon", "2",
    "--seed", "0", "--reproducible-noise", "--rounds", "8", "--json",
]  # fmt: skip
FLOWER = ["flower", "local", "--num-supernodes", "3"]


def _run(args: list[str]) -> tuple[dict[str, Any], float]:
    exe = str(Path(sys.executable).parent / "privmtl")
    t0 = time.perf_counter()
    out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=1800, check=True)
    return json.loads(out.stdout), time.perf_counter() - t0


def run_once() -> dict[str, Any]:
    pmtl, pmtl_seconds = _run(["pmtl", *FLAGS])
    with tempfile.TemporaryDirectory(prefix="privmtl-parity-") as tmp:
        flower, flower_seconds = _run([*FLOWER, *FLAGS, "--work-dir", str(Path(tmp) / "w")])
    shared = sorted(set(pmtl["config"]) & set(flower["config"]))
    differing = {k: [pmtl["config"][k], flower["config"][k]] for k in shared if pmtl["config"][k] != flower["config"][k]}  # fmt: skip
    keys = ("epsilon", "test_accuracy", "pre_finetune_test_accuracy", "global_test_accuracy")
    return {
        "command": "privmtl pmtl|flower local " + " ".join(FLAGS),
        "shared_config_keys": len(shared),
        "differing": differing,
        "pmtl": {k: pmtl.get(k) for k in keys},
        "flower": {k: flower.get(k) for k in keys},
        "finetune_auto": [
            pmtl.get("finetune_auto", {}).get("clients_per_candidate"),
            flower.get("finetune_auto", {}).get("clients_per_candidate"),
        ],
        "seconds": {"pmtl": pmtl_seconds, "flower": flower_seconds},
        "machine": machine_info(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _ok(r: dict[str, Any]) -> bool:
    eps = abs(r["pmtl"]["epsilon"] - r["flower"]["epsilon"])
    acc = abs(r["pmtl"]["test_accuracy"] - r["flower"]["test_accuracy"])
    return r["shared_config_keys"] >= 10 and not r["differing"] and eps <= 1e-6 and acc <= 0.01


def report(rows: list[dict[str, Any]]) -> bool:
    table = [
        [
            r["time_utc"],
            r["shared_config_keys"],
            len(r["differing"]),
            f"{r['pmtl']['epsilon']:.12g} / {r['flower']['epsilon']:.12g}",
            f"{r['pmtl']['test_accuracy']:.4f} / {r['flower']['test_accuracy']:.4f}",
            f"{r['pmtl']['pre_finetune_test_accuracy']:.4f} / "
            f"{r['flower']['pre_finetune_test_accuracy']:.4f}",
            f"{r['pmtl']['global_test_accuracy']:.4f} / {r['flower']['global_test_accuracy']:.4f}",
            f"{r['finetune_auto'][0]} / {r['finetune_auto'][1]}",
            "PASS" if _ok(r) else "FAIL",
        ]
        for r in rows
    ]
    ok = bool(rows) and all(_ok(r) for r in rows)
    lines = [
        "# privmtl pmtl and privmtl flower local: one protocol, two transports",
        "",
        f"`{rows[0]['command'] if rows else ''}`; Flower on 3 SuperNodes (loopback). Every other "
        "setting at the product default (`finetune=auto`: on Flower each node runs its clients' "
        "choice on their own data). Columns: `privmtl pmtl` / `privmtl flower local`. "
        "Acceptance: >= 10 shared `config` keys, none differing, the same ε (1e-6), test "
        "accuracy within 0.01.",
        "",
        markdown_table(
            [
                "finished (UTC)",
                "shared config keys",
                "differing",
                "ε",
                "test accuracy",
                "before finish",
                "global model",
                "finetune=auto choices",
                "result",
            ],
            table,
        ),
        "",
        "Reproduce: `python benchmarks/flower_parity_acceptance.py` (needs `privmtl[flower]`).",
    ]
    (RESULTS / "flower_parity.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    path = RESULTS / "flower_parity.jsonl"
    if not args.report_only:
        append_jsonl(path, run_once())
    sys.exit(0 if report(load_jsonl(path)) else 1)


if __name__ == "__main__":
    main()
