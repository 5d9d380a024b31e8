"""Audits through the real releases: the broken builds are caught, the real ones are not.

Seeded noise (``noise="seeded"``) makes every audit here reproducible; the mutations are injected
into the library's own objects (see privmtl.audit.experiments). Claimed ε = 2 with small trial
counts keeps the tests fast while each mutation's bound stays above the claim.
"""

import json

import pytest

from privmtl.audit import run_audit
from privmtl.cli import main
from privmtl.exceptions import InvalidParameterError

CONTRACT = (
    "mechanism",
    "claimed_epsilon",
    "claimed_delta",
    "epsilon_lower_bound",
    "confidence",
    "trials",
    "violation",
    "seconds",
)
SIZES = {"gaussian-covariance": 4000, "pmtl-gaussian": 4000, "pmtl-run": 1000, "banded-mf": 4000}


def _audit(mechanism, mutation, epsilon=2.0):
    return run_audit(
        mechanism,
        epsilon=epsilon,
        trials=SIZES[mechanism],
        seed=1,
        noise="seeded",
        mutation=mutation,
    )


@pytest.mark.parametrize("mechanism", sorted(SIZES))
def test_real_build_is_not_flagged(mechanism):
    res = _audit(mechanism, "none")
    assert res["violation"] is False
    assert 0.0 <= res["epsilon_lower_bound"] < 2.0
    if mechanism == "pmtl-run":  # through the Trainer: its own ledger accounts the audited claim
        assert res["accounted_epsilon"] == pytest.approx(2.0, rel=1e-3)
        assert res["canaries"] == 1000 and res["guesses"] == 200
        assert res["clients"] > res["canaries"]


@pytest.mark.parametrize("mutation", ["weak-noise", "no-clip", "known-seed"])
@pytest.mark.parametrize("mechanism", sorted(SIZES))
def test_broken_builds_are_flagged(mechanism, mutation):
    res = _audit(mechanism, mutation)
    assert res["violation"] is True, res
    assert res["epsilon_lower_bound"] > 2.0
    assert res["mutation"] == mutation


def test_banded_mf_accounted_for_one_participation_is_flagged():
    """The bug of charging a cyclic client for one of its rounds: its noise is short by the
    square root of its participations, and the audit proves more than the claim."""
    res = _audit("banded-mf", "one-participation")
    assert res["violation"] is True and res["epsilon_lower_bound"] > 2.0
    assert res["noise_mechanism"] == "banded" and res["bands"] == 2


def test_banded_mf_real_build_holds_its_claim_at_epsilon_1():
    res = run_audit("banded-mf", epsilon=1.0, trials=40000, seed=2)  # secure noise
    assert res["violation"] is False and res["noise_source"] == "secure"


def test_a_mutation_of_one_mechanism_is_refused_for_the_others():
    with pytest.raises(InvalidParameterError, match=r"'mutation'.*'one-participation'.*banded-mf"):
        run_audit("pmtl-gaussian", epsilon=1.0, mutation="one-participation")


def test_wishart_violates_its_claim():
    # SPEC §4: D0 releases with w^T Sigma^-1 w >= 1 (probability 1 - e^-1) are impossible under D1
    res = run_audit("wishart", epsilon=1.0, trials=1000, seed=0, noise="seeded")
    assert res["violation"] is True
    assert res["false_negatives"] == 0  # D1 never fails the support test
    assert res["fpr"] == pytest.approx(0.368, abs=0.07)  # e^-1 of D0 releases remain possible


def test_nonprivate_mtl_is_distinguished_perfectly():
    res = run_audit("nonprivate-mtl", epsilon=1.0, trials=1000, seed=0)
    assert res["false_positives"] == res["false_negatives"] == 0
    assert res["epsilon_lower_bound"] > 4.0
    assert res["violation"] is True


def test_audit_refuses_bad_parameters():
    with pytest.raises(InvalidParameterError, match="mechanism"):
        run_audit("laplace", epsilon=1.0)
    with pytest.raises(InvalidParameterError, match="epsilon"):
        run_audit("wishart", epsilon=0.0)
    with pytest.raises(InvalidParameterError, match="trials"):
        run_audit("pmtl-run", epsilon=1.0, trials=5)


def test_cli_json_contract(capsys):
    code = main(["audit", "--mechanism", "wishart", "--epsilon", "1", "--trials", "400", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    res = json.loads(out)
    for key in CONTRACT:
        assert key in res
    assert res["mechanism"] == "wishart" and res["claimed_epsilon"] == 1.0
    assert res["claimed_delta"] == 1e-5 and res["trials"] == 400 and res["violation"] is True


def test_cli_error_is_one_line(capsys):
    code = main(["audit", "--mechanism", "pmtl-run", "--epsilon", "1", "--trials", "3"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("privmtl: error:") and err.count("\n") == 1
