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
    assert out["test_accuracy"] == 0.6258741258741258
    assert out["mean_client_accuracy"] == 0.2405219049955892
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


# Numbers recorded from each run before its end of run went a block of clients at a time (the
# whole population at once then): accuracies, the grid's choice counts, digests of the
# per-client rows and of the saved personalized models (sha256 of each tensor's bytes).
GRIDS = {
    "mr-grid": (
        {"finetune": "mr", "finetune_lrs": [0.03, 0.1], "finetune_lams": [0.01, 1.0]},
        (0.4965034965034965, 0.5555555555555556, 0.281254746715273),
        [6, 2, 4, 0],
        "0960f4d8f93fdb3f",
        ("8e15a14ad3c605a8", "efd566155fbe8137"),
    ),
    "vanilla-grid": (
        {"finetune": "vanilla", "finetune_lrs": [0.01, 0.3]},
        (0.5244755244755245, 0.5833333333333334, 0.27898070496754707),
        [10, 2],
        "62a7077228836531",
        ("7c63aed35f19c562", "7175c8860a7370ef"),
    ),
    "billboard-client": (
        {"finetune": "vanilla", "finetune_start": "billboard", "finetune_epochs": [1, 3],
         "finetune_lrs": [0.3, 3.0], "finetune_select": "client"},
        (0.5629370629370629, 0.6759259259259259, 0.3130774926827558),
        [1, 0, 1, 10],
        "209b311bbb80ec77",
        ("15f50a4093df17d3", "68e860d9dac1a27a"),
    ),
    "billboard-pooled": (
        {"finetune": "vanilla", "finetune_start": "billboard", "finetune_epochs": [1, 3],
         "finetune_lrs": [0.3, 3.0], "finetune_select": "pooled"},
        (0.541958041958042, 0.6111111111111112, 0.11841174176700493),
        [0, 0, 12, 0],
        "ce5db0fccec9e188",
        ("42eb8a08fa5ed58b", "57f7efc5be1b83f8"),
    ),
    "extra-grids": (
        {"finetune": "vanilla", "extra_finetunes": ["mr", "ewc"], "finetune_lrs": [0.03, 0.1],
         "finetune_lams": [0.1, 1.0]},
        (0.5034965034965035, 0.5648148148148148, 0.28235123794334316),
        [8, 4],
        "8b9719ab3be2a575",
        ("ca075438b6130ef8", "bdd7d8640100f064"),
    ),
}  # fmt: skip
EXTRA_TEST = {"mr": 0.4125874125874126, "ewc": 0.47202797202797203}


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
