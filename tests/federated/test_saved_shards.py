"""Saved personalized models in shards (privmtl.federated.saved) and ``privmtl evaluate`` streaming
them back: with the shard size made small, a run saved in several shards holds exactly the
single file's tensors and evaluates to exactly the same numbers; a small run keeps the single
``personalized.pt``; every malformed shard list or shard file is refused in one line naming the key
(library and CLI, exit 2)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from privmtl.cli import main
from privmtl.data.registry import load_federated
from privmtl.exceptions import DataFormatError
from privmtl.experiments.pmtl import evaluate_saved, make_model, run_pmtl
from privmtl.federated import blocks, saved
from privmtl.federated.saved import MODEL_SHARD_CLIENTS, iter_personalized, load_models, read_meta
from privmtl.federated.scoring import evaluate
from privmtl.locking import LOCK_NAME

M, SHARD = 150, 70  # blocks of more and of fewer clients than client_scores vmaps together
RUN = {
    "data": "synthetic", "num_clients": M, "model": "logreg", "rounds": 2, "epsilon": 2.0,
    "threads": 1, "noise_source": "seeded", "finetune": "none", "show_progress": False,
    "seed": 3,
}  # fmt: skip
KEYS = ("test_accuracy", "mean_client_accuracy", "n_test", "global_test_accuracy")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``(single, sharded, run result)``: the same seeded run saved whole and in shards of 70."""
    root = tmp_path_factory.mktemp("shards")
    out = run_pmtl(**RUN, save_models=root / "single")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(saved, "MODEL_SHARD_CLIENTS", SHARD)
        again = run_pmtl(**RUN, save_models=root / "sharded")
    assert again["test_accuracy"] == out["test_accuracy"]
    return root / "single", root / "sharded", out


def _names(folder):
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def test_the_shard_size_keeps_a_logreg_shard_well_under_100_mb():
    assert 610 * 4 * MODEL_SHARD_CLIENTS < 50e6


def test_a_population_that_fits_one_shard_keeps_the_single_file(folders):
    single, _, _ = folders
    meta = json.loads((single / "model.json").read_text())
    files = {"global": "global.pt", "personalized": "personalized.pt", "clients": "clients.csv"}
    assert meta["files"] == files
    assert _names(single) == ["clients.csv", "global.pt", "model.json", "personalized.pt"]
    stack = torch.load(single / "personalized.pt", weights_only=True)  # the documented recipe
    assert all(t.shape[0] == M for t in stack.values())
    assert [(a, b) for a, b, _ in iter_personalized(single, read_meta(single))] == [(0, M)]


def test_shards_hold_the_single_files_rows_in_client_order(folders):
    single, sharded, _ = folders
    meta = json.loads((sharded / "model.json").read_text())
    shards = meta["files"]["personalized_shards"]
    assert "personalized" not in meta["files"]
    bounds = [(0, 70), (70, 140), (140, 150)]
    assert [(s["start"], s["stop"]) for s in shards] == bounds
    assert _names(sharded) == sorted(
        ["clients.csv", "global.pt", "model.json", *(f"personalized-{i:05d}.pt" for i in range(3))]
    )
    whole = torch.load(single / "personalized.pt", weights_only=True)
    for s in shards:  # the module docstring's recipe for one client's model
        part = torch.load(sharded / s["file"], weights_only=True)
        assert set(part) == set(whole)
        for n, t in part.items():
            assert torch.equal(t, whole[n][s["start"] : s["stop"]])
    _, glob_a, pers_a = load_models(single)
    _, glob_b, pers_b = load_models(sharded)
    assert all(torch.equal(glob_a[n], glob_b[n]) for n in glob_a)
    assert pers_a is not None and pers_b is not None
    assert all(torch.equal(pers_a[n], pers_b[n]) for n in pers_a)


def test_sharded_models_evaluate_to_the_unsharded_numbers(folders):
    single, sharded, out = folders
    a, b = evaluate_saved(single), evaluate_saved(sharded)
    for key in KEYS:
        assert a[key] == b[key], key
    assert b["test_accuracy"] == out["test_accuracy"]
    assert b["mean_client_accuracy"] == out["mean_client_accuracy"]
    # the same as scoring every client's model on its whole test split at once
    _, glob, pers = load_models(sharded)
    ds = load_federated("synthetic", seed=RUN["seed"], num_clients=M)
    net = make_model("logreg", ds, RUN["seed"])
    buffers = {n: x.detach() for n, x in net.named_buffers()}
    xs, ys = ds.split("test")
    own = evaluate(net, pers, buffers, xs, ys, personalized=True)
    shared = evaluate(net, glob, buffers, xs, ys, personalized=False)
    assert (b["test_accuracy"], b["mean_client_accuracy"], b["n_test"]) == (
        own["accuracy"],
        own["mean_client_accuracy"],
        own["n"],
    )
    assert (b["global_test_accuracy"], b["global_mean_client_accuracy"]) == (
        shared["accuracy"],
        shared["mean_client_accuracy"],
    )


