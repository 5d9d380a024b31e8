"""Joint-model DP and PP-SGD baselines: same accounting as PMTL, sensitivity, locality."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engine_defaults import old_config

from privmtl.data.federated import FederatedDataset, make_synthetic_federated
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import draw_noise, noise_generator
from privmtl.federated.baselines import config_for_epsilon, train_joint_dp, train_pp_sgd
from privmtl.federated.config import TrainConfig
from privmtl.federated.engine import train
from privmtl.federated.models import FemnistCNN, MultinomialLogReg

D, C = 4, 3


@pytest.fixture(scope="module")
def data() -> FederatedDataset:
    return make_synthetic_federated(
        n_clients=12, n_features=D, n_classes=C, samples_per_client=(20, 40), random_state=0
    )


def _cfg(**kw) -> TrainConfig:
    base = dict(
        rounds=4, clients_per_round=6, sampling="poisson", clip=0.5, lr=0.1, batch_size=10,
        lam=0.1, noise_std=0.05, progress=False, seed=0, noise_source="seeded",
    )  # fmt: skip
    base.update(kw)
    return old_config(**base)


# ----------------------------------------------------------------------------- joint-model DP
def test_joint_dp_is_far_worse_than_pmtl_at_the_same_epsilon(data: FederatedDataset) -> None:
    cfg = config_for_epsilon(_cfg(rounds=15), data.n_clients, 1.0)
    pmtl = train(data, MultinomialLogReg(D, C), cfg)
    joint = train_joint_dp(data, MultinomialLogReg(D, C), cfg)
    # Same sampler events and accountant: the same ε after every round, and it is the target.
    assert [h["epsilon"] for h in joint.history] == [h["epsilon"] for h in pmtl.history]
    assert joint.epsilon == pytest.approx(1.0, rel=1e-3)
    # z = σq/γ ≈ 2.9 here: every joint block gets noise of std zγ ≈ 1.5 per coordinate per
    # round, ≈ 5.6 after 15 rounds, against at most Tγ = 7.5 of clipped signal spread over 15
    # coordinates; PMTL's personalized models only see the billboard noise σ ≈ 0.24 on the
    # mean and reach local-training accuracy (≈ 0.86). Joint-DP is near chance (majority class
    # is 0.48 of the test set), so a 0.3 gap is a wide margin for this fixed seed.
    assert pmtl.test_accuracy >= joint.test_accuracy + 0.3
    assert joint.test_accuracy <= 0.55
    assert joint.extra["block_noise_std"] == pytest.approx(cfg.noise_std * 6)


def _with_train(ds: FederatedDataset, tx, ty) -> FederatedDataset:
    """A new dataset with other training data (fresh caches; other splits shared)."""
    return FederatedDataset(
        client_ids=ds.client_ids, train_x=tx, train_y=ty, val_x=ds.val_x, val_y=ds.val_y,
        test_x=ds.test_x, test_y=ds.test_y, n_classes=ds.n_classes,
    )  # fmt: skip


def test_joint_dp_release_touches_only_the_clients_block(data: FederatedDataset) -> None:
    """One noiseless round: replacing client j's data moves only block j, by at most 2γ."""
    cfg = _cfg(rounds=1, sampling="all", clients_per_round=12, noise_std=0.0, clip=0.05)
    j = 4
    tx = list(data.train_x)
    tx[j] = -3.0 * tx[j] + 1.0
    other = _with_train(data, tx, list(data.train_y))
    a = train_joint_dp(data, MultinomialLogReg(D, C), cfg).personalized_params
    b = train_joint_dp(other, MultinomialLogReg(D, C), cfg).personalized_params
    diff = torch.sqrt(sum((a[n] - b[n]).flatten(1).pow(2).sum(1) for n in a))
    assert float(diff[j]) > 0
    assert float(diff[j]) <= 2 * 0.05 + 1e-6
    assert torch.all(diff[torch.arange(12) != j] == 0)
    # and every block moved from the (zero) start by at most γ
    moved = torch.sqrt(sum(a[n].flatten(1).pow(2).sum(1) for n in a))
    assert float(moved.max()) <= 0.05 + 1e-6


def test_joint_dp_noise_per_block_is_z_gamma(data: FederatedDataset) -> None:
    # Tiny clip: the released blocks are (almost) pure noise of std zγ = σq per coordinate.
    cfg = _cfg(rounds=4, clip=1e-6, noise_std=0.05)
    res = train_joint_dp(data, MultinomialLogReg(D, C), cfg)
    z = 0.05 * 6 / 1e-6
    values = torch.cat([p.flatten() for p in res.personalized_params.values()])
    # 12 blocks × 15 coordinates = 180 sums of 4 rounds of N(0, (zγ)²): std 2·zγ;
    # the sample std is within ±4 standard errors (≈ 4/√360 ≈ 21%).
    assert float(values.std()) == pytest.approx(2 * z * 1e-6, rel=0.21)
    assert res.history[0]["noise_multiplier"] == pytest.approx(z)


