"""Methods on Flower's server and node halves (no Flower processes): FedRep and a user's method
release the in-process run's billboards and report its ε and accuracy."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from privmtl.data.federated import make_synthetic_federated
from privmtl.exceptions import InvalidParameterError
from privmtl.experiments.pmtl import make_model, run_pmtl
from privmtl.federated.config import TrainConfig
from privmtl.federated.methods import FLOWER_METHODS, ClientStep, Method
from privmtl.federated.protocol import Trainer
from privmtl.flower._core import check_options, run_options
from privmtl.flower.node_clients import NodeClients
from privmtl.flower.server_run import ServerRun


def _drive(run, nodes):
    """The ServerApp's loop, messages passed by value and the config as JSON."""
    owner = {int(k): node for node in nodes for k in node.clients}
    while not run.finished and not run.stop_on_budget():
        t, key = run.curator.round, run.round_key()
        sampled = run.curator.sample_round()
        board = {n: p.clone() for n, p in run.curator.billboard.items()}
        cfg = TrainConfig(**json.loads(json.dumps(asdict(run.config))))
        messages, losses = {}, {}
        for node in nodes:
            ks = [int(k) for k in sampled if owner[int(k)] is node]
            msgs, ls = node.train(ks, board, t, cfg, key=key)
            for j, k in enumerate(ks):
                messages[k] = {n: p[j] for n, p in msgs.items()}
                losses[k] = ls[j]
        run.release(sampled, messages, losses, 0.0)
    run.finish()
    return run


def _flower(ds, flags, n_nodes=3):
    """The Flower run's result and released billboards (the ServerApp's and nodes' halves)."""
    opts = run_options({**flags, "noise-source": "seeded"})
    seed = int(opts["seed"])
    nodes = [
        NodeClients(ds, make_model("logreg", ds, seed), partition_id=i, num_partitions=n_nodes)
        for i in range(n_nodes)
    ]
    run = _drive(ServerRun(opts, nodes[0].init, ds.n_clients), nodes)
    # the end of run as the apps send it: the finish settings through JSON
    finish = json.loads(json.dumps(run.finish_settings()))
    scores = [n.evaluate(run.curator.billboard, finish) for n in nodes]
    return run.result_dict(scores, 0.0), run.billboards, run.config


def _in_process(ds, flags, run_config):
    """run_pmtl's result, and the billboards the in-process engine releases with the Flower run's
    resolved config (whose equality to run_pmtl's the results' ``config`` shows)."""
    ref = run_pmtl(data="synthetic", dataset=ds, model="logreg", noise_source="seeded",
                   show_progress=False, threads=1, **flags)  # fmt: skip
    trainer = Trainer(ds, make_model("logreg", ds, 0), run_config, noise_source="seeded")
    return ref, [{n: p.clone() for n, p in rec.released.items()} for rec in trainer]


_SAME = ("epsilon", "delta", "noise_std", "clients_per_round", "lam", "personal_init",
         "global_test_accuracy", "test_accuracy", "mean_client_accuracy", "val_accuracy",
         "pre_finetune_test_accuracy", "finetune", "rounds_run", "representation", "head",
         "head_epochs")  # fmt: skip


def _assert_same(res, ref, boards, ref_boards):
    assert len(boards) == len(ref_boards) == res["rounds_run"]
    for t, (a, b) in enumerate(zip(boards, ref_boards, strict=True)):
        assert a.keys() == b.keys()
        for n in a:
            assert torch.allclose(a[n], b[n], atol=1e-5, rtol=0), (t, n)
    assert [k for k in _SAME if k in res] == [k for k in _SAME if k in ref]
    for key in (k for k in _SAME if k in ref):
        if isinstance(ref[key], float):
            assert res[key] == pytest.approx(ref[key], rel=1e-9, abs=1e-12), key
        else:
            assert res[key] == ref[key], key
    assert res["config"] == ref["config"]


def test_fedrep_is_a_flower_method():
    assert "fedrep" in FLOWER_METHODS
    check_options({"method": "fedrep", "shared-params": "linear.weight"}, 3)  # accepted


