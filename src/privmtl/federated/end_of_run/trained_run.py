"""The end-of-run modes applied to a trained run (a :class:`~privmtl.federated.config.TrainResult`):
each function fine-tunes or chooses every client's final model and gives the entries the run's
result reports (``test_accuracy``, ``finetune_auto``, ``finetune_selection``, ...), with the final
parameters under ``_params``. :func:`~privmtl.experiments.pmtl.run_pmtl` calls them after
training; all of them are post-processing of the recorded releases."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from privmtl.data.federated import FederatedDataset
from privmtl.exceptions import InvalidParameterError, PrivacyBudgetError
from privmtl.federated.algorithms import Params
from privmtl.federated.blocks import end_of_run_block
from privmtl.federated.client_models import SpilledModels
from privmtl.federated.config import TrainResult
from privmtl.federated.end_of_run import finetune_selection
from privmtl.federated.end_of_run import local as end_of_run_local
from privmtl.federated.end_of_run.final_models import stack_trained
from privmtl.federated.end_of_run.finish import FinishOptions, finish_pass
from privmtl.federated.end_of_run.plan import (
    FINETUNE_NOTE,
    FINETUNE_VOTE_ID,
    FINETUNE_VOTE_STREAM,
    FINETUNE_VOTERS_STREAM,
    auto_info,
    auto_plan,
)
from privmtl.federated.report import released_dim
from privmtl.privacy.noise import make_noise_source
from privmtl.privacy.selection import VotePlan

__all__ = [
    "epochs_grid",
    "finetune_auto",
    "finetune_from_billboard",
    "finetune_trained",
    "voter_rng",
]


def epochs_grid(epochs: int | Sequence[int]) -> list[int]:
    values = [epochs] if isinstance(epochs, int) else list(epochs)
    if not values or any(isinstance(e, bool) or not isinstance(e, int) or e < 1 for e in values):
        raise InvalidParameterError(
            "The 'finetune_epochs' parameter must be an int >= 1 or a non-empty sequence of "
            f"them; got {epochs!r}."
        )
    return values


def finetune_from_billboard(
    result: Any,
    ds: FederatedDataset,
    net: torch.nn.Module,
    epochs: Sequence[int],
    lrs: Sequence[float],
    batch_size: int,
    seed: int,
    select: str,
    *,
    keep_models: bool = True,
) -> dict[str, Any]:
    """Every client fine-tunes from the billboard: ``train_local`` started at the global model,
    a block of clients at a time (``select="pooled"``: in two passes, every client's validation
    scores, then the models). ``_params``, the final models, are written to disk block by block
    (:class:`~privmtl.federated.client_models.SpilledModels`), or dropped with
    ``keep_models=False`` (None): no step holds every client's model."""
    start = copy.deepcopy(net)
    start.load_state_dict({**start.state_dict(), **result.global_params})
    models = SpilledModels(ds.n_clients) if keep_models else None
    # through its module: the mediation audit's mutants replace it there
    tuned = end_of_run_local.train_local(
        ds, start, epochs=epochs, lrs=lrs, batch_size=batch_size, select=select, seed=seed,
        device=result.config.device,
        on_block=models.append if models is not None else lambda pos, params, data: None,
    )  # fmt: skip
    sel = tuned.extra["local_selection"]
    test = tuned.accuracies["test"]["personalized"]
    return {
        "finetune_selection": {
            "select": sel["select"],
            "grid": sel["grid"],
            "grid_axes": ["epochs", "lr"],
            "choice_counts": np.bincount(sel["choice"], minlength=len(sel["grid"])).tolist(),
            "grid_test_accuracy": sel["grid_test_accuracy"],
            "note": "every client fine-tuned from the billboard on its own data; "
            + (
                "each client chose (epochs, lr) on its own validation split: no privacy cost"
                if select == "client"
                else "one (epochs, lr) chosen on the pooled validation accuracy of all clients "
                "(not covered by the guarantee)"
            ),
        },
        "finetune": "vanilla",
        "finetune_start": "global",
        "pre_finetune_test_accuracy": float(result.test_accuracy),
        "test_accuracy": float(test["accuracy"]),
        "mean_client_accuracy": float(test["mean_client_accuracy"]),
        "val_accuracy": float(tuned.accuracies["val"]["personalized"]["accuracy"]),
        "finetune_note": FINETUNE_NOTE,
        "_params": models,
        "_per_client": {"final": tuned.extra["per_client"]} if "per_client" in tuned.extra else {},
    }


