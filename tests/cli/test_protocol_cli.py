"""`privmtl pmtl` with checkpoints, budgets, noise sources and saved models; `ledger`; `evaluate`."""

from __future__ import annotations

import json

import pytest

from privmtl.cli import main

# --finetune none: the clients' end of the run (the auto default's local training grid) is not
# what these tests are about, and it costs minutes on a busy machine
BASE = ["pmtl", "--data", "synthetic", "--model", "logreg", "--rounds", "6",
        "--clients-per-round", "5", "--server-update", "offset", "--finetune", "none", "--quiet",
        "--json"]  # fmt: skip


def _run(capsys, args):
    code = main(args)
    cap = capsys.readouterr()
    assert code == 0, cap.err
    return json.loads(cap.out)


def test_budget_stop_saves_models_and_says_so(capsys, tmp_path):
    args = [*BASE, "--epsilon", "2", "--rounds", "30"]
    assert main([*args, "--budget-epsilon", "1", "--save-models", str(tmp_path / "m")]) == 0
    cap = capsys.readouterr()
    out = json.loads(cap.out)
    said = [ln for ln in cap.err.splitlines() if "stopped on the privacy budget" in ln]
    assert len(said) == 1 and said[0].startswith("privmtl: warning: ")
    assert f"{out['rounds_run']} of 30 rounds ran" in said[0]
    assert out["stopped_on_budget"] is True
    assert 0.5 < out["epsilon"] <= 1.0 and 0 < out["rounds_run"] < 30
    assert (tmp_path / "m" / "personalized.pt").is_file()
    full = _run(capsys, args)
    assert full["stopped_on_budget"] is False and 1.0 < full["epsilon"] <= 2.0


def test_ledger_reproduces_the_runs_epsilon_and_reports_pld(capsys, tmp_path):
    out = _run(capsys, [*BASE, "--epsilon", "2", "--checkpoint-dir", str(tmp_path)])
    led = _run(capsys, ["ledger", str(tmp_path), "--json"])
    assert led["releases"] == 6 and led["accountant"] == "rdp"
    assert led["epsilon"] == pytest.approx(out["epsilon"], rel=1e-12)
    assert led["per_release"][-1] == pytest.approx(out["epsilon"], rel=1e-12)
    assert led["per_release"] == sorted(led["per_release"])
    assert 0 < led["epsilon_pld"] <= led["epsilon"]
    pld = _run(capsys, ["ledger", str(tmp_path / "ledger.jsonl"), "--accountant", "pld", "--json"])
    assert pld["epsilon"] == pytest.approx(led["epsilon_pld"])


def test_noise_sources_in_every_output(capsys):
    # --diagnostics: the per-round training loss shows whether two runs drew the same noise
    a = _run(capsys, [*BASE, "--epsilon", "2", "--diagnostics"])
    b = _run(capsys, [*BASE, "--epsilon", "2", "--diagnostics"])
    c = _run(capsys, [*BASE, "--epsilon", "2", "--reproducible-noise", "--diagnostics"])
    d = _run(capsys, [*BASE, "--epsilon", "2", "--reproducible-noise", "--diagnostics"])
    assert a["noise_source"] == "secure" and c["noise_source"] == "seeded"
    assert "SEEDED" in c["summary"] and "secure" in a["summary"]
    loss = [r["curator_diagnostics"]["train_loss_per_round"] for r in (a, b, c, d)]
    assert loss[2] == loss[3]
    assert loss[0][1:] != loss[1][1:]
    local = _run(capsys, [*BASE, "--method", "local"])
    assert local["noise_source"] == "none" and "stopped_on_budget" in local
    assert local["guarantee"]["noise_source"] == "none" and "noise: none" in local["summary"]


def test_saved_models_reload_to_the_runs_accuracy(capsys, tmp_path):
    for method, extra in (("pmtl", []), ("fedavg", []), ("pmtl", ["--finetune", "mr"])):
        d = tmp_path / f"{method}{len(extra)}"
        out = _run(capsys, [*BASE, "--method", method, "--epsilon", "2",
                            "--save-models", str(d), *extra])  # fmt: skip
        ev = _run(capsys, ["evaluate", "--models", str(d), "--json"])
        assert ev["test_accuracy"] == out["test_accuracy"]
        meta = json.loads((d / "model.json").read_text())
        assert meta["guarantee"]["epsilon"] == out["epsilon"]
        assert meta["run"]["noise_source"] == "secure"


def test_resume_needs_a_checkpoint_dir_and_refuses_a_foreign_one(capsys, tmp_path):
    assert main([*BASE, "--resume"]) == 2
    assert "--checkpoint-dir" in capsys.readouterr().err
    _run(capsys, [*BASE, "--epsilon", "2", "--checkpoint-dir", str(tmp_path)])
    assert main([*BASE, "--epsilon", "2", "--checkpoint-dir", str(tmp_path)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main([*BASE, "--epsilon", "2", "--lam", "0.5", "--checkpoint-dir", str(tmp_path),
                 "--resume"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("privmtl: error:")]
    assert len(errors) == 1 and "another configuration" in errors[0] and "lam" in errors[0]
    assert "Traceback" not in err