@pytest.mark.parametrize(
    "flags",
    [
        {"rounds": 3, "clients_per_round": 6, "epsilon": 2.0, "finetune": "none"},
        {"rounds": 2, "clients_per_round": 5, "noise_std": 0.01, "head_epochs": 2,
         "finetune": "vanilla"},
    ],
)  # fmt: skip
def test_fedrep_on_flower_equals_the_in_process_run(flags):
    """Same billboards every round (the representation only), same ε, and the same final heads
    (drawn on each node as the in-process engine draws them), so the same test accuracy."""
    ds = make_synthetic_federated(n_clients=20, random_state=0)
    flags = {**flags, "method": "fedrep", "shared_params": ["linear.weight"]}
    res, boards, config = _flower(ds, {k.replace("_", "-"): v for k, v in flags.items()})
    ref, ref_boards = _in_process(ds, flags, config)
    assert list(boards[0]) == ["linear.weight"]  # the head never reaches the server
    assert res["representation"] == ["linear.weight"] and res["head"] == ["linear.bias"]
    _assert_same(res, ref, boards, ref_boards)


def test_fedrep_final_heads_differ_from_the_stored_models():
    """The nodes' end of run trains every head (the models scored are not the stored ones)."""
    ds = make_synthetic_federated(n_clients=12, random_state=0)
    opts = run_options({"method": "fedrep", "shared-params": "linear.weight", "rounds": 2,
                        "clients-per-round": 4, "noise-std": 0.0, "seed": 1})  # fmt: skip
    node = NodeClients(ds, make_model("logreg", ds, 1), partition_id=0, num_partitions=1)
    run = _drive(ServerRun(opts, node.init, ds.n_clients), [node])
    config = TrainConfig(**run.finish_settings()["config"])
    final = node.trained(run.curator.billboard, config=config)
    stored = node.trained(run.curator.billboard)
    assert torch.equal(final["linear.weight"][0], run.curator.billboard["linear.weight"])
    assert not torch.equal(final["linear.bias"], stored["linear.bias"])


class HalfStepFedAvg(Method):
    """Written here, not in privmtl: FedAvg whose message is half the trained change, declared
    for both backends."""

    name: ClassVar[str] = "test-flower-half-step"
    start: ClassVar[str] = "global"
    personalized: ClassVar[bool] = False
    backends: ClassVar[tuple[str, ...]] = ("in-process", "flower")

    def client_update(self, billboard, shared, starts, anchor, train):
        news, losses = train(starts, self.rule(anchor))
        messages = {n: 0.5 * (news[n] - billboard[n]) for n in shared}
        return ClientStep(news, messages, losses)


class KeepsOwnHalfStep(HalfStepFedAvg):
    """The same message, but every client keeps its own trained model (personalized)."""

    name: ClassVar[str] = "test-flower-own-half-step"
    start: ClassVar[str] = "own"
    personalized: ClassVar[bool] = True


@pytest.mark.parametrize("method", [HalfStepFedAvg, KeepsOwnHalfStep])
def test_a_method_written_here_runs_in_both_backends_with_the_same_billboards(method):
    from privmtl.federated.methods import register_method

    ds = make_synthetic_federated(n_clients=20, random_state=0)
    flags = {"rounds": 3, "clients_per_round": 6, "epsilon": 1.0, "finetune": "none"}
    register_method(method)  # in this process Flower's halves find it by its name
    res, boards, config = _flower(
        ds, {"method": method.name, **{k.replace("_", "-"): v for k, v in flags.items()}}
    )
    ref, ref_boards = _in_process(ds, {**flags, "method": method}, config)
    assert res["method"] == ref["method"] == method.name
    assert 0.0 < res["epsilon"] <= 1.0 + 1e-9
    _assert_same(res, ref, boards, ref_boards)


def test_a_method_without_the_flower_backend_is_refused_in_one_line():
    class InProcessOnly(HalfStepFedAvg):
        name: ClassVar[str] = "test-flower-in-process-only"
        backends: ClassVar[tuple[str, ...]] = ("in-process",)

    from privmtl.federated.methods import register_method

    register_method(InProcessOnly)
    with pytest.raises(InvalidParameterError, match=r"'method'.*backends") as err:
        check_options({"method": InProcessOnly.name}, 3)
    assert "\n" not in str(err.value)


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_method.py"


