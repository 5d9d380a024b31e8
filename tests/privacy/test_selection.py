"""The client vote: its ε against the exact Gaussian mechanism, its winner, its write-ahead record."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event as dpe
from scipy.optimize import brentq
from scipy.stats import norm

from privmtl.exceptions import InvalidParameterError, PrivacyBudgetError
from privmtl.privacy import (
    ClientVote,
    PrivacyLedger,
    SeededNoise,
    client_votes,
    compute_epsilon,
    record_candidates,
    vote_sensitivity,
)
from privmtl.privacy.ledger import read_ledger
from privmtl.privacy.selection import ABSTAIN, VOTE_MECHANISM


def exact_gaussian_epsilon(sensitivity: float, sigma: float, delta: float) -> float:
    """ε of the Gaussian mechanism at δ (Balle & Wang 2018, Thm 8), independent of dp-accounting."""

    def delta_of(eps: float) -> float:
        a = sensitivity / (2 * sigma)
        b = eps * sigma / sensitivity
        return norm.cdf(a - b) - math.exp(eps) * norm.cdf(-a - b)

    return brentq(lambda e: delta_of(e) - delta, 0.0, 100.0, xtol=1e-12)


@pytest.mark.parametrize("relation", ["add-remove", "replace-one"])
@pytest.mark.parametrize("sigma", [1.5, 6.0])
def test_vote_epsilon_is_the_gaussian_mechanism_of_its_histogram(relation, sigma):
    delta = 1e-5
    vote = ClientVote(n_candidates=5, noise_std=sigma, relation=relation)
    oracle = exact_gaussian_epsilon(vote_sensitivity(relation), sigma, delta)
    pld = vote.epsilon(delta, accountant="pld")
    # PLD discretisation rounds pessimistically: never below the exact ε, and close to it
    assert oracle - 1e-9 <= pld <= oracle * 1.01 + 1e-3
    rdp = vote.epsilon(delta, accountant="rdp")
    assert rdp >= oracle - 1e-9  # RDP is an upper bound, never tighter than exact
    # the ledger composes the same event: a ledger holding only the vote reports its ε
    ledger = PrivacyLedger(delta=delta, accountant="pld", relation=relation)
    res = vote.select([0, 1, 1], SeededNoise(0), ledger=ledger)
    assert res.epsilon == pytest.approx(pld)


def test_sensitivities_and_replace_one_needs_sqrt2_more_noise():
    assert vote_sensitivity("add-remove") == 1.0
    assert vote_sensitivity("replace-one") == pytest.approx(math.sqrt(2.0))
    a = ClientVote.for_epsilon(3, epsilon=1.0, delta=1e-5, accountant="pld")
    b = ClientVote.for_epsilon(3, epsilon=1.0, delta=1e-5, accountant="pld", relation="replace-one")
    assert b.noise_std / a.noise_std == pytest.approx(math.sqrt(2.0), rel=2e-3)
    assert a.epsilon(1e-5, accountant="pld") <= 1.0
    assert a.epsilon(1e-5, accountant="pld") == pytest.approx(1.0, rel=1e-3)
    oracle = exact_gaussian_epsilon(1.0, a.noise_std, 1e-5)
    assert oracle == pytest.approx(1.0, rel=1e-2)


def test_argmax_picks_the_clear_winner():
    rng = np.random.default_rng(3)
    votes = np.concatenate([np.full(60, 2), rng.integers(0, 4, size=40)])  # 2 gets ~70 of 100
    vote = ClientVote(n_candidates=4, noise_std=5.0)
    winners = [vote.select(votes, SeededNoise(seed), delta=1e-5).winner for seed in range(50)]
    assert winners.count(2) == 50
    # with noise that swamps the counts the winner varies: the noise is really drawn
    loud = ClientVote(n_candidates=4, noise_std=500.0)
    assert len({loud.select(votes, SeededNoise(s), delta=1e-5).winner for s in range(50)}) > 1


def test_noisy_counts_are_counts_plus_the_seeded_draw():
    vote = ClientVote(n_candidates=3, noise_std=2.0)
    res = vote.select([0, 0, 2, ABSTAIN], SeededNoise(7), delta=1e-5)
    draw = SeededNoise(7).normal_numpy((3,), 2.0)
    np.testing.assert_allclose(res.noisy_counts, np.array([2.0, 0.0, 1.0]) + draw)
    assert res.winner == int(np.argmax(np.array([2.0, 0.0, 1.0]) + draw))
    assert res.details["noise_source"] == "seeded"


def test_vote_is_recorded_before_the_winner_is_returned(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = PrivacyLedger(delta=1e-5, path=path)
    seen: list[int] = []

    class Spy(SeededNoise):
        def normal_numpy(self, shape, std):
            seen.append(len(ledger.records))  # noise is drawn before the record...
            return super().normal_numpy(shape, std)

    res = ClientVote(n_candidates=2, noise_std=3.0).select([1, 1, 0], Spy(0), ledger=ledger)
    assert seen == [0]
    _, entries = read_ledger(path)  # ...and the record is on disk when select returns
    assert [e["mechanism"] for e in entries] == [VOTE_MECHANISM]
    assert entries[0]["params"]["noise_std"] == 3.0
    assert res.epsilon == pytest.approx(ledger.epsilon())

    # a ledger that refuses the vote: nothing is released, not even noise is drawn
    tight = PrivacyLedger(delta=1e-5, budget=0.01)
    seen.clear()
    with pytest.raises(PrivacyBudgetError):
        ClientVote(n_candidates=2, noise_std=3.0).select([1], Spy(0), ledger=tight)
    assert seen == [] and tight.records == []


def test_failed_record_releases_nothing():
    class Broken(PrivacyLedger):
        def record(self, *a, **k):
            raise OSError("disk full")

    with pytest.raises(OSError):
        ClientVote(n_candidates=2, noise_std=1.0).select(
            [0], SeededNoise(0), ledger=Broken(delta=1e-5)
        )


def test_selection_cost_composes_candidates_and_vote():
    delta = 1e-5
    z, rounds = 1.2, 30
    cand = [[dpe.SelfComposedDpEvent(dpe.GaussianDpEvent(z), rounds)] for _ in range(3)]
    ledger = PrivacyLedger(delta=delta)
    eps_candidates = record_candidates(ledger, cand)
    expected = compute_epsilon(
        dpe.SelfComposedDpEvent(dpe.GaussianDpEvent(z), 3 * rounds), delta=delta
    )
    assert eps_candidates == pytest.approx(expected, rel=1e-9)
    one = compute_epsilon(dpe.SelfComposedDpEvent(dpe.GaussianDpEvent(z), rounds), delta=delta)
    assert eps_candidates > one  # choosing among 3 runs costs more than one run
    res = ClientVote(n_candidates=3, noise_std=4.0).select([0, 1, 1], SeededNoise(0), ledger=ledger)
    both = compute_epsilon(
        dpe.ComposedDpEvent(
            [dpe.SelfComposedDpEvent(dpe.GaussianDpEvent(z), 3 * rounds), dpe.GaussianDpEvent(4.0)]
        ),
        delta=delta,
    )
    assert res.epsilon == pytest.approx(both, rel=1e-9)
    assert [r["mechanism"] for r in ledger.records][-1] == VOTE_MECHANISM
    # serialized events (as read from a run's ledger file) are accepted too
    ledger2 = PrivacyLedger(delta=delta)
    record_candidates(ledger2, [[{"type": "gaussian", "noise_multiplier": z}]])
    assert ledger2.epsilon() == pytest.approx(compute_epsilon(dpe.GaussianDpEvent(z), delta=delta))


def test_zero_noise_vote_is_recorded_non_private():
    ledger = PrivacyLedger(delta=1e-5)
    res = ClientVote(n_candidates=2, noise_std=0.0).select([1, 1, 0], SeededNoise(0), ledger=ledger)
    assert res.winner == 1 and res.noisy_counts == (1.0, 2.0)
    assert math.isinf(res.epsilon) and res.details["noise_source"] == "none"


def test_client_votes_from_scores():
    scores = np.array([[0.1, 0.9, 0.5], [np.nan, np.nan, np.nan], [0.7, np.nan, 0.7]])
    np.testing.assert_array_equal(client_votes(scores), [1, ABSTAIN, 0])
    np.testing.assert_array_equal(client_votes(scores, higher_is_better=False), [0, ABSTAIN, 0])
    with pytest.raises(InvalidParameterError, match="'scores'"):
        client_votes(np.zeros(3))


def test_bad_input_errors():
    with pytest.raises(InvalidParameterError, match="n_candidates"):
        ClientVote(n_candidates=0, noise_std=1.0)
    with pytest.raises(InvalidParameterError, match="noise_std"):
        ClientVote(n_candidates=2, noise_std=-1.0)
    with pytest.raises(InvalidParameterError, match="relation"):
        ClientVote(n_candidates=2, noise_std=1.0, relation="swap")
    vote = ClientVote(n_candidates=2, noise_std=1.0)
    with pytest.raises(InvalidParameterError, match=r"\[0, 2\).*got 2"):
        vote.select([0, 2], SeededNoise(0), delta=1e-5)
    with pytest.raises(InvalidParameterError, match="integers"):
        vote.select([0.5], SeededNoise(0), delta=1e-5)
    with pytest.raises(InvalidParameterError, match=r"ledger.*delta"):
        vote.select([0], SeededNoise(0))
    mismatch = PrivacyLedger(delta=1e-5, accountant="pld", relation="replace-one")
    with pytest.raises(InvalidParameterError, match="relation"):
        vote.select([0], SeededNoise(0), ledger=mismatch)
    assert mismatch.records == []
    with pytest.raises(InvalidParameterError, match="candidate_events"):
        record_candidates(PrivacyLedger(delta=1e-5), [])


def test_secure_noise_by_default():
    vote = ClientVote(n_candidates=3, noise_std=1.0)
    a = vote.select([0, 1, 1], delta=1e-5)
    b = vote.select([0, 1, 1], delta=1e-5)
    assert a.details["noise_source"] == "secure"
    assert a.noisy_counts != b.noisy_counts  # fresh OS entropy each time


def test_vote_shares_split_ties_and_abstain_without_scores():
    from privmtl.privacy import client_vote_shares

    scores = np.array([[2.0, 1.0, 2.0], [0.0, 0.0, 0.0], [np.nan] * 3, [1.0, np.nan, 3.0]])
    shares = client_vote_shares(scores)
    assert shares.tolist() == [[0.5, 0.0, 0.5], [1 / 3, 1 / 3, 1 / 3], [0.0] * 3, [0.0, 0.0, 1.0]]
    assert client_vote_shares(-scores, higher_is_better=False).tolist() == shares.tolist()
    vote = ClientVote(3, 0.0)
    assert vote.counts(shares).tolist() == pytest.approx([5 / 6, 1 / 3, 11 / 6])
    with pytest.raises(InvalidParameterError, match="'scores' parameter must be a 2-d"):
        client_vote_shares(np.zeros(3))


@pytest.mark.parametrize(
    ("shares", "match"),
    [
        (np.array([[0.6, 0.6, 0.0]]), "sum to at most 1 per client .* got a row summing to 1.2"),
        (np.array([[-0.1, 0.5, 0.0]]), "finite and non-negative"),
        (np.array([[0.5, 0.5]]), "must have 3 columns"),
    ],
)
def test_vote_shares_are_refused_beyond_one_vote_per_client(shares, match):
    with pytest.raises(InvalidParameterError, match=match):
        ClientVote(3, 1.0).select(shares, SeededNoise(0), delta=1e-5)


def test_plan_vote_holds_a_vote_only_where_its_noise_is_small_enough():
    from privmtl.privacy import plan_vote
    from privmtl.privacy.selection import VOTE_SIGNAL

    held = plan_vote(10_000, epsilon=1.0, delta=1e-6, share=0.05)
    assert held.held and held.share == 0.05 and held.noise_std <= 10_000 / VOTE_SIGNAL
    vote = held.vote(6)
    assert vote.epsilon(1e-6) == pytest.approx(0.05, rel=1e-3)  # its own share of ε
    # the RDP calibration is never tighter than the exact Gaussian mechanism
    assert exact_gaussian_epsilon(1.0, held.noise_std, 1e-6) <= 0.05 + 1e-9
    assert held.event() == dpe.GaussianDpEvent(held.noise_std)
    small = plan_vote(100, epsilon=1.0, delta=1e-5, share=0.05)
    assert not small.held and small.event() is None and small.noise_std == 0
    exact = plan_vote(10, epsilon=None, delta=1e-5, share=0.05)
    assert exact.held and exact.noise_std == 0 and exact.event() is None
    with pytest.raises(InvalidParameterError, match="'share' parameter"):
        plan_vote(10, epsilon=1.0, delta=1e-5, share=1.5)
