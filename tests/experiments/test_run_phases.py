"""A run's ``seconds`` is its wall time and ``phases`` splits it: with the timer's clock replaced
by a counter (every reading 1000 s later), each phase's seconds and their sum are exact."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pandas as pd
import pytest

from privmtl import _timing
from privmtl._timing import MPMTL_PHASES, PMTL_PHASES
from privmtl.experiments.mpmtl import run_mpmtl
from privmtl.experiments.pmtl import run_pmtl

T = 1000.0
"""Seconds between two readings of the counting clock: far more than any real round takes, so
that the engine's own time of its rounds (a real measure) never reaches the fit's."""

#: A small seeded run that ends with finetune="auto" (each client's choice among candidates).
SMALL = {
    "data": "synthetic", "num_clients": 12, "model": "logreg", "rounds": 3, "epsilon": 2.0,
    "threads": 1, "noise_source": "seeded",
}  # fmt: skip


@pytest.fixture
def ticking(monkeypatch):
    ticks = itertools.count()
    monkeypatch.setattr(_timing, "clock", lambda: T * next(ticks))


def test_pmtl_seconds_are_the_sum_of_its_phases(ticking, tmp_path, capsys):
    out = run_pmtl(**SMALL, show_progress=True, save_models=tmp_path / "models")
    phases = out["phases"]
    assert list(phases) == list(PMTL_PHASES)
    assert all(v >= 0 for v in phases.values())
    # 17 readings after the start: the method (setup), the user's factory (setup), the data, the
    # model and calibration (setup), the fit, the end of the run, the baseline (scoring), the
    # saving, and the result
    assert out["seconds"] == 17 * T
    assert sum(phases.values()) == pytest.approx(out["seconds"], abs=1e-9)
    assert phases["data"] == out["data_seconds"] == T
    assert phases["setup"] == 3 * T
    assert phases["saving"] == T
    assert phases[_timing.OTHER] == 9 * T  # between the phases: settings, the report
    # the fit is the rounds (the engine's own measure of them); finetune="auto" scores the
    # trained and the final models while it finishes the clients: its own measure of that time
    # moves from the end of the run to the scoring, as does the local baseline's
    assert phases["rounds"] + phases["scoring"] + phases["end_of_run"] == pytest.approx(
        3 * T, abs=1e-9
    )
    assert 0 < phases["end_of_run"] < T and T < phases["scoring"] < 2 * T
    assert phases["rounds"] == pytest.approx(out["seconds_per_round"] * out["rounds_run"])
    assert 0 < phases["rounds"] < T
    # finetune="auto" reports its local trainings (not a terminal: plain lines, the last at the end)
    err = capsys.readouterr().err
    done = re.findall(r"^end of run: (\d+)/(\d+) clients", err, flags=re.M)
    assert done and done[-1][0] == done[-1][1]  # every client of every trained candidate
    assert int(done[-1][1]) % SMALL["num_clients"] == 0


def test_pmtl_without_progress_or_saving(ticking, capsys):
    out = run_pmtl(**SMALL, show_progress=False)
    assert "end of run" not in capsys.readouterr().err
    assert out["phases"]["saving"] == 0.0  # nothing written: the phase did not run
    assert out["seconds"] == 15 * T == pytest.approx(sum(out["phases"].values()), abs=1e-9)


def test_mpmtl_seconds_are_the_sum_of_its_phases(ticking, tmp_path):
    out = run_mpmtl(
        data="synthetic-lowrank", method="lowrank", epsilon=1.0, iterations=3, tune=False,
        noise_source="seeded", save_models=tmp_path / "models",
    )  # fmt: skip
    assert list(out["phases"]) == list(MPMTL_PHASES)
    assert out["phases"] == {
        "data": T, "setup": 2 * T, "tuning": 0.0, "fit": T, "scoring": T, "saving": T,
        "other": 7 * T,
    }  # fmt: skip
    assert out["seconds"] == 13 * T == sum(out["phases"].values())


def test_mpmtl_pooled_search_is_its_tuning_phase(ticking, tmp_path):
    rng = np.random.default_rng(0)
    rows = [(f"t{t}", *rng.normal(size=2).round(4), 0.0) for t in range(4) for _ in range(12)]
    table = pd.DataFrame(rows, columns=["task", "a", "b", "y"])
    table["y"] = (table["a"] - table["b"] + rng.normal(size=len(table))).round(4)
    table.to_csv(tmp_path / "t.csv", index=False)
    out = run_mpmtl(
        data="table", data_path=tmp_path / "t.csv", method="stl-l2", tune="pooled", n_splits=2
    )
    assert out["tuned"] is True
    assert out["phases"]["tuning"] == T and out["phases"]["saving"] == 0.0
    assert out["seconds"] == sum(out["phases"].values())


def test_a_sweep_candidate_counts_the_scores_its_selection_reads(ticking):
    from privmtl.data.registry import load_federated
    from privmtl.experiments import pmtl_sweep

    ds = load_federated("synthetic", num_clients=12, seed=0)
    row = pmtl_sweep._candidate_run(
        dataset=ds, noise_source="seeded", data="synthetic", model="logreg", method="pmtl",
        epsilon=2.0, rounds=2, seed=0, finetune="none", threads=1,
    )  # fmt: skip
    assert row["client_scores"] and row["release_events"]
    # the run (15 T, its models saved for the scores), then reading its ledger and scoring every
    # client (one more T, in scoring): the sweep CSV's seconds is the whole
    assert row["seconds"] == 16 * T == pytest.approx(sum(row["phases"].values()), abs=1e-9)
    assert row["phases"]["rounds"] + row["phases"]["scoring"] == pytest.approx(2 * T, abs=1e-9)
