"""``privmtl mpmtl`` with secure/seeded noise, a budget, checkpoints, saved models, and
``privmtl ledger`` / ``privmtl evaluate`` on what it wrote."""

import json

import pytest

from privmtl.cli import main

BASE = ["mpmtl", "--data", "synthetic-lowrank", "--method", "lowrank", "--no-tune",
        "--iterations", "6", "--json"]  # fmt: skip


def _json(capsys, args):
    code = main(args)
    cap = capsys.readouterr()
    assert code == 0, cap.err
    return json.loads(cap.out)


def test_every_output_names_its_noise_source(capsys):
    secure = _json(capsys, [*BASE, "--epsilon", "1"])
    assert secure["noise_source"] == "secure" and secure["stopped_on_budget"] is False
    assert secure["guarantee"]["noise_source"] == "secure"
    seeded = _json(capsys, [*BASE, "--epsilon", "1", "--reproducible-noise"])
    assert seeded["noise_source"] == "seeded"
    assert any("protects nobody" in n for n in seeded["guarantee"]["notes"])
    again = _json(capsys, [*BASE, "--epsilon", "1", "--reproducible-noise"])
    assert again["nmse"] == seeded["nmse"]
    other = _json(capsys, [*BASE, "--epsilon", "1"])
    assert other["nmse"] != secure["nmse"]  # fresh OS-entropy noise
    base = _json(capsys, ["mpmtl", "--data", "synthetic-lowrank", "--method", "stl-l2",
                          "--no-tune", "--json"])  # fmt: skip
    assert "noise_source" in base and base["stopped_on_budget"] is False


def test_budget_checkpoint_ledger_and_evaluate(capsys, tmp_path):
    ck, models = tmp_path / "ck", tmp_path / "models"
    args = [*BASE, "--epsilon", "2", "--budget-epsilon", "1", "--reproducible-noise",
            "--checkpoint-dir", str(ck), "--save-models", str(models)]  # fmt: skip
    out = _json(capsys, args)
    assert out["stopped_on_budget"] is True and out["epsilon"] <= 1.0
    assert 0 < out["iterations_run"] < 6
    # privmtl ledger re-accounts the run's durable ledger: same epsilon (rdp), pld alongside
    led = _json(capsys, ["ledger", str(ck), "--json"])
    assert led["epsilon"] == pytest.approx(out["epsilon"], rel=1e-12)
    assert led["releases"] == out["iterations_run"]
    assert len(led["per_release"]) == out["iterations_run"]
    pld = _json(capsys, ["ledger", str(ck), "--accountant", "pld", "--json"])
    assert pld["accountant"] == "pld" and 0 < pld["epsilon"] <= led["epsilon"] * 1.01
    # the saved model is scored again exactly
    ev = _json(capsys, ["evaluate", "--models", str(models), "--json"])
    assert ev["nmse"] == out["nmse"] and ev["stopped_on_budget"] is True
    # resuming the finished run (same budget) reproduces it
    again = _json(capsys, [*args[:-2], "--resume"])
    assert again["nmse"] == out["nmse"] and again["epsilon"] == out["epsilon"]
    assert again["resumed_from"] == out["iterations_run"]


def test_protocol_errors_are_one_line(capsys, tmp_path):
    ck = tmp_path / "ck"
    _json(capsys, [*BASE, "--epsilon", "1", "--checkpoint-dir", str(ck)])
    code = main([*BASE, "--epsilon", "1", "--checkpoint-dir", str(ck)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("privmtl: error:") and "--resume" in err
    assert err.count("\n") == 1
    code = main([*BASE, "--epsilon", "3", "--checkpoint-dir", str(ck), "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and "param.epsilon: 1.0 (checkpoint) vs 3.0 (now)" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    code = main(["mpmtl", "--data", "synthetic-lowrank", "--method", "stl-l2", "--no-tune",
                 "--budget-epsilon", "1"])  # fmt: skip
    assert code == 2 and "budget" in capsys.readouterr().err


_KILLED_CLI = """
import os, signal, sys
sys.path.insert(0, {src!r})
import privmtl.linear.mpmtl as mp
from privmtl.cli import main

update = mp.TaskStep.update

def killing_update(self, state, release):
    if state.iteration == {at}:  # the release is recorded and drawn, the update not applied
        os.kill(os.getpid(), signal.SIGKILL)
    update(self, state, release)

mp.TaskStep.update = killing_update
main(sys.argv[1:])
"""


def test_cli_run_killed_mid_iteration_resumes_to_the_same_result(capsys, tmp_path):
    import signal
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[2] / "src")
    args = [*BASE, "--epsilon", "1", "--reproducible-noise", "--checkpoint-every", "2"]
    ref = _json(capsys, [*args, "--checkpoint-dir", str(tmp_path / "ref")])
    ck = str(tmp_path / "ck")
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_CLI.format(src=src, at=3), *args, "--checkpoint-dir", ck],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    out = _json(capsys, [*args, "--checkpoint-dir", ck, "--resume"])
    assert out["resumed_from"] == 2
    for key in ("nmse", "epsilon", "iterations_run", "stopped_on_budget", "noise_source"):
        assert out[key] == ref[key], key
    # one ledger entry per release (the replayed release 2 was not charged again)
    led, led_ref = (_json(capsys, ["ledger", p, "--json"]) for p in (ck, str(tmp_path / "ref")))
    assert led["per_release"] == led_ref["per_release"] and led["releases"] == 6
