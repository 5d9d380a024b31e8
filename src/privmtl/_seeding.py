"""numpy's seed sequences hashed for many entropies at once.

A per-client random stream is a PCG64 seeded by a :class:`~numpy.random.SeedSequence` of the
client's entropy words (the round plan's ``default_rng([seed, stream, t, k])``, the synthetic
federation's ``SeedSequence(entropy, spawn_key=(k,))``). numpy hashes one sequence at a time, a
few microseconds of Python-level work each; :func:`seed_sequence_states` runs the same uint32
arithmetic on a column per entropy word, for all clients in one vectorised call, and
:func:`generators_from_states` builds the PCG64 generators from its words. The data layer and
the federated engine both use it, hence its home below both.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from numpy.random.bit_generator import ISeedSequence

from privmtl.exceptions import InvalidParameterError

__all__ = [
    "WORD_MAX",
    "generators_from_states",
    "int_words",
    "seed_sequence_states",
    "spawned_generators",
]

# SeedSequence's hash constants and pool size (numpy/random/bit_generator.pyx)
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_POOL = 4
WORD_MAX = (1 << 32) - 1
"""The largest entropy word (entropy values above it take more than one word)."""


def int_words(value: int) -> list[int]:
    """The 32-bit words numpy's SeedSequence makes of a non-negative int entropy (least
    significant first; ``[0]`` for 0)."""
    v = int(value)
    if v < 0:
        raise InvalidParameterError(f"The 'value' parameter must be >= 0; got {value}.")
    words = [0] if v == 0 else []
    while v:
        words.append(v & WORD_MAX)
        v >>= 32
    return words


def seed_sequence_states(entropy: np.ndarray) -> np.ndarray:
    """``SeedSequence(words).generate_state(4, np.uint64)`` of every row of ``entropy``
    (``(K, L)``, each entry one word in ``[0, 2**32)``, ``L >= 1``), for all rows at once.

    numpy's :class:`~numpy.random.SeedSequence` hashes each entropy word into a pool of four
    (a pool word beyond the entropy hashes 0), mixes the pool, mixes in the words beyond the
    fourth and hashes the pool out; its hash constants do not depend on the entropy, so the same
    uint32 arithmetic runs on a column per word. A row is the *assembled* entropy: for
    ``SeedSequence(e, spawn_key=(k,))`` it is ``int_words(e)`` padded with zeros to four words,
    then ``k``'s words (:func:`spawned_generators`).
    """
    e = np.asarray(entropy, dtype=np.uint64)
    if e.ndim != 2 or e.shape[1] < 1 or (e.size and int(e.max()) > WORD_MAX):
        raise InvalidParameterError(
            f"The 'entropy' parameter must be (K, L >= 1) words in [0, 2**32); got shape {e.shape}."
        )
    words = e.astype(np.uint32)
    n_words = words.shape[1]
    const = [_INIT_A]

    def hashmix(v: np.ndarray) -> np.ndarray:
        v = v ^ np.uint32(const[0])
        const[0] = (const[0] * _MULT_A) & WORD_MAX
        v = v * np.uint32(const[0])
        return v ^ (v >> np.uint32(16))

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        r: np.ndarray = np.uint32(_MIX_L) * x - np.uint32(_MIX_R) * y
        return r ^ (r >> np.uint32(16))

    zero = np.zeros(len(words), dtype=np.uint32)
    with np.errstate(over="ignore"):
        pool = [hashmix(words[:, i] if i < n_words else zero) for i in range(_POOL)]
        for src in range(_POOL):
            for dst in range(_POOL):
                if src != dst:
                    pool[dst] = mix(pool[dst], hashmix(pool[src]))
        for src in range(_POOL, n_words):
            for dst in range(_POOL):
                pool[dst] = mix(pool[dst], hashmix(words[:, src]))
        out = np.empty((len(words), 8), dtype=np.uint32)
        const_b = _INIT_B
        for i in range(8):
            v = pool[i % _POOL] ^ np.uint32(const_b)
            const_b = (const_b * _MULT_B) & WORD_MAX
            v = v * np.uint32(const_b)
            out[:, i] = v ^ (v >> np.uint32(16))
    return out.astype("<u4").view("<u8").astype(np.uint64)


class _StateWords(ISeedSequence):
    """A seed sequence whose PCG64 state words are already computed
    (:func:`seed_sequence_states`)."""

    def __init__(self, words: np.ndarray) -> None:
        self.words = words

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> np.ndarray:
        if n_words != 4 or np.dtype(dtype) != np.dtype(np.uint64):
            raise InvalidParameterError(
                f"Precomputed PCG64 state words answer 4 uint64 words; got {n_words} {dtype}."
            )
        return self.words


def generators_from_states(states: np.ndarray) -> Iterator[np.random.Generator]:
    """``Generator(PCG64(...))`` of each row of :func:`seed_sequence_states`' words: the
    generators numpy builds from the same seed sequences."""
    for words in states:
        # numpy takes any ISeedSequence (its stubs name only its own SeedSequence)
        yield np.random.Generator(np.random.PCG64(_StateWords(words)))  # type: ignore[arg-type]


def spawned_generators(entropy: int, keys: np.ndarray) -> Iterator[np.random.Generator]:
    """``Generator(PCG64(SeedSequence(entropy, spawn_key=(k,))))`` for every ``k`` of ``keys``
    (non-negative), in order: the seed sequences hashed in one vectorised call where every key is
    one word, else one by one."""
    ks = np.asarray(keys, dtype=np.int64).reshape(-1)
    if ks.size and (int(ks.min()) < 0 or int(ks.max()) > WORD_MAX):
        for k in ks.tolist():
            seq = np.random.SeedSequence(entropy, spawn_key=(int(k),))
            yield np.random.Generator(np.random.PCG64(seq))
        return
    head = int_words(entropy)
    head += [0] * (_POOL - len(head))  # a spawn key pads the entropy to the pool's size
    rows = np.empty((ks.size, len(head) + 1), dtype=np.uint64)
    rows[:, :-1] = head
    rows[:, -1] = ks
    yield from generators_from_states(seed_sequence_states(rows))
