"""The MP-MTL protocol: ledger written ahead, secure/seeded noise, budget, checkpoint and resume
(including runs killed with SIGKILL), saved models."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from dp_accounting import dp_event as dpe

from privmtl.checkpoint import CheckpointError
from privmtl.exceptions import InvalidParameterError, PrivmtlWarning
from privmtl.linear import mpmtl as _mpmtl
from privmtl.linear.mpmtl import (
    CovarianceCurator,
    MPMTLExecution,
    MPMTLLowRankSparse,
    MPMTLPrivacy,
    MPMTLState,
)
from privmtl.privacy.accounting import event_from_dict
from privmtl.privacy.covariance import plan_covariance_releases
from privmtl.privacy.ledger import PrivacyLedger, reaccount
from privmtl.privacy.noise import NumpySeededNoise, SecureNoise

SRC = str(Path(__file__).resolve().parents[2] / "src")

# The paper's Algorithms 2/3 (zero start, T = 50 releases, projected output, shift fix): what the
# tests of this module check. The estimators' own defaults (STL start, one release, local refit
# with per-task weights) are tested in tests/linear/test_mpmtl_defaults.py.
PAPER_ALG = {
    "iterations": 50,
    "eigen_fix": "shift",
    "init": "zeros",
    "init_alpha": 1e-3,
    "refit_lam": None,
}


def MPMTLLowRank(**kw):
    return _mpmtl.MPMTLLowRank(**{**PAPER_ALG, **kw})


def MPMTLGroupSparse(**kw):
    return _mpmtl.MPMTLGroupSparse(**{**PAPER_ALG, **kw})


def make_tasks(m: int = 14, d: int = 6, n: int = 15, seed: int = 0):
    rng = np.random.default_rng(seed)
    W = 3.0 * rng.standard_normal((d, 2)) @ rng.standard_normal((2, m))
    Xs = [rng.standard_normal((n + i % 3, d)) for i in range(m)]
    Xs = [x / np.linalg.norm(x, axis=1, keepdims=True) for x in Xs]
    ys = [x @ W[:, i] + 0.1 * rng.standard_normal(x.shape[0]) for i, x in enumerate(Xs)]
    return Xs, ys


KW = {"lam": 0.05, "clip": 5.0, "iterations": 8, "epsilon": 1.0, "random_state": 3}


# ------------------------------------------------------------------------- ledger, write-ahead
def test_every_release_is_recorded_before_it_is_used(tmp_path):
    Xs, ys = make_tasks()
    seen = []

    def callback(stage, t):
        if stage == "recorded":  # the entry is on disk; the noise is not drawn yet
            lines = (tmp_path / "ck" / "ledger.jsonl").read_text().splitlines()
            seen.append((t, len(lines) - 1, json.loads(lines[-1])["release_id"]))

    est = MPMTLLowRank(
        **KW,
        noise_source="seeded",
        execution=MPMTLExecution(checkpoint_dir=tmp_path / "ck", callback=callback),
    ).fit(Xs, ys)
    assert seen == [(t, t + 1, f"covariance:{t}") for t in range(8)]
    records = est.ledger_.records
    z = est.privacy_.details["noise_multipliers"]
    assert [r["mechanism"] for r in records] == ["gaussian-covariance"] * 8
    for t, r in enumerate(records):
        assert event_from_dict(r["event"]) == dpe.GaussianDpEvent(z[t])
        assert r["params"]["noise_std"] == pytest.approx(est.epsilons_[t])
        assert r["round"] == t
    # the reported epsilon is the ledger's, and re-accounting the file gives it back
    assert est.privacy_.epsilon == est.ledger_.epsilon()
    assert est.privacy_.epsilon == pytest.approx(est.privacy_.details["planned_epsilon"], 1e-9)
    again = reaccount(tmp_path / "ck")
    assert again["epsilon"] == pytest.approx(est.privacy_.epsilon, rel=1e-12)
    assert again["releases"] == 8
    # independent oracle: composing the 8 Gaussian events at once
    from privmtl.privacy.accounting import compute_epsilon

    oracle = compute_epsilon(
        dpe.ComposedDpEvent([dpe.GaussianDpEvent(x) for x in z]),
        delta=est.delta_,
        accountant="rdp",
        relation="add-remove",
    )
    assert est.privacy_.epsilon == pytest.approx(oracle, rel=1e-9)


def test_wishart_releases_are_recorded_and_reported_honestly(tmp_path):
    Xs, ys = make_tasks()
    est = MPMTLLowRank(
        **{**KW, "iterations": 4},
        noise="wishart",
        noise_source="seeded",
        execution=MPMTLExecution(checkpoint_dir=tmp_path),
    ).fit(Xs, ys)
    assert [r["mechanism"] for r in est.ledger_.records] == ["wishart"] * 4
    claimed = [r["params"]["claimed_epsilon_t"] for r in est.ledger_.records]
    np.testing.assert_allclose(claimed, est.epsilons_)
    # no accountant can bound the Wishart step: the ledger says infinity, the guarantee is the
    # paper's claimed epsilon marked invalid, with the real delta
    assert math.isinf(est.ledger_.epsilon())
    assert reaccount(tmp_path)["epsilon"] is None
    g = est.privacy_
    assert not g.valid and g.delta >= 1 - math.exp(-sum(claimed)) - 1e-12
    assert any("Wishart" in n and "inf" in n for n in g.notes)
    with pytest.raises(InvalidParameterError, match="budget_epsilon"):
        MPMTLLowRank(**KW, noise="wishart", privacy=MPMTLPrivacy(budget_epsilon=5.0)).fit(Xs, ys)


# ------------------------------------------------------------------------------- noise source
def _last_release(noise_source):
    Xs, ys = make_tasks()
    est = MPMTLLowRank(**{**KW, "iterations": 2}, noise_source=noise_source).fit(Xs, ys)
    return est


def test_secure_runs_release_different_covariances_seeded_runs_the_same():
    a, b = _last_release("secure"), _last_release("secure")
    assert a.noise_source_ == "secure" and a.privacy_.noise_source == "secure"
    assert not np.array_equal(a.state_.last_release, b.state_.last_release)
    assert not np.array_equal(a.coef_, b.coef_)
    c, d = _last_release("seeded"), _last_release("seeded")
    np.testing.assert_array_equal(c.state_.last_release, d.state_.last_release)
    np.testing.assert_array_equal(c.coef_, d.coef_)
    assert c.privacy_.noise_source == "seeded" and "SEEDED" in c.privacy_.describe()
    assert MPMTLLowRank().get_params()["noise_source"] == "secure"  # the default


def test_secure_noise_has_the_planned_scale():
    """The secure source releases Sigma~ + E with E the planned symmetric Gaussian: the upper
    triangle of E / sigma_t is standard normal (chi-square bound on its sum of squares)."""
    sched = plan_covariance_releases(
        epsilon=1.0, delta=1e-4, iterations=3, clip=1.0, dim=40, eigen_fix="none"
    )
    cov = np.eye(40) * 0.3
    E = sched.noisy(1, cov, SecureNoise()) - cov
    np.testing.assert_array_equal(E, E.T)
    u = E[np.triu_indices(40)] / sched.per_release[1]
    k = u.size  # 820 entries: sum u^2 ~ chi2(k), mean k, sd sqrt(2k); 5 sd
    assert abs(float(np.sum(u**2)) - k) < 5 * math.sqrt(2 * k)
    assert abs(float(u.mean())) < 5 / math.sqrt(k)


def test_secure_instance_noise_radius_is_gamma():
    """Alg. 5 noise from the secure source: radius Gamma(d, scale) (mean d*scale, sd sqrt(d)*scale)."""
    from privmtl.linear.mpmtl import _l2_laplace

    d, scale, n = 5, 2.0, 20_000
    b = _l2_laplace(SecureNoise(), np.random.default_rng(0), d, scale, n)
    r = np.linalg.norm(b, axis=0)
    from scipy import stats

    assert abs(r.mean() - d * scale) < 5 * math.sqrt(d) * scale / math.sqrt(n)
    assert stats.kstest(r, stats.gamma(a=d, scale=scale).cdf).pvalue > 1e-4


def test_tuning_passes_the_noise_source_through():
    from privmtl.linear.selection import tune_method

    Xs, ys = make_tasks(m=10, n=20)
    grid = [{"clip_factor": [1.0], "lam_per_clip": [0.01, 0.1], "iterations": [3]}]

    def table(source):
        return tune_method(
            "lowrank", Xs, ys, grid=grid, random_state=0, epsilon=0.5, noise_source=source
        )[1]["mean_score"].to_numpy()

    np.testing.assert_array_equal(table("seeded"), table("seeded"))
    assert not np.array_equal(table("secure"), table("secure"))


# ------------------------------------------------------------------------------------ budget
def test_budget_stops_before_the_release_that_would_exceed_it(tmp_path):
    Xs, ys = make_tasks()
    kw = {**KW, "epsilon": 2.0, "iterations": 10, "noise_source": "seeded"}
    full = MPMTLLowRank(**kw).fit(Xs, ys)
    assert full.privacy_.epsilon == pytest.approx(2.0, rel=1e-6)
    with pytest.warns(PrivmtlWarning, match="stopped on the privacy budget") as caught:
        est = MPMTLLowRank(
            **kw,
            privacy=MPMTLPrivacy(budget_epsilon=1.0),
            execution=MPMTLExecution(checkpoint_dir=tmp_path),
        ).fit(Xs, ys)
    assert f"{est.n_iter_} of 10 iterations ran" in str(caught[0].message)
    assert est.stopped_on_budget_ and est.privacy_.epsilon <= 1.0
    t = est.n_iter_
    assert 0 < t < 10 and len(est.ledger_.records) == t
    # it stopped because the next release would have exceeded the budget
    assert (
        est.ledger_.epsilon_if(dpe.GaussianDpEvent(est.privacy_.details["noise_multipliers"][t]))
        > 1.0
    )
    assert any("stopped on budget" in n for n in est.privacy_.notes)
    # the model is the output rule on the state reached: the last projections W^(t)
    np.testing.assert_array_equal(est.coef_, est.state_.W_hat_prev)
    assert reaccount(tmp_path)["epsilon"] == pytest.approx(est.privacy_.epsilon, rel=1e-12)
    # a resumed run with a larger budget continues from the state reached
    more = MPMTLLowRank(
        **kw,
        privacy=MPMTLPrivacy(budget_epsilon=3.0),
        execution=MPMTLExecution(checkpoint_dir=tmp_path, resume=True),
    ).fit(Xs, ys)
    assert not more.stopped_on_budget_ and more.n_iter_ == 10
    np.testing.assert_array_equal(more.coef_, full.coef_)
    assert more.privacy_.epsilon == pytest.approx(full.privacy_.epsilon, rel=1e-12)


# -------------------------------------------------------------------------- checkpoint/resume
_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {src!r})
    sys.path.insert(0, {tests!r})
    from test_mpmtl_protocol import make_tasks, estimator
    ckpt, stage, at, source, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]

    def callback(s, t):
        if s == stage and t == at:
            os.kill(os.getpid(), signal.SIGKILL)

    Xs, ys = make_tasks()
    estimator(name, source, checkpoint_dir=ckpt, checkpoint_every=3, callback=callback).fit(Xs, ys)
    """
)


