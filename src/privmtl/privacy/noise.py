r"""Where the curator's Gaussian noise comes from: the operating system's entropy, or a seed.

A differentially private release is only as private as its noise is unpredictable. Noise drawn
from a generator seeded by a public ``--seed`` can be regenerated, and subtracted, by anyone who
knows the seed: such a run protects nobody. privmtl therefore has two noise sources and every
result names the one it used (JSON key ``noise_source``):

``"secure"`` (:class:`SecureNoise`, the default for real data)
    Uniform bits from the operating system's cryptographically secure generator
    (:func:`os.urandom`, the kernel CSPRNG), turned into standard normals by the Box–Muller
    transform in float64. Following Opacus' ``secure_mode`` (Holohan & Braghin 2021, "Secure
    random sampling in differential privacy"), each coordinate is the sum of four independent
    normals divided by two (same variance), which blunts the floating-point attacks on Gaussian
    samplers (Mironov 2012; Jin et al. 2022): the low-order bits of a single Box–Muller draw leak
    which uniform produced it, and so the draw itself. This is a mitigation, not a proof:
    floating-point Gaussian noise is never exactly the Gaussian of the analysis (the same caveat
    holds for every DP library that samples in floating point). Nothing of this source is ever
    written to a checkpoint: a resumed run draws fresh noise.

``"seeded"`` (:class:`SeededNoise`, for research simulation only)
    A ``torch.Generator`` (or a numpy ``Generator``) seeded from the run's seed, so that a
    simulation is reproducible bit for bit and can be checkpointed and resumed exactly. Results
    state ``noise_source: "seeded"``; never use it to protect real people.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from privmtl._validation import check_choice, check_int, check_real
from privmtl.exceptions import InvalidParameterError

__all__ = [
    "NOISE_SOURCES",
    "NoiseSource",
    "NumpySeededNoise",
    "SecureNoise",
    "SeededNoise",
    "make_noise_source",
    "seeded_torch_generator",
]

#: The noise sources every result may name.
NOISE_SOURCES = ("secure", "seeded")

#: Number of normals summed (and divided by sqrt of it) per secure coordinate (Opacus: 4, /2).
_SECURE_DRAWS = 4


class NoiseSource:
    """Base class: draws ``N(0, std²)`` arrays; ``kind`` is ``"secure"`` or ``"seeded"``."""

    kind = "base"

    def normal(
        self, shape: Sequence[int], std: float, *, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """A tensor of i.i.d. ``N(0, std²)`` entries of the given shape and dtype."""
        raise NotImplementedError

    def normal_numpy(self, shape: Sequence[int], std: float) -> np.ndarray:
        """A float64 array of i.i.d. ``N(0, std²)`` entries."""
        raise NotImplementedError

    def normal_like(self, template: dict[str, torch.Tensor], std: float) -> dict[str, torch.Tensor]:
        """``N(0, std² I)`` for every entry of ``template`` (its shapes and dtypes, in its order).

        The draws are made on the CPU, by this source (the OS's entropy for the secure source),
        and then moved to each entry's device: a GPU's own generator is never used for noise."""
        return {
            n: self.normal(tuple(p.shape), std, dtype=p.dtype).to(p.device)
            for n, p in template.items()
        }

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint may hold of this source (nothing secret for the secure source)."""
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; refuses a state of another kind."""
        raise NotImplementedError

    def _check_kind(self, state: dict[str, Any]) -> None:
        if state.get("kind") != self.kind:
            raise InvalidParameterError(
                f"Cannot restore a {state.get('kind')!r} noise state into a {self.kind!r} noise "
                "source; resume with the noise source the run was started with."
            )


# ------------------------------------------------------------------------------------ secure
def _urandom_unit(n: int) -> np.ndarray:
    """``n`` uniforms in (0, 1] with 53 random bits each, from the kernel CSPRNG."""
    bits = np.frombuffer(os.urandom(8 * n), dtype=np.uint64)
    return ((bits >> np.uint64(11)).astype(np.float64) + 1.0) * (2.0**-53)


def _urandom_standard_normal(n: int) -> np.ndarray:
    """``n`` standard normals by Box–Muller on CSPRNG uniforms (float64)."""
    pairs = (n + 1) // 2
    u1 = _urandom_unit(pairs)
    u2 = _urandom_unit(pairs)
    r = np.sqrt(-2.0 * np.log(u1))
    theta = 2.0 * math.pi * u2
    return np.concatenate([r * np.cos(theta), r * np.sin(theta)])[:n]


class SecureNoise(NoiseSource):
    """Gaussian noise from OS entropy (module docstring); not reproducible, never serialized."""

    kind = "secure"

    def normal_numpy(self, shape: Sequence[int], std: float) -> np.ndarray:
        std = check_real("std", std, low=0.0)
        size = int(np.prod(shape, dtype=np.int64))
        z = _urandom_standard_normal(_SECURE_DRAWS * size).reshape(_SECURE_DRAWS, size)
        out = z.sum(0) / math.sqrt(_SECURE_DRAWS)
        return (out * std).reshape(tuple(shape))

    def normal(
        self, shape: Sequence[int], std: float, *, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        return torch.from_numpy(self.normal_numpy(shape, std)).to(dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check_kind(state)


# ------------------------------------------------------------------------------------ seeded
def seeded_torch_generator(seed: int, stream: Sequence[int] = (2,)) -> torch.Generator:
    """The ``torch.Generator`` of seed ``seed`` and stream ``stream`` (``SeedSequence([seed, *stream])``)."""
    state = np.random.SeedSequence([int(seed), *map(int, stream)]).generate_state(2, np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 31 | int(state[1]) >> 1)


class SeededNoise(NoiseSource):
    """Reproducible Gaussian noise from a ``torch.Generator`` (research simulation only).

    Parameters
    ----------
    seed : int >= 0
    stream : sequence of int, default (2,)
        Distinguishes this stream from the run's other seeded streams (client sampling, local
        minibatches); the generator is seeded from ``SeedSequence([seed, *stream])``.
    """

    kind = "seeded"

    def __init__(self, seed: int, stream: Sequence[int] = (2,)) -> None:
        self.seed = check_int("seed", seed, low=0)
        self.stream = tuple(int(s) for s in stream)
        self.generator = seeded_torch_generator(self.seed, self.stream)

    def normal(
        self, shape: Sequence[int], std: float, *, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        return torch.randn(tuple(shape), generator=self.generator, dtype=dtype) * std

    def normal_numpy(self, shape: Sequence[int], std: float) -> np.ndarray:
        return self.normal(shape, std, dtype=torch.float64).numpy()

    @classmethod
    def from_numpy(cls, rng: np.random.Generator) -> NumpySeededNoise:
        """Seeded noise drawn from an existing numpy ``Generator`` (see :class:`NumpySeededNoise`)."""
        return NumpySeededNoise(rng)

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "seed": self.seed,
            "stream": list(self.stream),
            "torch_state": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check_kind(state)
        if "torch_state" not in state:
            raise InvalidParameterError("The seeded noise state has no 'torch_state'.")
        self.generator.set_state(state["torch_state"])


class NumpySeededNoise(NoiseSource):
    """Reproducible noise from a numpy ``Generator`` (the MP-MTL estimators' ``random_state``)."""

    kind = "seeded"

    def __init__(self, rng: np.random.Generator) -> None:
        if not isinstance(rng, np.random.Generator):
            raise InvalidParameterError(
                f"The 'rng' parameter must be a numpy Generator; got {type(rng).__name__}."
            )
        self.rng = rng

    def normal_numpy(self, shape: Sequence[int], std: float) -> np.ndarray:
        return self.rng.standard_normal(tuple(shape)) * std

    def normal(
        self, shape: Sequence[int], std: float, *, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        return torch.from_numpy(self.normal_numpy(shape, std)).to(dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "numpy_state": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check_kind(state)
        self.rng.bit_generator.state = state["numpy_state"]


def make_noise_source(
    kind: str, seed: int | None = None, *, stream: Sequence[int] = (2,)
) -> NoiseSource:
    """``SecureNoise()`` for ``"secure"``; ``SeededNoise(seed, stream)`` for ``"seeded"``."""
    check_choice("noise_source", kind, NOISE_SOURCES)
    if kind == "secure":
        return SecureNoise()
    if seed is None:
        raise InvalidParameterError("noise_source='seeded' needs a seed; got seed=None.")
    return SeededNoise(seed, stream)
