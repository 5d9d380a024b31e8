"""Every client's model read a block at a time (federated.client_models): the rows of a client
store or of blocks spilled to disk, the stacked models only when read as a dict."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from privmtl.data.federated import make_synthetic_federated
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.client_models import FilledRows, SpilledModels, StoredModels, filled_rows
from privmtl.federated.models import MultinomialLogReg
from privmtl.federated.scoring import BlockScores, block_rows
from privmtl.federated.store import ClientStore


def _store() -> ClientStore:
    store = ClientStore(10, {"personal": {"w": torch.zeros(2, 3), "b": torch.zeros(2)}})
    gen = torch.Generator().manual_seed(0)
    store.scatter(
        "personal", torch.tensor([3, 7]),
        {"w": torch.randn(2, 2, 3, generator=gen), "b": torch.randn(2, 2, generator=gen)},
    )  # fmt: skip
    return store


def test_stored_models_read_by_rows_without_stacking():
    store = _store()
    fill = {"w": torch.full((2, 3), 5.0), "b": torch.full((2,), 5.0)}
    models = StoredModels(store, "personal", fill)
    pos = np.array([7, 0, 3])
    rows = block_rows(models, pos)
    assert not models.stacked  # rows read, no stack of the 10 clients
    written = store.gather("personal", torch.tensor([7, 3]))
    assert torch.equal(rows["w"][0], written["w"][0]) and torch.equal(rows["w"][2], written["w"][1])
    assert torch.equal(rows["w"][1], fill["w"]) and torch.equal(rows["b"][1], fill["b"])
    # a snapshot: a later write to the store does not change it
    store.scatter("personal", torch.tensor([0]), {"w": torch.ones(1, 2, 3), "b": torch.ones(1, 2)})
    assert torch.equal(block_rows(models, pos)["w"], rows["w"])
    # read as a dict: the stack of every client, equal to the rows
    assert list(models) == ["w", "b"] and len(models) == 2 and "w" in models
    assert models["w"].shape == (10, 2, 3) and models.stacked
    assert torch.equal(models["w"][pos], rows["w"])
    assert torch.equal(block_rows(models, pos)["b"], rows["b"])


def test_filled_rows_hold_the_written_rows_and_score_as_the_rows():
    """A block's stored models as the written clients' rows and one fill: the same models, so
    the same correct predictions and examples (the loss up to rounding) as their stacked rows,
    the fill's clients scored as one shared model's."""
    m, d, c = 10, 4, 3
    store = ClientStore(
        m, {"personal": {"linear.weight": torch.zeros(c, d), "linear.bias": torch.zeros(c)}}
    )
    gen = torch.Generator().manual_seed(1)
    store.scatter(
        "personal", torch.tensor([2, 5, 9]),
        {"linear.weight": torch.randn(3, c, d, generator=gen), "linear.bias": torch.randn(3, c, generator=gen)},
    )  # fmt: skip
    fill = {
        "linear.weight": torch.randn(c, d, generator=gen),
        "linear.bias": torch.randn(c, generator=gen),
    }
    models = StoredModels(store, "personal", fill)
    pos = np.array([9, 0, 2, 4, 5, 7])
    got = filled_rows(models, pos)
    assert isinstance(got, FilledRows) and not models.stacked
    assert got.has_own.tolist() == [True, False, True, False, True, False]
    assert torch.equal(
        got.own["linear.weight"], block_rows(models, pos[got.has_own])["linear.weight"]
    )
    data = make_synthetic_federated(
        n_clients=m, n_features=d, n_classes=c, samples_per_client=(5, 40), random_state=0
    ).subset(pos.tolist())
    book = BlockScores(MultinomialLogReg(d, c), {}, ("val", "test"))
    for (split, _, mine), (_, _, theirs) in zip(
        book.score("p", got, True, data),
        book.score("p", block_rows(models, pos), True, data),
        strict=True,
    ):
        np.testing.assert_array_equal(mine[0], theirs[0])
        np.testing.assert_array_equal(mine[1], theirs[1])
        assert mine[2] == pytest.approx(theirs[2], rel=1e-6), split
    # the fill scored first as a shared model of the block: its clients take those scores
    memo: dict = {}
    shared = book.score("g", dict(fill), False, data, memo=memo)
    assert [len(v) for v in memo.values()] == [1, 1]
    for (_, _, mine), (_, _, theirs) in zip(
        book.score("p", got, True, data, memo=memo),
        book.score("p", got, True, data),
        strict=True,
    ):
        np.testing.assert_array_equal(mine[0], theirs[0])
        np.testing.assert_array_equal(mine[1], theirs[1])
        assert mine[2] == pytest.approx(theirs[2], rel=1e-12)
    assert [len(v) for v in memo.values()] == [1, 1]  # nothing shared added by FilledRows
    assert shared[0][2][1].sum() == data.sizes("val").sum()
    # no fill (or the stack held): the rows themselves
    assert isinstance(filled_rows(StoredModels(store, "personal"), pos), dict)
    models["linear.weight"]  # stacked
    assert isinstance(filled_rows(models, pos), dict)


def test_stored_models_without_fill_hold_the_default_and_pickle_as_the_stack():
    models = StoredModels(_store(), "personal")
    assert torch.equal(models.rows(np.array([1]))["w"], torch.zeros(1, 2, 3))
    back = pickle.loads(pickle.dumps(models))
    assert type(back) is dict and torch.equal(back["w"], models["w"])


def test_spilled_models_read_back_any_rows_in_order():
    spilled = SpilledModels(10)
    for pos in (np.arange(0, 4), np.arange(4, 8), np.arange(8, 10)):
        spilled.append(pos, {"w": torch.from_numpy(pos).double()[:, None] * torch.ones(1, 3)})
    rows = spilled.rows(np.array([9, 1, 5, 2, 8]))
    assert rows["w"][:, 0].tolist() == [9.0, 1.0, 5.0, 2.0, 8.0] and not spilled.stacked
    assert spilled["w"][:, 0].tolist() == list(map(float, range(10)))


def test_spilled_models_take_consecutive_blocks_and_all_of_them():
    spilled = SpilledModels(6)
    spilled.append(np.arange(0, 3), {"w": torch.zeros(3, 2)})
    with pytest.raises(InvalidParameterError, match="consecutive blocks from client 3"):
        spilled.append(np.arange(4, 6), {"w": torch.zeros(2, 2)})
    with pytest.raises(InvalidParameterError, match="3 of its 6 clients"):
        spilled.rows(np.array([0]))
