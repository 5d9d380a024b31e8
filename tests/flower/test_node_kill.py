"""A SuperNode killed mid-run: the round fails or proceeds as configured, the ledger stays exact.

Needs the extra (pip install 'privmtl[flower]'). The round timeout is generous: rounds where every
node answers end with the last answer, and the round asking the dead node ends when the SuperLink
marks it offline (missed heartbeats), before the timeout.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'privmtl[flower]')")

from privmtl.cli import main
from privmtl.flower._core import partition
from privmtl.flower.deploy import FlowerRunError, _descendants
from privmtl.flower.launcher import run_local

pytestmark = pytest.mark.slow

CONFIG = {
    "data": "synthetic",
    "model": "logreg",
    "clients-per-round": 20,
    "noise-std": 0.05,
    "seed": 5,
    "noise-source": "seeded",  # the sampled clients are reproducible: node 2 is always sampled
    "local-steps": 2,
    "round-timeout": 240.0,
}
KILLED = 2  # node index


ROUNDS = 6
"""Rounds of the runs: node 2 is killed when round 1's line appears, and a round lasts well under a
second, so the round that first misses it is round 2, 3 or later (the tests read which)."""


def _run_and_kill(work: Path, cfg: dict) -> tuple[dict | None, Exception | None, list[str]]:
    """Run 3 SuperNodes; kill node 2 (its process group and descendants) after round 1."""
    pids: list[int] = []
    lines: list[str] = []

    def progress(line: str) -> None:
        lines.append(line)
        if "round 1/" in line and not any("KILLED" in x for x in lines):
            victims = {pids[KILLED], *_descendants(pids[KILLED])}
            os.killpg(pids[KILLED], signal.SIGKILL)
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            lines.append("KILLED")

    try:
        res = run_local(
            num_supernodes=3,
            run_config=cfg,
            work_dir=work,
            timeout=900,
            progress=progress,
            on_started=pids.extend,
        )
    except FlowerRunError as exc:
        return None, exc, lines
    return res, None, lines


def _ledger_entries(work: Path) -> list[dict]:
    text = (work / "server" / "ledger.jsonl").read_text()
    assert text.endswith("\n")  # no torn line
    return [json.loads(line) for line in text.splitlines()]  # every line parses


def _reaccounted(work: Path, capsys) -> dict:
    capsys.readouterr()
    assert main(["ledger", str(work / "server"), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_killed_supernode_with_on_missing_proceed(tmp_path, capsys, alive_with_home):
    work = tmp_path / "w"
    res, err, lines = _run_and_kill(work, {**CONFIG, "rounds": ROUNDS, "on-missing": "proceed"})
    assert err is None, err
    assert "KILLED" in lines
    assert not alive_with_home(work / "flwr-home")
    assert res is not None and res["rounds_run"] == ROUNDS
    # from the first round that missed node 2 on, every round released the clients that
    # answered: all but node 2's
    dead = set(partition(res["num_clients"], KILLED, 3).tolist())
    answered = res["clients_answered_per_round"]
    server = json.loads((work / "server" / "result.json").read_text())
    assert answered == server["clients_answered_per_round"]
    rounds = _history(work)
    assert rounds[0]["answered"] == rounds[0]["sampled"]  # the kill came after round 1
    first = next(i for i, h in enumerate(rounds) if h["answered"] != h["sampled"])
    assert first >= 1
    for h in rounds[first:]:
        assert set(h["sampled"]) & dead  # node 2 was asked (seeded sampling)
        assert h["answered"] == [k for k in h["sampled"] if k not in dead]
    assert all(answered[i] < len(rounds[i]["sampled"]) for i in range(first, ROUNDS))
    assert res["nodes_evaluated"] == 2
    # one ledger entry per release, and the reported ε bounds what the ledger recomposes
    entries = _ledger_entries(work)
    releases = [e for e in entries if "release_id" in e]
    assert [e["release_id"] for e in releases] == [f"round:{i}" for i in range(ROUNDS)]
    acc = _reaccounted(work, capsys)
    assert acc["releases"] == ROUNDS
    assert res["epsilon"] >= acc["epsilon"] - 1e-12
    assert res["epsilon"] == pytest.approx(acc["epsilon"], rel=1e-9)


def test_killed_supernode_with_on_missing_fail(tmp_path, capsys, alive_with_home):
    work = tmp_path / "w"
    res, err, lines = _run_and_kill(work, {**CONFIG, "rounds": ROUNDS, "on-missing": "fail"})
    assert res is None and err is not None
    assert "KILLED" in lines
    assert not alive_with_home(work / "flwr-home")
    message = str(err)
    assert "\n" not in message, repr(message)
    found = re.search(rf"round (\d+)/{ROUNDS}: 1 node\(s\) did not answer", message)
    assert found is not None, message
    failed = int(found.group(1))  # the first round that asked the dead node
    assert failed >= 2
    assert f"--resume --work-dir {work}" in message
    # exactly the releases made before the kill; the checkpoint lets --resume continue
    entries = _ledger_entries(work)
    made = [f"round:{i}" for i in range(failed - 1)]
    assert [e["release_id"] for e in entries if "release_id" in e] == made
    acc = _reaccounted(work, capsys)
    assert acc["releases"] == failed - 1
    assert acc["epsilon"] == pytest.approx(entries[-1]["epsilon"], rel=1e-9)
    assert json.loads((work / "server" / "run.json").read_text())["finished"] is False
    manifest = json.loads((work / "server" / "manifest.json").read_text())
    assert manifest["step"] == failed - 1
    assert not (work / "server" / "result.json").exists()
    # and through the CLI: the unfinished work directory is refused without --resume (exit 2)
    capsys.readouterr()
    rc = main(
        ["flower", "local", "--data", "synthetic", "--model", "logreg", "--work-dir", str(work)]
    )
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err_lines) == 1 and "--resume" in err_lines[0]


def _history(work: Path) -> list[dict]:
    """The per-round history of the server's checkpoint (sampled and answered clients)."""
    import torch

    manifest = json.loads((work / "server" / "manifest.json").read_text())
    state = torch.load(work / "server" / manifest["state_file"], weights_only=True)
    return json.loads(state["history"])


