"""ε → σ calibration lives in privmtl.privacy.calibration; every entry point gets its σ there."""

import math

import dp_accounting
import numpy as np
import pytest
from engine_defaults import old_config

from privmtl.experiments.accounting import account_rounds
from privmtl.federated.baselines import config_for_epsilon
from privmtl.federated.config import TrainConfig
from privmtl.privacy.accounting import compute_epsilon
from privmtl.privacy.calibration import (
    calibrate_covariance_noise,
    calibrate_mean_noise_std,
    calibrate_rounds_multiplier,
    covariance_sensitivity,
    rounds_epsilon,
    rounds_event,
)
from privmtl.privacy.covariance import plan_covariance_releases
from privmtl.privacy.sampling import make_sampler

DELTA = 1e-5


def test_mean_noise_std_meets_the_target_by_an_independent_accounting():
    sampler = make_sampler("poisson", 100, 10)
    sigma = calibrate_mean_noise_std(
        sampler, rounds=20, clip=0.5, divisor=10, target_epsilon=2.0, delta=DELTA
    )
    z = sigma * 10 / 0.5  # the mean of 10 messages clipped to 0.5 has sensitivity 0.05
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(z)), 20
    )
    eps = compute_epsilon(event, delta=DELTA)
    assert eps <= 2.0
    assert eps == pytest.approx(2.0, rel=1e-3)  # the smallest σ that meets it, not any σ
    assert rounds_epsilon(sampler, z, 20, delta=DELTA) == pytest.approx(eps, rel=1e-12)
    assert rounds_event(sampler, z, 20) == event


def test_every_entry_point_takes_its_sigma_from_the_one_calibration():
    m, q, rounds, clip = 40, 5, 7, 0.7
    sampler = make_sampler("poisson", m, q)
    expected = calibrate_mean_noise_std(
        sampler, rounds=rounds, clip=clip, divisor=q, target_epsilon=1.5, delta=DELTA
    )
    cfg = old_config(rounds=rounds, clip=clip, clients_per_round=q, delta=DELTA)
    assert config_for_epsilon(cfg, m, 1.5).noise_std == expected
    out = account_rounds(
        clip=clip,
        num_clients=m,
        clients_per_round=q,
        rounds=rounds,
        delta=DELTA,
        target_epsilon=1.5,
    )
    assert out["noise_std"] == expected


def test_adaptive_clipping_spends_the_target_on_mean_and_count_jointly():
    sampler = make_sampler("poisson", 40, 5)
    sigma_b = 3.0
    z = calibrate_rounds_multiplier(
        sampler, rounds=7, target_epsilon=1.5, delta=DELTA, count_noise_std=sigma_b
    )
    joint = (z**-2 + (2 * sigma_b) ** -2) ** -0.5
    assert rounds_epsilon(sampler, joint, 7, delta=DELTA) == pytest.approx(1.5, rel=1e-3)
    alone = calibrate_rounds_multiplier(sampler, rounds=7, target_epsilon=1.5, delta=DELTA)
    assert z > alone  # the count takes part of the budget: the mean needs more noise


@pytest.mark.parametrize("relation", ["add-remove", "replace-one"])
def test_covariance_noise_is_the_multiplier_times_the_sensitivity(relation):
    inv = np.array([1.0, 0.5, 0.25])
    cal = calibrate_covariance_noise(
        inv, clip=1.3, target_epsilon=1.0, delta=1e-4, relation=relation
    )
    k2 = 1.3**2
    assert cal.sensitivity == pytest.approx(k2 * (math.sqrt(2) if relation == "replace-one" else 1))
    # event multipliers are relative to the add/remove sensitivity; the accountant doubles it
    # under replace-one, so the √2·K² replace-one sensitivity enters the event as √2·K²/2
    event_sensitivity = k2 if relation == "add-remove" else math.sqrt(2) * k2 / 2
    np.testing.assert_allclose(cal.stds, np.array(cal.multipliers) * event_sensitivity, rtol=1e-12)
    np.testing.assert_allclose(np.array(cal.multipliers) / cal.multipliers[0], inv / inv[0])
    event = dp_accounting.ComposedDpEvent(
        [dp_accounting.GaussianDpEvent(z) for z in cal.multipliers]
    )
    eps = compute_epsilon(event, delta=1e-4, relation=relation)
    assert eps <= 1.0 and eps == pytest.approx(1.0, rel=1e-3)
    assert cal.epsilon == pytest.approx(eps, rel=1e-12)
    plan = plan_covariance_releases(
        epsilon=1.0,
        delta=1e-4,
        iterations=3,
        clip=1.3,
        dim=4,
        relation=relation,
        alpha=1.0,
    )
    assert plan.guarantee.details["sensitivity"] == covariance_sensitivity(1.3, relation)


