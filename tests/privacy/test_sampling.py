import dp_accounting
import numpy as np
import pytest

from privmtl.exceptions import InvalidParameterError
from privmtl.privacy import make_sampler


def test_poisson_counts_follow_binomial():
    m, q, rounds = 200, 20, 4000
    s = make_sampler("poisson", m, q)
    rng = np.random.default_rng(0)
    counts = np.array([s.sample(rng).size for _ in range(rounds)])
    p = q / m
    se = np.sqrt(m * p * (1 - p) / rounds)
    assert abs(counts.mean() - q) < 4 * se
    assert counts.var() == pytest.approx(m * p * (1 - p), rel=0.1)
    # every client is equally likely
    hits = np.zeros(m)
    for _ in range(2000):
        hits[s.sample(rng)] += 1
    assert abs(hits.mean() / 2000 - p) < 0.005


def test_fixed_and_all_sizes_and_events():
    rng = np.random.default_rng(1)
    fixed = make_sampler("fixed", 50, 7)
    idx = fixed.sample(rng)
    assert idx.size == 7 and np.unique(idx).size == 7 and np.all(np.diff(idx) > 0)
    assert isinstance(fixed.event(1.0), dp_accounting.SampledWithoutReplacementDpEvent)
    assert isinstance(
        make_sampler("poisson", 50, 7).event(1.0), dp_accounting.PoissonSampledDpEvent
    )
    full = make_sampler("all", 50)
    assert np.array_equal(full.sample(rng), np.arange(50))
    assert full.event(2.0) == dp_accounting.GaussianDpEvent(2.0)


def test_bad_sampler_parameters():
    with pytest.raises(InvalidParameterError, match="clients_per_round"):
        make_sampler("poisson", 10, 11)
    with pytest.raises(InvalidParameterError, match="sampling"):
        make_sampler("uniform", 10, 5)
    with pytest.raises(InvalidParameterError, match="clients_per_round"):
        make_sampler("all", 10, 5)
