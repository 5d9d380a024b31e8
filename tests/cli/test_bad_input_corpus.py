"""Bad-input corpus: every command refuses bad input in one line, exit 2, and leaves nothing behind.

Each case runs the CLI in process (``privmtl.cli.main``) in a fresh temporary working directory
whose files are listed before and after: an error must leave no file or folder behind, in the
working directory or in the ``--out``/``--save-models``/``--checkpoint-dir``/``--work-dir`` it
names. A few cases run the installed ``privmtl`` script to show the real exit code and stderr.
Each case also names what the one error line must say (the parameter, and the value or the
constraint).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import pytest

from privmtl.cli import main

# ---------------------------------------------------------------------------- data files


def _client_table(n_clients: int = 6, rows: int = 10, seed: int = 0) -> pd.DataFrame:
    """A small valid federated table: a client column, three features, labels 0..2."""
    rng = np.random.default_rng(seed)
    n = n_clients * rows
    frame = pd.DataFrame(rng.normal(size=(n, 3)), columns=["f0", "f1", "f2"])
    frame.insert(0, "user", np.repeat([f"u{c}" for c in range(n_clients)], rows))
    frame["label"] = np.tile(np.arange(3), n // 3 + 1)[:n]
    return frame


def _task_table(n_tasks: int = 4, rows: int = 12, seed: int = 0) -> pd.DataFrame:
    """A small valid multi-task regression table: a task column, three features, y."""
    rng = np.random.default_rng(seed)
    n = n_tasks * rows
    frame = pd.DataFrame(rng.normal(size=(n, 3)), columns=["f0", "f1", "f2"])
    frame.insert(0, "task", np.repeat([f"t{c}" for c in range(n_tasks)], rows))
    frame["y"] = rng.normal(size=n)
    return frame


def _csv(frame: pd.DataFrame) -> Callable[[Path], None]:
    return lambda path: frame.to_csv(path, index=False)


def _with(column: str, row: int, value: object, base: Callable[[], pd.DataFrame] = _client_table):
    def make() -> pd.DataFrame:
        frame = base()
        if isinstance(value, str) or value is None:
            frame[column] = frame[column].astype(object)
        elif isinstance(value, float) and column in ("label", "y"):
            frame[column] = frame[column].astype(float)
        frame.loc[row, column] = value
        return frame

    return make


def _text(content: str | bytes) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)

    return write


def _dup_columns(path: Path) -> None:
    frame = _client_table()
    text = frame.to_csv(index=False).splitlines()
    text[0] = "user,f0,f0,f2,label"  # two columns named f0
    path.write_text("\n".join(text) + "\n")


def _mat_without_x(path: Path) -> None:
    from scipy.io import savemat

    savemat(path, {"A": np.ones((2, 2))})


def _many_columns(path: Path) -> None:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(60, 66)), columns=[f"feat_{j:02d}" for j in range(66)])
    frame.insert(0, "user", np.repeat([f"u{c}" for c in range(6)], 10))
    frame["label"] = np.tile(np.arange(3), 20)
    frame.to_csv(path, index=False)


# name in the tmp dir -> how to write it (written before every case that mentions it)
FILES: dict[str, Callable[[Path], None]] = {
    "good.csv": _csv(_client_table()),
    "tasks.csv": _csv(_task_table()),
    "empty.csv": _text(""),
    "header.csv": _text("user,f0,f1,f2,label\n"),
    "garbage.csv": _text(b"\x00\xff\xfe garbage \x00\x01" * 10),
    "garbage.parquet": _text(b"not a parquet file at all"),
    "table.txt": _csv(_client_table()),
    "text_feature.csv": _csv(_with("f1", 7, "abc")()),
    "nan_feature.csv": _csv(_with("f0", 3, float("nan"))()),
    "inf_feature.csv": _csv(_with("f2", 5, float("inf"))()),
    "float_label.csv": _csv(_with("label", 4, 3.5)()),
    "negative_label.csv": _csv(_with("label", 4, -1)()),
    "string_label.csv": _csv(_with("label", 4, "cat")()),
    "huge_label.csv": _csv(_with("label", 4, 999999)()),
    "constant_label.csv": _csv(_client_table().assign(label=0)),
    "missing_client.csv": _csv(_with("user", 2, None)()),
    "one_row_client.csv": _csv(pd.concat([_client_table(), _client_table(1, 1).assign(user="z")])),
    "dup_columns.csv": _dup_columns,
    "many_columns.csv": _many_columns,
    "task_text_target.csv": _csv(_with("y", 2, "high", _task_table)()),
    "task_nan_feature.csv": _csv(_with("f1", 2, float("nan"), _task_table)()),
    "task_dup_columns.csv": _text("task,f0,f0,y\nt0,1,2,3\nt0,1,2,3\n"),
    "garbage.mat": _text(b"MATLAB 5.0 MAT-file garbage garbage garbage"),
    "no_x.mat": _mat_without_x,
    "a_file": _text("I am a file, not a folder\n"),
    "bad.json": _text("{ not json"),
    "list.json": _text("[1, 2, 3]"),
    "ledger_garbage.jsonl": _text("not json at all\n"),
    "ledger_empty.jsonl": _text(""),
}

# folders created before every case that mentions them
DIRS = ("empty_dir", "dir.csv", "dir.mat", "dir.json")


# ---------------------------------------------------------------------------- the corpus

PMTL = ["pmtl", "--data", "synthetic", "--model", "logreg", "--num-clients", "8", "--rounds", "2"]
PMTL += ["--clients-per-round", "4", "--finetune", "none", "--quiet"]
FEMNIST = ["pmtl", "--data", "femnist-leaf", "--model", "cnn", "--rounds", "1", "--data-path"]
TABLE = ["pmtl", "--data", "table", "--client-column", "user", "--label-column", "label"]
TABLE += ["--model", "logreg", "--rounds", "2", "--finetune", "none", "--quiet", "--data-path"]
PSWEEP = ["pmtl-sweep", "--num-clients", "8", "--methods", "pmtl", "--epsilons", "1"]
PSWEEP += ["--clips", "0.5", "--rounds-grid", "2", "--clients-per-round", "4", "--out", "out"]
PSWEEP = [a for a in PSWEEP if a not in ("--num-clients", "8")]  # the sweep has no --num-clients
MPMTL = ["mpmtl", "--data", "synthetic-lowrank", "--method", "lowrank", "--no-tune"]
MTABLE = ["mpmtl", "--data", "table", "--method", "stl-l2", "--no-tune", "--data-path"]
SCHOOL = ["mpmtl", "--data", "school", "--method", "stl-l2", "--no-tune", "--data-path"]
MSWEEP = ["mpmtl-sweep", "--data", "synthetic-lowrank", "--methods", "lowrank", "--epsilons", "1"]
MSWEEP += ["--tune", "none", "--iterations", "2", "--out", "out"]
ACCOUNT = ["account", "--clip", "1", "--num-clients", "100", "--clients-per-round", "10"]
ACCOUNT += ["--rounds", "5", "--delta", "1e-5"]
ACC_SIGMA = [*ACCOUNT, "--noise-std", "1"]
AUDIT = ["audit", "--mechanism", "pmtl-gaussian", "--trials", "10"]
FLOWER = ["flower", "local", "--data", "synthetic", "--num-clients", "6", "--model", "logreg"]
FLOWER += ["--rounds", "1", "--work-dir", "work"]


class Case(NamedTuple):
    id: str
    argv: list[str]
    says: tuple[str, ...]  # substrings the one error line must hold


def _replace(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag``'s value replaced (or the flag appended)."""
    if flag in argv:
        i = argv.index(flag)
        return [*argv[: i + 1], value, *argv[i + 2 :]]
    return [*argv, flag, value]


