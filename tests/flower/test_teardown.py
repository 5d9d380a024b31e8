"""No process outlives ``privmtl flower local``: after a failure, and after Ctrl-C (then --resume).

Needs the extra (pip install 'privmtl[flower]'). Every process a run starts carries the run's own
``FLWR_HOME`` (inside its work directory) in its environment; none may be left afterwards.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'privmtl[flower]')")

from privmtl.data.federated import make_synthetic_federated
from privmtl.experiments.pmtl import make_model
from privmtl.federated.protocol import Trainer
from privmtl.flower._core import make_config, run_options
from privmtl.flower.launcher import FlowerRunError, run_local

pytestmark = pytest.mark.slow


def test_a_failing_run_leaves_no_process(tmp_path, alive_with_home):
    """The nodes cannot load their data: the run fails with one line and stops everything."""
    work = tmp_path / "w"
    cfg = {"data": "femnist-leaf", "data-path": str(tmp_path / "missing"), "model": "logreg"}
    cfg["round-timeout"] = 240.0
    with pytest.raises(FlowerRunError) as info:
        run_local(num_supernodes=2, run_config=cfg, work_dir=work, timeout=600)
    # one line with the nodes' own reason (a refusing node replies with it)
    msg = str(info.value)
    assert "\n" not in msg and "FEMNIST directory not found" in msg and "SuperNodes refused" in msg
    assert not alive_with_home(work / "flwr-home")
    assert (work / "server" / "error.txt").is_file()


ROUNDS = 60
"""Rounds of the interrupted run. A round lasts about a second; SIGINT goes out once the ledger
holds the first release (the ServerApp's progress lines reach ``flwr run``'s log stream in batches,
seconds late: on a CI machine all 60 rounds' lines arrived after the run had finished), so it
finds rounds left to interrupt."""


def test_ctrl_c_stops_every_process_and_resume_finishes_the_same_run(tmp_path, alive_with_home):
    """SIGINT to privmtl flower local after round 1: exit 130, no process left, the ledger holds
    the releases made; --resume finishes the run, and (seeded) every billboard equals the
    uninterrupted in-process engine's and no release is charged twice."""
    work = tmp_path / "w"
    args = [
        str(Path(sys.executable).parent / "privmtl"),
        "flower", "local", "--num-supernodes", "2", "--data", "synthetic", "--model", "logreg",
        "--rounds", str(ROUNDS), "--clients-per-round", "6", "--noise-std", "0.05", "--local-steps", "3",
        "--seed", "3", "--reproducible-noise", "--round-timeout", "240", "--work-dir", str(work),
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # SIGINT once the first release is in the ledger: the server writes it before the release
    # leaves, as it happens, while its progress lines may reach the log stream only in batches
    ledger = work / "server" / "ledger.jsonl"
    deadline = time.monotonic() + 600
    seen, polls, sent = 0, 0, False  # what the loop saw: said if the run ends uninterrupted
    while proc.poll() is None:
        polls += 1
        seen = len(ledger.read_text().splitlines()) if ledger.is_file() else -1
        if seen >= 2:
            proc.send_signal(signal.SIGINT)
            sent = True
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (
        f"SIGINT sent: {sent}; polls: {polls}; ledger lines last seen: {seen}\n{err}"
    )
    last = err.strip().splitlines()[-1]
    assert last.startswith("privmtl: aborted") and "--work-dir" in last and "--resume" in last
    assert not alive_with_home(work / "flwr-home")
    lines = (work / "server" / "ledger.jsonl").read_text().splitlines()
    done = [json.loads(x)["release_id"] for x in lines[1:]]  # every line parses
    assert done and done == [f"round:{t}" for t in range(len(done))]
    assert json.loads((work / "server" / "run.json").read_text())["finished"] is False

    out = subprocess.run([*args, "--resume", "--json"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert not alive_with_home(work / "flwr-home")
    assert res["rounds_run"] == ROUNDS and res["run_index"] == 0
    lines = (work / "server" / "ledger.jsonl").read_text().splitlines()
    assert [json.loads(x)["release_id"] for x in lines[1:]] == [f"round:{t}" for t in range(ROUNDS)]

    opts = run_options({
        "rounds": ROUNDS, "clients-per-round": 6, "noise-std": 0.05, "local-steps": 3, "seed": 3,
        "noise-source": "seeded",
    })  # fmt: skip
    ds = make_synthetic_federated(random_state=3)
    config, _ = make_config(opts, ds.n_clients)
    trainer = Trainer(ds, make_model("logreg", ds, 3), config, noise_source="seeded")
    ref = [{n: p.clone() for n, p in rec.released.items()} for rec in trainer]
    import torch

    boards = torch.load(work / "server" / "billboards.pt", weights_only=True)
    assert len(boards) == ROUNDS
    for a, b in zip(boards, ref, strict=True):
        for n in a:
            assert torch.allclose(a[n], b[n], atol=1e-5, rtol=0)
    assert res["epsilon"] == pytest.approx(trainer.epsilon, rel=1e-9)
