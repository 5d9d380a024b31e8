"""Euclidean projection of a model (all its parameters jointly) onto a ball.

The workshop method's models live in the ball of radius ``B`` (its privacy argument bounds the
norm of every message); both the driver (:class:`~privmtl.federated.protocol.Trainer`, for the
initial model) and :mod:`privmtl.federated.workshop` project with :func:`project_to_ball`.
"""

from __future__ import annotations

import math

import torch

from privmtl.federated.algorithms import Params

__all__ = ["project_to_ball"]


def project_to_ball(params: Params, bound: float, *, stacked: bool) -> Params:
    r""":math:`\Pi_B(w) = w\min(1, B/\lVert w\rVert_2)`, the norm over all parameters jointly.

    With ``stacked=True`` every leading index ``k`` is one model, projected on its own.
    """
    if stacked:
        sq = sum(p.double().flatten(1).pow(2).sum(1) for p in params.values())
        norms = torch.as_tensor(sq).sqrt()
        fac = torch.where(norms > bound, bound / norms.clamp_min(1e-30), torch.ones_like(norms))
        return {n: p * fac.to(p.dtype).view((-1,) + (1,) * (p.ndim - 1)) for n, p in params.items()}
    norm = math.sqrt(sum(float(p.double().pow(2).sum()) for p in params.values()))
    f = bound / norm if norm > bound else 1.0
    return {n: p * f for n, p in params.items()}
