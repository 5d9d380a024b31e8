"""``privmtl flower local``'s launcher process (privmtl.cli.flower_run): the command checks its
options with PyTorch loaded, then replaces its process with one that waits for the deployment
without it, and prints the result as the command does."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'privmtl[flower]')")

import privmtl.cli.flower as cli_flower
import privmtl.flower.deploy as deploy
import privmtl.flower.launcher as launcher
from privmtl import _timing
from privmtl.cli import flower_run, main


def test_the_launcher_process_imports_neither_torch_nor_flower():
    code = (
        "import sys; import privmtl.cli.flower_run, privmtl.flower.deploy; "
        "from privmtl.cli._common import echo_json, echo_final_models; "
        "import privmtl.gain, privmtl.trust; "
        "print([m for m in ('torch', 'scipy', 'flwr') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr


class _Exec(Exception):
    """Stands in for the process image os.execv replaces."""


def test_the_command_as_a_program_hands_its_checked_run_to_the_launcher(
    tmp_path, monkeypatch, capsys
):
    requests = []

    def exec_launcher(request):
        requests.append(json.loads(json.dumps(request)))  # JSON values only
        raise _Exec

    monkeypatch.setattr(cli_flower, "startup_seconds", lambda: 1.5)
    monkeypatch.setattr(cli_flower, "exec_launcher", exec_launcher)
    monkeypatch.setattr(launcher, "run_local", lambda **kw: pytest.fail("ran in this process"))
    argv = ["flower", "local", "--data", "synthetic", "--model", "logreg", "--rounds", "2",
            "--num-supernodes", "2", "--work-dir", str(tmp_path / "w"), "--json"]  # fmt: skip
    with pytest.raises(_Exec):
        main(argv)
    (req,) = requests
    assert req["num_supernodes"] == 2 and req["work_dir"] == str(tmp_path / "w")
    assert req["output"] == {"as_json": True, "code": False, "quiet": False}
    assert req["app"]["rounds"] == "2" and req["app"]["num-supernodes"] == "2"
    assert req["supernode"][-2:] == ["privmtl.flower.node", "supernode"]


def _result():
    phases = {"data": 1.0, "setup": 0.5, "rounds": 3.0, "end_of_run": 1.0, "scoring": 0.25,
              "saving": 0.0, "other": 0.25}  # fmt: skip
    return {"seconds": 6.0, "phases": phases, "test_accuracy": 0.5}


def test_the_launcher_prints_the_commands_json_with_its_start_up(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(deploy, "run_request", lambda req, progress: seen.append(req) or _result())
    monkeypatch.setattr(_timing, "process_seconds", lambda: 2.0)
    request = {"work_dir": "/w", "output": {"as_json": True, "code": False, "quiet": True}}
    assert flower_run.main([json.dumps(request)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["seconds"] == 8.0 and out["phases"]["startup"] == 2.0
    assert seen == [{"work_dir": "/w"}]


def test_a_failed_run_is_one_line_and_exit_2_with_the_resume_hint_on_ctrl_c(monkeypatch, capsys):
    def failed(req, progress):
        raise deploy.FlowerRunError("the ServerApp failed: boom\n  details")

    monkeypatch.setattr(deploy, "run_request", failed)
    request = json.dumps({"work_dir": "/w", "output": {"as_json": True}})
    assert flower_run.main([request]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["privmtl: error: the ServerApp failed: boom details"]

    def interrupted(req, progress):
        raise KeyboardInterrupt

    monkeypatch.setattr(deploy, "run_request", interrupted)
    assert flower_run.main([request]) == 130
    assert "--work-dir /w --resume" in capsys.readouterr().err
