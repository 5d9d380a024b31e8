"""SyntheticFederation: the eager generator's clients, drawn only when asked for."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stream_oracle import quantile_normals_oracle

from privmtl.data.federated import SyntheticLaw, make_synthetic_federated
from privmtl.data.streamed import SyntheticFederation
from privmtl.exceptions import InvalidParameterError

CASES = [
    {"n_clients": 120, "random_state": 3},
    {"n_clients": 80, "label_noise": 0.2, "feature_cov": "leaf", "random_state": 4},
    {"n_clients": 40, "samples_per_client": (3, 40), "heterogeneity": 0.0, "random_state": 5},
    {"n_clients": 30, "samples_per_client": 12, "feature_shift": 0.0, "random_state": 6},
]


# make_synthetic_federated(**CASES[i]).content_sha256(): the clients every seed gives with the
# per-client streams (SYNTHETIC_STREAM: splits train, val, test in turn, quantile normals), pinned
# (numpy's SeedSequence and PCG64 streams of raw words, uniforms and integers are fixed by
# its version); a faster draw must give these same bytes
PINNED = [
    "1866f0de7d04a01cb11133e9f6f3c5d543d63af9f1a54d2b9bbd47aa4600051d",
    "f2f715ae8fdd2ef970292664c4b6eceeb92160f082fe03bd0eb673788569c2ff",
    "33e199db9edd0bf311354ba0f55e5b8a0654a7a556f533e3fc7058adb1274146",
    "a71c7f64918c9619cd5b68218561052839ec9cd13f6b08ea327d556499dadd90",
]


@pytest.mark.parametrize(("kw", "pinned"), list(zip(CASES, PINNED, strict=True)))
def test_the_seeded_clients_are_pinned(kw: dict, pinned: str) -> None:
    assert make_synthetic_federated(**kw).content_sha256() == pinned
    assert SyntheticFederation(**kw).materialize().content_sha256() == pinned


@pytest.mark.parametrize("chunk_rows", [1, 50, 1 << 20])
def test_clients_drawn_in_chunks_are_the_pinned_clients(
    chunk_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a block's clients are drawn a chunk of clients at a time (their seed sequences hashed
    # together, the labels' argmax and the copies once a chunk): the same bytes whatever the
    # chunk, from one client a chunk to the whole federation in one
    monkeypatch.setattr("privmtl.data.synthetic_federated.DRAW_CHUNK_ROWS", chunk_rows)
    for kw, pinned in zip(CASES[:2], PINNED[:2], strict=True):
        assert SyntheticFederation(**kw).materialize().content_sha256() == pinned


@pytest.mark.parametrize("kw", CASES)
def test_clients_are_the_eager_generators(kw: dict) -> None:
    eager = make_synthetic_federated(**kw)
    lazy = SyntheticFederation(**kw)
    m = eager.n_clients
    assert lazy.n_clients == m and lazy.client_ids == eager.client_ids
    assert (lazy.n_features, lazy.n_classes, lazy.name) == (
        eager.n_features,
        eager.n_classes,
        eager.name,
    )
    for split in ("train", "val", "test"):  # sizes and offsets without drawing anything
        np.testing.assert_array_equal(lazy.sizes(split), eager.sizes(split))
        np.testing.assert_array_equal(lazy.offsets(split), eager.concat(split)[2])
    picks = [m - 1, 0, m // 2, 7]  # any order, any clients
    assert lazy.subset(picks).content_sha256() == eager.subset(picks).content_sha256()
    for split in ("train", "val", "test"):
        a, b = eager.take(picks, split), lazy.take(picks, split)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        np.testing.assert_array_equal(a[2], b[2])
    assert lazy.summary() == eager.summary()
    # the whole federation, when something asks for every client's tensors
    assert lazy.materialize().content_sha256() == eager.content_sha256()
    assert torch.equal(lazy.concat("val")[0], eager.concat("val")[0])


@pytest.mark.parametrize("kw", CASES)
def test_runs_of_consecutive_clients_are_the_eager_generators(kw: dict) -> None:
    # runs of consecutive clients and jumps, in any order: the eager clients, in every split
    eager = make_synthetic_federated(**kw)
    lazy = SyntheticFederation(**kw)
    m = eager.n_clients
    picks = [*range(m // 2, m), 5, 3, *range(8, m // 2)]
    for split in ("train", "val", "test"):
        a, b = eager.take(picks, split), lazy.take(picks, split)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        np.testing.assert_array_equal(a[2], b[2])
    assert lazy.subset(picks).content_sha256() == eager.subset(picks).content_sha256()


@pytest.mark.parametrize("kw", CASES)
def test_client_k_is_drawn_from_its_own_stream(kw: dict) -> None:
    # client k: Generator(PCG64(SeedSequence(seed, spawn_key=(k,)))), the k-th child of
    # SeedSequence(seed).spawn, whatever other clients are drawn
    from privmtl.data.federated import synthetic_law
    from privmtl.data.streamed import _GENERATOR_DEFAULTS

    law, sizes = synthetic_law(**{**_GENERATOR_DEFAULTS, **kw})
    eager = make_synthetic_federated(**kw)
    children = np.random.SeedSequence(kw["random_state"]).spawn(len(sizes))
    for k in (0, 7, len(sizes) - 1):
        drawn = law.draw_client(np.random.Generator(np.random.PCG64(children[k])), int(sizes[k]))
        mine = [getattr(eager, f"{s}_{a}")[k] for s in ("train", "val", "test") for a in "xy"]
        for arr, t in zip(drawn, mine, strict=True):
            np.testing.assert_array_equal(arr, t.numpy())


def _documented_stream(
    law: SyntheticLaw, rng: np.random.Generator, n: int, splits: tuple[str, ...]
) -> dict:
    """Client draws as the documentation states them, with bare numpy calls: the client's
    parameters, then each split in turn (quantile normals, coins, noise labels), up to the last
    split of ``splits``; labels from the split's stored features."""
    c, d, tau, flip = law.n_classes, law.n_features, law.heterogeneity, law.label_noise
    n_shift = 1 if law.feature_shift > 0 else 0
    head = quantile_normals_oracle(rng, c * d + c + n_shift + d).astype(np.float64)
    wk = law.w0 + tau * head[: c * d].reshape(c, d)
    bk = law.b0 + tau * head[c * d : c * d + c]
    beta = law.feature_shift * head[c * d + c] if n_shift else 0.0
    vk = (beta + law.feature_spread * head[c * d + c + n_shift :]).astype(np.float32)
    scale = np.arange(1, d + 1, dtype=np.float64) ** -0.6 if law.feature_cov == "leaf" else None
    out = {}
    for split, size in zip(("train", "val", "test"), law.split_counts(n), strict=True):
        z = quantile_normals_oracle(rng, size * d).reshape(size, d)
        if flip > 0:
            coins, noise = rng.random(size) < flip, rng.integers(0, c, size=size)
        x = (z if scale is None else z * scale.astype(np.float32)) + vk
        y = np.argmax(x.astype(np.float64) @ wk.T + bk, axis=1)
        out[split] = (x, np.where(coins, noise, y) if flip > 0 else y)
        if split == splits[-1]:
            return out
    return out


