"""The end of run in one pass (finish_pass): every block of clients finished, scored and handed
to the caller's sink in the clients' order, no stack of every client's final model kept."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from finish_inputs import finish_inputs

from privmtl.federated.client_models import ClientModels, StoredModels
from privmtl.federated.end_of_run.finetune_selection import finetune_select
from privmtl.federated.end_of_run.finish import (
    FinishOptions,
    auto_plan,
    finish_clients,
    finish_pass,
    stack_trained,
)
from privmtl.federated.store import ClientStore


@pytest.mark.parametrize("finetune", ["auto", "vanilla", "none"])
def test_the_pass_hands_over_the_blocks_of_finish_clients(finetune, monkeypatch):
    ds, net, trained, board = finish_inputs()
    m = ds.n_clients
    dim = sum(p.numel() for p in board.values())
    plan = auto_plan("pmtl", None, 0.001, 0.5, dim, 3) if finetune == "auto" else None
    kw = {"batch_size": 10, "seed": 0, "lr": 0.1, "lam": 0.1, "plan": plan, "block": 4}
    whole = finish_clients(finetune, ds, net, trained, board, **kw)
    # the trained models as a store's rows: the pass reads them a block at a time, never stacked
    store = ClientStore(m, {"personal": {n: p[0] for n, p in trained.items()}})
    store.scatter("personal", torch.arange(m), trained)
    stored = StoredModels(store, "personal")
    monkeypatch.setattr(ClientModels, "_stack", lambda self: pytest.fail("stacked every client"))
    seen: list[tuple[np.ndarray, dict[str, torch.Tensor]]] = []
    fin = finish_pass(
        FinishOptions(finetune, **kw), ds, net, stored, board, on_block=lambda pos, p, _: seen.append((pos, p))
    )  # fmt: skip
    assert fin.params == {}
    assert np.concatenate([pos for pos, _ in seen]).tolist() == list(range(m))
    assert max(len(pos) for pos, _ in seen) == 4
    for n, p in whole.params.items():
        assert torch.equal(torch.cat([block[n] for _, block in seen]), p), n
    if finetune == "auto":
        assert fin.choice is not None and fin.choice.tolist() == whole.choice.tolist()


def test_the_pass_scores_as_finish_clients_does():
    ds, net, trained, board = finish_inputs()
    dim = sum(p.numel() for p in board.values())
    plan = auto_plan("pmtl", None, 0.001, 0.5, dim, 3)
    kw = {"batch_size": 10, "seed": 0, "lr": 0.1, "lam": 0.1, "plan": plan, "block": 4}
    score = {"trained": (trained, True), "global": (board, False)}
    whole = finish_clients("auto", ds, net, trained, board, score=score, **kw)
    fin = finish_pass(FinishOptions("auto", score=score, **kw), ds, net, trained, board)
    assert fin.scores == whole.scores
    for name, (correct, n) in whole.per_client.items():
        assert np.array_equal(fin.per_client[name][0], correct)
        assert np.array_equal(fin.per_client[name][1], n)


def test_without_a_sink_the_workers_send_back_scores_and_choices_only():
    """Blocks in worker processes: without a sink no block's models come back, and the scores
    and choices are those of a pass that takes them."""
    ds, net, trained, board = finish_inputs(36)
    dim = sum(p.numel() for p in board.values())
    plan = auto_plan("pmtl", None, 0.001, 0.5, dim, 3)
    options = FinishOptions(
        "auto", batch_size=10, seed=0, lr=0.1, lam=0.1, plan=plan, block=4, workers=2,
        score={"global": (board, False)},
    )  # fmt: skip
    seen = []
    taken = finish_pass(options, ds, net, trained, board, on_block=lambda pos, p, _: seen.append(p))
    dropped = finish_pass(options, ds, net, trained, board)
    assert len(seen) == 9 and all(block for block in seen)
    assert dropped.scores == taken.scores and dropped.choice.tolist() == taken.choice.tolist()


def test_the_candidates_train_in_the_pass_blocks_and_a_model_is_the_same_bytes(monkeypatch):
    """A pass's block reaches its candidates' training (a large block solves fuller ridge
    buckets), and a client's final model is the same bytes whatever the block."""
    from privmtl.federated.end_of_run import local as end_of_run_local

    ds, net, trained, board = finish_inputs(12)
    dim = sum(p.numel() for p in board.values())
    plan = auto_plan("pmtl", None, 0.001, 0.5, dim, 3)
    kw = {"batch_size": 10, "seed": 0, "lr": 0.1, "lam": 0.1, "plan": plan, "local_solver": "ridge"}
    seen: list[tuple[int, int]] = []
    train_local = end_of_run_local.train_local

    def spy(dataset, model, **kwargs):
        seen.append((dataset.n_clients, kwargs["block"]))
        return train_local(dataset, model, **kwargs)

    monkeypatch.setattr(end_of_run_local, "train_local", spy)
    small = finish_clients("auto", ds, net, trained, board, block=3, **kw)
    assert seen and all(block == 3 and n <= 3 for n, block in seen)
    seen.clear()
    large = finish_clients("auto", ds, net, trained, board, block=12, **kw)
    assert seen and all(block == 12 and n == 12 for n, block in seen)
    assert small.choice is not None and large.choice is not None
    assert small.choice.tolist() == large.choice.tolist()
    for n, p in large.params.items():
        assert small.params[n].numpy().tobytes() == p.numpy().tobytes(), n


