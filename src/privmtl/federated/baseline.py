r"""Did sharing help? Every client's final model against its own training alone.

A private run's accuracy means little without the accuracy each client reaches with no sharing
at all: its own local training, the ``local`` candidate of the end of run
(:func:`~privmtl.federated.end_of_run.local.train_local`'s default grid, each client choosing its setting on
its own validation split; what ``method="local-all"`` gives). :func:`local_baseline` trains it for
the clients of :func:`baseline_sample` and scores both models of each of them on its own test
split, so the comparison is paired client by client (:mod:`privmtl.gain`: the gain pooled over
test examples, as ``test_accuracy`` is, and its normal interval over clients).

No privacy cost: each client trains and scores on its own data only. The sample is drawn from the
run's seed and the population size alone (never from the data); its summaries are population
summaries, as ``test_accuracy`` is.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from privmtl.data.federated import FederatedDataset
from privmtl.federated.algorithms import Params
from privmtl.federated.blocks import client_blocks
from privmtl.federated.end_of_run import local as end_of_run_local
from privmtl.federated.scoring import BlockScores, block_rows
from privmtl.gain import GAIN_LEVEL, describe_gain, gain_interval

__all__ = [
    "BASELINE_STREAM",
    "LOCAL_BASELINE_CLIENTS",
    "baseline_sample",
    "describe_gain",
    "local_baseline",
    "local_keys",
    "local_scores",
    "per_client_correct",
]

LOCAL_BASELINE_CLIENTS = 2000
"""The most clients trained alone for the baseline: every client of a population up to this size,
else a uniform sample of this many (:func:`baseline_sample`)."""
BASELINE_STREAM = 0xBA5E
"""The stream of the run's seed that draws the baseline's sample of clients."""


def baseline_sample(m: int, seed: int, size: int = LOCAL_BASELINE_CLIENTS) -> np.ndarray:
    """The clients of the baseline: all ``m`` when ``m <= size``, else ``size`` of them drawn
    uniformly without replacement from ``(seed, BASELINE_STREAM)`` (sorted)."""
    if m <= size:
        return np.arange(m)
    rng = np.random.default_rng([int(seed), BASELINE_STREAM])
    return np.sort(rng.choice(m, size=size, replace=False))


def local_baseline(
    dataset: FederatedDataset,
    model: nn.Module,
    final: Params,
    *,
    personalized: bool,
    seed: int,
    batch_size: int,
    solver: str,
    patience: int | None = None,
    device: str = "cpu",
    workers: int = 1,
    local: Params | None = None,
) -> dict[str, Any]:
    """The result's baseline keys: the clients' local training against their final models.

    Parameters
    ----------
    dataset : FederatedDataset
        The whole population.
    model : nn.Module
        Architecture and initial parameters (the start of local training).
    final : dict of str to Tensor
        The final models: stacked ``(m, ...)`` when ``personalized``, else one shared model.
    seed, batch_size, solver, patience, device, workers
        Local training's (:func:`~privmtl.federated.end_of_run.local.train_local`): the run's, so that the
        baseline is the end of run's ``local`` candidate.
    local : dict of str to Tensor, optional
        The local models of every client, stacked ``(m, ...)``, when the run computed them already
        (``method="local-all"``): scored, not trained again.

    Returns
    -------
    dict
        ``local_test_accuracy``, ``local_mean_client_accuracy``, ``gain_over_local``,
        ``gain_interval`` (``[low, high]`` at :data:`GAIN_LEVEL`), ``baseline_clients`` (clients
        scored) and ``baseline`` (how it was computed).
    """
    _, final_c, local_c, n = local_scores(
        dataset, model, final, personalized=personalized, seed=seed, batch_size=batch_size,
        solver=solver, patience=patience, device=device, workers=workers, local=local,
    )  # fmt: skip
    return local_keys(final_c, local_c, n, m=dataset.n_clients, solver=solver)


def local_scores(
    dataset: FederatedDataset,
    model: nn.Module,
    final: Params,
    *,
    personalized: bool,
    seed: int,
    batch_size: int,
    solver: str,
    patience: int | None = None,
    device: str = "cpu",
    workers: int = 1,
    local: Params | None = None,
    final_correct: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`local_baseline`'s per-client scores (same parameters): the clients of
    :func:`baseline_sample`, and their correct test predictions of the final and the local models
    and their test examples (what the per-client rows, :mod:`privmtl.per_client`, read).
    ``final_correct``: every client's correct test predictions and test examples of its final
    model, scored already (the end of run's pass): ``final`` is then not read."""
    m = dataset.n_clients
    idx = baseline_sample(m, seed)
    part = dataset if len(idx) == m else dataset.subset(idx.tolist())
    if local is None:
        # through its module: the mediation audit's mutants replace it there
        alone = end_of_run_local.train_local(
            part, model, batch_size=batch_size, seed=seed, select="client",
            client_index=idx.tolist(), device=device, solver=solver, patience=patience,
            workers=workers, scores=False,
        )  # fmt: skip
        assert alone.personalized_params is not None
        local = alone.personalized_params
    elif len(idx) != m:
        local = block_rows(local, idx)
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    book = BlockScores(model, buffers, ("test",))
    with torch.no_grad():
        if final_correct is None:
            own = block_rows(final, idx) if personalized and len(idx) != m else final
            book.add("final", own, personalized, part)
        book.add("local", {k: v.cpu() for k, v in local.items()}, True, part)
    local_c, n = book.per_client("test", "local")
    if final_correct is not None:
        return idx, np.asarray(final_correct[0])[idx], local_c, n
    final_c, n = book.per_client("test", "final")
    return idx, final_c, local_c, n


def local_keys(
    final_correct: np.ndarray, local_correct: np.ndarray, n: np.ndarray, *, m: int, solver: str
) -> dict[str, Any]:
    """The baseline keys of :func:`local_baseline` from the clients' correct test predictions
    (final and local models) and test examples (``m``: the population's size)."""
    n = np.asarray(n, dtype=np.float64)
    final_correct = np.asarray(final_correct, dtype=np.float64)
    local_correct = np.asarray(local_correct, dtype=np.float64)
    has = n > 0
    total = float(n.sum())
    gain, (low, high) = gain_interval(final_correct, local_correct, n)
    k = len(n)
    return {
        "local_test_accuracy": float(local_correct.sum() / total) if total else float("nan"),
        "local_mean_client_accuracy": (
            float(np.mean(local_correct[has] / n[has])) if has.any() else float("nan")
        ),
        "gain_over_local": gain,
        "gain_interval": [low, high],
        "baseline_clients": int(k),
        "baseline": (
            f"each client's own local training ({solver}, its setting chosen on its own "
            "validation split), scored on its own test split beside its final model; "
            + (f"a uniform sample of {k} of the {m} clients" if k < m else f"all {m} clients")
            + f"; gain_interval: {GAIN_LEVEL:.0%} normal interval over clients"
        ),
    }


def per_client_correct(
    dataset: FederatedDataset, model: nn.Module, params: Params, *, personalized: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Every client's correct test predictions and test examples of its model (``params``:
    stacked ``(m, ...)`` when ``personalized``, else one shared model), scored a block of clients
    at a time (:func:`~privmtl.federated.blocks.client_blocks`): no stack beyond ``params``."""
    m = dataset.n_clients
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    book = BlockScores(model, buffers, ("test",))
    with torch.no_grad():
        for pos in client_blocks(m):
            piece = dataset if len(pos) == m else dataset.subset(pos.tolist())
            own = block_rows(params, pos) if personalized and len(pos) != m else params
            book.add("final", own, personalized, piece)
    return book.per_client("test", "final")
