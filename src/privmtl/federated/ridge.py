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
:math:`W \leftarrow W - \nabla f_k(W) P_k^{-1}` never overshoots. A client stops as soon as its
gap to its minimum is certified below :data:`RIDGE_GAP`: :math:`f_k` is
:math:`\lambda_k`-strongly convex (:math:`\lambda_k = c / n_k`), so
:math:`f_k(V) - \min f_k \le \lVert \nabla f_k(V) \rVert^2 / (2 \lambda_k)` at the point
:math:`V` where the gradient is taken, and the step from :math:`V` only lowers :math:`f_k`; a
certified client keeps that step while the others of its batch go on, so when it stops depends
on its own iterates alone. At most :data:`RIDGE_ITERATIONS` iterations either way.

A client with fewer (padded) rows than parameters per class is solved in its dual: the iterates
stay :math:`W = W_0 + \alpha \tilde X` (the gradient and its preconditioned step lie in the
span of the client's rows), so with :math:`K = \tilde X \tilde X^\top` and
:math:`M = \lambda_k I + \tfrac{1}{2 n_k} K` (push-through: :math:`\tilde X P_k^{-1} = M^{-1}
\tilde X`) the same iterates cost :math:`O(C n_k^2)` instead of :math:`O(C n_k d + C d^2)`
(:func:`_solve_bucket_dual`; equal to the primal's up to rounding).

Both forms run the same iteration (:func:`_iterate`) in few batched kernels: with
:math:`E = (S(Z) - Y) D_k` (:math:`S` the softmax over the classes of the logits :math:`Z`,
:math:`Y` the one-hot labels, :math:`D_k` the rows' weights, :math:`1/n_k` or 0), the primal's
gradient :math:`E \tilde X + \lambda_k (W - W_0)` is one batched product added to the
penalty's term, the dual's :math:`E + \lambda_k \alpha` two fused elementwise kernels; the
step is one product with the precomputed inverse, the momentum one interpolation.

The clients are sorted by size and solved in buckets of one padded length (:func:`padded_rows`;
examples padded with a row of zeros, of zero weight), every prior strength of a bucket in the
same vectorised call: :data:`RIDGE_ITERATIONS` Python steps per bucket, not one per minibatch of
every client. Client ``k``'s model reads its own training data, the start model and public
constants only, down to the last bit: every bucket of a padded length has the same number of
slots (:func:`bucket_clients`, empty slots solved for a placeholder and dropped), every pair of
a client and a prior strength has a slot of its own in every batched product, and the width
``d + 1`` is padded with zero features to a multiple of :data:`RIDGE_WIDTH_STEP`, so that every
batched call that involves client ``k`` has the same shapes and the same memory alignment of its
slot whoever the other clients are (a batched inverse rounds by alignment). A client solved
alone or beside any others, for one prior strength or beside other strengths, gets the same
bytes (``tests/federated/test_ridge.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from privmtl._validation import check_real
from privmtl.data.federated import FederatedDataset
from privmtl.federated.algorithms import Params

__all__ = [
    "RIDGE_BUCKET_ROWS",
    "RIDGE_GAP",
    "RIDGE_ITERATIONS",
    "bucket_clients",
    "padded_rows",
    "ridge_logreg",
]

RIDGE_ITERATIONS = 30
"""The most iterations of :func:`ridge_logreg` (fewer once a client's gap is certified below
:data:`RIDGE_GAP`): the objective ends near its minimum, closer the stronger the prior
(``tests/federated/test_ridge.py`` bounds the gap)."""
RIDGE_GAP = 1e-2
"""A client's solve stops once its objective is certified within this of its minimum (nats per
example): ``f_k`` is ``lambda_k``-strongly convex, so ``f_k(V) - min f_k <= |grad f_k(V)|^2 / (2
lambda_k)``, and the step taken from ``V`` lowers ``f_k`` further. At most
:data:`RIDGE_ITERATIONS` iterations either way."""
RIDGE_WIDTH_STEP = 4
"""The width of a client's rows with the bias (``d + 1``) is padded with zero features to a
multiple of this: ``(d + 1)^2`` floats then fill whole 64-byte lines, so that the matrices of a
batch all start at one alignment (a batched inverse rounds by alignment)."""
RIDGE_BUCKET_ROWS = 1 << 11
"""The most padded training rows (times the prior strengths) of one bucket of :func:`ridge_logreg`."""


def padded_rows(sizes: np.ndarray) -> np.ndarray:
    """The rows a client of each size is padded to: multiples of 8 up to 64, then steps of
    about an eighth, multiples of 8 (a public ladder of its own size: the shapes of a client's
    solve never depend on the other clients)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    ladder = [8]
    while ladder[-1] < max(int(sizes.max(initial=0)), 1):
        step = 8 if ladder[-1] < 64 else -(-ladder[-1] // 8 // 8) * 8
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
    gap: float = RIDGE_GAP,
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
        The most iterations of a client's solve.
    gap : float, default :data:`RIDGE_GAP`
        A client stops once its objective is certified within ``gap`` of its minimum (module
        docstring); 0: every client runs ``iterations``.
    bucket_rows : int, default :data:`RIDGE_BUCKET_ROWS`
        Clients of one padded length are solved together in :func:`bucket_clients` slots: this
        many padded rows (times the prior strengths). A client's model does not depend on the
        other clients, bit for bit; another value may round it differently in its last bits.

    Returns
    -------
    list of dict of str to Tensor
        One stacked model ``(m, ...)`` per prior strength.
    """
    gap = check_real("gap", gap, low=0.0)
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
    x_raw, y_raw, offsets = dataset.concat("train")
    n_rows, width = x_raw.shape[0], d + extra + 1
    x_flat = x_raw.reshape(n_rows, -1).to(device)
    y_flat = y_raw.to(device)
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
        pos = np.arange(rows_of)[None, :]
        valid = pos < n[full][:, None]
        own = torch.from_numpy(np.where(valid, pos + offsets[full][:, None], 0)).to(device)
        pad = torch.from_numpy(np.flatnonzero(~valid)).to(device)
        # the bucket's rows (x, 0, 1), its padding rows zero, gathered straight from the
        # clients' rows (one read of them, the bucket's buffer staying in cache)
        xt = x_flat.new_empty(slots, rows_of, width, dtype=dtype)
        xt[..., :d] = x_flat[own]
        xt[..., d:-1] = 0
        xt[..., -1] = torch.from_numpy(valid).to(device)
        xt.view(-1, width)[pad] = 0
        yt = y_flat[own]
        yt.view(-1)[pad] = 0
        sizes = torch.from_numpy(n[full]).to(device=device, dtype=dtype)
        solve = _solve_bucket_dual if rows_of < d + 1 else _solve_bucket
        solved = solve(xt, yt, sizes, w0, cs, iterations, gap)
        out[:, torch.from_numpy(idx).to(device)] = solved[:, : len(idx)]
        i = j
    return [
        {"linear.weight": o[..., :d].contiguous(), "linear.bias": o[..., -1].contiguous()}
        for o in out
    ]


def _weights(sizes: torch.Tensor, top: int) -> torch.Tensor:
    """The rows' weights ``(K, top)``: ``1 / n_k`` on client ``k``'s rows, 0 on its padding."""
    valid = torch.arange(top, device=sizes.device)[None, :] < sizes[:, None]
    return valid.to(sizes.dtype) / sizes[:, None]


def _solve_bucket(
    xt: torch.Tensor,
    y: torch.Tensor,
    sizes: torch.Tensor,
    w0: torch.Tensor,
    cs: torch.Tensor,
    iterations: int,
    gap: float = 0.0,
) -> torch.Tensor:
    """``(len(cs), K, C, d + 1)``: the K clients' solutions, rows ``(x, 1)`` ``xt (K, top, d + 1)``
    padded with zero rows to ``top``, labels ``y (K, top)``, ``sizes (K,)``."""
    k, top, width = xt.shape
    n_classes, n_ridges = w0.shape[0], len(cs)
    weights = _weights(sizes, top)
    gram = torch.bmm(xt.transpose(1, 2), xt * weights.unsqueeze(-1))  # A_k
    lam = cs[None, :] / sizes[:, None]  # (K, R)
    eye = torch.eye(width, dtype=xt.dtype, device=xt.device)
    precond = 0.5 * gram.unsqueeze(1) + lam[..., None, None] * eye
    inv = torch.cholesky_inverse(torch.linalg.cholesky(precond)).reshape(-1, width, width)
    xs = _per_ridge(xt, n_ridges)
    w = _iterate(w0, xs.transpose(1, 2), xs, y, weights, lam, inv, iterations, gap)
    return w.view(k, n_ridges, n_classes, width).transpose(0, 1)


def _solve_bucket_dual(
    xt: torch.Tensor,
    y: torch.Tensor,
    sizes: torch.Tensor,
    w0: torch.Tensor,
    cs: torch.Tensor,
    iterations: int,
    gap: float = 0.0,
) -> torch.Tensor:
    """:func:`_solve_bucket`'s iterates in the span of each client's rows (module docstring):
    ``W = W_0 + alpha X`` with ``alpha (len(cs), K, C, top)``; for ``top`` below ``d + 1``."""
    k, top, _ = xt.shape
    n_classes, n_ridges = w0.shape[0], len(cs)
    weights = _weights(sizes, top)
    kern = torch.bmm(xt, xt.transpose(1, 2))  # K, zero on padding rows and columns
    lam = cs[None, :] / sizes[:, None]  # (K, R)
    eye = torch.eye(top, dtype=xt.dtype, device=xt.device)
    m = 0.5 * (kern * weights.unsqueeze(1)).unsqueeze(1) + lam[..., None, None] * eye
    inv = torch.cholesky_inverse(torch.linalg.cholesky(m)).reshape(-1, top, top)
    logits0 = torch.bmm(w0.expand(k, *w0.shape), xt.transpose(1, 2))  # (K, C, top): W_0's
    alpha = _iterate(
        logits0, _per_ridge(kern, n_ridges), None, y, weights, lam, inv, iterations, gap
    )
    w = torch.baddbmm(w0.expand(k * n_ridges, *w0.shape), alpha, _per_ridge(xt, n_ridges))
    return w.view(k, n_ridges, n_classes, -1).transpose(0, 1)


def _per_ridge(t: torch.Tensor, n_ridges: int) -> torch.Tensor:
    """``t (K, ...)`` once per prior strength: ``(K R, ...)``, client-major."""
    return t.repeat_interleave(n_ridges, 0) if n_ridges > 1 else t.contiguous()


def _iterate(
    start: torch.Tensor,
    basis: torch.Tensor,
    rows: torch.Tensor | None,
    y: torch.Tensor,
    weights: torch.Tensor,
    lam: torch.Tensor,
    inv: torch.Tensor,
    iterations: int,
    gap: float = 0.0,
) -> torch.Tensor:
    """The last step of the iterates ``V (K R, C, p)`` (client-major) of both forms, with
    Nesterov momentum. The primal (``start``: ``W_0 (C, d + 1)``, ``rows`` the clients' rows
    ``(K R, top, d + 1)``): ``V = W`` from ``W_0``, logits ``Z = W basis``, gradient
    ``E rows + lambda (W - W_0)``. The dual (``start``: ``W_0 X^T (K, C, top)``, ``rows`` None):
    ``V = alpha`` from 0, logits ``Z = W_0 X^T + alpha basis``, gradient ``E + lambda alpha``.
    ``E = (S(Z) - Y) D_k`` (``Y``: the one-hot labels, ``D_k``: the rows' weights), ``basis
    (K R, p, top)``; the step ``V - G inv`` (``inv (K R, p, p)``)."""
    n_ridges, kr = lam.shape[1], lam.numel()
    n_classes, p = start.shape[-2], basis.shape[1]
    one_hot = torch.nn.functional.one_hot(y, n_classes).to(start.dtype)
    neg_target = _per_ridge((one_hot * -weights.unsqueeze(-1)).transpose(1, 2), n_ridges)
    w_rows = _per_ridge(weights.unsqueeze(1), n_ridges)  # (K R, 1, top)
    lam_kr = lam.reshape(-1, 1, 1)
    if rows is None:  # the dual
        z0 = _per_ridge(start, n_ridges)
        v = prev = start.new_zeros(kr, n_classes, p)
    else:
        v = prev = start.expand(kr, n_classes, p)
        pull = -lam_kr * start  # the penalty's gradient is lambda W + pull
    # certified once |grad|^2 <= 2 lambda gap: f is lambda-strongly convex, so its gap to the
    # minimum is at most |grad|^2 / (2 lambda); the dual's norm costs a product: every other step
    limit = (2.0 * gap) * lam_kr if gap > 0 else None
    every = 1 if rows is not None else 2
    done: torch.Tensor | None = None
    for t in range(iterations):
        check = limit is not None and t % every == every - 1
        if rows is None:
            probs = torch.softmax(torch.baddbmm(z0, v, basis), 1)
            grad = torch.addcmul(torch.addcmul(neg_target, probs, w_rows), v, lam_kr)
            # the primal gradient is grad X: its squared norm is tr(grad K grad^T)
            sq = (torch.bmm(grad, basis) * grad).sum((1, 2), keepdim=True) if check else None
        else:
            probs = torch.softmax(torch.bmm(v, basis), 1)
            resid = torch.addcmul(neg_target, probs, w_rows)
            grad = torch.baddbmm(torch.addcmul(pull, v, lam_kr), resid, rows)
            sq = grad.square().sum((1, 2), keepdim=True) if check else None
        step = torch.baddbmm(v, grad, inv, alpha=-1)
        if done is not None:
            step = torch.where(done, prev, step)  # a client certified before keeps its step
        if sq is not None and limit is not None:
            newly = sq <= limit
            done = newly if done is None else done | newly
            n_done = int(done.sum())
            if n_done == kr:
                return step
            if n_done == 0:
                done = None
        v = torch.lerp(step, prev, -t / (t + 3))  # Nesterov: step + t / (t + 3) (step - prev)
        prev = step
    return prev
