"""Per-client reference implementation of the local training and of the server aggregation.

Plain Python loops over clients and steps with ordinary autograd: slow but obviously correct. The
batched engine (:mod:`privmtl.federated.engine`) must reproduce it up to float rounding; both
consume the same minibatch plan and the same noise draws (:mod:`privmtl.federated.algorithms`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from privmtl.federated.algorithms import Params
from privmtl.federated.client import ProxStep, local_sgd_reference

__all__ = ["aggregate_reference", "local_train_reference"]


def local_train_reference(
    model: nn.Module,
    buffers: Params,
    starts: list[Params],
    anchor: Params | None,
    prox_weight: float,
    lr: float,
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    plan: list[list[np.ndarray]],
) -> tuple[list[Params], list[float]]:
    r"""Run each client's local SGD one after the other.

    For client ``j`` and each minibatch ``b`` of ``plan[j]``:
    :math:`w \leftarrow w - \eta\,(\nabla_w \frac{1}{|b|}\sum_{i\in b} \mathrm{CE}(h_w(x_i), y_i)
    + \rho\,(w - \tilde w))` with :math:`\rho` = ``prox_weight`` (the gradient of
    :math:`\frac{\rho}{2}\lVert w - \tilde w\rVert^2`; skipped when ``anchor`` is None):
    :func:`~privmtl.federated.client.local_sgd_reference` with a
    :class:`~privmtl.federated.client.ProxStep`.

    Returns the final parameters of every client and its mean minibatch loss (data term only,
    measured before each step; NaN for a client without steps).
    """
    if not starts:
        return [], []
    stacked = {n: torch.stack([s[n] for s in starts]) for n in starts[0]}
    rule = ProxStep(lr=lr, anchor=anchor, weight=prox_weight)
    out, losses = local_sgd_reference(model, buffers, stacked, rule, x_all, y_all, plan)
    return [{n: p[j] for n, p in out.items()} for j in range(len(starts))], losses


@torch.no_grad()
def aggregate_reference(
    deltas: list[Params], template: Params, clip: float | None, q: int
) -> tuple[Params, np.ndarray, np.ndarray]:
    r"""Clip every update to norm ``clip`` and average with the fixed divisor ``q``.

    Returns :math:`\frac1q\sum_k g_k\min(1, \gamma/\lVert g_k\rVert_2)` (zeros when no update),
    the norms :math:`\lVert g_k\rVert_2` before clipping (over all parameters jointly) and a
    boolean array "was clipped".
    """
    total = {name: torch.zeros_like(p) for name, p in template.items()}
    norms, clipped = [], []
    for g in deltas:
        norm = math.sqrt(sum(float((t.double() ** 2).sum()) for t in g.values()))
        factor = 1.0 if clip is None or norm <= clip else clip / norm
        norms.append(norm)
        clipped.append(factor < 1.0)
        for name, t in g.items():
            total[name] += t * factor
    mean = {name: t / q for name, t in total.items()}
    return mean, np.asarray(norms, dtype=np.float64), np.asarray(clipped, dtype=bool)
