"""The end-of-run vote (``finetune="auto"``, ``finetune_select="vote"``): one candidate for every
client, elected by the clients' recorded noisy vote; its ε composed into the run's reported ε."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch
from finish_inputs import finish_inputs

from privmtl.data.federated import make_synthetic_federated
from privmtl.exceptions import InvalidParameterError
from privmtl.experiments.pmtl import run_pmtl
from privmtl.federated.end_of_run import finish
from privmtl.federated.end_of_run import plan as end_plan
from privmtl.federated.end_of_run.finish import (
    FINETUNE_VOTE_ID,
    FINETUNE_VOTE_SHARE,
    FINETUNE_VOTERS,
    auto_plan,
    finish_clients,
    vote_candidates,
    vote_voters,
)
from privmtl.privacy import ClientVote, plan_vote
from privmtl.privacy.selection import VOTE_MECHANISM, VOTE_SIGNAL

KW = {"noise_source": "seeded", "seed": 0, "show_progress": False, "threads": 1}


def _inputs(m=9):
    ds, net, trained, board = finish_inputs(m)
    dim = sum(p.numel() for p in board.values())
    return ds, net, trained, board, auto_plan("pmtl", None, 0.001, 0.5, dim, 3)


def test_vote_candidates_expand_the_billboard_grid_in_the_plans_order():
    *_, plan = _inputs()
    assert vote_candidates(plan) == (
        "trained", "local", "billboard-finetune e10 lr0.1", "billboard-finetune e10 lr0.01",
        "billboard-finetune e3 lr0.1", "billboard-finetune e3 lr0.01",
    )  # fmt: skip
    assert vote_candidates(plan, "ridge")[2:] == ("billboard-finetune c30",)
    weak = auto_plan("pmtl", None, 10.0, 0.5, 10, 3)  # no signal: no billboard candidate
    assert vote_candidates(weak) == ("trained", "local")


@pytest.mark.parametrize("pick", [0, 4])
def test_every_client_takes_the_winner_and_the_vote_reads_each_clients_own_shares(pick):
    ds, net, trained, board, plan = _inputs()
    seen = {}

    def vote(shares, names):
        seen["shares"], seen["names"] = shares, names
        return pick

    kw = {"batch_size": 10, "seed": 0, "lr": 0.1, "lam": 0.1, "plan": plan}
    fin = finish_clients("auto", ds, net, trained, board, select="vote", vote=vote, **kw)
    names = vote_candidates(plan)
    assert seen["names"] == names and fin.winner == names[pick]
    shares = seen["shares"]
    has_val = np.array([len(y) > 0 for y in ds.split("val")[1]])
    assert shares.shape == (ds.n_clients, len(names)) and (shares >= 0).all()
    assert np.allclose(shares.sum(1), has_val.astype(float))  # one vote each, or none
    assert fin.choice is not None and set(fin.choice.tolist()) == {
        plan.names.index(names[pick].split()[0])
    }
    if pick == 0:  # the trained models, unchanged
        for n, p in trained.items():
            assert torch.equal(fin.params[n], p)
    else:  # the billboard fine-tuned at that grid point, for every client: blocks change nothing
        again = finish_clients(
            "auto", ds, net, trained, board, select="vote", vote=vote, block=4, **kw
        )
        for n, p in fin.params.items():
            assert not torch.equal(p, trained[n])
            assert torch.allclose(again.params[n], p, atol=1e-6, rtol=0)


@pytest.mark.parametrize("in_processes", [False, True])
def test_the_vote_in_concurrent_blocks_equals_one_block_after_another(in_processes, monkeypatch):
    """``workers``: the voters' blocks computed in threads, or in forked processes, give the same
    shares, winner and models as one after another (a client's shares read its own block
    only)."""
    from privmtl.federated import blocks

    if in_processes:
        if not blocks.FORKED_WORKERS:
            pytest.skip("blocks run in forked processes on Linux only")
        monkeypatch.setattr(blocks, "PROCESS_MIN_BLOCKS", 2)
    ds, net, trained, board, plan = _inputs(m=11)
    seen = []

    def vote(shares, names):
        seen.append(shares)
        return 2

    kw = {"batch_size": 10, "seed": 0, "lr": 0.1, "lam": 0.1, "plan": plan, "block": 3}
    one = finish_clients("auto", ds, net, trained, board, select="vote", vote=vote, **kw)
    two = finish_clients("auto", ds, net, trained, board, select="vote", vote=vote, workers=2, **kw)
    assert np.array_equal(seen[0], seen[1]) and seen[0].sum() > 0
    assert two.winner == one.winner
    for n, p in one.params.items():
        assert torch.equal(two.params[n], p), n


def test_voters_are_everyone_up_to_the_cap_then_each_client_by_its_own_coin():
    assert np.array_equal(vote_voters(FINETUNE_VOTERS), np.arange(FINETUNE_VOTERS))
    m = 3 * FINETUNE_VOTERS
    a = vote_voters(m, np.random.default_rng(3))
    assert np.array_equal(a, vote_voters(m, np.random.default_rng(3)))  # the coins alone
    assert (np.diff(a) > 0).all() and 0 <= a[0] and a[-1] < m
    # Binomial(m, 1/3): within 5 standard deviations of FINETUNE_VOTERS
    assert abs(len(a) - FINETUNE_VOTERS) < 5 * (FINETUNE_VOTERS * 2 / 3) ** 0.5
    # each client's own coin, at the rate FINETUNE_VOTERS / m
    coins = np.random.default_rng(3).random(m) < FINETUNE_VOTERS / m
    assert np.array_equal(np.flatnonzero(coins), a)
    secure = [vote_voters(m) for _ in range(2)]  # OS entropy by default: two draws differ
    assert not np.array_equal(*secure)


def test_above_the_cap_only_the_voters_vote_and_every_client_takes_the_winner(monkeypatch):
    ds, net, trained, board, plan = _inputs(m=12)
    monkeypatch.setattr(end_plan, "FINETUNE_VOTERS", 5)
    voters = end_plan.vote_voters(12, np.random.default_rng(0))
    assert 0 < len(voters) < 12
    seen = {}

    def vote(shares, names):
        seen["shares"] = shares
        return 3

    kw = {"batch_size": 10, "seed": 0, "lr": 0.1, "lam": 0.1, "plan": plan}
    fin = finish_clients(
        "auto", ds, net, trained, board, select="vote", vote=vote,
        voter_rng=np.random.default_rng(0), **kw,
    )  # fmt: skip
    assert fin.voters == len(voters)
    others = np.setdiff1d(np.arange(12), voters)
    assert (seen["shares"][others] == 0).all()  # the others abstain: their data are not read
    has_val = np.array([len(y) > 0 for y in ds.split("val")[1]])
    assert np.allclose(seen["shares"][voters].sum(1), has_val[voters].astype(float))
    monkeypatch.setattr(end_plan, "FINETUNE_VOTERS", 100)  # everyone votes: the same models
    whole = finish_clients("auto", ds, net, trained, board, select="vote", vote=vote, **kw)
    assert whole.voters == 12
    for n, p in fin.params.items():
        assert torch.equal(p, whole.params[n])


def test_finish_refuses_a_vote_without_auto_or_without_its_vote():
    ds, net, trained, board, plan = _inputs()
    kw = {"batch_size": 10, "seed": 0, "lr": 0.1, "lam": 0.1}
    with pytest.raises(InvalidParameterError, match=r"select='vote'.*needs finetune='auto'"):
        finish_clients("auto", ds, net, trained, board, plan=plan, select="vote", **kw)
    with pytest.raises(InvalidParameterError, match="'select' parameter"):
        finish_clients("auto", ds, net, trained, board, plan=plan, select="pooled", **kw)


#: the integer Rényi orders of privmtl's RDP accountant, and a finer grid with fractional ones
ORDERS = [*range(2, 65), 80, 96, 128, 192, 256, 512, 1024]
FINE_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [128, 256, 512]


def _independent_epsilon(z_rounds, rate, rounds, z_vote, delta, orders=ORDERS):
    """ε of the rounds (Poisson-sampled Gaussians) and the vote (a Gaussian), composed by
    dp-accounting's RDP accountant directly."""
    acc = dp_accounting.rdp.RdpAccountant([float(a) for a in orders])
    gauss = dp_accounting.GaussianDpEvent(z_rounds)
    acc.compose(dp_accounting.PoissonSampledDpEvent(rate, gauss), rounds)
    acc.compose(dp_accounting.GaussianDpEvent(z_vote))
    return acc.get_epsilon(delta)


