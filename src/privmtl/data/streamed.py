"""A synthetic federation whose clients are drawn when they are needed.

:class:`SyntheticFederation` is :func:`~privmtl.data.federated.make_synthetic_federated`'s data
without holding them: it draws the shared part (the shared model and every client's size, one
vectorised draw) and nothing else. Client ``k`` is drawn from its own random stream, a function
of the seed and ``k`` only (:meth:`~privmtl.data.federated.SyntheticLaw.client_rng`), whenever it
is needed, so any client or set of clients is drawn directly, exactly as the eager generator
draws it for the same seed, and the memory held grows with the clients asked for at once (a
round's sampled clients, a block of the end of run), not with the population.
:meth:`SyntheticFederation.partition` keeps some of the clients (a Flower node's own) without
drawing any.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch

from privmtl.data.federated import (
    SYNTHETIC_STREAM,
    FederatedDataset,
    SyntheticLaw,
    make_synthetic_federated,
    synthetic_law,
)
from privmtl.data.federated_dataset import concat_key
from privmtl.data.row_federation import check_positions
from privmtl.data.synthetic_federated import SyntheticClientIds
from privmtl.exceptions import InvalidParameterError
from privmtl.io import arrays_sha256

__all__ = ["SyntheticFederation"]

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
    from their own random streams, :meth:`sizes` needs no draw, :meth:`partition` keeps some of
    the clients without drawing them, and every other use of the per-client tensors
    (``train_x``, :meth:`split`, :meth:`concat`) draws the whole federation once and keeps it,
    as the eager data set would.

    Notes
    -----
    Building it costs the shared part's draws (one vectorised draw of the sizes) and a few
    scalars per client (sizes, stream index, id); drawing a client costs its own draws alone,
    whichever clients are drawn before or with it. :meth:`content_sha256` fingerprints what
    determines every example (the law's parameters and stream, its shared model and stream
    entropy, the clients' stream indices and sizes): it differs from the eager data set's
    content hash of the same data.
    """

    def __init__(self, **params: Any) -> None:
        unknown = sorted(set(params) - set(_GENERATOR_DEFAULTS))
        if unknown:
            raise InvalidParameterError(
                f"SyntheticFederation takes make_synthetic_federated's parameters "
                f"{sorted(_GENERATOR_DEFAULTS)}; got {unknown}."
            )
        law, sizes = synthetic_law(**{**_GENERATOR_DEFAULTS, **params})
        m = len(sizes)
        ids = cast(list[str], SyntheticClientIds(m))  # read as a list, made when read
        self._hold(law, np.arange(m, dtype=np.int64), sizes, ids, law.name(m))

    def _hold(
        self, law: SyntheticLaw, keys: np.ndarray, sizes: np.ndarray, ids: list[str], name: str
    ) -> None:
        """Set the clients held: client ``j`` is the population's client ``keys[j]`` (its
        stream index), of ``sizes[j]`` examples, named ``ids[j]``."""
        self.law: SyntheticLaw = law
        self._keys = np.asarray(keys, dtype=np.int64)
        self._n = np.asarray(sizes, dtype=np.int64)
        # held as 32-bit counts where they fit (a forked worker's copy counts again), read as int64
        split_sizes = law.split_sizes(self._n)
        small = all(int(a.max(initial=0)) < 2**31 for a in split_sizes.values())
        self._split_sizes = {k: a.astype(np.int32) if small else a for k, a in split_sizes.items()}
        self.client_ids = ids
        self.n_classes = law.n_classes
        self.feature_shape = (law.n_features,)
        self.name = name
        self.scaling = "none"
        self._concat_cache = {}
        self._whole: FederatedDataset | None = None

    def partition(self, clients: Sequence[int] | np.ndarray) -> SyntheticFederation:
        """The clients at positions ``clients`` (distinct, in that order) as a federation drawn
        on demand, drawing nothing now: its client ``j`` is this federation's client
        ``clients[j]``, with its id, size and examples. Costs O(len(clients)) beside an index
        check: a Flower node builds the population (the size draw) and keeps its own clients."""
        idx = check_positions(clients, self.n_clients)
        out = SyntheticFederation.__new__(SyntheticFederation)
        ids = [self.client_ids[i] for i in idx.tolist()]
        out._hold(self.law, self._keys[idx], self._n[idx], ids, self.name)
        return out

    # ------------------------------------------------------------------ drawing clients
    def _draw(
        self, idx: list[int], splits: Sequence[str]
    ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The ``splits`` of the clients at positions ``idx`` (checked), drawn once each from
        their own streams: ``{split: (x (N, d) float32, y (N,) int64, offsets (len(idx) +
        1,))``, the ``j``-th client owning rows ``offsets[j]:offsets[j + 1]``. One allocation
        per split for the whole block, none per client."""
        d = self.law.n_features
        stacked = {}
        outs = {}
        for split in splits:
            sizes = self._split_sizes[split][idx].astype(np.int64)
            offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            n_rows = int(offsets[-1])
            x, y = np.empty((n_rows, d), np.float32), np.empty(n_rows, np.int64)
            stacked[split] = (x, y, offsets)
            outs[split] = (x, y)
        law = self.law
        # each client's stream up to the last split asked for (training rows first)
        law.draw_block(law.client_rngs(self._keys[idx]), self._n[idx], outs)
        return stacked

    def subset(self, clients: Sequence[int]) -> FederatedDataset:
        """A data set (in memory) of the clients at positions ``clients``, drawn now (each
        client's tensors are views of one tensor per split and field)."""
        idx = check_positions(clients, self.n_clients).tolist()
        ids = [self.client_ids[i] for i in idx]
        kw: dict[str, list[torch.Tensor]] = {}
        stacked = {}
        for split, (x, y, offsets) in self._draw(idx, tuple(_SPLIT_KEYS)).items():
            sizes = np.diff(offsets).tolist()
            kx, ky = _SPLIT_KEYS[split]
            tx, ty = torch.from_numpy(x), torch.from_numpy(y)
            kw[kx], kw[ky] = list(tx.split(sizes)), list(ty.split(sizes))
            stacked[split] = (tx, ty, offsets)
        # drawn by the law: float32 / int64 tensors of consistent shapes, nothing to check again
        out = FederatedDataset._unchecked(
            ids, kw, self.n_classes, self.feature_shape, self.name, self.scaling
        )
        for split, block in stacked.items():  # concat() is the drawn block itself, not a copy
            xs, ys = kw[_SPLIT_KEYS[split][0]], kw[_SPLIT_KEYS[split][1]]
            out._concat_cache[split] = (concat_key(xs, ys), block)
        return out

    def take(
        self, clients: Sequence[int] | np.ndarray, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """:meth:`FederatedDataset.take`, drawing only the clients asked for, and of each only
        its stream up to the split asked for (``"train"``: its parameters and training rows)."""
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
        return self._split_sizes[split].astype(np.int64)

    def content_sha256(self) -> str:
        """SHA-256 of what determines every example: the law's parameters and random stream
        (:data:`~privmtl.data.federated.SYNTHETIC_STREAM`), its shared model and the streams'
        entropy, the population's name and the clients' stream indices and sizes (not equal to
        the eager data set's content hash)."""
        law = self.law
        params = repr(
            (law.n_features, law.n_classes, law.heterogeneity, law.feature_shift,
             law.feature_spread, law.feature_cov, law.label_noise, law.test_fraction,
             law.val_fraction, law.entropy, SYNTHETIC_STREAM, self.name)
        ).encode()  # fmt: skip
        return arrays_sha256(
            iter([np.frombuffer(params, np.uint8), law.w0, law.b0, self._keys, self._n])
        )

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
