"""The release gate both curators derive from: ids, replay policy, budget check, record."""

import math

import numpy as np
import pytest
import torch
from dp_accounting import dp_event as dpe

from privmtl.exceptions import PrivacyBudgetError
from privmtl.federated.protocol import Curator
from privmtl.linear.mpmtl import CovarianceCurator
from privmtl.privacy.covariance import plan_covariance_releases
from privmtl.privacy.curator import ReleaseCurator
from privmtl.privacy.ledger import PrivacyLedger
from privmtl.privacy.noise import SecureNoise, SeededNoise
from privmtl.privacy.release import GaussianMeanRelease
from privmtl.privacy.sampling import make_sampler

EVENT = dpe.PoissonSampledDpEvent(0.1, dpe.GaussianDpEvent(1.0))


class _Gate(ReleaseCurator):
    release_kind = "step"


def test_release_ids_name_the_curator_and_the_index():
    gate = _Gate(ledger=None, noise=SecureNoise(), name="run2:")
    assert gate.release_id_at(7) == "run2:step:7"
    sampler = make_sampler("poisson", 10, 2)
    mech = GaussianMeanRelease(clip=1.0, noise_std=0.5, sampler=sampler)
    cur = Curator(mech, {"w": torch.zeros(3)}, noise=SeededNoise(0), ledger=None, name="a:")
    assert isinstance(cur, ReleaseCurator) and cur.release_id() == "a:round:0"
    cur.name = "b:"  # Flower renames a curator after construction
    assert cur.release_id() == "b:round:0"
    sched = plan_covariance_releases(epsilon=1.0, delta=1e-4, iterations=3, clip=1.0, dim=4)
    cov = CovarianceCurator(
        sched,
        covariance="WWt",
        clip=1.0,
        noise=SecureNoise(),
        ledger=PrivacyLedger(delta=1e-4),
        eigen_fix="shift",
    )
    assert isinstance(cov, ReleaseCurator) and cov.release_id(2) == "covariance:2"


def test_seeded_repeats_are_replays_secure_repeats_are_new_releases():
    for noise, entries in ((SeededNoise(0), 1), (SecureNoise(), 2)):
        ledger = PrivacyLedger(delta=1e-5)
        gate = _Gate(ledger=ledger, noise=noise)
        first = gate.record(EVENT, release_id="step:0", round=0, mechanism="m")
        assert gate.is_replay("step:0") == (noise.kind == "seeded")
        again = gate.record(EVENT, release_id="step:0", round=0, mechanism="m")
        assert len(ledger.records) == entries
        assert (again == first) == (entries == 1)
        assert ledger.records[0]["release_id"] == "step:0"
        assert ledger.records[0]["mechanism"] == "m"


def test_the_budget_refuses_new_releases_but_not_replays():
    ledger = PrivacyLedger(delta=1e-5)
    seeded = _Gate(ledger=ledger, noise=SeededNoise(0))
    seeded.record(EVENT, release_id="step:0")
    ledger.budget = ledger.epsilon() * 1.01  # room for nothing more
    assert not seeded.would_exceed(EVENT, "step:0")  # a replay was charged when first made
    assert seeded.would_exceed(EVENT, "step:1")
    with pytest.raises(PrivacyBudgetError, match="budget"):
        seeded.record(EVENT, release_id="step:1")
    secure = _Gate(ledger=ledger, noise=SecureNoise())
    assert secure.would_exceed(EVENT, "step:0")  # fresh noise: a new release
    assert not secure.would_exceed(None, "step:1")  # not private


def test_record_without_event_or_ledger():
    gate = _Gate(ledger=None, noise=SeededNoise(0))
    assert gate.record(None, release_id="step:0") == math.inf
    assert math.isnan(gate.record(EVENT, release_id="step:0"))
    assert not gate.would_exceed(EVENT, "step:0")


def test_the_federated_curator_records_through_its_gate():
    sampler = make_sampler("poisson", 10, 2)
    mech = GaussianMeanRelease(clip=1.0, noise_std=0.5, sampler=sampler)
    ledger = PrivacyLedger(delta=1e-5)
    cur = Curator(mech, {"w": torch.zeros(3)}, noise=SeededNoise(0), ledger=ledger, name="x:")
    msgs = {"w": torch.as_tensor(np.ones((2, 3)), dtype=torch.float32)}
    out = cur.release(msgs)
    rec = ledger.records[0]
    assert rec["release_id"] == "x:round:0" and rec["mechanism"] == "gaussian-mean"
    assert rec["params"]["noise_std"] == 0.5
    assert out.epsilon == ledger.epsilon() and out.event == mech.event()


def test_a_stand_in_ledger_gets_the_event_and_round_only():
    seen = []

    class StandIn:
        def record(self, event, round=None):
            seen.append((event, round))
            return 0.25

    gate = _Gate(ledger=StandIn(), noise=SeededNoise(0))  # type: ignore[arg-type]
    assert gate.record(EVENT, release_id="step:4", round=4, mechanism="m") == 0.25
    assert seen == [(EVENT, 4)]
