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
