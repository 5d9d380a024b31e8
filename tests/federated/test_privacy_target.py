"""A target ε travels as one typed object, :class:`~privmtl.privacy.calibration.PrivacyTarget`,
from the run's settings to the release, which calibrates its σ to it and records it with its
first ledger record; σ never comes back up into the resolution (docs/CONTRACTS.md walks the
hops)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import privmtl
from privmtl.data.federated import make_synthetic_federated
from privmtl.federated.backend import release_noise, setup_run
from privmtl.federated.config import TrainConfig, resolve
from privmtl.federated.models import MultinomialLogReg
from privmtl.federated.spec import RunSpec
from privmtl.federated.trainer import Trainer
from privmtl.privacy.calibration import GivenNoise, PrivacyTarget, calibrate_release
from privmtl.privacy.sampling import make_sampler

PACKAGE = Path(privmtl.__file__).parent
#: The privacy layer's functions that turn a target ε into noise: only privacy/ calls them.
CALIBRATIONS = {
    "calibrate_release",
    "banded_noise_std",
    "calibrate_mean_noise_std",
    "calibrate_rounds_multiplier",
    "calibrate_noise_multiplier",
}


def _called_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            f = node.func
            names.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return names


@pytest.mark.parametrize("package", ["federated", "flower"])
def test_no_federated_module_turns_a_target_into_noise(package):
    # the release calibrates itself (privacy/release.py); the engine, its resolution and
    # Flower pass the PrivacyTarget down and never compute σ from ε themselves
    offenders = {
        str(p.relative_to(PACKAGE)): sorted(_called_names(p) & CALIBRATIONS)
        for p in sorted((PACKAGE / package).rglob("*.py"))
        if _called_names(p) & CALIBRATIONS
    }
    assert offenders == {}


def test_the_target_is_typed_and_serialized_with_its_type():
    t = PrivacyTarget(2.0, 1e-5, "pld", "replace-one", sampling="poisson")
    assert PrivacyTarget.from_dict(t.to_dict()) == t
    assert t.to_dict() == {
        "epsilon": 2.0, "delta": 1e-5, "accountant": "pld", "relation": "replace-one",
        "sampling": "poisson",
    }  # fmt: skip
    assert PrivacyTarget.from_dict({"epsilon": 1.0, "delta": 1e-6}) == PrivacyTarget(1.0, 1e-6)
    with pytest.raises(ValueError, match="accountant"):
        PrivacyTarget(1.0, 1e-5, accountant="moments")
    assert GivenNoise(0.3).to_dict() == {"noise_std": 0.3}


def test_resolution_passes_the_target_down_and_computes_no_noise():
    run = resolve(RunSpec(rounds=4, epsilon=2.0, accountant="pld"), 30)
    assert run.config.noise_std == 0.0  # σ is the release's, not the resolution's
    assert run.target == PrivacyTarget(
        2.0, run.config.delta, "pld", run.config.relation, sampling=run.config.sampling
    )
    assert run.privacy is run.target
    given = resolve(RunSpec(rounds=4, noise_std=0.3), 30)
    assert given.target is None and given.privacy == GivenNoise(0.3)


def test_the_release_calibrates_itself_to_the_target_as_the_privacy_layer_does():
    run = resolve(TrainConfig(rounds=4, epsilon=2.0, clients_per_round=6), 30)
    setup = setup_run(run, 30, {})
    mech = setup.release
    sampler = make_sampler(run.config.sampling, 30, 6)
    cal = calibrate_release(run.target, sampler, rounds=4, clip=run.config.clip, divisor=6)
    assert mech.target == run.target and mech.noise_std == cal.noise_std  # bit for bit
    assert setup.config.noise_std == cal.noise_std == release_noise(run, 30)


def test_the_first_ledger_record_carries_the_target_and_its_sigma():
    data = make_synthetic_federated(
        n_clients=12, n_features=4, n_classes=3, samples_per_client=(10, 20), random_state=0
    )
    cfg = TrainConfig(
        rounds=3, clients_per_round=6, epsilon=2.0, lam=0.01, noise_source="seeded",
        progress=False, threads=1,
    )  # fmt: skip
    model = MultinomialLogReg(data.n_features, data.n_classes, random_state=0)
    trainer = Trainer(data, model, cfg)
    result = trainer.run()
    records = trainer.ledger.records
    target = trainer.curator.release_mechanism.target
    assert records[0]["params"]["target"] == target.to_dict()
    assert target.epsilon == 2.0 and target.sampling == "poisson"
    assert records[0]["params"]["noise_std"] == result.config.noise_std > 0
    assert all("target" not in r["params"] for r in records[1:])  # once, with the first
    assert trainer.ledger.target_epsilon == 2.0
