r"""Training engine for PMTL (Algorithm 1 of Hu, Wu & Smith) and its federated baselines.

One round ``t`` of ``method="pmtl"``:

1. the server samples clients :math:`S_t` with the configured sampler and broadcasts
   :math:`\tilde w^t`;
2. every :math:`k\in S_t` starts from its *own persistent* model :math:`w_k` and runs local SGD
   (minibatch ``B``, step ``η``, no per-example clipping) on

   .. math:: f_k(w) = \frac{1}{|b|}\sum_{i\in b}\mathrm{CE}(h_w(x_i), y_i)
             + \frac{\lambda}{2}\lVert w-\tilde w^t\rVert_2^2,

   i.e. :math:`w \leftarrow w - \eta(\nabla l_k(w) + \lambda(w-\tilde w^t))`, and sends
   :math:`g_k = w_k^{new} - \tilde w^t` (``server_update="offset"``, the default) or
   :math:`g_k = w_k^{new} - w_k^{old}` (``"delta"``, Algorithm 1 as printed), or with ``"ditto"``
   the change :math:`v_k - \tilde w^t` of a copy of the billboard trained on the same minibatches
   without the pull; the client keeps :math:`w_k^{new}`;
3. the server releases

   .. math:: \tilde w^{t+1} = \tilde w^t + \frac1q\sum_{k\in S_t} g_k
             \min\Bigl(1,\frac{\gamma}{\lVert g_k\rVert_2}\Bigr) + N(0,\sigma^2 I)

   with the *fixed* ``q`` = ``clients_per_round`` (so the add/remove sensitivity is
   :math:`\gamma/q` and the noise multiplier :math:`z=\sigma q/\gamma`), and the ledger records
   the sampler's event before the release leaves the server.

``fedavg``/``fedprox`` start each round from :math:`\tilde w^t` (λ = 0, resp. μ = ``lam``) and are
evaluated with the global model; ``local`` never communicates. :func:`train` is the one-call front
end of :class:`~privmtl.federated.protocol.Trainer`, which holds the round logic of every method.
The batched path trains the sampled clients together: ``vmap(grad(loss))`` over stacked
parameters ``(K, ...)`` (or the model's ``forward_batched``) and per-client minibatches padded to
``B`` with per-row weights (:mod:`privmtl.federated.client`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from privmtl.data.federated import FederatedDataset
from privmtl.federated.algorithms import Params
from privmtl.federated.client import ProxStep, local_sgd_batched
from privmtl.federated.config import TrainConfig, TrainResult
from privmtl.federated.gradients import StepFn, make_step_fn
from privmtl.federated.trainer import Trainer
from privmtl.privacy.release import clipped_mean

__all__ = ["aggregate_batched", "local_train_batched", "make_step_fn", "train"]


def local_train_batched(
    step_fn: StepFn,
    starts: Params,
    anchor: Params | None,
    prox_weight: float,
    lr: float,
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    plan: list[list[np.ndarray]],
    batch_size: int,
) -> tuple[Params, list[float]]:
    """Local SGD on :math:`l_k(w) + (\\rho/2)\\lVert w - a\\rVert^2` of all clients of ``plan``.

    :func:`~privmtl.federated.client.local_sgd_batched` with a
    :class:`~privmtl.federated.client.ProxStep` (ρ = ``prox_weight``, ``a`` = ``anchor``).
    """
    rule = ProxStep(lr=lr, anchor=anchor, weight=prox_weight)
    return local_sgd_batched(step_fn, starts, rule, x_all, y_all, plan, batch_size)


@torch.no_grad()
def aggregate_batched(
    deltas: Params, template: Params, clip: float | None, q: int
) -> tuple[Params, np.ndarray, np.ndarray]:
    """Clipped mean of ``(K, ...)`` updates over ``q``
    (:func:`~privmtl.privacy.release.clipped_mean`)."""
    return clipped_mean(deltas, clip, q, template)


def train(
    dataset: FederatedDataset,
    model: nn.Module,
    config: TrainConfig | None = None,
    *,
    sampler: Any = None,
    ledger: Any = None,
    **run: Any,
) -> TrainResult:
    r"""Train ``config.method`` on ``dataset`` starting every client from ``model``'s parameters.

    Parameters
    ----------
    dataset : FederatedDataset
        One client per task; training uses the ``train`` split, evaluation ``val`` and ``test``.
    model : torch.nn.Module
        Architecture and initial parameters :math:`w_k^0 = \tilde w^0` (not modified).
    config : TrainConfig, optional
        Hyper-parameters (defaults: :class:`TrainConfig`).
    sampler : ClientSampler, optional
        Object with ``.sample(rng) -> indices`` and ``.event(noise_multiplier) -> DpEvent``;
        default ``privmtl.privacy.sampling.make_sampler(config.sampling, m, q)``.
    ledger : PrivacyLedger, optional
        Receives one event per round when the run is private; default a new ledger with
        ``config.accountant``, ``config.relation``, δ resolved by :func:`~privmtl.federated.config.resolve_config`.
    **run
        Passed to :class:`~privmtl.federated.protocol.Trainer` (``noise_source``,
        ``checkpoint_dir``, ``checkpoint_every``, ``resume``, ``budget_epsilon``,
        ``message_hook``, ...). Unlike the trainer, ``train`` raises
        :class:`~privmtl.exceptions.PrivacyBudgetError` when ``config.budget`` would be exceeded
        unless ``on_budget="stop"`` is passed.

    Returns
    -------
    TrainResult
    """
    run.setdefault("on_budget", "raise")
    trainer = Trainer(dataset, model, config, sampler=sampler, ledger=ledger, **run)
    return trainer.run()
