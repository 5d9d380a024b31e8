"""Random-subspace releases and the noisy count of adaptive clipping: values and accounting."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.rdp import RdpAccountant

from privmtl.exceptions import InvalidParameterError
from privmtl.privacy.ledger import PrivacyLedger
from privmtl.privacy.noise import SeededNoise
from privmtl.privacy.release import (
    AdaptiveClip,
    GaussianMeanRelease,
    combined_noise_multiplier,
    mean_multiplier_for,
)
from privmtl.privacy.sampling import make_sampler

#: The ledger's RDP orders (integers: dp-accounting drops fractional orders below 2 at small z).
ORDERS = [float(a) for a in range(2, 65)] + [80.0, 96.0, 128.0, 192.0, 256.0, 512.0, 1024.0]


def _updates(k: int, seed: int = 0, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": scale * torch.randn((k, 6, 5), generator=g, dtype=torch.float64),
        "b": scale * torch.randn((k, 4), generator=g, dtype=torch.float64),
    }


def _flat(p: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.flatten() for t in p.values()])


def _oracle_epsilon(z: float, rate: float, rounds: int, delta: float) -> float:
    """ε of ``rounds`` Poisson-sampled Gaussian releases, straight from dp-accounting."""
    acc = RdpAccountant(orders=ORDERS)
    event = dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(z))
    acc.compose(dp_accounting.SelfComposedDpEvent(event, rounds))
    return float(acc.get_epsilon(delta))


# ------------------------------------------------------------------------- random subspace
def test_subspace_release_keeps_the_event_and_the_epsilon_of_the_full_release() -> None:
    sampler = make_sampler("poisson", 50, 10)
    full = GaussianMeanRelease(clip=0.5, noise_std=0.05, sampler=sampler)
    sub = GaussianMeanRelease(clip=0.5, noise_std=0.05, sampler=sampler, subspace_dim=7)
    assert sub.event() == full.event()
    ledgers = [PrivacyLedger(delta=1e-3), PrivacyLedger(delta=1e-3)]
    for t in range(4):
        for rel, ledger in zip((full, sub), ledgers, strict=True):
            rel.release(_updates(3, seed=t), SeededNoise(t), ledger=ledger, round=t)
    assert ledgers[0].epsilon() == ledgers[1].epsilon()
    assert [r["event"] for r in ledgers[0].records] == [r["event"] for r in ledgers[1].records]
    assert ledgers[1].records[0]["params"]["subspace_dim"] == 7
    assert ledgers[1].epsilon() == pytest.approx(_oracle_epsilon(0.05 * 10 / 0.5, 0.2, 4, 1e-3))


def test_subspace_release_is_the_projected_clipped_mean_plus_k_noise_draws_lifted_back() -> None:
    upd = _updates(3, seed=1)
    sampler = make_sampler("fixed", 10, 5)
    rel = GaussianMeanRelease(clip=1.0, noise_std=0.2, sampler=sampler, subspace_dim=9)
    clean = GaussianMeanRelease(clip=1.0, noise_std=0.0, sampler=sampler).release(
        upd, SeededNoise(0)
    )
    out = rel.release(upd, SeededNoise(4), round=3)
    idx = rel.subspace(3, 34)
    assert len(idx) == 9 and len(set(idx.tolist())) == 9
    value, mean = _flat(out.value), _flat(clean.value)
    off = np.setdiff1d(np.arange(34), idx)
    assert torch.all(value[off] == 0)
    noise = SeededNoise(4).normal((9,), 0.2, dtype=torch.float64)
    torch.testing.assert_close(value[idx], mean[idx] + noise)
    assert out.details["released_dim"] == 9
    assert out.details["signal_norm"] == pytest.approx(float(mean[idx].norm()))
    assert out.details["full_signal_norm"] == pytest.approx(float(mean.norm()))
    assert out.details["noise_norm"] == pytest.approx(float(noise.norm()))


def test_the_subspace_is_public_fresh_every_round_and_reproducible() -> None:
    rel = GaussianMeanRelease(
        clip=1.0, noise_std=0.1, sampler=make_sampler("all", 5, 5), subspace_dim=20
    )
    a, b = rel.subspace(0, 1000), rel.subspace(1, 1000)
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(a, rel.subspace(0, 1000))
    # coordinate frequencies over many rounds are uniform (each has probability k/d per round)
    counts = np.bincount(np.concatenate([rel.subspace(t, 50) for t in range(500)]), minlength=50)
    assert counts.min() > 0.5 * 500 * 20 / 50 and counts.max() < 1.5 * 500 * 20 / 50
    with pytest.raises(InvalidParameterError, match="subspace_dim"):
        rel.subspace(0, 10)
    with pytest.raises(InvalidParameterError, match="round"):
        rel.subspace(None, 1000)


def test_subspace_sensitivity_stays_clip_over_q() -> None:
    """Adding one client with a huge message moves the projected mean by at most γ/q."""
    sampler = make_sampler("fixed", 20, 4)
    rel = GaussianMeanRelease(clip=0.7, noise_std=0.0, sampler=sampler, subspace_dim=5)
    base = _updates(3, seed=2)
    worst = 0.0
    for seed in range(20):
        extra = _updates(1, seed=100 + seed, scale=50.0)
        both = {n: torch.cat([base[n], extra[n]]) for n in base}
        a = _flat(rel.release(base, SeededNoise(0), round=seed).value)
        b = _flat(rel.release(both, SeededNoise(0), round=seed).value)
        worst = max(worst, float((a - b).norm()))
    assert 0 < worst <= 0.7 / 4 + 1e-12


# ------------------------------------------------------------------ adaptive clipping count
def test_count_is_accounted_jointly_with_the_mean_and_recorded_in_the_ledger() -> None:
    sampler = make_sampler("poisson", 50, 10)
    z, sigma_b = 1.5, 2.0
    plain = GaussianMeanRelease(clip=0.5, noise_std=z * 0.5 / 10, sampler=sampler)
    counted = GaussianMeanRelease(
        clip=0.5, noise_std=z * 0.5 / 10, sampler=sampler, count_noise_std=sigma_b
    )
    z_joint = (z**-2 + (2 * sigma_b) ** -2) ** -0.5
    assert counted.event_multiplier == pytest.approx(z_joint)
    ledger, ref = PrivacyLedger(delta=1e-3), PrivacyLedger(delta=1e-3)
    for t in range(5):
        counted.release(_updates(4, seed=t), SeededNoise(t), ledger=ledger, round=t)
        plain.release(_updates(4, seed=t), SeededNoise(t), ledger=ref, round=t)
    rec = ledger.records[-1]
    assert rec["mechanism"] == "gaussian-mean+count"
    assert rec["params"]["count_noise_std"] == sigma_b
    assert rec["params"]["combined_noise_multiplier"] == pytest.approx(z_joint)
    # ε is that of one Poisson-sampled Gaussian with the joint multiplier per round ...
    assert ledger.epsilon() == pytest.approx(_oracle_epsilon(z_joint, 0.2, 5, 1e-3), rel=1e-9)
    # ... larger than the mean alone, and larger than two independently amplified events
    assert ledger.epsilon() > ref.epsilon() * 1.01
    separate = RdpAccountant(orders=ORDERS)
    for zz in (z, 2 * sigma_b):
        ev = dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(zz))
        separate.compose(dp_accounting.SelfComposedDpEvent(ev, 5))
    assert ledger.epsilon() >= separate.get_epsilon(1e-3) - 1e-9


def test_count_estimates_the_fraction_of_unclipped_messages() -> None:
    upd = _updates(8, seed=3)
    norms = torch.cat([t.flatten(1) for t in upd.values()], 1).norm(dim=1)
    clip = float(norms.median())
    rel = GaussianMeanRelease(
        clip=clip, noise_std=0.0, sampler=make_sampler("fixed", 20, 8), count_noise_std=1e-9
    )
    out = rel.release(upd, SeededNoise(0))
    assert out.details["unclipped_fraction"] == pytest.approx(
        float((norms <= clip).double().mean())
    )
    noisy = GaussianMeanRelease(
        clip=clip, noise_std=0.0, sampler=rel.sampler, count_noise_std=3.0
    ).release(upd, SeededNoise(0))
    draw = float(SeededNoise(0).normal((1,), 3.0, dtype=torch.float64)[0])
    assert noisy.details["unclipped_fraction"] == pytest.approx(
        float((norms <= clip).double().mean()) + draw / 8
    )


def test_mean_multiplier_for_inverts_the_combination_and_refuses_too_little_count_noise() -> None:
    z = mean_multiplier_for(1.2, 2.0)
    assert combined_noise_multiplier(z, 4.0) == pytest.approx(1.2)
    assert z > 1.2
    with pytest.raises(InvalidParameterError, match="adaptive_clip_noise"):
        mean_multiplier_for(1.2, 0.5)


def test_adaptive_clip_moves_geometrically_towards_the_quantile() -> None:
    rule = AdaptiveClip(quantile=0.5, lr=0.2)
    assert rule.next_clip(1.0, 0.9) == pytest.approx(math.exp(-0.2 * 0.4))
    assert rule.next_clip(1.0, 0.1) == pytest.approx(math.exp(0.2 * 0.4))
    assert rule.next_clip(2.0, 0.5) == 2.0
    with pytest.raises(InvalidParameterError, match="adaptive_clip_quantile"):
        AdaptiveClip(quantile=1.0)
