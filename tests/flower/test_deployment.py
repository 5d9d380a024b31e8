"""A real SuperLink and SuperNodes on loopback (needs the extra: pip install 'privmtl[flower]')."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from privmtl.locking import LOCK_NAME

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'privmtl[flower]')")

from privmtl.data.federated import make_synthetic_federated
from privmtl.experiments.pmtl import make_model, run_pmtl
from privmtl.federated.protocol import Trainer
from privmtl.flower._core import run_options
from privmtl.flower.launcher import run_local
from privmtl.flower.node_state import read_personal
from privmtl.privacy.ledger import reaccount, read_ledger

pytestmark = pytest.mark.slow

CONFIG = {
    "data": "synthetic",
    "model": "logreg",
    "rounds": 3,
    "clients-per-round": 6,
    "noise-std": 0.05,
    "seed": 3,
    "noise-source": "seeded",
    "local-steps": 3,
    # the message that carries a returning client's personalized model (the continuation check
    # below needs one; Ditto's message, the default, is the billboard copy's change)
    "server-update": "delta",
    # the comparison below is with the raw Trainer: no end-of-run fine-tuning (finetune="auto"
    # on Flower against run_pmtl is tests/flower/test_core.py's)
    "finetune": "none",
}


def _personal(state: Path) -> dict:
    out = {}
    for f in sorted(state.glob("node-*/personal")):
        out.update(read_personal(f))
    return out


def test_three_supernodes_match_in_process_engine_and_continue(tmp_path, alive_with_home):
    work = tmp_path / "w"
    res = run_local(num_supernodes=3, run_config=CONFIG, work_dir=work, timeout=600)
    assert not alive_with_home(work / "flwr-home")
    # the JSON of privmtl pmtl plus the engine
    ref_keys = run_pmtl(  # the Flower run does no fine-tuning
        rounds=1, clients_per_round=2, noise_std=0.05, show_progress=False, finetune="none"
    ).keys()
    # Flower reports the same keys, the phases of the run and its wall time included
    assert set(ref_keys) - {"data_seconds"} <= set(res)
    assert list(res["phases"]) == ["data", "setup", "rounds", "end_of_run", "scoring", "saving",
                                   "other"]  # fmt: skip
    assert sum(res["phases"].values()) == pytest.approx(res["seconds"], rel=1e-9)
    assert res["engine"] == "flower-deployment" and res["work_dir"] == str(work.absolute())

    # seeded: every billboard equals the in-process engine's, and so do ε and the accuracy
    ds = make_synthetic_federated(random_state=3)
    from privmtl.flower._core import make_config

    config, _ = make_config(run_options(CONFIG), ds.n_clients)
    trainer = Trainer(ds, make_model("logreg", ds, 3), config, noise_source="seeded")
    ref = [{n: p.clone() for n, p in rec.released.items()} for rec in trainer]
    boards = torch.load(work / "server" / "billboards.pt", weights_only=True)
    assert len(boards) == 3
    for a, b in zip(boards, ref, strict=True):
        for n in a:
            assert torch.allclose(a[n], b[n], atol=1e-5, rtol=0)
    assert res["epsilon"] == pytest.approx(trainer.epsilon, rel=1e-9)
    assert res["epsilon_per_round"] == pytest.approx([h["epsilon"] for h in trainer.history])
    inproc = trainer.result()
    assert res["test_accuracy"] == pytest.approx(inproc.test_accuracy, abs=1e-9)
    assert res["mean_client_accuracy"] == pytest.approx(inproc.mean_client_accuracy, abs=1e-9)
    # the work directory keeps the write-ahead ledger, the checkpoint and every process's log
    assert reaccount(work / "server")["releases"] == 3
    assert (work / "server" / "manifest.json").is_file()
    assert json.loads((work / "server" / "run.json").read_text())["finished"] is True
    assert {p.name for p in next((work / "logs").iterdir()).iterdir()} >= {
        "superlink.log",
        "supernode-0.log",
        "flwr-run.log",
    }

    # the personalized models live on the nodes and equal the engine's
    personal = _personal(work / "nodes")
    trained = {k for h in trainer.history for k in h["sampled"]}
    assert set(personal) == {ds.client_ids[k] for k in trained}
    for k in trained:
        for n, p in personal[ds.client_ids[k]].items():
            assert torch.allclose(p, inproc.personalized_params[n][k], atol=1e-5, rtol=0)

    # a second run in the same work directory continues the same personalized models:
    # its first release equals an in-process engine started from those models
    res2 = run_local(
        num_supernodes=3, run_config={**CONFIG, "rounds": 1}, work_dir=work, timeout=600
    )
    assert res2["rounds_run"] == 1 and res2["run_index"] == 1
    config1, _ = make_config(run_options({**CONFIG, "rounds": 1}), ds.n_clients)
    cont = Trainer(ds, make_model("logreg", ds, 3), config1, noise_source="seeded")
    for k in range(ds.n_clients):  # the clients' own models after run 1
        cid = ds.client_ids[k]
        if cid in personal:
            models = {n: p.unsqueeze(0) for n, p in personal[cid].items()}
            cont.clients.scatter("personal", torch.tensor([k]), models)
    (rec,) = list(cont)
    (b2,) = torch.load(work / "server" / "billboards.pt", weights_only=True)
    for n in b2:
        assert torch.allclose(b2[n], rec.released[n], atol=1e-5, rtol=0)
    fresh = Trainer(ds, make_model("logreg", ds, 3), config1, noise_source="seeded")
    (rec0,) = list(fresh)
    assert not all(torch.allclose(b2[n], rec0.released[n], atol=1e-5) for n in b2)
    # the ledger continues: ε composes the 3 + 1 releases the clients took part in
    acc = reaccount(work / "server")
    assert acc["releases"] == res2["ledger_releases"] == 4
    assert res2["epsilon"] == pytest.approx(acc["epsilon"], rel=1e-9)
    assert res2["epsilon"] > res["epsilon"]


MODELS = """
from torch import nn


