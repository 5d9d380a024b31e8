"""A SuperNode killed mid-run, then ``--resume``, beside the uninterrupted run with seeded noise.

Runs ``privmtl flower local``'s engine (:func:`privmtl.flower.launcher.run_local`) twice on the
synthetic logreg population of ``--m`` clients over 4 SuperNodes, ``--rounds`` rounds, ε = 1,
reproducible (seeded) noise, ``--on-missing fail``:

- ``uninterrupted``: one run to its end;
- ``killed+resumed``: SuperNode 2 (its process group and descendants) is killed with SIGKILL when
  the line of round ``--kill-after`` appears; the round that asks it fails, the run stops with its
  checkpoint, and the same work directory is run again with ``resume``.

For each it records ε, test accuracy, the SHA-256 of the released billboards (every round's
tensors, in order, as bytes), the ledger's release ids and how many rounds were charged (a
release id charged twice would show), the rounds run and the wall seconds. Appends to
``results/flower_kill_resume.jsonl`` and rewrites ``results/flower_kill_resume.md``, which says
whether the two runs are identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import RESULTS, append_jsonl, load_jsonl, machine_info, markdown_table

from privmtl.flower.deploy import FlowerRunError, _descendants
from privmtl.flower.launcher import run_local

JSONL = RESULTS / "flower_kill_resume.jsonl"
MD = RESULTS / "flower_kill_resume.md"
NODES = 4
KILLED = 2  # node index


def _config(m: int, rounds: int, finetune: str) -> dict[str, Any]:
    return {
        "data": "synthetic",
        "model": "logreg",
        "num-clients": m,
        "rounds": rounds,
        "epsilon": 1.0,
        "seed": 0,
        "noise-source": "seeded",  # --reproducible-noise
        "finetune": finetune,
        "on-missing": "fail",
        "round-timeout": 600.0,
    }


def _kill(pid: int) -> None:
    victims = {pid, *_descendants(pid)}
    os.killpg(pid, signal.SIGKILL)
    for p in victims:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _billboards_sha256(work: Path) -> tuple[str, int]:
    import torch

    boards = torch.load(work / "server" / "billboards.pt", weights_only=True)
    h = hashlib.sha256()
    for board in boards:
        for name in sorted(board):
            h.update(name.encode())
            h.update(board[name].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest(), len(boards)


def _summary(label: str, res: dict[str, Any], work: Path, wall: float) -> dict[str, Any]:
    entries = [
        json.loads(line) for line in (work / "server" / "ledger.jsonl").read_text().splitlines()
    ]
    releases = [str(e["release_id"]) for e in entries if "release_id" in e]
    sha, boards = _billboards_sha256(work)
    return {
        "run": label,
        "epsilon": res["epsilon"],
        "test_accuracy": res["test_accuracy"],
        "rounds_run": res["rounds_run"],
        "billboards": boards,
        "billboards_sha256": sha,
        "release_ids": releases,
        "rounds_charged": sum(r.startswith("round:") for r in releases),
        "releases_unique": len(set(releases)) == len(releases),
        "wall": wall,
    }


def run(m: int, rounds: int, kill_after: int, finetune: str, tmp: Path) -> list[dict[str, Any]]:
    cfg = _config(m, rounds, finetune)
    t0 = time.perf_counter()
    ref = run_local(num_supernodes=NODES, run_config=cfg, work_dir=tmp / "ref", timeout=3600)
    ref_row = _summary("uninterrupted", ref, tmp / "ref", time.perf_counter() - t0)
    print(json.dumps(ref_row), flush=True)

    work, pids, lines = tmp / "killed", [], []

    def progress(line: str) -> None:
        lines.append(line)
        if f"round {kill_after}/" in line and "KILLED" not in lines:
            _kill(pids[KILLED])
            lines.append("KILLED")

    t0 = time.perf_counter()
    failure = ""
    try:
        run_local(
            num_supernodes=NODES, run_config=cfg, work_dir=work, timeout=3600,
            progress=progress, on_started=pids.extend,
        )  # fmt: skip
    except FlowerRunError as exc:
        failure = str(exc)
    killed_wall = time.perf_counter() - t0
    if "KILLED" not in lines or not failure:
        raise SystemExit(f"the kill did not stop the run (killed: {'KILLED' in lines})")
    manifest = json.loads((work / "server" / "manifest.json").read_text())
    t0 = time.perf_counter()
    again = run_local(
        num_supernodes=NODES, run_config={**cfg, "resume": True}, work_dir=work, timeout=3600
    )
    row = _summary("killed+resumed", again, work, time.perf_counter() - t0)
    row.update(
        killed_after_round=kill_after,
        checkpoint_round=manifest["step"],
        killed_run_wall=killed_wall,
        killed_run_error=failure,
    )
    print(json.dumps({k: v for k, v in row.items() if k != "release_ids"}), flush=True)
    return [ref_row, row]


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("epsilon", "test_accuracy", "rounds_run", "billboards_sha256", "release_ids")
    return all(a[k] == b[k] for k in keys) and a["releases_unique"] and b["releases_unique"]


def report() -> None:
    rows = load_jsonl(JSONL)
    table, verdicts = [], []
    for r in rows:
        table.append([
            r.get("finished", "")[:19], r["m"], r["config"]["rounds"], r["config"]["finetune"],
            r["run"], r.get("killed_after_round", "–"), r.get("checkpoint_round", "–"),
            r["rounds_run"], f"{r['epsilon']:.12g}", f"{r['test_accuracy']:.12g}",
            r["billboards_sha256"][:16], r["rounds_charged"], r["releases_unique"],
            f"{r['wall']:.0f}",
        ])  # fmt: skip
    pairs: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        pairs.setdefault(r["invocation"], {})[r["run"]] = r
    for inv, p in pairs.items():
        if {"uninterrupted", "killed+resumed"} <= set(p):
            a, b = p["uninterrupted"], p["killed+resumed"]
            same = _same(a, b)
            verdicts.append(
                f"- {inv} (m = {a['m']}): **{'identical' if same else 'DIFFERENT'}** "
                "(ε, test accuracy, billboards' SHA-256, release ids, rounds run; "
                f"{b['rounds_charged']} rounds charged once each after the resume: "
                f"{b['releases_unique']})"
            )
    head = [
        "finished (UTC)", "m", "rounds", "finetune", "run", "killed after round",
        "checkpoint round", "rounds run", "ε", "test accuracy", "billboards SHA-256 (16)",
        "rounds charged", "release ids unique", "wall s (resumed part)",
    ]  # fmt: skip
    text = f"""# A SuperNode killed mid-run, then `--resume`, beside the uninterrupted run

