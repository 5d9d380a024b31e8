import numpy as np
import pytest
import torch
from scipy import stats

from privmtl.exceptions import InvalidParameterError
from privmtl.privacy.noise import (
    SecureNoise,
    SeededNoise,
    make_noise_source,
    seeded_torch_generator,
)


def test_secure_noise_is_gaussian_with_the_requested_std():
    # KS test against N(0, 1.5^2): the secure source cannot be seeded, so the threshold is set for
    # a false-alarm probability of 1e-6 (a broken sampler, e.g. uniform or std off by 10%, fails).
    x = SecureNoise().normal_numpy((40_000,), 1.5)
    assert stats.kstest(x / 1.5, "norm").pvalue > 1e-6
    assert abs(x.std() - 1.5) < 1.5 * 5 / np.sqrt(2 * 40_000)  # 5 standard errors of the std


def test_secure_noise_differs_between_sources_and_is_never_serialized():
    a, b = SecureNoise(), SecureNoise()
    assert not torch.equal(a.normal((64,), 1.0), b.normal((64,), 1.0))
    state = a.state_dict()
    assert state == {"kind": "secure"}
    with pytest.raises(InvalidParameterError, match="seeded"):
        a.load_state_dict(SeededNoise(0).state_dict())


def test_seeded_noise_is_the_documented_torch_stream_and_resumes_exactly():
    gen = seeded_torch_generator(7, (2,))
    expected = torch.randn((3, 4), generator=gen, dtype=torch.float64) * 0.5
    src = SeededNoise(7)
    assert torch.equal(src.normal((3, 4), 0.5, dtype=torch.float64), expected)
    state = src.state_dict()
    nxt = src.normal((5,), 1.0)
    other = SeededNoise(7)
    other.load_state_dict(state)
    assert torch.equal(other.normal((5,), 1.0), nxt)


def test_numpy_seeded_noise_matches_its_generator():
    src = SeededNoise.from_numpy(np.random.default_rng(3))
    got = src.normal_numpy((4,), 2.0)
    assert np.array_equal(got, np.random.default_rng(3).standard_normal(4) * 2.0)


def test_make_noise_source_validates():
    assert make_noise_source("secure").kind == "secure"
    assert make_noise_source("seeded", 1).kind == "seeded"
    with pytest.raises(InvalidParameterError, match="noise_source"):
        make_noise_source("urandom")
    with pytest.raises(InvalidParameterError, match="seed"):
        make_noise_source("seeded")
