"""The run timer: phases measured once, ``other`` the rest, ``seconds`` their sum (a counting
clock, so that every sum is exact), and the human ``time:`` line."""

from __future__ import annotations

import itertools

import pytest

from privmtl import _timing
from privmtl._timing import (
    MPMTL_PHASES,
    OTHER,
    PMTL_PHASES,
    PhaseTimer,
    added_phase,
    describe_phases,
)


@pytest.fixture
def ticking(monkeypatch):
    """The timer's clock advances 1.0 per reading."""
    ticks = itertools.count()
    monkeypatch.setattr(_timing, "clock", lambda: float(next(ticks)))


def test_phases_add_up_to_the_wall_time(ticking):
    timer = PhaseTimer(PMTL_PHASES)  # reads 0
    with timer.phase("data"):  # 1 → 2
        pass
    with timer.phase("setup"):  # 3 → 4
        pass
    with timer.phase("setup"):  # 5 → 6: a phase measured twice adds up
        pass
    out = timer.record({"seconds": 0.5})  # reads 7
    assert out["seconds"] == 7.0
    assert list(out["phases"]) == list(PMTL_PHASES)  # every phase, in order, 0 when not run
    assert out["phases"] == {
        "data": 1.0, "setup": 2.0, "rounds": 0.0, "end_of_run": 0.0, "scoring": 0.0,
        "saving": 0.0, OTHER: 4.0,
    }  # fmt: skip
    assert sum(out["phases"].values()) == out["seconds"]


def test_carve_moves_at_most_what_the_phase_has(ticking):
    timer = PhaseTimer(PMTL_PHASES)
    with timer.phase("scoring"):
        pass
    timer.carve("scoring", "rounds", 0.25)
    assert (timer.seconds("rounds"), timer.seconds("scoring")) == (0.25, 0.75)
    timer.carve("scoring", "rounds", 5.0)  # more than measured: all of it, never negative
    assert (timer.seconds("rounds"), timer.seconds("scoring")) == (1.0, 0.0)
    timer.carve("rounds", "scoring", -1.0)
    assert timer.seconds("rounds") == 1.0


def test_bad_phases_are_refused():
    timer = PhaseTimer(MPMTL_PHASES)
    with pytest.raises(ValueError, match=r"'name' parameter.*'rounds'"):
        timer.seconds("rounds")  # not an MP-MTL phase
    with pytest.raises(ValueError, match=r"'name' parameter.*'other'"):
        with timer.phase(OTHER):  # the rest is never measured directly
            pass
    with pytest.raises(RuntimeError, match="'fit' started inside phase 'data'"):
        with timer.phase("data"), timer.phase("fit"):
            pass
    with pytest.raises(ValueError, match="'names' parameter must end with 'other'"):
        PhaseTimer(("data", "fit"))


def test_added_phase_extends_a_recorded_run(ticking):
    out = PhaseTimer(PMTL_PHASES).record({})  # 0 → 1
    with added_phase(out, "scoring"):  # 2 → 3
        pass
    assert out["seconds"] == 2.0 and out["phases"]["scoring"] == 1.0
    assert sum(out["phases"].values()) == out["seconds"]
    with pytest.raises(ValueError, match="no phase 'tuning'"):
        with added_phase(out, "tuning"):
            pass


def test_the_time_line_shows_every_phase_that_took_time_and_its_share():
    out = {
        "seconds": 555.0,
        "phases": {
            "data": 3.2, "setup": 0.01, "rounds": 0.9, "end_of_run": 540.1, "scoring": 10.8,
            "saving": 0.0, "other": 0.0,
        },
    }  # fmt: skip
    assert describe_phases(out, per_round=0.03) == (
        "555.0s (data 3.2s; rounds 0.9s, 0.030s/round; end of run 540.1s = 97%; scoring 10.8s = 2%)"
    )
    # the rounds are always shown; a run under a second keeps three decimals (never "0.0s")
    quick = {"seconds": 0.02, "phases": dict.fromkeys(PMTL_PHASES, 0.0)}
    assert describe_phases(quick, per_round=0.001) == "0.020s (rounds 0.0s, 0.001s/round)"
    assert describe_phases({"seconds": 12.34}) == "12.3s"
    assert describe_phases({"seconds": 1.0, "phases": dict.fromkeys(MPMTL_PHASES, 0.0)}) == "1.0s"