def estimator(name: str, source: str, **execution):
    """The estimator ``name`` with seeded or secure noise; ``execution``: its
    :class:`MPMTLExecution`'s fields (checkpoint directory, resume, callback)."""
    kw = {"noise_source": source, "execution": MPMTLExecution(**execution)}
    if name == "lowrank":
        return MPMTLLowRank(**KW, **kw)
    if name == "groupsparse-refit":
        return MPMTLGroupSparse(**{**KW, "lam": 0.3}, refit_lam=0.1, **kw)
    return MPMTLLowRankSparse(
        **KW, lam_sparse=0.02, mu=1e-2, privacy=MPMTLPrivacy(instance_epsilon=3.0), **kw
    )


def _kill(tmp_path: Path, ckpt: Path, stage: str, at: int, source: str, name: str) -> None:
    script = _CHILD.format(src=SRC, tests=str(Path(__file__).parent))
    proc = subprocess.run(
        [sys.executable, "-c", script, str(ckpt), stage, str(at), source, name],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr


@pytest.mark.parametrize(
    ("name", "stage", "at", "resumed_from"),
    [
        ("lowrank", "recorded", 4, 3),  # ledger entry written, release not yet used
        ("lowrank", "iteration", 4, 3),  # mid-run, between two checkpoints (every 3)
        ("lowrank-sparse", "recorded", 0, 0),  # before the first release was used
        ("groupsparse-refit", "iteration", 7, 6),  # after the last release, before the final save
    ],
)
def test_sigkill_then_resume_gives_the_uninterrupted_run_in_seeded_mode(
    tmp_path, name, stage, at, resumed_from
):
    Xs, ys = make_tasks()
    ref = estimator(name, "seeded", checkpoint_dir=tmp_path / "ref").fit(Xs, ys)
    ckpt = tmp_path / "ck"
    _kill(tmp_path, ckpt, stage, at, "seeded", name)
    assert (ckpt / "ledger.jsonl").is_file()
    res = estimator(name, "seeded", checkpoint_dir=ckpt, resume=True).fit(Xs, ys)
    assert res.resumed_from_ == resumed_from
    np.testing.assert_array_equal(res.coef_, ref.coef_)
    np.testing.assert_array_equal(res.noise_to_signal_, ref.noise_to_signal_)
    assert res.privacy_.epsilon == ref.privacy_.epsilon
    # never charged twice: one ledger entry per release, the same file as the uninterrupted run's
    assert [r["release_id"] for r in res.ledger_.records] == [f"covariance:{t}" for t in range(8)]
    assert reaccount(ckpt)["per_release"] == reaccount(tmp_path / "ref")["per_release"]


def test_sigkill_then_resume_in_secure_mode_charges_every_release(tmp_path):
    Xs, ys = make_tasks()
    ref = estimator("lowrank", "seeded").fit(Xs, ys)
    ckpt = tmp_path / "ck"
    _kill(tmp_path, ckpt, "recorded", 4, "secure", "lowrank")
    res = estimator("lowrank", "secure", checkpoint_dir=ckpt, resume=True).fit(Xs, ys)
    assert res.resumed_from_ == 3 and res.n_iter_ == 8
    # releases 3 and 4 were recorded by the killed run (4 maybe never left: charged anyway) and
    # again, with fresh noise, by the resumed one: 10 entries, epsilon the ledger's, above the
    # 8 releases' epsilon
    ids = [r["release_id"] for r in res.ledger_.records]
    assert len(ids) == 10 and ids.count("covariance:3") == 2 and ids.count("covariance:4") == 2
    assert res.privacy_.epsilon == res.ledger_.epsilon() == reaccount(ckpt)["epsilon"]
    assert res.privacy_.epsilon > ref.privacy_.epsilon
    assert any("charged" in n for n in res.privacy_.notes)
    # nothing of the secure source is in the checkpoint
    from privmtl.checkpoint import load_checkpoint
    from privmtl.linear.mpmtl import CHECKPOINT_KIND

    manifest = json.loads((ckpt / "manifest.json").read_text())
    state, _ = load_checkpoint(ckpt, kind=CHECKPOINT_KIND, config=manifest["config"])
    assert json.loads(state["noise"]) == {"kind": "secure"}
    assert manifest["noise_source"] == "secure"


def test_resume_refuses_another_configuration_or_a_corrupt_file(tmp_path):
    Xs, ys = make_tasks()
    MPMTLLowRank(
        **KW, noise_source="seeded", execution=MPMTLExecution(checkpoint_dir=tmp_path)
    ).fit(Xs, ys)
    with pytest.raises(InvalidParameterError, match="holds a run already"):
        MPMTLLowRank(
            **KW, noise_source="seeded", execution=MPMTLExecution(checkpoint_dir=tmp_path)
        ).fit(Xs, ys)
    with pytest.raises(CheckpointError, match=r"param\.lam: 0\.05 \(checkpoint\) vs 0\.1"):
        MPMTLLowRank(
            **{**KW, "lam": 0.1},
            noise_source="seeded",
            execution=MPMTLExecution(checkpoint_dir=tmp_path, resume=True),
        ).fit(Xs, ys)
    with pytest.raises(CheckpointError, match="noise_source"):
        MPMTLLowRank(**KW, execution=MPMTLExecution(checkpoint_dir=tmp_path, resume=True)).fit(
            Xs, ys
        )
    Xs2 = [x.copy() for x in Xs]
    Xs2[0][0, 0] += 1e-3
    with pytest.raises(CheckpointError, match="data_sha256"):
        MPMTLLowRank(
            **KW,
            noise_source="seeded",
            execution=MPMTLExecution(checkpoint_dir=tmp_path, resume=True),
        ).fit(Xs2, ys)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    state = tmp_path / manifest["state_file"]
    state.write_bytes(state.read_bytes()[:-5] + b"xxxxx")
    with pytest.raises(CheckpointError, match="corrupt"):
        MPMTLLowRank(
            **KW,
            noise_source="seeded",
            execution=MPMTLExecution(checkpoint_dir=tmp_path, resume=True),
        ).fit(Xs, ys)
    manifest["version"] = 99
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="version 99"):
        MPMTLLowRank(
            **KW,
            noise_source="seeded",
            execution=MPMTLExecution(checkpoint_dir=tmp_path, resume=True),
        ).fit(Xs, ys)
    with pytest.raises(InvalidParameterError, match="resume"):
        MPMTLLowRank(execution=MPMTLExecution(resume=True)).fit(Xs, ys)


