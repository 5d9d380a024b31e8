"""Federated (one client = one task) classification data: LEAF reader and synthetic generator.

A :class:`FederatedDataset` holds, for each of ``m`` clients, train / validation / test tensors
(features ``float32`` of shape ``(n, d)``, labels ``int64`` of shape ``(n,)``). Images are stored
flattened row by row (``d = 784`` for FEMNIST) and :attr:`FederatedDataset.feature_shape` says how
to reshape them (``(1, 28, 28)``); models reshape themselves.

Two sources:

* :func:`load_leaf` reads LEAF's JSON shards (``path/train/*.json[.gz]`` and
  ``path/test/*.json[.gz]``), keeps the writers present in both splits, carves a seeded per-client
  validation split out of each writer's training data, and caches the parsed arrays as ``.npz``
  outside the repository (parsing FEMNIST's JSON takes seconds, loading the cache milliseconds).
* :func:`make_synthetic_federated` draws a heterogeneous federated problem in the spirit of LEAF's
  ``synthetic(alpha, beta)`` (Li et al., FedProx): per-client softmax models scattered around a
  shared one, per-client feature shifts and unequal client sizes, so that both federation (shared
  part) and personalization (client part) help.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privmtl._validation import (
    CLIENT_BYTES,
    check_choice,
    check_int,
    check_memory,
    check_real,
    check_rng,
)
from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.io import arrays_sha256

__all__ = [
    "FEATURE_COVS",
    "LEAF_SIZE_BOUNDS",
    "LEAF_SIZE_LOGNORMAL",
    "FederatedDataset",
    "SyntheticLaw",
    "default_cache_dir",
    "load_leaf",
    "make_synthetic_federated",
    "synthetic_client_ids",
    "synthetic_client_sizes",
    "synthetic_law",
]

_SPLITS = ("train", "val", "test")
_CACHE_VERSION = 1


def _as_x(a: Any) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(a, dtype=np.float32) if not torch.is_tensor(a) else a)
    return t.to(torch.float32)


def _as_y(a: Any) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(a) if not torch.is_tensor(a) else a)
    return t.to(torch.int64)


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
        key = tuple((id(t), t._version) for t in (*xs, *ys))
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
def default_cache_dir() -> Path:
    """``$PRIVMTL_CACHE_DIR/leaf`` if that variable is set, else ``~/.cache/privmtl/leaf``."""
    root = os.environ.get("PRIVMTL_CACHE_DIR")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "privmtl"
    return base / "leaf"


def _shards(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise DataFormatError(
            f"LEAF directory {directory} does not exist (expected train/ and "
            "test/ sub-directories with *.json or *.json.gz shards)."
        )
    files = sorted(
        p
        for p in directory.iterdir()
        if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz"))
    )
    if not files:
        raise DataFormatError(f"No LEAF shards (*.json or *.json.gz) in {directory}.")
    return files


def _read_json(path: Path) -> Any:
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as fh:
                return json.load(fh)
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataFormatError(f"Cannot parse LEAF shard {path}: {exc}") from exc


def _parse_split(files: list[Path]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Map user -> (x float32 (n, d), y int64 (n,)) over all shards of one split."""
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    where: dict[str, Path] = {}
    dim: int | None = None
    for path in files:
        doc = _read_json(path)
        if not isinstance(doc, dict) or "users" not in doc or "user_data" not in doc:
            raise DataFormatError(
                f"LEAF shard {path} must be an object with keys 'users' and 'user_data'."
            )
        users, data = doc["users"], doc["user_data"]
        counts = doc.get("num_samples")
        if not isinstance(users, list) or not isinstance(data, dict):
            raise DataFormatError(
                f"LEAF shard {path}: 'users' must be a list and 'user_data' an object."
            )
        if counts is not None and (not isinstance(counts, list) or len(counts) != len(users)):
            raise DataFormatError(f"LEAF shard {path}: 'num_samples' must list one count per user.")
        for j, user in enumerate(users):
            user = str(user)
            if user in where:
                raise DataFormatError(f"User {user!r} appears in both {where[user]} and {path}.")
            rec = data.get(user)
            if not isinstance(rec, dict) or "x" not in rec or "y" not in rec:
                raise DataFormatError(
                    f"LEAF shard {path}: user {user!r} needs 'x' and 'y' in 'user_data'."
                )
            rx, ry = rec["x"], rec["y"]
            if not isinstance(rx, list) or not isinstance(ry, list) or len(rx) != len(ry):
                raise DataFormatError(
                    f"LEAF shard {path}: user {user!r} has {len(rx) if isinstance(rx, list) else '?'}"
                    f" x rows but {len(ry) if isinstance(ry, list) else '?'} labels."
                )
            if counts is not None and counts[j] != len(ry):
                raise DataFormatError(
                    f"LEAF shard {path}: user {user!r} has num_samples="
                    f"{counts[j]} but {len(ry)} examples."
                )
            if not rx:
                x = np.zeros((0, dim or 0), dtype=np.float32)
            else:
                lens = {len(r) if isinstance(r, list) else -1 for r in rx}
                if len(lens) != 1 or -1 in lens:
                    raise DataFormatError(
                        f"LEAF shard {path}: user {user!r} has feature rows of different lengths "
                        f"{sorted(lens)} (expected flattened images of one size, e.g. 784)."
                    )
                try:
                    x = np.asarray(rx, dtype=np.float32)
                except (TypeError, ValueError) as exc:
                    raise DataFormatError(
                        f"LEAF shard {path}: user {user!r} has non-numeric features."
                    ) from exc
                if dim is None:
                    dim = int(x.shape[1])
                elif x.shape[1] != dim:
                    raise DataFormatError(
                        f"LEAF shard {path}: user {user!r} has {x.shape[1]} features per example, "
                        f"other users have {dim}."
                    )
                if not np.isfinite(x).all():
                    raise DataFormatError(f"LEAF shard {path}: user {user!r} has NaN/inf features.")
            try:
                yf = np.asarray(ry, dtype=np.float64)
            except (TypeError, ValueError) as exc:
                raise DataFormatError(
                    f"LEAF shard {path}: user {user!r} has non-numeric labels."
                ) from exc
            if yf.ndim != 1 or (yf.size and (np.any(yf < 0) or np.any(yf != np.round(yf)))):
                raise DataFormatError(
                    f"LEAF shard {path}: user {user!r} labels must be non-negative integers."
                )
            out[user] = (x, yf.astype(np.int64))
            where[user] = path
    if dim is not None:  # users with no rows got (0, 0) before dim was known
        out = {u: (x.reshape(-1, dim) if x.size == 0 else x, y) for u, (x, y) in out.items()}
    return out


