"""Server optimizers after the noise, partial sharing, vectorised scoring of many clients."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
import torch
from engine_defaults import old_config

from privmtl.data.federated import FederatedDataset
from privmtl.exceptions import InvalidParameterError
from privmtl.federated import MultinomialLogReg
from privmtl.federated.protocol import Trainer
from privmtl.federated.scoring import client_scores
from privmtl.federated.server_optim import ServerOptimizer
from privmtl.privacy.noise import SeededNoise
from privmtl.privacy.release import clipped_mean

BASE: dict[str, Any] = {
    "rounds": 3,
    "clients_per_round": 4,
    "clip": 0.5,
    "noise_std": 0.3,
    "lam": 0.5,
    "progress": False,
    "threads": 1,
    "noise_source": "seeded",
    "sampling": "fixed",
    "relation": "replace-one",
}


def _model(ds: FederatedDataset) -> MultinomialLogReg:
    return MultinomialLogReg(ds.n_features, ds.n_classes)


# ------------------------------------------------------------------- server optimizer
class _Spy(ServerOptimizer):
    def __init__(self, **kw: Any) -> None:
        super().__init__("momentum", **kw)
        self.seen: list[dict[str, torch.Tensor]] = []

    def step(self, released: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.seen.append({n: r.clone() for n, r in released.items()})
        return super().step(released)


def test_server_optimizer_sees_only_the_noised_mean(tabular: FederatedDataset) -> None:
    cfg = old_config(**BASE, server_optimizer="momentum")
    seen_messages: list[dict[str, torch.Tensor]] = []

    def hook(t: int, sampled: np.ndarray, msgs: dict[str, torch.Tensor]) -> Any:
        seen_messages.append({n: p.clone() for n, p in msgs.items()})
        return msgs

    tr = Trainer(tabular, _model(tabular), cfg, message_hook=hook)
    spy = _Spy(lr=1.0, momentum=0.9)
    tr.curator.optimizer = spy
    tr.run()
    # an independent replay of the server noise stream: SeededNoise(seed, (2,)), one draw per
    # parameter in message order, std σ
    noise = SeededNoise(0, (2,))
    assert len(spy.seen) == 3
    for msgs, got in zip(seen_messages, spy.seen, strict=True):
        mean, _, _ = clipped_mean(msgs, 0.5, 4.0)
        draws = noise.normal_like(mean, 0.3)
        for n in mean:
            assert torch.allclose(got[n], mean[n] + draws[n], atol=1e-6)
            # the un-noised mean differs from what the optimizer saw by the noise (σ√d ≫ 0)
            assert (got[n] - mean[n]).norm() > 0.1 * math.sqrt(mean[n].numel()) * 0.3


def test_momentum_billboard_is_the_momentum_of_the_releases(tabular: FederatedDataset) -> None:
    cfg = old_config(**BASE, server_optimizer="momentum", server_lr=0.5, server_momentum=0.8)
    tr = Trainer(tabular, _model(tabular), cfg)
    board0 = {n: p.clone() for n, p in tr.curator.billboard.items()}
    released = []
    orig = tr.curator.release_mechanism.release

    def capture(*a: Any, **k: Any) -> Any:
        out = orig(*a, **k)
        released.append({n: v.clone() for n, v in out.value.items()})
        return out

    object.__setattr__(tr.curator.release_mechanism, "release", capture)
    tr.run()
    v = {n: torch.zeros_like(p) for n, p in board0.items()}
    expect = {n: p.clone() for n, p in board0.items()}
    for r in released:
        for n in v:
            v[n] = 0.8 * v[n] + r[n]
            expect[n] = expect[n] + 0.5 * v[n]
    for n in expect:
        assert torch.allclose(tr.curator.billboard[n], expect[n], atol=1e-6)


def test_adam_step_matches_formula() -> None:
    opt = ServerOptimizer("adam", lr=0.1, momentum=0.9, beta2=0.99, eps=1e-3)
    r1, r2 = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.0])
    opt.step({"w": r1})
    inc = opt.step({"w": r2})["w"]
    m = 0.9 * (0.1 * r1) + 0.1 * r2
    v = 0.99 * (0.01 * r1**2) + 0.01 * r2**2
    assert torch.allclose(inc, 0.1 * m / (v.sqrt() + 1e-3))


def test_server_optimizer_costs_no_privacy(tabular: FederatedDataset) -> None:
    plain = Trainer(tabular, _model(tabular), old_config(**BASE)).run()
    adam = Trainer(tabular, _model(tabular), old_config(**BASE, server_optimizer="adam")).run()
    assert plain.epsilon == adam.epsilon and math.isfinite(plain.epsilon)
    assert not torch.equal(
        plain.global_params["linear.weight"], adam.global_params["linear.weight"]
    )


def test_server_optimizer_refused_for_replace_billboards() -> None:
    with pytest.raises(InvalidParameterError, match="server_optimizer"):
        old_config(method="local", server_optimizer="adam")
    with pytest.raises(InvalidParameterError, match="server_optimizer"):
        old_config(server_optimizer="sgd")


# ------------------------------------------------------------------- partial sharing
def test_partial_sharing_releases_only_shared_dimension_at_the_same_epsilon(
    tabular: FederatedDataset,
) -> None:
    full = Trainer(tabular, _model(tabular), old_config(**BASE))
    part = Trainer(tabular, _model(tabular), old_config(**BASE, shared_params=("linear.bias",)))
    shapes: list[list[str]] = []
    orig = part.curator.release

    def spy(messages: dict[str, torch.Tensor], rows: Any = None) -> Any:
        shapes.append(sorted(messages))
        return orig(messages, rows)

    part.curator.release = spy  # type: ignore[method-assign]
    r_full, r_part = full.run(), part.run()
    assert shapes == [["linear.bias"]] * 3
    assert sorted(part.curator.billboard) == ["linear.bias"]
    # the released dimension (4 vs 36) does not change the accounting
    assert r_part.epsilon == r_full.epsilon and math.isfinite(r_part.epsilon)
    assert r_part.ledger is not None and r_full.ledger is not None
    assert r_part.ledger.history == r_full.ledger.history
    # the global model completes the shared part with the initial personal part
    assert torch.equal(r_part.global_params["linear.weight"], torch.zeros(4, 8))


def test_personal_layers_are_untouched_by_the_billboard(tabular: FederatedDataset) -> None:
    """With one local step per round the personal layer's step is the plain gradient at the
    client's own model: enormous billboard noise must not move it (it would through a prox pull)."""
    kw = {**BASE, "local_steps": 1, "shared_params": ("linear.weight",), "sampling": "all"}
    kw["clients_per_round"] = None  # every client: q = m
    quiet = Trainer(tabular, _model(tabular), old_config(**{**kw, "noise_std": 0.0})).run()
    loud = Trainer(tabular, _model(tabular), old_config(**{**kw, "noise_std": 1e3})).run()
    assert quiet.personalized_params is not None and loud.personalized_params is not None
    qb, lb = quiet.personalized_params["linear.bias"], loud.personalized_params["linear.bias"]
    qw, lw = quiet.personalized_params["linear.weight"], loud.personalized_params["linear.weight"]
    # the shared layer is pulled to the (noisy) billboard ...
    assert (qw - lw).abs().max() > 1.0
    # ... the personal one is not; it only feels the shared layer through the loss
    # (the gradient of round t is taken at the client's model of round t)
    full_q = Trainer(
        tabular,
        _model(tabular),
        old_config(**{**kw, "shared_params": None, "noise_std": 0.0}),
    )
    full_l = Trainer(
        tabular,
        _model(tabular),
        old_config(**{**kw, "shared_params": None, "noise_std": 1e3}),
    )
    fq, fl = full_q.run(), full_l.run()
    assert fq.personalized_params is not None and fl.personalized_params is not None
    full_gap = fq.personalized_params["linear.bias"] - fl.personalized_params["linear.bias"]
    part_gap = qb - lb
    assert full_gap.abs().max() > 100 * part_gap.abs().max()