def test_the_example_method_file_runs_on_flower_as_run_pmtl_does(tmp_path, monkeypatch):
    """--method examples/own_method.py:OwnMethod: announced with its file's SHA-256, loaded by
    every node from method-dir (not its working directory), ε within the target, and the same ε
    and accuracy as the in-process run."""
    import hashlib

    from privmtl.flower.factory import announce
    from privmtl.flower.node_clients import load_node

    spec = "examples/own_method.py:OwnMethod"
    monkeypatch.chdir(EXAMPLE.parents[1])
    flags = {"rounds": 2, "clients-per-round": 4, "epsilon": 1.0, "finetune": "none",
             "num-clients": 12}  # fmt: skip
    cfg = announce({"method": spec, **flags})
    sha = hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()
    assert cfg["method-dir"] == str(EXAMPLE.parents[1]) and cfg["method-sha256"] == sha
    ref = run_pmtl(data="synthetic", model="logreg", noise_source="seeded", show_progress=False,
                   threads=1, method=spec, **{k.replace("-", "_"): v for k, v in flags.items()})  # fmt: skip
    opts = run_options({**cfg, "noise-source": "seeded"})
    monkeypatch.chdir(tmp_path)  # the nodes resolve the spec against method-dir
    nodes = [load_node(opts, i, 2, None) for i in range(2)]
    run = _drive(ServerRun(opts, nodes[0].init, nodes[0].m), nodes)
    finish = json.loads(json.dumps(run.finish_settings()))
    res = run.result_dict([n.evaluate(run.curator.billboard, finish) for n in nodes], 0.0)
    assert res["method"] == ref["method"] == "own-mixture"
    assert res["method_source"]["sha256"] == ref["method_source"]["sha256"] == sha
    assert 0.0 < res["epsilon"] <= 1.0 + 1e-9
    assert res["guarantee"]["details"]["releases"] == 2
    assert res["epsilon"] == pytest.approx(ref["epsilon"], rel=1e-12)
    for key in ("test_accuracy", "mean_client_accuracy", "global_test_accuracy"):
        assert res[key] == pytest.approx(ref[key], rel=1e-9, abs=1e-12), key
    assert run.fingerprint_config()["method_sha256"] == sha  # a resume must load the same code


def test_a_node_whose_method_file_differs_is_refused_naming_both_hashes(tmp_path, monkeypatch):
    import hashlib

    from privmtl.flower.factory import announce
    from privmtl.flower.node_clients import load_node

    monkeypatch.chdir(EXAMPLE.parents[1])
    opts = run_options(announce({"method": "examples/own_method.py:OwnMethod", "num-clients": 9}))
    other = tmp_path / "node1" / "examples"
    other.mkdir(parents=True)
    (other / "own_method.py").write_text(EXAMPLE.read_text() + "\n# another version\n")
    theirs = hashlib.sha256((other / "own_method.py").read_bytes()).hexdigest()
    with pytest.raises(InvalidParameterError) as err:
        load_node(opts, 1, 3, None, method_dir=str(other.parent))
    msg = str(err.value)
    assert "\n" not in msg and opts["method-sha256"] in msg and theirs in msg
    assert "SuperNode partition 1" in msg and "'method'" in msg
    with pytest.raises(InvalidParameterError, match="'method-sha256'"):
        load_node({**opts, "method-sha256": ""}, 0, 3, None)


def test_a_method_named_only_by_an_unsigned_config_file_is_refused(tmp_path, monkeypatch, capsys):
    """A method file is code: named by a --config file this user did not sign, privmtl flower
    local exits 2 in one line before loading it (as for a model factory)."""
    pytest.importorskip("flwr", reason="Flower is not installed (pip install 'privmtl[flower]')")
    from privmtl.cli import main

    monkeypatch.setenv("PRIVMTL_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "evil.py").write_text("raise SystemExit('must not run')\n")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"method": "evil.py:Evil", "rounds": 1}))
    argv = ["flower", "local", "--config", str(spec), "--data", "synthetic", "--model", "logreg"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "code for method 'evil.py:Evil'" in err[0], err
    assert "did not sign" in err[0]
