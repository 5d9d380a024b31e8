"""Resumable CLI sweeps: a sweep SIGKILLed after some runs resumes with only the missing runs.

The killed process runs the real CLI and kills itself with SIGKILL right after its k-th run has
been logged (deterministic, no timing race). The resumed sweep must reuse exactly those k runs,
compute the others, and write the same table as an uninterrupted sweep (seeded noise).
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pytest

from privmtl.cli import main

KILL_AFTER = """
import os, signal, sys
from privmtl.experiments import runlog
real_add = runlog.RunLog.add
count = [0]
def add(self, config, row):
    out = real_add(self, config, row)
    count[0] += 1
    if count[0] == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)
    return out
runlog.RunLog.add = add
from privmtl.cli import main
sys.exit(main(sys.argv[2:]))
"""

MPMTL = [
    "mpmtl-sweep",
    "--data",
    "synthetic-lowrank",
    "--methods",
    "lowrank,stl-l2",
    "--epsilons",
    "0.3,1,3",
    "--tune",
    "none",
    "--reproducible-noise",
]
PMTL = [
    "pmtl-sweep",
    "--finetune",
    "none",
    "--data",
    "synthetic",
    "--methods",
    "pmtl,fedavg",
    "--epsilons",
    "1,4",
    "--clips",
    "0.5",
    "--rounds-grid",
    "3",
    "--reproducible-noise",
]


def _table(path, drop=("seconds",)):
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    return [{k: v for k, v in r.items() if k not in drop} for r in rows]


@pytest.mark.parametrize(
    ("argv", "table", "n_runs", "kill_after"),
    [(MPMTL, "mpmtl_sweep.csv", 4, 2), (PMTL, "pmtl_sweep.csv", 6, 3)],
)
def test_sigkilled_sweep_resumes_with_only_missing_runs(
    tmp_path, capsys, argv, table, n_runs, kill_after
):
    full, killed = tmp_path / "full", tmp_path / "killed"
    assert main([*argv, "--out", str(full), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["runs_reused"], out["runs_computed"]) == (0, n_runs)
    # every row carries its own guarantee, validity included
    for row in _table(full / table):
        assert row["valid"] == "True" and row["notion"] and row["relation"] and row["accountant"]

    proc = subprocess.run(
        [sys.executable, "-c", KILL_AFTER, str(kill_after), *argv, "--out", str(killed)],
        capture_output=True,
    )
    assert proc.returncode == -9  # SIGKILL
    # the log holds the finished runs; no table that looks complete
    assert len((killed / "runs.jsonl").read_text().splitlines()) == kill_after
    assert sorted(p.name for p in killed.iterdir()) == ["runs.jsonl"]

    assert main([*argv, "--out", str(killed), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["runs_reused"], out["runs_computed"]) == (kill_after, n_runs - kill_after)
    assert _table(killed / table) == _table(full / table)
    assert len((killed / "runs.jsonl").read_text().splitlines()) == n_runs

    # a finished sweep re-run computes nothing and writes the same table
    assert main([*argv, "--out", str(killed), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["runs_reused"], out["runs_computed"]) == (n_runs, 0)
    assert _table(killed / table) == _table(full / table)


#: Every name under which a command reaches the one-run functions (the sweeps and the demo too).
_RUN_FUNCTIONS = (
    "privmtl.cli.pmtl.run_pmtl",
    "privmtl.cli.mpmtl.run_mpmtl",
    "privmtl.experiments.pmtl.run_pmtl",
    "privmtl.experiments.pmtl_sweep.run_pmtl",
    "privmtl.experiments.mpmtl.run_mpmtl",
    "privmtl.experiments.mpmtl_sweep_runs.run_mpmtl",
)


def _no_run(*args, **kwargs):
    raise AssertionError("a run started before the output folder was checked")


@pytest.mark.parametrize(
    "argv",
    [
        MPMTL,
        PMTL,
        ["pmtl", "--data", "synthetic", "--model", "logreg", "--save-models"],
        ["mpmtl", "--data", "synthetic-lowrank", "--method", "stl-l2", "--save-models"],
        ["demo", "--out"],
    ],
)
def test_unwritable_output_exits_2_fast_having_computed_nothing(
    tmp_path, capsys, monkeypatch, argv
):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = blocker / "out"  # cannot be created, not even by root
    flag = [] if argv[-1].startswith("--") and argv[-1] != "--reproducible-noise" else ["--out"]
    # "fast, having computed nothing": every run function refuses to start (no wall-clock bound)
    for where in _RUN_FUNCTIONS:
        monkeypatch.setattr(where, _no_run)
    code = main([*argv, *flag, str(target)])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "writable" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_csv_row_states_an_invalid_guarantee():
    from privmtl.experiments.sweep import rows_to_csv

    text = rows_to_csv([{"method": "dp-mtrl", "guarantee": {"valid": False, "notion": "MP-MTL"}}])
    row = next(csv.DictReader(io.StringIO(text)))
    assert row["valid"] == "False" and row["notion"] == "MP-MTL"
