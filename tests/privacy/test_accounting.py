import json
import math

import dp_accounting
import pytest

from privmtl.exceptions import InvalidParameterError, PrivacyBudgetError
from privmtl.privacy import (
    PrivacyLedger,
    calibrate_noise_multiplier,
    compute_epsilon,
    event_from_dict,
    event_to_dict,
    make_sampler,
)

DELTA = 1e-5


def test_agrees_with_dp_accounting_directly():
    ev = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(1.3)), 50
    )
    pld = dp_accounting.pld.PLDAccountant()
    pld.compose(ev)
    assert compute_epsilon(ev, delta=DELTA, accountant="pld") == pytest.approx(
        pld.get_epsilon(DELTA), rel=1e-9
    )
    rdp = dp_accounting.rdp.RdpAccountant()  # default orders (incl. fractional)
    rdp.compose(ev)
    ours = compute_epsilon(ev, delta=DELTA, accountant="rdp")
    # our integer orders can only be slightly looser than dp-accounting's default grid
    assert rdp.get_epsilon(DELTA) * 0.97 <= ours <= rdp.get_epsilon(DELTA) * 1.05


def test_replace_one_gaussian_doubles_sensitivity_in_rdp_and_pld():
    z, T = 4.0, 10
    ev = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), T)
    half = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z / 2), T)
    for acc in ("rdp", "pld"):
        rep = compute_epsilon(ev, delta=DELTA, accountant=acc, relation="replace-one")
        ar_half = compute_epsilon(half, delta=DELTA, accountant=acc, relation="add-remove")
        assert rep == pytest.approx(ar_half, rel=2e-3)
        assert rep > compute_epsilon(ev, delta=DELTA, accountant=acc)


def test_unsupported_combinations_raise_clear_errors():
    poisson = make_sampler("poisson", 100, 10).event(1.0)
    fixed = make_sampler("fixed", 100, 10).event(1.0)
    with pytest.raises(InvalidParameterError, match="replace-one"):
        compute_epsilon(poisson, delta=DELTA, accountant="rdp", relation="replace-one")
    with pytest.raises(InvalidParameterError, match="Fixed-size"):
        compute_epsilon(fixed, delta=DELTA, accountant="rdp", relation="add-remove")
    with pytest.raises(InvalidParameterError, match="Fixed-size"):
        compute_epsilon(fixed, delta=DELTA, accountant="pld", relation="replace-one")
    # supported: fixed-size + replace-one + rdp; poisson + replace-one + pld
    assert math.isfinite(compute_epsilon(fixed, delta=DELTA, relation="replace-one"))
    assert math.isfinite(
        compute_epsilon(poisson, delta=DELTA, accountant="pld", relation="replace-one")
    )


@pytest.mark.parametrize(
    ("kind", "accountant", "relation"),
    [
        ("poisson", "rdp", "add-remove"),
        ("poisson", "pld", "add-remove"),
        ("fixed", "rdp", "replace-one"),
    ],
)
def test_calibration_round_trip(kind, accountant, relation):
    """Calibrate σ for ε = 1, account it back: ε ∈ [0.97, 1.0]."""
    sampler = make_sampler(kind, 100, 20)

    def ev(z):
        return dp_accounting.SelfComposedDpEvent(sampler.event(z), 100)

    z = calibrate_noise_multiplier(
        ev, target_epsilon=1.0, delta=DELTA, accountant=accountant, relation=relation
    )
    eps = compute_epsilon(ev(z), delta=DELTA, accountant=accountant, relation=relation)
    assert 0.97 <= eps <= 1.0


def test_event_serialization_round_trip():
    ev = dp_accounting.ComposedDpEvent(
        [
            dp_accounting.SelfComposedDpEvent(make_sampler("poisson", 50, 5).event(2.0), 3),
            make_sampler("fixed", 50, 5).event(1.5),
            dp_accounting.GaussianDpEvent(0.7),
        ]
    )
    back = event_from_dict(json.loads(json.dumps(event_to_dict(ev))))
    assert back == ev


def test_ledger_history_resume_and_budget():
    sampler = make_sampler("poisson", 100, 10)
    ledger = PrivacyLedger(delta=DELTA, budget=10.0)
    for t in range(5):
        ledger.record(sampler.event(1.0), round=t)
    assert len(ledger.history) == 5
    assert all(a < b for a, b in zip(ledger.history, ledger.history[1:], strict=False))
    # the ledger equals one-shot accounting of the composed event
    total = compute_epsilon(dp_accounting.SelfComposedDpEvent(sampler.event(1.0), 5), delta=DELTA)
    assert ledger.epsilon() == pytest.approx(total, rel=1e-9)
    # checkpoint/resume: JSON round trip continues identically
    resumed = PrivacyLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))
    a = ledger.record(sampler.event(1.0), round=5)
    b = resumed.record(sampler.event(1.0), round=5)
    assert a == pytest.approx(b, rel=1e-12)
    # a release that would exceed the budget is refused before it is recorded
    big = dp_accounting.SelfComposedDpEvent(sampler.event(0.5), 1000)
    n = len(ledger.records)
    with pytest.raises(PrivacyBudgetError, match="budget"):
        ledger.record(big)
    assert len(ledger.records) == n


def test_cached_rdp_accountant_equals_dp_accounting_over_mixed_sequences():
    """The ledger's RDP accountant caches each event's RDP increment; composing must not change."""
    import dp_accounting
    from dp_accounting import dp_event as dpe

    from privmtl.privacy.accounting import adapt_event, make_accountant

    events = [
        dpe.PoissonSampledDpEvent(0.2, dpe.GaussianDpEvent(1.3)),
        dpe.GaussianDpEvent(4.0),
        dpe.PoissonSampledDpEvent(0.2, dpe.GaussianDpEvent(1.3)),
        dpe.SelfComposedDpEvent(dpe.GaussianDpEvent(2.0), 3),
        dpe.PoissonSampledDpEvent(0.05, dpe.GaussianDpEvent(0.9)),
    ] * 3
    ours = make_accountant("rdp", "add-remove")
    plain = dp_accounting.rdp.RdpAccountant(orders=list(ours._orders))
    for i, e in enumerate(events):
        ours.compose(e, count=1 + i % 2)
        plain.compose(e, count=1 + i % 2)
        assert ours.get_epsilon(1e-5) == pytest.approx(plain.get_epsilon(1e-5), rel=1e-12)
    fixed = adapt_event(
        dpe.SampledWithoutReplacementDpEvent(100, 10, dpe.GaussianDpEvent(1.5)),
        accountant="rdp",
        relation="replace-one",
    )
    rel = dp_accounting.privacy_accountant.NeighboringRelation.REPLACE_ONE
    ours = make_accountant("rdp", "replace-one")
    plain = dp_accounting.rdp.RdpAccountant(orders=list(ours._orders), neighboring_relation=rel)
    for _ in range(4):
        ours.compose(fixed)
        plain.compose(fixed)
    assert ours.get_epsilon(1e-5) == pytest.approx(plain.get_epsilon(1e-5), rel=1e-12)
    ours.compose(dpe.NonPrivateDpEvent())
    assert ours.get_epsilon(1e-5) == float("inf")
