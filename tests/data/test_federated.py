"""FederatedDataset, the LEAF reader (real FEMNIST and tiny synthetic shards) and the generator."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from stream_oracle import quantile_normals_oracle

from privmtl.data.federated import (
    FederatedDataset,
    load_leaf,
    make_synthetic_federated,
    synthetic_client_sizes,
)
from privmtl.data.synthetic_federated import normal_quantiles, quantile_normals
from privmtl.exceptions import DataFormatError, InvalidParameterError


def _shard(users: dict[str, tuple[list, list]]) -> dict:
    return {
        "users": list(users),
        "num_samples": [len(y) for _, y in users.values()],
        "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()},
    }


def _write(path: Path, doc: dict, gz: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc)
    if gz:
        with gzip.open(str(path) + ".json.gz", "wt") as fh:
            fh.write(text)
    else:
        Path(str(path) + ".json").write_text(text)


def _rows(n: int, d: int, seed: int) -> list[list[float]]:
    return np.random.default_rng(seed).random((n, d)).round(3).tolist()


@pytest.fixture
def tiny_leaf(tmp_path: Path) -> Path:
    """3 writers with train data (a: 10, b: 5, c: 3), test for a, b and d (d has no train)."""
    root = tmp_path / "leaf"
    _write(root / "train" / "s0", _shard({"a": (_rows(10, 4, 0), [0, 1, 2] * 3 + [0])}), gz=True)
    _write(
        root / "train" / "s1",
        _shard({"b": (_rows(5, 4, 1), [3, 3, 3, 1, 0]), "c": (_rows(3, 4, 2), [1, 1, 1])}),
        gz=False,
    )
    _write(
        root / "test" / "t0",
        _shard(
            {
                "a": (_rows(2, 4, 3), [0, 1]),
                "b": (_rows(1, 4, 4), [4]),
                "d": (_rows(2, 4, 5), [2, 2]),
            }
        ),
        gz=True,
    )
    return root


def test_tiny_leaf_plain_and_gzip(tiny_leaf: Path, tmp_path: Path) -> None:
    ds = load_leaf(tiny_leaf, cache_dir=tmp_path / "cache", val_fraction=0.2, random_state=3)
    assert ds.client_ids == ["a", "b"]  # c: no test data, d: no train data
    assert ds.n_classes == 5  # max label 4 (in b's test data) + 1
    assert ds.feature_shape == (4,)
    # val = floor(0.2 n): a 10 -> 2, b 5 -> 1
    np.testing.assert_array_equal(ds.sizes("train"), [8, 4])
    np.testing.assert_array_equal(ds.sizes("val"), [2, 1])
    np.testing.assert_array_equal(ds.sizes("test"), [2, 1])
    assert ds.train_x[0].dtype == torch.float32 and ds.train_y[0].dtype == torch.int64
    # train + val is a partition of the writer's training data
    a_x = torch.tensor(_rows(10, 4, 0), dtype=torch.float32)
    got = torch.cat([ds.train_x[0], ds.val_x[0]])
    assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, a_x.tolist()))
    torch.testing.assert_close(ds.test_x[1], torch.tensor(_rows(1, 4, 4), dtype=torch.float32))


def test_validation_split_is_seeded_per_writer(tiny_leaf: Path, tmp_path: Path) -> None:
    kw = {"cache_dir": tmp_path / "c", "val_fraction": 0.3}
    one, two = (
        load_leaf(tiny_leaf, random_state=1, **kw),
        load_leaf(tiny_leaf, random_state=1, **kw),
    )
    other = load_leaf(tiny_leaf, random_state=2, **kw)
    assert torch.equal(one.val_x[0], two.val_x[0])
    assert not torch.equal(one.val_x[0], other.val_x[0])
    # writer a's split does not depend on which other writers are kept
    fewer = load_leaf(tiny_leaf, random_state=1, min_train=6, **kw)
    assert fewer.client_ids == ["a"]
    assert torch.equal(fewer.val_x[0], one.val_x[0])


def test_cache_hit_and_invalidation(tiny_leaf: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    load_leaf(tiny_leaf, cache_dir=cache)
    folders = list(cache.glob("leaf-*"))
    assert len(folders) == 1 and folders[0].is_dir()
    # a hit reads the cache, not the JSON: poison the cached features and check that the poison
    # comes back
    x_file = folders[0] / "train_x.npy"
    np.save(x_file, np.load(x_file) + 100.0)
    hit = load_leaf(tiny_leaf, cache_dir=cache)
    assert float(torch.cat(hit.train_x).min()) >= 100.0
    # touching an input (new mtime and size) changes the key: rebuilt from JSON
    shard = tiny_leaf / "train" / "s1.json"
    doc = json.loads(shard.read_text())
    doc["user_data"]["b"]["y"][0] = 2
    shard.write_text(json.dumps(doc) + " ")
    os.utime(shard, ns=(1, 1))
    fresh = load_leaf(tiny_leaf, cache_dir=cache)
    assert float(torch.cat(fresh.train_x).max()) <= 1.0
    assert len(list(cache.glob("leaf-*"))) == 2
    # use_cache=False writes nothing
    nocache = tmp_path / "none"
    load_leaf(tiny_leaf, cache_dir=nocache, use_cache=False)
    assert not nocache.exists()


def test_cache_is_memory_mapped_and_rebuilt_when_broken(tiny_leaf: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = load_leaf(tiny_leaf, cache_dir=cache, random_state=4)
    (folder,) = cache.glob("leaf-*")
    hit = load_leaf(tiny_leaf, cache_dir=cache, random_state=4)
    assert isinstance(hit._sources["train"][0], np.memmap)
    assert hit.content_sha256() == first.content_sha256()
    # a truncated or missing array: the cache is written again from the JSON
    (folder / "train_offsets.npy").write_bytes(b"broken")
    (folder / "test_y.npy").unlink()
    again = load_leaf(tiny_leaf, cache_dir=cache, random_state=4)
    assert again.content_sha256() == first.content_sha256()
    assert sorted(p.name for p in cache.iterdir()) == [folder.name]
    assert np.load(folder / "test_y.npy").dtype == np.int64


def test_a_cache_of_the_single_file_format_is_converted_once(
    tiny_leaf: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    want = load_leaf(tiny_leaf, cache_dir=cache, random_state=2)
    (folder,) = cache.glob("leaf-*")
    # the earlier format: the same arrays in one .npz named by the same key, poisoned so that a
    # read of it shows
    arrays = {p.stem: np.load(p) for p in folder.glob("*.npy")}
    arrays["test_x"] = arrays["test_x"] + 50.0
    np.savez(cache / f"{folder.name}.npz", **arrays)
    shutil.rmtree(folder)
    got = load_leaf(tiny_leaf, cache_dir=cache, random_state=2)
    assert sorted(p.name for p in cache.iterdir()) == [folder.name]  # converted, .npz removed
    assert torch.equal(got.test_x[0], want.test_x[0] + 50.0)
    assert torch.equal(got.train_x[1], want.train_x[1])


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d.pop("user_data"), "users.*user_data"),
        (lambda d: d["user_data"]["a"]["y"].pop(), "x rows but"),
        (lambda d: d["user_data"]["a"]["x"][0].pop(), "different lengths"),
        (lambda d: d["user_data"]["a"]["y"].__setitem__(0, -1), "non-negative integers"),
        (lambda d: d["user_data"]["a"]["y"].__setitem__(0, 1.5), "non-negative integers"),
        (lambda d: d["num_samples"].__setitem__(0, 99), "num_samples"),
    ],
)
def test_bad_shards(tmp_path: Path, mutate, match: str) -> None:
    doc = _shard({"a": (_rows(3, 4, 0), [0, 1, 2])})
    mutate(doc)
    _write(tmp_path / "train" / "s", doc, gz=False)
    _write(tmp_path / "test" / "t", _shard({"a": (_rows(1, 4, 1), [0])}), gz=False)
    with pytest.raises(DataFormatError, match=match):
        load_leaf(tmp_path, use_cache=False)


def test_bad_layouts(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match="does not exist"):
        load_leaf(tmp_path / "nowhere", use_cache=False)
    (tmp_path / "train").mkdir()
    with pytest.raises(DataFormatError, match="test"):
        load_leaf(tmp_path, use_cache=False)
    (tmp_path / "test").mkdir()
    with pytest.raises(DataFormatError, match="No LEAF shards"):
        load_leaf(tmp_path, use_cache=False)
    (tmp_path / "train" / "s.json").write_text("{not json")
    (tmp_path / "test" / "t.json").write_text("{}")
    with pytest.raises(DataFormatError, match="Cannot parse"):
        load_leaf(tmp_path, use_cache=False)
    (tmp_path / "train" / "s.json").write_text(json.dumps(_shard({"a": ([[0.0, 1.0]], [0])})))
    (tmp_path / "test" / "t.json").write_text(json.dumps(_shard({"z": ([[0.0, 1.0]], [0])})))
    with pytest.raises(DataFormatError, match="both train and test"):
        load_leaf(tmp_path, use_cache=False)
    (tmp_path / "test" / "t.json").write_text(json.dumps(_shard({"a": ([[0.0, 1.0, 2.0]], [0])})))
    with pytest.raises(DataFormatError, match="different feature sizes"):
        load_leaf(tmp_path, use_cache=False)
    with pytest.raises(InvalidParameterError, match="val_fraction"):
        load_leaf(tmp_path, val_fraction=1.0, use_cache=False)


def test_duplicate_user_across_shards(tmp_path: Path) -> None:
    _write(tmp_path / "train" / "s0", _shard({"a": (_rows(2, 3, 0), [0, 1])}), gz=False)
    _write(tmp_path / "train" / "s1", _shard({"a": (_rows(2, 3, 1), [0, 1])}), gz=True)
    _write(tmp_path / "test" / "t", _shard({"a": (_rows(1, 3, 2), [0])}), gz=False)
    with pytest.raises(DataFormatError, match="appears in both"):
        load_leaf(tmp_path, use_cache=False)


@pytest.mark.shared_data
def test_real_femnist(femnist_dir: Path, tmp_path: Path) -> None:
    ds = load_leaf(femnist_dir, cache_dir=tmp_path / "cache")
    assert ds.n_clients == 105
    assert ds.n_samples("train") + ds.n_samples("val") == 14_708
    assert ds.n_samples("test") == 1_685
    assert ds.n_classes == 62 and ds.feature_shape == (1, 28, 28) and ds.n_features == 784
    assert all(int(n) >= 1 for n in ds.sizes("train"))
    x = torch.cat(ds.train_x)
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0
    again = load_leaf(femnist_dir, cache_dir=tmp_path / "cache")  # cache hit
    assert again.client_ids == ds.client_ids
    assert torch.equal(again.test_x[7], ds.test_x[7]) and torch.equal(again.val_y[3], ds.val_y[3])


def test_dataset_validation_and_helpers() -> None:
    x = [torch.zeros(3, 2), torch.ones(2, 2)]
    y = [torch.tensor([0, 1, 1]), torch.tensor([2, 0])]
    e = [torch.zeros(0, 2), torch.zeros(0, 2)]
    ey = [torch.zeros(0, dtype=torch.int64)] * 2
    ds = FederatedDataset(["p", "q"], x, y, e, ey, x, y, n_classes=3)
    xa, ya, off = ds.concat("train")
    assert xa.shape == (5, 2) and off.tolist() == [0, 3, 5] and ya.tolist() == [0, 1, 1, 2, 0]
    sub = ds.subset([1])
    assert sub.client_ids == ["q"] and sub.n_samples("train") == 2
    assert ds.summary()["n_val"] == 0
    with pytest.raises(DataFormatError, match="labels must be in"):
        FederatedDataset(["p", "q"], x, y, e, ey, x, y, n_classes=2)
    with pytest.raises(DataFormatError, match="one entry per client"):
        FederatedDataset(["p"], x, y, e, ey, x, y, n_classes=3)
    with pytest.raises(DataFormatError, match="no training data"):
        FederatedDataset(
            ["p", "q"], [x[0], torch.zeros(0, 2)], [y[0], ey[0]], e, ey, x, y, n_classes=3
        )
    with pytest.raises(DataFormatError, match="feature_shape"):
        FederatedDataset(["p", "q"], x, y, e, ey, x, y, n_classes=3, feature_shape=(3,))


def test_concat_follows_replaced_and_written_tensors_also_on_a_copy() -> None:
    """The stacked view is rebuilt when a client's tensor is replaced or written in place, on
    the dataset and on a deep copy that carries the original's stacked view."""
    import copy

    x = [torch.zeros(3, 2), torch.ones(2, 2)]
    y = [torch.tensor([0, 1, 1]), torch.tensor([2, 0])]
    e = [torch.zeros(0, 2), torch.zeros(0, 2)]
    ey = [torch.zeros(0, dtype=torch.int64)] * 2
    ds = FederatedDataset(["p", "q"], x, y, e, ey, x, y, n_classes=3)
    assert ds.concat("train")[1].tolist() == [0, 1, 1, 2, 0]
    other = copy.deepcopy(ds)
    other.train_y[0] = torch.tensor([2, 2, 2])
    assert other.concat("train")[1].tolist() == [2, 2, 2, 2, 0]
    assert ds.concat("train")[1].tolist() == [0, 1, 1, 2, 0]
    ds.train_y[1][0] = 1  # in place
    assert ds.concat("train")[1].tolist() == [0, 1, 1, 1, 0]


