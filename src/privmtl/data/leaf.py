"""LEAF's federated data: :func:`load_leaf` reads LEAF's JSON shards (``path/train/*.json[.gz]`` and
``path/test/*.json[.gz]``), keeps the writers present in both splits, carves a seeded per-client
validation split out of each writer's training data, and caches the parsed arrays outside the
repository, one ``.npy`` file per array (parsing FEMNIST's JSON takes seconds). The cache is
memory-mapped, every writer's rows a range of it: :class:`LeafFederation` reads a writer's
examples only when they are asked for, and :meth:`LeafFederation.partition` keeps some writers
(a Flower node's own) without reading any."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import shutil
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privmtl._validation import (
    check_int,
    check_real,
    check_rng,
)
from privmtl.data.row_federation import RowFederation, row_ranges
from privmtl.exceptions import DataFormatError, InvalidParameterError

__all__ = ["LeafFederation", "default_cache_dir", "load_leaf"]

# the key of the cached arrays' contents (not of the files' format: a cache of the earlier
# single-file format under the same key is converted, not parsed again)
_CACHE_VERSION = 1
#: The arrays cached per split: writer ids, features, labels, where each writer's rows begin,
#: and each writer's largest label (-1 for none: the classes are known without reading a label).
_CACHE_FIELDS = ("users", "x", "y", "offsets", "top")


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
    y = np.concatenate(ys) if ys else np.zeros(0, np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(y) for y in ys])]).astype(np.int64)
    return {
        "users": np.array(users, dtype=np.str_),
        "x": np.concatenate(xs) if xs else np.zeros((0, dim), np.float32),
        "y": y,
        "offsets": offsets,
        "top": _tops(y, offsets),
    }


def _tops(y: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Each writer's largest label (-1 for a writer without rows), in one vectorised call."""
    top = np.full(len(offsets) - 1, -1, dtype=np.int64)
    rows = np.flatnonzero(np.diff(offsets) > 0)
    if rows.size:
        top[rows] = np.maximum.reduceat(y, offsets[rows])
    return top


