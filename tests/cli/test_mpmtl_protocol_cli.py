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
    assert ev["covered"] is out["covered"] is True  # --no-tune: nothing chosen on pooled data
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
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    out = _json(capsys, [*args, "--checkpoint-dir", ck, "--resume"])
    assert out["resumed_from"] == 2
    for key in ("nmse", "epsilon", "iterations_run", "stopped_on_budget", "noise_source"):
        assert out[key] == ref[key], key
    # one ledger entry per release (the replayed release 2 was not charged again)
    led, led_ref = (_json(capsys, ["ledger", p, "--json"]) for p in (ck, str(tmp_path / "ref")))
    assert led["per_release"] == led_ref["per_release"] and led["releases"] == 6


# -------------------------------------------------------------------- delta, coverage, tuning
def _table(path, m=12, n=20, d=4, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    w = rng.standard_normal(d)
    lines = ["task," + ",".join(f"x{j}" for j in range(d)) + ",y"]
    for i in range(m):
        for _ in range(n):
            x = rng.standard_normal(d)
            lines.append(f"t{i}," + ",".join(f"{v:.6f}" for v in x) + f",{x @ w + 0.1 * i:.6f}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("data", ["synthetic-lowrank", "synthetic-groupsparse", "school", "table"])
def test_default_delta_is_below_one_over_m_on_every_data_set(capsys, tmp_path, data):
    args = ["mpmtl", "--data", data, "--method", "lowrank", "--epsilon", "1", "--iterations", "1",
            "--no-tune", "--json"]  # fmt: skip
    if data == "table":
        args += ["--data-path", str(_table(tmp_path / "t.csv"))]
    out = _json(capsys, args)
    m = out["n_tasks"]
    assert out["delta"] == pytest.approx(min(1e-5, 1 / (100 * m))) and out["delta"] < 1 / m
    assert out["params"]["delta"] == out["delta"]
    if data == "synthetic-lowrank":  # the paper's delta only when asked for
        paper = _json(capsys, [*args, "--paper-delta"])
        assert paper["delta"] == pytest.approx(1 / (m * __import__("math").log(m)))
        assert main([*args, "--paper-delta", "--delta", "1e-6"]) == 2


def test_runs_without_noise_say_none_and_every_result_says_covered(capsys):
    for method, extra in (("mtl-trace", []), ("lowrank", []), ("stl-l2", []),
                          ("lowrank", ["--epsilon", "1"])):  # fmt: skip
        out = _json(capsys, ["mpmtl", "--data", "synthetic-lowrank", "--method", method,
                             "--iterations", "1", "--no-tune", "--json", *extra])  # fmt: skip
        assert out["covered"] is out["guarantee"]["covered"]
        if extra:  # a private run
            assert out["noise_source"] == "secure"
            assert out["guarantee"]["notion"].startswith("MP-MTL")
            continue
        assert out["noise_source"] == "none" and out["guarantee"]["noise_source"] == "none"
        if method != "stl-l2":  # non-private: epsilon = inf, no privacy notion
            assert out["epsilon"] is None and out["guarantee"]["notion"] == "none"


def test_default_tuning_is_covered_and_pooled_says_it_is_not(capsys):
    base = ["mpmtl", "--data", "synthetic-lowrank", "--epsilon", "1", "--iterations", "1",
            "--reproducible-noise", "--json"]  # fmt: skip
    private = _json(capsys, [*base, "--method", "lowrank"])
    assert private["tune"] == "covered" and private["covered"] is True
    assert private["tuned"] is False and "public" in private["tuning_note"]
    assert len(private["per_task_params"]["refit_lam"]) == private["n_tasks"]
    stl = _json(capsys, ["mpmtl", "--data", "synthetic-lowrank", "--method", "stl-l2", "--json"])
    assert stl["covered"] is True and "its own" in stl["tuning_note"]
    assert len(set(stl["per_task_params"]["lam"])) > 1  # every task chose for itself
    pooled = _json(capsys, [*base, "--method", "dp-aggr", "--tune", "pooled"])
    assert pooled["covered"] is False and pooled["guarantee"]["covered"] is False
    assert "cross-validation over every task's data" in " ".join(pooled["guarantee"]["not_covered"])
    assert main([*base, "--method", "lowrank", "--tune", "sometimes"]) == 2


def test_single_task_selection_reads_only_the_own_task():
    """Per-task selection oracle: rescaling task 0 (features x5, targets negated) leaves every
    other task's choice and model unchanged (bit-identical for the closed-form ridge)."""
    import numpy as np

    from privmtl.linear.selection import PerTaskSelected
    from privmtl.linear.stl import STLRidge

    rng = np.random.default_rng(0)
    Xs = [rng.standard_normal((15, 4)) for _ in range(6)]
    ys = [x @ rng.standard_normal(4) + 0.5 * rng.standard_normal(15) for x in Xs]
    Xs2, ys2 = [x.copy() for x in Xs], [y.copy() for y in ys]
    Xs2[0], ys2[0] = 5.0 * Xs2[0], -ys2[0]
    a, b = STLRidge(lam="cv").fit(Xs, ys), STLRidge(lam="cv").fit(Xs2, ys2)
    np.testing.assert_array_equal(a.lam_[1:], b.lam_[1:])
    np.testing.assert_array_equal(a.coef_[:, 1:], b.coef_[:, 1:])
    c = PerTaskSelected(method="stl-l1", random_state=3).fit(Xs, ys)
    e = PerTaskSelected(method="stl-l1", random_state=3).fit(Xs2, ys2)
    assert c.best_params_[1:] == e.best_params_[1:]
    np.testing.assert_allclose(c.coef_[:, 1:], e.coef_[:, 1:], atol=1e-6)
