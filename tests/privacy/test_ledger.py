import json
import os

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


# ------------------------------------------------------------------ loading checks, it does not trust
def _state(n: int = 3, **kw):
    ledger = PrivacyLedger(delta=DELTA, **kw)
    for t in range(n):
        ledger.record(EVENT, round=t, mechanism="gaussian-mean", release_id=f"round:{t}")
    return ledger, json.loads(json.dumps(ledger.to_dict()))


def test_a_state_round_trips_and_reports_the_recomputed_epsilon():
    ledger, state = _state()
    assert state["format"] == "privmtl-ledger" and state["version"] == 1
    back = PrivacyLedger.from_dict(state)
    oracle = compute_epsilon(dp_accounting.SelfComposedDpEvent(EVENT, 3), delta=DELTA)
    assert back.epsilon() == pytest.approx(oracle, rel=1e-9)
    assert back.history == ledger.history and back.records == ledger.records
    # a state written before the tag existed still loads
    legacy = {k: v for k, v in state.items() if k not in ("format", "version")}
    assert PrivacyLedger.from_dict(legacy).epsilon() == back.epsilon()
    # load_state_dict: same checks, in place
    fresh = PrivacyLedger(delta=DELTA, budget=100.0)
    fresh.load_state_dict(state)
    assert fresh.epsilon() == back.epsilon() and fresh.budget == 100.0
    assert fresh.has_release("round:2")
    assert fresh.record(EVENT, release_id="round:2", replay_ok=True) == back.epsilon()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.update(format="opacus-rdp"), r"format tag 'opacus-rdp'.*'privmtl-ledger'"),
        (lambda s: s.update(version=2), r"format version 2"),
        (
            lambda s: s["records"][1].update(epsilon=s["records"][1]["epsilon"] / 2),
            r"record 1 \(release 'round:1'\) states epsilon=.*compose to epsilon=",
        ),
        (
            lambda s: s["history"].__setitem__(2, 0.01),
            r"history\[2\]=0\.01, but the recorded events compose",
        ),
        (lambda s: s["history"].pop(), r"'history' of 2 entries for 3 records"),
        (
            lambda s: s["records"][0]["event"]["event"].update(noise_multiplier=50.0),
            r"record 0 \(release 'round:0'\) states epsilon=",
        ),
        (
            lambda s: s["records"][2].update(accountant="pld"),
            r"record 2 .* accountant='pld'; the ledger has accountant='rdp'",
        ),
        (lambda s: s["records"][0].update(delta=0.5), r"record 0 .* delta=0\.5"),
        (lambda s: s["records"][1].update(sampling="fixed"), r"sampling='fixed'.*'poisson'"),
        (lambda s: s["records"].pop(0), r"record 0 \(release 'round:1'\) states index=1"),
        (lambda s: s["records"][0].pop("event"), r"record 0 has no 'event'"),
        (
            lambda s: s["records"][0].update(event={"type": "laplace"}),
            r"record 0 .* unreadable event.*'laplace'",
        ),
        (lambda s: s.pop("relation"), r"no 'relation'"),
    ],
)
def test_a_tampered_state_is_refused_naming_what_disagrees(edit, message):
    _, state = _state()
    edit(state)
    with pytest.raises(InvalidParameterError, match=message):
        PrivacyLedger.from_dict(state)
    with pytest.raises(InvalidParameterError, match=message):
        PrivacyLedger(delta=DELTA).load_state_dict(state)


def test_load_state_dict_refuses_other_settings_and_durable_ledgers(tmp_path):
    _, state = _state()
    with pytest.raises(InvalidParameterError, match=r"delta=0\.001; this ledger has delta=0\.01"):
        PrivacyLedger(delta=0.01).load_state_dict(state)
    durable = PrivacyLedger(delta=DELTA, path=tmp_path / "l.jsonl")
    with pytest.raises(InvalidParameterError, match="durable"):
        durable.load_state_dict(state)