def test_a_global_model_is_scored_in_blocks_to_the_same_numbers(tmp_path, monkeypatch):
    """FedAvg (no personalized models): the global model scored block by block."""
    kw = {**RUN, "method": "fedavg"}
    out = run_pmtl(**kw, save_models=tmp_path / "m")
    whole = evaluate_saved(tmp_path / "m")
    monkeypatch.setattr(blocks, "END_OF_RUN_BLOCK", 4)
    real = blocks.client_blocks
    monkeypatch.setattr(blocks, "client_blocks", lambda m, block=4: real(m, block))
    small = evaluate_saved(tmp_path / "m")
    assert json.loads((tmp_path / "m" / "model.json").read_text())["files"] == {
        "global": "global.pt",
        "clients": "clients.csv",
    }
    for key in KEYS:
        assert small[key] == whole[key], key
    assert small["test_accuracy"] == out["test_accuracy"]
    assert small["global_mean_client_accuracy"] == out["global_mean_client_accuracy"]


def test_writing_again_removes_the_other_layouts_files(folders, tmp_path, monkeypatch):
    single, sharded, _ = folders
    folder = tmp_path / "again"
    shutil.copytree(sharded, folder)
    (folder / "personalized-old.pt").write_bytes(b"a user's file")  # not a name privmtl writes
    run_pmtl(**RUN, save_models=folder)  # one shard's population: the single file
    assert _names(folder) == [
        "clients.csv", "global.pt", "model.json", "personalized-old.pt", "personalized.pt",
    ]  # fmt: skip
    monkeypatch.setattr(saved, "MODEL_SHARD_CLIENTS", SHARD)
    run_pmtl(**RUN, save_models=folder)
    assert "personalized.pt" not in _names(folder)
    assert evaluate_saved(folder)["test_accuracy"] == evaluate_saved(single)["test_accuracy"]


