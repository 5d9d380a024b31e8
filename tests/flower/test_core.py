"""The PMTL protocol split into server and nodes (no Flower needed) against the in-process engine."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import numpy as np
import pytest
import torch
from engine_defaults import old_config

from privmtl.checkpoint import CheckpointError
from privmtl.data.federated import make_synthetic_federated
from privmtl.exceptions import InvalidParameterError
from privmtl.experiments.pmtl import make_model
from privmtl.federated.protocol import Trainer
from privmtl.flower._core import partition, run_options
from privmtl.flower.node_clients import NodeClients
from privmtl.flower.server_run import ServerRun
from privmtl.privacy.ledger import reaccount, read_ledger


def _opts(**kw):
    base = {
        "rounds": 3,
        "clients-per-round": 6,
        "noise-std": 0.05,
        "seed": 3,
        "noise-source": "seeded",
        "local-steps": 3,
    }
    base.update(kw)
    return run_options(base)


def _nodes(ds, opts, n_nodes, state_root=None):
    seed = int(opts["seed"])
    return [
        NodeClients(
            ds,
            make_model("logreg", ds, seed),
            partition_id=i,
            num_partitions=n_nodes,
            state_dir=None if state_root is None else state_root / f"node-{i}",
        )
        for i in range(n_nodes)
    ]


def _round(run, nodes):
    """One round as the ServerApp drives it (by-value message passing, the config as JSON)."""
    owner = {int(k): node for node in nodes for k in node.clients}
    t = run.curator.round
    key = run.round_key()
    sampled = run.curator.sample_round()
    messages, losses = {}, {}
    board = {n: p.clone() for n, p in run.curator.billboard.items()}
    cfg = old_config(**json.loads(json.dumps(asdict(run.config))))
    for node in nodes:
        ks = [int(k) for k in sampled if owner[int(k)] is node]
        msgs, ls = node.train(ks, board, t, cfg, key=key)
        for j, k in enumerate(ks):
            messages[k] = {n: p[j] for n, p in msgs.items()}
            losses[k] = ls[j]
    run.release(sampled, messages, losses, 0.0)


def _drive(run, nodes, max_rounds=None):
    """The ServerApp's loop: rounds until finished or stopped on the budget."""
    done = 0
    while not run.finished and not run.stop_on_budget():
        if max_rounds is not None and done == max_rounds:
            return run
        _round(run, nodes)
        done += 1
    run.finish()
    return run


def _split_run(ds, opts, n_nodes, state_root=None, ledger_path=None):
    nodes = _nodes(ds, opts, n_nodes, state_root)
    run = ServerRun(opts, nodes[0].init, ds.n_clients, ledger_path=ledger_path)
    return _drive(run, nodes), nodes


def test_partition_covers_every_client_once():
    parts = [partition(50, i, 3) for i in range(3)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(50))
    with pytest.raises(InvalidParameterError, match="partition-id"):
        partition(50, 3, 3)


def test_seeded_split_run_equals_in_process_engine_every_round():
    ds = make_synthetic_federated(random_state=0)
    opts = _opts()
    run, _ = _split_run(ds, opts, n_nodes=3)
    # the reference is configured from the run spec (the product's path), not from Flower's config
    from privmtl.federated.config import train_config
    from privmtl.federated.spec import RunSpec, resolve_defaults

    spec = RunSpec(rounds=3, clients_per_round=6, noise_std=0.05, seed=3, local_steps=3,
                   noise_source="seeded")  # fmt: skip
    config = train_config(resolve_defaults(spec, ds.n_clients), threads=1)
    trainer = Trainer(ds, make_model("logreg", ds, 3), config)
    assert trainer.config.personal_init == run.config.personal_init
    boards = [{n: p.clone() for n, p in rec.released.items()} for rec in trainer]
    assert len(boards) == len(run.billboards) == 3
    for t, (a, b) in enumerate(zip(run.billboards, boards, strict=True)):
        for n in a:
            assert torch.allclose(a[n], b[n], atol=1e-5, rtol=0), (t, n)
    # the sampled clients and the accounting agree too
    assert [h["sampled"] for h in run.history] == [h["sampled"] for h in trainer.history]
    assert math.isclose(run.epsilon, trainer.epsilon, rel_tol=1e-12)


def test_personalized_models_persist_in_node_storage(tmp_path):
    ds = make_synthetic_federated(random_state=0)
    opts = _opts(**{"noise-source": "secure"})
    _, nodes = _split_run(ds, opts, n_nodes=3, state_root=tmp_path)
    trained = {cid: m for node in nodes for cid, m in node.personal.items()}
    assert trained  # some clients were sampled
    # a restarted node reads the same models back
    again = [
        NodeClients(
            ds,
            make_model("logreg", ds, 3),
            partition_id=i,
            num_partitions=3,
            state_dir=tmp_path / f"node-{i}",
        )
        for i in range(3)
    ]
    back = {cid: m for node in again for cid, m in node.personal.items()}
    assert back.keys() == trained.keys()
    for cid in trained:
        for n in trained[cid]:
            assert torch.equal(back[cid][n], trained[cid][n])
    # and a node keeps only its own clients' models
    for i, node in enumerate(again):
        own = {ds.client_ids[k] for k in partition(ds.n_clients, i, 3)}
        assert set(node.personal) <= own


