"""The low-rank refit's eigenvalue floor and the tasks' recorded vote that chooses it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event as dpe
from dp_accounting.rdp import RdpAccountant
from lowrank_tasks import lowrank_tasks

from privmtl.exceptions import InvalidParameterError
from privmtl.linear.eigen_floor import (
    FLOOR_GRID,
    FLOOR_VOTE_ID,
    VOTE_SHARE,
    estimation_noise_edge,
    floored_shift,
    median_winner,
)
from privmtl.linear.mpmtl import MPMTLGroupSparse, MPMTLLowRank
from privmtl.linear.options import MPMTLExecution, MPMTLRefit
from privmtl.privacy.covariance import plan_covariance_releases, reserve_share
from privmtl.privacy.selection import VOTE_MECHANISM


def _fit(eps, floor="vote", **kw):
    Xs, ys = lowrank_tasks()
    return MPMTLLowRank(
        epsilon=eps,
        random_state=0,
        noise_source="seeded",
        **kw,
        refit=MPMTLRefit(eigen_floor=floor),
    ).fit(Xs, ys)


#: The RDP orders privmtl's accountant evaluates (integers 2..64, then sparse up to 1024).
ORDERS = [float(a) for a in range(2, 65)] + [80.0, 96.0, 128.0, 192.0, 256.0, 512.0, 1024.0]


def _oracle_rdp_epsilon(multipliers, delta):
    """ε of independent Gaussian mechanisms (add/remove), composed by dp-accounting's RDP."""
    acc = RdpAccountant(orders=ORDERS)
    for z in multipliers:
        acc.compose(dpe.GaussianDpEvent(z))
    return acc.get_epsilon(delta)


def _exact_gaussian_epsilon(multipliers, delta):
    """The tight ε of the composed Gaussians: one Gaussian of the summed precision (analytic
    Gaussian mechanism, Balle & Wang 2018), by bisection on δ(ε)."""
    from scipy.stats import norm

    z = float(np.sum(np.asarray(multipliers) ** -2.0)) ** -0.5

    def dlt(e):
        return norm.cdf(-e * z + 0.5 / z) - math.exp(e) * norm.cdf(-e * z - 0.5 / z)

    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if dlt(mid) <= delta else (mid, hi)
    return hi


def test_the_vote_is_charged_and_the_total_is_the_target():
    """The ledger holds the covariance release and the vote; an independent composition of the
    two Gaussian mechanisms (their σ over their sensitivities, read from the ledger) gives the
    reported ε, which is the user's target: the vote's share came out of the release's."""
    est = _fit(10.0)
    floor = est.eigen_floor_
    assert floor["mode"] == "vote"
    recs = est.ledger_.records
    assert [r["mechanism"] for r in recs] == ["gaussian-covariance", VOTE_MECHANISM]
    assert recs[1]["release_id"] == FLOOR_VOTE_ID
    cov, vote = recs[0]["params"], recs[1]["params"]
    z_cov = cov["noise_std"] / cov["sensitivity"]
    z_vote = vote["noise_std"] / vote["sensitivity"]
    oracle = _oracle_rdp_epsilon([z_cov, z_vote], est.delta_)
    assert est.privacy_.epsilon == pytest.approx(oracle, rel=1e-6)
    # never below the tight ε of the two mechanisms; the vote is charged (without it: less)
    tight = _exact_gaussian_epsilon([z_cov, z_vote], est.delta_)
    assert tight <= est.privacy_.epsilon
    assert _exact_gaussian_epsilon([z_cov], est.delta_) < tight
    assert 0.999 * 10.0 <= est.privacy_.epsilon <= 10.0 * (1 + 1e-9)
    # the vote holds VOTE_SHARE of the precision; the release the rest
    prec_cov, prec_vote = z_cov**-2, z_vote**-2
    assert prec_vote / (prec_cov + prec_vote) == pytest.approx(VOTE_SHARE, rel=1e-9)
    # the release without a vote has the whole precision: its σ is √(1 - share) of the vote run's
    full = _fit(10.0, floor=0.0)
    z_full = full.ledger_.records[0]["params"]["noise_multiplier"]
    assert z_cov == pytest.approx(z_full / math.sqrt(1 - VOTE_SHARE), rel=1e-9)
    assert floor["vote_epsilon"] == pytest.approx(_oracle_rdp_epsilon([z_vote], est.delta_))
    assert est.privacy_.details["releases"] == 1
    assert any("recorded vote" in n for n in est.privacy_.notes)


def test_the_vote_reports_the_grid_the_winner_and_the_counts():
    est = _fit(10.0)
    f = est.eigen_floor_
    assert f["grid"] == list(FLOOR_GRID)
    assert f["floor"] in f["candidates"] and set(f["candidates"]) <= set(FLOOR_GRID)
    assert len(f["noisy_counts"]) == len(f["candidates"]) >= 2
    winner = f["candidates"].index(f["floor"])
    assert f["rule"] == "median" and median_winner(f["noisy_counts"]) == winner
    edge = estimation_noise_edge(1.0, 40, 6)
    assert f["edge"] == pytest.approx(edge)
    assert f["cut"] == pytest.approx(max(f["privacy_cut"], f["floor"] * edge))
    # the candidates are distinct cuts of the same release
    assert len(set(f["candidate_cuts"])) == len(f["candidate_cuts"])