def test_a_save_cut_short_over_a_folder_leaves_the_old_folder(folders, tmp_path, monkeypatch):
    """Overwriting: the new files are written in a staging folder and moved in with model.json
    last, so a crash while they are written leaves the old folder as it was (it still loads),
    never the old index over a mix of files, and no staging folder behind."""
    single, sharded, _ = folders
    folder = tmp_path / "cut"
    shutil.copytree(sharded, folder)
    real = saved._save_personalized

    def crash(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt  # after the new (single) file, before the new model.json

    monkeypatch.setattr(saved, "_save_personalized", crash)
    with pytest.raises(KeyboardInterrupt):
        run_pmtl(**RUN, save_models=folder)
    assert sorted(p.name for p in folder.iterdir() if p.name != LOCK_NAME) == _names(sharded)
    _, _, pers = load_models(folder)
    _, _, whole = load_models(single)
    assert pers is not None and whole is not None
    assert all(torch.equal(pers[n], whole[n]) for n in pers)


def test_a_failed_signature_leaves_no_file(tmp_path, monkeypatch):
    """The signing key fails after the model files are written: none of them is left."""
    from privmtl.exceptions import InvalidParameterError

    def no_key(doc):
        raise InvalidParameterError("the key is gone")

    monkeypatch.setattr(saved, "sign", no_key)
    with pytest.raises(InvalidParameterError):
        run_pmtl(**RUN, save_models=tmp_path / "m")
    folder = tmp_path / "m"
    assert not folder.exists() or [p.name for p in folder.iterdir() if p.name != LOCK_NAME] == []


def test_model_json_lists_the_sha256_of_every_file(folders):  # the models and clients.csv
    import hashlib

    for folder in folders[:2]:
        meta = json.loads((folder / "model.json").read_text())
        names = {p.name for p in folder.iterdir() if p.suffix in (".pt", ".csv")}
        assert set(meta["files_sha256"]) == names
        for name in names:
            assert (
                meta["files_sha256"][name]
                == hashlib.sha256((folder / name).read_bytes()).hexdigest()
            )


@pytest.fixture(scope="module")
def other_run(tmp_path_factory):
    """Another run's folders (ε = 50 instead of 2): its model files have the same shapes."""
    root = tmp_path_factory.mktemp("other")
    run_pmtl(**{**RUN, "epsilon": 50.0}, save_models=root / "single")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(saved, "MODEL_SHARD_CLIENTS", SHARD)
        run_pmtl(**{**RUN, "epsilon": 50.0}, save_models=root / "sharded")
    return root / "single", root / "sharded"


@pytest.mark.parametrize(
    "layout, name, key",
    [
        (0, "global.pt", "files.global"),
        (0, "personalized.pt", "files.personalized"),
        (1, "personalized-00001.pt", "files.personalized_shards[1].file"),
    ],
)
def test_a_model_file_copied_from_another_run_is_refused(
    folders, other_run, tmp_path, capsys, layout, name, key
):
    """The signed model.json of the ε = 2 run with a file of the ε = 50 run: refused, naming
    the file (library and CLI), though the folder is still signed and the shapes match."""
    from privmtl.trust import is_signed

    folder = tmp_path / "m"
    shutil.copytree(folders[layout], folder)
    shutil.copy(other_run[layout] / name, folder / name)
    assert is_signed(json.loads((folder / "model.json").read_text()))
    for call in (load_models, evaluate_saved):
        with pytest.raises(DataFormatError, match="SHA-256") as err:
            call(folder)
        assert name in str(err.value) and key in str(err.value)
    assert main(["evaluate", str(folder), "--json"]) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and cap.out == ""


def _shards(change):
    def tamper(folder):
        path = folder / "model.json"
        meta = json.loads(path.read_text())
        change(meta["files"]["personalized_shards"], meta)
        path.write_text(json.dumps(meta))

    return tamper


def _missing(folder):
    (folder / "personalized-00002.pt").unlink()


def _rehash(folder, name):
    """Record the file's new SHA-256 (model.json is then no longer signed): the shapes are
    checked next."""
    import hashlib

    path = folder / "model.json"
    meta = json.loads(path.read_text())
    meta["files_sha256"][name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    path.write_text(json.dumps(meta))


def _short_rows(folder):
    part = torch.load(folder / "personalized-00001.pt", weights_only=True)
    torch.save({n: t[:69].clone() for n, t in part.items()}, folder / "personalized-00001.pt")
    _rehash(folder, "personalized-00001.pt")


def _other_shape(folder):
    part = torch.load(folder / "personalized-00002.pt", weights_only=True)
    name = sorted(part)[0]
    part[name] = torch.zeros(10, 2)
    torch.save(part, folder / "personalized-00002.pt")
    _rehash(folder, "personalized-00002.pt")


def _set(i, **kv):
    return _shards(lambda shards, meta: shards[i].update(kv))


BAD = {
    "missing-file": (_missing, "files.personalized_shards[2].file"),
    "overlapping": (_set(1, start=5), "files.personalized_shards[1].start"),
    "gap": (_set(1, start=71), "files.personalized_shards[1].start"),
    "first-not-zero": (_set(0, start=1), "files.personalized_shards[0].start"),
    "stop-past-clients": (_set(2, stop=151), "files.personalized_shards[2].stop"),
    "empty-range": (_set(2, stop=140), "files.personalized_shards[2].stop"),
    "start-text": (_set(1, start="70"), "files.personalized_shards[1].start"),
    "uncovered": (_shards(lambda shards, meta: shards.pop()), "files.personalized_shards"),
    "extra": (
        _shards(lambda shards, meta: shards.append({**shards[-1], "start": M, "stop": M + 2})),
        "files.personalized_shards[3]",
    ),
    "not-a-list": (
        _shards(lambda shards, meta: meta["files"].update(personalized_shards={})),
        "files.personalized_shards",
    ),
    "entry-keys": (_set(0, rows=70), "files.personalized_shards[0]"),
    "both-layouts": (
        _shards(lambda shards, meta: meta["files"].update(personalized="personalized-00000.pt")),
        "files.personalized_shards",
    ),
    "outside-folder": (_set(0, file="../x.pt"), "files.personalized_shards[0].file"),
    "mis-shaped-rows": (_short_rows, "files.personalized_shards[1].file"),
    "mis-shaped-parameter": (_other_shape, "files.personalized_shards[2].file"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_malformed_shard_is_refused_in_one_line(folders, tmp_path, capsys, case):
    _, sharded, _ = folders
    folder = tmp_path / "m"
    shutil.copytree(sharded, folder)
    tamper, key = BAD[case]
    tamper(folder)
    for call in (load_models, evaluate_saved):
        with pytest.raises(DataFormatError) as err:
            call(folder)
        message = str(err.value)
        assert key in message and "\n" not in message, message
    assert main(["evaluate", str(folder), "--json"]) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and "Traceback" not in cap.err
    assert cap.out == ""


@pytest.mark.parametrize("stream", [None, "per-client PCG64 (SeedSequence spawn key k), version 2"])
def test_a_folder_of_another_synthetic_stream_is_refused(folders, tmp_path, capsys, stream):
    """model.json records the synthetic data's random stream; a folder saved by a version whose
    stream drew other examples for the seed (none recorded, or another) is not scored on this
    version's examples: refused in one line naming the stream (library and CLI)."""
    from privmtl.data.federated import SYNTHETIC_STREAM
    from privmtl.trust import sign

    meta = json.loads((folders[0] / "model.json").read_text())
    assert meta["data"]["stream"] == SYNTHETIC_STREAM
    folder = tmp_path / "m"
    shutil.copytree(folders[0], folder)
    if stream is None:
        del meta["data"]["stream"]
    else:
        meta["data"]["stream"] = stream
    (folder / "model.json").write_text(json.dumps(sign(meta)))
    with pytest.raises(DataFormatError, match=r"another random stream.*data\.stream"):
        evaluate_saved(folder)
    assert main(["evaluate", str(folder), "--json"]) == 2
    cap = capsys.readouterr()
    assert len(cap.err.strip().splitlines()) == 1 and "data.stream" in cap.err and cap.out == ""
