"""A folder of saved models (or a --config file) someone else wrote runs no code without consent.

Every tampered case exits 2 with one line on stderr and no traceback, and the code planted in it
never runs (its marker file is never created). The user's own folders (signed with the key in
PRIVMTL_CONFIG_DIR) reload from anywhere with no flag; another user's need ``--model`` or
``--trust-code``.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import io
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from privmtl.cli import main

MODELS = """
from torch import nn


def make_mlp(n_features, n_classes):
    return nn.Sequential(nn.Linear(n_features, 8), nn.ReLU(), nn.Linear(8, n_classes))
"""

RUN = ["pmtl", "--data", "table", "--data-path", "clients.csv", "--client-column", "user",
       "--label-column", "label", "--model", "mymodels:make_mlp", "--rounds", "2",
       "--finetune", "none", "--threads", "1", "--json"]  # fmt: skip


TABLE = ["--client-column", "user", "--label-column", "label"]


def _table(path: Path) -> None:
    rng = np.random.default_rng(0)
    frames = []
    for c in range(4):
        y = rng.integers(0, 3, size=20)
        f = pd.DataFrame(rng.normal(size=(20, 3)) + y[:, None], columns=list("abc"))
        f.insert(0, "user", f"u{c}")
        f["label"] = y
        frames.append(f)
    pd.concat(frames, ignore_index=True).to_csv(path, index=False)


@contextlib.contextmanager
def _cwd(path: Path):
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """``(home, result)``: a user's folder with mymodels.py, clients.csv, the models in ``M``
    (signed with the session's key) and ``run.json`` (the signed result)."""
    home = tmp_path_factory.mktemp("home")
    (home / "mymodels.py").write_text(MODELS)
    _table(home / "clients.csv")
    out = io.StringIO()
    with _cwd(home), contextlib.redirect_stdout(out):
        rc = main([*RUN, "--save-models", "M"])
    sys.modules.pop("mymodels", None)
    assert rc == 0
    (home / "run.json").write_text(out.getvalue())
    return home, json.loads(out.getvalue())


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """An empty working directory, with the user's module forgotten."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delitem(sys.modules, "mymodels", raising=False)
    return work


def _refused(capsys, argv, marker: Path) -> str:
    rc = main(argv)
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert rc == 2, cap.err
    assert len(lines) == 1 and lines[0].startswith("privmtl: error:"), cap.err
    assert "Traceback" not in cap.err and cap.out == ""
    assert not marker.exists(), "the planted code ran"
    return lines[0]


def _ok(capsys, argv) -> dict:
    rc = main(argv)
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return json.loads(cap.out)


def _plant(marker: Path) -> str:
    return f"open({str(marker)!r}, 'w').close()\n"


def _edit(folder: Path, change) -> None:
    path = folder / "model.json"
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))


class _Evil:
    """Unpickled, it would create the marker file (torch.load without weights_only)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (builtins.open, (self.marker, "w"))


def _source_with_code(folder, work, marker):
    def change(meta):
        record = meta["model"]["factory"]
        record["source"] = _plant(marker) + record["source"]
        record["sha256"] = hashlib.sha256(record["source"].encode()).hexdigest()

    _edit(folder, change)


def _module_in_cwd(folder, work, marker):
    (work / "evilmod.py").write_text(_plant(marker) + MODELS)

    def change(meta):
        meta["model"]["name"] = "evilmod:make_mlp"
        meta["model"]["factory"] = {"spec": "evilmod:make_mlp", "factory": "make_mlp",
                                    "module": "evilmod", "path": None, "source": None,
                                    "sha256": None}  # fmt: skip

    _edit(folder, change)


def _module_in_cwd_signed(folder, work, marker):
    """Even a folder this user signed never imports a module from the working directory."""
    from privmtl.trust import sign

    _module_in_cwd(folder, work, marker)
    path = folder / "model.json"
    path.write_text(json.dumps(sign(json.loads(path.read_text()))))


def _py_path_in_name(folder, work, marker):
    (work / "evil.py").write_text(_plant(marker) + MODELS)

    def change(meta):
        meta["model"]["name"] = f"{work / 'evil.py'}:make_mlp"
        del meta["model"]["factory"]

    _edit(folder, change)


def _files_absolute(folder, work, marker):
    shutil.copy(folder / "global.pt", work / "outside.pt")
    _edit(folder, lambda meta: meta["files"].update({"global": str(work / "outside.pt")}))


def _files_dotdot(folder, work, marker):
    shutil.copy(folder / "global.pt", folder.parent / "x.pt")
    _edit(folder, lambda meta: meta["files"].update({"global": "../x.pt"}))


def _symlink_escape(folder, work, marker):
    shutil.copy(folder / "global.pt", work / "outside.pt")
    (folder / "global.pt").unlink()
    (folder / "global.pt").symlink_to(work / "outside.pt")


def _rehash(folder, name="global.pt"):
    """Record the file's new SHA-256 in model.json (which is then no longer signed)."""
    digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    _edit(folder, lambda meta: meta["files_sha256"].update({name: digest}))


def _pickled_pt(folder, work, marker):
    import torch

    torch.save(_Evil(marker), folder / "global.pt")
    _rehash(folder)


def _not_torch(folder, work, marker):
    (folder / "global.pt").write_bytes(b"not a torch file")
    _rehash(folder)


def _other_weights(name):
    def tamper(folder, work, marker):
        """Weights of the same shapes from elsewhere (another run's file)."""
        import torch

        params = torch.load(folder / name, weights_only=True)
        torch.save({n: t + 1.0 for n, t in params.items()}, folder / name)

    return tamper


def _nul_in_name(folder, work, marker):
    _edit(folder, lambda meta: meta["files"].update({"global": "global.pt\x00.pt"}))


def _no_hashes(folder, work, marker):
    _edit(folder, lambda meta: meta.pop("files_sha256"))


def _installed_module(module, factory):
    def tamper(folder, work, marker):
        def change(meta):
            meta["model"]["name"] = f"{module}:{factory}"
            meta["model"]["factory"] = {"spec": f"{module}:{factory}", "factory": factory,
                                        "module": module, "path": None, "source": None,
                                        "sha256": None}  # fmt: skip
            meta.pop("signature")

        _edit(folder, change)

    return tamper


def _deep(folder, work, marker):
    (folder / "model.json").write_text("[" * 200_000 + "]" * 200_000)


def _malformed(text):
    def tamper(folder, work, marker):
        (folder / "model.json").write_text(text)

    return tamper


def _meta_change(change):
    def tamper(folder, work, marker):
        _edit(folder, change)

    return tamper


TAMPERS = {
    "source-with-code": (_source_with_code, "did not sign"),
    "module-in-cwd": (_module_in_cwd, "did not sign"),
    "module-in-cwd-signed": (_module_in_cwd_signed, "did not sign"),
    "py-path-in-name": (_py_path_in_name, "did not sign"),
    "files-absolute": (_files_absolute, "files.global"),
    "files-dotdot": (_files_dotdot, "files.global"),
    "symlink-escape": (_symlink_escape, "files.global"),
    "pickled-pt": (_pickled_pt, "weights_only"),
    "not-a-torch-file": (_not_torch, "weights_only"),
    "global-from-elsewhere": (_other_weights("global.pt"), "SHA-256"),
    "personalized-from-elsewhere": (_other_weights("personalized.pt"), "SHA-256"),
    "nul-in-files-global": (_nul_in_name, "files.global"),
    "no-file-hashes": (_no_hashes, "files_sha256"),
    "installed-this": (_installed_module("this", "x"), "did not sign"),
    "installed-venv-main": (_installed_module("venv.__main__", "x"), "did not sign"),
    "installed-os-spawnv": (_installed_module("os", "spawnv"), "did not sign"),
    "deep-json": (_deep, "nests"),
    "bad-json": (_malformed("{not json"), "not valid JSON"),
    "json-list": (_malformed("[1, 2]"), "JSON object"),
    "no-model": (_meta_change(lambda m: m.pop("model")), "model"),
    "features-not-int": (
        _meta_change(lambda m: m["model"].update(n_features="many")),
        "model.n_features",
    ),
    "files-not-object": (_meta_change(lambda m: m.update(files="global.pt")), "files"),
    "no-client-ids": (_meta_change(lambda m: m.pop("client_ids")), "client_ids"),
    "factory-not-object": (
        _meta_change(lambda m: m["model"].update(factory="mymodels:make_mlp")),
        "model.factory",
    ),
    "source-not-text": (
        _meta_change(lambda m: m["model"]["factory"].update(source=["x"])),
        "model.factory.source",
    ),
}


@pytest.mark.parametrize("case", list(TAMPERS))
def test_a_tampered_folder_exits_2_in_one_line_and_runs_nothing(
    saved, elsewhere, capsys, monkeypatch, case
):
    home, _ = saved
    tamper, needle = TAMPERS[case]
    folder = elsewhere.parent / "M"
    shutil.copytree(home / "M", folder)
    marker = elsewhere.parent / "pwned"
    # what the named modules would do if imported or called: each leaves the marker
    monkeypatch.setattr(sys, "argv", ["privmtl", str(marker)])  # venv.__main__ makes a venv there
    monkeypatch.setattr(os, "spawnv", lambda *a: marker.touch())
    for name in ("this", "venv.__main__"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    tamper(folder, elsewhere, marker)
    line = _refused(capsys, ["evaluate", str(folder), "--json"], marker)
    assert needle in line
    if needle == "did not sign":  # the ways out are named
        assert "--model" in line and "--trust-code" in line and str(folder) in line
    assert not {"evilmod", "this", "venv.__main__"} & set(sys.modules)


def test_own_models_reload_from_another_directory_with_no_flag(saved, elsewhere, capsys):
    home, run = saved
    ev = _ok(capsys, ["evaluate", str(home / "M"), "--json"])
    assert ev["test_accuracy"] == run["test_accuracy"]
    assert ev["data_path"] == str((home / "clients.csv").resolve())


@pytest.fixture
def other_user(tmp_path, monkeypatch):
    """Another user: another PRIVMTL_CONFIG_DIR, so the folder's signature is not theirs."""
    monkeypatch.setenv("PRIVMTL_CONFIG_DIR", str(tmp_path / "other-user"))


def test_another_users_models_need_model_or_trust_code(saved, elsewhere, other_user, capsys):
    home, run = saved
    folder, data = str(home / "M"), ["--data-path", str(home / "clients.csv")]
    marker = elsewhere / "never"
    line = _refused(capsys, ["evaluate", folder, *data, "--json"], marker)
    assert "did not sign" in line and "--model" in line and "--trust-code" in line
    # the recorded data path is not followed for a folder this user did not sign
    own = f"{home / 'mymodels.py'}:make_mlp"
    line = _refused(capsys, ["evaluate", folder, "--model", own, "--json"], marker)
    assert "--data-path" in line and "not signed" in line
    # the factory named again, from the user's own file: the run's accuracy
    ev = _ok(capsys, ["evaluate", folder, *data, "--model", own, "--json"])
    assert ev["test_accuracy"] == run["test_accuracy"]
    # a factory whose source differs from the recorded one is refused
    (elsewhere / "changed.py").write_text(MODELS + "\n# changed\n")
    line = _refused(capsys, ["evaluate", folder, *data, "--model", "./changed.py:make_mlp"], marker)
    assert "--model" in line and "sha256" in line
    # --trust-code runs the recorded source (its SHA-256 checked)
    ev = _ok(capsys, ["evaluate", folder, *data, "--trust-code", "--json"])
    assert ev["test_accuracy"] == run["test_accuracy"]


def test_a_config_file_naming_code_needs_a_signature_model_or_trust_code(saved, elsewhere, capsys):
    _, run = saved
    marker = elsewhere / "pwned"
    (elsewhere / "evil.py").write_text(_plant(marker) + MODELS)
    (elsewhere / "evilmod.py").write_text(_plant(marker) + MODELS)
    _table(elsewhere / "clients.csv")
    base = ["--data-path", "clients.csv", *TABLE, "--threads", "1", "--json"]
    for model in ("./evil.py:make_mlp", "evilmod:make_mlp"):
        doc = dict(run, model=model)
        doc.pop("signature")
        path = elsewhere / "shared.json"
        path.write_text(json.dumps(doc))
        line = _refused(capsys, ["pmtl", "--config", str(path), *base], marker)
        assert "--config" in line and "did not sign" in line and model in line
        # a signed file edited afterwards is not signed any more
        path.write_text(json.dumps({**doc, "signature": run["signature"]}))
        _refused(capsys, ["pmtl", "--config", str(path), *base], marker)
    assert "evilmod" not in sys.modules


def test_a_signed_result_reruns_and_trust_code_or_model_open_an_unsigned_one(
    saved, elsewhere, capsys, monkeypatch
):
    home, run = saved
    monkeypatch.chdir(home)
    again = _ok(capsys, ["pmtl", "--config", "run.json", *TABLE, "--data-path", "clients.csv",
                         "--threads", "1", "--json"])  # fmt: skip
    assert again["config"] == run["config"] and again["test_accuracy"] == run["test_accuracy"]
    assert again["signature"].startswith("hmac-sha256:")  # a result naming code is signed
    unsigned = {k: v for k, v in run.items() if k != "signature"}
    (elsewhere / "a.json").write_text(json.dumps(unsigned))
    for flag in (["--trust-code"], ["--model", "mymodels:make_mlp"]):
        b = _ok(capsys, ["pmtl", "--config", str(elsewhere / "a.json"), *flag, *TABLE,
                         "--data-path", str(home / "clients.csv"), "--threads", "1",
                         "--json"])  # fmt: skip
        assert b["test_accuracy"] == run["test_accuracy"]


def test_an_unsigned_mpmtl_folder_needs_data_path(tmp_path, capsys, monkeypatch):
    rng = np.random.default_rng(1)
    frames = []
    for t in range(4):
        x = rng.normal(size=(30, 3))
        f = pd.DataFrame(x, columns=["p", "q", "r"])
        f.insert(0, "task", f"t{t}")
        f["y"] = x @ [1.0, -1.0, 0.5] + 0.1 * rng.normal(size=30)
        frames.append(f)
    pd.concat(frames, ignore_index=True).to_csv(tmp_path / "tasks.csv", index=False)
    monkeypatch.chdir(tmp_path)
    out = _ok(capsys, ["mpmtl", "--data", "table", "--data-path", "tasks.csv", "--method",
                       "stl-l2", "--save-models", "mp", "--json"])  # fmt: skip
    monkeypatch.setenv("PRIVMTL_CONFIG_DIR", str(tmp_path / "other-user"))
    line = _refused(capsys, ["evaluate", "mp", "--json"], tmp_path / "never")
    assert "--data-path" in line
    ev = _ok(capsys, ["evaluate", "mp", "--data-path", "tasks.csv", "--json"])
    assert ev["nmse"] == out["nmse"]


def test_flower_local_config_naming_code_needs_a_signature_model_or_trust_code(
    elsewhere, capsys, monkeypatch
):
    pytest.importorskip("flwr")
    monkeypatch.chdir(elsewhere)
    marker = elsewhere / "pwned"
    (elsewhere / "evil.py").write_text(_plant(marker) + MODELS)
    result = {"config": {"method": "pmtl"}, "data": "synthetic", "model": "./evil.py:make_mlp"}
    (elsewhere / "spec.json").write_text(json.dumps(result))  # a result JSON, unsigned
    argv = ["flower", "local", "--config", "spec.json", "--json"]
    line = _refused(capsys, argv, marker)
    assert "--config" in line and "did not sign" in line and "evil.py" in line
    assert not (elsewhere / "privmtl-results").exists()


def test_a_method_named_only_by_an_unsigned_config_file_is_refused_by_pmtl(
    tmp_path, monkeypatch, capsys
):
    """A method file is code: named by a --config file this user did not sign, privmtl pmtl
    exits 2 in one line before loading it (as privmtl flower local does, and as for a model)."""
    from privmtl.cli import main

    monkeypatch.setenv("PRIVMTL_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "ran"
    (tmp_path / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"method": "evil.py:Evil", "rounds": 1}))
    argv = ["pmtl", "--config", str(spec), "--data", "synthetic", "--model", "logreg"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "code for method 'evil.py:Evil'" in err[0], err
    assert "did not sign" in err[0]
    assert not marker.exists()
