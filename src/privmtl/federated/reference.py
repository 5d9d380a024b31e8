"""Per-client reference implementation of the local training and of the server aggregation.

Plain Python loops over clients and steps with ordinary autograd: slow but obviously correct. The
batched engine (:mod:`privmtl.federated.engine`) must reproduce it up to float rounding; both
consume the same minibatch plan and the same noise draws (:mod:`privmtl.federated.algorithms`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from privmtl.federated.algorithms import Params

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
    :math:`\frac{\rho}{2}\lVert w - \tilde w\rVert^2`; skipped when ``anchor`` is None).

    Returns the final parameters of every client and its mean minibatch loss (data term only,
    measured before each step; NaN for a client without steps).
    """
    outs: list[Params] = []
    losses: list[float] = []
    for start, steps in zip(starts, plan, strict=True):
        w = {name: p.detach().clone() for name, p in start.items()}
        total = 0.0
        for rows in steps:
            idx = torch.from_numpy(np.asarray(rows, dtype=np.int64))
            x, y = x_all[idx], y_all[idx]
            leaves = {name: p.detach().requires_grad_(True) for name, p in w.items()}
            with torch.enable_grad():
                logits = functional_call(model, (leaves, buffers), (x,))
                loss = F.cross_entropy(logits, y)
                grads = torch.autograd.grad(loss, list(leaves.values()))
            total += float(loss.detach())
            with torch.no_grad():
                for (name, p), g in zip(leaves.items(), grads, strict=True):
                    step = g
                    if anchor is not None and prox_weight != 0:
                        step = g + prox_weight * (p - anchor[name])
                    w[name] = p.detach() - lr * step
        outs.append(w)
        losses.append(total / len(steps) if steps else math.nan)
    return outs, losses


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
