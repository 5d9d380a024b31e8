"""``run_mpmtl`` is load → fit → finish → report: the steps composed by hand are the run, and a
seeded run's numbers stay what they were before the run was split into steps."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from privmtl.exceptions import InvalidParameterError
from privmtl.experiments import mpmtl
from privmtl.experiments.mpmtl import (
    DataRequest,
    FittedRun,
    LoadedData,
    run_mpmtl,
)
from privmtl.linear.spec import MPMTLSpec


def _table(path):
    rng = np.random.default_rng(0)
    frames = []
    for t in range(6):
        w = rng.normal(size=3)
        x = rng.normal(size=(30, 3))
        f = pd.DataFrame(np.round(x, 4), columns=["a", "b", "c"])
        f.insert(0, "task", f"t{t}")
        f["y"] = np.round(x @ w + 100 + rng.normal(size=30), 4)
        frames.append(f)
    pd.concat(frames, ignore_index=True).to_csv(path, index=False)
    return path


def _without_seconds(out):
    return {k: v for k, v in out.items() if k not in ("seconds", "phases")}


@pytest.mark.parametrize(
    ("settings", "request_kw"),
    [
        (dict(method="lowrank", epsilon=2.0, noise_source="seeded"), dict(data="table")),
        (dict(method="stl-l2", tune="covered"), dict(data="table", normalize="unit-norm")),
        (dict(method="dp-aggr", epsilon=1.0), dict(data="synthetic-lowrank")),
    ],
)
def test_the_steps_composed_by_hand_are_the_run(tmp_path, settings, request_kw):
    path = _table(tmp_path / "t.csv")
    req = DataRequest(**request_kw, data_path=path if request_kw["data"] == "table" else None)
    spec = MPMTLSpec(**settings)
    durability = mpmtl._durability(spec, None, False)
    loaded = mpmtl._load(spec, req)
    assert isinstance(loaded, LoadedData)
    fitted = mpmtl._fit(spec, loaded, durability)
    assert isinstance(fitted, FittedRun)
    finished = mpmtl._finish(spec, loaded, fitted)
    by_hand = mpmtl._report(spec, loaded, fitted, finished, durability)
    run = run_mpmtl(data=req.data, data_path=req.data_path, normalize=req.normalize, **settings)
    assert by_hand == _without_seconds(run)
    assert run[finished.metric] == finished.value


def test_a_seeded_run_keeps_its_numbers(tmp_path):
    """Pinned from the run before it was split into steps (seeded noise, a user's table)."""
    path = _table(tmp_path / "t.csv")
    out = run_mpmtl(
        data="table", data_path=path, method="lowrank", epsilon=2.0, noise_source="seeded",
        save_models=tmp_path / "models",
    )  # fmt: skip
    assert out["nmse"] == pytest.approx(0.4924810446614083, rel=1e-9)
    assert out["epsilon"] <= 2.0 and out["covered"] is True
    meta = json.loads((tmp_path / "models" / "model.json").read_text())
    assert meta["data"]["target_offsets"] == out["target_offsets"]
    assert meta["data"]["scaling"] == out["scaling"] == "per-task"
    assert meta["data"]["feature_columns"] == ["a", "b", "c"]
    assert meta["data"]["data_path"] == str(path.resolve())
    # the saved parameters are the run's settings by their own names, not the estimator's
    # grouped parameters: a models folder reads the same whichever way the estimator groups them
    assert {"relation", "accountant", "eigen_floor", "refit_power"} <= set(meta["params"])
    assert not {"privacy", "refit", "execution"} & set(meta["params"])


def test_the_durability_settings_are_checked_before_any_data_is_read(tmp_path):
    with pytest.raises(InvalidParameterError, match="'resume' parameter needs a checkpoint_dir"):
        run_mpmtl(data="table", method="lowrank", resume=True)  # no data_path: not read
    with pytest.raises(InvalidParameterError, match="checkpoint/budget parameters apply"):
        run_mpmtl(data="table", method="stl-l2", budget_epsilon=1.0)


def test_a_spec_and_settings_run_as_the_same_keywords(tmp_path):
    """``run_mpmtl(spec, **settings)``: the spec's settings with the keywords replacing them."""
    path = _table(tmp_path / "t.csv")
    spec = MPMTLSpec(method="lowrank", epsilon=0.5, noise_source="seeded", iterations=5)
    from_spec = run_mpmtl(spec, data="table", data_path=path, epsilon=2.0)
    by_keywords = run_mpmtl(
        data="table", data_path=path, method="lowrank", epsilon=2.0, noise_source="seeded",
        iterations=5,
    )  # fmt: skip
    assert _without_seconds(from_spec) == _without_seconds(by_keywords)
    assert from_spec["epsilon"] == pytest.approx(2.0)  # the keyword replaced the spec's 0.5


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        (dict(data="table", methd="lowrank"), "Invalid parameter 'methd' for run_mpmtl"),
        (dict(method="lowrank"), "The 'data' parameter of run_mpmtl"),
    ],
)
def test_an_unknown_keyword_or_no_data_is_refused_naming_it(settings, words):
    with pytest.raises(InvalidParameterError, match=words):
        run_mpmtl(**settings)


def test_a_spec_of_the_other_family_is_refused():
    with pytest.raises(InvalidParameterError, match="must be an MPMTLSpec"):
        run_mpmtl({"method": "lowrank"}, data="table")  # type: ignore[arg-type]