def test_a_killed_supernode_resumed_finishes_as_the_uninterrupted_run(tmp_path):
    """Kill SuperNode 2 mid-run, resume: the same billboards, ε and accuracy as without the kill
    (seeded noise: the rounds repeated after the checkpoint are the releases the ledger holds)."""
    import torch

    cfg = {**CONFIG, "rounds": ROUNDS, "on-missing": "fail", "finetune": "none"}
    ref = run_local(num_supernodes=3, run_config=cfg, work_dir=tmp_path / "ref", timeout=900)
    work = tmp_path / "w"
    res, err, lines = _run_and_kill(work, cfg)
    assert res is None and err is not None and "KILLED" in lines
    assert json.loads((work / "server" / "run.json").read_text())["finished"] is False
    again = run_local(
        num_supernodes=3, run_config={**cfg, "resume": True}, work_dir=work, timeout=900
    )
    assert again["rounds_run"] == ref["rounds_run"] == ROUNDS
    assert again["epsilon"] == pytest.approx(ref["epsilon"], rel=1e-12)
    assert again["test_accuracy"] == pytest.approx(ref["test_accuracy"], abs=1e-9)
    assert again["clients_answered_per_round"] == ref["clients_answered_per_round"]
    boards = [torch.load(w / "server" / "billboards.pt") for w in (tmp_path / "ref", work)]
    assert len(boards[0]) == len(boards[1]) == ROUNDS
    for a, b in zip(*boards, strict=True):
        for n in a:
            torch.testing.assert_close(a[n], b[n], rtol=0, atol=0)
    releases = [e["release_id"] for e in _ledger_entries(work) if "release_id" in e]
    assert releases == [f"round:{i}" for i in range(ROUNDS)]  # no round charged twice