def test_partial_sharing_refuses_unknown_names(tabular: FederatedDataset) -> None:
    with pytest.raises(InvalidParameterError, match="shared_params"):
        Trainer(tabular, _model(tabular), old_config(**BASE, shared_params=("conv1",)))
    with pytest.raises(InvalidParameterError, match="shared_params"):
        old_config(method="fedavg", shared_params=("linear.weight",))


# ------------------------------------------------------------------- scoring many clients
def test_vectorised_scores_equal_the_client_loop(tabular: FederatedDataset) -> None:
    net = _model(tabular)
    gen = torch.Generator().manual_seed(0)
    params = {
        n: torch.randn((tabular.n_clients, *p.shape), generator=gen)
        for n, p in net.named_parameters()
    }
    xs, ys = tabular.split("test")
    loop = client_scores(net, params, {}, xs, ys, clients_together=1)
    grouped = client_scores(net, params, {}, xs, ys, clients_together=5)
    np.testing.assert_array_equal(loop[0], grouped[0])
    np.testing.assert_allclose(loop[1], grouped[1], rtol=1e-5)


# ------------------------------------------------------------------- cold start
def test_billboard_personal_init(tabular: FederatedDataset) -> None:
    kw = {**BASE, "clients_per_round": 2, "rounds": 2, "noise_std": 0.0}
    tr = Trainer(tabular, _model(tabular), old_config(**kw, personal_init="billboard"))
    tr.run()
    joined = tr.clients.written(torch.arange(tabular.n_clients))
    sampled = {k for rec in tr.history for k in rec["sampled"]}
    assert set(torch.nonzero(joined).flatten().tolist()) == sampled
    never = int(torch.nonzero(~joined)[0])
    board = tr.curator.billboard
    assert any(p.abs().sum() > 0 for p in board.values())
    # a new client starts from the billboard, a returning one from its own model
    old = int(torch.nonzero(joined)[0])
    starts, _ = tr.method.starts(board, torch.tensor([never, old]), tr.clients)
    res = tr.result()
    assert res.personalized_params is not None
    stored = tr.clients.dense("personal")
    for n, b in board.items():
        assert torch.equal(starts[n][0], b)
        assert torch.equal(starts[n][1], stored[n][old])
        # clients that never took part are scored with the billboard
        assert torch.equal(res.personalized_params[n][never], b)
        assert not torch.equal(stored[n][never], b)