def test_synthetic_generator_shapes_and_seed() -> None:
    ds = make_synthetic_federated(
        n_clients=12, n_features=6, n_classes=4, samples_per_client=(10, 80), random_state=0
    )
    assert ds.n_clients == 12 and ds.n_features == 6 and ds.n_classes == 4
    total = ds.sizes("train") + ds.sizes("val") + ds.sizes("test")
    assert total.min() >= 10 and total.max() <= 80 and len(set(total.tolist())) > 3
    same = make_synthetic_federated(
        n_clients=12, n_features=6, n_classes=4, samples_per_client=(10, 80), random_state=0
    )
    assert all(torch.equal(a, b) for a, b in zip(ds.train_x, same.train_x, strict=True))
    fixed = make_synthetic_federated(n_clients=3, samples_per_client=20, random_state=1)
    assert (fixed.sizes("train") + fixed.sizes("val") + fixed.sizes("test")).tolist() == [20] * 3
    with pytest.raises(InvalidParameterError, match="heterogeneity"):
        make_synthetic_federated(heterogeneity=-1.0)
    with pytest.raises(InvalidParameterError, match="samples_per_client"):
        make_synthetic_federated(samples_per_client=(5, 6, 7))  # type: ignore[arg-type]


def _fit_accuracy(ds: FederatedDataset, personal: bool) -> float:
    """Test accuracy of least-squares one-vs-rest linear classifiers (global or per client)."""

    def fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        xb = np.hstack([x, np.ones((len(x), 1))])
        t = np.eye(ds.n_classes)[y]
        return np.linalg.solve(xb.T @ xb + 1e-1 * np.eye(xb.shape[1]), xb.T @ t)

    def pred(w: np.ndarray, x: np.ndarray) -> np.ndarray:
        return np.argmax(np.hstack([x, np.ones((len(x), 1))]) @ w, axis=1)

    xs = [x.numpy() for x in ds.train_x]
    ys = [y.numpy() for y in ds.train_y]
    hits = n = 0
    wg = fit(np.vstack(xs), np.concatenate(ys))
    for k in range(ds.n_clients):
        w = fit(xs[k], ys[k]) if personal else wg
        p = pred(w, ds.test_x[k].numpy())
        hits += int((p == ds.test_y[k].numpy()).sum())
        n += len(p)
    return hits / n


