"""``privmtl mpmtl --eigen-floor``: the vote's record in the JSON and the ledger, bad values."""

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


def test_the_vote_is_in_the_json_and_the_durable_ledger(capsys, tmp_path):
    ck = tmp_path / "ck"
    out = _json(capsys, [*BASE, "--epsilon", "10", "--eigen-floor", "vote",
                         "--checkpoint-dir", str(ck)])  # fmt: skip
    floor = out["eigen_floor"]
    assert floor["mode"] == "vote" and floor["floor"] in floor["candidates"]
    assert floor["grid"] == [0.0, 0.5, 1.0, 2.0] and floor["vote_share"] == 0.05
    assert 0 < floor["vote_epsilon"] < out["epsilon"] <= 10.0
    assert out["params"]["eigen_floor"] == "vote"
    # privmtl ledger re-accounts the durable ledger: the release and the vote, the same ε
    led = _json(capsys, ["ledger", str(ck), "--json"])
    assert led["releases"] == 2
    assert led["epsilon"] == pytest.approx(out["epsilon"], rel=1e-12)


def test_a_fixed_floor_and_the_default(capsys):
    fixed = _json(capsys, [*BASE, "--epsilon", "10", "--eigen-floor", "1"])
    assert fixed["eigen_floor"]["mode"] == "fixed" and fixed["eigen_floor"]["floor"] == 1.0
    assert fixed["eigen_floor"]["vote_epsilon"] == 0.0


@pytest.mark.parametrize("value", ["-1", "best", "nan"])
def test_a_bad_floor_exits_2_in_one_line(capsys, value):
    code = main([*BASE, "--epsilon", "1", "--eigen-floor", value])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--eigen-floor" in err and len(err.splitlines()) == 1
    assert "Traceback" not in err
