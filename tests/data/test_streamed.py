"""SyntheticFederation: the eager generator's clients, drawn only when asked for."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privmtl.data.federated import make_synthetic_federated
from privmtl.data.streamed import SyntheticFederation
from privmtl.exceptions import InvalidParameterError

CASES = [
    {"n_clients": 120, "random_state": 3},
    {"n_clients": 80, "label_noise": 0.2, "feature_cov": "leaf", "random_state": 4},
    {"n_clients": 40, "samples_per_client": (3, 40), "heterogeneity": 0.0, "random_state": 5},
    {"n_clients": 30, "samples_per_client": 12, "feature_shift": 0.0, "random_state": 6},
]


# make_synthetic_federated(**CASES[i]).content_sha256(): the clients every seed gives, pinned
# (numpy's PCG64 streams of standard normals, permutations and integers are fixed by its
# version); a faster draw must give these same bytes
PINNED = [
    "fcd723bf430b8f6b65959ca30dd8e5f0feb876011d690082f9aed02288f28523",
    "d9c1c0e21dba63bd4a41f740591aedcb8066386efe3fd7535f2ab51e727b9740",
    "07e4c59256b1477b6b7892f2635db88761cfde6e54286e7ba65bc4f065688ab4",
    "7eaa2fed2c444ce7c5c472439648d6b335b542c802e1318a98847ba678cc512d",
]


@pytest.mark.parametrize(("kw", "pinned"), zip(CASES, PINNED, strict=True))
def test_the_seeded_clients_are_pinned(kw: dict, pinned: str) -> None:
    assert make_synthetic_federated(**kw).content_sha256() == pinned
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
    # a run of consecutive clients continues the generator from one client to the next, a jump
    # sets the recorded state: both give the eager clients, in every split
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
def test_skipping_a_client_takes_the_draws_of_drawing_it(kw: dict) -> None:
    from privmtl.data.federated import synthetic_law
    from privmtl.data.streamed import _GENERATOR_DEFAULTS

    law, sizes, rng = synthetic_law(**{**_GENERATOR_DEFAULTS, **kw})
    other = np.random.default_rng()
    other.bit_generator.state = rng.bit_generator.state
    for n in sizes[:10].tolist():
        law.draw_client(rng, n)
        law.skip_client(other, n)
        assert other.bit_generator.state == rng.bit_generator.state


def test_a_generator_argument_gives_the_same_clients() -> None:
    eager = make_synthetic_federated(n_clients=25, random_state=np.random.default_rng(9))
    lazy = SyntheticFederation(n_clients=25, random_state=np.random.default_rng(9))
    assert lazy.materialize().content_sha256() == eager.content_sha256()


def test_nothing_is_drawn_until_asked() -> None:
    lazy = SyntheticFederation(n_clients=5000, random_state=0)
    assert lazy._whole is None
    lazy.sizes("train"), lazy.summary(), lazy.content_sha256(), lazy.take([3, 4999])
    assert lazy._whole is None  # none of these held the federation


def test_fingerprint_follows_the_data() -> None:
    a = SyntheticFederation(n_clients=50, random_state=0)
    assert a.content_sha256() == SyntheticFederation(n_clients=50, random_state=0).content_sha256()
    assert a.content_sha256() != SyntheticFederation(n_clients=50, random_state=1).content_sha256()
    assert (
        a.content_sha256()
        != SyntheticFederation(n_clients=50, label_noise=0.1, random_state=0).content_sha256()
    )


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
    mt = np.random.Generator(np.random.MT19937(0))
    with pytest.raises(InvalidParameterError, match=r"'random_state'.*PCG64.*MT19937"):
        SyntheticFederation(n_clients=3, random_state=mt)


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
