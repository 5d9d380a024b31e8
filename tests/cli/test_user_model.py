"""``--model MODULE:FACTORY`` / ``PATH.py:FACTORY`` from the working directory; ``evaluate`` anywhere."""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np
import pandas as pd
import pytest

from privmtl.cli import main

MODELS = """
import torch
from torch import nn


def make_mlp(n_features, n_classes):
    return nn.Sequential(nn.Linear(n_features, 8), nn.ReLU(), nn.Linear(8, n_classes))


def make_wide(n_features, n_classes):
    return nn.Linear(n_features, n_classes + 3)


def make_none(n_features, n_classes):
    return "not a module"


def make_fails(n_features, n_classes):
    raise RuntimeError("boom")


def make_bad_forward(n_features, n_classes):
    return nn.Linear(n_features + 1, n_classes)
"""


def _table(path, n_clients=6, rows=30, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(3, 4)) * 2
    frames = []
    for c in range(n_clients):
        y = rng.integers(0, 3, size=rows)
        f = pd.DataFrame(centers[y] + rng.normal(size=(rows, 4)), columns=list("abcd"))
        f.insert(0, "user", f"u{c}")
        f["label"] = y
        frames.append(f)
    pd.concat(frames, ignore_index=True).to_csv(path, index=False)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty directory outside the repository holding mymodels.py and a table, as cwd."""
    (tmp_path / "mymodels.py").write_text(MODELS)
    _table(tmp_path / "clients.csv")
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    yield tmp_path
    assert sys.path == before  # the working directory was put on the path only while importing


def _pmtl(model, *extra):
    return ["pmtl", "--data", "table", "--data-path", "clients.csv", "--client-column", "user",
            "--label-column", "label", "--model", model, "--rounds", "3", *extra]  # fmt: skip


def _json(capsys, argv):
    code = main(argv)
    cap = capsys.readouterr()
    assert code == 0, cap.err
    return json.loads(cap.out)


@pytest.mark.parametrize("spec", ["mymodels:make_mlp", "./mymodels.py:make_mlp"])
def test_factory_from_the_working_directory_saves_and_evaluates_anywhere(
    workdir, capsys, monkeypatch, spec
):
    out = _json(capsys, [*_pmtl(spec, "--save-models", "out1"), "--json"])
    meta = json.loads((workdir / "out1" / "model.json").read_text())
    factory = meta["model"]["factory"]
    text = (workdir / "mymodels.py").read_text()
    assert factory["source"] == text and factory["factory"] == "make_mlp"
    assert factory["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert factory["path"] == str((workdir / "mymodels.py").resolve())
    data = meta["data"]
    assert data["data_path"] == str((workdir / "clients.csv").resolve())
    assert (data["client_column"], data["label_column"], data["scaling"]) == (
        "user",
        "label",
        "per-client-clipped",
    )
    # from another directory, the factory's module gone from sys.modules: same accuracy
    monkeypatch.chdir("/")
    monkeypatch.delitem(sys.modules, "mymodels", raising=False)
    ev = _json(capsys, ["evaluate", str(workdir / "out1"), "--json"])
    assert ev["test_accuracy"] == out["test_accuracy"] and ev["notes"] == []
    # the factory file changed since: the recorded source is used, and the output says so
    (workdir / "mymodels.py").write_text(text + "\n# edited\n")
    ev2 = _json(capsys, ["evaluate", "--models", str(workdir / "out1"), "--json"])
    assert ev2["test_accuracy"] == out["test_accuracy"] and "changed" in ev2["notes"][0]


def test_a_changed_recorded_source_is_refused_in_one_line(workdir, capsys):
    _json(capsys, [*_pmtl("mymodels:make_mlp", "--save-models", "out1"), "--json"])
    path = workdir / "out1" / "model.json"
    meta = json.loads(path.read_text())
    meta["model"]["factory"]["source"] += "\nHIDDEN = 1\n"
    path.write_text(json.dumps(meta))
    # the edit breaks the folder's signature: no code runs without the user's consent
    assert main(["evaluate", str(workdir / "out1"), "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did not sign" in err[0]
    # with --trust-code, the recorded SHA-256 still refuses the changed source
    assert main(["evaluate", str(workdir / "out1"), "--trust-code", "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sha256" in err[0] and "changed" in err[0]


@pytest.mark.parametrize(
    ("factory", "needle"),
    [
        ("mymodels:make_wide", "(2, 6)"),  # Linear(n_features, n_classes + 3)
        ("mymodels:make_none", "torch.nn.Module"),
        ("mymodels:make_fails", "boom"),
        ("mymodels:make_bad_forward", "forward"),
        ("mymodels:nothing", "nothing"),
        ("nomodule:make", "nomodule"),
        ("./missing.py:make", "not found"),
    ],
)
def test_bad_factories_exit_2_naming_model_before_training(
    workdir, capsys, monkeypatch, factory, needle
):
    import privmtl.federated.engine as engine

    def no_training(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(engine, "train", no_training)
    assert main([*_pmtl(factory), "--json"]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert cap.out == "" and len(err) == 1
    assert "--model" in err[0] and needle in err[0]


def test_the_working_directory_wins_over_a_module_loaded_elsewhere(tmp_path, capsys, monkeypatch):
    for name, hidden in (("one", 3), ("two", 5)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "mymodels.py").write_text(
            "from torch import nn\n\ndef make(d, c):\n"
            f"    return nn.Sequential(nn.Linear(d, {hidden}), nn.Linear({hidden}, c))\n"
        )
        _table(folder / "clients.csv")
        monkeypatch.chdir(folder)
        _json(capsys, [*_pmtl("mymodels:make", "--save-models", "out"), "--json"])
        state = json.loads((folder / "out" / "model.json").read_text())
        assert f"nn.Linear(d, {hidden})" in state["model"]["factory"]["source"]
    monkeypatch.delitem(sys.modules, "mymodels", raising=False)


def test_mpmtl_table_with_its_own_columns_evaluates_from_anywhere(tmp_path, capsys, monkeypatch):
    rng = np.random.default_rng(3)
    frames = []
    for t in range(5):
        x = rng.normal(size=(40, 3)) * [1e-2, 1, 1e2]
        f = pd.DataFrame(x, columns=["p", "q", "r"])
        f.insert(0, "site", f"s{t}")
        f["outcome"] = x @ [50.0, 1.0, 0.01] + 0.1 * rng.normal(size=40) + 3
        frames.append(f)
    pd.concat(frames, ignore_index=True).to_csv(tmp_path / "tasks.csv", index=False)
    monkeypatch.chdir(tmp_path)
    out = _json(capsys, ["mpmtl", "--data", "table", "--data-path", "tasks.csv",
                         "--task-column", "site", "--target-column", "outcome",
                         "--method", "stl-l2", "--save-models", "mp", "--json"])  # fmt: skip
    data = json.loads((tmp_path / "mp" / "model.json").read_text())["data"]
    assert (data["task_column"], data["target_column"]) == ("site", "outcome")
    assert data["feature_columns"] == ["p", "q", "r"] and data["scaling"] == "per-task"
    assert data["data_path"] == str((tmp_path / "tasks.csv").resolve())
    monkeypatch.chdir("/")
    ev = _json(capsys, ["evaluate", str(tmp_path / "mp"), "--json"])
    assert ev["nmse"] == out["nmse"] and out["nmse"] < 0.05
    # a PMTL-only option is refused for MP-MTL models, in one line
    assert main(["evaluate", str(tmp_path / "mp"), "--client-column", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--client-column" in err[0]


def test_the_forward_check_leaves_model_modes_and_random_streams_alone(tmp_path):
    import torch

    from privmtl.federated.user_model import load_factory

    (tmp_path / "m.py").write_text(
        "from torch import nn\n\n"
        "def make(d, c):\n"
        "    net = nn.Sequential(nn.Linear(d, 4), nn.Dropout(0.5), nn.Linear(4, c))\n"
        "    net[1].eval()\n"
        "    return net\n"
    )
    user = load_factory(f"{tmp_path / 'm.py'}:make")
    torch.manual_seed(7)
    direct = user.factory(3, 2)
    after_direct = torch.get_rng_state()
    torch.manual_seed(7)
    built = user.build(3, 2)
    assert torch.equal(torch.get_rng_state(), after_direct)  # the check drew nothing
    assert [m.training for m in built.modules()] == [True, True, False, True]
    for a, b in zip(direct.parameters(), built.parameters(), strict=True):
        assert torch.equal(a, b)
