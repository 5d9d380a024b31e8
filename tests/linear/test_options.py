"""The MP-MTL estimators' grouped parameters (``privacy``, ``refit``, ``execution``): the
scikit-learn contract with typed groups, the refusal of a grouped setting given by its own name,
the run's flat settings gathered by ``LinearMethod.make``, and the checkpoint identity kept."""

from __future__ import annotations

import dataclasses
import inspect
import json

import numpy as np
import pytest
from sklearn.base import clone

from privmtl.exceptions import InvalidParameterError
from privmtl.linear.methods import GroupSparse, LowRank, LowRankSparse, grouped_params
from privmtl.linear.mpmtl import MPMTLGroupSparse, MPMTLLowRank, MPMTLLowRankSparse
from privmtl.linear.options import (
    MPMTL_PARAMETERS,
    MPMTLExecution,
    MPMTLPrivacy,
    MPMTLRefit,
)

ESTIMATORS = (MPMTLLowRank, MPMTLGroupSparse, MPMTLLowRankSparse)


def _tasks(m: int = 6, d: int = 4, n: int = 12):
    rng = np.random.default_rng(0)
    Xs = [rng.standard_normal((n, d)) for _ in range(m)]
    Xs = [x / np.linalg.norm(x, axis=1, keepdims=True) for x in Xs]
    w = rng.standard_normal(d)
    return Xs, [x @ w + 0.1 * rng.standard_normal(n) for x in Xs]


def _fields(group: type) -> list[str]:
    return [f.name for f in dataclasses.fields(group)]


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_the_estimators_take_at_most_25_keyword_only_parameters(cls):
    sig = inspect.signature(cls.__init__)
    named = [p for p in sig.parameters.values() if p.name != "self" and p.kind != p.VAR_KEYWORD]
    assert len(named) + 1 <= 25  # self included, as tests/test_code_size.py counts
    assert all(p.kind == p.KEYWORD_ONLY for p in named)
    for name in cls._param_groups:
        assert sig.parameters[name].default is None


@pytest.mark.parametrize(
    ("cls", "group", "name"),
    [
        (cls, name, field)
        for cls in ESTIMATORS
        for name, group in cls._param_groups.items()
        for field in _fields(group)
    ],
)
def test_a_grouped_setting_by_its_own_name_is_refused_naming_its_group(cls, group, name):
    kind = cls._param_groups[group].__name__
    with pytest.raises(InvalidParameterError) as err:
        cls(**{name: 0.5})
    msg = str(err.value)
    assert f"The '{name}' parameter of {cls.__name__}" in msg
    assert f"'{group}' parameter: pass {group}={kind}({name}=0.5)" in msg
    assert msg.endswith(f"got {name}=0.5.")


def test_an_unknown_keyword_is_a_type_error_and_the_sparse_estimator_has_no_refit():
    with pytest.raises(TypeError, match="unexpected keyword argument 'lamb'"):
        MPMTLLowRank(lamb=1.0)
    with pytest.raises(TypeError, match="'eigen_floor'"):
        MPMTLLowRankSparse(eigen_floor=0.0)
    with pytest.raises(TypeError, match="'refit'"):
        MPMTLLowRankSparse(refit=MPMTLRefit())


def test_clone_get_params_and_set_params_round_trip_the_groups():
    privacy = MPMTLPrivacy(relation="replace-one", budget_epsilon=2.0)
    refit = MPMTLRefit(eigen_floor=0.5, refit_power=1.0)
    est = MPMTLLowRank(epsilon=1.0, privacy=privacy, refit=refit)
    params = est.get_params()
    assert params["privacy"] is privacy and params["refit"] is refit and params["execution"] is None
    again = clone(est)
    assert again.get_params()["privacy"] == privacy and again.get_params()["refit"] == refit
    other = MPMTLPrivacy(accountant="pld")
    assert est.set_params(privacy=other, execution=MPMTLExecution(checkpoint_every=3)) is est
    assert est.privacy is other and est.execution.checkpoint_every == 3
    assert MPMTLLowRank(**est.get_params()).get_params() == est.get_params()
    with pytest.raises(ValueError, match="relation"):
        est.set_params(relation="add-remove")  # scikit-learn's own refusal of an unknown name


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("privacy", {"relation": "add-remove"}, r"'privacy' parameter must be a MPMTLPrivacy"),
        ("refit", MPMTLPrivacy(), r"'refit' parameter must be a MPMTLRefit"),
        ("privacy", MPMTLPrivacy(relation="neighbour"), r"'relation' parameter.*'neighbour'"),
        ("privacy", MPMTLPrivacy(instance_epsilon=0.0), r"'instance_epsilon'.*got 0"),
        ("refit", MPMTLRefit(vote_share=1.0), r"'vote_share' parameter.*\(0, 1\).*got 1"),
        ("refit", MPMTLRefit(floor_grid=(1.0, 0.5)), "floor_grid"),
        ("execution", MPMTLExecution(checkpoint_every=0), r"'checkpoint_every'.*got 0"),
        ("execution", MPMTLExecution(resume="yes"), r"'resume' parameter must be a bool"),
        ("execution", MPMTLExecution(callback=3), r"'callback' parameter must be callable"),
        ("execution", MPMTLExecution(save_models="models"), r"'save_models' field.*run_mpmtl"),
    ],
)
def test_the_groups_are_checked_at_fit_naming_the_field(name, value, match):
    Xs, ys = _tasks()
    est = MPMTLLowRank(epsilon=1.0, **{name: value})  # __init__ only stores
    assert getattr(est, name) is value
    with pytest.raises(InvalidParameterError, match=match):
        est.fit(Xs, ys)


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_groups_at_their_defaults_fit_as_no_groups(cls):
    Xs, ys = _tasks()
    kw = {"epsilon": 1.0, "noise_source": "seeded", "random_state": 0, "iterations": 3}
    groups = {name: group() for name, group in cls._param_groups.items()}
    a = cls(**kw).fit(Xs, ys)
    b = cls(**kw, **groups).fit(Xs, ys)
    np.testing.assert_array_equal(a.coef_, b.coef_)
    assert a.privacy_.epsilon == b.privacy_.epsilon


