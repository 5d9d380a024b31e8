"""Clients as rows of shared arrays: a federation read by offsets.

:class:`RowFederation` holds, per split, one source of examples (features ``(N, d)`` float32 and
labels ``(N,)`` int64, in memory or memory-mapped from a cache file) and, for each client it
holds, which rows of that source are the client's own. :meth:`~RowFederation.take` and
:meth:`~RowFederation.subset` gather exactly the rows of the clients asked for (one index
operation per split), :meth:`~RowFederation.sizes` reads no example, and
:meth:`~RowFederation.partition` keeps some of the clients (a Flower node's own) without reading
any row, as :class:`~privmtl.data.streamed.SyntheticFederation` does for the synthetic
federation. Every other use of the per-client tensors (``train_x``, :meth:`split`,
:meth:`concat`) gathers all the held clients once and keeps them, as the eager data set would.

:class:`ContiguousFederation` is the simplest such federation: each split's rows stored client
after client, client ``k`` owning rows ``offsets[k]:offsets[k + 1]`` (a user's table).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from privmtl.data.federated_dataset import FederatedDataset, concat_key
from privmtl.exceptions import InvalidParameterError
from privmtl.io import arrays_sha256

__all__ = [
    "SPLITS",
    "ContiguousFederation",
    "RowFederation",
    "check_positions",
    "check_split",
    "row_ranges",
    "stacked_dataset",
]

SPLITS = ("train", "val", "test")
_FIELDS = frozenset(f"{s}_{a}" for s in SPLITS for a in "xy")
#: Clients gathered at once when the whole held federation is hashed.
_HASH_BLOCK = 256


def check_positions(clients: Sequence[int] | np.ndarray, n_clients: int) -> np.ndarray:
    """``clients`` as an int64 array of distinct positions in ``[0, n_clients)``, at least one
    (the ``partition`` of a federation); InvalidParameterError naming ``clients`` otherwise."""
    idx = np.asarray(clients, dtype=np.int64).reshape(-1)
    if idx.size == 0:
        raise InvalidParameterError("The 'clients' parameter must hold at least one index.")
    bad = idx[(idx < 0) | (idx >= n_clients)]
    if bad.size:
        raise InvalidParameterError(
            f"The 'clients' parameter must hold indices in [0, {n_clients}); got {int(bad[0])}."
        )
    if np.unique(idx).size != idx.size:
        raise InvalidParameterError("The 'clients' parameter must not repeat a client.")
    return idx


def check_split(split: str) -> None:
    """Refuse a split name other than ``"train"``, ``"val"`` or ``"test"``."""
    if split not in SPLITS:
        raise InvalidParameterError(
            f"The 'split' parameter must be one of {SPLITS}; got {split!r}."
        )


def row_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Rows ``starts[j]`` up to (without) ``starts[j] + lengths[j]`` for every ``j``, one range
    after the other (int64), built in one vectorised call."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    first = np.cumsum(lengths) - lengths
    within = np.arange(total, dtype=np.int64) - np.repeat(first, lengths)
    return np.repeat(np.asarray(starts, dtype=np.int64), lengths) + within


def stacked_dataset(
    ids: list[str],
    blocks: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
    n_classes: int,
    feature_shape: tuple[int, ...],
    name: str,
    scaling: str,
) -> FederatedDataset:
    """A data set (in memory) from one stacked block per split, ``{split: (x (N, d) float32,
    y (N,) int64, offsets (m + 1,))}`` with checked contents: each client's tensors are views of
    its split's block, and :meth:`FederatedDataset.concat` returns the block itself (no copy)
    until a client's tensor is replaced or written into."""
    parts: dict[str, list[torch.Tensor]] = {}
    stacked = {}
    for split, (x, y, offsets) in blocks.items():
        sizes = np.diff(offsets).tolist()
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)
        parts[f"{split}_x"], parts[f"{split}_y"] = list(tx.split(sizes)), list(ty.split(sizes))
        stacked[split] = (tx, ty, offsets)
    out = FederatedDataset._unchecked(ids, parts, n_classes, feature_shape, name, scaling)
    for split, block in stacked.items():
        xs, ys = parts[f"{split}_x"], parts[f"{split}_y"]
        out._concat_cache[split] = (concat_key(xs, ys), block)
    return out