def test_joint_dp_batched_matches_reference(data: FederatedDataset) -> None:
    a = train_joint_dp(data, MultinomialLogReg(D, C), _cfg(rounds=3))
    b = train_joint_dp(data, MultinomialLogReg(D, C), _cfg(rounds=3, batched=False))
    for n in a.personalized_params:
        torch.testing.assert_close(
            a.personalized_params[n], b.personalized_params[n], rtol=1e-4, atol=1e-5
        )
    assert a.epsilon == b.epsilon


# ----------------------------------------------------------------------------- PP-SGD
def test_pp_sgd_without_local_part_is_private_fedavg(data: FederatedDataset) -> None:
    cfg = _cfg(rounds=5)
    fedavg = train(data, MultinomialLogReg(D, C), dataclasses.replace(cfg, method="fedavg"))
    pp = train_pp_sgd(data, cfg, alpha=0.0)
    for n in fedavg.global_params:
        torch.testing.assert_close(pp.global_params[n], fedavg.global_params[n])
    assert [h["epsilon"] for h in pp.history] == [h["epsilon"] for h in fedavg.history]
    a, b = pp.accuracies["test"]["global"], fedavg.accuracies["test"]["global"]
    assert a["accuracy"] == b["accuracy"] and a["n"] == b["n"]
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)  # the params agree to float tolerance


def test_pp_sgd_batched_matches_reference(data: FederatedDataset) -> None:
    a = train_pp_sgd(data, _cfg(rounds=3), alpha=0.5, theta_reg=0.2)
    b = train_pp_sgd(data, _cfg(rounds=3, batched=False), alpha=0.5, theta_reg=0.2)
    for n in a.personalized_params:
        torch.testing.assert_close(
            a.personalized_params[n], b.personalized_params[n], rtol=1e-4, atol=1e-5
        )
    # the local part is really used
    theta = a.personalized_params["linear.weight"] - a.global_params["linear.weight"]
    assert float(theta.abs().max()) > 1e-3


def _trace(data, cfg, theta_init=None):
    seen: list[dict] = []
    train_pp_sgd(data, cfg, alpha=1.0, theta_init=theta_init, observer=seen.append)
    return seen


def test_pp_sgd_server_sees_only_shared_updates(data: FederatedDataset) -> None:
    """The server's input is the shared-part updates; its release is a function of them only."""
    cfg = _cfg(rounds=2, clip=0.05)
    seen = _trace(data, cfg)
    shapes = {n: p.shape for n, p in MultinomialLogReg(D, C).named_parameters()}
    gen = noise_generator(cfg.seed)
    prev = {n: torch.zeros(s) for n, s in shapes.items()}
    for rec in seen:
        k = len(rec["sampled"])
        assert set(rec["messages"]) == set(shapes)
        for n, g in rec["messages"].items():
            assert tuple(g.shape) == (k, *shapes[n])
        norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in rec["messages"].values()))
        fac = torch.clamp(0.05 / norms, max=1.0)
        noise = draw_noise(prev, cfg.noise_std, gen)
        for n in shapes:
            expect = prev[n] + torch.tensordot(fac, rec["messages"][n], dims=1) / 6 + noise[n]
            torch.testing.assert_close(rec["released"][n], expect)
        prev = rec["released"]


def test_pp_sgd_local_part_influences_only_its_own_message(data: FederatedDataset) -> None:
    """Changing client k's Θ_k (never sent) changes round 0 only through k's clipped message.

    (The released sequence cannot be independent of Θ_k: client k's shared gradient is taken at
    W + Θ_k. What must hold is that Θ_k itself never reaches the server and that its effect on the
    release is bounded by the clipping of k's own message.)
    """
    cfg = _cfg(rounds=1, clip=10.0, noise_std=0.0)
    base = _trace(data, cfg)[0]
    k = int(base["sampled"][0])
    m = data.n_clients
    init = {
        "linear.weight": torch.zeros(m, C, D),
        "linear.bias": torch.zeros(m, C),
    }
    init["linear.weight"][k] = 5.0
    alt = _trace(data, cfg, theta_init=init)[0]
    assert alt["sampled"].tolist() == base["sampled"].tolist()
    for n in base["messages"]:
        a, b = base["messages"][n], alt["messages"][n]
        assert torch.equal(a[1:], b[1:])  # the other clients' messages are unchanged
        assert not torch.equal(a[0], b[0])
        # release moved by exactly client k's (unclipped, clip=10) message change / q
        torch.testing.assert_close(alt["released"][n] - base["released"][n], (b[0] - a[0]) / 6)


def test_pp_sgd_same_epsilon_as_pmtl_and_rejects_nonlinear(data: FederatedDataset) -> None:
    cfg = config_for_epsilon(_cfg(rounds=3), data.n_clients, 2.0)
    assert cfg.noise_std > 0
    pp = train_pp_sgd(data, cfg)
    assert pp.epsilon == pytest.approx(2.0, rel=1e-3)
    assert pp.extra["method"] == "pp-sgd"
    with pytest.raises(InvalidParameterError, match="linear"):
        train_pp_sgd(data, cfg, model=FemnistCNN(n_classes=3))  # type: ignore[arg-type]
