"""CLI conventions: --save-models never overwrites silently, Ctrl-C says how to resume, numbers
print as numbers, absurd ε is refused."""

from __future__ import annotations

import numpy as np
import pytest

from privmtl.cli import main
from privmtl.exceptions import InvalidParameterError

PMTL = ["pmtl", "--data", "synthetic", "--num-clients", "8", "--rounds", "2"]
PMTL += ["--clients-per-round", "4", "--model", "logreg", "--finetune", "none", "--quiet"]
MPMTL = ["mpmtl", "--data", "synthetic-lowrank", "--method", "stl-l2", "--no-tune"]


@pytest.mark.parametrize("argv", [PMTL, MPMTL], ids=["pmtl", "mpmtl"])
def test_save_models_refuses_a_non_empty_folder(capsys, tmp_path, argv):
    out = tmp_path / "models"
    out.mkdir()
    (out / "model.json").write_text("{}")
    assert main([*argv, "--save-models", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "--save-models" in err and "--overwrite" in err and "not empty" in err
    assert sorted(p.name for p in out.iterdir()) == ["model.json"]  # nothing written
    assert (out / "model.json").read_text() == "{}"


def test_save_models_overwrite_and_empty_folder(capsys, tmp_path):
    out = tmp_path / "models"
    out.mkdir()  # an empty folder is fine
    assert main([*PMTL, "--save-models", str(out)]) == 0
    assert (out / "model.json").exists()
    capsys.readouterr()
    assert main([*PMTL, "--save-models", str(out)]) == 2  # now it holds a run
    capsys.readouterr()
    assert main([*PMTL, "--save-models", str(out), "--overwrite"]) == 0


def _interrupt(**kw):
    raise KeyboardInterrupt


def test_ctrl_c_tells_how_to_resume(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("privmtl.cli.pmtl.run_pmtl", _interrupt)
    ckpt = tmp_path / "ckpt"
    assert main([*PMTL, "--epsilon", "2", "--checkpoint-dir", str(ckpt)]) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("privmtl: aborted; ") and str(ckpt) in err and "--resume" in err
    assert main([*PMTL, "--epsilon", "2"]) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "no checkpoint was kept" in err and "--checkpoint-dir" in err


def test_validation_messages_print_numpy_numbers_as_numbers():
    from privmtl._validation import check_choice, check_int, check_real

    with pytest.raises(InvalidParameterError) as exc:
        check_real("clip", np.float64(-4.23), low=0.0)
    assert str(exc.value).endswith("got -4.23.")
    with pytest.raises(InvalidParameterError) as exc:
        check_int("rounds", np.int64(-3), low=1)
    assert "got -3." in str(exc.value)
    with pytest.raises(InvalidParameterError) as exc:
        check_choice("k", np.float64(2.5), (np.int64(1), np.int64(2)))
    assert "np." not in str(exc.value) and "{1, 2}" in str(exc.value)


@pytest.mark.parametrize("argv", [PMTL, [*MPMTL[:4], "lowrank", "--no-tune"]])
def test_absurd_epsilon_is_refused_with_its_bound(capsys, argv):
    assert main([*argv, "--epsilon", "1e300"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "at most 100" in err[0] and "got 1e+300" in err[0]


def test_largest_accepted_epsilon_calibrates():
    import dp_accounting.dp_event as dpe

    from privmtl.privacy.calibration import MAX_TARGET_EPSILON, calibrate_noise_multiplier

    z = calibrate_noise_multiplier(
        lambda z: dpe.GaussianDpEvent(z), target_epsilon=MAX_TARGET_EPSILON, delta=1e-5
    )
    assert 0 < z < 1
    with pytest.raises(InvalidParameterError, match="at most 100"):
        calibrate_noise_multiplier(
            lambda z: dpe.GaussianDpEvent(z), target_epsilon=100.5, delta=1e-5
        )


def _table_checks(out: str, csv_text: str) -> None:
    import csv
    import io

    lines = [ln for ln in out.splitlines() if not ln.startswith("wrote:")]
    private = [ln for ln in lines if "non-private" not in ln and "ε=0" not in ln]
    assert private, out
    for ln in private:  # ε with δ, relation, sampling, accountant and noise source
        assert "[ε=" in ln and ", δ=" in ln and "add-remove" in ln and "sampling " in ln
        assert ", rdp, noise seeded]" in ln
    assert any(ln.endswith("[non-private (no noise)]") for ln in lines)
    for row in csv.DictReader(io.StringIO(csv_text)):
        if row["epsilon"] == "":  # a non-private row
            assert row["notion"] == "non-private" and row["noise_source"] == "none"
        elif float(row["epsilon"]) == 0:
            assert row["noise_source"] == "none"
        else:
            assert row["noise_source"] == "seeded" and row["delta"] and row["accountant"] == "rdp"


def test_sweep_tables_and_csv_carry_the_full_guarantee(capsys, tmp_path):
    argv = ["mpmtl-sweep", "--data", "synthetic-lowrank", "--methods", "lowrank,stl-l2,mtl-trace"]
    argv += ["--epsilons", "1", "--tune", "none", "--iterations", "2", "--reproducible-noise"]
    assert main([*argv, "--out", str(tmp_path / "m"), "--quiet"]) == 0
    _table_checks(capsys.readouterr().out, (tmp_path / "m" / "mpmtl_sweep.csv").read_text())
    argv = ["pmtl-sweep", "--methods", "pmtl,fedavg,local", "--epsilons", "2", "--clips", "0.5"]
    argv += ["--rounds-grid", "2", "--clients-per-round", "4", "--reproducible-noise"]
    argv += ["--finetune", "none"]
    assert main([*argv, "--out", str(tmp_path / "p"), "--quiet"]) == 0
    _table_checks(capsys.readouterr().out, (tmp_path / "p" / "pmtl_sweep.csv").read_text())


def test_a_checkpoint_directory_in_use_is_refused_with_the_flag_not_the_python_term(
    capsys, tmp_path
):
    """A rerun after Ctrl-C without --resume is told the flag to pass, as a command-line user
    writes it (the library says resume=True to Python users)."""
    ckpt = tmp_path / "ckpt"
    argv = [*PMTL, "--epsilon", "2", "--checkpoint-dir", str(ckpt)]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--resume" in err[0], err
    assert "resume=True" not in err[0], err
