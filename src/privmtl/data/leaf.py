"""LEAF's federated data: :func:`load_leaf` reads LEAF's JSON shards (``path/train/*.json[.gz]`` and
``path/test/*.json[.gz]``), keeps the writers present in both splits, carves a seeded per-client
validation split out of each writer's training data, and caches the parsed arrays as ``.npz``
outside the repository (parsing FEMNIST's JSON takes seconds, loading the cache milliseconds)."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privmtl._validation import (
    check_int,
    check_real,
    check_rng,
)
from privmtl.data.federated_dataset import FederatedDataset
from privmtl.exceptions import DataFormatError, InvalidParameterError

__all__ = ["default_cache_dir", "load_leaf"]

_CACHE_VERSION = 1


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

    tx, ty, vx, vy = _carve_validation(train, users, val_fraction, base)
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


def _carve_validation(
    train: dict[str, tuple[np.ndarray, np.ndarray]],
    users: list[str],
    val_fraction: float,
    base: int,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Every writer's training rows split into train and validation (``val_fraction`` of them,
    at least one training row kept), by a permutation seeded by ``base`` and the writer's id:
    the train features, train labels, validation features and validation labels, per writer."""
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
    return tx, ty, vx, vy
