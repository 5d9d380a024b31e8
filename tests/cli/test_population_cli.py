"""``privmtl pmtl --num-clients`` (population study), server optimizer and partial sharing flags."""

import json

import pytest

from privmtl.cli import main


def _run(capsys, args):
    code = main(args)
    cap = capsys.readouterr()
    return code, cap


def test_num_clients_builds_the_synthetic_population(capsys):
    code, cap = _run(
        capsys,
        ["pmtl", "--data", "synthetic", "--num-clients", "37", "--model", "logreg",
         "--rounds", "2", "--clients-per-round", "5", "--epsilon", "2", "--server-update",
         "offset", "--server-optimizer", "momentum", "--server-lr", "0.5",
         "--shared-params", "linear.weight", "--reproducible-noise", "--json"],
    )  # fmt: skip
    assert code == 0, cap.err
    out = json.loads(cap.out)
    assert out["num_clients"] == 37
    assert out["epsilon"] == pytest.approx(2.0, rel=1e-3)
    assert out["server_optimizer"] == "momentum" and out["shared_params"] == ["linear.weight"]
    assert out["delta"] == pytest.approx(1 / 37)  # the default δ = 1/m of that population


def test_num_clients_is_refused_for_femnist(capsys, tmp_path):
    code, cap = _run(
        capsys,
        ["pmtl", "--data", "femnist-leaf", "--data-path", str(tmp_path), "--num-clients", "5",
         "--model", "logreg", "--rounds", "1"],
    )  # fmt: skip
    assert code == 2
    assert cap.err.startswith("privmtl: error:") and "num_clients" in cap.err


def test_unknown_shared_params_exit_2(capsys):
    code, cap = _run(
        capsys,
        ["pmtl", "--data", "synthetic", "--num-clients", "10", "--model", "logreg",
         "--rounds", "1", "--clients-per-round", "5", "--shared-params", "conv1"],
    )  # fmt: skip
    assert code == 2 and "shared_params" in cap.err
