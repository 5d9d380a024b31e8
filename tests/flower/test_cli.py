"""``privmtl flower``: lazy import of Flower and input validation (no processes are started)."""

from __future__ import annotations

import subprocess
import sys

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
