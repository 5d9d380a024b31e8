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
