"""The PMTL protocol split into server and nodes (no Flower needed) against the in-process engine."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from privmtl.data.federated import make_synthetic_federated
from privmtl.exceptions import InvalidParameterError
from privmtl.experiments.pmtl import make_model
from privmtl.federated.protocol import Trainer
from privmtl.flower._core import NodeClients, ServerRun, partition, run_options


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


def _split_run(ds, opts, n_nodes, state_root=None, ledger_path=None):
    """Drive ServerRun + NodeClients as the Flower apps do (by-value message passing)."""
    seed = int(opts["seed"])
    nodes = [
        NodeClients(
            ds,
            make_model("logreg", ds, seed),
            partition_id=i,
            num_partitions=n_nodes,
            state_dir=None if state_root is None else state_root / f"node-{i}",
        )
        for i in range(n_nodes)
    ]
    owner = {int(k): node for node in nodes for k in node.clients}
    run = ServerRun(opts, nodes[0].init, ds.n_clients, ledger_path=ledger_path)
    for t in range(run.config.rounds):
        sampled = run.curator.sample_round()
        messages, losses = {}, {}
        board = {n: p.clone() for n, p in run.curator.billboard.items()}
        for node in nodes:
            ks = [int(k) for k in sampled if owner[int(k)] is node]
            # the config travels as JSON, as in the Flower message
            from dataclasses import asdict

            from privmtl.federated.config import TrainConfig

            cfg = TrainConfig(**json.loads(json.dumps(asdict(run.config))))
            msgs, ls = node.train(ks, board, t, cfg)
            for j, k in enumerate(ks):
                messages[k] = {n: p[j] for n, p in msgs.items()}
                losses[k] = ls[j]
        run.release(sampled, messages, losses, 0.0)
    return run, nodes


def test_partition_covers_every_client_once():
    parts = [partition(50, i, 3) for i in range(3)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(50))
    with pytest.raises(InvalidParameterError, match="partition-id"):
        partition(50, 3, 3)


def test_seeded_split_run_equals_in_process_engine_every_round():
    ds = make_synthetic_federated(random_state=0)
    opts = _opts()
    run, _ = _split_run(ds, opts, n_nodes=3)
    trainer = Trainer(ds, make_model("logreg", ds, 3), run.config, noise_source="seeded")
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


def test_node_data_cache_rebuilds_the_same_node(tmp_path):
    from privmtl.flower._core import load_node

    opts = _opts()
    first = load_node(opts, 1, 3, str(tmp_path))
    assert list(tmp_path.glob("data-*.pt"))  # cached in the node's storage
    again = load_node(opts, 1, 3, str(tmp_path))  # from the cache
    assert again.client_ids == first.client_ids and again.m == first.m
    assert np.array_equal(again.clients, first.clients)
    assert np.array_equal(again.full_offsets, first.full_offsets)
    assert torch.equal(again.x_all, first.x_all) and torch.equal(again.y_all, first.y_all)
    for n in first.init:
        assert torch.equal(again.init[n], first.init[n])
    board = {n: p.clone() for n, p in first.init.items()}
    cfg, _ = __import__("privmtl.flower._core", fromlist=["make_config"]).make_config(opts, 50)
    ks = [int(first.clients[0]), int(first.clients[2])]
    m1, _ = first.train(ks, board, 0, cfg)
    m2, _ = again.train(ks, board, 0, cfg)
    for n in m1:
        assert torch.equal(m1[n], m2[n])
