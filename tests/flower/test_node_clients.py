"""A SuperNode over a lazy synthetic partition: a round draws its sampled clients only, the end
of run and the scoring draw a block at a time, and the results are the eager node's."""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest
import torch
from engine_defaults import old_config

import privmtl.flower.node_clients as node_clients
from privmtl.data.federated import SyntheticLaw
from privmtl.data.streamed import SyntheticFederation
from privmtl.experiments.pmtl import make_model
from privmtl.flower._core import run_options
from privmtl.flower.node_clients import NodeClients, load_node
from privmtl.flower.server_run import ServerRun

M, SEED = 50, 3


def _opts(**kw):
    base = {"rounds": 3, "clients-per-round": 6, "epsilon": 8.0, "seed": SEED,
            "noise-source": "seeded", "local-steps": 3}  # fmt: skip
    return run_options({**base, **kw})


def _nodes(ds, n_nodes=3):
    return [
        NodeClients(ds, make_model("logreg", ds, SEED), partition_id=i, num_partitions=n_nodes)
        for i in range(n_nodes)
    ]


def _count_draws(monkeypatch):
    """Every client drawn from its stream (population index), and the clients of each draw."""
    asked: list[int] = []
    blocks: list[int] = []
    stream, draw = SyntheticLaw.client_rngs, SyntheticFederation._draw
    monkeypatch.setattr(
        SyntheticLaw, "client_rngs", lambda law, ks: asked.extend(ks.tolist()) or stream(law, ks)
    )
    monkeypatch.setattr(
        SyntheticFederation, "_draw", lambda self, idx, splits: blocks.append(len(idx)) or draw(
            self, idx, splits
        ),
    )  # fmt: skip
    return asked, blocks


def _forbid_materialising(monkeypatch):
    def refuse(self):
        raise AssertionError("a lazy partition was materialised")

    monkeypatch.setattr(SyntheticFederation, "materialize", refuse)


def _round(run, nodes):
    """One round as the ServerApp drives it; returns every node's messages."""
    owner = {int(k): node for node in nodes for k in node.clients}
    t, key = run.curator.round, run.round_key()
    sampled = run.curator.sample_round()
    board = {n: p.clone() for n, p in run.curator.billboard.items()}
    cfg = old_config(**json.loads(json.dumps(asdict(run.config))))
    messages, losses, sent = {}, {}, []
    for node in nodes:
        ks = [int(k) for k in sampled if owner[int(k)] is node]
        msgs, ls = node.train(ks, board, t, cfg, key=key)
        sent.append((ks, msgs, ls))
        for j, k in enumerate(ks):
            messages[k] = {n: p[j] for n, p in msgs.items()}
            losses[k] = ls[j]
    run.release(sampled, messages, losses, 0.0)
    return sampled, sent


def _whole_run(nodes, opts):
    """A seeded run to its end (rounds, the vote where held, every node's end of run)."""
    run = ServerRun(opts, nodes[0].init, M)
    rounds = []
    while not run.finished and not run.stop_on_budget():
        rounds.append(_round(run, nodes))
    run.finish()
    if run.vote is not None:
        settings = run.finish_settings()
        run.elect(sum(np.asarray(n.vote_shares(run.curator.billboard, settings)) for n in nodes))
    evals = [n.evaluate(run.curator.billboard, run.finish_settings()) for n in nodes]
    return rounds, evals, run.result_dict(evals, 0.0)


def test_a_lazy_node_draws_nothing_to_start_and_only_a_rounds_sampled_clients(monkeypatch):
    asked, _ = _count_draws(monkeypatch)
    pop = SyntheticFederation(n_clients=M, random_state=SEED)
    node = _nodes(pop)[1]
    assert asked == []  # built from the clients' sizes alone
    assert node.data_sha256 == pop.partition(node.clients).content_sha256()
    cfg = old_config(**json.loads(json.dumps(asdict(ServerRun(_opts(), node.init, M).config))))
    board = {n: p.clone() for n, p in node.init.items()}
    ks = [int(node.clients[4]), int(node.clients[0]), int(node.clients[9])]
    node.train(ks, board, 0, cfg)
    assert sorted(asked) == sorted(ks)  # each sampled client drawn once, no other