@pytest.mark.parametrize("workers", [1, 2])
def test_the_sink_takes_each_block_s_data_as_the_pass_drew_it(workers, monkeypatch):
    """A sink that scores a block needs its data: the pass hands over the block it drew in this
    process (the whole data set when one block holds every client), so nothing draws a block
    twice; from worker processes it hands over None."""
    ds, net, trained, board = finish_inputs()
    m = ds.n_clients
    drawn = []
    real_subset = type(ds).subset

    def subset(self, clients):
        drawn.append(list(clients))
        return real_subset(self, clients)

    monkeypatch.setattr(type(ds), "subset", subset)
    kw = {"batch_size": 10, "seed": 0, "lr": 0.1, "lam": 0.1, "workers": workers}
    seen = []
    finish_pass(
        FinishOptions("vanilla", block=m, **kw), ds, net, trained, board,
        on_block=lambda pos, p, data: seen.append((pos, data)),
    )  # fmt: skip
    assert len(seen) == 1 and seen[0][1] is ds and drawn == []
    seen.clear()
    finish_pass(
        FinishOptions("vanilla", block=4, **kw), ds, net, trained, board,
        on_block=lambda pos, p, data: seen.append((pos, data)),
    )  # fmt: skip
    blocks = [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    # handed over in the blocks' order; drawn once each, by threads in whatever order they ran
    assert [pos.tolist() for pos, _ in seen] == blocks
    assert sorted(drawn) == blocks
    for pos, data in seen:
        assert data.n_clients == len(pos)
        for split in ("train", "test"):
            for mine, theirs in zip(
                data.split(split)[0], ds.split(split)[0][pos[0] :], strict=False
            ):
                assert torch.equal(mine, theirs)


def test_blocks_from_worker_processes_reach_the_sink_without_their_data():
    ds, net, trained, board = finish_inputs(36)
    options = FinishOptions("vanilla", batch_size=10, seed=0, lr=0.1, lam=0.1, block=4, workers=2)
    seen = []
    finish_pass(options, ds, net, trained, board, on_block=lambda pos, p, data: seen.append(data))
    assert len(seen) == 9 and all(data is None for data in seen)


@pytest.mark.parametrize(("method", "start"), [("vanilla", "personalized"), ("mr", "global")])
def test_a_fine_tuning_grid_goes_a_block_at_a_time(method, start, monkeypatch):
    """A grid of (lr, lam): the pass runs finetune_select on each block's clients (seeded by
    their population indices) and every client ends with the model, the choice and the scores
    of finetune_select run on the whole population at once."""
    ds, net, trained, board = finish_inputs(12)
    lrs, lams = (0.003, 0.3, 30.0), (0.1, 3.0)
    kw = {"batch_size": 10, "seed": 0, "epochs": 2, "start": start}
    pers = trained if start == "personalized" else stack_trained(None, board, ds.n_clients)
    whole, acc, sel = finetune_select(
        pers, ds, net, method=method, lrs=lrs, lams=lams, global_params=board, **kw
    )
    assert len(set(sel["choice"])) > 1  # the clients' choices differ
    store = ClientStore(ds.n_clients, {"personal": {n: p[0] for n, p in pers.items()}})
    store.scatter("personal", torch.arange(ds.n_clients), pers)
    monkeypatch.setattr(ClientModels, "_stack", lambda self: pytest.fail("stacked every client"))
    seen: list[tuple[np.ndarray, dict[str, torch.Tensor]]] = []
    options = FinishOptions(
        method, lr=0.1, lam=0.1, block=4, score={}, grid=(lrs, lams), **kw
    )  # fmt: skip
    fin = finish_pass(
        options, ds, net, StoredModels(store, "personal"), board,
        on_block=lambda pos, p, _: seen.append((pos, p)),
    )  # fmt: skip
    assert [len(pos) for pos, _ in seen] == [4, 4, 4]
    for n, p in whole.items():
        assert torch.equal(torch.cat([block[n] for _, block in seen]), p), n
    assert fin.choice is not None and fin.choice.tolist() == sel["choice"]
    assert fin.scores is not None
    assert {split: fin.scores[split]["final"] for split in ("val", "test")} == acc