@pytest.mark.parametrize("kw", CASES)
def test_a_clients_stream_is_its_parameters_then_its_splits_in_turn(kw: dict) -> None:
    # the documented stream: no permutation, the splits train, val, test drawn one after the
    # other; asking for the training rows draws nothing after them (the generator is left where
    # the documented draws leave it), asking for a later split alone draws the earlier ones
    from privmtl.data.federated import synthetic_law
    from privmtl.data.streamed import _GENERATOR_DEFAULTS

    law, sizes = synthetic_law(**{**_GENERATOR_DEFAULTS, **kw})
    eager = make_synthetic_federated(**kw)
    for k in (0, 5, len(sizes) - 1):
        n = int(sizes[k])
        whole = _documented_stream(law, law.client_rng(k), n, ("test",))
        for split, (x, y) in whole.items():
            np.testing.assert_array_equal(getattr(eager, f"{split}_x")[k].numpy(), x)
            np.testing.assert_array_equal(getattr(eager, f"{split}_y")[k].numpy(), y)
        for asked in (("train",), ("val",), ("test",), ("train", "test")):
            documented, drawn = law.client_rng(k), law.client_rng(k)
            want = _documented_stream(law, documented, n, asked)
            got = {
                s: (np.empty_like(want[s][0]), np.empty_like(want[s][1], dtype=np.int64))
                for s in asked
            }
            law.draw_into(drawn, n, got)
            assert drawn.bit_generator.state == documented.bit_generator.state
            for s in asked:
                np.testing.assert_array_equal(got[s][0], want[s][0])
                np.testing.assert_array_equal(got[s][1], want[s][1])