@pytest.fixture(scope="module")
def voted():
    return run_pmtl(num_clients=300, epsilon=1.0, rounds=3, finetune_select="vote", **KW)


def test_reported_epsilon_composes_rounds_and_vote_to_the_target(voted):
    vote = voted["finetune_auto"]["vote"]
    assert voted["finetune_auto"]["select"] == "vote" and vote["held"]
    assert vote["id"] == FINETUNE_VOTE_ID and vote["winner"] in vote["candidates"]
    assert vote["voters"] == 300
    assert len(vote["noisy_counts"]) == len(vote["candidates"])
    assert vote["share"] == FINETUNE_VOTE_SHARE
    assert vote["epsilon"] == pytest.approx(FINETUNE_VOTE_SHARE * 1.0, rel=1e-3)
    assert vote["noise_std"] <= 300 / VOTE_SIGNAL
    q, m, delta = voted["clients_per_round"], voted["num_clients"], voted["delta"]
    indep = _independent_epsilon(voted["noise_multiplier"], q / m, 3, vote["noise_std"], delta)
    assert voted["epsilon"] == pytest.approx(indep, rel=1e-6)
    fine = _independent_epsilon(
        voted["noise_multiplier"], q / m, 3, vote["noise_std"], delta, FINE_ORDERS
    )
    assert fine <= voted["epsilon"]  # the reported ε is never below a tighter computation
    assert voted["epsilon"] == pytest.approx(1.0, rel=1e-3) and voted["epsilon"] <= 1.0 + 1e-9
    rounds_only = _independent_epsilon(voted["noise_multiplier"], q / m, 3, 1e9, delta)
    assert rounds_only < voted["epsilon"] - 1e-4  # the vote's reserve is spent on the vote
    assert voted["guarantee"]["details"]["votes"] == 1
    assert voted["guarantee"]["details"]["releases"] == 3
    assert any("select=vote" in note for note in voted["guarantee"]["notes"])
    won = vote["winner"].split()[0]
    assert voted["clients_per_final_model"][won] == m


