"""``privmtl flower``: lazy import of Flower and input validation (no processes are started)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from privmtl.cli import main


def test_help_lists_flower_and_the_cli_works_without_importing_flwr():
    code = (
        "import sys; from privmtl.cli import main; rc = main(['--help']); "
        "assert 'flwr' not in sys.modules, 'flwr imported'; sys.exit(rc)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "flower" in out.stdout


def test_epsilon_and_noise_std_together_exit_2(capsys):
    rc = main(
        ["flower", "local", "--data", "synthetic", "--model", "logreg", "--epsilon", "2",
         "--noise-std", "0.1"]
    )  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("privmtl: error:")


def test_invalid_rounds_exit_2_before_starting_anything(capsys):
    rc = main(["flower", "local", "--data", "synthetic", "--model", "logreg", "--rounds", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and ("rounds" in err[0] or "Flower" in err[0])


needs_flwr = pytest.mark.skipif(
    importlib.util.find_spec("flwr") is None,
    reason="Flower is not installed (pip install 'privmtl[flower]'): the command stops before the run",
)


def _local(*extra):
    return ["flower", "local", "--data", "synthetic", "--model", "logreg", *extra]


def test_negative_values_are_refused_not_read_as_not_given(capsys):
    # the run config encodes "not given" as -1: a given -1 must not turn a run non-private
    for flag in ("--epsilon", "--budget-epsilon", "--noise-std"):
        rc = main(_local(flag, "-1"))
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and flag in err[0], (flag, err)


def test_resume_needs_a_work_dir_and_bad_options_exit_2(capsys):
    for argv, word in (
        (_local("--resume"), "--work-dir"),
        (_local("--round-timeout", "0"), "round_timeout"),
        (_local("--checkpoint-every", "0"), "checkpoint_every"),
        (_local("--on-missing", "drop"), "on-missing"),
    ):
        rc = main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and word in err[0], (argv, err)


def test_unfinished_work_dir_is_refused_before_any_process_starts(tmp_path, capsys):
    server = tmp_path / "server"
    server.mkdir()
    (server / "run.json").write_text('{"run": 0, "token": "t", "finished": false}')
    rc = main(_local("--work-dir", str(tmp_path)))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--resume" in err[0]
    assert not (tmp_path / "logs").exists()  # nothing was started


@needs_flwr
def test_a_user_factory_reaches_the_apps_as_its_directory_and_hash(tmp_path, monkeypatch, capsys):
    """--model takes privmtl pmtl's forms; the launcher gets the directory the command ran in and
    the file's SHA-256 (no source), and a factory that does not load exits 2 before any process."""
    import hashlib
    import json

    import privmtl.flower.launcher as launcher

    (tmp_path / "mymodels.py").write_text(
        "from torch import nn\n\ndef make_mlp(d, c):\n    return nn.Linear(d, c)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    sha = hashlib.sha256((tmp_path / "mymodels.py").read_bytes()).hexdigest()
    seen: list[dict] = []
    monkeypatch.setattr(
        launcher, "run_local", lambda *, run_config, **kw: seen.append(run_config) or {}
    )
    for spec in ("mymodels:make_mlp", "./mymodels.py:make_mlp"):
        argv = ["flower", "local", "--data", "synthetic", "--model", spec, "--json",
                "--work-dir", str(tmp_path / "w")]  # fmt: skip
        assert main(argv) == 0, capsys.readouterr().err
        cfg = seen.pop()
        assert (cfg["model"], cfg["model-dir"], cfg["model-sha256"]) == (spec, str(tmp_path), sha)
        assert "source" not in json.dumps(cfg) and "nn.Linear" not in json.dumps(cfg)
    capsys.readouterr()
    sys.modules.pop("mymodels", None)  # loaded from tmp_path: no other test sees it
    for spec, word in (("nothere:make", "nothere"), ("./mymodels.py:nope", "nope"),
                       ("mlp", "MODULE:FACTORY")):  # fmt: skip
        rc = main(["flower", "local", "--data", "synthetic", "--model", spec,
                   "--work-dir", str(tmp_path / "w2")])  # fmt: skip
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and word in err[0] and "--model" in err[0], (spec, err)
    assert seen == [] and not (tmp_path / "w2").exists()  # nothing was started


@needs_flwr
def test_save_models_refuses_a_folder_that_is_not_empty_before_any_process_starts(
    tmp_path, monkeypatch, capsys
):
    """--save-models/--overwrite mean what they mean for privmtl pmtl; the folder reaches
    run_local, which writes it once the run finished."""
    import privmtl.flower.launcher as launcher

    models = tmp_path / "models"
    models.mkdir()
    (models / "model.json").write_text("{}")
    rc = main(_local("--save-models", str(models), "--work-dir", str(tmp_path / "w")))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--save-models" in err[0] and "--overwrite" in err[0]
    assert not (tmp_path / "w").exists()  # nothing was started
    seen: list[dict] = []
    monkeypatch.setattr(launcher, "run_local", lambda **kw: seen.append(kw) or {})
    argv = _local("--save-models", str(models), "--overwrite", "--work-dir", str(tmp_path / "w"))
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    assert seen[0]["save_models"] == models


def test_the_launcher_adds_its_own_time_to_the_serverapps_phases():
    """A Flower run's seconds is the launcher's wall time; what the ServerApp did not measure
    (starting the processes, collecting the result) is set-up."""
    from privmtl.flower.launcher import with_launch

    phases = {"data": 1.0, "setup": 0.5, "rounds": 3.0, "end_of_run": 1.0, "scoring": 0.25,
              "saving": 0.0, "other": 0.25}  # fmt: skip
    out = with_launch({"seconds": 6.0, "phases": dict(phases)}, 8.5)
    assert out["seconds"] == 8.5 and out["phases"]["setup"] == 3.0
    assert sum(out["phases"].values()) == pytest.approx(out["seconds"])


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--data", "table", "--data-path", "t.csv", "--label-column", "y"], "--client-column"),
        (["--data", "synthetic", "--client-column", "user"], "--client-column"),
    ],
)
def test_a_table_on_flower_needs_its_columns_and_they_need_a_table(argv, flag, capsys):
    rc = main(["flower", "local", *argv, "--rounds", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("privmtl: error:") and flag in err[0]
