"""The ``time:`` line of ``privmtl pmtl`` / ``privmtl mpmtl`` is the run's wall time and its
phases (the timer's clock replaced by a counter: every reading 1000 s later, so the line is
exact but for the rounds, the engine's own measure)."""

from __future__ import annotations

import itertools
import json
import re

import pytest

from privmtl import _timing
from privmtl.cli import main

PMTL = ["pmtl", "--data", "synthetic", "--num-clients", "12", "--model", "logreg", "--rounds", "3",
        "--epsilon", "2", "--reproducible-noise", "--threads", "1", "--finetune", "none"]  # fmt: skip
MPMTL = ["mpmtl", "--data", "synthetic-lowrank", "--method", "lowrank", "--epsilon", "1",
         "--iterations", "3", "--no-tune", "--reproducible-noise"]  # fmt: skip


@pytest.fixture
def ticking(monkeypatch):
    ticks = itertools.count()
    monkeypatch.setattr(_timing, "clock", lambda: 1000.0 * next(ticks))


def _time_line(capsys, argv):  # argv None: the program's own command line (sys.argv)
    assert main(argv) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("time: ")]
    assert len(lines) == 1
    return lines[0]


def test_pmtl_prints_its_wall_time_with_the_phases(ticking, capsys):
    line = _time_line(capsys, PMTL)
    assert re.fullmatch(
        r"time: 15000\.0s \(data 1000\.0s = 7%; setup 3000\.0s = 20%; "
        r"rounds \d+\.\ds, \d+\.\d{3}s/round; end of run 1000\.0s = 7%; "
        r"scoring \d+\.\ds = 13%; other 8000\.0s = 53%\)",  # scoring: the fit less its rounds,
        line,  # and the local baseline
    ), line
    out = json.loads(_json_out(capsys, [*PMTL, "--json"]))
    assert out["seconds"] == 15000.0 and set(out["phases"]) == set(_timing.PMTL_PHASES)


def test_mpmtl_prints_its_wall_time_with_the_phases(ticking, capsys):
    line = _time_line(capsys, MPMTL)
    assert line == (
        "time: 11000.0s (data 1000.0s = 9%; setup 2000.0s = 18%; fit 1000.0s = 9%; "
        "scoring 1000.0s = 9%; other 6000.0s = 55%)"
    )
    out = json.loads(_json_out(capsys, [*MPMTL, "--json"]))
    assert out["seconds"] == 11000.0 == sum(out["phases"].values())


def _json_out(capsys, argv):
    assert main(argv) == 0
    return capsys.readouterr().out


def test_the_program_counts_its_start_up_in_its_time(ticking, capsys, monkeypatch):
    """``privmtl ...`` as the process (``main()`` reading ``sys.argv``): the time from the start
    of the process to the run comes first as ``startup``, inside ``seconds``; a command called
    from Python (``main(argv)``, above) has none."""
    monkeypatch.setattr(_timing, "process_seconds", lambda: 5.0)
    monkeypatch.setattr("sys.argv", ["privmtl", *PMTL, "--json"])
    out = json.loads(_json_out(capsys, None))
    assert next(iter(out["phases"])) == _timing.STARTUP
    # the start was read at tick 0 (less 5 s); the command reaches its run one tick later
    assert out["phases"][_timing.STARTUP] == 1005.0
    assert out["seconds"] == pytest.approx(sum(out["phases"].values()))
    monkeypatch.setattr("sys.argv", ["privmtl", *PMTL])
    assert "start-up " in _time_line(capsys, None)


def test_process_seconds_is_the_age_of_this_process():
    first = _timing.process_seconds()
    if first is None:
        pytest.skip("this system does not say when a process started (no /proc)")
    assert first >= 0.0 and _timing.process_seconds() >= first