def test_state_round_trip_and_curator_replay():
    """The state survives to_dict/from_dict bit for bit; a seeded replay of a recorded release is
    not charged again, a secure one is."""
    rng = np.random.default_rng(0)
    s = MPMTLState(
        iteration=3,
        W=rng.standard_normal((4, 5)),
        W_hat_prev=rng.standard_normal((4, 5)),
        Q=None,
        Q_hat_prev=None,
        noise_to_signal=rng.random(6),
        last_release=rng.standard_normal((4, 4)),
        last_shift=0.25,
    )
    back = MPMTLState.from_dict(s.to_dict())
    for name in ("W", "W_hat_prev", "noise_to_signal", "last_release"):
        np.testing.assert_array_equal(getattr(back, name), getattr(s, name))
    assert back.Q is None and back.iteration == 3 and back.last_shift == 0.25
    sched = plan_covariance_releases(epsilon=1.0, delta=1e-4, iterations=3, clip=1.0, dim=4)
    W = rng.standard_normal((4, 5))
    for source, entries in (("seeded", 1), ("secure", 2)):
        ledger = PrivacyLedger(delta=1e-4)
        noise = NumpySeededNoise(np.random.default_rng(1)) if source == "seeded" else SecureNoise()
        cur = CovarianceCurator(
            sched, covariance="WWt", clip=1.0, noise=noise, ledger=ledger, eigen_fix="shift"
        )
        cur.release(0, W)
        cur.release(0, W)
        assert len(ledger.records) == entries


