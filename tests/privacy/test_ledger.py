import json

import dp_accounting
import pytest

from privmtl.exceptions import InvalidParameterError, PrivacyBudgetError
from privmtl.privacy.accounting import compute_epsilon
from privmtl.privacy.ledger import PrivacyLedger, reaccount, read_ledger

DELTA = 1e-3
EVENT = dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(1.1))


def test_durable_record_is_on_disk_when_record_returns(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = PrivacyLedger(delta=DELTA, path=path)
    eps = ledger.record(EVENT, round=0, mechanism="gaussian-mean", release_id="round:0")
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["format"] == "privmtl-ledger"
    assert lines[1]["release_id"] == "round:0"
    assert lines[1]["sampling"] == "poisson"
    assert lines[1]["epsilon"] == pytest.approx(eps)
    assert eps == pytest.approx(compute_epsilon(EVENT, delta=DELTA))


def test_open_resumes_every_release_and_refuses_other_settings(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = PrivacyLedger.open(path, delta=DELTA)
    for t in range(3):
        ledger.record(EVENT, round=t, release_id=f"round:{t}")
    again = PrivacyLedger.open(path, delta=DELTA)
    assert again.epsilon() == pytest.approx(ledger.epsilon())
    oracle = compute_epsilon(dp_accounting.SelfComposedDpEvent(EVENT, 3), delta=DELTA)
    assert again.epsilon() == pytest.approx(oracle, rel=1e-9)
    with pytest.raises(InvalidParameterError, match="accountant"):
        PrivacyLedger.open(path, delta=DELTA, accountant="pld")
    with pytest.raises(InvalidParameterError, match="exists already"):
        PrivacyLedger(delta=DELTA, path=path)


def test_a_torn_last_line_is_a_release_that_never_left(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = PrivacyLedger(delta=DELTA, path=path)
    ledger.record(EVENT, round=0)
    with open(path, "a") as fh:
        fh.write('{"index": 1, "event": {"ty')  # killed inside record()
    reopened = PrivacyLedger.open(path, delta=DELTA)
    assert len(reopened.records) == 1
    reopened.record(EVENT, round=1)
    _, entries = read_ledger(path)
    assert [e["round"] for e in entries] == [0, 1]


def test_seeded_replay_is_not_charged_twice_and_secure_repeat_is(tmp_path):
    ledger = PrivacyLedger(delta=DELTA, path=tmp_path / "l.jsonl")
    e0 = ledger.record(EVENT, release_id="round:0")
    assert ledger.record(EVENT, release_id="round:0", replay_ok=True) == e0
    assert len(ledger.records) == 1
    e1 = ledger.record(EVENT, release_id="round:0")  # a fresh (secure) release of the same round
    assert e1 > e0 and len(ledger.records) == 2
    other = dp_accounting.GaussianDpEvent(3.0)
    with pytest.raises(InvalidParameterError, match="another event"):
        ledger.record(other, release_id="round:0", replay_ok=True)


def test_budget_refuses_before_recording(tmp_path):
    ledger = PrivacyLedger(delta=DELTA, budget=3.0, path=tmp_path / "l.jsonl")
    n = 0
    while not ledger.would_exceed(EVENT):
        ledger.record(EVENT)
        n += 1
    assert n > 0 and ledger.epsilon() <= 3.0
    with pytest.raises(PrivacyBudgetError):
        ledger.record(EVENT)
    assert len(read_ledger(tmp_path / "l.jsonl")[1]) == n


def test_reaccount_reproduces_the_recorded_epsilon_and_gives_pld(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = PrivacyLedger(delta=DELTA, path=path)
    for t in range(4):
        ledger.record(EVENT, round=t)
    out = reaccount(path)
    assert out["releases"] == 4
    assert out["epsilon"] == pytest.approx(ledger.epsilon(), rel=1e-12)
    assert out["per_release"] == pytest.approx(ledger.history, rel=1e-12)
    pld = reaccount(tmp_path, accountant="pld")
    oracle = compute_epsilon(
        dp_accounting.SelfComposedDpEvent(EVENT, 4), delta=DELTA, accountant="pld"
    )
    assert pld["epsilon"] == pytest.approx(oracle, rel=1e-6)
    assert pld["epsilon"] <= out["epsilon"]