def test_a_larger_population_begins_with_the_smaller_one() -> None:
    # the shared part draws the sizes in one vectorised call and each client has its own stream:
    # the first 40 clients of 300 are the federation of 40 for the same seed
    small = SyntheticFederation(n_clients=40, label_noise=0.1, random_state=8)
    large = SyntheticFederation(n_clients=300, label_noise=0.1, random_state=8)
    first = large.subset(range(40))
    assert first.content_sha256() == small.materialize().content_sha256()


def test_a_partition_is_those_clients_drawn_on_demand() -> None:
    whole = SyntheticFederation(n_clients=200, random_state=4)
    own = np.array([150, 3, 77, 199, 0])
    part = whole.partition(own)
    assert part.n_clients == 5 and part.client_ids == [whole.client_ids[i] for i in own]
    assert part._whole is None  # nothing drawn
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(part.sizes(split), whole.sizes(split)[own])
        a, b = part.take([4, 1, 2], split), whole.take(own[[4, 1, 2]], split)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        np.testing.assert_array_equal(a[2], b[2])
    assert part.materialize().content_sha256() == whole.subset(own).content_sha256()
    again = whole.partition(own)
    assert part.content_sha256() == again.content_sha256() != whole.content_sha256()
    assert part.content_sha256() != whole.partition(own[::-1]).content_sha256()
    with pytest.raises(InvalidParameterError, match=r"'clients'.*\[0, 200\).*got 200"):
        whole.partition([200])
    with pytest.raises(InvalidParameterError, match=r"'clients'.*repeat"):
        whole.partition([3, 3])
    with pytest.raises(InvalidParameterError, match=r"'clients'.*at least one"):
        whole.partition([])


def test_a_generator_argument_gives_the_same_clients() -> None:
    # the streams' entropy is drawn once from the Generator, whatever its bit generator
    for bits in (np.random.PCG64, np.random.MT19937):
        eager = make_synthetic_federated(n_clients=25, random_state=np.random.Generator(bits(9)))
        lazy = SyntheticFederation(n_clients=25, random_state=np.random.Generator(bits(9)))
        assert lazy.materialize().content_sha256() == eager.content_sha256()
    by_int = make_synthetic_federated(n_clients=25, random_state=9)
    assert by_int.content_sha256() != eager.content_sha256()


def test_nothing_is_drawn_until_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from privmtl.data.federated import SyntheticLaw

    asked: list[int] = []
    stream = SyntheticLaw.client_rngs
    monkeypatch.setattr(
        SyntheticLaw, "client_rngs", lambda law, ks: asked.extend(ks.tolist()) or stream(law, ks)
    )
    lazy = SyntheticFederation(n_clients=5000, random_state=0)
    mine = lazy.partition(np.arange(4000, 5000))
    assert asked == [] and lazy._whole is None  # building walks no client's stream
    lazy.sizes("train"), lazy.summary(), lazy.content_sha256(), mine.content_sha256()
    lazy.take([3, 4999])
    mine.take([10])
    assert asked == [3, 4999, 4010]  # only the clients asked for, straight from their streams
    assert lazy._whole is None and mine._whole is None  # none of these held the federation


def test_fingerprint_follows_the_data(monkeypatch: pytest.MonkeyPatch) -> None:
    a = SyntheticFederation(n_clients=50, random_state=0)
    assert a.content_sha256() == SyntheticFederation(n_clients=50, random_state=0).content_sha256()
    assert a.content_sha256() != SyntheticFederation(n_clients=50, random_state=1).content_sha256()
    assert (
        a.content_sha256()
        != SyntheticFederation(n_clients=50, label_noise=0.1, random_state=0).content_sha256()
    )
    # the stream is part of it (pinned: a checkpoint of data drawn by an earlier stream, whose
    # fingerprint this was not, is refused), and another stream's name gives another fingerprint
    pinned = "13d68f5af4ccf3a6d87d9ae75f43ab9465a5156eba80d16558a9f732156a609b"
    assert a.content_sha256() == pinned
    monkeypatch.setattr("privmtl.data.streamed.SYNTHETIC_STREAM", "another stream")
    assert a.content_sha256() != pinned


