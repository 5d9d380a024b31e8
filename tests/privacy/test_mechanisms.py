import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from privmtl.exceptions import InvalidParameterError
from privmtl.privacy import (
    clip_columns,
    clip_rows,
    plan_covariance_releases,
    symmetric_gaussian_noise,
    wishart_noise,
    wishart_support_mismatch,
)


def test_clipping_scales_long_vectors_exactly_and_keeps_short_ones():
    W = np.array([[3.0, 0.1], [4.0, 0.2]])  # column norms 5 and ~0.22
    C = clip_columns(W, 1.0)
    assert np.linalg.norm(C[:, 0]) == pytest.approx(1.0)
    assert np.allclose(C[:, 0], W[:, 0] / 5)
    assert np.array_equal(C[:, 1], W[:, 1])
    assert np.allclose(clip_rows(W.T, 1.0), C.T)
    with pytest.raises(InvalidParameterError, match="clip"):
        clip_columns(W, 0.0)


def test_symmetric_gaussian_noise_moments():
    rng = np.random.default_rng(0)
    d, std, n = 6, 2.5, 4000
    samples = np.stack([symmetric_gaussian_noise(d, std, rng) for _ in range(n)])
    assert np.array_equal(samples, np.swapaxes(samples, 1, 2))
    iu = np.triu_indices(d)
    entries = samples[:, iu[0], iu[1]].ravel()
    # chi-square 99.9% band for the variance of N = n*d(d+1)/2 i.i.d. normals
    N = entries.size
    lo, hi = stats.chi2.ppf([0.0005, 0.9995], N - 1) / (N - 1)
    assert lo * std**2 <= entries.var(ddof=1) <= hi * std**2
    assert abs(entries.mean()) < 4 * std / math.sqrt(N)


def test_wishart_noise_mean_matches_theory():
    rng = np.random.default_rng(1)
    d, scale, n = 4, 0.3, 20000
    mean = sum(wishart_noise(d, scale, rng) for _ in range(n)) / n
    # E[E] = nu * V = (d+1) * scale * I; entry std of the mean ~ scale*sqrt(2(d+1))/sqrt(n)
    tol = 5 * scale * math.sqrt(2 * (d + 1)) / math.sqrt(n)
    assert np.allclose(mean, (d + 1) * scale * np.eye(d), atol=tol)


@pytest.mark.parametrize("eps_t", [0.3, 1.0])
def test_wishart_support_mismatch_rate_is_one_minus_exp_minus_eps(eps_t):
    """SPEC §4: with w = 0 vs ‖w'‖ = K, Σ̃ + E is impossible under the neighbour at rate
    exactly 1 − e^{−ε_t}. Sampled with a fixed seed; the band is a 4.5-sigma binomial interval."""
    rng = np.random.default_rng(7)
    d, K, n = 5, 2.0, 6000
    w = np.zeros(d)
    w[0] = K
    scale = K**2 / (2 * eps_t)
    hits = sum(wishart_support_mismatch(wishart_noise(d, scale, rng), w) for _ in range(n))
    p = 1 - math.exp(-eps_t)
    assert abs(hits / n - p) < 4.5 * math.sqrt(p * (1 - p) / n)


def test_wishart_schedule_reports_real_delta():
    s = plan_covariance_releases(
        noise="wishart", epsilon=1.0, delta=1e-3, iterations=5, clip=1.0, dim=3
    )
    g = s.guarantee
    assert not g.valid and g.accountant == "kairouz-cb"
    assert g.delta >= 0.1
    assert g.delta == pytest.approx(1 - math.exp(-sum(s.per_release)))
    assert g.epsilon <= 1.0 + 1e-9


def test_gaussian_schedule_limits():
    rng = np.random.default_rng(3)
    W = rng.standard_normal((4, 30))
    cov = W @ W.T
    # non-private: identity map
    s0 = plan_covariance_releases(epsilon=None, delta=1e-3, iterations=2, clip=1.0, dim=4)
    assert np.array_equal(s0.release(0, cov, rng), cov)
    assert s0.guarantee.epsilon == math.inf
    # calibrated: reported epsilon matches target
    s = plan_covariance_releases(epsilon=0.01, delta=1e-3, iterations=2, clip=1.0, dim=4)
    assert 0.0099 <= s.guarantee.epsilon <= 0.01
    # high noise: after the eigenvalue shift the release is PSD and dominated by a multiple of I,
    # so the MP-MTL projection tends to the identity (single-task learning)
    loud = dataclasses.replace(s, per_release=(1e6, 1e6))
    vals = np.linalg.eigvalsh(loud.release(1, cov, rng))
    assert vals.min() >= 0
    assert vals.min() > 1e3 * np.linalg.eigvalsh(cov).max()
    # moderate noise, eigen_fix='none' leaves the noise unbiased: mean over draws ≈ cov
    s2 = plan_covariance_releases(
        epsilon=5.0, delta=1e-3, iterations=1, clip=1.0, dim=4, eigen_fix="none"
    )
    mean = sum(s2.release(0, cov, rng) for _ in range(4000)) / 4000
    assert np.allclose(mean, cov, atol=5 * s2.per_release[0] / math.sqrt(4000))


def test_denoise_fix_removes_the_noise_floor_but_keeps_strong_directions():
    rng = np.random.default_rng(11)
    d = 20
    u = np.zeros(d)
    u[0] = 1.0
    cov = 1e4 * np.outer(u, u)  # one strong direction
    s = plan_covariance_releases(
        epsilon=1.0, delta=1e-3, iterations=1, clip=1.0, dim=d, eigen_fix="denoise"
    )
    s = dataclasses.replace(s, per_release=(20.0,))  # ‖E‖₂ ≈ 2·20·√20 ≈ 179 ≪ 1e4
    vals, vecs = np.linalg.eigh(s.release(0, cov, rng))
    # noise-only directions fall below 2σ√d and are zeroed; the signal survives, shrunk by ≈ 2σ√d
    assert np.sum(vals > 1e-9 * vals.max()) == 1
    assert abs(vecs[0, -1]) > 0.99
    assert vals[-1] == pytest.approx(1e4 - 2 * 20 * math.sqrt(d), rel=0.05)