Produced by `python benchmarks/flower_kill_resume.py --m M --rounds R` (4 SuperNodes on
loopback, synthetic logreg, ε = 1, seed 0, reproducible noise, `--on-missing fail`). The killed
run: SuperNode 2 and its descendants get SIGKILL when round *killed after round*'s line appears;
the round that asks it fails; the run is started again on the same work directory with
`--resume` from its checkpoint (*checkpoint round*: the rounds it holds). *wall*: the
uninterrupted run, or the resumed run alone.

{markdown_table(head, table)}

Verdict (the two runs of one invocation compared exactly):

{chr(10).join(verdicts)}
"""
    MD.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--kill-after", type=int, default=8, help="kill when this round's line shows"
    )
    parser.add_argument("--finetune", default="none", help="the end of run (default: none)")
    parser.add_argument("--report-only", action="store_true")
    ns = parser.parse_args()
    if not ns.report_only:
        inv = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with tempfile.TemporaryDirectory(prefix="privmtl-kill-resume-") as tmp:
            rows = run(ns.m, ns.rounds, ns.kill_after, ns.finetune, Path(tmp))
        for row in rows:
            row.update(
                m=ns.m, invocation=inv, config=_config(ns.m, ns.rounds, ns.finetune),
                finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                machine=machine_info(),
            )  # fmt: skip
            append_jsonl(JSONL, row)
    report()


if __name__ == "__main__":
    main()