def _cache_key(files: list[Path]) -> str:
    h = hashlib.sha256(f"privmtl-leaf-v{_CACHE_VERSION}".encode())
    for p in files:
        st = p.stat()
        h.update(f"{p.parent.name}/{p.name}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:24]


def _pack(parsed: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    users = sorted(parsed)
    xs = [parsed[u][0] for u in users]
    ys = [parsed[u][1] for u in users]
    dim = next((x.shape[1] for x in xs if x.ndim == 2), 0)
    return {
        "users": np.array(users, dtype=np.str_),
        "x": np.concatenate(xs) if xs else np.zeros((0, dim), np.float32),
        "y": np.concatenate(ys) if ys else np.zeros(0, np.int64),
        "offsets": np.concatenate([[0], np.cumsum([len(y) for y in ys])]).astype(np.int64),
    }


def _unpack(arrs: dict[str, np.ndarray], prefix: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    users, x, y, off = (arrs[f"{prefix}_{k}"] for k in ("users", "x", "y", "offsets"))
    return {str(u): (x[off[i] : off[i + 1]], y[off[i] : off[i + 1]]) for i, u in enumerate(users)}


def load_leaf(
    path: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    min_train: int = 1,
    val_fraction: float = 0.1,
    random_state: int | np.random.Generator | None = 0,
    use_cache: bool = True,
) -> FederatedDataset:
    """Read a LEAF classification data set (e.g. FEMNIST) as a :class:`FederatedDataset`.

    Parameters
    ----------
    path : path-like
        Folder with ``train/`` and ``test/`` sub-folders of LEAF JSON shards (``*.json`` or
        ``*.json.gz``): ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [[...],
        ...], "y": [...]}}}``, ``x`` rows being flattened numeric feature vectors.
    cache_dir : path-like, optional
        Where to keep the parsed copy (``leaf-<key>.npz``); default :func:`default_cache_dir`
        (``$PRIVMTL_CACHE_DIR/leaf`` or ``~/.cache/privmtl/leaf``, outside the repository). The
        key hashes the shard names, sizes and modification times, so the cache is rebuilt when
        any input changes.
    min_train : int, default 1
        Keep only writers with at least this many training examples (before the validation split).
    val_fraction : float in [0, 1), default 0.1
        Each writer's validation split is ``floor(val_fraction * n_k)`` of its training examples,
        capped so that at least one training example remains, drawn uniformly without
        replacement.
    random_state : int, numpy Generator or None, default 0
        Seed of the validation split. Writer ``k``'s split uses its own stream seeded by
        ``(seed, crc32(writer id))``, so it does not change when other writers are added or
        removed.
    use_cache : bool, default True
        ``False`` always parses the JSON and writes no cache.

    Returns
    -------
    FederatedDataset
        One client per writer present in both ``train`` and ``test`` (sorted by writer id),
        ``n_classes = 1 + max label``, ``feature_shape = (1, 28, 28)`` for 784 features and
        ``(d,)`` otherwise. For ``/work/shared/data/femnist-leaf`` that is 105 writers with
        14 708 training (train + val) and 1 685 test images.

    Raises
    ------
    DataFormatError
        Missing folders, no shards, unparsable JSON, missing keys, ``x``/``y`` length mismatch,
        rows of different lengths (pixel dimensions), non-integer labels, duplicate users, or no
        writer with both splits.
    """
    root = Path(path)
    if not root.is_dir():
        raise DataFormatError(f"LEAF data folder {root} does not exist.")
    min_train = check_int("min_train", min_train, low=1)
    val_fraction = check_real("val_fraction", val_fraction, low=0.0, high=1.0, closed="left")
    train_files, test_files = _shards(root / "train"), _shards(root / "test")

    arrays: dict[str, np.ndarray] | None = None
    cache_file: Path | None = None
    if use_cache:
        folder = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        cache_file = folder / f"leaf-{_cache_key(train_files + test_files)}.npz"
        if cache_file.is_file():
            try:
                with np.load(cache_file, allow_pickle=False) as npz:
                    arrays = {k: npz[k] for k in npz.files}
            except (OSError, ValueError, EOFError, zlib.error):
                arrays = None  # corrupt cache: rebuild
    if arrays is None:
        tr, te = _pack(_parse_split(train_files)), _pack(_parse_split(test_files))
        arrays = {f"train_{k}": v for k, v in tr.items()} | {f"test_{k}": v for k, v in te.items()}
        if cache_file is not None:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_file.with_suffix(f".tmp{os.getpid()}.npz")
            np.savez(tmp, **arrays)  # type: ignore[arg-type]
            os.replace(tmp, cache_file)

    train, test = _unpack(arrays, "train"), _unpack(arrays, "test")
    dims = {a.shape[1] for a, _ in (*train.values(), *test.values()) if a.size}
    if len(dims) > 1:
        raise DataFormatError(f"train and test shards have different feature sizes {sorted(dims)}.")
    users = sorted(u for u in train if u in test and len(train[u][1]) >= min_train)
    if not users:
        raise DataFormatError(
            f"No LEAF writer in {root} has both train and test data (min_train={min_train})."
        )
    labels = [y for u in users for y in (train[u][1], test[u][1]) if y.size]
    n_classes = int(max(int(y.max()) for y in labels)) + 1
    dim = dims.pop()
    base = (
        int(check_rng(random_state).integers(2**63))
        if not isinstance(random_state, (int, np.integer))
        else int(random_state)
    )
    if base < 0:
        raise InvalidParameterError(f"The 'random_state' parameter must be >= 0; got {base}.")

    tx: list[torch.Tensor] = []
    ty: list[torch.Tensor] = []
    vx: list[torch.Tensor] = []
    vy: list[torch.Tensor] = []
    for u in users:
        x, y = train[u]
        n = len(y)
        n_val = min(math.floor(val_fraction * n), n - 1)
        perm = np.random.default_rng([base, zlib.crc32(u.encode())]).permutation(n)
        val_idx, tr_idx = np.sort(perm[:n_val]), np.sort(perm[n_val:])
        tx.append(torch.from_numpy(x[tr_idx]))
        ty.append(torch.from_numpy(y[tr_idx]))
        vx.append(torch.from_numpy(x[val_idx]))
        vy.append(torch.from_numpy(y[val_idx]))
    return FederatedDataset(
        client_ids=users,
        train_x=tx,
        train_y=ty,
        val_x=vx,
        val_y=vy,
        test_x=[torch.from_numpy(np.ascontiguousarray(test[u][0])) for u in users],
        test_y=[torch.from_numpy(np.ascontiguousarray(test[u][1])) for u in users],
        n_classes=n_classes,
        feature_shape=(1, 28, 28) if dim == 784 else (dim,),
        name=root.name,
    )


# ====================================================================== synthetic
LEAF_SIZE_LOGNORMAL = (3.0, 2.0)
"""``(mu, s)`` of LEAF's law of examples per client (``data/synthetic/main.py``)."""
FEATURE_COVS = ("isotropic", "leaf")
"""Within-client feature covariances of :func:`make_synthetic_federated`."""
LEAF_SIZE_BOUNDS = (5, 1000)
"""Smallest and largest client of LEAF's law: ``n_k = min(5 + floor(LogNormal(3, 2)), 1000)``."""


def synthetic_client_sizes(
    n_clients: int,
    samples_per_client: int | tuple[int, int] | None = None,
    *,
    size_lognormal: tuple[float, float] = LEAF_SIZE_LOGNORMAL,
    random_state: int | np.random.Generator | None = None,
) -> np.ndarray:
    r"""Examples per client (before the train/validation/test split) of the synthetic federation.

    Parameters
    ----------
    n_clients : int
        ``m``.
    samples_per_client : int, (int, int) or None, default None
        ``None``: LEAF's law, :math:`n_k = \min(5 + \lfloor e^{Z_k} \rfloor, 1000)` with
        :math:`Z_k \sim N(\mu, s^2)` and :math:`(\mu, s)` = ``size_lognormal`` (LEAF's
        ``synthetic``: (3, 2): median 24 examples, a third of the clients below 15, about 3 %
        at the cap of 1000). An int: every client has that many. ``(lo, hi)``: log-uniform on
        ``[lo, hi]``.
    size_lognormal : (float, float), default (3.0, 2.0)
        :math:`(\mu, s)` of the lognormal law (``s >= 0``), used when ``samples_per_client`` is
        None.
    random_state : int, numpy Generator or None

    Returns
    -------
    ndarray of int64, shape (n_clients,)
    """
    m = check_int("n_clients", n_clients, low=1)
    rng = check_rng(random_state)
    if samples_per_client is None:
        if not isinstance(size_lognormal, tuple | list) or len(size_lognormal) != 2:
            raise InvalidParameterError(
                f"The 'size_lognormal' parameter must be a (mu, s) pair; got {size_lognormal!r}."
            )
        mu = check_real("size_lognormal[0]", size_lognormal[0])
        s = check_real("size_lognormal[1]", size_lognormal[1], low=0.0)
        lo, hi = LEAF_SIZE_BOUNDS
        raw = (
            np.floor(rng.lognormal(mu, s, size=m))
            if s > 0
            else np.full(m, math.floor(math.exp(mu)))
        )
        return np.asarray(np.minimum(lo + np.minimum(raw, hi), hi), dtype=np.int64)
    if isinstance(samples_per_client, tuple | list):
        if len(samples_per_client) != 2:
            raise InvalidParameterError(
                "The 'samples_per_client' parameter must be None, an int or a (low, high) pair; "
                f"got {samples_per_client!r}."
            )
        lo = check_int("samples_per_client[0]", samples_per_client[0], low=3)
        hi = check_int("samples_per_client[1]", samples_per_client[1], low=lo)
    else:
        lo = hi = check_int("samples_per_client", samples_per_client, low=3)
    if lo == hi:
        return np.full(m, lo, dtype=np.int64)
    sizes = np.floor(np.exp(rng.uniform(np.log(lo), np.log(hi + 1), size=m))).astype(np.int64)
    return np.asarray(np.clip(sizes, lo, hi), dtype=np.int64)


def make_synthetic_federated(
    *,
    n_clients: int = 50,
    n_features: int = 60,
    n_classes: int = 10,
    samples_per_client: int | tuple[int, int] | None = None,
    size_lognormal: tuple[float, float] = LEAF_SIZE_LOGNORMAL,
    heterogeneity: float = 0.5,
    feature_shift: float = 0.5,
    feature_spread: float = 0.5,
    feature_cov: str = "isotropic",
    label_noise: float = 0.0,
    test_fraction: float = 0.2,
    val_fraction: float = 0.1,
    random_state: int | np.random.Generator | None = None,
) -> FederatedDataset:
    r"""Heterogeneous synthetic federated classification (LEAF-style; softmax models around a shared one).

    For client :math:`k` (all draws independent):

    * shared model :math:`W_0 \in \mathbb{R}^{C \times d}, b_0 \in \mathbb{R}^C` with i.i.d.
      :math:`N(0, 1)` entries (drawn once);
    * client model :math:`W_k = W_0 + \tau A_k`, :math:`b_k = b_0 + \tau a_k`, :math:`A_k, a_k`
      i.i.d. :math:`N(0, 1)`, :math:`\tau` = ``heterogeneity``;
    * features :math:`x \sim N(v_k, \Sigma)` with :math:`\Sigma = I` (``feature_cov="isotropic"``)
      or :math:`\Sigma = \mathrm{diag}(j^{-1.2})_{j=1..d}` (``"leaf"``, LEAF's and FedProx's law);
      client mean :math:`v_k \sim N(\beta_k \mathbf 1, s^2 I)` with :math:`s` =
      ``feature_spread`` and :math:`\beta_k \sim N(0,` ``feature_shift``:math:`^2)`;
    * label :math:`y = \arg\max_c (W_k x + b_k)_c`, then, with probability ``label_noise``,
      replaced by a class drawn uniformly (it may draw the same class);
    * size :math:`n_k` from :func:`synthetic_client_sizes` (default: LEAF's lognormal law, many
      clients with a few examples and a few with hundreds); ``round(test_fraction * n_k)``
      examples go to test, then ``floor(val_fraction * rest)`` to validation (at least one
      training example is always kept, so the smallest clients have no validation example).

    The defaults follow the federated-learning literature where it describes a learning problem:
    ``d = 60`` features and ``C = 10`` classes as in FedProx's synthetic(alpha, beta), LEAF's law
    of examples per client (many clients with a few examples, a few with hundreds), a feature
    shift :math:`\beta_k` of spread 0.5 (FedProx's synthetic(0.5, 0.5)) and noise-free labels.
    Unlike FedProx's generator, whose client models share nothing but a scalar mean, and LEAF's,
    whose client models are all multiples of one matrix, the client models here share
    :math:`W_0` and keep a part of their own: :math:`\tau = 0.5` puts a fifth of the variance of
    a client's model in its own part (:math:`\tau^2 / (1 + \tau^2) = 0.2`).

    The feature law departs from LEAF's on purpose. With LEAF's covariance (small variance
    :math:`j^{-1.2}` within a client) and unit spread of client means (``feature_cov="leaf",
    feature_spread=1``), a client's examples sit in a small region where one class dominates:
    predicting each client's majority class is right on 84 % of the examples (m = 1 000, seed 0),
    so a client with ten examples needs nobody and the data measure class priors, not learning.
    The default (isotropic features, client means spread by half the within-client standard
    deviation) keeps a per-client feature shift while a client's labels need its model: the
    majority class covers 33 % of the examples. ``benchmarks/results/pmtl_population.md``
    measures collaboration against training alone under both laws and other settings.

    With ``heterogeneity = 0`` all clients share one labelling rule (a global model suffices); as it
    grows, client models diverge and personalization helps, while the shared :math:`W_0` keeps
    federation useful for clients with few samples.

    Parameters
    ----------
    n_clients, n_features, n_classes : int
        ``m``, ``d`` (>= 1) and ``C`` (>= 2).
    samples_per_client : int, (int, int) or None, default None
        Total examples per client before splitting (see :func:`synthetic_client_sizes`; >= 3 each
        for an int or a pair). None: LEAF's lognormal law.
    size_lognormal : (float, float), default (3.0, 2.0)
        :math:`(\mu, s)` of the lognormal law (LEAF: (3, 2)).
    heterogeneity : float >= 0, default 0.5
        Spread :math:`\tau` of client models around the shared model.
    feature_shift : float >= 0, default 0.5
        Standard deviation of the per-client feature offset :math:`\beta_k`.
    feature_spread : float >= 0, default 0.5
        Standard deviation :math:`s` of a client's feature mean around :math:`\beta_k \mathbf 1`
        (LEAF and FedProx: 1).
    feature_cov : {"isotropic", "leaf"}, default "isotropic"
        Within-client feature covariance: :math:`I`, or LEAF's :math:`\mathrm{diag}(j^{-1.2})`.
    label_noise : float in [0, 1], default 0.0
        Probability that a label is redrawn uniformly.
    test_fraction, val_fraction : float in [0, 1)
    random_state : int, numpy Generator or None

    Returns
    -------
    FederatedDataset
        ``client_ids`` ``"synthetic_000"``, ...; ``feature_shape = (d,)``.
    """
    law, sizes, rng = synthetic_law(
        n_clients=n_clients, n_features=n_features, n_classes=n_classes,
        samples_per_client=samples_per_client, size_lognormal=size_lognormal,
        heterogeneity=heterogeneity, feature_shift=feature_shift,
        feature_spread=feature_spread, feature_cov=feature_cov, label_noise=label_noise,
        test_fraction=test_fraction, val_fraction=val_fraction, random_state=random_state,
    )  # fmt: skip
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in ("tx", "ty", "vx", "vy", "sx", "sy")}
    for n in sizes:
        drawn = law.draw_client(rng, int(n))
        assert drawn is not None
        for key, arr in zip(parts, drawn, strict=True):
            parts[key].append(torch.from_numpy(arr))
    m = len(sizes)
    return FederatedDataset(
        client_ids=synthetic_client_ids(m),
        train_x=parts["tx"],
        train_y=parts["ty"],
        val_x=parts["vx"],
        val_y=parts["vy"],
        test_x=parts["sx"],
        test_y=parts["sy"],
        n_classes=law.n_classes,
        feature_shape=(law.n_features,),
        name=law.name(m),
    )


def synthetic_client_ids(m: int) -> list[str]:
    """The client ids of the synthetic federation: ``"synthetic_000"``, ..."""
    return [f"synthetic_{k:03d}" for k in range(m)]


@dataclass(frozen=True)
class SyntheticLaw:
    """The law of one client of :func:`make_synthetic_federated` (its parameters and shared model).

    :meth:`draw_client` draws one client from a generator in the order the generator of the
    whole federation does, so that the clients drawn one after another from one generator are
    the federation's.
    """

    n_features: int
    n_classes: int
    heterogeneity: float
    feature_shift: float
    feature_spread: float
    feature_cov: str
    label_noise: float
    test_fraction: float
    val_fraction: float
    w0: np.ndarray = field(repr=False)
    b0: np.ndarray = field(repr=False)

    def name(self, m: int) -> str:
        """The data set's name for ``m`` clients."""
        return (
            f"synthetic(m={m}, d={self.n_features}, C={self.n_classes}, "
            f"tau={self.heterogeneity:g}, shift={self.feature_shift:g}, "
            f"spread={self.feature_spread:g}, cov={self.feature_cov}, noise={self.label_noise:g})"
        )

    def split_sizes(self, n: np.ndarray) -> dict[str, np.ndarray]:
        """Examples of each split (``"train"``, ``"val"``, ``"test"``) of clients of ``n``
        examples, without drawing them."""
        n = np.asarray(n, dtype=np.int64)
        n_test = np.minimum(np.round(self.test_fraction * n).astype(np.int64), n - 1)
        n_val = np.minimum(
            np.floor(self.val_fraction * (n - n_test)).astype(np.int64), n - n_test - 1
        )
        return {"train": n - n_test - n_val, "val": n_val, "test": n_test}

    def draw_client(
        self, rng: np.random.Generator, n: int, *, keep: bool = True
    ) -> tuple[np.ndarray, ...] | None:
        """Draw one client of ``n`` examples: ``(train_x, train_y, val_x, val_y, test_x,
        test_y)`` as ``float32`` / ``int64`` arrays; with ``keep=False`` only advance ``rng``
        past the client's draws and return None."""
        if not keep:
            self.skip_client(rng, n)
            return None
        d = self.n_features
        out = {
            split: (np.empty((hi - lo, d), np.float32), np.empty(hi - lo, np.int64))
            for split, (lo, hi) in self._split_rows(n).items()
        }
        self.draw_rows(rng, n, out)
        return tuple(a for split in ("train", "val", "test") for a in out[split])

    def _split_rows(self, n: int) -> dict[str, tuple[int, int]]:
        """Where each split's rows lie in the permutation of a client of ``n`` examples: test
        first, then validation, then training (sizes of :meth:`split_sizes`)."""
        n_test = min(round(self.test_fraction * n), n - 1)
        n_val = min(math.floor(self.val_fraction * (n - n_test)), n - n_test - 1)
        return {"test": (0, n_test), "val": (n_test, n_test + n_val), "train": (n_test + n_val, n)}

    def n_normals(self, n: int) -> int:
        """How many standard normal draws a client of ``n`` examples takes (:meth:`draw_client`
        draws them in this order: the client model ``(C, d)`` and bias ``(C,)``, the feature
        shift when ``feature_shift > 0``, the feature mean ``(d,)`` and the features ``(n, d)``)."""
        c, d = self.n_classes, self.n_features
        return c * d + c + (self.feature_shift > 0) + d + n * d

    def skip_client(
        self, rng: np.random.Generator, n: int, buffer: np.ndarray | None = None
    ) -> None:
        """Advance ``rng`` past one client of ``n`` examples exactly as :meth:`draw_client` does,
        computing nothing from the draws.

        A ``normal(loc, scale)`` draw takes one standard normal draw, so the client's normal
        draws are one call; ``buffer`` (float64, at least :meth:`n_normals` long) receives them
        without an allocation per client.
        """
        k = self.n_normals(n)
        if buffer is None or len(buffer) < k:
            buffer = np.empty(k)
        rng.standard_normal(out=buffer[:k])
        if self.label_noise > 0:
            rng.random(n)
            rng.integers(0, self.n_classes, size=n)
        rng.permutation(n)

    def draw_rows(
        self,
        rng: np.random.Generator,
        n: int,
        out: Mapping[str, tuple[np.ndarray, np.ndarray]],
        work: np.ndarray | None = None,
    ) -> None:
        """Draw one client of ``n`` examples and write its rows of each split of ``out``
        (``"train"``, ``"val"`` or ``"test"`` to ``(x, y)``: float32 ``(n_split, d)`` and int64
        ``(n_split,)``, the split's size of :meth:`split_sizes`).

        The client's draws: its model ``W_k = W_0 + tau A_k`` and bias, its feature shift and
        mean, its standard normal features ``z`` (``(n, d)``), the label noise's coins, then a
        permutation of its examples, whose first rows go to test, the next to validation and
        the rest to training (:meth:`_split_rows`). Every label is computed from the client's
        whole feature matrix ``v_k + z * scale`` (one product for every split asked for, so a
        client's rows are the same whatever splits are asked); the splits not asked for are not
        copied. ``work`` (float64, at least ``n * d`` long) holds the features without an
        allocation per client. :meth:`draw_client` and :meth:`skip_client` take the same draws.
        """
        c, d, tau, flip = self.n_classes, self.n_features, self.heterogeneity, self.label_noise
        wk = self.w0 + tau * rng.standard_normal((c, d))
        bk = self.b0 + tau * rng.standard_normal(c)
        shift = self.feature_shift
        vk = rng.normal(rng.normal(0.0, shift) if shift > 0 else 0.0, self.feature_spread, size=d)
        if work is None or len(work) < n * d:
            work = np.empty(n * d)
        x = work[: n * d].reshape(n, d)
        rng.standard_normal(out=x)
        if flip > 0:
            redraw = rng.random(n) < flip
            noise = rng.integers(0, c, size=n)
        perm = rng.permutation(n)
        if self.feature_cov != "isotropic":  # z * 1 is z: isotropic features skip the product
            x *= self._scale()
        x += vk  # vk + z * scale, element by element
        y = np.argmax(x @ wk.T + bk, axis=1)
        if flip > 0:
            y = np.where(redraw, noise, y)
        bounds = self._split_rows(n)
        for split, (out_x, out_y) in out.items():
            lo, hi = bounds[split]
            rows = perm[lo:hi]
            out_x[...] = x[rows]  # the float32 cast of astype
            out_y[...] = y[rows]

    def _scale(self) -> np.ndarray:
        """Square root of the diagonal within-client covariance."""
        d = self.n_features
        if self.feature_cov == "leaf":
            return np.asarray(np.arange(1, d + 1, dtype=np.float64) ** -0.6)
        return np.ones(d)


def synthetic_law(
    *,
    n_clients: int,
    n_features: int,
    n_classes: int,
    samples_per_client: int | tuple[int, int] | None,
    size_lognormal: tuple[float, float],
    heterogeneity: float,
    feature_shift: float,
    feature_spread: float,
    feature_cov: str,
    label_noise: float,
    test_fraction: float,
    val_fraction: float,
    random_state: int | np.random.Generator | None,
) -> tuple[SyntheticLaw, np.ndarray, np.random.Generator]:
    """Check :func:`make_synthetic_federated`'s parameters and draw its shared part: the law of a
    client, every client's number of examples, and the generator positioned at client 0."""
    m = check_int("n_clients", n_clients, low=1)
    check_memory("n_clients", m, CLIENT_BYTES, "clients")
    d = check_int("n_features", n_features, low=1)
    c = check_int("n_classes", n_classes, low=2)
    tau = check_real("heterogeneity", heterogeneity, low=0.0)
    shift = check_real("feature_shift", feature_shift, low=0.0)
    spread = check_real("feature_spread", feature_spread, low=0.0)
    check_choice("feature_cov", feature_cov, FEATURE_COVS)
    flip = check_real("label_noise", label_noise, low=0.0, high=1.0)
    test_fraction = check_real("test_fraction", test_fraction, low=0.0, high=1.0, closed="left")
    val_fraction = check_real("val_fraction", val_fraction, low=0.0, high=1.0, closed="left")
    rng = check_rng(random_state)
    w0 = rng.standard_normal((c, d))
    b0 = rng.standard_normal(c)
    sizes = synthetic_client_sizes(
        m, samples_per_client, size_lognormal=size_lognormal, random_state=rng
    )
    law = SyntheticLaw(
        d, c, tau, shift, spread, feature_cov, flip, test_fraction, val_fraction, w0, b0
    )
    return law, sizes, rng