def test_missing_node_release_keeps_accounted_sensitivity(tmp_path):
    """Dropping a node's clients releases a sum over fewer clients, still divided by q."""
    ds = make_synthetic_federated(random_state=0)
    opts = _opts(**{"noise-std": 0.0, "clip": 0.5})
    seed = 3
    node = NodeClients(ds, make_model("logreg", ds, seed), partition_id=0, num_partitions=1)
    run = ServerRun(opts, node.init, ds.n_clients, ledger_path=tmp_path / "ledger.jsonl")
    sampled = run.curator.sample_round()
    ks = [int(k) for k in sampled]
    msgs, _ = node.train(ks, run.curator.billboard, 0, run.config)
    kept = ks[: len(ks) // 2]
    before = {n: p.clone() for n, p in run.curator.billboard.items()}
    run.release(
        sampled,
        {k: {n: p[j] for n, p in msgs.items()} for j, k in enumerate(kept)},
        dict.fromkeys(kept, 0.0),
        0.0,
    )
    # oracle: clipped messages of the answering clients, summed, over the fixed q (no noise)
    flat = torch.cat([msgs[n][: len(kept)].reshape(len(kept), -1) for n in msgs], 1)
    scale = torch.clamp(0.5 / flat.norm(dim=1), max=1.0)
    expect = (flat * scale[:, None]).sum(0) / run.q
    got = torch.cat([(run.curator.billboard[n] - before[n]).reshape(-1) for n in msgs])
    assert torch.allclose(got, expect.to(got.dtype), atol=1e-6)
    assert run.history[0]["answered"] == kept


def test_a_synthetic_node_caches_nothing_and_rebuilds_the_same_node(tmp_path):
    from privmtl.flower.node_clients import load_node

    opts = _opts()
    first = load_node(opts, 1, 3, str(tmp_path))
    assert not list(tmp_path.glob("data-*.pt"))  # drawn when needed: nothing cached
    again = load_node(opts, 1, 3, str(tmp_path))
    assert again.client_ids == first.client_ids and again.m == first.m
    assert np.array_equal(again.clients, first.clients)
    assert np.array_equal(again.full_offsets, first.full_offsets)
    every = range(len(first.clients))
    for a, b in zip(again.local.take(every), first.local.take(every), strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    assert again.data_sha256 == first.data_sha256
    for n in first.init:
        assert torch.equal(again.init[n], first.init[n])
    board = {n: p.clone() for n, p in first.init.items()}
    cfg, _ = __import__("privmtl.flower._core", fromlist=["make_config"]).make_config(opts, 50)
    ks = [int(first.clients[0]), int(first.clients[2])]
    m1, _ = first.train(ks, board, 0, cfg)
    m2, _ = again.train(ks, board, 0, cfg)
    for n in m1:
        assert torch.equal(m1[n], m2[n])


def _boards_close(a, b, atol=1e-6):
    return len(a) == len(b) and all(
        torch.allclose(x[n], y[n], atol=atol, rtol=0) for x, y in zip(a, b, strict=True) for n in x
    )


def test_budget_stop_before_the_exceeding_release_as_the_trainer(tmp_path):
    ds = make_synthetic_federated(random_state=0)
    full, _ = _split_run(ds, _opts(rounds=4), n_nodes=2)
    per_round = [h["epsilon"] for h in full.history]
    budget = (per_round[1] + per_round[2]) / 2  # room for two releases, not three
    opts = _opts(rounds=4, **{"budget-epsilon": budget})
    nodes = _nodes(ds, opts, 2, tmp_path / "nodes")
    run = _drive(ServerRun(opts, nodes[0].init, ds.n_clients, server_dir=tmp_path / "s"), nodes)
    assert run.stopped_on_budget and len(run.history) == 2
    assert run.epsilon == pytest.approx(per_round[1], rel=1e-12) and run.epsilon <= budget
    _, entries = read_ledger(tmp_path / "s" / "ledger.jsonl")
    assert len(entries) == 2
    res = run.result_dict(
        [n.evaluate(run.curator.billboard, run.finish_settings()) for n in nodes], 0.0
    )
    assert res["stopped_on_budget"] is True and res["rounds_run"] == 2
    assert res["budget_epsilon"] == budget
    # the in-process Trainer stops at the same round
    trainer = Trainer(
        ds, make_model("logreg", ds, 3), run.config, noise_source="seeded", budget_epsilon=budget
    )
    trainer.run()
    assert trainer.stopped_on_budget and len(trainer.history) == 2


def test_resumed_server_repeats_uncheckpointed_round_without_double_charge(tmp_path):
    """Killed after round 2's release but before its checkpoint: the resumed run repeats round 2
    from the same state (curator and nodes), the ledger keeps one entry per release, and every
    billboard equals the uninterrupted run's."""
    ds = make_synthetic_federated(random_state=0)
    opts = _opts(rounds=4, **{"checkpoint-every": 2})
    ref_nodes = _nodes(ds, opts, 3, tmp_path / "ref-nodes")
    ref = _drive(
        ServerRun(opts, ref_nodes[0].init, ds.n_clients, server_dir=tmp_path / "ref"), ref_nodes
    )
    nodes = _nodes(ds, opts, 3, tmp_path / "nodes")
    first = ServerRun(opts, nodes[0].init, ds.n_clients, server_dir=tmp_path / "s")
    _drive(first, nodes, max_rounds=3)  # rounds 0, 1, 2 released; checkpoint after round 1
    assert first.curator.round == 3
    with pytest.raises(InvalidParameterError, match="did not finish"):
        ServerRun(opts, nodes[0].init, ds.n_clients, server_dir=tmp_path / "s")
    # restarted server and nodes (read back from their storage)
    nodes = _nodes(ds, opts, 3, tmp_path / "nodes")
    again = ServerRun(
        {**opts, "resume": True}, nodes[0].init, ds.n_clients, server_dir=tmp_path / "s"
    )
    assert again.curator.round == 2 and again.token == first.token
    _drive(again, nodes)
    assert _boards_close(again.billboards, ref.billboards)
    _, entries = read_ledger(tmp_path / "s" / "ledger.jsonl")
    assert [e["release_id"] for e in entries] == [f"round:{t}" for t in range(4)]
    assert again.epsilon == pytest.approx(ref.epsilon, rel=1e-12)
    assert reaccount(tmp_path / "s")["epsilon"] == pytest.approx(again.epsilon, rel=1e-9)
    # the nodes' personalized models equal the uninterrupted run's
    for a, b in zip(nodes, ref_nodes, strict=True):
        assert a.personal.keys() == b.personal.keys()
        for cid in a.personal:
            for n in a.personal[cid]:
                assert torch.allclose(a.personal[cid][n], b.personal[cid][n], atol=1e-6)


def test_resume_of_another_configuration_is_refused(tmp_path):
    ds = make_synthetic_federated(random_state=0)
    opts = _opts(rounds=3)
    nodes = _nodes(ds, opts, 1)
    _drive(ServerRun(opts, nodes[0].init, ds.n_clients, server_dir=tmp_path), nodes, max_rounds=1)
    other = {**opts, "lam": 0.5, "resume": True}
    with pytest.raises(CheckpointError, match="lam"):
        ServerRun(other, nodes[0].init, ds.n_clients, server_dir=tmp_path)


def test_the_server_refuses_a_ledger_cut_short_or_deleted(tmp_path):
    """The ServerApp's ledger must hold what its checkpoint saw (resume or a later run)."""
    ds = make_synthetic_federated(random_state=0)
    opts = _opts(rounds=3)
    nodes = _nodes(ds, opts, 1)
    _drive(ServerRun(opts, nodes[0].init, ds.n_clients, server_dir=tmp_path), nodes, max_rounds=2)
    led = tmp_path / "ledger.jsonl"
    lines = led.read_bytes().splitlines(keepends=True)
    led.write_bytes(b"".join(lines[:-1]))
    resume = {**opts, "resume": True}
    with pytest.raises(InvalidParameterError, match="holds 1 releases but the checkpoint"):
        ServerRun(resume, nodes[0].init, ds.n_clients, server_dir=tmp_path)
    led.unlink()
    with pytest.raises(InvalidParameterError, match="missing or empty"):
        ServerRun(resume, nodes[0].init, ds.n_clients, server_dir=tmp_path)
    assert not led.exists()


def test_a_second_run_in_the_same_directory_continues_the_ledger(tmp_path):
    """The clients continue their models, so the second run's ε composes both runs' releases."""
    ds = make_synthetic_federated(random_state=0)
    opts = _opts(rounds=2, **{"noise-source": "secure"})
    nodes = _nodes(ds, opts, 2, tmp_path / "nodes")
    one = _drive(ServerRun(opts, nodes[0].init, ds.n_clients, server_dir=tmp_path / "s"), nodes)
    two = _drive(ServerRun(opts, nodes[0].init, ds.n_clients, server_dir=tmp_path / "s"), nodes)
    assert (one.run_index, two.run_index) == (0, 1)
    _, entries = read_ledger(tmp_path / "s" / "ledger.jsonl")
    ids = [e["release_id"] for e in entries]
    assert ids == ["round:0", "round:1", "run1:round:0", "run1:round:1"]
    assert two.epsilon > one.epsilon
    assert two.epsilon == pytest.approx(reaccount(tmp_path / "s")["epsilon"], rel=1e-9)
    # two runs of 2 rounds = one run of 4 rounds (same mechanism) for the accountant
    four = ServerRun(_opts(rounds=4), nodes[0].init, ds.n_clients)
    for _ in range(4):
        four.curator.ledger.record(four.curator.event())
    assert two.epsilon == pytest.approx(four.epsilon, rel=1e-9)


def test_num_clients_sets_the_synthetic_population_of_every_node():
    from privmtl.flower._core import check_options
    from privmtl.flower.node_clients import load_node

    opts = _opts(**{"num-clients": 12})
    node = load_node(opts, 1, 3, None)
    assert node.m == 12 and node.clients.tolist() == [4, 5, 6, 7]
    assert load_node(_opts(), 0, 1, None).m == 50  # 0: the generator's default
    with pytest.raises(InvalidParameterError, match="num_clients"):
        check_options({**opts, "data": "femnist-leaf"}, 3)
    with pytest.raises(InvalidParameterError, match="num_clients"):
        check_options(opts, 13)  # fewer clients than SuperNodes


def test_ditto_message_split_run_equals_in_process_engine():
    """Ditto's second local run (a copy of the billboard) is the same on a node as in process."""
    ds = make_synthetic_federated(random_state=0)
    opts = _opts(**{"server-update": "ditto"})
    run, _ = _split_run(ds, opts, n_nodes=2)
    assert run.config.server_update == "ditto"
    trainer = Trainer(ds, make_model("logreg", ds, 3), run.config, noise_source="seeded")
    boards = [{n: p.clone() for n, p in rec.released.items()} for rec in trainer]
    for t, (a, b) in enumerate(zip(run.billboards, boards, strict=True)):
        for n in a:
            assert torch.allclose(a[n], b[n], atol=1e-5, rtol=0), (t, n)


def _run_pmtl_reference(ds, **flags):
    """The in-process product run (run_pmtl, its own defaults) the Flower run must equal."""
    from privmtl.experiments.pmtl import run_pmtl

    return run_pmtl(
        data="synthetic", dataset=ds, model="logreg", noise_source="seeded",
        show_progress=False, threads=1, **flags,
    )  # fmt: skip


def _flower_result(ds, flags, n_nodes=3):
    opts = run_options({k.replace("_", "-"): v for k, v in flags.items()})
    run, nodes = _split_run(ds, {**opts, "noise-source": "seeded"}, n_nodes=n_nodes)
    if run.vote is not None:  # the ServerApp's vote: the nodes' summed shares, released
        settings = run.finish_settings()
        shares = sum(np.asarray(n.vote_shares(run.curator.billboard, settings)) for n in nodes)
        run.elect(shares)
    return run.result_dict(
        [n.evaluate(run.curator.billboard, run.finish_settings()) for n in nodes], 0.0
    )


# keys of the JSON result both transports report for the same run (besides config)
_SAME = ("epsilon", "delta", "noise_std", "clients_per_round", "lam", "personal_init",
         "global_test_accuracy", "test_accuracy", "mean_client_accuracy", "val_accuracy",
         "pre_finetune_test_accuracy", "finetune", "finetune_auto", "released_dim",
         "rounds_run", "covered", "global_mean_client_accuracy", "clients_per_final_model",
         "end_of_run", "local_test_accuracy", "local_mean_client_accuracy", "gain_over_local",
         "gain_interval", "baseline_clients", "baseline")  # fmt: skip


@pytest.mark.parametrize(
    "flags",
    [
        # a scale run's flags, fewer rounds; everything else at the product defaults
        {"rounds": 3, "clients_per_round": 6, "epsilon": 2.0},
        # the clients' vote held (at 50 clients from epsilon 8 on): released by the server
        {"rounds": 3, "clients_per_round": 6, "epsilon": 8.0},
        # the other personal start, an explicit fine-tuning method, the authors' message
        {"rounds": 2, "clients_per_round": 5, "noise_std": 0.01, "personal_init": "billboard",
         "finetune": "mr", "server_update": "offset"},
        # partial sharing with a server optimizer; adaptive clipping of subspace releases
        {"rounds": 2, "clients_per_round": 6, "epsilon": 4.0, "shared_params": ["linear.weight"],
         "server_optimizer": "momentum", "finetune": "vanilla"},
        {"rounds": 2, "clients_per_round": 6, "epsilon": 4.0, "adaptive_clip_quantile": 0.5,
         "adaptive_clip_noise": 1.0, "subspace_dim": 20, "local_epochs": 2, "finetune": "none"},
        # the global-model methods: auto's choice from the billboard, FedProx fine-tuned
        {"rounds": 3, "clients_per_round": 6, "noise_std": 0.001, "method": "fedavg"},
        {"rounds": 2, "clients_per_round": 6, "epsilon": 4.0, "method": "fedprox",
         "finetune": "vanilla"},
        # cyclic groups with independent noise; banded noise at full and cyclic participation
        {"rounds": 3, "sampling": "cyclic", "groups": 3, "epsilon": 2.0, "finetune": "none"},
        {"rounds": 3, "sampling": "all", "noise_mechanism": "banded", "epsilon": 2.0,
         "finetune": "none"},
        {"rounds": 4, "sampling": "cyclic", "groups": 2, "noise_mechanism": "banded",
         "epsilon": 2.0, "finetune": "none"},
    ],
)  # fmt: skip
def test_flower_run_equals_run_pmtl_at_the_product_defaults(flags):
    """The reference is run_pmtl with its own defaults (not a Trainer built from Flower's
    config): the Flower run resolves the same config, releases with the same ε and every client
    ends with the same model (after the same per-client finish)."""
    ds = make_synthetic_federated(random_state=0)
    ref = _run_pmtl_reference(ds, **flags)
    res = _flower_result(ds, flags)
    assert list(res["config"]) == list(ref["config"])
    differing = {k: v for k, v in res["config"].items() if ref["config"][k] != v}
    assert differing == {}
    assert [k for k in _SAME if k in res] == [k for k in _SAME if k in ref]
    assert ("pre_finetune_test_accuracy" in ref) == (flags.get("finetune") != "none")
    for key in (k for k in _SAME if k in ref):
        if isinstance(ref[key], float):
            assert res[key] == pytest.approx(ref[key], rel=1e-9, abs=1e-12), key
        elif key == "finetune_auto" and "vote" in ref[key]:
            # the vote released from the nodes' sums: its noisy counts to the last bits
            got, want = dict(res[key]), dict(ref[key])
            got_vote, want_vote = dict(got.pop("vote")), dict(want.pop("vote"))
            counts = got_vote.pop("noisy_counts")
            assert counts == pytest.approx(want_vote.pop("noisy_counts"), rel=1e-12)
            assert (got, got_vote) == (want, want_vote)
        else:
            assert res[key] == ref[key], key
    if flags.get("epsilon") == 8.0:  # the vote was held, on both transports
        assert ref["finetune_auto"]["vote"]["held"] and res["finetune_auto"]["vote"]["held"]
    assert res["guarantee"]["notes"] == ref["guarantee"]["notes"]
    if flags.get("noise_mechanism") == "banded":  # the same one event, bands and groups
        assert res["banded"] == ref["banded"] and ref["banded"]["mechanism"] == "banded"
        assert ref["banded"]["groups"] == flags.get("groups", 1)


def test_flower_refuses_what_it_does_not_run_with_one_line_naming_the_parameter():
    from privmtl.flower._core import check_options

    with pytest.raises(InvalidParameterError, match=r"'method'.*joint-dp"):
        check_options({"method": "joint-dp"}, 3)
    with pytest.raises(InvalidParameterError, match="'adaptive_clip_quantile'"):
        check_options({"adaptive-clip-quantile": 0.5, "secagg": True}, 3)
    with pytest.raises(InvalidParameterError, match="'finetune'"):
        check_options({"finetune": "sideways"}, 3)
    with pytest.raises(InvalidParameterError, match="'delta' and 'paper_delta'"):
        check_options({"delta": 1e-6, "paper-delta": True}, 3)
    check_options({"shared_params": ["linear.weight"], "personal_init": None}, 3)  # accepted


MODELS = """
from torch import nn


def make_mlp(n_features, n_classes):
    return nn.Sequential(nn.Linear(n_features, 8), nn.ReLU(), nn.Linear(8, n_classes))
"""


@pytest.fixture
def models_dir(tmp_path, monkeypatch):
    """A directory holding mymodels.py (the user's factory), as the working directory."""
    import sys

    (tmp_path / "mymodels.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    yield tmp_path
    sys.path[:] = before
    for name in [n for n in sys.modules if n == "mymodels"]:
        del sys.modules[name]


@pytest.mark.parametrize("spec", ["mymodels:make_mlp", "./mymodels.py:make_mlp"])
def test_a_user_factory_on_flower_nodes_equals_run_pmtl(models_dir, spec, monkeypatch, tmp_path):
    """Each node loads the factory itself (from model-dir, not its working directory) and checks
    the announced SHA-256; the run then equals run_pmtl with the same --model (ε, accuracy).
    Without the end-of-run fine-tuning, which trains every client and is the same code for any
    model (the product defaults with a factory: tests/flower/test_deployment.py, slow)."""
    import hashlib

    from privmtl.experiments.pmtl import run_pmtl
    from privmtl.flower.factory import announce
    from privmtl.flower.node_clients import load_node

    flags = {"rounds": 3, "clients_per_round": 6, "epsilon": 2.0, "finetune": "none"}
    ref = run_pmtl(data="synthetic", model=spec, noise_source="seeded", show_progress=False,
                   threads=1, **flags)  # fmt: skip
    cfg = announce({"model": spec, **{k.replace("_", "-"): v for k, v in flags.items()}})
    sha = hashlib.sha256((models_dir / "mymodels.py").read_bytes()).hexdigest()
    assert cfg["model-dir"] == str(models_dir) and cfg["model-sha256"] == sha
    opts = run_options({**cfg, "noise-source": "seeded"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the nodes resolve the spec against model-dir
    nodes = [load_node(opts, i, 3, None) for i in range(3)]
    assert [n for n, _ in nodes[0].model.named_parameters()] == ["0.weight", "0.bias", "2.weight",
                                                                  "2.bias"]  # fmt: skip
    run = _drive(ServerRun(opts, nodes[0].init, nodes[0].m), nodes)
    res = run.result_dict(
        [n.evaluate(run.curator.billboard, run.finish_settings()) for n in nodes], 0.0
    )
    assert res["model"] == ref["model"] == spec and res["model_sha256"] == sha
    assert res["epsilon"] == pytest.approx(ref["epsilon"], rel=1e-12)
    for key in ("test_accuracy", "mean_client_accuracy", "global_test_accuracy"):
        assert res[key] == pytest.approx(ref[key], rel=1e-9, abs=1e-12), key
    assert run.fingerprint_config()["model_sha256"] == sha  # a resume must load the same code


def test_a_node_whose_factory_file_differs_is_refused_naming_both_hashes(models_dir, tmp_path):
    from privmtl.flower.factory import announce
    from privmtl.flower.node_clients import load_node

    opts = run_options(announce({"model": "mymodels:make_mlp", "seed": 0}))
    other = tmp_path / "node1"
    other.mkdir()
    (other / "mymodels.py").write_text(MODELS.replace("8", "16"))
    mine = opts["model-sha256"]
    import hashlib

    theirs = hashlib.sha256((other / "mymodels.py").read_bytes()).hexdigest()
    with pytest.raises(InvalidParameterError) as err:
        load_node(opts, 1, 3, None, model_dir=str(other))
    msg = str(err.value)
    assert "\n" not in msg and mine in msg and theirs in msg
    assert "SuperNode partition 1" in msg and "refusing" in msg
    # a run configuration that announces no hash is refused too (same code or refused)
    with pytest.raises(InvalidParameterError, match="'model-sha256'"):
        load_node({**opts, "model-sha256": ""}, 0, 3, None)


def test_the_serverapp_checks_the_nodes_build_its_shapes(models_dir):
    from privmtl.federated.user_model import load_factory
    from privmtl.flower.factory import check_shapes

    user = load_factory("mymodels:make_mlp")
    net = user.build(60, 10)
    init = {n: p.detach() for n, p in net.named_parameters()}
    state = torch.random.get_rng_state()
    check_shapes(user, 60, 10, init)  # the same model: accepted
    assert torch.equal(state, torch.random.get_rng_state())
    with pytest.raises(InvalidParameterError, match="every machine must build the same model"):
        check_shapes(user, 60, 12, init)


def test_a_refusing_node_fails_the_run_with_its_one_line(models_dir, tmp_path):
    """The ClientApp answers ``query`` with the refusal; the ServerApp fails with that line."""
    pytest.importorskip("flwr", reason="Flower is not installed (pip install 'privmtl[flower]')")
    from flwr.app import Context, RecordDict

    from privmtl.flower.apps import check_refusals, describe_node
    from privmtl.flower.factory import announce

    cfg = run_options(announce({"model": "mymodels:make_mlp", "num-clients": 9}))
    other = tmp_path / "node1"
    other.mkdir()
    (other / "mymodels.py").write_text(MODELS + "\n# another version\n")

    def ctx(pid, **node):
        nc = {"partition-id": pid, "num-partitions": 3, **node}
        return Context(run_id=1, node_id=pid + 1, node_config=nc, state=RecordDict(),
                       run_config=cfg)  # fmt: skip

    good = describe_node(ctx(0))
    assert "error" not in good.config_records["node"] and "init" in good.array_records
    bad = describe_node(ctx(1, **{"model-dir": str(other)}))
    check_refusals({1: good}, 2)  # nothing refused
    with pytest.raises(InvalidParameterError) as err:
        check_refusals({1: good, 2: bad}, 2)
    assert "\n" not in str(err.value) and cfg["model-sha256"] in str(err.value)


def _saved_run(opts, root, n_nodes=3):
    """A run with save-models as the apps drive it: the ServerApp keeps the released global model
    in server/, each node its clients' final models in its own storage; returns the result."""
    from privmtl.checkpoint import write_atomic
    from privmtl.flower._core import MODELS_FILE, SERVER_DIR, to_bytes
    from privmtl.flower.node_clients import load_node

    dirs = [root / "nodes" / f"node-{i}" for i in range(n_nodes)]
    nodes = [load_node(opts, i, n_nodes, str(d)) for i, d in enumerate(dirs)]
    (root / SERVER_DIR).mkdir(parents=True)
    run = _drive(ServerRun(opts, nodes[0].init, nodes[0].m), nodes)
    scores = [n.evaluate(run.curator.billboard, run.finish_settings()) for n in nodes]
    for node in nodes:
        assert node.save_models(run.token) == node.state_dir / MODELS_FILE
    write_atomic(root / SERVER_DIR / MODELS_FILE, to_bytes(run.models_state()))
    return run.result_dict(scores, 0.0), dirs


@pytest.mark.parametrize(
    ("spec", "flags", "primary"),
    [
        ("logreg", {"finetune": "none"}, "personalized"),
        ("logreg", {"finetune": "vanilla", "method": "fedavg"}, "personalized"),
        ("logreg", {"finetune": "none", "method": "fedavg"}, "global"),
        ("mymodels:make_mlp", {"finetune": "none"}, "personalized"),
        # FedRep: the nodes save their clients' final heads on the released representation
        ("mymodels:make_mlp", {"finetune": "none", "method": "fedrep"}, "personalized"),
    ],
)
def test_saved_flower_models_reload_with_the_accuracy_the_run_reported(
    models_dir, tmp_path, monkeypatch, spec, flags, primary
):
    """The folder assembled from the ServerApp's global model and the nodes' own files is the
    folder of privmtl pmtl --save-models: signed, and privmtl evaluate's accuracy is the run's
    (a user's factory rebuilt from the source model.json records, from another directory)."""
    from privmtl.experiments.pmtl import evaluate_saved
    from privmtl.flower.factory import announce
    from privmtl.flower.saved import collect_models
    from privmtl.trust import is_signed

    cfg = announce({"model": spec, "rounds": 2, "clients-per-round": 6, "epsilon": 2.0,
                    "num-clients": 12, **flags})  # fmt: skip
    opts = run_options({**cfg, "noise-source": "seeded"})
    res, dirs = _saved_run(opts, tmp_path / "work")
    out = collect_models(
        tmp_path / "models", work_dir=tmp_path / "work", result=res, run_config=cfg, node_dirs=dirs
    )
    meta = json.loads((out / "model.json").read_text())
    assert is_signed(meta) and meta["primary"] == primary
    assert meta["finetuned"] == (flags["finetune"] != "none")
    assert ("personalized" in meta["files"]) == (primary == "personalized")
    assert ("factory" in meta["model"]) == (spec != "logreg")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    ev = evaluate_saved(out)
    assert ev["test_accuracy"] == pytest.approx(res["test_accuracy"], rel=1e-9, abs=1e-12)
    assert ev["mean_client_accuracy"] == pytest.approx(res["mean_client_accuracy"], rel=1e-9)
    assert ev["guarantee"]["epsilon"] == pytest.approx(res["epsilon"], rel=1e-12)


def test_saving_refuses_a_node_file_of_another_run_and_writes_nothing(tmp_path):
    from privmtl.exceptions import DataFormatError
    from privmtl.flower._core import MODELS_FILE, from_bytes, to_bytes
    from privmtl.flower.saved import collect_models

    cfg = {"rounds": 1, "clients-per-round": 4, "noise-std": 0.0, "num-clients": 9,
           "finetune": "none"}  # fmt: skip
    res, dirs = _saved_run(run_options(cfg), tmp_path / "work")
    stale = from_bytes((dirs[1] / MODELS_FILE).read_bytes())
    (dirs[1] / MODELS_FILE).write_bytes(to_bytes({**stale, "token": "an-earlier-run"}))
    kw = {"work_dir": tmp_path / "work", "result": res, "run_config": cfg}
    with pytest.raises(DataFormatError, match="another run") as err:
        collect_models(tmp_path / "models", node_dirs=dirs, **kw)
    assert "\n" not in str(err.value) and "SuperNode 1" in str(err.value)
    (dirs[1] / MODELS_FILE).write_bytes(to_bytes(stale))
    (dirs[2] / MODELS_FILE).unlink()  # a node that did not answer the end of the run
    with pytest.raises(DataFormatError, match="No models of SuperNode 2"):
        collect_models(tmp_path / "models", node_dirs=dirs, **kw)
    assert not (tmp_path / "models").exists()


@pytest.mark.parametrize(
    "content",
    [b"[]", b"\xff\xfe{}", b'{"run": 0, "token": "t"}', b"[" * 200_000 + b"]" * 200_000],
    ids=["list", "not-utf8", "no-finished", "deep"],
)
def test_a_malformed_run_json_is_one_line_before_anything_starts(tmp_path, capsys, content):
    """The ServerApp's run.json: refused in one line naming it, by the ServerApp, by the check
    the launcher makes before any process starts, and by privmtl flower local."""
    from privmtl.exceptions import DataFormatError
    from privmtl.flower.launcher import check_work_dir

    server = tmp_path / "work" / "server"
    server.mkdir(parents=True)
    (server / "run.json").write_bytes(content)
    ds = make_synthetic_federated(random_state=0)
    opts = _opts(rounds=1)
    nodes = _nodes(ds, opts, 1)
    for resume in (False, True):
        with pytest.raises(DataFormatError, match=r"run\.json") as err:
            ServerRun({**opts, "resume": resume}, nodes[0].init, ds.n_clients, server_dir=server)
        assert "\n" not in str(err.value)
        with pytest.raises(DataFormatError, match=r"run\.json"):
            check_work_dir(tmp_path / "work", resume=resume)
    pytest.importorskip("flwr")
    from privmtl.cli import main

    rc = main(["flower", "local", "--work-dir", str(tmp_path / "work"), "--data", "synthetic",
               "--model", "logreg", "--resume", "--json"])  # fmt: skip
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err_lines) == 1 and "run.json" in err_lines[0], err_lines


@pytest.mark.parametrize(
    "flags",
    [
        {"rounds": 3, "clients_per_round": 6, "epsilon": 8.0},  # the vote held
        {"rounds": 2, "clients_per_round": 6, "epsilon": 2.0},  # every client's own choice
        {"rounds": 2, "clients_per_round": 6, "epsilon": 2.0, "finetune": "none"},
    ],
)  # fmt: skip
def test_flower_per_client_rows_equal_run_pmtls(flags, tmp_path):
    """The rows of a seeded Flower run (the nodes' scores, their baseline) are run_pmtl's."""
    from privmtl.per_client import read_rows

    ds = make_synthetic_federated(random_state=0)
    _run_pmtl_reference(ds, per_client=tmp_path / "ref.csv", **flags)
    opts = run_options({k.replace("_", "-"): v for k, v in flags.items()})
    run, nodes = _split_run(ds, {**opts, "noise-source": "seeded"}, n_nodes=3)
    if run.vote is not None:
        settings = run.finish_settings()
        run.elect(sum(np.asarray(n.vote_shares(run.curator.billboard, settings)) for n in nodes))
    evals = [n.evaluate(run.curator.billboard, run.finish_settings()) for n in nodes]
    # the nodes answer in any order (the ServerApp lists them by node id, not by partition)
    rows = run.client_rows(evals[::-1], run.result_dict(evals, 0.0))
    ref = read_rows(tmp_path / "ref.csv")
    assert list(rows.columns) == list(ref.columns) and len(rows) == ds.n_clients
    for col in rows.columns:
        if rows[col].dtype.kind == "f":
            np.testing.assert_allclose(rows[col], ref[col], rtol=1e-9, atol=1e-12)
        else:
            assert rows[col].astype(str).tolist() == ref[col].astype(str).tolist(), col


def test_discovery_waits_for_the_populations_work_and_names_the_slow_partition():
    """The nodes' data work grows with the population: the wait for them does too (not the
    round timeout that failed large populations), and a timeout names the partitions missing."""
    from privmtl.flower.discovery import discovery_timeout, slow_nodes_line

    small = discovery_timeout(run_options({"num-clients": 1_000}))
    large = discovery_timeout(run_options({"num-clients": 100_000}))
    assert small == run_options({})["round-timeout"] and large >= 500.0
    assert discovery_timeout(run_options({"num-clients": 100_000, "discovery-timeout": 30})) == 30
    line = slow_nodes_line({7: {"partition": 0}, 9: {"partition": 2}}, 3, 560.0)
    assert "only 2 of 3" in line and "partition-id=1" in line and "partition-id=0" not in line
    assert "\n" not in line and "discovery-timeout" in line


def _client_table(path, n_clients=12, rows=30, seed=0):
    import pandas as pd

    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(3, 4)) * 2
    frames = []
    for c in range(n_clients):
        y = rng.integers(0, 3, size=rows)
        f = pd.DataFrame(centers[y] + rng.normal(size=(rows, 4)), columns=list("abcd"))
        f.insert(0, "user", f"u{c:02d}")
        f["label"] = y
        frames.append(f)
    pd.concat(frames, ignore_index=True).to_csv(path, index=False)


def test_flower_reads_the_users_table_as_run_pmtl_does(tmp_path):
    """--data table on Flower: each node keeps its own clients' rows (cached, mapped) and the
    seeded run equals run_pmtl on the same table (epsilon, accuracy, scaling, notes)."""
    from privmtl.experiments.pmtl import run_pmtl
    from privmtl.flower.node_clients import load_node

    _client_table(tmp_path / "t.csv")
    flags = {"rounds": 2, "clients_per_round": 4, "epsilon": 4.0}
    ref = run_pmtl(
        data="table", data_path=str(tmp_path / "t.csv"), client_column="user",
        label_column="label", model="logreg", noise_source="seeded", show_progress=False,
        threads=1, **flags,
    )  # fmt: skip
    opts = run_options(
        {
            **{k.replace("_", "-"): v for k, v in flags.items()},
            "data": "table", "data-path": str(tmp_path / "t.csv"), "client-column": "user",
            "label-column": "label", "noise-source": "seeded",
        }
    )  # fmt: skip
    nodes = [load_node(opts, i, 3, str(tmp_path / f"node-{i}")) for i in range(3)]
    assert [len(n.client_ids) for n in nodes] == [4, 4, 4]
    assert nodes[1].client_ids == ["u04", "u05", "u06", "u07"]
    run = ServerRun(opts, nodes[0].init, 12)
    run.data_scaling = nodes[0].describe()["scaling"]
    _drive(run, nodes)
    res = run.result_dict(
        [n.evaluate(run.curator.billboard, run.finish_settings()) for n in nodes], 0.0
    )
    for key in ("epsilon", "test_accuracy", "mean_client_accuracy", "local_test_accuracy"):
        assert res[key] == pytest.approx(ref[key], rel=1e-9, abs=1e-12), key
    assert res["scaling"] == ref["scaling"] != "none"
    assert res["guarantee"]["notes"] == ref["guarantee"]["notes"]
    again = load_node(opts, 1, 3, str(tmp_path / "node-1"))  # from the node's cache
    assert again.client_ids == nodes[1].client_ids and torch.equal(
        again.local.concat("train")[0], nodes[1].local.concat("train")[0]
    )