def load_leaf(
    path: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    min_train: int = 1,
    val_fraction: float = 0.1,
    random_state: int | np.random.Generator | None = 0,
    use_cache: bool = True,
) -> LeafFederation:
    """Read a LEAF classification data set (e.g. FEMNIST) as a federation read by offsets.

    Parameters
    ----------
    path : path-like
        Folder with ``train/`` and ``test/`` sub-folders of LEAF JSON shards (``*.json`` or
        ``*.json.gz``): ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [[...],
        ...], "y": [...]}}}``, ``x`` rows being flattened numeric feature vectors.
    cache_dir : path-like, optional
        Where to keep the parsed copy (a folder ``leaf-<key>`` of ``.npy`` files, memory-mapped
        when read); default :func:`default_cache_dir` (``$PRIVMTL_CACHE_DIR/leaf`` or
        ``~/.cache/privmtl/leaf``, outside the repository). The key hashes the shard names,
        sizes and modification times, so the cache is rebuilt when any input changes; a cache
        of the earlier single-file format (``leaf-<key>.npz``) is converted once.
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
        ``False`` always parses the JSON, holds it in memory and writes no cache.

    Returns
    -------
    LeafFederation
        A :class:`FederatedDataset` that reads a writer's examples only when asked for
        (:meth:`~LeafFederation.take`, :meth:`~LeafFederation.subset`,
        :meth:`~LeafFederation.partition`; the per-client tensors such as ``train_x`` read every
        writer once). One client per writer present in both ``train`` and ``test`` (sorted by
        writer id),
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
    if use_cache:
        folder = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        arrays = _cached_arrays(
            folder, _cache_key(train_files + test_files), train_files, test_files
        )
    else:
        arrays = _parsed_arrays(train_files, test_files)

    train_users = [str(u) for u in arrays["train_users"].tolist()]
    test_at = {str(u): i for i, u in enumerate(arrays["test_users"].tolist())}
    tr_off, te_off = np.array(arrays["train_offsets"]), np.array(arrays["test_offsets"])
    dims = {int(arrays[f"{s}_x"].shape[1]) for s in ("train", "test") if arrays[f"{s}_x"].shape[0]}
    if len(dims) > 1:
        raise DataFormatError(f"train and test shards have different feature sizes {sorted(dims)}.")
    kept = sorted(
        (u, i, test_at[u])
        for i, u in enumerate(train_users)
        if u in test_at and int(tr_off[i + 1] - tr_off[i]) >= min_train
    )
    if not kept:
        raise DataFormatError(
            f"No LEAF writer in {root} has both train and test data (min_train={min_train})."
        )
    users = [u for u, _, _ in kept]
    tr_pos = np.array([i for _, i, _ in kept], dtype=np.int64)
    te_pos = np.array([j for _, _, j in kept], dtype=np.int64)
    starts = {"train": tr_off[tr_pos], "test": te_off[te_pos]}
    counts = {
        "train": tr_off[tr_pos + 1] - starts["train"],
        "test": te_off[te_pos + 1] - starts["test"],
    }
    top = max(int(arrays["train_top"][tr_pos].max()), int(arrays["test_top"][te_pos].max()))
    dim = dims.pop()
    base = (
        int(check_rng(random_state).integers(2**63))
        if not isinstance(random_state, (int, np.integer))
        else int(random_state)
    )
    if base < 0:
        raise InvalidParameterError(f"The 'random_state' parameter must be >= 0; got {base}.")
    out = LeafFederation.__new__(LeafFederation)
    out._keep(
        _Writers(users, starts["train"], counts["train"], starts["test"], counts["test"]),
        {s: (arrays[f"{s}_x"], arrays[f"{s}_y"]) for s in ("train", "test")},
        _LeafSplit(val_fraction, base),
        top + 1,
        (1, 28, 28) if dim == 784 else (dim,),
        root.name,
    )
    return out


# ====================================================================== the cache


def _parsed_arrays(train_files: list[Path], test_files: list[Path]) -> dict[str, np.ndarray]:
    """Both splits parsed from JSON and packed: ``{"train_x": ..., "test_offsets": ...}``."""
    tr, te = _pack(_parse_split(train_files)), _pack(_parse_split(test_files))
    return {f"train_{k}": v for k, v in tr.items()} | {f"test_{k}": v for k, v in te.items()}


def _cached_arrays(
    folder: Path, key: str, train_files: list[Path], test_files: list[Path]
) -> dict[str, np.ndarray]:
    """The packed arrays of both splits, memory-mapped from the cache folder ``leaf-<key>``
    (one ``.npy`` file per array), which is written first if absent or unreadable: from a cache
    of the earlier single-file format (``leaf-<key>.npz``, read once, then removed) or from
    the JSON shards."""
    target = folder / f"leaf-{key}"
    arrays = _read_cache(target)
    if arrays is not None:
        return arrays
    arrays = _read_npz(folder / f"leaf-{key}.npz")
    old = arrays is not None
    if arrays is None:
        arrays = _parsed_arrays(train_files, test_files)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"leaf-{key}.tmp", dir=folder))
    try:
        for name, arr in arrays.items():
            np.save(tmp / f"{name}.npy", arr, allow_pickle=False)
        if target.exists():  # unreadable: replaced
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:  # another process wrote it first: use that one
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if old:
        (folder / f"leaf-{key}.npz").unlink(missing_ok=True)
    return _read_cache(target) or arrays


def _read_npz(path: Path) -> dict[str, np.ndarray] | None:
    """A cache of the single-file format, or None if absent or unreadable."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, EOFError, zlib.error):
        return None
    for split in ("train", "test"):
        y, off = arrays.get(f"{split}_y"), arrays.get(f"{split}_offsets")
        if y is not None and off is not None and f"{split}_top" not in arrays:
            try:
                arrays[f"{split}_top"] = _tops(y, off)
            except (ValueError, IndexError, TypeError):
                return None
    return arrays if _consistent(arrays) else None