class RowFederation(FederatedDataset):
    """A federation whose clients are rows of per-split sources, read when they are needed.

    A subclass sets the held clients with :meth:`_hold` and says which source rows a client owns
    (:meth:`_rows`) and how to keep some of its clients (:meth:`_select`). The examples are
    byte for byte those of the eager data set holding the same clients.

    Notes
    -----
    :meth:`content_sha256` equals the eager data set's content hash of the same clients (it
    streams the held clients' examples, a block of clients at a time).
    """

    _sources: dict[str, tuple[Any, Any]]
    _split_sizes: dict[str, np.ndarray]
    _whole: FederatedDataset | None

    def _hold(
        self,
        ids: list[str],
        sources: dict[str, tuple[Any, Any]],
        split_sizes: dict[str, np.ndarray],
        n_classes: int,
        feature_shape: tuple[int, ...],
        name: str,
        scaling: str = "none",
    ) -> None:
        """Set the clients held: client ``j`` is named ``ids[j]`` and owns
        ``split_sizes[split][j]`` rows of ``sources[split]`` (``(x, y)``, anything indexable
        by an int64 array of rows, e.g. a memory map)."""
        self.client_ids = ids
        self._sources = sources
        self._split_sizes = {s: np.asarray(split_sizes[s], dtype=np.int64) for s in SPLITS}
        self.n_classes = n_classes
        self.feature_shape = feature_shape
        self.name = name
        self.scaling = scaling
        self._concat_cache = {}
        self._whole = None

    # ------------------------------------------------------------------ what a subclass says
    def _rows(self, idx: np.ndarray, split: str) -> np.ndarray:
        """The source rows (int64) of the held clients at positions ``idx`` (checked) in
        ``split``, client after client, each client's in its own order."""
        raise NotImplementedError

    def _select(self, idx: np.ndarray) -> RowFederation:
        """A federation holding the clients at positions ``idx`` (checked, distinct)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ clients
    def partition(self, clients: Sequence[int] | np.ndarray) -> RowFederation:
        """The clients at positions ``clients`` (distinct, in that order) as a federation read
        on demand: its client ``j`` is this federation's client ``clients[j]``, with its id,
        sizes and examples. Reads no example of a memory-mapped source (a node's own clients
        of a cached LEAF set); an in-memory source keeps only these clients' rows."""
        idx = check_positions(clients, self.n_clients)
        return self._select(idx)

    def _gather(self, idx: np.ndarray, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(x, y, offsets)`` of the clients at positions ``idx`` in ``split``: one index
        operation per source array."""
        rows = self._rows(idx, split)
        xs, ys = self._sources[split]
        x = np.ascontiguousarray(np.asarray(xs[rows]), dtype=np.float32)
        y = np.ascontiguousarray(np.asarray(ys[rows]), dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(self._split_sizes[split][idx])]).astype(np.int64)
        return x, y, offsets

    def take(
        self, clients: Sequence[int] | np.ndarray, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """:meth:`FederatedDataset.take`, reading only the rows of the clients asked for."""
        check_split(split)
        idx = self._positions(clients)
        if not idx:
            return self._no_rows()
        x, y, offsets = self._gather(np.asarray(idx, dtype=np.int64), split)
        return torch.from_numpy(x), torch.from_numpy(y), offsets

    def subset(self, clients: Sequence[int]) -> FederatedDataset:
        """A data set (in memory) of the clients at positions ``clients``, read now (each
        client's tensors are views of one tensor per split and field)."""
        idx = check_positions(clients, self.n_clients).tolist()
        ids = [self.client_ids[i] for i in idx]
        pos = np.asarray(idx, dtype=np.int64)
        blocks = {split: self._gather(pos, split) for split in SPLITS}
        return stacked_dataset(
            ids, blocks, self.n_classes, self.feature_shape, self.name, self.scaling
        )

    # ------------------------------------------------------------------ sizes and identity
    @property
    def n_features(self) -> int:
        return int(self._sources["train"][0].shape[1])

    def sizes(self, split: str = "train") -> np.ndarray:
        """Per-client number of examples of ``split``, without reading any example."""
        check_split(split)
        return self._split_sizes[split].copy()

    def content_sha256(self) -> str:
        """SHA-256 of the held clients' ids and examples, equal to the eager data set's
        (:meth:`FederatedDataset.content_sha256`); reads the held clients' rows, a block of
        clients at a time."""
        if self._whole is not None:
            return self._whole.content_sha256()
        ids = np.frombuffer("\n".join(self.client_ids).encode(), dtype=np.uint8)

        def arrays() -> Iterator[np.ndarray]:
            yield ids
            for split in SPLITS:
                for start in range(0, self.n_clients, _HASH_BLOCK):
                    pos = np.arange(start, min(start + _HASH_BLOCK, self.n_clients))
                    x, y, offsets = self._gather(pos, split)
                    for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
                        yield x[a:b]
                        yield y[a:b]

        return arrays_sha256(arrays())

    # ------------------------------------------------------------------ the whole federation
    def materialize(self) -> FederatedDataset:
        """Every held client read and kept in memory (what the eager reader returns); cached."""
        if self._whole is None:
            self._whole = self.subset(range(self.n_clients))
        return self._whole

    def split(self, split: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        check_split(split)
        return self.materialize().split(split)

    def concat(self, split: str = "train") -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        check_split(split)
        return self.materialize().concat(split)

    def __getattr__(self, name: str) -> Any:
        if name in _FIELDS:
            return getattr(self.materialize(), name)
        raise AttributeError(name)


class ContiguousFederation(RowFederation):
    """Clients stored one after the other: per split ``(x (N, d) float32, y (N,) int64,
    offsets (m + 1,))``, client ``k`` owning rows ``offsets[k]:offsets[k + 1]``.

    The arrays are taken as they are (already checked by the reader that built them).
    :meth:`partition` copies the kept clients' rows into arrays of their own, so that the
    others' can be freed.
    """

    def __init__(
        self,
        client_ids: list[str],
        blocks: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
        n_classes: int,
        feature_shape: tuple[int, ...],
        name: str,
        scaling: str = "none",
    ) -> None:
        self._starts = {s: np.asarray(blocks[s][2][:-1], dtype=np.int64) for s in SPLITS}
        self._hold(
            list(client_ids),
            {s: (blocks[s][0], blocks[s][1]) for s in SPLITS},
            {s: np.diff(blocks[s][2]) for s in SPLITS},
            n_classes,
            feature_shape,
            name,
            scaling,
        )

    def _rows(self, idx: np.ndarray, split: str) -> np.ndarray:
        return row_ranges(self._starts[split][idx], self._split_sizes[split][idx])

    def _select(self, idx: np.ndarray) -> ContiguousFederation:
        blocks = {split: self._gather(idx, split) for split in SPLITS}
        ids = [self.client_ids[i] for i in idx.tolist()]
        return ContiguousFederation(
            ids, blocks, self.n_classes, self.feature_shape, self.name, self.scaling
        )
