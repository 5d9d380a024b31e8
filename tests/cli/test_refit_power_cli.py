"""``privmtl mpmtl --refit-power``: the power used in the JSON, the rule's default, bad values."""

import json

import pytest

from privmtl.cli import main

BASE = ["mpmtl", "--data", "synthetic-lowrank", "--method", "lowrank", "--no-tune",
        "--reproducible-noise", "--json"]  # fmt: skip


def _json(capsys, args):
    code = main(args)
    cap = capsys.readouterr()
    assert code == 0, cap.err
    return json.loads(cap.out)


def test_the_default_rule_and_the_power_before(capsys):
    """At ε = 10 on the synthetic tasks the rule takes power 1; --refit-power 0.5 is the refit of
    before: the same release and vote noise (same ε), the tasks' votes and the model differ."""
    auto = _json(capsys, [*BASE, "--epsilon", "10"])
    half = _json(capsys, [*BASE, "--epsilon", "10", "--refit-power", "0.5"])
    assert auto["refit_power"] == 1.0 and half["refit_power"] == 0.5
    assert auto["params"]["refit_power"] == "auto" and half["params"]["refit_power"] == 0.5
    assert auto["epsilon"] == half["epsilon"]
    a, h = auto["eigen_floor"], half["eigen_floor"]
    assert a["vote_noise_std"] == h["vote_noise_std"] and a["vote_epsilon"] == h["vote_epsilon"]
    # the same noise on both histograms: the counts differ by whole votes only
    diff = [x - y for x, y in zip(a["noisy_counts"], h["noisy_counts"], strict=True)]
    assert all(abs(v - round(v)) < 1e-9 for v in diff) and abs(sum(diff)) < 1e-9
    assert auto["nmse"] != half["nmse"]
    # at ε = 1 the release is too noisy for power 1: the rule gives the fit of before
    low = _json(capsys, [*BASE, "--epsilon", "1"])
    low_half = _json(capsys, [*BASE, "--epsilon", "1", "--refit-power", "0.5"])
    assert low["refit_power"] == 0.5 and low["nmse"] == low_half["nmse"]


@pytest.mark.parametrize("value", ["0", "-1", "best", "nan", "inf"])
def test_a_bad_power_exits_2_in_one_line(capsys, value):
    code = main([*BASE, "--epsilon", "1", "--refit-power", value])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--refit-power" in err and len(err.splitlines()) == 1
    assert "Traceback" not in err