def test_bad_input_names_the_parameter() -> None:
    lazy = SyntheticFederation(n_clients=10, random_state=0)
    with pytest.raises(InvalidParameterError, match=r"'clients'.*\[0, 10\).*got 10"):
        lazy.take([10])
    with pytest.raises(InvalidParameterError, match="'split'"):
        lazy.sizes("dev")
    with pytest.raises(InvalidParameterError, match="n_clients"):
        SyntheticFederation(n_clients=0)
    with pytest.raises(
        InvalidParameterError, match=r"make_synthetic_federated's parameters.*'n_tasks'"
    ):
        SyntheticFederation(n_tasks=3)
    with pytest.raises(InvalidParameterError, match=r"'random_state'.*got -1"):
        SyntheticFederation(n_clients=3, random_state=-1)


def test_take_of_a_data_set_in_memory() -> None:
    ds = make_synthetic_federated(n_clients=12, random_state=0)
    x, y, off = ds.take([4, 1])
    assert torch.equal(x, torch.cat([ds.train_x[4], ds.train_x[1]]))
    assert torch.equal(y, torch.cat([ds.train_y[4], ds.train_y[1]]))
    assert off.tolist() == [0, len(ds.train_y[4]), len(ds.train_y[4]) + len(ds.train_y[1])]
    x0, y0, off0 = ds.take([], "test")
    assert x0.shape == (0, ds.n_features) and y0.shape == (0,) and off0.tolist() == [0]
    with pytest.raises(InvalidParameterError, match=r"'clients'.*\[0, 12\).*got -1"):
        ds.take([-1])
    with pytest.raises(InvalidParameterError, match="'split'"):
        ds.take([0], "dev")


def test_client_ids_are_made_when_read() -> None:
    # a population's ids are not m strings held (nor in a forked worker's copy): they read as
    # the list of ids, and a result keeps them as they are
    from privmtl.data.federated import synthetic_client_ids
    from privmtl.data.synthetic_federated import SyntheticClientIds, client_id_list

    ds = SyntheticFederation(n_clients=1500, random_state=2)
    ids = ds.client_ids
    assert isinstance(ids, SyntheticClientIds) and not isinstance(ids, list)
    expected = synthetic_client_ids(1500)
    assert ids == expected and expected == ids and list(ids) == expected and len(ids) == 1500
    assert ids[7] == "synthetic_007" and ids[-1] == "synthetic_1499" and ids[3:6] == expected[3:6]
    assert ids.index("synthetic_1200") == 1200 and "synthetic_1500" not in ids
    assert client_id_list(ids) is ids and client_id_list(["a", "b"]) == ["a", "b"]
    assert ids != expected[:-1] and ids != SyntheticClientIds(1499)
    with pytest.raises(IndexError):
        ids[1500]
    import pickle

    assert pickle.loads(pickle.dumps(ids)) == ids
    assert ds.subset([4, 2]).client_ids == ["synthetic_004", "synthetic_002"]


def test_a_drawn_block_concatenates_without_a_copy() -> None:
    # the clients of a block are views of one drawn tensor per split: concat() is that tensor
    ds = SyntheticFederation(n_clients=50, random_state=3)
    part = ds.subset([9, 4, 30])
    for split in ("train", "val", "test"):
        x, y, offsets = part.concat(split)
        xs, ys = part.split(split)
        for whole, views in ((x, xs), (y, ys)):
            assert all(v.untyped_storage().data_ptr() == whole.data_ptr() for v in views)
        assert torch.equal(x, torch.cat(xs)) and torch.equal(y, torch.cat(ys))
        np.testing.assert_array_equal(offsets, np.cumsum([0, *(len(t) for t in ys)]))
    part.train_y[1][0] = 1 - part.train_y[1][0]  # written in place: the cache follows
    assert torch.equal(part.concat("train")[1], torch.cat(part.train_y))


def test_split_sizes_are_held_small_and_read_as_int64() -> None:
    ds = SyntheticFederation(n_clients=400, random_state=5)
    eager = make_synthetic_federated(n_clients=400, random_state=5)
    for split in ("train", "val", "test"):
        assert ds._split_sizes[split].dtype == np.int32
        got = ds.sizes(split)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, eager.sizes(split))
        got[0] = -1  # a copy: the federation's sizes do not change
        assert ds.sizes(split)[0] >= 0
