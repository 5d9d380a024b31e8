"""Small low-rank linear tasks shared by the MP-MTL refit tests (importable from tests/)."""

from __future__ import annotations

import math

import numpy as np


def lowrank_tasks(m=40, d=6, n=25, rank=2, seed=0):
    """Low-rank linear tasks: every task's model in a shared rank-``rank`` subspace."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.standard_normal((d, rank)))[0]
    Xs, ys = [], []
    for _ in range(m):
        w = basis @ rng.standard_normal(rank)
        x = rng.standard_normal((n, d)) / math.sqrt(d)
        Xs.append(x)
        ys.append(x @ w + 0.3 * rng.standard_normal(n))
    return Xs, ys