def finetune_auto(
    result: TrainResult,
    ds: FederatedDataset,
    net: torch.nn.Module,
    method: str,
    sigma: float,
    batch_size: int,
    seed: int,
    local_solver: str = "sgd",
    local_patience: int | None = None,
    *,
    score_trained: bool = False,
    vote: VotePlan | None = None,
    keep_models: bool = True,
) -> dict[str, Any]:
    """``finetune="auto"`` (:data:`AUTO_FINETUNE_EPOCHS`): every client chooses on its own
    validation split among the billboard fine-tuned on its data (where it carries signal), its own
    local training and its trained model (:func:`~privmtl.federated.end_of_run.finish.finish_clients`).
    Which candidates it compares depends on public parameters only: ``sigma`` (the released
    mean's noise), the clip, one release's size and the releases made. The final models are
    scored block by block as the clients finish; ``score_trained``: the trained models too
    (``result.accuracies`` is filled in). ``vote`` (held): one candidate for every client by the
    clients' noisy vote, recorded in the run's ledger before any final model exists; the
    result's ε is then the ledger's, rounds and vote composed.

    The clients are finished in one pass (:func:`~privmtl.federated.end_of_run.finish.finish_pass`):
    ``_params``, the final models, are written to disk block by block and read back by rows
    (:class:`~privmtl.federated.client_models.SpilledModels`); ``keep_models=False`` drops each
    block once scored (``_params`` is None): no step holds every client's model."""
    cfg = result.config
    shared = None if cfg.shared_params is None else list(cfg.shared_params)
    dim = int(released_dim(result) or 0)
    rounds = len(result.history) or cfg.rounds
    plan = auto_plan(method, shared, sigma, cfg.clip, dim, rounds)
    trained = stack_trained(result.personalized_params, result.global_params, ds.n_clients)
    others: dict[str, tuple[Params, bool]] = {}
    if score_trained:
        others = {name: (result.global_params, False) for name in result.accuracies["test"]}
        if "personalized" in others:
            assert result.personalized_params is not None
            others["personalized"] = (result.personalized_params, True)
    record: dict[str, Any] | None = None
    # a seeded vote is a deterministic function of the run: its replay after a resume is the
    # recorded release (its recorded epsilon, not charged twice); a secure one is new noise
    replay = result.noise_source == "seeded"
    replayed = replay and result.ledger is not None and result.ledger.has_release(FINETUNE_VOTE_ID)
    if vote is not None and vote.held and result.ledger is not None and not replayed:
        try:  # a run stopped on its budget may have no room left for the vote
            result.ledger.check(vote.vote(1).event())
        except PrivacyBudgetError as exc:
            vote = dataclasses.replace(vote, held=False, reason=f"no vote: {exc}")
    if vote is not None:
        record = {"id": FINETUNE_VOTE_ID, "held": vote.held, "reason": vote.reason}
    elect = None
    if vote is not None and vote.held:
        assert record is not None

        def elect(shares: np.ndarray, names: tuple[str, ...]) -> int:
            ballot = vote.vote(len(names))
            noise = make_noise_source(result.noise_source, seed, stream=(FINETUNE_VOTE_STREAM,))
            ledger = result.ledger
            res = ballot.select(
                shares, noise if ballot.private else None, ledger=ledger,
                release_id=FINETUNE_VOTE_ID, replay_ok=replay, delta=float(result.delta),
                accountant=cfg.accountant,
            )  # fmt: skip
            if ledger is not None:
                result.epsilon = res.epsilon  # rounds and vote, composed by the ledger
            own = ballot.epsilon(float(result.delta), accountant=cfg.accountant)
            record.update(
                candidates=list(names), winner=names[res.winner],
                noisy_counts=list(res.noisy_counts), noise_std=ballot.noise_std,
                share=vote.share, epsilon=own if math.isfinite(own) else None,
                noise_source=res.details["noise_source"],
            )  # fmt: skip
            return res.winner

    options = FinishOptions(
        "auto", batch_size=batch_size, seed=seed, lr=float(cfg.lr), lam=float(cfg.lam or 0.0),
        plan=plan, progress=bool(cfg.progress), device=cfg.device, score=others,
        workers=cfg.threads, local_solver=local_solver, local_patience=local_patience,
        select="vote" if elect is not None else "client", vote=elect,
        voter_rng=voter_rng(result.noise_source, seed), block=end_of_run_block(ds.n_clients),
    )  # fmt: skip
    models = SpilledModels(ds.n_clients) if keep_models else None
    fin = finish_pass(
        options, ds, net, trained, result.global_params,
        on_block=None if models is None else models.append,
    )  # fmt: skip
    if record is not None and fin.voters is not None:
        record["voters"] = fin.voters
    assert fin.choice is not None and fin.scores is not None
    if score_trained:  # the trained models' scores, from the same pass
        result.accuracies = {
            split: {name: fin.scores[split][name] for name in others} for split in fin.scores
        }
    acc = {split: fin.scores[split]["final"] for split in fin.scores}
    counts = np.bincount(fin.choice, minlength=len(plan.names))
    return {
        "finetune": "auto",
        "finetune_auto": {
            **auto_info(plan, counts.tolist(), fin.grids, local_solver, record),
            **({"patience": local_patience} if local_patience is not None else {}),
        },
        "pre_finetune_test_accuracy": float(result.test_accuracy),
        "test_accuracy": float(acc["test"]["accuracy"]),
        "mean_client_accuracy": float(acc["test"]["mean_client_accuracy"]),
        "val_accuracy": float(acc["val"]["accuracy"]),
        "_params": models,
        "_score_seconds": fin.score_seconds,
        "_per_client": fin.per_client,
        "_kept": np.asarray(plan.names, dtype=object)[fin.choice],
    }


