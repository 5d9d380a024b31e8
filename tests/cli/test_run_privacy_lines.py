"""The privacy lines of a federated run's human output are the same for ``privmtl pmtl`` and
``privmtl flower local``: the guarantee, the noise's source, a budget's stop, the models."""

from __future__ import annotations

import pytest

from privmtl.cli import flower_run
from privmtl.cli import pmtl as pmtl_cli

RESULT = {
    "method": "pmtl", "model": "logreg", "data": "synthetic", "engine": "flower",
    "num_clients": 10, "clients_per_round": 5, "rounds": 8, "rounds_run": 3, "clip": 0.5,
    "noise_std": 1.25, "test_accuracy": 0.5, "mean_client_accuracy": 0.5, "epsilon": 0.9,
    "summary": "(0.9, 1e-05)-DP", "noise_source": "seeded", "stopped_on_budget": True,
    "models_dir": "/tmp/models", "work_dir": "/tmp/work", "guarantee": {"notes": []},
    "phases": {}, "seconds": 1.0,
}  # fmt: skip


@pytest.mark.parametrize("human", [flower_run._human, pmtl_cli._human])
def test_both_engines_print_the_same_privacy_lines(human, capsys):
    human(dict(RESULT))
    lines = capsys.readouterr().out.splitlines()
    expected = [
        "privacy: (0.9, 1e-05)-DP",
        "noise source: seeded",
        "stopped on budget after 3 of 8 rounds (ε spent 0.9)",
        "models: /tmp/models",
    ]
    start = lines.index(expected[0])
    assert lines[start : start + 4] == expected


def test_a_run_without_noise_says_so():
    import click
    from click.testing import CliRunner

    @click.command()
    def show():
        flower_run._human({**RESULT, "noise_std": 0.0, "stopped_on_budget": False})

    out = CliRunner().invoke(show).output
    assert "noise source: none (no noise added)" in out and "stopped on budget" not in out