def test_open_refuses_a_file_whose_stated_epsilon_was_edited(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = PrivacyLedger(delta=DELTA, path=path)
    for t in range(3):
        ledger.record(EVENT, round=t, release_id=f"round:{t}")
    lines = path.read_text().splitlines()
    entry = json.loads(lines[2])
    entry["epsilon"] = 0.001
    lines[2] = json.dumps(entry, sort_keys=True)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InvalidParameterError, match=r"record 1 \(release 'round:1'\) states"):
        PrivacyLedger.open(path, delta=DELTA)


def _three(path):
    ledger = PrivacyLedger(delta=DELTA, path=path)
    for t in range(3):
        ledger.record(EVENT, round=t, release_id=f"round:{t}")
    return ledger


def test_every_line_carries_a_chained_mac_and_a_broken_chain_is_refused(tmp_path):
    path = tmp_path / "ledger.jsonl"
    _three(path)
    lines = path.read_bytes().splitlines(keepends=True)
    assert all("mac" in json.loads(x) for x in lines)
    assert reaccount(path)["authenticated"]
    path.write_bytes(lines[0] + lines[2] + lines[3])  # a release removed, the rest unedited
    with pytest.raises(InvalidParameterError, match="index=1"):
        PrivacyLedger.open(path, delta=DELTA)
    stripped = [{k: v for k, v in json.loads(x).items() if k != "mac"} for x in lines]
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in stripped))
    with pytest.raises(InvalidParameterError, match="not authenticated: line 1 carries no MAC"):
        PrivacyLedger.open(path, delta=DELTA)
    with pytest.raises(InvalidParameterError, match="not authenticated"):
        read_ledger(path)
    out = reaccount(path)  # read alone, it says so
    assert not out["authenticated"] and "no MAC" in out["authentication"]


def test_another_users_ledger_is_not_authenticated(tmp_path, monkeypatch):
    path = tmp_path / "ledger.jsonl"
    _three(path)
    monkeypatch.setenv("PRIVMTL_CONFIG_DIR", str(tmp_path / "other-user"))
    assert not reaccount(path)["authenticated"]
    with pytest.raises(InvalidParameterError, match="not authenticated"):
        PrivacyLedger.open(path, delta=DELTA)


def test_close_appends_one_closing_line_and_a_reader_knows_the_file_is_complete(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = _three(path)
    assert not reaccount(path)["complete"]
    seen = ledger.seen()
    ledger.close()
    ledger.close()  # once
    assert json.loads(path.read_text().splitlines()[-1])["closing"] is True
    assert len(path.read_text().splitlines()) == 5
    out = reaccount(path)
    assert out["complete"] and out["releases"] == 3 and out["incomplete"] == ""
    again = PrivacyLedger.open(path, delta=DELTA, seen=seen)  # continued after its closing line
    again.record(EVENT, round=3, release_id="round:3")
    assert not reaccount(path)["complete"] and reaccount(path)["releases"] == 4
    again.close()
    assert reaccount(path)["complete"]


def test_a_last_line_without_its_newline_is_a_whole_release_kept_on_open(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = _three(path)
    path.write_bytes(path.read_bytes()[:-1])
    out = reaccount(path)
    assert out["releases"] == 3 and out["epsilon"] == pytest.approx(ledger.epsilon())
    assert not out["complete"] and "newline" in out["incomplete"]
    reopened = PrivacyLedger.open(path, delta=DELTA)  # the newline put back, appends continue
    assert len(reopened.records) == 3 and path.read_bytes().endswith(b"\n")
    reopened.record(EVENT, round=3)
    assert reaccount(path)["releases"] == 4 and reaccount(path)["authenticated"]


@pytest.mark.parametrize("make", ["devnull", "link"])
def test_a_ledger_that_is_not_a_regular_file_is_refused(tmp_path, make):
    path = tmp_path / "ledger.jsonl"
    if make == "devnull":
        path.symlink_to(os.devnull)
    else:
        _three(tmp_path / "real.jsonl")
        path.symlink_to(tmp_path / "real.jsonl")
    for call in (
        lambda: PrivacyLedger.open(path, delta=DELTA),
        lambda: PrivacyLedger(delta=DELTA, path=path),
        lambda: reaccount(path),
    ):
        with pytest.raises(InvalidParameterError, match="must be a regular file"):
            call()
