"""The local baseline of every result: each client's own training beside its final model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privmtl.experiments.pmtl import run_pmtl
from privmtl.federated import baseline as baseline_module
from privmtl.federated.baseline import baseline_sample, describe_gain
from privmtl.gain import gain_interval

SMALL = dict(
    data="synthetic", num_clients=12, model="logreg", rounds=3, clients_per_round=6,
    epsilon=2.0, noise_source="seeded", seed=0, show_progress=False, threads=1,
)  # fmt: skip


def test_gain_interval_is_the_ratio_estimator_over_clients():
    final = np.array([8.0, 5.0, 9.0, 0.0])
    local = np.array([6.0, 5.0, 7.0, 0.0])
    n = np.array([10, 10, 10, 0])  # a client without test data does not count
    gain, (low, high) = gain_interval(final, local, n)
    assert gain == pytest.approx(4 / 30)
    d = np.array([2.0, 0.0, 2.0]) - 4 / 30 * 10  # residuals of the three clients with data
    se = math.sqrt(3 / 2 * float((d**2).sum())) / 30
    assert (low, high) == pytest.approx((4 / 30 - 1.959963985 * se, 4 / 30 + 1.959963985 * se))
    same, (lo, hi) = gain_interval(final, final, n)
    assert same == 0.0 and lo == hi == 0.0


def test_the_sample_is_every_client_up_to_its_size_else_a_seeded_uniform_draw():
    assert np.array_equal(baseline_sample(50, seed=3, size=50), np.arange(50))
    a, b = baseline_sample(1000, seed=3, size=40), baseline_sample(1000, seed=3, size=40)
    assert np.array_equal(a, b) and len(np.unique(a)) == 40 and np.all(np.diff(a) > 0)
    assert not np.array_equal(a, baseline_sample(1000, seed=4, size=40))


def test_the_baseline_is_local_all_whatever_path_computes_it(monkeypatch):
    """The end of run's local candidate (reused), local training for the baseline alone
    (--finetune none) and --method local-all give the same local accuracy."""
    auto = run_pmtl(**SMALL)
    none = run_pmtl(**SMALL, finetune="none")
    alone = run_pmtl(**{**SMALL, "method": "local-all"})
    assert auto["local_test_accuracy"] == none["local_test_accuracy"] == alone["test_accuracy"]
    assert alone["gain_over_local"] == 0.0
    for out in (auto, none):
        low, high = out["gain_interval"]
        assert low <= out["gain_over_local"] <= high
        assert out["baseline_clients"] == 12
        pooled_gain = out["test_accuracy"] - out["local_test_accuracy"]
        assert out["gain_over_local"] == pytest.approx(pooled_gain, abs=1e-12)
    # above the sample's size, the baseline is an estimate over a uniform sample
    monkeypatch.setattr(baseline_module, "LOCAL_BASELINE_CLIENTS", 5)
    monkeypatch.setattr(
        baseline_module, "baseline_sample", lambda m, seed, size=5: baseline_sample(m, seed, size)
    )
    sampled = run_pmtl(**SMALL, finetune="none")
    assert sampled["baseline_clients"] == 5 and "sample of 5 of the 12" in sampled["baseline"]


def test_no_baseline_when_asked_not_to():
    out = run_pmtl(**SMALL, finetune="none", baseline=False)
    assert "local_test_accuracy" not in out and describe_gain(out) is None


def test_the_human_line_says_plainly_whether_collaboration_helped():
    out = {"local_test_accuracy": 0.6, "gain_over_local": 0.05, "gain_interval": [0.01, 0.09]}
    assert describe_gain(out).endswith("collaboration helped")
    out["gain_interval"] = [-0.01, 0.09]
    assert "no clear gain" in describe_gain(out)
    out.update(gain_over_local=-0.05, gain_interval=[-0.09, -0.01])
    assert "collaboration hurt" in describe_gain(out)