def test_synthetic_heterogeneity_makes_personalization_help() -> None:
    kw = {
        "n_clients": 20,
        "n_features": 5,
        "n_classes": 3,
        "samples_per_client": 300,
        "feature_shift": 0.0,
        "random_state": 0,
    }
    homo = make_synthetic_federated(heterogeneity=0.0, **kw)
    het = make_synthetic_federated(heterogeneity=2.0, **kw)
    gain_homo = _fit_accuracy(homo, personal=True) - _fit_accuracy(homo, personal=False)
    gain_het = _fit_accuracy(het, personal=True) - _fit_accuracy(het, personal=False)
    # one labelling rule: a global linear model is nearly as good as local ones (seed 0: 0.90 vs
    # 0.93); heterogeneous rules: local models are far better (0.67 vs 0.93)
    assert gain_homo < 0.05
    assert gain_het > 0.15 and gain_het > gain_homo + 0.1


def test_synthetic_defaults_follow_leaf_and_fedprox() -> None:
    ds = make_synthetic_federated(random_state=3)
    assert ds.n_clients == 50 and ds.n_features == 60 and ds.n_classes == 10
    assert ds.feature_shape == (60,)
    total = ds.sizes("train") + ds.sizes("val") + ds.sizes("test")
    # LEAF's law, drawn independently: n_k = min(5 + floor(LogNormal(3, 2)), 1000), the first
    # draws after W_0 (C x d) and b_0 (C)
    rng = np.random.default_rng(3)
    rng.standard_normal((10, 60))
    rng.standard_normal(10)
    expected = np.minimum(5 + np.floor(rng.lognormal(3.0, 2.0, size=50)), 1000)
    assert total.tolist() == expected.astype(int).tolist()
    assert (ds.sizes("train") >= 1).all()


