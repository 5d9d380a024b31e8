"""``run_pmtl`` is load → train → finish → report: the steps composed by hand are the run, and a
seeded run's numbers stay what they were before the run was split into steps."""

from __future__ import annotations

import json

import pytest

from privmtl.exceptions import InvalidParameterError
from privmtl.experiments import pmtl
from privmtl.experiments.pmtl import (
    DataRequest,
    Durability,
    FinishedRun,
    LoadedRun,
    TrainedRun,
    run_pmtl,
)
from privmtl.federated.spec import RunSpec

#: A small seeded run: synthetic data (12 clients), logreg, 3 rounds, seeded noise, one thread.
RUN = {"rounds": 3, "seed": 0, "noise_source": "seeded"}
DATA = {"data": "synthetic", "num_clients": 12, "model": "logreg"}
TIMINGS = ("seconds", "seconds_per_round", "data_seconds", "baseline_seconds", "phases")


def _without_timings(out):
    return {k: v for k, v in out.items() if k not in TIMINGS}


def _by_hand(settings, *, diagnostics=False, save_models=None):
    spec = RunSpec(**RUN, **settings)
    finishing = pmtl._finish_request(
        spec.finetune, epochs=1, lrs=None, lams=None, start="auto", select="client", extra=()
    )
    request = DataRequest(
        data=DATA["data"],
        data_path=None,
        model=DATA["model"],
        table={"client_column": None, "label_column": None, "feature_columns": None},
        num_clients=DATA["num_clients"],
        scaling="none",
    )
    durability = Durability(None, 1, False, None)
    loaded = pmtl._load(
        spec, spec.method, request, method_source=None, dataset=None, batched=True,
        progress=False, threads=1,
    )  # fmt: skip
    assert isinstance(loaded, LoadedRun)
    trained = pmtl._train(loaded, durability, "client")
    assert isinstance(trained, TrainedRun)
    finished = pmtl._finish(loaded, trained, finishing)
    assert isinstance(finished, FinishedRun)
    alone, scored = pmtl._baseline(loaded, trained, finished)
    alone["baseline_seconds"] = 0.0  # the run's timer measures it
    out = pmtl._report(loaded, durability, trained, finished, diagnostics=diagnostics)
    out.update(alone)
    if save_models is not None:
        rows = pmtl._client_rows(loaded, trained, finished, scored)
        out["models_dir"] = pmtl._save(save_models, loaded, trained, finished, out, rows)
    return out, finished


@pytest.mark.parametrize(
    ("settings", "diagnostics"),
    [
        ({"epsilon": 2.0, "clients_per_round": 6, "finetune": "none"}, True),
        ({"epsilon": 2.0, "clients_per_round": 6, "finetune": "auto"}, False),
        ({"method": "local-all", "finetune": "auto"}, False),
    ],
    ids=["pmtl-none", "pmtl-auto", "local-all-auto"],
)
def test_the_steps_composed_by_hand_are_the_run(settings, diagnostics):
    by_hand, finished = _by_hand(settings, diagnostics=diagnostics)
    run = run_pmtl(
        **DATA, **RUN, **settings, diagnostics=diagnostics, show_progress=False, threads=1
    )
    # the same keys in the same order; the run's own timer adds its phases last
    assert [*by_hand, "phases"] == list(run)
    assert _without_timings(by_hand) == _without_timings(run)
    if settings["finetune"] == "none":
        assert finished.parts == {} and finished.params is None and not finished.own_data
        assert "finetune" not in run and run["curator_diagnostics"]
        assert run["covered"] is False  # the diagnostics read un-noised updates
    else:
        assert run["finetune"] == "auto" and run["covered"] is True


def test_the_saved_models_of_the_steps_are_the_runs(tmp_path):
    settings = {"epsilon": 2.0, "clients_per_round": 6}
    _by_hand(settings, save_models=tmp_path / "hand")
    run_pmtl(
        **DATA, **RUN, **settings, show_progress=False, threads=1, save_models=tmp_path / "run"
    )
    hand, run = (json.loads((tmp_path / d / "model.json").read_text()) for d in ("hand", "run"))
    assert hand == run  # the same models, data record, guarantee and signature
    assert hand["finetuned"] is True and hand["data"]["num_clients"] == 12


def test_the_finish_settings_are_checked_before_any_data_is_read():
    with pytest.raises(InvalidParameterError, match=r"'finetune_epochs'.*got finetune_epochs=3"):
        pmtl._finish_request(
            "auto", epochs=3, lrs=None, lams=None, start="auto", select="client", extra=()
        )
    with pytest.raises(InvalidParameterError, match=r"'finetune_select'.*'everyone'"):
        run_pmtl(data="no-such-data", finetune="vanilla", finetune_select="everyone")


def test_a_seeded_run_keeps_its_numbers():
    """Pinned in tests/federated/test_spec.py (``BEFORE["defaults"]``) from the run before it was
    split into steps: every setting at its default but ε = 2 and 6 clients per round."""
    out = run_pmtl(**DATA, **RUN, epsilon=2.0, clients_per_round=6, show_progress=False, threads=1)
    expected = {
        "epsilon": 1.9999999999997666, "noise_std": 0.1951287707192182,
        "test_accuracy": 0.6433566433566433, "mean_client_accuracy": 0.35439951130740605,
        "val_accuracy": 0.7222222222222222, "global_test_accuracy": 0.045454545454545456,
        "personal_init": "model", "delta": 1e-05, "lam": 0.001,
    }  # fmt: skip
    assert {k: out[k] for k in expected} == expected
    assert out["finetune"] == "auto" and out["covered"] is True
