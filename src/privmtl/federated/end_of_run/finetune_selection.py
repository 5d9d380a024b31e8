r"""Fine-tuning with its step size and penalty weight chosen by every client on its own data.

Fine-tuning is only as good as its step size: on FEMNIST-105 (non-private PMTL, λ = 1, 100
rounds, seed 0), one epoch of vanilla fine-tuning from the personalized models reaches 0.60 test
accuracy with ``lr = 0.1`` (the training step) and 0.68 with ``lr = 0.01``, and the symmetrized-KL
objective with ``λ = 1`` collapses to 0.33 at
``lr = 0.1`` but reaches 0.70 at ``lr = 0.01`` (its gradient grows with
:math:`\log p_w - \log p_{\tilde w}`, unbounded where the released model is confident).
:func:`finetune_select` therefore runs :func:`~privmtl.federated.end_of_run.finetune.finetune` for every
``(lr, λ)`` of a small grid and keeps, for each client, the fine-tuned model with the best accuracy
on that client's *own* validation split.

Privacy: a client's choice reads only its own validation data and models computed from the
released billboard and its own training data, so the selection is post-processing of the billboard
and the joint-DP guarantee of training is unchanged (``select="client"``). ``select="pooled"``
picks one grid point for all clients from the pooled validation accuracy, which reads every
client's validation data: a tuning step that is not covered by the guarantee (reported as such).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from privmtl._validation import check_choice
from privmtl.data.federated import FederatedDataset
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import Params
from privmtl.federated.config import TrainResult
from privmtl.federated.end_of_run.finetune import finetune
from privmtl.federated.scoring import client_scores, evaluate

__all__ = ["SELECT_MODES", "finetune_select", "selection_grid"]

SELECT_MODES = ("client", "pooled")


def selection_grid(
    method: str, lrs: Sequence[float], lams: Sequence[float]
) -> list[tuple[float, float]]:
    """The ``(lr, λ)`` points :func:`finetune_select` tries, in its order (``"vanilla"``: λ = 0)."""
    if not lrs:
        raise InvalidParameterError("The 'lrs' parameter must hold at least one step size.")
    if method != "vanilla" and not lams:
        raise InvalidParameterError(
            f"The 'lams' parameter must hold at least one value for method={method!r}."
        )
    lam_values = [0.0] if method == "vanilla" else [float(v) for v in lams]
    return [(float(lr), lam) for lr in lrs for lam in lam_values]


def finetune_select(
    result_or_params: TrainResult | Mapping[str, torch.Tensor],
    dataset: FederatedDataset,
    model: nn.Module,
    *,
    method: str = "vanilla",
    lrs: Sequence[float] = (0.01, 0.03, 0.1),
    lams: Sequence[float] = (0.01, 0.1, 1.0),
    select: str = "client",
    scores: bool = True,
    **finetune_kwargs: Any,
) -> tuple[Params, dict[str, dict[str, float]], dict[str, Any]]:
    r"""Fine-tune over a grid of ``(lr, λ)`` and keep each client's best model on validation.

    Parameters
    ----------
    result_or_params, dataset, model
        As for :func:`~privmtl.federated.end_of_run.finetune.finetune`.
    method : {"vanilla", "mr", "skl", "ewc"}, default "vanilla"
        Fine-tuning objective; ``"vanilla"`` has no penalty and searches ``lrs`` only.
    lrs : sequence of float, default (0.01, 0.03, 0.1)
        Step sizes tried.
    lams : sequence of float, default (0.01, 0.1, 1.0)
        Penalty weights :math:`\lambda` tried (ignored by ``"vanilla"``).
    select : {"client", "pooled"}, default "client"
        ``"client"``: client ``k`` keeps the grid point with the most correct predictions on its
        own validation split (ties: lower validation loss, then the earlier grid point; clients
        without validation data keep the first grid point). ``"pooled"``: one grid point for
        all clients, the best pooled validation accuracy (reads every client's validation data).
    scores : bool, default True
        False: ``accuracies`` is empty (the caller scores the selected models itself, as
        :func:`~privmtl.federated.end_of_run.finish.finish_pass` does block by block). The
        models and the choice are the same.
    **finetune_kwargs
        Passed to :func:`~privmtl.federated.end_of_run.finetune.finetune` (``start``, ``epochs``,
        ``batch_size``, ``seed``, ``batched``, ``global_params``, ``client_index``, ...); not
        ``lr`` or ``lam``. A client's selected model depends on nothing but its own data, its
        start model, the anchor and its index (``client_index``, which seeds its minibatches):
        a population finished a block of clients at a time gets the same models.

    Returns
    -------
    params : dict of str to Tensor
        Each client's selected fine-tuned model, stacked ``(m, *shape)``.
    accuracies : dict
        ``{"val": metrics, "test": metrics}`` of the selected models (validation accuracy is
        optimistically biased by the selection; report ``test``).
    selection : dict
        ``grid`` (list of ``(lr, lam)``), ``choice`` (grid index per client), ``select`` and
        ``grid_test_accuracy`` (pooled test accuracy of every grid point used for all clients,
        for reference).
    """
    check_choice("select", select, SELECT_MODES)
    for name in ("lr", "lam"):
        if name in finetune_kwargs:
            raise InvalidParameterError(
                f"finetune_select searches '{name}' itself; pass the grid as '{name}s'."
            )
    grid = selection_grid(method, lrs, lams)
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    val_x, val_y = dataset.split("val")
    m = dataset.n_clients
    chosen: Params = {}
    choice = np.zeros(m, dtype=np.int64)
    best_correct, best_loss = np.full(m, -1.0), np.full(m, np.inf)
    grid_test: list[float] = []
    # streamed: only the best model per client so far is kept (m models, not m x grid)
    for g, (lr, lam) in enumerate(grid):
        params, acc = finetune(
            result_or_params, dataset, model, method=method, lr=lr, lam=lam, **finetune_kwargs
        )
        grid_test.append(float(acc["test"]["accuracy"]))
        correct, loss = client_scores(model, params, buffers, val_x, val_y)
        if select == "pooled":
            total = (-correct.sum(), loss.sum())
            better = np.full(m, g == 0 or total < (-best_correct.sum(), best_loss.sum()))
        else:  # most correct, then lowest loss; ties keep the earlier grid point
            better = (correct > best_correct) | ((correct == best_correct) & (loss < best_loss))
        if g == 0:
            chosen = params
            better[:] = True
        else:
            mask = torch.from_numpy(better)
            for n, p in chosen.items():
                p[mask] = params[n][mask]
        choice[better] = g
        best_correct = np.where(better, correct, best_correct)
        best_loss = np.where(better, loss, best_loss)
    accuracies = {}
    for split in ("val", "test") if scores else ():
        xs, ys = dataset.split(split)
        accuracies[split] = evaluate(model, chosen, buffers, xs, ys, personalized=True)
    selection = {
        "grid": grid,
        "choice": choice.tolist(),
        "select": select,
        "grid_test_accuracy": grid_test,
    }
    return chosen, accuracies, selection