def test_leaf_size_law_many_small_clients() -> None:
    sizes = synthetic_client_sizes(20000, random_state=0)
    assert sizes.min() == 5 and sizes.max() == 1000
    # median of 5 + floor(e^Z), Z ~ N(3, 4): 5 + floor(e^3) = 25 (24 from the floor of draws)
    assert 23 <= np.median(sizes) <= 26
    # P(n < 15) = P(e^Z < 10) = Phi((ln 10 - 3) / 2) = 0.364; P(n = 1000) = P(e^Z >= 995) = 0.026
    assert abs((sizes < 15).mean() - 0.364) < 0.01
    assert abs((sizes == 1000).mean() - 0.026) < 0.006
    assert synthetic_client_sizes(4, 7, random_state=0).tolist() == [7] * 4
    lu = synthetic_client_sizes(1000, (20, 200), random_state=0)
    assert lu.min() >= 20 and lu.max() <= 200
    with pytest.raises(InvalidParameterError, match="size_lognormal"):
        synthetic_client_sizes(3, size_lognormal=(3.0,))  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="size_lognormal"):
        synthetic_client_sizes(3, size_lognormal=(3.0, -1.0))


def test_label_noise_redraws_labels_uniformly() -> None:
    kw = {"n_clients": 4, "samples_per_client": 400, "random_state": 2}
    clean = make_synthetic_federated(**kw)
    assert "noise=0" in clean.name
    noisy = make_synthetic_federated(label_noise=1.0, **kw)
    y = torch.cat(noisy.train_y).numpy()
    # every label redrawn uniformly over the 10 classes: each class about 10 %
    counts = np.bincount(y, minlength=10) / len(y)
    assert np.abs(counts - 0.1).max() < 0.03
    # the clean labels are far from uniform within a client (the feature shift)
    assert max(np.bincount(t.numpy(), minlength=10).max() / len(t) for t in clean.train_y) > 0.3
    with pytest.raises(InvalidParameterError, match="label_noise"):
        make_synthetic_federated(label_noise=1.5)