def _read_cache(folder: Path) -> dict[str, np.ndarray] | None:
    """The cache folder's arrays, memory-mapped read-only (no example is read), or None if it
    is absent, incomplete or inconsistent."""
    if not folder.is_dir():
        return None
    arrays = {}
    try:
        for split in ("train", "test"):
            for field in _CACHE_FIELDS:
                name = f"{split}_{field}"
                arrays[name] = np.load(folder / f"{name}.npy", mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    return arrays if _consistent(arrays) else None


def _consistent(arrays: dict[str, np.ndarray]) -> bool:
    """Whether the packed arrays of both splits fit together (kinds, shapes and offsets)."""
    for split in ("train", "test"):
        try:
            users, x, y, off, top = (arrays[f"{split}_{k}"] for k in _CACHE_FIELDS)
        except KeyError:
            return False
        if (
            users.ndim != 1
            or users.dtype.kind != "U"
            or x.ndim != 2
            or x.dtype != np.float32
            or y.shape != (x.shape[0],)
            or y.dtype != np.int64
            or off.shape != (users.shape[0] + 1,)
            or off.dtype != np.int64
            or top.shape != users.shape
            or top.dtype != np.int64
            or int(off[0]) != 0
            or int(off[-1]) != x.shape[0]
            or bool(np.any(np.diff(off) < 0))
        ):
            return False
    return True


# ====================================================================== the federation


@dataclass(frozen=True)
class _Writers:
    """The writers held: ids, and where each one's rows begin and how many there are in the
    training and test sources."""

    ids: list[str]
    train_start: np.ndarray
    train_n: np.ndarray
    test_start: np.ndarray
    test_n: np.ndarray

    def select(self, idx: np.ndarray) -> _Writers:
        return _Writers(
            [self.ids[i] for i in idx.tolist()],
            self.train_start[idx],
            self.train_n[idx],
            self.test_start[idx],
            self.test_n[idx],
        )


@dataclass(frozen=True)
class _LeafSplit:
    """How a writer's training rows are split into train and validation."""

    val_fraction: float
    base: int

    def n_val(self, n: np.ndarray) -> np.ndarray:
        """``floor(val_fraction * n)``, at least one training row kept."""
        return np.minimum(np.floor(self.val_fraction * n).astype(np.int64), n - 1)

    def parts(self, writer: str, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The writer's train and validation rows (sorted, within its ``n`` training rows), by a
        permutation seeded by ``base`` and the writer's id: the same whichever writers are
        held."""
        n_val = min(math.floor(self.val_fraction * n), n - 1)
        perm = np.random.default_rng([self.base, zlib.crc32(writer.encode())]).permutation(n)
        return np.sort(perm[n_val:]), np.sort(perm[:n_val])


class LeafFederation(RowFederation):
    """A LEAF data set read by offsets: :func:`load_leaf`'s result.

    Every writer's training and test rows are a range of the cached arrays (memory-mapped);
    its train / validation split is drawn, when the writer is first read, from its own seeded
    permutation. :meth:`partition` keeps some writers without reading any example, and
    :meth:`take` / :meth:`subset` read only the rows of the writers asked for; the examples are
    byte for byte those of the eager data set (:meth:`materialize`).
    """

    def _keep(
        self,
        writers: _Writers,
        sources: dict[str, tuple[Any, Any]],
        rule: _LeafSplit,
        n_classes: int,
        feature_shape: tuple[int, ...],
        name: str,
    ) -> None:
        n_val = rule.n_val(writers.train_n)
        self._writers, self._rule = writers, rule
        self._parts: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._hold(
            writers.ids,
            {"train": sources["train"], "val": sources["train"], "test": sources["test"]},
            {"train": writers.train_n - n_val, "val": n_val, "test": writers.test_n},
            n_classes,
            feature_shape,
            name,
        )

    def _rows(self, idx: np.ndarray, split: str) -> np.ndarray:
        w = self._writers
        if split == "test":
            return row_ranges(w.test_start[idx], w.test_n[idx])
        side = 0 if split == "train" else 1
        pieces = []
        for j in idx.tolist():
            parts = self._parts.get(j)
            if parts is None:
                parts = self._parts[j] = self._rule.parts(w.ids[j], int(w.train_n[j]))
            pieces.append(int(w.train_start[j]) + parts[side])
        return np.concatenate(pieces) if pieces else np.zeros(0, np.int64)

    def _select(self, idx: np.ndarray) -> LeafFederation:
        out = LeafFederation.__new__(LeafFederation)
        sources = {"train": self._sources["train"], "test": self._sources["test"]}
        out._keep(
            self._writers.select(idx),
            sources,
            self._rule,
            self.n_classes,
            self.feature_shape,
            self.name,
        )
        return out