def test_a_run_hands_grouped_settings_by_their_own_names():
    """``LinearMethod.make`` (the run, the tuning, ``extra_params``) gathers the flat names into
    their groups, on top of a group given; the estimator then fits as if built with the groups."""
    flat = {"relation": "replace-one", "eigen_floor": 0.0, "checkpoint_every": 2}
    est = LowRank.make(epsilon=1.0, privacy=MPMTLPrivacy(budget_epsilon=3.0), **flat)
    assert est.privacy == MPMTLPrivacy(relation="replace-one", budget_epsilon=3.0)
    assert est.refit == MPMTLRefit(eigen_floor=0.0)
    assert est.execution == MPMTLExecution(checkpoint_every=2)
    assert grouped_params(MPMTLLowRank, {"lam": 1.0}) == {"lam": 1.0}
    assert {"relation", "eigen_floor", "callback", "privacy", "lam"} <= set(LowRank.parameters())
    assert "eigen_floor" not in LowRankSparse.parameters()  # it has no refit
    Xs, ys = _tasks()
    kw = {"epsilon": 1.0, "noise_source": "seeded", "random_state": 0}
    a = GroupSparse.make(**kw, relation="replace-one", refit_power=1.0).fit(Xs, ys)
    b = MPMTLGroupSparse(
        **kw, privacy=MPMTLPrivacy(relation="replace-one"), refit=MPMTLRefit(refit_power=1.0)
    ).fit(Xs, ys)
    np.testing.assert_array_equal(a.coef_, b.coef_)
    assert a.privacy_.relation == b.privacy_.relation == "replace-one"


def test_run_mpmtl_keeps_its_execution_keywords():
    """``run_mpmtl`` takes ``checkpoint_dir``, ``resume`` and ``save_models`` of the execution
    part; its checkpoint interval stays the spec's, and a callback is the estimator's alone."""
    from privmtl.linear.spec import MPMTLSpec

    execution = {k for k, v in MPMTL_PARAMETERS.items() if v is MPMTLExecution}
    assert execution == {"checkpoint_dir", "resume", "save_models"}
    assert MPMTL_PARAMETERS["checkpoint_every"] is MPMTLSpec
    assert "callback" not in MPMTL_PARAMETERS


def test_a_checkpoint_identifies_the_run_by_every_settings_own_name(tmp_path):
    """The checkpoint's configuration names every setting as before the grouping (the literal
    below is what a checkpoint of the same fit held then), so an older checkpoint resumes."""
    Xs, ys = _tasks()
    est = MPMTLLowRank(
        epsilon=1.0,
        noise_source="seeded",
        random_state=0,
        execution=MPMTLExecution(checkpoint_dir=tmp_path / "a", checkpoint_every=2),
    ).fit(Xs, ys)
    config = json.loads((tmp_path / "a" / "manifest.json").read_text())["config"]
    params = {k: v for k, v in config.items() if k.startswith("param.")}
    assert params == {
        "param.Q": None, "param.accelerate": True, "param.accountant": None,
        "param.allocation": "power", "param.alpha": None, "param.clip": 1.0,
        "param.covariance": "WWt", "param.delta": None, "param.eigen_fix": "denoise",
        "param.eigen_floor": "vote", "param.epsilon": 1.0,
        "param.floor_grid": "array[4]:sha256:839d3be6530684a2", "param.init": "stl",
        "param.init_alpha": "cv", "param.instance_epsilon": None, "param.iterations": 1,
        "param.lam": 1.0, "param.loss": "squared", "param.mu": 0.0, "param.noise": "gaussian",
        "param.noise_source": "seeded", "param.random_state": 0, "param.refit_floor": 0.001,
        "param.refit_lam": "cv", "param.refit_power": "auto", "param.relation": "add-remove",
        "param.step_size": None, "param.vote_share": 0.05,
    }  # fmt: skip
    # a grouped setting is part of the identity under its own name: another relation is refused
    from privmtl.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match=r"param\.relation"):
        MPMTLLowRank(
            epsilon=1.0,
            noise_source="seeded",
            random_state=0,
            privacy=MPMTLPrivacy(relation="replace-one"),
            execution=MPMTLExecution(checkpoint_dir=tmp_path / "a", resume=True),
        ).fit(Xs, ys)
    same = MPMTLLowRank(
        epsilon=1.0,
        noise_source="seeded",
        random_state=0,
        execution=MPMTLExecution(checkpoint_dir=tmp_path / "a", resume=True),
    ).fit(Xs, ys)
    np.testing.assert_array_equal(same.coef_, est.coef_)
