"""``run_pmtl`` finishes its clients in one pass: the trained and final models of every client are
read a block at a time (federated.client_models), never stacked for the whole population, and
the run's numbers and saved models are those of the pass."""

from __future__ import annotations

import pytest

from privmtl.experiments.pmtl import evaluate_saved, run_pmtl
from privmtl.federated.client_models import ClientModels

RUN = {"data": "synthetic", "num_clients": 12, "model": "logreg", "rounds": 3, "seed": 0}
SETTINGS = {"noise_source": "seeded", "epsilon": 2.0, "clients_per_round": 6}


def _no_stack(self):
    pytest.fail(f"{self!r} stacked every client's model")


def test_the_run_never_stacks_every_client_model(tmp_path, monkeypatch):
    monkeypatch.setattr(ClientModels, "_stack", _no_stack)
    out = run_pmtl(
        **RUN, **SETTINGS, show_progress=False, threads=1, save_models=tmp_path / "models",
        per_client=tmp_path / "clients.csv",
    )  # fmt: skip
    # the numbers pinned for this run in tests/experiments/test_pmtl_steps.py
    assert out["test_accuracy"] == 0.6503496503496503
    assert out["mean_client_accuracy"] == 0.36003944885523836
    monkeypatch.undo()
    again = evaluate_saved(tmp_path / "models")  # the saved final models are the ones scored
    assert again["test_accuracy"] == out["test_accuracy"]


def test_the_run_without_saving_keeps_no_final_model(monkeypatch):
    monkeypatch.setattr(ClientModels, "_stack", _no_stack)
    out = run_pmtl(**RUN, **SETTINGS, show_progress=False, threads=1, finetune_select="vote")
    assert out["finetune"] == "auto" and 0.0 < out["test_accuracy"] <= 1.0


@pytest.mark.parametrize("finetune", ["vanilla", "auto"])
def test_the_run_never_assembles_the_final_models(finetune, monkeypatch):
    """finish_clients stacks every client's final model: the run finishes with finish_pass."""
    from privmtl.federated.end_of_run import finish

    def assembled(*args, **kwargs):
        pytest.fail("finish_clients assembled every client's final model")

    monkeypatch.setattr(finish, "finish_clients", assembled)
    monkeypatch.setattr(ClientModels, "_stack", _no_stack)
    out = run_pmtl(
        **RUN, **SETTINGS, show_progress=False, threads=1, finetune=finetune,
        extra_finetunes=["mr"] if finetune == "vanilla" else [],
    )  # fmt: skip
    assert out["finetune"] == finetune and 0.0 < out["test_accuracy"] <= 1.0
