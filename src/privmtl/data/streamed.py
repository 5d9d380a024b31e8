"""A synthetic federation whose clients are drawn when they are needed.

:class:`SyntheticFederation` is :func:`~privmtl.data.federated.make_synthetic_federated`'s data
without holding them: it draws the shared part once, then walks the generator through every
client once, keeping only the generator's state at the start of each client (a few bytes per
client, never the examples). Client ``k``'s data are drawn again from its recorded state whenever
they are needed, so they are exactly the clients the eager generator gives for the same seed,
while the memory held grows with the clients asked for at once (a round's sampled clients, a
block of the end of run), not with the population.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from privmtl.data.federated import (
    FederatedDataset,
    SyntheticLaw,
    make_synthetic_federated,
    synthetic_client_ids,
    synthetic_law,
)
from privmtl.exceptions import InvalidParameterError
from privmtl.io import arrays_sha256

__all__ = ["SyntheticFederation"]

_MASK64 = (1 << 64) - 1
# the generator's parameters and defaults have one home: make_synthetic_federated's signature
_GENERATOR_DEFAULTS = {
    name: p.default for name, p in inspect.signature(make_synthetic_federated).parameters.items()
}
_SPLIT_KEYS = {
    "train": ("train_x", "train_y"),
    "val": ("val_x", "val_y"),
    "test": ("test_x", "test_y"),
}


def _check_split(split: str) -> None:
    if split not in _SPLIT_KEYS:
        raise InvalidParameterError(
            f"The 'split' parameter must be one of {tuple(_SPLIT_KEYS)}; got {split!r}."
        )


class SyntheticFederation(FederatedDataset):
    """:func:`~privmtl.data.federated.make_synthetic_federated`'s federation, drawn on demand.

    Takes the parameters of :func:`~privmtl.data.federated.make_synthetic_federated` (keyword
    only) and holds the same clients: :meth:`subset` and :meth:`take` draw the clients asked for
    from their recorded generator states, :meth:`sizes` needs no draw, and every other use of
    the per-client tensors (``train_x``, :meth:`split`, :meth:`concat`) draws the whole
    federation once and keeps it, as the eager data set would.

    Notes
    -----
    Building it costs one pass of the generator over every client (the draws, not the labels or
    the copies) and 32 bytes per client. The generator must be numpy's default bit generator
    (PCG64), as for an ``int`` seed. :meth:`content_sha256` fingerprints the generator's law,
    its shared model, the clients' sizes and their generator states, which determine every
    example: it differs from the eager data set's content hash of the same data.
    """

    def __init__(self, **params: Any) -> None:
        unknown = sorted(set(params) - set(_GENERATOR_DEFAULTS))
        if unknown:
            raise InvalidParameterError(
                f"SyntheticFederation takes make_synthetic_federated's parameters "
                f"{sorted(_GENERATOR_DEFAULTS)}; got {unknown}."
            )
        law, sizes, rng = synthetic_law(**{**_GENERATOR_DEFAULTS, **params})
        if not isinstance(rng.bit_generator, np.random.PCG64):
            raise InvalidParameterError(
                "The 'random_state' parameter of SyntheticFederation must be an int, None or a "
                f"Generator on PCG64; got a Generator on {type(rng.bit_generator).__name__}."
            )
        m = len(sizes)
        self.law: SyntheticLaw = law
        self._n = np.asarray(sizes, dtype=np.int64)
        self._split_sizes = law.split_sizes(self._n)
        self._hi = np.empty(m, dtype=np.uint64)
        self._lo = np.empty(m, dtype=np.uint64)
        self._has32 = np.empty(m, dtype=np.uint8)
        self._u32 = np.empty(m, dtype=np.uint32)
        inc = None
        bg = rng.bit_generator
        # one buffer for the normal draws of the largest client: no allocation per client
        buffer = np.empty(law.n_normals(int(self._n.max())) if m else 0)
        for k, n in enumerate(self._n.tolist()):
            st = bg.state
            s = int(st["state"]["state"])
            self._hi[k], self._lo[k] = s >> 64, s & _MASK64
            self._has32[k], self._u32[k] = st["has_uint32"], st["uinteger"]
            inc = st["state"]["inc"] if inc is None else inc
            law.skip_client(rng, n, buffer)
        self._inc = int(inc or 0)
        self.client_ids = synthetic_client_ids(m)
        self.n_classes = law.n_classes
        self.feature_shape = (law.n_features,)
        self.name = law.name(m)
        self.scaling = "none"
        self._concat_cache = {}
        self._whole: FederatedDataset | None = None

    # ------------------------------------------------------------------ drawing clients
    def _walk(self, idx: list[int]) -> Iterator[tuple[np.random.Generator, int]]:
        """``(rng, n)`` for each client of ``idx`` in turn, ``rng`` at the client's first draw.

        The recorded state is set only where ``idx`` does not continue the client drawn before:
        drawing client ``k`` whole leaves the generator at client ``k + 1``'s state.
        """
        bg = np.random.PCG64(0)
        rng = np.random.Generator(bg)
        prev = -2
        for k in idx:
            if k != prev + 1:
                bg.state = {
                    "bit_generator": "PCG64",
                    "state": {
                        "state": (int(self._hi[k]) << 64) | int(self._lo[k]),
                        "inc": self._inc,
                    },
                    "has_uint32": int(self._has32[k]),
                    "uinteger": int(self._u32[k]),
                }
            prev = k
            yield rng, int(self._n[k])

    def _draw(
        self, idx: list[int], splits: Sequence[str]
    ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The ``splits`` of the clients at positions ``idx`` (checked), drawn once each:
        ``{split: (x (N, d) float32, y (N,) int64, offsets (len(idx) + 1,))``, the ``j``-th
        client owning rows ``offsets[j]:offsets[j + 1]``. One allocation per split for the whole
        block, none per client."""
        d = self.law.n_features
        stacked = {}
        for split in splits:
            sizes = self._split_sizes[split][idx]
            offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            n_rows = int(offsets[-1])
            stacked[split] = (
                np.empty((n_rows, d), np.float32),
                np.empty(n_rows, np.int64),
                offsets,
            )
        work = np.empty(int(self._n[idx].max()) * d if idx else 0)
        for j, (rng, n) in enumerate(self._walk(idx)):
            out = {}
            for split, (x, y, offsets) in stacked.items():
                a, b = offsets[j], offsets[j + 1]
                out[split] = (x[a:b], y[a:b])
            self.law.draw_rows(rng, n, out, work)
        return stacked

    def subset(self, clients: Sequence[int]) -> FederatedDataset:
        """A data set (in memory) of the clients at positions ``clients``, drawn now (each
        client's tensors are views of one tensor per split and field)."""
        idx = self._positions(clients)
        if not idx:
            raise InvalidParameterError("The 'clients' parameter must hold at least one index.")
        ids = [self.client_ids[i] for i in idx]
        if len(set(ids)) != len(ids):
            raise InvalidParameterError("The 'clients' parameter must not repeat a client.")
        kw: dict[str, list[torch.Tensor]] = {}
        for split, (x, y, offsets) in self._draw(idx, tuple(_SPLIT_KEYS)).items():
            sizes = np.diff(offsets).tolist()
            kx, ky = _SPLIT_KEYS[split]
            kw[kx] = list(torch.from_numpy(x).split(sizes))
            kw[ky] = list(torch.from_numpy(y).split(sizes))
        # drawn by the law: float32 / int64 tensors of consistent shapes, nothing to check again
        return FederatedDataset._unchecked(
            ids, kw, self.n_classes, self.feature_shape, self.name, self.scaling
        )

    def take(
        self, clients: Sequence[int] | np.ndarray, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """:meth:`FederatedDataset.take`, drawing only the clients asked for."""
        _check_split(split)
        idx = self._positions(clients)
        if not idx:
            return self._no_rows()
        x, y, offsets = self._draw(idx, (split,))[split]
        return torch.from_numpy(x), torch.from_numpy(y), offsets

    # ------------------------------------------------------------------ sizes and identity
    @property
    def n_features(self) -> int:
        return self.law.n_features

    def sizes(self, split: str = "train") -> np.ndarray:
        """Per-client number of examples of ``split``, without drawing any example."""
        _check_split(split)
        return self._split_sizes[split].copy()

    def content_sha256(self) -> str:
        """SHA-256 of what determines every example: the law's parameters, its shared model, the
        clients' sizes and generator states (not equal to the eager data set's content hash)."""
        law = self.law
        params = repr(
            (law.n_features, law.n_classes, law.heterogeneity, law.feature_shift,
             law.feature_spread, law.feature_cov, law.label_noise, law.test_fraction,
             law.val_fraction, self._inc)
        ).encode()  # fmt: skip
        ids = np.frombuffer("\n".join(self.client_ids).encode(), dtype=np.uint8)
        return arrays_sha256(
            iter([np.frombuffer(params, np.uint8), ids, law.w0, law.b0, self._n, self._hi,
                  self._lo, self._has32, self._u32])
        )  # fmt: skip

    # ------------------------------------------------------------------ the whole federation
    def materialize(self) -> FederatedDataset:
        """Every client drawn and kept (what the eager generator returns); cached."""
        if self._whole is None:
            self._whole = self.subset(range(self.n_clients))
        return self._whole

    def __getattr__(self, name: str) -> Any:
        if name in {k for keys in _SPLIT_KEYS.values() for k in keys}:
            return getattr(self.materialize(), name)
        raise AttributeError(name)