def _majority_fraction(ds: FederatedDataset) -> float:
    ys = [
        torch.cat([a, b, c]).numpy()
        for a, b, c in zip(ds.train_y, ds.val_y, ds.test_y, strict=True)
    ]
    return sum(np.bincount(y).max() for y in ys) / sum(len(y) for y in ys)


SPLITS_30 = (("train", 22), ("val", 2), ("test", 6))  # 30 examples: 6 test, 2 val, 22 train


def test_the_normal_quantiles_are_pinned() -> None:
    table = normal_quantiles()
    assert table.dtype == np.float32 and table.shape == (65536,) and not table.flags.writeable
    # the same bytes on every machine: a stream drawn elsewhere is this one
    digest = hashlib.sha256(table.tobytes()).hexdigest()
    assert digest == "1cfbba1e07e34386a57626f82aeb43e6ed54ba70a3ea6b7d964dc66a841074a8"
    # symmetric, increasing, a normal's moments up to the rounding to 2^16 cells
    np.testing.assert_array_equal(table, -table[::-1])
    assert (np.diff(table) > 0).all()
    assert abs(float(table.astype(np.float64).var()) - 1) < 1e-4
    assert 4.3 < float(table[-1]) < 4.35
    np.testing.assert_array_equal(normal_quantiles(np.float64), table.astype(np.float64))
    rng = np.random.default_rng(11)
    for shape, dtype in (((5, 7), np.float32), ((13,), np.float64), ((0,), np.float32)):
        out = np.empty(shape, dtype)
        quantile_normals(np.random.default_rng(3), out)
        expected = quantile_normals_oracle(np.random.default_rng(3), out.size)
        np.testing.assert_array_equal(out.reshape(-1), expected.astype(dtype))
    # one word of the generator per four normals: the generator is left after ceil(n / 4)
    quantile_normals(rng, np.empty(5, np.float32))
    after = np.random.default_rng(11)
    after.bit_generator.random_raw(2)
    assert rng.bit_generator.state == after.bit_generator.state


