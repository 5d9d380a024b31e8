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
         "--shared-params", "linear.weight", "--reproducible-noise", "--finetune", "none",
         "--json"],
    )  # fmt: skip
    assert code == 0, cap.err
    out = json.loads(cap.out)
    assert out["num_clients"] == 37
    assert out["epsilon"] == pytest.approx(2.0, rel=1e-3)
    assert out["server_optimizer"] == "momentum" and out["shared_params"] == ["linear.weight"]
    # the default δ = min(1e-5, 1/(100 m)), below 1/m of that population
    assert out["delta"] == pytest.approx(1e-5) and out["delta"] < 1 / 37


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


def test_local_all_trains_every_client_alone(capsys):
    code, cap = _run(
        capsys,
        ["pmtl", "--data", "synthetic", "--num-clients", "12", "--model", "logreg",
         "--method", "local-all", "--epsilon", "1", "--json"],
    )  # fmt: skip
    assert code == 0, cap.err
    out = json.loads(cap.out)
    # nothing leaves a client: ε = 0 whatever --epsilon says, and no noise
    assert out["epsilon"] == 0.0 and out["noise_std"] == 0.0
    assert out["guarantee"]["sampling"] == "none"
    assert out["noise_source"] == "none" and out["covered"] is True
    sel = out["local_selection"]
    assert sel["select"] == "client" and sum(sel["clients_per_choice"]) == 12
    # --local-select pooled: one grid point for all, the best pooled validation accuracy
    code, cap = _run(
        capsys,
        ["pmtl", "--data", "synthetic", "--num-clients", "12", "--model", "logreg",
         "--method", "local-all", "--local-select", "pooled", "--json"],
    )  # fmt: skip
    assert code == 0, cap.err
    out = json.loads(cap.out)
    sel = out["local_selection"]
    assert sel["select"] == "pooled" and sum(sel["clients_per_choice"]) == 12
    best = max(range(len(sel["grid"])), key=lambda g: sel["grid_val_accuracy"][g])
    assert sel["clients_per_choice"][best] == 12
    assert out["test_accuracy"] == pytest.approx(sel["grid_test_accuracy"][best])
    assert out["covered"] is False


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_bad_num_clients_exit_2(capsys, value):
    code, cap = _run(
        capsys,
        ["pmtl", "--data", "synthetic", "--num-clients", value, "--model", "logreg",
         "--method", "local-all"],
    )  # fmt: skip
    assert code == 2
    assert "num-clients" in cap.err and "Traceback" not in cap.err
