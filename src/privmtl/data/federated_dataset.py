"""One client's train / validation / test tensors for each of ``m`` clients: :class:`FederatedDataset`.

Features are ``float32`` of shape ``(n, d)``, labels ``int64`` of shape ``(n,)``. Images are stored
flattened row by row (``d = 784`` for FEMNIST) and :attr:`FederatedDataset.feature_shape` says how
to reshape them (``(1, 28, 28)``); models reshape themselves. Its sources are
:mod:`privmtl.data.leaf` and :mod:`privmtl.data.synthetic_federated` (together, with this class:
:mod:`privmtl.data.federated`)."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from privmtl._validation import check_int
from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.io import arrays_sha256

__all__ = ["FederatedDataset", "concat_key"]

_SPLITS = ("train", "val", "test")


def _as_x(a: Any) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(a, dtype=np.float32) if not torch.is_tensor(a) else a)
    return t.to(torch.float32)


def _as_y(a: Any) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(a) if not torch.is_tensor(a) else a)
    return t.to(torch.int64)


_VERSION = operator.attrgetter("_version")


def concat_key(xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor]) -> tuple[Any, ...]:
    """What :meth:`FederatedDataset.concat`'s cache of one split checks: which tensors the
    split's lists hold and their in-place versions (a list element replaced or a tensor written
    in place invalidates it)."""
    both = (*xs, *ys)
    return tuple(map(id, both)), tuple(map(_VERSION, both))


@dataclass
class FederatedDataset:
    """Per-client train / validation / test classification data.

    Parameters
    ----------
    client_ids : list of str
        One identifier per client (for LEAF: the writer id).
    train_x, val_x, test_x : list of Tensor
        Per-client features, ``float32`` of shape ``(n_k, d)`` (converted on construction).
    train_y, val_y, test_y : list of Tensor
        Per-client labels, ``int64`` of shape ``(n_k,)`` in ``[0, n_classes)``.
    n_classes : int
        Number of classes.
    feature_shape : tuple of int, optional
        Shape of one example before flattening (``(1, 28, 28)`` for FEMNIST); its product must
        equal ``d``. Defaults to ``(d,)``.
    name : str
        Free-text name used in summaries.

    Attributes
    ----------
    scaling : str
        How the features were scaled when the data was read (reported by runs): ``"none"``, or
        e.g. ``"per-client standardization (own training split)"`` for a user's table (set by
        :func:`~privmtl.data.federated_table.load_federated_table`; kept by :meth:`subset`).

    Notes
    -----
    A client may have an empty validation or test split (e.g. writers with 4 images and
    ``val_fraction=0.1``); every client has at least one training example.
    """

    client_ids: list[str]
    train_x: list[torch.Tensor]
    train_y: list[torch.Tensor]
    val_x: list[torch.Tensor]
    val_y: list[torch.Tensor]
    test_x: list[torch.Tensor]
    test_y: list[torch.Tensor]
    n_classes: int
    feature_shape: tuple[int, ...] = ()
    name: str = "federated"
    scaling: str = field(default="none", init=False)
    _concat_cache: dict[str, tuple[Any, tuple[torch.Tensor, torch.Tensor, np.ndarray]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self.client_ids = [str(c) for c in self.client_ids]
        m = len(self.client_ids)
        if m == 0:
            raise DataFormatError("A FederatedDataset needs at least one client; got 0.")
        if len(set(self.client_ids)) != m:
            raise DataFormatError("client_ids must be unique.")
        self.n_classes = check_int("n_classes", self.n_classes, low=1)
        d = None
        for split in _SPLITS:
            xs = [_as_x(x) for x in getattr(self, f"{split}_x")]
            ys = [_as_y(y) for y in getattr(self, f"{split}_y")]
            if len(xs) != m or len(ys) != m:
                raise DataFormatError(
                    f"{split}_x and {split}_y must have one entry per client ({m}); "
                    f"got {len(xs)} and {len(ys)}."
                )
            for k, (x, y) in enumerate(zip(xs, ys, strict=True)):
                if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0]:
                    raise DataFormatError(
                        f"client {self.client_ids[k]!r} {split}: x must be (n, d) and y (n,); "
                        f"got {tuple(x.shape)} and {tuple(y.shape)}."
                    )
                if d is None:
                    d = int(x.shape[1])
                if x.shape[1] != d:
                    raise DataFormatError(
                        f"client {self.client_ids[k]!r} {split}: {x.shape[1]} features, "
                        f"expected {d}."
                    )
                if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.n_classes):
                    raise DataFormatError(
                        f"client {self.client_ids[k]!r} {split}: labels must be in "
                        f"[0, {self.n_classes}); got range [{int(y.min())}, {int(y.max())}]."
                    )
                if not torch.isfinite(x).all():
                    raise DataFormatError(
                        f"client {self.client_ids[k]!r} {split}: features contain NaN or inf."
                    )
            setattr(self, f"{split}_x", xs)
            setattr(self, f"{split}_y", ys)
        assert d is not None
        for k in range(m):
            if self.train_y[k].numel() == 0:
                raise DataFormatError(f"client {self.client_ids[k]!r} has no training data.")
        self.feature_shape = tuple(int(s) for s in self.feature_shape) or (d,)
        if math.prod(self.feature_shape) != d:
            raise DataFormatError(
                f"feature_shape {self.feature_shape} has {math.prod(self.feature_shape)} "
                f"entries but the data has {d} features."
            )

    @classmethod
    def _unchecked(
        cls,
        client_ids: list[str],
        parts: dict[str, list[torch.Tensor]],
        n_classes: int,
        feature_shape: tuple[int, ...],
        name: str,
        scaling: str = "none",
    ) -> FederatedDataset:
        """A data set from tensors already in the checked form (``float32`` / ``int64``, one per
        client and split, consistent shapes): what a generator of checked data builds, without
        checking every tensor again. ``parts`` maps ``"train_x"``, ... to the per-client lists."""
        out = cls.__new__(cls)
        out.client_ids = client_ids
        for key in ("train_x", "train_y", "val_x", "val_y", "test_x", "test_y"):
            setattr(out, key, parts[key])
        out.n_classes, out.feature_shape, out.name = n_classes, feature_shape, name
        out.scaling = scaling
        out._concat_cache = {}
        return out

    # ------------------------------------------------------------------ sizes
    @property
    def n_clients(self) -> int:
        """Number of clients ``m``."""
        return len(self.client_ids)

    @property
    def n_features(self) -> int:
        """Number of (flattened) features ``d``."""
        return int(self.train_x[0].shape[1])

    def sizes(self, split: str = "train") -> np.ndarray:
        """Per-client number of examples of ``split`` (``"train"``, ``"val"`` or ``"test"``)."""
        return np.array([int(y.shape[0]) for y in self._ys(split)], dtype=np.int64)

    def offsets(self, split: str = "train") -> np.ndarray:
        """Where each client's rows of ``split`` begin in :meth:`concat`: ``(m + 1,)``, client ``k``
        owning rows ``offsets[k]:offsets[k + 1]`` (from :meth:`sizes`: nothing is stacked)."""
        return np.concatenate([[0], np.cumsum(self.sizes(split))]).astype(np.int64)

    def content_sha256(self) -> str:
        """SHA-256 of the data's contents: every client's id and its train, val and test
        features and labels, streamed array by array (:func:`privmtl.io.arrays_sha256`).

        Equal only for the same clients, in the same order, with the same split and values.
        """
        ids = np.frombuffer("\n".join(self.client_ids).encode(), dtype=np.uint8)

        def arrays() -> Any:
            yield ids
            for split in _SPLITS:
                for x, y in zip(self._xs(split), self._ys(split), strict=True):
                    yield x.detach().cpu()
                    yield y.detach().cpu()

        return arrays_sha256(arrays())

    def n_samples(self, split: str = "train") -> int:
        """Total number of examples of ``split`` over all clients."""
        return int(self.sizes(split).sum())

    def _xs(self, split: str) -> list[torch.Tensor]:
        if split not in _SPLITS:
            raise InvalidParameterError(
                f"The 'split' parameter must be one of {_SPLITS}; got {split!r}."
            )
        return getattr(self, f"{split}_x")  # type: ignore[no-any-return]

    def _ys(self, split: str) -> list[torch.Tensor]:
        self._xs(split)
        return getattr(self, f"{split}_y")  # type: ignore[no-any-return]

    def split(self, split: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Return ``(xs, ys)``, the per-client tensors of ``split``."""
        return self._xs(split), self._ys(split)

    def concat(self, split: str = "train") -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """All clients' ``split`` data stacked: ``(X (N, d), y (N,), offsets (m + 1,))``.

        Client ``k`` owns rows ``offsets[k]:offsets[k + 1]``. The result is cached, keyed by the
        identity and version counter of every per-client tensor, so replacing a client's tensor
        or writing into it in place (also on a deep copy) rebuilds it.
        """
        xs, ys = self.split(split)
        key = concat_key(xs, ys)
        cached = self._concat_cache.get(split)
        if cached is None or cached[0] != key:
            offsets = np.concatenate([[0], np.cumsum([y.shape[0] for y in ys])]).astype(np.int64)
            cached = (key, (torch.cat(xs), torch.cat(ys), offsets))
            self._concat_cache[split] = cached
        return cached[1]

    def take(
        self, clients: Sequence[int] | np.ndarray, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """The ``split`` data of the clients at positions ``clients`` (in that order), stacked:
        ``(X (N, d), y (N,), offsets (len(clients) + 1,))``, the ``j``-th client owning rows
        ``offsets[j]:offsets[j + 1]``. Only these clients' data are read (the engine takes each
        round's sampled clients this way)."""
        xs, ys = self.split(split)
        idx = self._positions(clients)
        if not idx:
            return self._no_rows()
        sx, sy = [xs[i] for i in idx], [ys[i] for i in idx]
        offsets = np.concatenate([[0], np.cumsum([y.shape[0] for y in sy])]).astype(np.int64)
        return torch.cat(sx), torch.cat(sy), offsets

    def _positions(self, clients: Sequence[int] | np.ndarray) -> list[int]:
        """``clients`` as a list of positions, each checked to be in ``[0, m)``."""
        idx = [int(i) for i in clients]
        bad = [i for i in idx if not 0 <= i < self.n_clients]
        if bad:
            raise InvalidParameterError(
                f"The 'clients' parameter must hold indices in [0, {self.n_clients}); got {bad[0]}."
            )
        return idx

    def _no_rows(self) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """:meth:`take`'s result for no clients."""
        d = self.n_features
        return torch.zeros((0, d)), torch.zeros(0, dtype=torch.int64), np.zeros(1, np.int64)

    def subset(self, clients: Sequence[int]) -> FederatedDataset:
        """A new dataset with the clients at positions ``clients`` (in that order)."""
        idx = self._positions(clients)
        kw = {
            f"{s}_{a}": [getattr(self, f"{s}_{a}")[i] for i in idx] for s in _SPLITS for a in "xy"
        }
        out = FederatedDataset(
            client_ids=[self.client_ids[i] for i in idx],
            n_classes=self.n_classes,
            feature_shape=self.feature_shape,
            name=self.name,
            **kw,
        )
        out.scaling = self.scaling
        return out

    def summary(self) -> dict[str, Any]:
        """JSON-serializable description: clients, examples per split, features, classes."""
        tr = self.sizes("train")
        return {
            "name": self.name,
            "n_clients": self.n_clients,
            "n_features": self.n_features,
            "feature_shape": list(self.feature_shape),
            "n_classes": self.n_classes,
            "n_train": int(tr.sum()),
            "n_val": self.n_samples("val"),
            "n_test": self.n_samples("test"),
            "train_per_client": {
                "min": int(tr.min()),
                "median": float(np.median(tr)),
                "max": int(tr.max()),
            },
        }

    def __repr__(self) -> str:
        s = self.summary()
        return (
            f"FederatedDataset(name={s['name']!r}, n_clients={s['n_clients']}, "
            f"n_features={s['n_features']}, n_classes={s['n_classes']}, n_train={s['n_train']}, "
            f"n_val={s['n_val']}, n_test={s['n_test']})"
        )


# ====================================================================== LEAF reader
