"""Each client's end of a run (federated.finish): computed for any part of the population, every
client ends with the model it ends with when the whole population is finished at once."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from finish_inputs import finish_inputs

from privmtl.exceptions import InvalidParameterError
from privmtl.federated.end_of_run.finish import auto_plan, finish_clients


@pytest.mark.parametrize("finetune", ["auto", "mr", "vanilla"])
def test_finish_of_parts_equals_finish_of_the_whole(finetune):
    ds, net, trained, board = finish_inputs()
    dim = sum(p.numel() for p in board.values())
    plan = auto_plan("pmtl", None, 0.001, 0.5, dim, 3) if finetune == "auto" else None
    kw = {"batch_size": 10, "seed": 0, "lr": 0.1, "lam": 0.1, "plan": plan}
    whole = finish_clients(finetune, ds, net, trained, board, **kw)
    parts = [np.arange(0, 4), np.arange(4, 9)]
    pieces = [
        finish_clients(
            finetune, ds.subset(idx.tolist()), net, {n: p[idx] for n, p in trained.items()},
            board, client_index=idx.tolist(), **kw,
        )
        for idx in parts
    ]  # fmt: skip
    for n, p in whole.params.items():
        got = torch.cat([piece.params[n] for piece in pieces])
        assert torch.allclose(got, p, atol=1e-6, rtol=0), n
    if finetune == "auto":
        assert plan is not None and "billboard-finetune" in plan.names  # every candidate exists
        assert np.concatenate([piece.choice for piece in pieces]).tolist() == whole.choice.tolist()
        assert len(set(whole.choice.tolist())) > 1  # the clients do not all choose alike
    # without the population indices, the second part's clients draw other minibatches
    alone = finish_clients(
        finetune, ds.subset(parts[1].tolist()), net,
        {n: p[parts[1]] for n, p in trained.items()}, board, **kw,
    )  # fmt: skip
    assert not all(
        torch.allclose(alone.params[n], whole.params[n][parts[1]], atol=1e-6) for n in board
    )


@pytest.mark.parametrize("finetune", ["auto", "vanilla"])
def test_finish_in_blocks_equals_finish_of_the_whole(finetune):
    """``block``: the population finished a few clients at a time ends as the whole at once."""
    ds, net, trained, board = finish_inputs()
    dim = sum(p.numel() for p in board.values())
    plan = auto_plan("pmtl", None, 0.001, 0.5, dim, 3) if finetune == "auto" else None
    kw = {"batch_size": 10, "seed": 0, "lr": 0.1, "lam": 0.1, "plan": plan}
    whole = finish_clients(finetune, ds, net, trained, board, **kw)
    blocks = finish_clients(finetune, ds, net, trained, board, block=4, **kw)
    for n, p in whole.params.items():
        assert blocks.params[n].shape == p.shape
        assert torch.allclose(blocks.params[n], p, atol=1e-6, rtol=0), n
    if finetune == "auto":
        assert blocks.choice is not None and whole.choice is not None
        assert blocks.choice.tolist() == whole.choice.tolist()
        assert blocks.grids == whole.grids and blocks.plan == whole.plan
    with pytest.raises(InvalidParameterError, match="'block'"):
        finish_clients(finetune, ds, net, trained, board, block=0, **kw)


def test_finish_none_keeps_the_trained_models_and_auto_needs_its_plan():
    from privmtl.exceptions import InvalidParameterError

    ds, net, trained, board = finish_inputs(4)
    kw = {"batch_size": 10, "seed": 0, "lr": 0.1, "lam": 0.1}
    done = finish_clients("none", ds, net, trained, board, **kw)
    assert all(torch.equal(done.params[n], trained[n]) for n in trained) and done.choice is None
    with pytest.raises(InvalidParameterError, match="'plan'"):
        finish_clients("auto", ds, net, trained, board, **kw)
    with pytest.raises(InvalidParameterError, match="'finetune'"):
        finish_clients("sideways", ds, net, trained, board, **kw)


def test_final_model_counts_and_their_words():
    from privmtl.federated.end_of_run.finish import describe_final_models, final_model_counts

    auto = final_model_counts("auto", 20, auto_counts={"trained": 0, "local": 20})
    assert auto == {"trained": 0, "local": 20}
    assert describe_final_models(auto, personalized=True) == (
        "0 of 20 clients kept the trained personalized model, 20 trained locally from scratch"
    )
    three = {"trained": 2, "local": 15, "billboard-finetune": 3}
    assert describe_final_models(three, personalized=False) == (
        "2 of 20 clients kept the trained global model, 15 trained locally from scratch, "
        "3 fine-tuned the released global model on their own data"
    )
    assert final_model_counts("none", 7) == {"trained": 7}
    assert final_model_counts("mr", 7) == {"finetuned": 7}
    assert final_model_counts("vanilla", 7, from_billboard=True) == {"billboard-finetune": 7}
    assert describe_final_models({"finetuned": 7}, personalized=True) == (
        "7 of 7 clients fine-tuned the trained personalized model on their own data"
    )
    with pytest.raises(InvalidParameterError, match="auto_counts"):
        final_model_counts("auto", 7)


@pytest.mark.parametrize("in_processes", [False, True])
def test_concurrent_blocks_and_their_scores_equal_one_block_after_another(
    in_processes, monkeypatch
):
    """``workers``: blocks finished in threads, or in forked processes, give the same models,
    choices and scores as one after another; ``score``: the scores are those of evaluating the
    models afterwards."""
    from privmtl.federated import blocks
    from privmtl.federated.scoring import evaluate

    if in_processes:
        if not blocks.FORKED_WORKERS:
            pytest.skip("blocks run in forked processes on Linux only")
        monkeypatch.setattr(blocks, "PROCESS_MIN_BLOCKS", 2)

    ds, net, trained, board = finish_inputs(m=11)
    dim = sum(p.numel() for p in board.values())
    plan = auto_plan("pmtl", None, 0.001, 0.5, dim, 3)
    kw = {"batch_size": 10, "seed": 0, "lr": 0.1, "lam": 0.1, "plan": plan, "block": 3}
    score = {"personalized": (trained, True), "global": (board, False)}
    one = finish_clients("auto", ds, net, trained, board, score=score, **kw)
    two = finish_clients("auto", ds, net, trained, board, score=score, workers=3, **kw)
    for n, p in one.params.items():
        assert torch.equal(two.params[n], p), n
    assert two.choice.tolist() == one.choice.tolist()
    assert two.scores == one.scores and set(one.scores) == {"val", "test"}
    buffers = dict(net.named_buffers())
    for split in ("val", "test"):
        xs, ys = ds.split(split)
        final = evaluate(net, one.params, buffers, xs, ys, personalized=True)
        glob = evaluate(net, board, buffers, xs, ys, personalized=False)
        for key in ("accuracy", "mean_client_accuracy", "n"):
            assert one.scores[split]["final"][key] == final[key]
            assert one.scores[split]["global"][key] == glob[key]
    with pytest.raises(InvalidParameterError, match="'workers'"):
        finish_clients("auto", ds, net, trained, board, workers=0, **kw)


def test_the_scoring_share_of_concurrent_blocks_is_a_share_of_their_wall_time():
    """Blocks computed at once: their summed times exceed the wall time they took, and the
    scoring is carved as its fraction of the blocks' summed time; one block after another: the
    scoring's own seconds."""
    from privmtl.federated.end_of_run.finish import _Book

    book = _Book(scores=None, others={})  # type: ignore[arg-type]
    book.seconds, book.block_seconds = 10.0, 40.0
    assert book.wall_seconds(20.0) == pytest.approx(5.0)  # two threads: 40 s of blocks in 20 s
    assert book.wall_seconds(41.0) == 10.0  # one after another (and the overhead around them)
    book.seconds = book.block_seconds = 0.0
    assert book.wall_seconds(3.0) == 0.0


def test_a_finished_run_s_scoring_is_within_its_wall_time():
    ds, net, trained, board = finish_inputs()
    dim = sum(p.numel() for p in board.values())
    plan = auto_plan("pmtl", None, 0.001, 0.5, dim, 3)
    kw = {"batch_size": 10, "seed": 0, "lr": 0.1, "lam": 0.1, "plan": plan, "score": {}}
    t0 = time.perf_counter()
    fin = finish_clients("auto", ds, net, trained, board, block=3, workers=2, **kw)
    wall = time.perf_counter() - t0
    assert 0.0 < fin.score_seconds <= wall