def voter_rng(noise_source: str, seed: int) -> np.random.Generator | None:
    """The voters' coins (:func:`~privmtl.federated.end_of_run.finish.vote_voters`): the seeded stream
    :data:`~privmtl.federated.end_of_run.finish.FINETUNE_VOTERS_STREAM` of a seeded run (a simulation),
    else None (OS entropy: secret, as the rounds' sampling of a secure run)."""
    if noise_source != "seeded":
        return None
    return np.random.default_rng([int(seed), FINETUNE_VOTERS_STREAM])


def finetune_trained(
    result: Any,
    ds: FederatedDataset,
    net: torch.nn.Module,
    method: str,
    epochs: int,
    lr: float,
    batch_size: int,
    lam: float,
    seed: int,
    grid: tuple[list[float], list[float]] | None = None,
    *,
    keep_models: bool = True,
) -> dict[str, Any]:
    """An explicit fine-tuning ``method`` of every client's trained model (or of the billboard,
    for a method without personalized models); ``grid``: each client's choice of ``(lr, lam)``
    on its own validation split
    (:func:`~privmtl.federated.end_of_run.finetune_selection.finetune_select`, a block of clients
    at a time). The clients are finished and scored in one pass
    (:func:`~privmtl.federated.end_of_run.finish.finish_pass`): ``_params`` are spilled to disk
    block by block, or None with ``keep_models=False``; no step holds every client's model."""
    start = "personalized" if result.personalized_params is not None else "global"
    options = FinishOptions(
        method, batch_size=batch_size, seed=seed, lr=lr, lam=lam, start=start, epochs=epochs,
        device=result.config.device, workers=result.config.threads, score={}, grid=grid,
    )  # fmt: skip
    models = SpilledModels(ds.n_clients) if keep_models else None
    fin = finish_pass(
        options, ds, net,
        stack_trained(result.personalized_params, result.global_params, ds.n_clients),
        result.global_params, on_block=None if models is None else models.append,
    )  # fmt: skip
    assert fin.scores is not None
    acc = {split: fin.scores[split]["final"] for split in fin.scores}
    extra: dict[str, Any] = {"_per_client": fin.per_client}
    if grid is not None:
        assert fin.choice is not None
        points = finetune_selection.selection_grid(method, grid[0], grid[1])
        extra["finetune_selection"] = {
            "select": "client",
            "grid": points,
            "choice_counts": np.bincount(fin.choice, minlength=len(points)).tolist(),
            "note": "each client chose (lr, lam) on its own validation split: no privacy cost",
        }
    return {
        **extra,
        "finetune": method,
        "finetune_start": start,
        "pre_finetune_test_accuracy": float(result.test_accuracy),
        "test_accuracy": float(acc["test"]["accuracy"]),
        "mean_client_accuracy": float(acc["test"]["mean_client_accuracy"]),
        "val_accuracy": float(acc.get("val", {}).get("accuracy", float("nan"))),
        "finetune_note": FINETUNE_NOTE,
        "_params": models,
    }