@pytest.mark.parametrize(
    ("noise_std", "subspace_dim", "shared"),
    [
        (0.0, None, None),
        (0.01, None, None),
        (0.3, None, None),
        (0.3, 2, None),
        (0.05, None, ("linear.bias",)),
        (0.3, None, ("linear.bias",)),
    ],
)
def test_auto_personal_init_compares_the_noise_norm_with_the_clip(
    tabular: FederatedDataset, noise_std: float, subspace_dim: int | None, shared: Any
) -> None:
    model = _model(tabular)
    kw = {**BASE, "noise_std": noise_std, "subspace_dim": subspace_dim, "shared_params": shared}
    tr = Trainer(tabular, model, old_config(**kw, personal_init="auto"))
    # independent oracle: sigma * sqrt(released coordinates) against the clip
    names = [n for n, _ in model.named_parameters() if shared is None or n in shared]
    dim = subspace_dim or sum(dict(model.named_parameters())[n].numel() for n in names)
    expected = "billboard" if noise_std * math.sqrt(dim) <= BASE["clip"] else "model"
    assert tr.config.personal_init == expected
    assert tr.method.joins_billboard == (expected == "billboard")
    assert tr.run().config.personal_init == expected


# ------------------------------------------------------------------- random subspace
def test_subspace_release_changes_k_coordinates_per_round_at_the_same_epsilon(
    tabular: FederatedDataset,
) -> None:
    full = Trainer(tabular, _model(tabular), old_config(**BASE)).run()
    tr = Trainer(tabular, _model(tabular), old_config(**BASE, subspace_dim=5))
    before = torch.cat([p.flatten() for p in tr.curator.billboard.values()])
    tr.step()
    after = torch.cat([p.flatten() for p in tr.curator.billboard.values()])
    assert int((after != before).sum()) == 5
    assert tr.history[0]["released_dim"] == 5
    sub = Trainer(tabular, _model(tabular), old_config(**BASE, subspace_dim=5)).run()
    assert sub.ledger is not None and full.ledger is not None
    assert sub.ledger.history == full.ledger.history and math.isfinite(sub.epsilon)
    assert [r["event"] for r in sub.ledger.records] == [r["event"] for r in full.ledger.records]


