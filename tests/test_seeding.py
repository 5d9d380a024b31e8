"""numpy's seed sequences hashed for many entropies at once (privmtl._seeding)."""

from __future__ import annotations

import numpy as np
import pytest

from privmtl._seeding import int_words, seed_sequence_states, spawned_generators
from privmtl.exceptions import InvalidParameterError


@pytest.mark.parametrize("n_words", [1, 2, 4, 5, 7])
def test_seed_sequence_states_are_numpys_for_every_word(n_words: int) -> None:
    rng = np.random.default_rng(7)
    entropy = rng.integers(0, 2**32, size=(200, n_words), dtype=np.uint64)
    entropy[:3] = 0
    entropy[3:6] = 2**32 - 1
    ours = seed_sequence_states(entropy)
    for row, words in zip(entropy, ours, strict=True):
        want = np.random.SeedSequence([int(v) for v in row]).generate_state(4, np.uint64)
        assert np.array_equal(words, want)


def test_seed_sequence_states_refuses_words_over_32_bits() -> None:
    with pytest.raises(InvalidParameterError, match="entropy"):
        seed_sequence_states(np.array([[0, 1, 2, 2**32]], dtype=np.uint64))


def test_int_words_are_numpys_coercion() -> None:
    assert int_words(0) == [0]
    assert int_words(2**32 - 1) == [2**32 - 1]
    assert int_words(2**32 + 5) == [5, 1]
    with pytest.raises(InvalidParameterError, match="value"):
        int_words(-1)


@pytest.mark.parametrize("entropy", [0, 3, 2**32 - 1, 2**32, 2**70, 2**127 + 12345, 2**160 + 7])
def test_spawned_generators_are_numpys_spawned_streams(entropy: int) -> None:
    """The synthetic federation's client streams, ``SeedSequence(entropy, spawn_key=(k,))``:
    the same draws, keys of one word hashed together and larger keys one by one."""
    for keys in ([0, 1, 9, 123_456, 2**32 - 1], [5, 2**32, 2**40], []):
        ks = np.asarray(keys, dtype=np.int64)
        got = [g.standard_normal(3) for g in spawned_generators(entropy, ks)]
        want = [
            np.random.Generator(
                np.random.PCG64(np.random.SeedSequence(entropy, spawn_key=(k,)))
            ).standard_normal(3)
            for k in keys
        ]
        assert len(got) == len(want)
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
