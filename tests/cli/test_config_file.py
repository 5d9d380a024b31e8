"""``--config FILE``: a run starts from a saved spec (a result, a model.json or a spec object);
options given beside it win; bad files exit 2 with one line naming the setting and value."""

from __future__ import annotations

import dataclasses
import json

import pytest

from privmtl.cli import main
from privmtl.federated.spec import SPEC, RunSpec

FIELDS = [f.name for f in dataclasses.fields(RunSpec)]

# settings away from the spec's defaults, so the re-run can only match by reading the file
RUN_A = ["pmtl", "--data", "synthetic", "--model", "logreg", "--num-clients", "12", "--rounds", "2",
         "--epsilon", "3", "--clients-per-round", "6", "--lr", "0.05", "--clip", "0.8",
         "--server-update", "offset", "--batch-size", "5", "--finetune", "none",
         "--server-optimizer", "momentum", "--server-lr", "0.5", "--seed", "4", "--reproducible-noise", "--threads", "1",
         "--json"]  # fmt: skip
SCORES = ("test_accuracy", "mean_client_accuracy", "val_accuracy", "global_test_accuracy",
          "epsilon", "noise_std")  # fmt: skip


def _run(capsys, argv):
    rc = main(argv)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return json.loads(captured.out)


@pytest.fixture(scope="module")
def run_a(tmp_path_factory):
    """Run A's JSON result, saved as a file (and its model.json)."""
    import contextlib
    import io

    folder = tmp_path_factory.mktemp("run-a")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main([*RUN_A, "--save-models", str(folder / "models")])
    assert rc == 0
    path = folder / "a.json"
    path.write_text(out.getvalue())
    return path, json.loads(out.getvalue())


def test_a_run_started_from_a_result_file_alone_is_the_same_run(run_a, capsys):
    path, a = run_a
    b = _run(capsys, ["pmtl", "--config", str(path), "--threads", "1", "--json"])
    assert b["config"] == a["config"]
    assert {k: b[k] for k in SCORES} == {k: a[k] for k in SCORES}
    # the file carried every non-default flag of A (not only the defaults)
    assert a["config"]["server_update"] == "offset" != SPEC.server_update
    assert a["config"]["server_lr"] == 0.5 != SPEC.server_lr
    assert a["config"]["server_optimizer"] == "momentum" != SPEC.server_optimizer
    assert a["config"]["noise_source"] == "seeded" != SPEC.noise_source
    assert (b["data"], b["model"], b["num_clients"]) == ("synthetic", "logreg", 12)


def test_a_model_json_and_a_spec_object_start_the_same_run(run_a, capsys, tmp_path):
    path, a = run_a
    model_json = path.parent / "models" / "model.json"
    b = _run(capsys, ["pmtl", "--config", str(model_json), "--threads", "1", "--json"])
    assert b["config"] == a["config"] and b["test_accuracy"] == a["test_accuracy"]
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(a["config"]))
    c = _run(capsys, ["pmtl", "--config", str(spec_file), "--data", "synthetic", "--model",
                      "logreg", "--num-clients", "12", "--threads", "1", "--json"])  # fmt: skip
    assert c["config"] == a["config"] and c["test_accuracy"] == a["test_accuracy"]


def test_an_option_given_beside_the_file_wins(run_a, capsys):
    path, a = run_a
    # --noise-std replaces the file's epsilon (a run takes one of them), --delta its delta
    argv = ["pmtl", "--config", str(path), "--rounds", "1", "--noise-std", "0.2",
            "--secure-noise", "--delta", "1e-6", "--threads", "1", "--json"]  # fmt: skip
    b = _run(capsys, argv)
    changed = {"rounds": 1, "noise_std": 0.2, "epsilon": None, "noise_source": "secure",
               "delta": 1e-6}  # fmt: skip
    assert {k: b["config"][k] for k in changed} == changed
    assert {k: v for k, v in b["config"].items() if k not in changed} == {
        k: v for k, v in a["config"].items() if k not in changed
    }
    c = _run(capsys, ["pmtl", "--config", str(path), "--paper-delta", "--rounds", "1", "--json"])
    assert c["config"]["delta"] == 1 / 12  # --paper-delta replaces the file's delta


def test_a_partial_spec_keeps_the_other_defaults(capsys, tmp_path):
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({"clip": 0.3, "rounds": 1, "shared_params": ["linear"]}))
    out = _run(capsys, ["pmtl", "--config", str(spec_file), "--data", "synthetic", "--model",
                        "logreg", "--num-clients", "6", "--finetune", "none", "--json"])  # fmt: skip
    assert out["config"]["clip"] == 0.3 and out["config"]["rounds"] == 1
    assert out["config"]["shared_params"] == ["linear"]
    assert out["config"]["server_update"] == SPEC.server_update and out["config"]["lr"] == SPEC.lr


