"""Covered selection in the PMTL sweep: the vote's cost is composed, pooled selection is labelled."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import numpy as np
import pytest
from dp_accounting import dp_event as dpe

from privmtl.experiments.pmtl_sweep import plot_rounds, run_pmtl_sweep, write_pmtl_sweep
from privmtl.experiments.runlog import RunLog
from privmtl.experiments.sweep import rows_to_csv
from privmtl.experiments.sweep_selection import select_candidates
from privmtl.linear.methods import linear_method
from privmtl.privacy import compute_epsilon

SMALL = {
    "data": "synthetic",
    "data_path": None,
    "model": "logreg",
    "epsilons": [1.0],
    "seeds": [0],
    "clips": [0.2, 1.0],
    "rounds_grid": [3],
    "clients_per_round": 20,
    "noise_source": "seeded",
    "finetune": "none",  # selection, not fine-tuning, is under test: keep the candidates cheap
}


@pytest.fixture(scope="module")
def voted(tmp_path_factory):
    out = tmp_path_factory.mktemp("vote")
    log = RunLog(out)
    res = run_pmtl_sweep(methods=["pmtl", "local"], log=log, **SMALL)
    return res, out, log


def _row(res, method, eps):
    return next(r for r in res["rows"] if r["method"] == method and r["target_epsilon"] == eps)


def test_vote_epsilon_composes_every_candidate_and_the_vote(voted):
    res, _, _ = voted
    row = _row(res, "pmtl", 1.0)
    sel = row["selection"]
    assert row["covered"] is True and row["selection_method"] == "vote" and res["covered"]
    assert sel["candidates"] == 2 and sel["chosen"] in (0, 1)
    cands = [c for c in res["candidates"] if c["method"] == "pmtl" and c["target_epsilon"] == 1.0]
    # independent composition: each candidate is T rounds of the Poisson-sampled Gaussian
    events = [
        dpe.SelfComposedDpEvent(
            dpe.PoissonSampledDpEvent(
                c["clients_per_round"] / c["num_clients"],
                dpe.GaussianDpEvent(c["noise_multiplier"]),
            ),
            c["rounds_run"],
        )
        for c in cands
    ]
    vote = dpe.GaussianDpEvent(sel["vote"]["noise_multiplier"])
    delta = row["delta"]
    expected = compute_epsilon(dpe.ComposedDpEvent([*events, vote]), delta=delta)
    assert row["epsilon"] == pytest.approx(expected, rel=1e-6)
    assert row["guarantee"]["epsilon"] == row["epsilon"]
    assert sel["candidates_epsilon"] == pytest.approx(
        compute_epsilon(dpe.ComposedDpEvent(events), delta=delta), rel=1e-6
    )
    # the budget split: the vote alone spends half of the point's ε; training is the run's own
    assert sel["vote"]["epsilon"] == pytest.approx(0.5, rel=1e-3) and sel["vote"]["share"] == 0.5
    assert row["training_epsilon"] == pytest.approx(1.0, rel=0.03)
    assert row["epsilon"] > sel["candidates_epsilon"] > row["training_epsilon"]
    assert sel["vote"]["noise_source"] == "seeded" and len(sel["vote"]["noisy_counts"]) == 2
    # the published candidates do not carry the selection inputs (per-client scores, events)
    assert all("client_scores" not in c and "release_events" not in c for c in res["candidates"])


def test_local_training_is_chosen_per_client_and_stays_at_epsilon_zero(voted):
    res, out, _ = voted
    row = _row(res, "local", None)
    assert row["selection_method"] == "client" and row["covered"] is True
    assert row["epsilon"] == 0.0 and row["selection"]["vote"] is None
    # the per-client choice's test accuracy: each client scored with its own chosen candidate
    logged = [json.loads(x)["row"] for x in (out / "runs.jsonl").read_text().splitlines()]
    local = [r for r in logged if r.get("method") == "local"]
    assert len(local) == 2
    val = np.stack(
        [np.divide(r["client_scores"]["val_correct"], np.maximum(r["client_scores"]["val_n"], 1))
         for r in local], 1,
    )  # fmt: skip
    has_val = np.asarray(local[0]["client_scores"]["val_n"]) > 0
    choice = np.where(has_val, np.argmax(val, 1), 0)
    test_correct = np.stack([r["client_scores"]["test_correct"] for r in local], 1)
    n_test = np.asarray(local[0]["client_scores"]["test_n"])
    mine = test_correct[np.arange(len(choice)), choice]
    assert row["test_accuracy"] == pytest.approx(mine.sum() / n_test.sum())


def test_resumed_sweep_reuses_the_logged_vote(voted, tmp_path):
    res, out, log = voted
    again = run_pmtl_sweep(methods=["pmtl", "local"], log=RunLog(out), **SMALL)
    assert [r["selection"] for r in again["rows"]] == [r["selection"] for r in res["rows"]]
    logged = [json.loads(x)["key"] for x in (out / "runs.jsonl").read_text().splitlines()]
    assert sum('"pmtl-selection"' in k for k in logged) == 2  # pmtl at ε=1 and non-private
    # the run counters count runs, not votes
    assert (log.computed, log.reused) == (6, 0)


def test_secure_vote_is_logged_and_reused(tmp_path):
    kw = {**SMALL, "noise_source": "secure", "clips": [0.5, 1.0]}
    first = run_pmtl_sweep(methods=["fedavg"], log=RunLog(tmp_path), **kw)
    second = run_pmtl_sweep(methods=["fedavg"], log=RunLog(tmp_path), **kw)
    a, b = _row(first, "fedavg", 1.0), _row(second, "fedavg", 1.0)
    assert a["selection"]["vote"]["noise_source"] == "secure"
    assert a["selection"]["vote"]["noisy_counts"] == b["selection"]["vote"]["noisy_counts"]
    assert a["epsilon"] == b["epsilon"]


def test_pooled_selection_is_labelled_not_covered_everywhere(tmp_path):
    res = run_pmtl_sweep(methods=["pmtl"], select="pooled", **SMALL)
    row = _row(res, "pmtl", 1.0)
    assert row["covered"] is False and res["covered"] is False
    assert row["selection_method"] == "pooled" and row["guarantee"]["covered"] is False
    assert any("pooled validation" in r for r in row["guarantee"]["not_covered"])
    assert row["epsilon"] == row["training_epsilon"]  # nothing claimed for the selection
    best = max(
        (c for c in res["candidates"] if c["method"] == "pmtl" and c["target_epsilon"] == 1.0),
        key=lambda c: c["val_accuracy"],
    )
    assert row["clip"] == best["clip"]
    table = list(csv.DictReader(io.StringIO(rows_to_csv(res["rows"]))))
    assert {r["covered"] for r in table} == {"False"}
    assert {r["selection_method"] for r in table} == {"pooled"}
    assert all(s["covered"] is False for s in res["summary"])
    files = write_pmtl_sweep(res, tmp_path, title="t")
    assert all(f.stat().st_size > 0 for f in files)


def test_select_candidates_bad_input():
    from privmtl.exceptions import InvalidParameterError

    kw = {
        "scores": np.zeros((3, 2)),
        "pooled": [0.1, 0.2],
        "events": [[], []],
        "target_epsilon": 1.0,
        "delta": 1e-5,
        "accountant": "rdp",
        "relation": "add-remove",
        "noise_source": "seeded",
        "seed": 0,
    }
    with pytest.raises(InvalidParameterError, match="'select'"):
        select_candidates(select="best", **kw)
    with pytest.raises(InvalidParameterError, match="vote_share"):
        select_candidates(select="vote", vote_share=0.0, **kw)
    with pytest.raises(InvalidParameterError, match="pooled"):
        select_candidates(select="vote", **{**kw, "pooled": [0.1]})
    with pytest.raises(InvalidParameterError, match="scores"):
        select_candidates(select="vote", **{**kw, "scores": np.zeros((3, 3))})


def test_vote_in_select_candidates_is_in_its_ledger_and_picks_the_clear_winner():
    scores = np.tile([0.2, 0.9, 0.5], (200, 1))  # every client prefers candidate 1
    z = 3.0
    sel = select_candidates(
        select="vote",
        scores=scores,
        pooled=[None, None, None],
        events=[[{"type": "gaussian", "noise_multiplier": z}]] * 3,
        target_epsilon=1.0,
        delta=1e-5,
        accountant="rdp",
        relation="add-remove",
        noise_source="seeded",
        seed=0,
    )
    assert sel["chosen"] == 1 and sel["method"] == "vote" and sel["covered"]
    expected = compute_epsilon(
        dpe.ComposedDpEvent(
            [dpe.SelfComposedDpEvent(dpe.GaussianDpEvent(z), 3),
             dpe.GaussianDpEvent(sel["vote"]["noise_multiplier"])]
        ),
        delta=1e-5,
    )  # fmt: skip
    assert sel["epsilon"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    "extra",
    [
        {"curator_diagnostics": {"train_loss_per_round": [1.0, 0.5, None]}},
        {"train_loss_per_round": [1.0, 0.5, 0.4]},
        {},
    ],
)
def test_plot_rounds_tolerates_both_loss_keys_and_none(tmp_path, extra):
    row = {
        "method": "pmtl",
        "target_epsilon": 1.0,
        "seed": 0,
        "epsilon_per_round": [0.3, 0.6, 1.0],
        "guarantee": {"private": True},
        **extra,
    }
    plot_rounds([row], tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 0


# ------------------------------------------------------------------------------ MP-MTL sweep
def _mpmtl(tmp_path, **kw):
    from privmtl.experiments.mpmtl_sweep import run_mpmtl_sweep

    args = {
        "data": "synthetic-lowrank",
        "data_path": None,
        "methods": ["lowrank", "stl-l2"],
        "epsilons": [1.0],
        "seeds": [0],
        "noise": "gaussian",
        "tune_mode": "each",
        "out_dir": tmp_path,
        "noise_source": "seeded",
    }
    res = run_mpmtl_sweep(**{**args, **kw})
    saved = json.loads((tmp_path / "mpmtl_sweep.json").read_text())
    logged = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines()]
    return res, saved, logged


#: A two-point low-rank grid (the default grid is one point: nothing to vote on).
TWO_POINTS = [{"clip": [1.0], "eigen_fix": ["denoise", "shift"]}]


def _mpmtl_two(tmp_path, **kw):

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(linear_method("lowrank"), "vote_grid", TWO_POINTS)
        return _mpmtl(tmp_path, **kw)


@pytest.fixture(scope="module")
def mpmtl_voted(tmp_path_factory):
    return _mpmtl_two(tmp_path_factory.mktemp("mpmtl"))


def test_mpmtl_vote_composes_every_candidate_and_the_vote(mpmtl_voted):
    from privmtl.linear.selection import expand_grid
    from privmtl.privacy.accounting import event_from_dict

    res, saved, logged = mpmtl_voted
    row = next(r for r in saved["rows"] if r["method"] == "lowrank")
    sel = row["selection"]
    assert res["covered"] and saved["covered"] and row["covered"]
    assert row["selection_method"] == "vote" and sel["candidates"] == len(expand_grid(TWO_POINTS))
    cands = [e["row"] for e in logged if e["row"].get("method") == "lowrank"]
    assert len(cands) == sel["candidates"]
    events = [event_from_dict(ev) for c in cands for ev in c["release_events"]]
    assert events  # the candidates' covariance releases, from their own ledgers
    vote = dpe.GaussianDpEvent(sel["vote"]["noise_multiplier"])
    expected = compute_epsilon(dpe.ComposedDpEvent([*events, vote]), delta=row["delta"])
    assert row["epsilon"] == pytest.approx(expected, rel=1e-9)
    # the candidates and the vote split the target: together they are charged the target
    assert row["epsilon"] == pytest.approx(1.0, rel=1e-6) and row["target_epsilon"] == 1.0
    assert row["training_epsilon"] == pytest.approx(sel["plan"]["candidate_epsilon"], rel=1e-6)
    assert row["training_epsilon"] < 1.0
    assert sel["vote"]["epsilon"] == pytest.approx(0.5, rel=1e-3)
    # the chosen row reports the chosen candidate's test metric
    assert row["nmse"] == pytest.approx(cands[sel["chosen"]]["nmse"])


def test_mpmtl_single_task_baseline_is_the_single_covered_run(mpmtl_voted):
    from privmtl.experiments.mpmtl import run_mpmtl

    _, saved, _ = mpmtl_voted
    row = next(r for r in saved["rows"] if r["method"] == "stl-l2")
    assert row["selection_method"] == "client" and row["epsilon"] == 0.0 and row["covered"]
    # every task chose its own weight on its own whole training split: `privmtl mpmtl`'s run
    single = run_mpmtl(data="synthetic-lowrank", method="stl-l2", seed=0, tune="covered")
    assert single["tuned"] and row["nmse"] == pytest.approx(single["nmse"], rel=1e-12)


def test_mpmtl_non_private_choice_is_fitted_again_on_the_whole_split(tmp_path):
    _, saved, logged = _mpmtl(tmp_path, methods=["mtl-trace"], n_splits=3)
    row = saved["rows"][0]
    assert row["selection_method"] == "vote" and row["covered"] and row["epsilon"] is None
    keyed = [(json.loads(e["key"]), e["row"]) for e in logged if e["row"].get("method")]
    fit = [
        (k["select_inputs"]["point"], r) for k, r in keyed if "val_fraction" in k["select_inputs"]
    ]
    whole = [(k["select_inputs"]["point"], r) for k, r in keyed if k["select_inputs"].get("refit")]
    assert [p for p, _ in fit] == [p for p, _ in whole] and len(whole) > 1
    chosen = row["selection"]["chosen"]
    assert row["nmse"] == whole[chosen][1]["nmse"] != fit[chosen][1]["nmse"]


def test_validation_split_of_a_task_ignores_the_other_tasks():
    from privmtl.data.multitask import MultiTaskDataset
    from privmtl.experiments.mpmtl_sweep import _validation_split

    rng = np.random.default_rng(0)
    a = MultiTaskDataset(
        X=[rng.normal(size=(n, 3)) for n in (10, 7, 12)],
        y=[np.arange(n) * 1.0 for n in (10, 7, 12)],
    )
    b = MultiTaskDataset(
        X=[a.X[0], rng.normal(size=(30, 3)), a.X[2]], y=[a.y[0], np.zeros(30), a.y[2]]
    )
    fa, va = _validation_split(a, 0.2, 3)
    fb, vb = _validation_split(b, 0.2, 3)
    for i in (0, 2):
        np.testing.assert_array_equal(va[i][1], vb[i][1])
        np.testing.assert_array_equal(fa.y[i], fb.y[i])
    assert va[0][1].size == 2 and fa.y[0].size == 8


def test_mpmtl_pooled_selection_is_labelled_not_covered(tmp_path):
    res, saved, _ = _mpmtl(tmp_path, methods=["stl-l2"], select="pooled", n_splits=3)
    row = saved["rows"][0]
    assert row["covered"] is False and res["covered"] is False and saved["covered"] is False
    assert row["selection_method"] == "pooled"
    assert any("cross-validation" in r for r in row["guarantee"]["not_covered"])
    table = list(csv.DictReader(io.StringIO((tmp_path / "mpmtl_sweep.csv").read_text())))
    assert table[0]["covered"] == "False" and table[0]["selection_method"] == "pooled"


def test_mpmtl_no_tuning_is_covered_without_selection(tmp_path):
    _, saved, _ = _mpmtl(tmp_path, methods=["lowrank"], tune_mode="none")
    row = saved["rows"][0]
    assert row["covered"] is True and row["selection_method"] == "none"
    assert row["epsilon"] == row["training_epsilon"]


@pytest.mark.parametrize("select", ["vote", "client", "pooled"])
def test_one_candidate_is_no_selection(select):
    ev = [{"type": "gaussian", "noise_multiplier": 2.0}]
    sel = select_candidates(
        select=select,
        scores=np.ones((4, 1)),
        pooled=[0.5],
        events=[ev],
        target_epsilon=1.0,
        delta=1e-5,
        accountant="rdp",
        relation="add-remove",
        noise_source="seeded",
        seed=0,
    )
    assert sel["method"] == "none" and sel["covered"] and sel["chosen"] == 0
    assert sel["vote"] is None
    assert sel["epsilon"] == pytest.approx(compute_epsilon(dpe.GaussianDpEvent(2.0), delta=1e-5))


def test_summary_never_claims_coverage_a_row_does_not_state():
    from privmtl.experiments.sweep import aggregate, selection_footnote

    rows = [
        {"method": "a", "target_epsilon": 1.0, "value": 0.5, "epsilon": 1.0, "covered": True},
        {"method": "b", "target_epsilon": 1.0, "value": 0.5, "epsilon": 1.0},
        {"method": "c", "target_epsilon": 1.0, "value": 0.5, "epsilon": 1.0,
         "guarantee": {"covered": False}},
    ]  # fmt: skip
    assert [s["covered"] for s in aggregate(rows)] == [True, None, False]
    assert "NOT covered" in selection_footnote(rows)
    assert "not stated" in selection_footnote(rows[:2])


def test_mpmtl_per_task_choice_of_a_private_method_composes_the_candidates(tmp_path):
    from privmtl.privacy.accounting import event_from_dict

    _, saved, logged = _mpmtl_two(tmp_path, methods=["lowrank"], select="client")
    row = saved["rows"][0]
    assert row["selection_method"] == "client" and row["covered"] and row["params"] is None
    assert row["selection"]["vote"] is None
    events = [
        event_from_dict(ev)
        for e in logged
        if e["row"].get("method") == "lowrank"
        for ev in e["row"]["release_events"]
    ]
    expected = compute_epsilon(dpe.ComposedDpEvent(events), delta=row["delta"])
    assert row["epsilon"] == pytest.approx(expected, rel=1e-9)
    assert row["epsilon"] == pytest.approx(1.0, rel=1e-6)  # the candidates share the target
    assert not any('"mpmtl-selection"' in e["key"] for e in logged)  # no vote was released


def test_the_sweep_module_the_cli_imports_at_start_up_loads_no_torch():
    """The selection, which needs the privacy package, is a module of its own."""
    code = "import sys, privmtl.experiments.sweep; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