def test_where_the_vote_cannot_matter_nothing_is_spent_and_today_s_fit_stays():
    """At small ε every floor of the grid is under the privacy cut: no vote, the whole budget on
    the release, the same model as the fixed default floor (τ = 0), bit for bit."""
    est = _fit(0.3)
    assert est.eigen_floor_["mode"] == "fixed" and est.eigen_floor_["vote_epsilon"] == 0.0
    assert "coincide" in est.eigen_floor_["reason"]
    assert [r["mechanism"] for r in est.ledger_.records] == ["gaussian-covariance"]
    base = _fit(0.3, floor=0.0)
    np.testing.assert_array_equal(est.coef_, base.coef_)
    assert est.privacy_.epsilon == base.privacy_.epsilon


def test_a_vote_without_signal_is_not_held():
    """Few tasks: the vote's noise std would exceed m / 4, so nothing is spent on it."""
    Xs, ys = lowrank_tasks(m=8)
    est = MPMTLLowRank(
        epsilon=3.0, random_state=0, noise_source="seeded", refit=MPMTLRefit(eigen_floor="vote")
    ).fit(Xs, ys)
    assert est.eigen_floor_["mode"] == "fixed"
    assert "could not carry signal" in est.eigen_floor_["reason"]
    assert len(est.ledger_.records) == 1


def test_a_fixed_floor_cuts_at_the_larger_of_the_two():
    est = _fit(10.0, floor=2.0)
    f = est.eigen_floor_
    assert f["mode"] == "fixed" and f["floor"] == 2.0
    assert f["cut"] == pytest.approx(max(f["privacy_cut"], 2.0 * f["edge"]))
    assert len(est.ledger_.records) == 1


def test_the_median_of_an_ordered_histogram():
    """A plurality would elect τ = 0 here; most tasks want a floor: the median is the next."""
    assert median_winner([48.4, 43.3, 41.0]) == 1
    assert median_winner([27.7, 32.4, 77.9]) == 2
    assert median_winner([64.9, 59.2]) == 0
    assert median_winner([-3.0, 10.0, -1.0]) == 1
    assert median_winner([-1.0, -2.0]) == 0


def test_floored_shift():
    assert floored_shift(-3.0, 0.0) == -3.0 and floored_shift(None, 0.0) is None
    assert floored_shift(-3.0, 5.0) == -5.0 and floored_shift(-7.0, 5.0) == -7.0
    assert floored_shift(None, 5.0) == -5.0 and floored_shift(0.0, 2.0) == -2.0


def test_a_non_private_run_takes_the_exact_vote():
    est = _fit(None)
    assert est.eigen_floor_["mode"] == "vote" and est.eigen_floor_["vote_noise_std"] == 0.0
    assert est.eigen_floor_["noisy_counts"] == [
        float(int(c)) for c in est.eigen_floor_["noisy_counts"]
    ]
    assert sum(est.eigen_floor_["noisy_counts"]) == 40


def test_a_seeded_resume_replays_the_vote_without_charging_it(tmp_path):
    a = _fit(10.0, execution=MPMTLExecution(checkpoint_dir=tmp_path / "run"))
    b = _fit(10.0, execution=MPMTLExecution(checkpoint_dir=tmp_path / "run", resume=True))
    np.testing.assert_array_equal(a.coef_, b.coef_)
    assert b.privacy_.epsilon == a.privacy_.epsilon
    assert len(b.ledger_.records) == 2


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"eigen_floor": -1.0}, "eigen_floor"),
        ({"eigen_floor": "best"}, "eigen_floor"),
        ({"eigen_floor": 1.0, "refit_lam": None}, "eigen_floor"),
        ({"eigen_floor": 1.0, "eigen_fix": "shift"}, "eigen_floor"),
        ({"floor_grid": []}, "floor_grid"),
        ({"floor_grid": [0.0, -1.0]}, "floor_grid"),
        ({"floor_grid": [1.0, 0.5]}, "floor_grid"),
        ({"vote_share": 1.0}, "vote_share"),
        ({"vote_share": 0.0}, "vote_share"),
    ],
)
def test_bad_floor_settings_name_the_parameter(kw, match):
    Xs, ys = lowrank_tasks(m=5)
    with pytest.raises(InvalidParameterError, match=match):
        MPMTLLowRank(epsilon=1.0, **kw).fit(Xs, ys)


def test_group_sparse_default_has_no_floor():
    Xs, ys = lowrank_tasks(m=10)
    est = MPMTLGroupSparse(
        epsilon=10.0, random_state=0, noise_source="seeded", refit=MPMTLRefit(eigen_floor="vote")
    ).fit(Xs, ys)
    assert est.eigen_floor_ is None and len(est.ledger_.records) == 1


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
@pytest.mark.parametrize("relation", ["add-remove", "replace-one"])
def test_reserve_share_keeps_the_planned_epsilon(accountant, relation):
    from privmtl.privacy.accounting import compute_epsilon

    plan = plan_covariance_releases(
        epsilon=2.0, delta=1e-5, iterations=3, clip=1.0, dim=4,
        accountant=accountant, relation=relation, alpha=0.4,
    )  # fmt: skip
    reserved, z_vote = reserve_share(plan, 0.2)
    events = [reserved.event(t) for t in range(3)] + [dpe.GaussianDpEvent(z_vote)]
    both = compute_epsilon(
        dpe.ComposedDpEvent(events), delta=1e-5, accountant=accountant, relation=relation
    )
    assert both == pytest.approx(plan.guarantee.epsilon, rel=2e-3)
    assert both <= 2.0 * (1 + 2e-3)
    assert reserved.guarantee.epsilon < plan.guarantee.epsilon
    z = np.asarray(plan.guarantee.details["noise_multipliers"])
    np.testing.assert_allclose(reserved.per_release, np.asarray(plan.per_release) / math.sqrt(0.8))
    assert z_vote**-2 == pytest.approx(0.2 * float(np.sum(z**-2.0)))