@pytest.mark.parametrize("flags", [{}, {"finetune": "none"}, {"finetune": "mr"}])
def test_a_lazy_node_gives_the_eager_nodes_messages_and_scores(monkeypatch, flags):
    """Bit for bit: every round's messages and losses, the vote, the nodes' scores, the run."""
    opts = _opts(**flags)
    pop = SyntheticFederation(n_clients=M, random_state=SEED)
    eager_rounds, eager_evals, eager = _whole_run(_nodes(pop.materialize()), opts)
    _forbid_materialising(monkeypatch)
    # blocks of at most 5 clients in the end of run and the scoring (a node holds 15)
    monkeypatch.setattr(node_clients, "END_OF_RUN_BLOCK", 5)
    asked, blocks = _count_draws(monkeypatch)
    lazy_rounds, lazy_evals, lazy = _whole_run(_nodes(pop), opts)
    for (s1, sent1), (s2, sent2) in zip(eager_rounds, lazy_rounds, strict=True):
        assert np.array_equal(s1, s2)
        for (k1, m1, l1), (k2, m2, l2) in zip(sent1, sent2, strict=True):
            assert k1 == k2 and l1 == l2
            assert all(torch.equal(m1[n], m2[n]) for n in m1)
    for e1, e2 in zip(eager_evals, lazy_evals, strict=True):
        for key in e1:
            if "seconds" not in key:
                assert e1[key] == e2[key], key
    for key in eager:
        if "seconds" not in key and key not in ("phases", "wall_seconds"):
            assert json.dumps(eager[key], sort_keys=True, default=str) == json.dumps(
                lazy[key], sort_keys=True, default=str
            ), key
    assert asked and max(blocks) <= max(5, int(opts["clients-per-round"]))
    if not flags:  # the CLI defaults: the vote and the baseline ran on the lazy nodes too
        assert all("voters" in e and "baseline" in e for e in lazy_evals)


def test_load_node_keeps_a_lazy_partition_and_caches_no_data(tmp_path, monkeypatch):
    _forbid_materialising(monkeypatch)
    asked, _ = _count_draws(monkeypatch)
    node = load_node(_opts(**{"num-clients": M}), 2, 3, str(tmp_path))
    assert isinstance(node.local, SyntheticFederation) and asked == []
    assert not list(tmp_path.glob("data-*.pt"))
    again = load_node(_opts(**{"num-clients": M}), 2, 3, str(tmp_path))
    assert again.data_sha256 == node.data_sha256 and asked == []


@pytest.mark.parametrize("flags", [{}, {"finetune": "mr"}])
def test_a_lazy_nodes_end_of_run_draws_each_of_its_clients_once(monkeypatch, flags):
    """The end of run and the scores in one pass: each block drawn once for both (the run's
    baseline, with the CLI defaults, draws its sample's clients again for their own training)."""
    from privmtl.federated.baseline import baseline_sample

    opts = _opts(**flags)
    monkeypatch.setattr(node_clients, "END_OF_RUN_BLOCK", 5)  # a node's 15 clients: 3 blocks
    asked, _ = _count_draws(monkeypatch)
    nodes = _nodes(SyntheticFederation(n_clients=M, random_state=SEED))
    run = ServerRun(opts, nodes[0].init, M)
    while not run.finished and not run.stop_on_budget():
        _round(run, nodes)
    run.finish()
    settings = run.finish_settings()
    if run.vote is not None:
        run.elect(sum(np.asarray(n.vote_shares(run.curator.billboard, settings)) for n in nodes))
        settings = run.finish_settings()
    again = set(baseline_sample(M, SEED).tolist()) if settings.get("baseline") else set()
    for node in nodes:
        asked.clear()
        node.evaluate(run.curator.billboard, settings)
        counts = np.bincount(asked, minlength=M)
        mine = [int(k) for k in node.clients]
        assert all(counts[k] == 1 + (k in again) for k in mine), counts[mine]
        assert counts.sum() == len(mine) + len(again & set(mine))