# ------------------------------------------------------------------------------ saved models
def test_save_models_then_evaluate_reproduces_the_run(tmp_path):
    from privmtl.experiments.mpmtl import evaluate_saved, run_mpmtl

    out = run_mpmtl(
        data="synthetic-lowrank",
        method="lowrank",
        epsilon=1.0,
        iterations=5,
        tune=False,
        noise_source="seeded",
        save_models=tmp_path / "models",
    )
    # the format loads without privmtl: numpy + json
    meta = json.loads((tmp_path / "models" / "model.json").read_text())
    W = np.load(tmp_path / "models" / "coef.npy")
    assert meta["family"] == "mpmtl" and meta["format"] == "privmtl-models"
    assert list(W.shape) == meta["coef"]["shape"] == [out["n_features"], out["n_tasks"]]
    assert meta["guarantee"]["epsilon"] == out["epsilon"] and meta["noise_source"] == "seeded"
    again = evaluate_saved(tmp_path / "models")
    assert again["nmse"] == out["nmse"]
    assert again["noise_source"] == "seeded" and again["guarantee"] == out["guarantee"]


def test_resumed_run_reuses_the_checkpointed_tuning(tmp_path, monkeypatch):
    """Secure-noise tuning is not reproducible: a resumed run must continue the configuration
    tuned before (kept in checkpoint_dir/tuning.json), not tune again."""
    import privmtl.linear.selection as selection
    from privmtl.experiments.mpmtl import run_mpmtl

    calls = []

    def fake_tune(method, Xs, ys, **kw):
        calls.append(kw["noise_source"])
        return {"lam": 0.2, "clip": 2.0}, None

    monkeypatch.setattr(selection, "tune_method", fake_tune)
    kw = {
        "data": "synthetic-lowrank",
        "method": "lowrank",
        "epsilon": 1.0,
        "iterations": 4,
        "tune": "pooled",  # the default uses public hyper-parameters: nothing to tune
    }
    first = run_mpmtl(**kw, checkpoint_dir=tmp_path / "ck")
    assert calls == ["secure"]  # the tuning's fits use the run's noise source
    assert json.loads((tmp_path / "ck" / "tuning.json").read_text())["best"] == {
        "lam": 0.2,
        "clip": 2.0,
    }

    def no_tune(*a, **k):
        raise AssertionError("tuned again")

    monkeypatch.setattr(selection, "tune_method", no_tune)
    again = run_mpmtl(**kw, checkpoint_dir=tmp_path / "ck", resume=True)
    assert again["params"]["lam"] == 0.2 and again["params"]["clip"] == 2.0
    assert again["resumed_from"] == 4 and again["nmse"] == first["nmse"]
    assert again["epsilon"] == first["epsilon"]