def test_synthetic_feature_law_leaf_is_the_old_generator() -> None:
    # an independent re-implementation of LEAF's feature law (covariance diag(j^-1.2), client
    # means N(beta_k 1, I)) with the generator's streams and draw order: W_0, b_0 (then the
    # sizes) from the seed's generator; client k's A_k, a_k, beta_k, v_k in one draw of
    # quantile normals, then its 22 training, 2 validation and 6 test examples' normals, in
    # turn, from its own, PCG64(SeedSequence(seed, spawn_key=(k,)))
    m, d, c = 6, 8, 4
    ds = make_synthetic_federated(
        n_clients=m, n_features=d, n_classes=c, samples_per_client=30, feature_cov="leaf",
        feature_spread=1.0, random_state=5,
    )  # fmt: skip
    rng = np.random.default_rng(5)
    w0, b0 = rng.standard_normal((c, d)), rng.standard_normal(c)
    for k in range(m):
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(5, spawn_key=(k,))))
        head = quantile_normals_oracle(rng, c * d + c + 1 + d).astype(np.float64)
        wk = w0 + 0.5 * head[: c * d].reshape(c, d)
        bk = b0 + 0.5 * head[c * d : c * d + c]
        beta = 0.5 * head[c * d + c]
        v = beta + 1.0 * head[c * d + c + 1 :]
        z = {split: quantile_normals_oracle(rng, n * d).reshape(n, d) for split, n in SPLITS_30}
        x = v + z["test"] * np.arange(1, d + 1) ** -0.6
        assert np.allclose(ds.test_x[k].numpy(), x, atol=1e-6)
        assert ds.test_y[k].tolist() == np.argmax(x @ wk.T + bk, axis=1).tolist()


def test_synthetic_default_feature_law_needs_a_model() -> None:
    kw = {"n_clients": 400, "random_state": 0}
    leaf = make_synthetic_federated(feature_cov="leaf", feature_spread=1.0, **kw)
    default = make_synthetic_federated(**kw)
    assert "cov=isotropic" in default.name and "spread=0.5" in default.name
    # LEAF's law: a client's majority class covers most of its examples (0.84 at m = 1 000);
    # the default: about three times chance (0.33 at m = 1 000), so labels need the client's model
    assert _majority_fraction(leaf) > 0.75
    assert _majority_fraction(default) < 0.4
    with pytest.raises(InvalidParameterError, match="feature_cov"):
        make_synthetic_federated(feature_cov="diag")
    with pytest.raises(InvalidParameterError, match="feature_spread"):
        make_synthetic_federated(feature_spread=-0.1)
