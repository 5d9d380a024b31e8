"""Clustered MTL: parallel composition (ε = max over clusters) and billboard locality."""

from __future__ import annotations

import dataclasses

import dp_accounting
import pytest
import torch
from engine_defaults import old_config

from privmtl.data.federated import FederatedDataset, make_synthetic_federated
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.clusters import cluster_seed, parse_clusters, train_clusters
from privmtl.federated.config import TrainConfig, resolve_config
from privmtl.federated.engine import train
from privmtl.federated.models import MultinomialLogReg
from privmtl.privacy.accounting import compute_epsilon
from privmtl.privacy.sampling import make_sampler

D, C = 4, 3
GROUPS = [[0, 5, 9], [1, 2, 3, 4], [6, 7, 8, 10, 11]]


@pytest.fixture(scope="module")
def data() -> FederatedDataset:
    return make_synthetic_federated(
        n_clients=12, n_features=D, n_classes=C, samples_per_client=(10, 20), random_state=3
    )


def _cfg(**kw) -> TrainConfig:
    base = dict(
        rounds=3, clients_per_round=6, sampling="poisson", clip=0.5, noise_std=0.1, lr=0.1,
        lam=0.1, batch_size=10, seed=0, progress=False, noise_source="seeded",
    )  # fmt: skip
    base.update(kw)
    return old_config(**base)


def _with_train(ds: FederatedDataset, tx, ty) -> FederatedDataset:
    """A new dataset with other training data (fresh caches; other splits shared)."""
    return FederatedDataset(
        client_ids=ds.client_ids, train_x=tx, train_y=ty, val_x=ds.val_x, val_y=ds.val_y,
        test_x=ds.test_x, test_y=ds.test_y, n_classes=ds.n_classes,
    )  # fmt: skip


def test_epsilon_is_the_max_over_clusters(data: FederatedDataset) -> None:
    cfg = _cfg()
    res = train_clusters(data, MultinomialLogReg(D, C), cfg, GROUPS)
    delta = min(1e-5, 1.0 / (100 * data.n_clients))  # the default δ, below 1/m (all clients)
    expected = []
    for g in GROUPS:  # independent accounting: cluster of m_c clients, q_c = round(6 m_c / 12)
        m_c = len(g)
        q_c = min(m_c, max(1, round(6 * m_c / 12)))
        ev = make_sampler("poisson", m_c, q_c).event(0.1 * q_c / 0.5)
        expected.append(compute_epsilon(dp_accounting.SelfComposedDpEvent(ev, 3), delta=delta))
    got = [c["epsilon"] for c in res.extra["clusters"]]
    assert got == pytest.approx(expected, rel=1e-9)
    assert len(set(round(e, 6) for e in got)) == 3  # same σ, different (m_c, q_c): different ε_c
    assert res.epsilon == pytest.approx(max(expected), rel=1e-9)
    assert res.history[-1]["epsilon"] == res.epsilon
    assert res.history[-1]["epsilon_per_cluster"] == pytest.approx(expected, rel=1e-9)
    assert res.delta == delta
    # seeds are distinct per cluster: independent noise streams
    assert len({c["seed"] for c in res.extra["clusters"]}) == 3


def test_calibrated_clusters_meet_the_target(data: FederatedDataset) -> None:
    res = train_clusters(data, MultinomialLogReg(D, C), _cfg(rounds=2), GROUPS, target_epsilon=1.5)
    eps = [c["epsilon"] for c in res.extra["clusters"]]
    assert all(1.5 * 0.999 <= e <= 1.5 for e in eps)
    assert res.epsilon <= 1.5
    sigmas = [c["noise_std"] for c in res.extra["clusters"]]
    assert len(set(sigmas)) == 3  # calibrated per cluster to its own (m_c, q_c)


def test_a_clients_data_only_affects_its_own_clusters_billboard(data: FederatedDataset) -> None:
    j = 2  # in cluster 1
    tx, ty = list(data.train_x), list(data.train_y)
    tx[j] = 4.0 * tx[j] - 1.0
    ty[j] = (ty[j] + 2) % C
    other = _with_train(data, tx, ty)
    a = train_clusters(data, MultinomialLogReg(D, C), _cfg(), GROUPS)
    b = train_clusters(other, MultinomialLogReg(D, C), _cfg(), GROUPS)
    for n in a.cluster_params:
        assert torch.equal(a.cluster_params[n][0], b.cluster_params[n][0])
        assert torch.equal(a.cluster_params[n][2], b.cluster_params[n][2])
        for k in GROUPS[0] + GROUPS[2]:  # other clusters' personalized models too
            assert torch.equal(a.personalized_params[n][k], b.personalized_params[n][k])
    assert not torch.equal(
        a.cluster_params["linear.weight"][1], b.cluster_params["linear.weight"][1]
    )
    # the per-client view of the billboard is the client's cluster's
    for k in range(data.n_clients):
        c = int(a.cluster_of[k])
        assert torch.equal(
            a.global_params["linear.weight"][k], a.cluster_params["linear.weight"][c]
        )


def test_one_cluster_is_plain_pmtl(data: FederatedDataset) -> None:
    cfg = _cfg(rounds=2)
    res = train_clusters(data, MultinomialLogReg(D, C), cfg, [0] * data.n_clients)
    ref = train(data, MultinomialLogReg(D, C), dataclasses.replace(
        cfg, seed=cluster_seed(cfg.seed, 0), delta=resolve_config(cfg, data.n_clients)[0].delta))  # fmt: skip
    for n in ref.personalized_params:
        assert torch.equal(res.personalized_params[n], ref.personalized_params[n])
        assert torch.equal(res.cluster_params[n][0], ref.global_params[n])
    assert res.epsilon == ref.epsilon
    assert res.test_accuracy == ref.test_accuracy


def test_parse_clusters() -> None:
    labels = [0, 1, 1, 1, 1, 0, 2, 2, 2, 0, 2, 2]
    assert [g.tolist() for g in parse_clusters(labels, 12)] == GROUPS
    assert [g.tolist() for g in parse_clusters(GROUPS, 12)] == GROUPS
    with pytest.raises(InvalidParameterError, match="partition"):
        parse_clusters([[0, 1], [1, 2]], 3)
    with pytest.raises(InvalidParameterError, match="partition"):
        parse_clusters([[0], [2]], 3)
    with pytest.raises(InvalidParameterError, match="one entry per client"):
        parse_clusters([0, 1], 3)
