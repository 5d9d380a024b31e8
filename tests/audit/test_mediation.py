"""`privmtl audit mediation`: outputs depend on other clients only through recorded releases."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest
import torch

from privmtl.audit import mediation
from privmtl.audit.mediation import MUTANTS, check_specs, run_mediation_audit
from privmtl.audit.tape import ReleaseTape, release_tape
from privmtl.cli import main
from privmtl.cli.audit import _run_command
from privmtl.privacy.covariance import plan_covariance_releases
from privmtl.privacy.noise import make_noise_source
from privmtl.privacy.release import GaussianMeanRelease
from privmtl.privacy.sampling import make_sampler

# Fast paths that are mediated today and, together, let every mutant bite.
FAST = ["train_local", "train_workshop", "lowrank (public step size)"]
# ... and one command-line path: what the command-line audit runs once for this module.
CLI_ONLY = ["pmtl --finetune none", *FAST]


# ------------------------------------------------------------------------------- the tape
def _release(values: torch.Tensor, seed: int = 0) -> torch.Tensor:
    mech = GaussianMeanRelease(clip=1.0, noise_std=0.5, sampler=make_sampler("all", 3, 3))
    out = mech.release({"w": values}, make_noise_source("seeded", seed))
    return out.value["w"]


_ORIGINALS = (GaussianMeanRelease.release, GaussianMeanRelease.release_sum)


def test_no_tape_is_active_by_default():
    assert (GaussianMeanRelease.release, GaussianMeanRelease.release_sum) == _ORIGINALS
    x = torch.ones(3, 2)
    assert torch.equal(_release(x), _release(x))  # seeded, deterministic, untouched


def test_replay_emits_the_recorded_release_not_the_new_one():
    a, b = torch.ones(3, 2), -5 * torch.ones(3, 2)
    with release_tape(ReleaseTape("record")) as tape:
        recorded = _release(a)
    assert len(tape.values) == 1
    with release_tape(tape.replay()) as replay:
        replayed = _release(b, seed=1)
    assert replay.position == 1
    assert torch.equal(replayed, recorded)
    assert not torch.equal(_release(b, seed=1), recorded)  # without the tape: B's own release
    # the tape was injected around the mechanism and is gone: the product holds no hook
    assert (GaussianMeanRelease.release, GaussianMeanRelease.release_sum) == _ORIGINALS


def test_replay_refuses_more_releases_than_recorded():
    tape = ReleaseTape("record")
    with release_tape(tape.replay()), pytest.raises(Exception, match="only 0 were recorded"):
        _release(torch.ones(3, 2))


def test_covariance_release_goes_through_the_tape():
    sched = plan_covariance_releases(epsilon=1.0, delta=1e-5, iterations=1, clip=1.0, dim=3)
    rng = np.random.default_rng(0)
    with release_tape(ReleaseTape("record")) as tape:
        first = sched.noisy(0, np.eye(3), rng)
    with release_tape(tape.replay()):
        again = sched.noisy(0, 7 * np.eye(3), np.random.default_rng(1))
    np.testing.assert_array_equal(again, first)


def test_the_floor_vote_goes_through_the_tape():
    """MP-MTL low-rank with the refit's floor vote held (ε = 10, 40 tasks): task 0's data
    replaced, the covariance release and the vote's noisy counts replayed from the first run;
    every other task's model is the same bit for bit (its vote, its scores and its refit read
    only its own data and the releases)."""
    from privmtl.linear.mpmtl import MPMTLLowRank

    rng = np.random.default_rng(0)
    basis = np.linalg.qr(rng.standard_normal((6, 2)))[0]
    Xs = [rng.standard_normal((25, 6)) / 3 for _ in range(40)]
    ys = [x @ basis @ rng.standard_normal(2) + 0.3 * rng.standard_normal(25) for x in Xs]

    def fit(X0, y0, seed):
        est = MPMTLLowRank(epsilon=10.0, random_state=seed, noise_source="seeded")
        return est.fit([X0, *Xs[1:]], [y0, *ys[1:]])

    with release_tape(ReleaseTape("record")) as tape:
        a = fit(Xs[0], ys[0], 0)
    assert a.eigen_floor_["mode"] == "vote" and len(tape.values) == 2
    other = np.ones((25, 6)) / 6**0.5, 5.0 * np.ones(25)
    with release_tape(tape.replay()) as replay:
        b = fit(*other, 1)
    assert replay.position == 2
    assert b.eigen_floor_["noisy_counts"] == a.eigen_floor_["noisy_counts"]
    np.testing.assert_array_equal(b.coef_[:, 1:], a.coef_[:, 1:])
    assert not np.array_equal(b.coef_[:, 0], a.coef_[:, 0])


def test_tape_mode_is_validated():
    with pytest.raises(Exception, match="'mode'"):
        ReleaseTape("play")


# ------------------------------------------------------------------------------- the audit
def test_enough_paths_and_mutants():
    names = [s.name for s in check_specs()]
    assert len(names) >= 10 and len(set(names)) == len(names)
    assert len(MUTANTS) >= 3
    assert any("local-all" in n and "labels" in n and "personalized.pt" in n for n in names)


@pytest.fixture(scope="module")
def cli_audit():
    """One ``privmtl audit mediation --json`` run on the fast paths and one command-line path,
    with every mutant: its exit code and its JSON object, shared by the tests that read them."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(["audit", "mediation", "--json", *(a for o in CLI_ONLY for a in ("--only", o))])
    return code, json.loads(buffer.getvalue())