def C(id: str, argv: list[str], *says: str) -> Case:
    return Case(id, argv, says)


CASES: list[Case] = [
    # ---- pmtl: numbers
    C("pmtl-eps-negative", [*PMTL, "--epsilon", "-1"], "epsilon", "-1"),
    C("pmtl-eps-zero", [*PMTL, "--epsilon", "0"], "epsilon", "0"),
    C("pmtl-eps-nan", [*PMTL, "--epsilon", "nan"], "epsilon", "nan"),
    C("pmtl-eps-inf", [*PMTL, "--epsilon", "inf"], "epsilon", "inf"),
    C("pmtl-eps-text", [*PMTL, "--epsilon", "abc"], "--epsilon", "abc"),
    C("pmtl-delta-one", [*PMTL, "--epsilon", "1", "--delta", "1"], "delta", "1"),
    C("pmtl-delta-above-one", [*PMTL, "--epsilon", "1", "--delta", "1.5"], "delta", "1.5"),
    C("pmtl-delta-zero", [*PMTL, "--epsilon", "1", "--delta", "0"], "delta", "0"),
    C("pmtl-delta-negative", [*PMTL, "--epsilon", "1", "--delta", "-1e-5"], "delta"),
    C("pmtl-delta-nan", [*PMTL, "--epsilon", "1", "--delta", "nan"], "delta", "nan"),
    C("pmtl-clip-zero", [*PMTL, "--epsilon", "1", "--clip", "0"], "clip", "0"),
    C("pmtl-clip-negative", [*PMTL, "--clip", "-1"], "clip", "-1"),
    C("pmtl-clip-nan", [*PMTL, "--clip", "nan"], "clip", "nan"),
    C("pmtl-local-patience-zero", [*PMTL, "--local-patience", "0"], "--local-patience", "0"),
    C("pmtl-local-solver-bogus", [*PMTL, "--local-solver", "newton"], "--local-solver", "newton"),
    C(
        "pmtl-local-patience-with-ridge",
        [*PMTL, "--local-solver", "ridge", "--local-patience", "3"],
        "local_patience",
        "ridge",
    ),
    C("pmtl-clip-inf", [*PMTL, "--epsilon", "1", "--clip", "inf"], "clip", "inf"),
    C("pmtl-rounds-zero", _replace(PMTL, "--rounds", "0"), "rounds", "0"),
    C("pmtl-rounds-negative", _replace(PMTL, "--rounds", "-3"), "rounds", "-3"),
    C("pmtl-rounds-float", _replace(PMTL, "--rounds", "2.5"), "--rounds", "2.5"),
    C("pmtl-rounds-huge", _replace(PMTL, "--rounds", "1e9"), "--rounds", "1e9"),
    C("pmtl-q-above-m", _replace(PMTL, "--clients-per-round", "9"), "clients_per_round", "9"),
    C("pmtl-q-zero", _replace(PMTL, "--clients-per-round", "0"), "clients_per_round", "0"),
    C(
        "pmtl-sampling-all-q-not-m",
        [*PMTL, "--sampling", "all"],
        "clients_per_round",
        "sampling='all'",
    ),
    C("pmtl-m-zero", _replace(PMTL, "--num-clients", "0"), "--num-clients", "0"),
    C("pmtl-lr-zero", [*PMTL, "--lr", "0"], "lr", "0"),
    C("pmtl-lr-nan", [*PMTL, "--lr", "nan"], "lr", "nan"),
    C("pmtl-lr-inf", [*PMTL, "--lr", "inf"], "lr", "inf"),
    C("pmtl-batch-zero", [*PMTL, "--batch-size", "0"], "batch_size", "0"),
    C("pmtl-local-steps-zero", [*PMTL, "--local-steps", "0"], "local_steps", "0"),
    C("pmtl-lam-negative", [*PMTL, "--lam", "-1"], "lam", "-1"),
    C("pmtl-noise-std-negative", [*PMTL, "--noise-std", "-1"], "noise_std", "-1"),
    C("pmtl-noise-std-nan", [*PMTL, "--noise-std", "nan"], "noise_std", "nan"),
    C("pmtl-budget-zero", [*PMTL, "--epsilon", "1", "--budget-epsilon", "0"], "--budget-epsilon"),
    C("pmtl-checkpoint-every-zero", [*PMTL, "--checkpoint-every", "0"], "--checkpoint-every"),
    C("pmtl-finetune-epochs-zero", [*PMTL, "--finetune-epochs", "0"], "--finetune-epochs"),
    C("pmtl-finetune-epochs-text", [*PMTL, "--finetune-epochs", "x"], "--finetune-epochs"),
    # ---- pmtl: choices, conflicts, paths
    C("pmtl-method-unknown", [*PMTL, "--method", "nope"], "--method", "nope"),
    C("pmtl-model-unknown", _replace(PMTL, "--model", "nope"), "--model", "nope"),
    C("pmtl-data-unknown", _replace(PMTL, "--data", "nope"), "--data", "nope"),
    C("pmtl-sampling-unknown", [*PMTL, "--sampling", "nope"], "--sampling", "nope"),
    C("pmtl-unknown-option", [*PMTL, "--frobnicate"], "--frobnicate"),
    C(
        "pmtl-model-empty",
        [*[a for a in PMTL if a not in ("--model", "logreg")], "--model", ""],
        "--model",
    ),
    C("pmtl-eps-and-sigma", [*PMTL, "--epsilon", "1", "--noise-std", "1"], "noise"),
    C("pmtl-steps-and-epochs", [*PMTL, "--local-steps", "2", "--local-epochs", "2"], "local"),
    C("pmtl-paper-delta-and-delta", [*PMTL, "--paper-delta", "--delta", "1e-5"], "delta"),
    C("pmtl-threads-zero", [*PMTL, "--threads", "0"], "--threads", "0"),
    C("pmtl-resume-no-ckpt", [*PMTL, "--resume"], "--resume", "--checkpoint-dir"),
    C("pmtl-save-models-file", [*PMTL, "--save-models", "a_file"], "--save-models", "a_file"),
    C("pmtl-ckpt-dir-file", [*PMTL, "--checkpoint-dir", "a_file"], "checkpoint", "a_file"),
    C("pmtl-config-missing", [*PMTL, "--config", "nothere.json"], "--config", "nothere.json"),
    C("pmtl-config-garbage", [*PMTL, "--config", "bad.json"], "bad.json"),
    C("pmtl-config-list", [*PMTL, "--config", "list.json"], "list.json"),
    C("pmtl-config-dir", [*PMTL, "--config", "dir.json"], "dir.json"),
    C("pmtl-column-without-table", [*PMTL, "--client-column", "user"], "--client-column"),
    C("pmtl-table-no-path", TABLE[:-1], "--data-path"),
    C("pmtl-femnist-missing", [*FEMNIST, "nope"], "nope"),
    C("pmtl-femnist-file", [*FEMNIST, "a_file"], "a_file"),
    C(
        "pmtl-femnist-num-clients",
        [*_replace(PMTL, "--data", "femnist-leaf"), "--data-path", "empty_dir"],
        "num_clients",
        "synthetic",
    ),
    # ---- pmtl --data table: files
    C("table-missing-file", [*TABLE, "nothere.csv"], "nothere.csv", "not found"),
    C("table-directory", [*TABLE, "dir.csv"], "dir.csv"),
    C("table-empty-file", [*TABLE, "empty.csv"], "empty.csv"),
    C("table-header-only", [*TABLE, "header.csv"], "header.csv", "no rows"),
    C("table-garbage-csv", [*TABLE, "garbage.csv"], "garbage.csv"),
    C("table-garbage-parquet", [*TABLE, "garbage.parquet"], "garbage.parquet"),
    C("table-unknown-suffix", [*TABLE, "table.txt"], "table.txt", ".txt"),
    C(
        "table-missing-client-col",
        [*_replace(TABLE, "--client-column", "who"), "good.csv"],
        "--client-column",
        "'who'",
    ),
    C(
        "table-missing-label-col",
        [*_replace(TABLE, "--label-column", "y"), "good.csv"],
        "--label-column",
        "'y'",
    ),
    C("table-missing-feature-col", [*TABLE, "good.csv", "--feature-columns", "f0,f9"], "'f9'"),
    C("table-feature-is-label", [*TABLE, "good.csv", "--feature-columns", "f0,label"], "label"),
    C(
        "table-feature-columns-empty",
        [*TABLE, "good.csv", "--feature-columns", ","],
        "--feature-columns",
    ),
    C("table-non-numeric-feature", [*TABLE, "text_feature.csv"], "non-numeric", "'f1'", "line"),
    C("table-nan-feature", [*TABLE, "nan_feature.csv"], "NaN", "'f0'", "line 5"),
    C("table-inf-feature", [*TABLE, "inf_feature.csv"], "infinite", "'f2'", "line 7"),
    C("table-float-label", [*TABLE, "float_label.csv"], "label", "got 3.5"),
    C("table-negative-label", [*TABLE, "negative_label.csv"], "label", "-1"),
    C("table-string-label", [*TABLE, "string_label.csv"], "non-numeric", "'label'", "0..C-1"),
    C("table-huge-label", [*TABLE, "huge_label.csv"], "999999", "4 distinct"),
    C("table-constant-label", [*TABLE, "constant_label.csv"], "label", "one class"),
    C("table-missing-client", [*TABLE, "missing_client.csv"], "missing client", "line 4"),
    C("table-one-row-client", [*TABLE, "one_row_client.csv"], "'z'", "1 row"),
    C("table-duplicate-columns", [*TABLE, "dup_columns.csv"], "'f0'", "more than once"),
    C(
        "table-66-columns-missing",
        [*_replace(TABLE, "--label-column", "lable"), "many_columns.csv"],
        "'lable'",
        "and 58 more",
        "did you mean",
        "'label'",
    ),
    C("table-q-above-m", [*TABLE, "good.csv", "--clients-per-round", "7"], "clients_per_round"),
    C("table-scaling-unknown", [*TABLE, "good.csv", "--scaling", "pooled"], "--scaling", "pooled"),
    # ---- pmtl-sweep
    C("psweep-eps-negative", _replace(PSWEEP, "--epsilons", "-1"), "--epsilons"),
    C("psweep-eps-zero", _replace(PSWEEP, "--epsilons", "0,1"), "--epsilons"),
    C("psweep-eps-text", _replace(PSWEEP, "--epsilons", "1,abc"), "--epsilons", "abc"),
    C("psweep-eps-nan", _replace(PSWEEP, "--epsilons", "nan"), "epsilon", "nan"),
    C("psweep-eps-inf", _replace(PSWEEP, "--epsilons", "inf"), "epsilon", "inf"),
    C("psweep-eps-empty", _replace(PSWEEP, "--epsilons", ","), "--epsilons"),
    C("psweep-method-unknown", _replace(PSWEEP, "--methods", "pmtl,nope"), "--methods", "nope"),
    C("psweep-methods-empty", _replace(PSWEEP, "--methods", ","), "--methods"),
    C("psweep-clip-negative", _replace(PSWEEP, "--clips", "-1"), "clip", "-1"),
    C("psweep-clip-text", _replace(PSWEEP, "--clips", "big"), "--clips", "big"),
    C("psweep-rounds-zero", _replace(PSWEEP, "--rounds-grid", "0"), "rounds", "0"),
    C("psweep-rounds-float", _replace(PSWEEP, "--rounds-grid", "2.5"), "--rounds-grid", "2.5"),
    C("psweep-seeds-text", [*PSWEEP, "--seeds", "zero"], "--seeds", "zero"),
    C("psweep-seeds-negative", [*PSWEEP, "--seeds", "-1"], "seed", "-1"),
    C("psweep-lams-negative", [*PSWEEP, "--lams", "-1"], "lam", "-1"),
    C("psweep-vote-share-zero", [*PSWEEP, "--vote-share", "0"], "--vote-share", "0"),
    C("psweep-vote-share-big", [*PSWEEP, "--vote-share", "1.5"], "--vote-share", "1.5"),
    C("psweep-select-unknown", [*PSWEEP, "--select", "nope"], "--select", "nope"),
    C("psweep-q-above-m", _replace(PSWEEP, "--clients-per-round", "99"), "clients_per_round", "99"),
    C("psweep-out-is-file", _replace(PSWEEP, "--out", "a_file"), "a_file"),
    C("psweep-lr-negative", [*PSWEEP, "--lr", "-0.1"], "lr", "-0.1"),
    C(
        "psweep-table-missing",
        [
            *PSWEEP,
            "--data",
            "table",
            "--data-path",
            "nothere.csv",
            "--client-column",
            "user",
            "--label-column",
            "label",
        ],
        "nothere.csv",
    ),
    # ---- mpmtl
    C("mpmtl-eps-negative", [*MPMTL, "--epsilon", "-1"], "--epsilon", "-1"),
    C("mpmtl-eps-zero", [*MPMTL, "--epsilon", "0"], "--epsilon", "0"),
    C("mpmtl-eps-nan", [*MPMTL, "--epsilon", "nan"], "--epsilon", "nan"),
    C("mpmtl-eps-inf", [*MPMTL, "--epsilon", "inf"], "--epsilon", "inf"),
    C("mpmtl-delta-one", [*MPMTL, "--epsilon", "1", "--delta", "1"], "--delta", "1"),
    C("mpmtl-delta-zero", [*MPMTL, "--epsilon", "1", "--delta", "0"], "--delta", "0"),
    C("mpmtl-delta-nan", [*MPMTL, "--epsilon", "1", "--delta", "nan"], "--delta", "nan"),
    C("mpmtl-iterations-zero", [*MPMTL, "--iterations", "0"], "--iterations", "0"),
    C(
        "mpmtl-iterations-negative",
        [*MPMTL, "--epsilon", "1", "--iterations", "-2"],
        "--iterations",
        "-2",
    ),
    C(
        "mpmtl-budget-negative",
        [*MPMTL, "--epsilon", "1", "--budget-epsilon", "-1"],
        "--budget-epsilon",
        "-1",
    ),
    C(
        "mpmtl-budget-nan",
        [*MPMTL, "--epsilon", "1", "--budget-epsilon", "nan"],
        "--budget-epsilon",
        "nan",
    ),
    C("mpmtl-method-unknown", _replace(MPMTL, "--method", "nope"), "--method", "nope"),
    C("mpmtl-noise-unknown", [*MPMTL, "--noise", "laplace"], "--noise", "laplace"),
    C("mpmtl-tune-unknown", [*MPMTL, "--tune", "always"], "--tune", "always"),
    C("mpmtl-missing-method", MPMTL[:3], "--method"),
    C("mpmtl-paper-delta-and-delta", [*MPMTL, "--paper-delta", "--delta", "1e-5"], "--delta"),
    C("mpmtl-checkpoint-every-zero", [*MPMTL, "--checkpoint-every", "0"], "--checkpoint-every"),
    C("mpmtl-train-fraction-one", [*MPMTL, "--train-fraction", "1"], "--train-fraction", "1"),
    C("mpmtl-train-fraction-zero", [*MPMTL, "--train-fraction", "0"], "--train-fraction", "0"),
    C("mpmtl-features-without-table", [*MPMTL, "--feature-columns", "a"], "--feature-columns"),
    C("mpmtl-save-models-file", [*MPMTL, "--save-models", "a_file"], "a_file"),
    C("mpmtl-ckpt-dir-file", [*MPMTL, "--checkpoint-dir", "a_file"], "a_file"),
    C("mpmtl-resume-no-ckpt", [*MPMTL, "--epsilon", "1", "--resume"], "--resume"),
    C("school-missing", [*SCHOOL, "nothere.mat"], "nothere.mat"),
    C("school-directory", [*SCHOOL, "dir.mat"], "dir.mat"),
    C("school-garbage", [*SCHOOL, "garbage.mat"], "garbage.mat"),
    C("school-empty", [*SCHOOL, "empty.csv"], "empty.csv"),
    C("school-no-x", [*SCHOOL, "no_x.mat"], "no_x.mat", "'X'"),
    C("mtable-missing-file", [*MTABLE, "nothere.csv"], "nothere.csv"),
    C("mtable-empty-file", [*MTABLE, "empty.csv"], "empty.csv"),
    C("mtable-missing-task-col", [*MTABLE, "good.csv"], "task column", "--task-column", "'task'"),
    C(
        "mtable-missing-target-col",
        [*MTABLE, "tasks.csv", "--target-column", "z"],
        "'z'",
        "--target-column",
    ),
    C("mtable-text-target", [*MTABLE, "task_text_target.csv"], "non-numeric", "'y'", "0/1 or -1/1"),
    C("mtable-nan-feature", [*MTABLE, "task_nan_feature.csv"], "NaN", "'f1'"),
    C("mtable-dup-columns", [*MTABLE, "task_dup_columns.csv"], "'f0'", "more than once"),
    C("mtable-unknown-suffix", [*MTABLE, "table.txt"], "table.txt"),
    # ---- mpmtl-sweep
    C("msweep-eps-negative", _replace(MSWEEP, "--epsilons", "-1"), "--epsilons"),
    C("msweep-eps-text", _replace(MSWEEP, "--epsilons", "one"), "--epsilons", "one"),
    C("msweep-eps-nan", _replace(MSWEEP, "--epsilons", "nan"), "epsilon", "nan"),
    C("msweep-eps-inf", _replace(MSWEEP, "--epsilons", "inf"), "epsilon", "inf"),
    C("msweep-eps-empty", _replace(MSWEEP, "--epsilons", ""), "--epsilons"),
    C("msweep-method-unknown", _replace(MSWEEP, "--methods", "nope"), "--methods", "nope"),
    C("msweep-seeds-text", [*MSWEEP, "--seeds", "x"], "--seeds", "x"),
    C("msweep-iterations-zero", _replace(MSWEEP, "--iterations", "0"), "iterations", "0"),
    C("msweep-jobs-zero", [*MSWEEP, "--jobs", "0"], "--jobs", "0"),
    C("msweep-vote-share-zero", [*MSWEEP, "--vote-share", "0"], "--vote-share", "0"),
    C("msweep-vote-share-one", [*MSWEEP, "--vote-share", "1"], "vote_share", "1"),
    C("msweep-eigen-floor-negative", [*MSWEEP, "--eigen-floor", "-1"], "eigen_floor", "-1"),
    C("msweep-eigen-floor-text", [*MSWEEP, "--eigen-floor", "median"], "--eigen-floor", "median"),
    C(
        "msweep-eigen-floor-projection",
        [*MSWEEP, "--eigen-floor", "2", "--final-step", "projection"],
        "eigen_floor",
        "projection",
    ),
    C("msweep-out-is-file", _replace(MSWEEP, "--out", "a_file"), "a_file"),
    C("msweep-tune-unknown", _replace(MSWEEP, "--tune", "twice"), "--tune", "twice"),
    C(
        "msweep-table-missing",
        [*_replace(MSWEEP, "--data", "table"), "--data-path", "no.csv"],
        "no.csv",
    ),
    # ---- evaluate (model-folder contents are another corpus)
    C("evaluate-no-folder", ["evaluate"], "DIRECTORY"),
    C("evaluate-missing-folder", ["evaluate", "nothere"], "nothere"),
    C("evaluate-file", ["evaluate", "a_file"], "a_file"),
    C("evaluate-empty-folder", ["evaluate", "empty_dir"], "model.json"),
    C("evaluate-scaling-unknown", ["evaluate", "empty_dir", "--scaling", "x"], "--scaling"),
    C(
        "evaluate-train-fraction",
        ["evaluate", "empty_dir", "--train-fraction", "2"],
        "--train-fraction",
    ),
    C("evaluate-seed-text", ["evaluate", "empty_dir", "--seed", "abc"], "--seed", "abc"),
    # ---- ledger
    C("ledger-missing", ["ledger", "nothere.jsonl"], "nothere.jsonl"),
    C("ledger-empty-dir", ["ledger", "empty_dir"], "empty_dir"),
    C("ledger-garbage", ["ledger", "ledger_garbage.jsonl"], "ledger_garbage.jsonl"),
    C("ledger-empty-file", ["ledger", "ledger_empty.jsonl"], "ledger_empty.jsonl"),
    C("ledger-delta-one", ["ledger", "ledger_empty.jsonl", "--delta", "1"], "--delta", "1"),
    C("ledger-delta-nan", ["ledger", "ledger_empty.jsonl", "--delta", "nan"], "--delta", "nan"),
    C("ledger-accountant-unknown", ["ledger", "empty_dir", "--accountant", "x"], "--accountant"),
    # ---- account
    C("account-m-zero", [*_replace(ACC_SIGMA, "--num-clients", "0")], "num_clients", "0"),
    C("account-q-zero", [*_replace(ACC_SIGMA, "--clients-per-round", "0")], "clients_per_round"),
    C(
        "account-q-above-m",
        [*_replace(ACC_SIGMA, "--clients-per-round", "101")],
        "clients_per_round",
        "101",
    ),
    C("account-rounds-zero", [*_replace(ACC_SIGMA, "--rounds", "0")], "rounds", "0"),
    C("account-clip-zero", [*_replace(ACC_SIGMA, "--clip", "0")], "clip", "0"),
    C("account-clip-nan", [*_replace(ACC_SIGMA, "--clip", "nan")], "clip", "nan"),
    C("account-delta-zero", [*_replace(ACC_SIGMA, "--delta", "0")], "delta", "0"),
    C("account-delta-one", [*_replace(ACC_SIGMA, "--delta", "1")], "delta", "1"),
    C("account-rounds-negative", [*_replace(ACC_SIGMA, "--rounds", "-5")], "--rounds", "-5"),
    C("account-sigma-negative", [*_replace(ACC_SIGMA, "--noise-std", "-1")], "noise_std", "-1"),
    C("account-sigma-nan", [*_replace(ACC_SIGMA, "--noise-std", "nan")], "noise_std", "nan"),
    C("account-sigma-inf", [*_replace(ACC_SIGMA, "--noise-std", "inf")], "noise_std", "inf"),
    C("account-target-negative", [*ACCOUNT, "--target-epsilon", "-1"], "epsilon", "-1"),
    C("account-target-zero", [*ACCOUNT, "--target-epsilon", "0"], "epsilon", "0"),
    C("account-target-nan", [*ACCOUNT, "--target-epsilon", "nan"], "epsilon", "nan"),
    C("account-target-huge", [*ACCOUNT, "--target-epsilon", "1e300"], "epsilon", "at most 100"),
    C("account-neither", ACCOUNT, "noise"),
    C("account-both", [*ACC_SIGMA, "--target-epsilon", "1"], "noise"),
    C("account-missing-delta", ACC_SIGMA[:-4] + ACC_SIGMA[-2:], "--delta"),
    C("account-m-text", [*_replace(ACC_SIGMA, "--num-clients", "many")], "--num-clients", "many"),
    C("account-sampling-all", [*ACC_SIGMA, "--sampling", "all"], "--sampling", "all"),
    # ---- audit
    C("audit-eps-negative", [*AUDIT, "--epsilon", "-1"], "epsilon", "-1"),
    C("audit-eps-zero", [*AUDIT, "--epsilon", "0"], "epsilon", "0"),
    C("audit-eps-nan", [*AUDIT, "--epsilon", "nan"], "epsilon", "nan"),
    C("audit-delta-one", [*AUDIT, "--epsilon", "1", "--delta", "1"], "delta", "1"),
    C("audit-trials-zero", [*_replace(AUDIT, "--trials", "0"), "--epsilon", "1"], "trials", "0"),
    C("audit-confidence-one", [*AUDIT, "--epsilon", "1", "--confidence", "1"], "confidence"),
    C("audit-confidence-nan", [*AUDIT, "--epsilon", "1", "--confidence", "nan"], "confidence"),
    C("audit-mechanism-unknown", ["audit", "--mechanism", "x", "--epsilon", "1"], "--mechanism"),
    C("audit-mutation-unknown", [*AUDIT, "--epsilon", "1", "--mutation", "x"], "--mutation"),
    C("audit-missing-epsilon", AUDIT, "--epsilon"),
    C("audit-mediation-seed-text", ["audit", "mediation", "--seed", "x"], "--seed", "x"),
    C("audit-mediation-unknown-option", ["audit", "mediation", "--fast"], "--fast"),
    # ---- demo
    C("demo-seeds-zero", ["demo", "--out", "out", "--seeds", "0"], "--seeds", "0"),
    C("demo-seed-text", ["demo", "--out", "out", "--seed", "x"], "--seed", "x"),
    C("demo-tune-unknown", ["demo", "--out", "out", "--tune", "x"], "--tune", "x"),
    C("demo-out-is-file", ["demo", "--small", "--out", "a_file"], "a_file"),
    # ---- flower local (argument validation only: no Flower process is started)
    C("flower-eps-negative", [*FLOWER, "--epsilon", "-1"], "epsilon", "-1"),
    C("flower-delta-one", [*FLOWER, "--epsilon", "1", "--delta", "1"], "delta", "1"),
    C("flower-supernodes-zero", [*FLOWER, "--num-supernodes", "0"], "supernodes", "0"),
    C("flower-q-above-m", [*FLOWER, "--clients-per-round", "7"], "clients_per_round", "7"),
    C("flower-rounds-zero", _replace(FLOWER, "--rounds", "0"), "rounds", "0"),
    C("flower-model-unknown", _replace(FLOWER, "--model", "mlp"), "--model", "mlp"),
    C("flower-timeout-zero", [*FLOWER, "--timeout", "0"], "--timeout", "0"),
    C(
        "flower-budget-zero",
        [*FLOWER, "--epsilon", "1", "--budget-epsilon", "0"],
        "--budget-epsilon",
    ),
    C("flower-resume-no-workdir", [*FLOWER[:-2], "--resume"], "--resume", "--work-dir"),
    C("flower-workdir-file", _replace(FLOWER, "--work-dir", "a_file"), "a_file"),
    C("flower-no-subcommand-option", ["flower", "--frobnicate"], "--frobnicate"),
    # ---- per-client rows and reports: their paths are checked before the run
    C("pmtl-per-client-suffix", [*PMTL, "--per-client", "rows.txt"], "--per-client", "rows.txt"),
    C("pmtl-per-client-folder", [*PMTL, "--per-client", "dir.csv"], "--per-client", "dir.csv"),
    C("pmtl-report-suffix", [*PMTL, "--report", "r.pdf"], "--report", "r.pdf"),
    C("mpmtl-per-client-suffix", [*MPMTL, "--per-client", "r.json"], "--per-client", "r.json"),
    C("evaluate-per-client-suffix", ["evaluate", "empty_dir", "--per-client", "r.xlsx"], "r.xlsx"),
    C("report-missing", ["report", "nothere.json"], "nothere.json"),
    C("report-garbage", ["report", "bad.json"], "bad.json"),
    C("report-list", ["report", "list.json"], "list.json"),
    C("report-empty-folder", ["report", "empty_dir", "-o", "r.html"], "model.json"),
    C("report-output-suffix", ["report", "list.json", "-o", "r.txt"], "output", "r.txt"),
    C("unknown-command", ["frobnicate"], "frobnicate"),
]