def test_calibrated_noise_is_bit_for_bit_what_it_was_before_the_one_module():
    """Values computed by the separate calibrations this module replaced (same dp-accounting)."""
    cfg = old_config(rounds=7, clip=0.7, clients_per_round=5)
    assert config_for_epsilon(cfg, 40, 1.5).noise_std == 0.22437362003111322
    adaptive = old_config(
        rounds=7, clip=0.7, clients_per_round=5, adaptive_clip_quantile=0.5, adaptive_clip_noise=3.0
    )
    assert config_for_epsilon(adaptive, 40, 1.5).noise_std == 0.23283347455824335
    out = account_rounds(
        clip=1.0, num_clients=100, clients_per_round=10, rounds=20, delta=1e-5, target_epsilon=2.0
    )
    assert (out["noise_std"], out["epsilon"]) == (0.1485728274719399, 2.0)
    for relation, stds in (
        ("add-remove", (22.96510887190275, 16.238784214009776, 13.258911789162118)),
        ("replace-one", (32.477568425917376, 22.965108870416277, 18.750932873327887)),
    ):
        plan = plan_covariance_releases(
            epsilon=1.0, delta=1e-4, iterations=5, clip=1.3, dim=4, relation=relation, alpha=0.5
        )
        assert plan.per_release[:3] == stds


# ------------------------------------------------------------ ε carried to the release
def test_calibrate_release_is_the_one_calibration():
    from privmtl.privacy.calibration import PrivacyTarget, ReleaseCalibration, calibrate_release
    from privmtl.privacy.sampling import make_sampler

    sampler = make_sampler("poisson", 40, 8)
    target = PrivacyTarget(2.0, 1e-5)
    cal = calibrate_release(target, sampler, rounds=30, clip=0.5, divisor=8)
    assert isinstance(cal, ReleaseCalibration) and cal.target == target
    assert cal.noise_std == cal.multiplier * 0.5 / 8
    assert cal.epsilon <= 2.0 and cal.epsilon > 1.9  # tight, never above the target
    assert cal.epsilon == compute_epsilon(cal.event, delta=1e-5)
    # its σ is the σ of every entry point: privmtl account and config_for_epsilon
    acc = account_rounds(
        clip=0.5, num_clients=40, clients_per_round=8, rounds=30, delta=1e-5, target_epsilon=2.0
    )
    assert acc["noise_std"] == cal.noise_std and acc["epsilon"] == cal.epsilon
    cfg = config_for_epsilon(
        TrainConfig(rounds=30, clients_per_round=8, clip=0.5, progress=False), 40, 2.0
    )
    assert cfg.noise_std == cal.noise_std and cfg.epsilon == 2.0 and cfg.delta == 1e-5
    assert cal.to_dict()["target_epsilon"] == 2.0


def test_privacy_target_refuses_bad_values():
    from privmtl.exceptions import InvalidParameterError
    from privmtl.privacy.calibration import PrivacyTarget, calibrate_release

    with pytest.raises(InvalidParameterError, match=r"'target_epsilon'.*got -1"):
        PrivacyTarget(-1.0, 1e-5)
    with pytest.raises(InvalidParameterError, match="at most 100"):
        PrivacyTarget(1000.0, 1e-5)
    with pytest.raises(InvalidParameterError, match="'delta'"):
        PrivacyTarget(1.0, 1.5)
    with pytest.raises(InvalidParameterError, match=r"'target'.*PrivacyTarget; got float"):
        calibrate_release(2.0, None, rounds=1, clip=1.0, divisor=1.0)  # type: ignore[arg-type]


def test_a_target_in_the_config_is_calibrated_when_the_run_starts_and_recorded(tmp_path):
    import json

    from privmtl.data.federated import make_synthetic_federated
    from privmtl.federated import MultinomialLogReg, train
    from privmtl.federated.protocol import Trainer
    from privmtl.privacy.ledger import PrivacyLedger

    data = make_synthetic_federated(n_clients=10, random_state=0)
    model = MultinomialLogReg(data.n_features, data.n_classes)
    cfg = TrainConfig(rounds=3, epsilon=3.0, noise_source="seeded", progress=False, threads=1)
    res = train(data, model, cfg)
    calibrated = config_for_epsilon(TrainConfig(rounds=3, progress=False, threads=1), 10, 3.0)
    assert res.config.noise_std == calibrated.noise_std > 0
    assert res.config.epsilon == 3.0 and res.epsilon <= 3.0
    assert res.ledger.target_epsilon == 3.0
    # the durable ledger's header records the target with the run; it round-trips
    trainer = Trainer(data, model, cfg, checkpoint_dir=tmp_path / "ckpt")
    trainer.run()
    header = json.loads((tmp_path / "ckpt" / "ledger.jsonl").read_text().splitlines()[0])
    assert header["target_epsilon"] == 3.0 and header["delta"] == res.delta
    state = trainer.ledger.to_dict()
    assert PrivacyLedger.from_dict(state).target_epsilon == 3.0
    # without a target, the ledger's format is what it was
    plain = PrivacyLedger(delta=1e-5)
    assert "target_epsilon" not in plain.to_dict()