def test_fast_paths_hold_and_every_mutant_is_caught(cli_audit):
    _, out = cli_audit
    assert [c["ok"] for c in out["checks"]] == [True] * 4, out["checks"]
    assert out["mutants"] == 3 and out["mutants_caught"] == 3, out["mutant_results"]
    assert out["ok"] and out["skipped"] == 0
    caught_by = {m["name"]: m["failed_checks"] for m in out["mutant_results"]}
    # the per-client rows (clients.csv) show each client's local-only accuracy: a pooled choice
    # of the local training's setting reaches the other clients' rows
    assert caught_by["pooled-selection"] == ["pmtl --finetune none", "train_local(select='client')"]
    assert caught_by["global-step-size"] == ["MP-MTL lowrank (public step size)"]
    assert caught_by["unnoised-diagnostic"] == ["pmtl --finetune none", "train_workshop"]


def test_a_leak_is_reported_with_the_clients_that_differ():
    with MUTANTS["global-step-size"][1]():
        out = run_mediation_audit(None, only=["lowrank (public step size)"], mutants=False)
    (check,) = out["checks"]
    assert check["ok"] is False and not out["ok"]
    assert check["clients_differing"] == ["c1", "c2", "c3", "c4", "c5"]  # never c0
    assert check["max_abs_diff"] > 0 and "models:coef[c1]" in check["detail"]


def test_command_line_checks_need_the_cli_runner():
    out = run_mediation_audit(None, only=["--method local"], mutants=False)
    assert [c["ok"] for c in out["checks"]] == [None, None]  # local, local-all: skipped
    assert not out["ok"]


def test_cli_contract(cli_audit):
    code, out = cli_audit
    assert isinstance(out["checks"], list) and len(out["checks"]) == 4
    assert all({"name", "ok", "detail"} <= set(c) for c in out["checks"])
    assert isinstance(out["mutants"], int) and isinstance(out["mutants_caught"], int)
    assert out["mutants"] == out["mutants_caught"] == 3
    assert code == 0


def test_cli_exits_1_when_a_check_fails(monkeypatch, capsys):
    report = {
        "checks": [{"name": "x", "ok": False, "detail": "differs"}],
        "mutants": 0,
        "mutants_caught": 0,
        "mutant_results": [],
        "ok": False,
        "seconds": 0.0,
    }
    monkeypatch.setattr(mediation, "run_mediation_audit", lambda *a, **k: report)
    assert main(["audit", "mediation", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["checks"][0]["ok"] is False


def test_mechanism_audit_still_needs_its_options(capsys):
    assert main(["audit", "--epsilon", "1"]) == 2
    assert "--mechanism" in capsys.readouterr().err


def test_the_end_of_run_vote_is_replayed_and_mediates():
    from privmtl.audit.mediation_paths import NUM_CLIENTS
    from privmtl.federated.end_of_run.finish import FINETUNE_VOTE_SHARE
    from privmtl.privacy import plan_vote

    name = "pmtl --finetune auto --finetune-select vote (recorded vote)"
    assert plan_vote(NUM_CLIENTS, epsilon=100.0, delta=1e-5, share=FINETUNE_VOTE_SHARE).held
    out = run_mediation_audit(_run_command, only=[name], mutants=False)
    (check,) = [c for c in out["checks"] if c["name"] == name]
    assert check["ok"], check


# --------------------------------------------------- paths that a default choice makes mediated:
# each fails without that choice, for the reason named.
MEDIATED_BY_A_DEFAULT = [pytest.param(s, id=s.name) for s in check_specs() if s.mediated_by]


@pytest.mark.parametrize("spec", MEDIATED_BY_A_DEFAULT)
def test_paths_made_mediated_by_a_default_choice(spec):
    out = run_mediation_audit(_run_command, only=[spec.name], mutants=False)
    (check,) = [c for c in out["checks"] if c["name"] == spec.name]
    assert check["ok"], f"{spec.mediated_by}: {check['detail']}"
    assert check["mediated_by"] == spec.mediated_by


@pytest.mark.slow
def test_full_audit_holds():
    out = run_mediation_audit(_run_command)
    assert len(out["checks"]) >= 10 and out["mutants"] >= 3
    assert out["ok"], [c for c in out["checks"] if not c["ok"]]


def test_the_product_holds_no_audit_hook():
    """The tape is injected by the audit around the mechanisms: no module outside
    ``privmtl.audit`` refers to it."""
    from pathlib import Path

    import privmtl

    src = Path(privmtl.__file__).parent
    offenders = [
        str(p.relative_to(src))
        for p in src.rglob("*.py")
        if p.relative_to(src).parts[0] != "audit"
        and any(w in p.read_text() for w in ("ReleaseTape", "release_tape", "taped("))
    ]
    assert offenders == []