# ------------------------------------------------------------------- adaptive clipping
ADAPT: dict[str, Any] = {**BASE, "adaptive_clip_quantile": 0.5, "adaptive_clip_noise": 1.0}


def test_adaptive_clip_each_release_is_clipped_with_the_clip_it_is_accounted_with(
    tabular: FederatedDataset,
) -> None:
    direction = {"linear.weight": torch.ones(4, 8), "linear.bias": torch.ones(4)}

    def huge(t: int, sampled: np.ndarray, msgs: dict[str, torch.Tensor]) -> Any:
        # every message is far above any clip, in the same direction: the mean's norm is the clip
        return {n: direction[n].expand_as(p) * 100.0 for n, p in msgs.items()}

    cfg = old_config(**{**ADAPT, "noise_std": 1e-9, "rounds": 5})
    tr = Trainer(tabular, _model(tabular), cfg, message_hook=huge)
    res = tr.run()
    assert res.ledger is not None
    clips = [r["params"]["clip"] for r in res.ledger.records]
    assert clips == [h["clip"] for h in res.history]
    assert clips[0] == 0.5 and len(set(clips)) == 5  # every message clipped: the clip grows
    assert all(b > a for a, b in itertools.pairwise(clips))
    for h, c in zip(res.history, clips, strict=True):
        assert h["signal_norm"] == pytest.approx(h["n_sampled"] * c / 4, rel=1e-6)
    # the mean's noise multiplier stays fixed: σ follows the clip
    ratios = [r["params"]["noise_std"] / r["params"]["clip"] for r in res.ledger.records]
    assert max(ratios) == pytest.approx(min(ratios), rel=1e-12)
    assert all(r["mechanism"] == "gaussian-mean+count" for r in res.ledger.records)


def test_adaptive_clip_costs_its_count_and_meets_an_epsilon_target(
    tabular: FederatedDataset,
) -> None:
    from privmtl.federated import config_for_epsilon

    plain = Trainer(tabular, _model(tabular), old_config(**BASE)).run()
    adapt = Trainer(tabular, _model(tabular), old_config(**ADAPT)).run()
    assert adapt.epsilon > plain.epsilon * 1.01  # same σ on the mean, plus the count
    base = old_config(**{**ADAPT, "noise_std": 0.0, "adaptive_clip_noise": 3.0})
    cfg = config_for_epsilon(base, tabular.n_clients, 2.0)
    ref = config_for_epsilon(old_config(**{**BASE, "noise_std": 0.0}), tabular.n_clients, 2.0)
    assert cfg.noise_std > ref.noise_std  # the mean pays for the count
    res = Trainer(tabular, _model(tabular), cfg).run()
    assert res.epsilon == pytest.approx(2.0, rel=1e-6)


def test_adaptive_clip_state_survives_a_checkpoint(tabular: FederatedDataset) -> None:
    cfg = old_config(**{**ADAPT, "rounds": 4})
    whole = Trainer(tabular, _model(tabular), cfg).run()
    first = Trainer(tabular, _model(tabular), cfg)
    first.step()
    first.step()
    second = Trainer(tabular, _model(tabular), cfg)
    second.load_state_dict(first.state_dict())
    assert second.curator.release_mechanism.clip == first.curator.release_mechanism.clip != 0.5
    res = second.run()
    assert [h["clip"] for h in res.history] == [h["clip"] for h in whole.history]
    torch.testing.assert_close(res.global_params, whole.global_params)


def test_subspace_and_adaptive_clip_refused_where_they_do_not_apply() -> None:
    with pytest.raises(InvalidParameterError, match="subspace_dim"):
        old_config(method="local", subspace_dim=3)
    with pytest.raises(InvalidParameterError, match="adaptive_clip_quantile"):
        old_config(adaptive_clip_quantile=1.5)
    with pytest.raises(InvalidParameterError, match="adaptive_clip_quantile"):
        old_config(clip=None, adaptive_clip_quantile=0.5)