def test_the_ledger_holds_the_vote_before_any_final_model_exists(monkeypatch):
    order = []
    select, finish_all = ClientVote.select, finish._finish_all

    def taped_select(self, *args, **kw):
        res = select(self, *args, **kw)
        ledger = kw["ledger"]
        assert ledger.records[-1]["mechanism"] == VOTE_MECHANISM
        assert ledger.records[-1].get("release_id") == FINETUNE_VOTE_ID
        order.append("vote recorded")
        return res

    def taped_finish_all(*args, **kw):
        order.append("final models")
        return finish_all(*args, **kw)

    monkeypatch.setattr(ClientVote, "select", taped_select)
    monkeypatch.setattr(finish, "_finish_all", taped_finish_all)
    run_pmtl(num_clients=300, epsilon=1.0, rounds=2, finetune_select="vote", **KW)
    assert order == ["vote recorded", "final models"]


def test_few_clients_hold_no_vote_and_spend_nothing_on_it():
    plan = plan_vote(50, epsilon=1.0, delta=1e-5, share=FINETUNE_VOTE_SHARE)
    assert not plan.held and plan.event() is None and "could not carry signal" in plan.reason
    out = run_pmtl(num_clients=50, epsilon=1.0, rounds=2, finetune_select="vote", **KW)
    base = run_pmtl(num_clients=50, epsilon=1.0, rounds=2, **KW)
    auto = out["finetune_auto"]
    assert auto["select"] == "client" and auto["vote"]["held"] is False
    assert "m / 4" in auto["vote"]["reason"]
    assert out["noise_std"] == base["noise_std"] and out["epsilon"] == base["epsilon"]
    assert out["test_accuracy"] == base["test_accuracy"]  # today's per-client rule


def test_non_private_run_takes_the_exact_vote():
    out = run_pmtl(num_clients=30, epsilon=None, rounds=2, finetune_select="vote", **KW)
    vote = out["finetune_auto"]["vote"]
    assert vote["held"] and vote["noise_std"] == 0 and vote["epsilon"] is None
    counts = np.array(vote["noisy_counts"])
    assert counts.sum() == pytest.approx(
        sum(
            len(y) > 0
            for y in make_synthetic_federated(n_clients=30, random_state=0).split("val")[1]
        )
    )  # exact shares: one vote per client with validation data
    assert vote["winner"] == vote["candidates"][int(np.argmax(counts))]
    assert math.isinf(out["epsilon"])


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"finetune": "vanilla"}, "finetune_select='vote' elects one candidate of finetune='auto'"),
        ({"noise_std": 0.1}, "finetune_select='vote' takes its share of a target 'epsilon'"),
        ({"finetune_select": "best"}, "'finetune_select' parameter"),
    ],
)
def test_vote_refusals_name_the_parameter(kw, match):
    args = {"num_clients": 20, "rounds": 1, "finetune_select": "vote", **KW, **kw}
    with pytest.raises(InvalidParameterError, match=match):
        run_pmtl(**args)


def test_a_run_stopped_on_its_budget_holds_no_vote_it_cannot_afford():
    # two rounds spend 0.9379 of the budget 0.938, the vote would bring it to 0.9392
    out = run_pmtl(
        num_clients=300, epsilon=1.0, rounds=3, finetune_select="vote", budget_epsilon=0.938, **KW
    )
    vote = out["finetune_auto"]["vote"]
    assert out["stopped_on_budget"] and out["guarantee"]["details"]["rounds_run"] == 2
    assert out["finetune_auto"]["select"] == "client" and vote["held"] is False
    assert vote["reason"].startswith("no vote:") and out["epsilon"] <= 0.938
