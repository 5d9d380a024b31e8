"""Federations read by offsets: LEAF writers and table clients as row ranges, a partition that
reads only its own clients' rows, and the same examples as the eager data set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

import privmtl.data.leaf as leaf
from privmtl.data.federated import FederatedDataset, load_leaf
from privmtl.data.federated_table import load_federated_table
from privmtl.data.readers import dataset_from_frame, group_rows
from privmtl.data.row_federation import ContiguousFederation, row_ranges
from privmtl.exceptions import InvalidParameterError

_SPLITS = ("train", "val", "test")


def _eager(ds: FederatedDataset) -> FederatedDataset:
    """The same clients as a plain data set of separate tensors (what the readers built)."""
    parts = {
        f"{s}_{a}": [t.clone() for t in getattr(ds, f"{s}_{a}")] for s in _SPLITS for a in "xy"
    }
    return FederatedDataset(
        client_ids=list(ds.client_ids),
        n_classes=ds.n_classes,
        feature_shape=ds.feature_shape,
        name=ds.name,
        **parts,
    )


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    np.testing.assert_array_equal(a[2], b[2])


@pytest.fixture
def leaf_dir(tmp_path: Path) -> Path:
    """12 writers w00..w11 (3 to 14 training rows, 1 to 3 test rows, 5 features); w11 has no
    test data."""
    rng = np.random.default_rng(0)
    for split, n_shards in (("train", 3), ("test", 2)):
        docs: list[dict[str, Any]] = [
            {"users": [], "num_samples": [], "user_data": {}} for _ in range(n_shards)
        ]
        for k in range(12 if split == "train" else 11):
            n = 3 + k if split == "train" else 1 + k % 3
            doc = docs[k % n_shards]
            doc["users"].append(f"w{k:02d}")
            doc["num_samples"].append(n)
            doc["user_data"][f"w{k:02d}"] = {
                "x": rng.random((n, 5)).round(3).tolist(),
                "y": rng.integers(0, 7, n).tolist(),
            }
        (tmp_path / split).mkdir()
        for i, doc in enumerate(docs):
            (tmp_path / split / f"s{i}.json").write_text(json.dumps(doc))
    return tmp_path


class _Counting:
    """An array that records the rows read through it."""

    def __init__(self, arr: np.ndarray, log: list[int]) -> None:
        self.arr, self.log = arr, log
        self.shape, self.dtype = arr.shape, arr.dtype

    def __getitem__(self, rows: Any) -> np.ndarray:
        self.log.extend(np.arange(self.shape[0])[rows].tolist())
        return self.arr[rows]


def test_leaf_is_the_eager_data_set_byte_for_byte(leaf_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    lazy = load_leaf(leaf_dir, cache_dir=cache, val_fraction=0.3, random_state=5)
    assert lazy.client_ids == [f"w{k:02d}" for k in range(11)]
    eager = _eager(lazy)
    assert lazy.content_sha256() == eager.content_sha256()
    fresh = load_leaf(leaf_dir, cache_dir=cache, val_fraction=0.3, random_state=5)
    pick = [9, 0, 4]
    for split in _SPLITS:
        np.testing.assert_array_equal(fresh.sizes(split), eager.sizes(split))
        _same(fresh.take(pick, split), eager.take(pick, split))
        _same(fresh.concat(split), eager.concat(split))
    assert fresh.subset(pick).content_sha256() == eager.subset(pick).content_sha256()
    # without the cache: the same
    plain = load_leaf(leaf_dir, use_cache=False, val_fraction=0.3, random_state=5)
    assert plain.content_sha256() == eager.content_sha256()


def test_a_leaf_partition_reads_only_its_writers_rows(
    leaf_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    want = _eager(load_leaf(leaf_dir, cache_dir=cache, random_state=1))
    reads: dict[str, list[int]] = {}
    opened = leaf._read_cache

    def counted(folder: Path) -> dict[str, Any] | None:
        arrays = opened(folder)
        assert arrays is not None
        for name in ("train_x", "train_y", "test_x", "test_y"):
            arrays[name] = _Counting(arrays[name], reads.setdefault(name, []))
        return arrays

    monkeypatch.setattr(leaf, "_read_cache", counted)
    whole = load_leaf(leaf_dir, cache_dir=cache, random_state=1)
    own = np.array([7, 2, 10])
    part = whole.partition(own)
    part.sizes("val"), part.summary(), whole.summary()
    assert all(not rows for rows in reads.values())  # opening and partitioning read no example
    assert part.client_ids == [want.client_ids[i] for i in own]
    for split in _SPLITS:
        np.testing.assert_array_equal(part.sizes(split), want.sizes(split)[own])
        _same(part.take([2, 0], split), want.take(own[[2, 0]], split))
    assert part.content_sha256() == want.subset(own.tolist()).content_sha256()
    assert torch.equal(part.val_x[1], want.val_x[2])  # the partition materialized alone
    stored = opened(next(cache.glob("leaf-*")))
    assert stored is not None
    for s in ("train", "test"):
        mine: set[int] = set()
        users, off = stored[f"{s}_users"].tolist(), stored[f"{s}_offsets"]
        for k in own:
            i = users.index(want.client_ids[k])
            mine |= set(range(int(off[i]), int(off[i + 1])))
        assert reads[f"{s}_x"] and set(reads[f"{s}_x"]) <= mine
        assert set(reads[f"{s}_y"]) <= mine
    with pytest.raises(InvalidParameterError, match=r"'clients'.*\[0, 11\).*got 11"):
        whole.partition([11])
    with pytest.raises(InvalidParameterError, match=r"'clients'.*repeat"):
        whole.partition([3, 3])
    with pytest.raises(InvalidParameterError, match=r"'clients'.*at least one"):
        whole.partition([])
    with pytest.raises(InvalidParameterError, match="'split'"):
        part.take([0], "dev")


def test_a_partition_of_a_partition_and_the_validation_split_per_writer(
    leaf_dir: Path, tmp_path: Path
) -> None:
    kw: dict[str, Any] = {"cache_dir": tmp_path / "c", "val_fraction": 0.4, "random_state": 8}
    whole = load_leaf(leaf_dir, **kw)
    inner = whole.partition([10, 3, 6, 1]).partition([2, 0])
    assert inner.client_ids == ["w06", "w10"]
    assert inner.content_sha256() == whole.subset([6, 10]).content_sha256()
    # a writer's split does not depend on the writers kept (min_train drops w00..w04)
    fewer = load_leaf(leaf_dir, min_train=8, **kw)
    assert fewer.client_ids[0] == "w05"
    _same(fewer.take([0], "val"), whole.take([5], "val"))


def test_group_rows_is_one_stable_sort() -> None:
    codes = np.array([2, 0, 2, 1, 0, 2])
    order, offsets = group_rows(codes, 4)
    np.testing.assert_array_equal(order, [1, 4, 3, 0, 2, 5])
    np.testing.assert_array_equal(offsets, [0, 2, 3, 6, 6])
    np.testing.assert_array_equal(
        row_ranges(np.array([5, 0, 9]), np.array([2, 0, 3])), [5, 6, 9, 10, 11]
    )


def test_a_table_is_stored_client_after_client(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    frame = pd.DataFrame(rng.normal(size=(300, 4)), columns=list("abcd"))
    frame.insert(0, "client", rng.choice(["p", "q", "r", "s", "t"], 300))
    frame["label"] = rng.integers(0, 3, 300)
    path = tmp_path / "t.csv"
    frame.to_csv(path, index=False)
    ds = load_federated_table(path, client_column="client", label_column="label", random_state=2)
    assert isinstance(ds, ContiguousFederation)
    assert ds.client_ids == list(pd.unique(frame["client"]))
    # each client's rows: the same as the table grouped by client (rows in file order)
    tasks = dataset_from_frame(frame, task_column="client", target_column="label")
    for k, name in enumerate(ds.client_ids):
        rows = frame[frame["client"] == name]
        np.testing.assert_array_equal(tasks.X[k], rows[list("abcd")].to_numpy())
        n = [int(s[k]) for s in (ds.sizes("train"), ds.sizes("val"), ds.sizes("test"))]
        assert sum(n) == len(rows) and n[2] == max(1, round(0.2 * len(rows)))
    eager = _eager(ds)
    assert ds.content_sha256() == eager.content_sha256()
    part = ds.partition([4, 1])
    assert part.client_ids == [ds.client_ids[4], ds.client_ids[1]] and part.scaling == ds.scaling
    for split in _SPLITS:
        x, _ = part._sources[split]
        assert x.shape[0] == int(part.sizes(split).sum())  # only its own rows are kept
        _same(part.take([1, 0], split), eager.take([1, 4], split))
    assert part.content_sha256() == eager.subset([4, 1]).content_sha256()
    assert part.materialize().scaling == ds.scaling