def _prepare(tmp: Path, argv: list[str]) -> None:
    for arg in argv:
        if arg in FILES:
            FILES[arg](tmp / arg)
        elif arg in DIRS:
            (tmp / arg).mkdir()


def _tree(root: Path) -> dict[str, int]:
    """Every file and folder under ``root`` with its size (-1 for folders)."""
    return {
        str(p.relative_to(root)): (-1 if p.is_dir() else p.stat().st_size)
        for p in sorted(root.rglob("*"))
    }


def _check_one_line(rc: int, err: str, case: Case) -> str:
    assert rc == 2, (case.id, rc, err)
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("privmtl: error: "), line
    for text in case.says:
        assert text in line, (text, line)
    return line


def test_corpus_is_large_and_covers_every_command():
    import click

    from privmtl.cli import _LAZY_COMMANDS, cli

    assert len(CASES) >= 100
    assert len({c.id for c in CASES}) == len(CASES)  # unique ids
    used = {c.argv[0] for c in CASES}
    assert set(_LAZY_COMMANDS) <= used, set(_LAZY_COMMANDS) - used
    flower = cli.get_command(click.Context(cli), "flower")
    assert isinstance(flower, click.Group)
    assert set(flower.commands) == {"local"}  # `flower local` is covered above


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_exits_2_in_one_line_leaving_nothing(case, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _prepare(tmp_path, case.argv)
    before = _tree(tmp_path)
    rc = main(list(case.argv))
    out, err = capsys.readouterr()
    _check_one_line(rc, err, case)
    assert out == ""
    assert _tree(tmp_path) == before  # nothing created, nothing changed


SUBPROCESS_CASES = ["table-float-label", "mpmtl-eps-negative", "account-q-above-m"]


@pytest.mark.skipif(shutil.which("privmtl", path=str(Path(sys.executable).parent)) is None,
                    reason="the privmtl script is not installed next to this Python")  # fmt: skip
@pytest.mark.parametrize("case_id", SUBPROCESS_CASES)
def test_the_installed_script_exits_2_in_one_line(case_id, tmp_path):
    case = next(c for c in CASES if c.id == case_id)
    _prepare(tmp_path, case.argv)
    before = _tree(tmp_path)
    script = str(Path(sys.executable).parent / "privmtl")
    proc = subprocess.run(
        [script, *case.argv], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    _check_one_line(proc.returncode, proc.stderr, case)
    assert proc.stdout == ""
    assert _tree(tmp_path) == before