@pytest.mark.parametrize(
    "content, words",
    [
        ({"clip": 0.5, "momentum": 0.9}, ["'momentum'"]),
        ({"clip": -0.5}, ["'clip'", "-0.5"]),
        ({"sampling": "uniform"}, ["'sampling'", "'uniform'"]),
        ({"epsilon": 1.0, "noise_std": 0.1}, ["'epsilon'", "'noise_std'"]),
        ({"config": {"seed": -2}}, ["'seed'", "-2"]),
        ({"config": {"rounds": "many"}}, ["'rounds'", "'many'"]),
        ([1, 2], ["JSON object"]),
        ("not json", ["not valid JSON"]),
        ("[" * 200_000 + "]" * 200_000, ["nests"]),
        (b'{"clip": "\xff"}', ["not UTF-8"]),
        ({"format": "privmtl-models", "run": [], "data": {}}, ["run must be an object"]),
    ],
)
def test_a_bad_file_exits_2_naming_the_setting_and_value(capsys, tmp_path, content, words):
    path = tmp_path / "bad.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    for command in (["pmtl"], ["flower", "local"]):
        rc = main([*command, "--config", str(path), "--data", "synthetic", "--model", "logreg"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1, (command, err)
        assert "--config" in err[0] and all(w in err[0] for w in words), (command, err)


def _flower_run_config(monkeypatch, capsys, tmp_path, *argv):
    """The run configuration ``privmtl flower local`` hands to the launcher (none started)."""
    import privmtl.flower.launcher as launcher

    seen: dict = {}

    def fake_run_local(*, run_config, **kw):
        seen.update(run_config)
        return {"config": {}}

    monkeypatch.setattr(launcher, "run_local", fake_run_local)
    rc = main(["flower", "local", "--work-dir", str(tmp_path / "work"), *argv, "--json"])
    err = capsys.readouterr().err
    return rc, seen, err


def test_flower_local_passes_the_file_and_the_flags_under_the_spec_names(
    monkeypatch, capsys, tmp_path
):
    pytest.importorskip("flwr")
    from privmtl.flower._core import RUN_DEFAULTS

    spec = {"rounds": 2, "clip": 0.8, "lr": 0.05, "clients_per_round": 6, "epsilon": 3.0,
            "server_update": "offset", "seed": 4, "noise_source": "seeded", "batch_size": 5,
            "relation": "replace-one"}  # fmt: skip
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    rc, cfg, err = _flower_run_config(
        monkeypatch, capsys, tmp_path, "--config", str(spec_file), "--data", "synthetic",
        "--model", "logreg", "--lr", "0.02",
    )  # fmt: skip
    assert rc == 0, err
    expected = {k.replace("_", "-"): v for k, v in {**spec, "lr": 0.02}.items()}
    assert {k: cfg[k] for k in expected} == expected
    assert set(expected) <= set(RUN_DEFAULTS)  # keys the Flower apps read
    # settings left at their defaults are not passed: the Flower run's default is the spec's
    assert "finetune" not in cfg and "personal-init" not in cfg and "method" not in cfg
    assert "paper-delta" not in cfg and "delta" not in cfg
    rc, cfg, err = _flower_run_config(
        monkeypatch, capsys, tmp_path, "--config", str(spec_file), "--data", "synthetic",
        "--model", "logreg", "--paper-delta", "--noise-std", "0.1", "--secure-noise",
    )  # fmt: skip
    assert rc == 0, err
    assert cfg["paper-delta"] is True and cfg["noise-std"] == 0.1 and "epsilon" not in cfg
    assert cfg["noise-source"] == "secure"
    # the Flower-only checks see the Flower run's defaults of what was not given (clip, q)
    rc, cfg, err = _flower_run_config(
        monkeypatch, capsys, tmp_path, "--data", "synthetic", "--model", "logreg", "--secagg"
    )
    assert rc == 0 and cfg["secagg"] is True and "clip" not in cfg, err


def test_flower_local_takes_every_setting_or_refuses_it_in_one_line(monkeypatch, capsys, tmp_path):
    """Every setting of the spec given to ``privmtl flower local`` reaches the Flower apps under
    its name, or (when they do not read it) is refused naming it — never silently dropped."""
    pytest.importorskip("flwr")
    from privmtl.flower import _core

    given = {"method": "fedavg", "personal_init": "billboard", "local_epochs": 2,
             "delta": 1e-6, "finetune": "vanilla", "server_optimizer": "momentum",
             "server_lr": 0.5, "server_momentum": 0.5, "shared_params": ["linear"],
             "subspace_dim": 4, "adaptive_clip_quantile": 0.5, "adaptive_clip_lr": 0.1,
             "adaptive_clip_noise": 0.3, "sampling": "fixed", "accountant": "pld",
             "lam": 0.2, "noise_std": 0.1}  # fmt: skip
    for name, value in given.items():
        spec_file = tmp_path / f"{name}.json"
        spec_file.write_text(json.dumps({name: value}))
        rc, cfg, err = _flower_run_config(
            monkeypatch, capsys, tmp_path, "--config", str(spec_file), "--data", "synthetic",
            "--model", "logreg",
        )  # fmt: skip
        key = name.replace("_", "-")
        if key in _core.RUN_DEFAULTS:
            assert rc == 0 and cfg[key] == (",".join(value) if name == "shared_params" else value)
        else:
            lines = err.strip().splitlines()
            assert rc == 2 and len(lines) == 1 and f"{name}=" in lines[0], (name, lines)


def _one_line(capsys, argv):
    rc = main(argv)
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "Traceback" not in cap.err, cap.err
    return err[0]


def test_an_unsigned_model_json_does_not_choose_the_data_file(run_a, capsys, tmp_path, monkeypatch):
    """A model.json's recorded data path is followed only when this user signed the file (or it
    lies inside the file's folder); otherwise the run needs --data-path, as privmtl evaluate."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    frames = []
    for c in range(4):
        y = rng.integers(0, 2, size=12)
        f = pd.DataFrame(rng.normal(size=(12, 2)) + y[:, None], columns=["a", "b"])
        f.insert(0, "user", f"u{c}")
        f["label"] = y
        frames.append(f)
    table = tmp_path / "theirs.csv"
    pd.concat(frames, ignore_index=True).to_csv(table, index=False)
    path, _ = run_a
    doc = json.loads((path.parent / "models" / "model.json").read_text())
    doc.pop("signature")
    doc["data"].update(data="table", data_path=str(table), num_clients=None)
    shared = tmp_path / "shared" / "model.json"
    shared.parent.mkdir()
    shared.write_text(json.dumps(doc))
    cols = ["--client-column", "user", "--label-column", "label", "--clients-per-round", "4",
            "--threads", "1", "--json"]  # fmt: skip
    line = _one_line(capsys, ["pmtl", "--config", str(shared), *cols])
    assert "not signed" in line and "--data-path" in line and str(table) in line
    out = _run(capsys, ["pmtl", "--config", str(shared), "--data-path", str(table), *cols])
    assert out["num_clients"] == 4
    # signed by this user: followed as recorded
    from privmtl.trust import sign

    shared.write_text(json.dumps(sign(doc)))
    out = _run(capsys, ["pmtl", "--config", str(shared), *cols])
    assert out["num_clients"] == 4 and out["data"] == "table"
    # unsigned, inside the file's folder: followed
    doc["data"]["data_path"] = "theirs.csv"
    table.rename(shared.parent / "theirs.csv")
    shared.write_text(json.dumps(doc))
    out = _run(capsys, ["pmtl", "--config", str(shared), *cols])
    assert out["num_clients"] == 4


def test_a_bad_signing_key_stops_a_run_that_will_sign_before_its_first_round(
    capsys, tmp_path, monkeypatch
):
    import privmtl.experiments.pmtl as pmtl_run

    def no_training(*a, **k):
        raise AssertionError("the run started")

    monkeypatch.setattr(pmtl_run, "PhaseTimer", no_training)
    cfg = tmp_path / "cfg"
    monkeypatch.setenv("PRIVMTL_CONFIG_DIR", str(cfg))
    argv = ["pmtl", "--data", "synthetic", "--model", "logreg", "--rounds", "1",
            "--save-models", str(tmp_path / "models")]  # fmt: skip
    cfg.mkdir()
    (cfg / "signing.key").write_text("not a key\n")
    (cfg / "signing.key").chmod(0o600)
    assert "does not hold 32 hex bytes" in _one_line(capsys, argv)
    (cfg / "signing.key").write_text("ab" * 32 + "\n")
    (cfg / "signing.key").chmod(0o644)
    line = _one_line(capsys, argv)
    assert "mode 0644" in line and "chmod 600" in line
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("PRIVMTL_CONFIG_DIR", str(blocker / "privmtl"))
    assert "cannot create the signing key" in _one_line(capsys, argv)
    assert not (tmp_path / "models").exists() or not any(
        p for p in (tmp_path / "models").iterdir() if not p.name.startswith(".")
    )
