r"""Every client's L2-regularised multinomial logistic regression, solved in batches.

The ``solver="ridge"`` of :func:`~privmtl.federated.end_of_run.local.train_local`: instead of a grid of
minibatch-SGD runs (one Python step per minibatch of every client), client ``k`` minimises, on
its own training split of ``n_k`` examples,

.. math::

    f_k(W) = \frac{1}{n_k} \sum_{i} \mathrm{CE}(W \tilde x_i, y_i)
             + \frac{c}{2 n_k} \lVert W - W_0 \rVert^2,

with :math:`\tilde x = (x, 1)` (the bias is the last column of :math:`W`), :math:`W_0` the start
model (the initial model for training alone, the billboard for fine-tuning it) and ``c`` a public
prior strength: the penalty is that of a Gaussian prior around :math:`W_0` worth ``c`` examples,
so a client with much data moves far from the start and one with little data stays near it —
what early-stopped SGD from :math:`W_0` does, without a number of epochs to choose.

The solver is a fixed-preconditioner gradient method with Nesterov momentum: the Hessian of the
mean cross-entropy is at most :math:`\tfrac12 I_C \otimes A_k` with
:math:`A_k = \frac{1}{n_k}\sum_i \tilde x_i \tilde x_i^\top` (Böhning's bound), so
:math:`P_k = \tfrac12 A_k + \lambda_k I` majorises the curvature of :math:`f_k` and the step
:math:`W \leftarrow W - \nabla f_k(W) P_k^{-1}` never overshoots.

A client with fewer (padded) rows than parameters per class is solved in its dual: the iterates
stay :math:`W = W_0 + \alpha \tilde X` (the gradient and its preconditioned step lie in the
span of the client's rows), so with :math:`K = \tilde X \tilde X^\top` and
:math:`M = \lambda_k I + \tfrac{1}{2 n_k} K` (push-through: :math:`\tilde X P_k^{-1} = M^{-1}
\tilde X`) the same iterates cost :math:`O(C n_k^2)` instead of :math:`O(C n_k d + C d^2)`
(:func:`_solve_bucket_dual`; equal to the primal's up to rounding).

The clients are sorted by size and solved in buckets of one padded length (:func:`padded_rows`;
examples padded with zero weight), every prior strength of a bucket in the same vectorised call:
:data:`RIDGE_ITERATIONS` Python steps per bucket, not one per minibatch of every client. Client
``k``'s model reads its own training data, the start model and public constants only, down to
the last bit: every bucket of a padded length has the same number of slots
(:func:`bucket_clients`, empty slots solved for a placeholder and dropped), and the width
``d + 1`` is padded with zero features to a multiple of :data:`RIDGE_WIDTH_STEP`, so that every
batched call that involves client ``k`` has the same shapes and the same memory alignment of its
slot whoever the other clients are (a batched inverse rounds by alignment). A client solved
alone or beside any others gets the same bytes (``tests/federated/test_ridge.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from privmtl.data.federated import FederatedDataset
from privmtl.federated.algorithms import Params

__all__ = [
    "RIDGE_BUCKET_ROWS",
    "RIDGE_ITERATIONS",
    "bucket_clients",
    "padded_rows",
    "ridge_logreg",
]

RIDGE_ITERATIONS = 30
"""Iterations of :func:`ridge_logreg`: the objective ends near its minimum, closer the stronger
the prior (``tests/federated/test_ridge.py`` bounds the gap)."""
RIDGE_WIDTH_STEP = 4
"""The width of a client's rows with the bias (``d + 1``) is padded with zero features to a
multiple of this: ``(d + 1)^2`` floats then fill whole 64-byte lines, so that the matrices of a
batch all start at one alignment (a batched inverse rounds by alignment)."""
RIDGE_BUCKET_ROWS = 1 << 11
"""The most padded training rows (times the prior strengths) of one bucket of :func:`ridge_logreg`."""


def padded_rows(sizes: np.ndarray) -> np.ndarray:
    """The rows a client of each size is padded to: multiples of 8 up to 64, then steps of
    about a quarter (a public ladder of its own size: the shapes of a client's solve never depend
    on the other clients)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    ladder = [8]
    while ladder[-1] < max(int(sizes.max(initial=0)), 1):
        step = 8 if ladder[-1] < 64 else -(-ladder[-1] // 4 // 8) * 8
        ladder.append(ladder[-1] + step)
    return np.asarray(ladder, dtype=np.int64)[np.searchsorted(ladder, sizes)]


def bucket_clients(rows: int, n_ridges: int, bucket_rows: int = RIDGE_BUCKET_ROWS) -> int:
    """How many clients every bucket of padded length ``rows`` holds, for ``n_ridges`` prior
    strengths: as many as fit in ``bucket_rows`` padded rows (times the strengths), at least one.
    A function of public constants only: a client is solved in a batch of this many, whoever
    the others are (fewer clients of its length: the empty slots hold placeholders)."""
    return max(1, bucket_rows // (rows * n_ridges))


def ridge_logreg(
    start: Params,
    dataset: FederatedDataset,
    ridges: Sequence[float],
    *,
    iterations: int = RIDGE_ITERATIONS,
    bucket_rows: int = RIDGE_BUCKET_ROWS,
) -> list[Params]:
    """Every client's minimiser of ``f_k`` (module docstring) for every prior strength.

    Parameters
    ----------
    start : dict of str to Tensor
        ``linear.weight`` ``(C, d)`` and ``linear.bias`` ``(C,)`` of a
        :class:`~privmtl.federated.models.MultinomialLogReg`: the start and the centre of the
        penalty, the same for every client. The solve runs on its device, in its dtype.
    dataset : FederatedDataset
        Client ``k`` trains on its ``train`` split (every client has at least one example).
    ridges : sequence of float
        Prior strengths ``c`` (each > 0), in the order of the returned models.
    iterations : int, default :data:`RIDGE_ITERATIONS`
    bucket_rows : int, default :data:`RIDGE_BUCKET_ROWS`
        Clients of one padded length are solved together in :func:`bucket_clients` slots: this
        many padded rows (times the prior strengths). A client's model does not depend on the
        other clients, bit for bit; another value may round it differently in its last bits.

    Returns
    -------
    list of dict of str to Tensor
        One stacked model ``(m, ...)`` per prior strength.
    """
    weight, bias = start["linear.weight"], start["linear.bias"]
    dtype, device = weight.dtype, weight.device
    n_classes, d = weight.shape
    # the features padded with zero columns to a width where d + 1 is a multiple of
    # RIDGE_WIDTH_STEP: every (d + 1)-square matrix of a batch then starts at the same memory
    # alignment, and the batched kernels that round by alignment round every slot alike
    extra = -(d + 1) % RIDGE_WIDTH_STEP
    zeros = weight.new_zeros(n_classes, extra)
    w0 = torch.cat([weight, zeros, bias.unsqueeze(1)], 1)  # (C, d + extra + 1): bias last
    m = dataset.n_clients
    x_all, y_all, offsets = dataset.concat("train")
    x_all = x_all.reshape(x_all.shape[0], -1).to(device=device, dtype=dtype)
    x_all = torch.cat([x_all, x_all.new_zeros(x_all.shape[0], extra)], 1)
    y_all = y_all.to(device)
    n = np.diff(offsets).astype(np.int64)
    cs = torch.tensor([float(c) for c in ridges], dtype=dtype, device=device)
    out = w0.expand(len(ridges), m, *w0.shape).clone()
    top = padded_rows(n)
    order = np.lexsort((np.arange(m), top))  # by padded length, then position
    i = 0
    while i < len(order):
        rows_of = int(top[order[i]])  # a bucket: clients of one padded length
        slots = bucket_clients(rows_of, len(ridges), bucket_rows)
        j = i + 1
        while j < len(order) and top[order[j]] == rows_of and j - i < slots:
            j += 1
        idx = order[i:j]
        # every bucket of this length has the same number of slots, those left empty filled
        # with copies of its first client (solved, then dropped): no call's shape depends on
        # how many clients of this length there are
        full = np.concatenate([idx, np.full(slots - len(idx), idx[0], dtype=idx.dtype)])
        own = np.minimum(np.arange(rows_of)[None, :], n[full][:, None] - 1) + offsets[full][:, None]
        rows = torch.from_numpy(own).to(device)
        sizes = torch.from_numpy(n[full]).to(device=device, dtype=dtype)
        solve = _solve_bucket_dual if rows_of < d + 1 else _solve_bucket
        solved = solve(x_all[rows], y_all[rows], sizes, w0, cs, iterations)
        out[:, torch.from_numpy(idx).to(device)] = solved[:, : len(idx)]
        i = j
    return [
        {"linear.weight": o[..., :d].contiguous(), "linear.bias": o[..., -1].contiguous()}
        for o in out
    ]


def _rows_and_weights(x: torch.Tensor, sizes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows ``(x, 1)`` with the padding zeroed ``(K, top, d + 1)``, and the rows' weights
    ``(K, top)``: ``1 / n_k`` on client ``k``'s rows, 0 on its padding."""
    top = x.shape[1]
    valid = (torch.arange(top, device=x.device)[None, :] < sizes[:, None]).to(x.dtype)
    xt = torch.cat([x, torch.ones_like(x[..., :1])], -1) * valid.unsqueeze(-1)
    return xt, valid / sizes[:, None]


def _solve_bucket(
    x: torch.Tensor,
    y: torch.Tensor,
    sizes: torch.Tensor,
    w0: torch.Tensor,
    cs: torch.Tensor,
    iterations: int,
) -> torch.Tensor:
    """``(len(cs), K, C, d + 1)``: the K clients' solutions, rows ``x (K, top, d)`` padded
    (with the client's own last row, weight 0, zeroed) to ``top``, labels ``y (K, top)``,
    ``sizes (K,)``."""
    k = x.shape[0]
    n_classes = w0.shape[0]
    xt, weights = _rows_and_weights(x, sizes)
    gram = torch.bmm(xt.transpose(1, 2), xt * weights.unsqueeze(-1))  # A_k
    lam = cs[:, None] / sizes[None, :]  # (R, K)
    eye = torch.eye(xt.shape[-1], dtype=x.dtype, device=x.device)
    precond = 0.5 * gram.unsqueeze(0) + lam[..., None, None] * eye
    inv = torch.cholesky_inverse(torch.linalg.cholesky(precond))
    one_hot = torch.nn.functional.one_hot(y, n_classes).to(x.dtype)
    target = (one_hot * weights.unsqueeze(-1)).transpose(1, 2).unsqueeze(0)  # (1, K, C, top)
    xs = xt.unsqueeze(0)
    xs_t = xt.transpose(1, 2).unsqueeze(0)  # (1, K, d + 1, top)
    anchor = w0.expand(len(cs), k, *w0.shape)
    w = anchor.clone()
    prev = w
    for t in range(iterations):
        # class-major logits (R, K, C, top): the products with a short output dimension of C
        # classes are the slow layout of batched matrix products
        probs = torch.softmax(torch.matmul(w, xs_t), -2)
        resid = probs * weights[None, :, None, :] - target
        g = torch.matmul(resid, xs) + lam[..., None, None] * (w - anchor)
        step = w - torch.matmul(g, inv)
        w = step + (t / (t + 3)) * (step - prev)  # Nesterov momentum
        prev = step
    return prev


def _solve_bucket_dual(
    x: torch.Tensor,
    y: torch.Tensor,
    sizes: torch.Tensor,
    w0: torch.Tensor,
    cs: torch.Tensor,
    iterations: int,
) -> torch.Tensor:
    """:func:`_solve_bucket`'s iterates in the span of each client's rows (module docstring):
    ``W = W_0 + alpha X`` with ``alpha (len(cs), K, C, top)``; for ``top`` below ``d + 1``."""
    k, top, _ = x.shape
    n_classes = w0.shape[0]
    xt, weights = _rows_and_weights(x, sizes)
    kern = torch.bmm(xt, xt.transpose(1, 2))  # K, zero on padding rows and columns
    lam = cs[:, None] / sizes[None, :]  # (R, K)
    eye = torch.eye(top, dtype=x.dtype, device=x.device)
    m = 0.5 * (kern * weights.unsqueeze(1)).unsqueeze(0) + lam[..., None, None] * eye
    inv = torch.cholesky_inverse(torch.linalg.cholesky(m))
    one_hot = torch.nn.functional.one_hot(y, n_classes).to(x.dtype)
    target = (one_hot * weights.unsqueeze(-1)).transpose(1, 2)  # (K, C, top)
    logits0 = torch.bmm(w0.expand(k, *w0.shape), xt.transpose(1, 2))  # (K, C, top): W_0's
    alpha = torch.zeros(len(cs), k, n_classes, top, dtype=x.dtype, device=x.device)
    prev = alpha
    for t in range(iterations):
        probs = torch.softmax(logits0 + torch.matmul(alpha, kern), -2)  # (R, K, C, top)
        g = probs * weights[None, :, None, :] - target + lam[..., None, None] * alpha
        step = alpha - torch.matmul(g, inv)
        alpha = step + (t / (t + 3)) * (step - prev)  # Nesterov momentum
        prev = step
    return w0 + torch.matmul(prev, xt)