def make_mlp(n_features, n_classes):
    return nn.Sequential(nn.Linear(n_features, 8), nn.ReLU(), nn.Linear(8, n_classes))
"""

# a user's factory, everything else at the product defaults
FACTORY_FLAGS = ["--data", "synthetic", "--rounds", "3", "--clients-per-round", "6",
                 "--epsilon", "2", "--reproducible-noise", "--json"]  # fmt: skip


@pytest.fixture
def models_dir(tmp_path, monkeypatch):
    import sys

    (tmp_path / "mymodels.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    sys.modules.pop("mymodels", None)


@pytest.mark.parametrize("spec", ["mymodels:make_mlp", "./mymodels.py:make_mlp"])
def test_a_user_factory_on_three_supernodes_equals_privmtl_pmtl(models_dir, spec, capsys):
    """privmtl flower local --model <factory> equals privmtl pmtl with the same flags: the
    SuperNodes (other processes, other working directories) load the same file themselves."""
    from privmtl.cli import main

    assert main(["pmtl", "--model", spec, *FACTORY_FLAGS]) == 0
    ref = json.loads(capsys.readouterr().out)
    argv = ["flower", "local", "--num-supernodes", "3", "--model", spec, *FACTORY_FLAGS,
            "--work-dir", str(models_dir / "w")]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    res = json.loads(capsys.readouterr().out)
    assert res["engine"] == "flower-deployment" and res["model"] == spec
    assert res["config"] == ref["config"]
    for key in ("epsilon", "test_accuracy", "mean_client_accuracy", "pre_finetune_test_accuracy",
                "global_test_accuracy"):  # fmt: skip
        assert res[key] == pytest.approx(ref[key], rel=1e-9, abs=1e-12), key


def test_saved_models_of_a_flower_run_reload_with_privmtl_evaluate(models_dir, capsys):
    """--save-models on flower local: the folder assembled from the ServerApp's global model and
    the SuperNodes' own files is signed, and privmtl evaluate (from another directory, no
    PYTHONPATH) rebuilds the user's factory and reports the accuracy of the run."""
    import os

    from privmtl.cli import main
    from privmtl.trust import is_signed

    out = models_dir / "models"
    argv = ["flower", "local", "--num-supernodes", "2", "--model", "mymodels:make_mlp", "--data",
            "synthetic", "--num-clients", "10", "--rounds", "2", "--clients-per-round", "4",
            "--epsilon", "2", "--finetune", "none", "--json", "--work-dir", str(models_dir / "w"),
            "--save-models", str(out)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    res = json.loads(capsys.readouterr().out)
    assert res["models_dir"] == str(out)
    meta = json.loads((out / "model.json").read_text())
    assert is_signed(meta) and meta["primary"] == "personalized"
    # and the folder's lock file (privmtl.locking), kept so that a later writer locks the same file
    assert sorted(os.listdir(out)) == sorted(
        ["global.pt", "model.json", "personalized.pt", LOCK_NAME]
    )
    elsewhere = models_dir / "elsewhere"
    elsewhere.mkdir()
    os.chdir(elsewhere)  # models_dir's monkeypatch.chdir restores the directory
    assert main(["evaluate", str(out), "--json"]) == 0, capsys.readouterr().err
    ev = json.loads(capsys.readouterr().out)
    assert ev["test_accuracy"] == pytest.approx(res["test_accuracy"], rel=1e-9, abs=1e-12)
    assert ev["guarantee"]["epsilon"] == pytest.approx(res["epsilon"], rel=1e-12)


def test_a_supernode_with_another_factory_file_is_refused_in_one_line(models_dir, alive_with_home):
    from privmtl.flower.launcher import FlowerRunError

    other = models_dir / "node1"
    other.mkdir()
    (other / "mymodels.py").write_text(MODELS.replace("8", "16"))
    import hashlib

    digests = [hashlib.sha256(p.read_bytes()).hexdigest() for p in
               (models_dir / "mymodels.py", other / "mymodels.py")]  # fmt: skip
    work = models_dir / "w"
    with pytest.raises(FlowerRunError) as err:
        run_local(
            num_supernodes=3,
            run_config={**CONFIG, "model": "mymodels:make_mlp"},
            work_dir=work,
            timeout=300,
            node_configs=[{}, {"model-dir": str(other)}, {}],
        )
    msg = str(err.value)
    assert "\n" not in msg and all(d in msg for d in digests) and "SuperNode partition 1" in msg
    assert not alive_with_home(work / "flwr-home")
    assert not (work / "server" / "ledger.jsonl").exists()  # nothing was released


EXAMPLE_DIR = Path(__file__).resolve().parents[2]
SMALL = ["--data", "synthetic", "--model", "logreg", "--num-clients", "12", "--rounds", "3",
         "--reproducible-noise", "--json"]  # fmt: skip


@pytest.mark.parametrize(
    "method",
    [
        ["--method", "examples/own_method.py:OwnMethod", "--epsilon", "1", "--finetune", "none"],
        ["--method", "fedrep", "--shared-params", "linear.weight", "--epsilon", "2",
         "--clients-per-round", "5"],
    ],
)  # fmt: skip
def test_own_method_and_fedrep_on_supernodes_equal_privmtl_pmtl(
    tmp_path, monkeypatch, capsys, method
):
    """privmtl flower local --method <file>:<class> (each SuperNode loads and checks the file
    itself) and --method fedrep report privmtl pmtl's ε (≤ the target, from the ledger) and
    accuracy."""
    from privmtl.cli import main

    monkeypatch.chdir(EXAMPLE_DIR)
    assert main(["pmtl", *method, *SMALL]) == 0
    ref = json.loads(capsys.readouterr().out)
    argv = ["flower", "local", "--num-supernodes", "2", *method, *SMALL,
            "--work-dir", str(tmp_path / "w")]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    res = json.loads(capsys.readouterr().out)
    assert res["method"] == ref["method"] and res["config"] == ref["config"]
    assert 0.0 < res["epsilon"] <= float(method[method.index("--epsilon") + 1]) + 1e-9
    assert res["ledger_releases"] == 3
    assert res.get("method_source", {}).get("sha256") == ref.get("method_source", {}).get("sha256")
    for key in ("epsilon", "test_accuracy", "mean_client_accuracy"):
        assert res[key] == pytest.approx(ref[key], rel=1e-9, abs=1e-12), key


def test_the_clients_vote_on_three_supernodes_equals_privmtl_pmtl(tmp_path, capsys):
    """At the defaults where the vote is held (50 clients, epsilon 8): the ServerApp releases the
    nodes' summed shares through the ledger and the nodes finish with its winner, as privmtl
    pmtl does in process (same epsilon, same accuracy, same winner)."""
    from privmtl.cli import main

    flags = ["--data", "synthetic", "--rounds", "3", "--clients-per-round", "6", "--epsilon", "8",
             "--reproducible-noise", "--seed", "3", "--json"]  # fmt: skip
    assert main(["pmtl", *flags, "--per-client", str(tmp_path / "ref.csv")]) == 0
    ref = json.loads(capsys.readouterr().out)
    argv = ["flower", "local", "--num-supernodes", "3", *flags, "--work-dir", str(tmp_path / "w"),
            "--per-client", str(tmp_path / "rows.csv")]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    res = json.loads(capsys.readouterr().out)
    assert ref["finetune_auto"]["vote"]["held"]
    assert res["finetune_auto"]["vote"]["winner"] == ref["finetune_auto"]["vote"]["winner"]
    for key in ("epsilon", "test_accuracy", "mean_client_accuracy", "global_test_accuracy"):
        assert res[key] == pytest.approx(ref[key], rel=1e-9, abs=1e-12), key
    _, entries = read_ledger(tmp_path / "w" / "server" / "ledger.jsonl")
    assert entries[-1]["release_id"] == "finetune-vote:0"
    assert res["per_client_file"] == str(tmp_path / "rows.csv")
    assert (tmp_path / "rows.csv").read_text() == (tmp_path / "ref.csv").read_text()


def test_a_users_table_on_three_supernodes_equals_privmtl_pmtl(tmp_path, capsys):
    """privmtl flower local --data table: every SuperNode reads the user's file and keeps its own
    clients' rows; the seeded run equals privmtl pmtl on the same table."""
    import numpy as np
    import pandas as pd

    from privmtl.cli import main

    rng = np.random.default_rng(0)
    centers = rng.normal(size=(3, 4)) * 2
    frames = []
    for c in range(12):
        y = rng.integers(0, 3, size=30)
        f = pd.DataFrame(centers[y] + rng.normal(size=(30, 4)), columns=list("abcd"))
        f.insert(0, "user", f"u{c:02d}")
        f["label"] = y
        frames.append(f)
    pd.concat(frames, ignore_index=True).to_csv(tmp_path / "t.csv", index=False)
    flags = ["--data", "table", "--data-path", str(tmp_path / "t.csv"), "--client-column", "user",
             "--label-column", "label", "--rounds", "2", "--clients-per-round", "4",
             "--epsilon", "4", "--reproducible-noise", "--json"]  # fmt: skip
    assert main(["pmtl", *flags]) == 0
    ref = json.loads(capsys.readouterr().out)
    argv = ["flower", "local", "--num-supernodes", "3", *flags, "--work-dir", str(tmp_path / "w")]
    assert main(argv) == 0, capsys.readouterr().err
    res = json.loads(capsys.readouterr().out)
    assert res["num_clients"] == 12 and res["scaling"] == ref["scaling"]
    for key in ("epsilon", "test_accuracy", "mean_client_accuracy", "local_test_accuracy"):
        assert res[key] == pytest.approx(ref[key], rel=1e-9, abs=1e-12), key
