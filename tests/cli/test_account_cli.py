import json

import dp_accounting
import pytest

from privmtl.cli import main

BASE = ["--clip", "0.5", "--num-clients", "100", "--clients-per-round", "20", "--rounds", "50"]


def _run(capsys, args):
    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_account_json_contract_and_agreement_with_dp_accounting(capsys):
    code, out, _ = _run(
        capsys, ["account", *BASE, "--delta", "1e-5", "--noise-std", "0.05", "--json"]
    )
    assert code == 0
    res = json.loads(out)
    for key in (
        "epsilon",
        "delta",
        "noise_std",
        "noise_multiplier",
        "accountant",
        "sampling",
        "relation",
    ):
        assert key in res
    assert res["noise_multiplier"] == pytest.approx(0.05 * 20 / 0.5)
    assert (res["accountant"], res["sampling"], res["relation"]) == ("rdp", "poisson", "add-remove")
    # independent computation with dp-accounting's own RDP accountant
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(2.0)), 50
        )
    )
    assert res["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=0.03)


def test_account_calibration_round_trip_via_cli(capsys):
    code, out, _ = _run(
        capsys,
        [
            "account",
            *BASE,
            "--delta",
            "1e-5",
            "--target-epsilon",
            "1",
            "--accountant",
            "pld",
            "--json",
        ],
    )
    assert code == 0
    sigma = json.loads(out)["noise_std"]
    code, out, _ = _run(
        capsys,
        [
            "account",
            *BASE,
            "--delta",
            "1e-5",
            "--noise-std",
            repr(sigma),
            "--accountant",
            "pld",
            "--json",
        ],
    )
    assert 0.97 <= json.loads(out)["epsilon"] <= 1.0


def test_account_paper_flags_sampling_mismatch(capsys):
    code, out, _ = _run(
        capsys,
        [
            "account", *BASE, "--delta", "1e-5", "--noise-std", "0.05",
            "--accountant", "paper", "--sampling", "fixed", "--relation", "replace-one", "--json",
        ],
    )  # fmt: skip
    assert code == 0
    res = json.loads(out)
    assert res["sampling"] == "poisson"  # what the paper's accountant assumed
    assert any("MISMATCH" in n for n in res["guarantee"]["notes"])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["account", *BASE, "--delta", "1e-5"], "Exactly one of"),
        (["account", *BASE, "--delta", "2", "--noise-std", "1"], "'delta'"),
        (["account", *BASE, "--delta", "1e-5", "--noise-std", "-1"], "'noise_std'"),
        (["account", "--clip", "1"], "Missing option"),
        (
            ["mpmtl", "--data", "school", "--data-path", "/no/such.mat", "--method", "lowrank"],
            "/no/such.mat",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, args, needle):
    code, out, err = _run(capsys, args)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("privmtl: error:")
    assert needle in lines[0]


CYCLIC = ["--clip", "0.5", "--num-clients", "100", "--rounds", "50", "--delta", "1e-5"]


def test_account_cyclic_banded_matches_a_training_runs_calibration_and_dp_accounting(capsys):
    from privmtl.federated.backend import release_noise
    from privmtl.federated.config import TrainConfig, resolve

    args = [*CYCLIC, "--sampling", "cyclic", "--groups", "5", "--noise-mechanism", "banded"]
    code, out, err = _run(capsys, ["account", *args, "--target-epsilon", "1", "--json"])
    assert code == 0, err
    res = json.loads(out)
    assert (res["sampling"], res["groups"], res["clients_per_round"]) == ("cyclic", 5, 20)
    cfg = TrainConfig(
        sampling="cyclic", groups=5, noise_mechanism="banded", epsilon=1.0, clip=0.5,
        rounds=50, delta=1e-5,
    )  # fmt: skip
    sigma = release_noise(resolve(cfg, 100), 100)
    assert res["noise_std"] == pytest.approx(sigma, rel=1e-12)  # the run's own σ
    banded = res["banded"]
    assert (banded["bands"], banded["groups"], banded["rounds"]) == (5, 5, 50)
    # independently: one Gaussian of multiplier σ / sensitivity, by dp-accounting's RDP
    z = res["noise_std"] / banded["sensitivity"]
    assert banded["run_noise_multiplier"] == pytest.approx(z, rel=1e-12)
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(z))
    assert acc.get_epsilon(1e-5) == pytest.approx(res["epsilon"], rel=1e-6)
    assert res["epsilon"] == pytest.approx(1.0, rel=1e-3)
    sigma = str(res["noise_std"])
    code, out, _ = _run(capsys, ["account", *args, "--noise-std", sigma, "--json"])
    assert code == 0 and json.loads(out)["epsilon"] == pytest.approx(res["epsilon"], rel=1e-9)


def test_account_cyclic_independent_noise_is_the_runs_sigma(capsys):
    from privmtl.federated.backend import release_noise
    from privmtl.federated.config import TrainConfig, resolve

    args = ["account", *CYCLIC, "--sampling", "cyclic", "--groups", "4", "--target-epsilon", "2"]
    code, out, err = _run(capsys, [*args, "--json"])
    assert code == 0, err
    cfg = TrainConfig(
        sampling="cyclic", groups=4, epsilon=2.0, clip=0.5, rounds=50, delta=1e-5
    )  # fmt: skip
    assert json.loads(out)["noise_std"] == pytest.approx(
        release_noise(resolve(cfg, 100), 100), rel=1e-12
    )


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--noise-mechanism", "banded", "--clients-per-round", "20"], "'noise_mechanism'"),
        (["--sampling", "cyclic", "--groups", "5", "--accountant", "paper"], "'accountant'"),
        (["--groups", "3", "--clients-per-round", "20"], "'groups'"),
        ([], "'clients_per_round'"),
    ],
)
def test_account_refusals_are_one_line(capsys, extra, needle):
    code, _, err = _run(capsys, ["account", *CYCLIC, "--target-epsilon", "1", *extra])
    assert code == 2
    err = err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and needle in err
