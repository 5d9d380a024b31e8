"""``run_pmtl`` finishes its clients in one pass: the trained and final models of every client are
read a block at a time (federated.client_models), never stacked for the whole population, and
the run's numbers and saved models are those of the pass."""

from __future__ import annotations

import hashlib

import pytest
import torch

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
    assert out["test_accuracy"] == 0.6433566433566433
    assert out["mean_client_accuracy"] == 0.35439951130740605
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


# Numbers recorded from each run with the whole population finished as one block (the default
# block is larger than these 12 clients): accuracies, the grid's choice counts, digests of the
# per-client rows and of the saved personalized models (sha256 of each tensor's bytes).
GRIDS = {
    "mr-grid": (
        {"finetune": "mr", "finetune_lrs": [0.03, 0.1], "finetune_lams": [0.01, 1.0]},
        (0.5944055944055944, 0.6388888888888888, 0.32335467894678416),
        [7, 1, 3, 1],
        "ec197106a2fa2886",
        ("0c76eab63a7c337a", "c83b2f64e7448f9b"),
    ),
    "vanilla-grid": (
        {"finetune": "vanilla", "finetune_lrs": [0.01, 0.3]},
        (0.5454545454545454, 0.5648148148148148, 0.30938673899200214),
        [10, 2],
        "dd75bcb1728f5dbf",
        ("2924ee5dfa3f6db2", "41532131359fa558"),
    ),
    "billboard-client": (
        {"finetune": "vanilla", "finetune_start": "billboard", "finetune_epochs": [1, 3],
         "finetune_lrs": [0.3, 3.0], "finetune_select": "client"},
        (0.5874125874125874, 0.6296296296296297, 0.234727662688189),
        [1, 0, 2, 9],
        "b0476bd1847d7097",
        ("68f82ce3f2f45a80", "7d015ec2d8834aa6"),
    ),
    "billboard-pooled": (
        {"finetune": "vanilla", "finetune_start": "billboard", "finetune_epochs": [1, 3],
         "finetune_lrs": [0.3, 3.0], "finetune_select": "pooled"},
        (0.583916083916084, 0.6018518518518519, 0.307707460667987),
        [0, 0, 12, 0],
        "e889956707077ba1",
        ("b387adb3574f176d", "c0cd99c1009d8745"),
    ),
    "extra-grids": (
        {"finetune": "vanilla", "extra_finetunes": ["mr", "ewc"], "finetune_lrs": [0.03, 0.1],
         "finetune_lams": [0.1, 1.0]},
        (0.5804195804195804, 0.6296296296296297, 0.31413418452892133),
        [9, 3],
        "3370012e8ebffea7",
        ("9ed3330f72f68706", "8687513ef33e7be0"),
    ),
}  # fmt: skip
EXTRA_TEST = {"mr": 0.5594405594405595, "ewc": 0.5734265734265734}


@pytest.mark.parametrize("case", list(GRIDS))
def test_grids_and_the_billboard_start_go_a_block_at_a_time(case, tmp_path, monkeypatch):
    """The fine-tuning grids and the start from the billboard finish in blocks of 4 of the 12
    clients, never stacking every client's model, with the numbers, rows and saved models the
    whole population finished at once gave."""
    from privmtl.federated.client_models import SpilledModels
    from privmtl.federated.end_of_run import finish, local, trained_run

    kw, (test, val, mean), counts, rows, models = GRIDS[case]
    options, train_local = trained_run.FinishOptions, local.train_local
    monkeypatch.setattr(
        trained_run, "FinishOptions", lambda *a, **k: options(*a, **{**k, "block": 4})
    )
    monkeypatch.setattr(local, "train_local", lambda *a, **k: train_local(*a, **{**k, "block": 4}))
    blocks: list[int] = []
    append = SpilledModels.append
    monkeypatch.setattr(
        SpilledModels, "append", lambda self, pos, *a: (blocks.append(len(pos)), append(self, pos, *a))
    )  # fmt: skip
    monkeypatch.setattr(finish, "finish_clients", lambda *a, **k: pytest.fail("assembled"))
    monkeypatch.setattr(ClientModels, "_stack", _no_stack)
    out = run_pmtl(
        **RUN, **SETTINGS, show_progress=False, threads=1, save_models=tmp_path / "models",
        per_client=tmp_path / "clients.csv", **kw,
    )  # fmt: skip
    assert blocks == [4, 4, 4]  # the final models, written a block at a time
    assert (out["test_accuracy"], out["val_accuracy"], out["mean_client_accuracy"]) == (
        test, val, mean
    )  # fmt: skip
    assert out["finetune_selection"]["choice_counts"] == counts
    if "extra_finetunes" in kw:
        assert {n: r["test_accuracy"] for n, r in out["finetune_results"].items()} == EXTRA_TEST
    digest = hashlib.sha256((tmp_path / "clients.csv").read_bytes()).hexdigest()
    assert digest[:16] == rows
    monkeypatch.undo()
    saved = torch.load(tmp_path / "models" / "personalized.pt")
    got = [hashlib.sha256(saved[n].numpy().tobytes()).hexdigest()[:16] for n in saved]
    assert tuple(got) == models
    assert evaluate_saved(tmp_path / "models")["test_accuracy"] == test
