"""Per-client gradients of the batched engine (``privmtl.federated.gradients``)."""

from __future__ import annotations

import math

import pytest
import torch

from privmtl.federated.gradients import (
    joins_sets,
    logreg_sets_losses,
    logreg_sets_step,
    make_step_fn,
    tape_free,
)
from privmtl.federated.models import FemnistCNN, MultinomialLogReg


class _Taped(MultinomialLogReg):
    """The same model through the generic path: autograd over ``forward_batched``."""


def _within_rounding(fast: torch.Tensor, taped: torch.Tensor, scale: torch.Tensor) -> None:
    """``|fast - taped| <= 16 eps scale`` element by element: two computations of the same
    sum of terms, each rounded to the dtype (``eps``), whose absolute values sum to at most
    ``scale``, differ by a few units of ``eps * scale`` (16: the exponential, the division and
    the sums' reorderings, with room)."""
    eps = torch.finfo(fast.dtype).eps
    assert fast.shape == taped.shape and fast.dtype == taped.dtype
    assert bool(((fast - taped).abs() <= 16 * eps * scale).all()), (fast - taped).abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("k", "b"), [(1, 1), (3, 10), (64, 10), (17, 32)])
def test_the_logreg_step_is_autograds_within_rounding(dtype: torch.dtype, k: int, b: int) -> None:
    # the by-hand step computes autograd's mathematics with other kernels (a softmax by hand, the
    # product g^T x): equal to the taped path's up to the rounding of each term
    d, c = 13, 5
    g = torch.Generator().manual_seed(k * 100 + b)
    params = {
        "linear.weight": torch.randn(k, c, d, generator=g, dtype=dtype),
        "linear.bias": torch.randn(k, c, generator=g, dtype=dtype),
    }
    x = torch.randn(k, b, d, generator=g, dtype=dtype)
    y = torch.randint(0, c, (k, b), generator=g)
    w = torch.rand(k, b, generator=g, dtype=dtype) / b
    w[:, -1] = 0.0  # a padded row
    fast = make_step_fn(MultinomialLogReg(d, c), {})
    taped = make_step_fn(_Taped(d, c), {})
    assert fast is not taped  # the by-hand step is taken for the model itself only
    (g_fast, l_fast), (g_taped, l_taped) = fast(params, x, y, w), taped(params, x, y, w)
    # a row's gradient term w_i (p_i - e_y) x_i is at most 2 w_i |x_i| in absolute value; its
    # loss term w_i CE_i at most w_i (2 max |z_i| + log C)
    logits = x @ params["linear.weight"].transpose(1, 2) + params["linear.bias"].unsqueeze(1)
    ce_scale = (w * (2 * logits.abs().amax(-1) + math.log(c))).sum(1)
    _within_rounding(l_fast, l_taped, ce_scale)
    _within_rounding(g_fast["linear.weight"], g_taped["linear.weight"],
                     2 * (w.unsqueeze(-1) * x.abs()).sum(1).unsqueeze(1))  # fmt: skip
    _within_rounding(g_fast["linear.bias"], g_taped["linear.bias"], 2 * w.sum(1, keepdim=True))


def test_the_logreg_step_is_the_gradient() -> None:
    """Against an independent oracle: the closed form (softmax - one-hot) x, float64."""
    d, c, k, b = 7, 4, 3, 6
    g = torch.Generator().manual_seed(0)
    params = {
        "linear.weight": torch.randn(k, c, d, generator=g, dtype=torch.float64),
        "linear.bias": torch.randn(k, c, generator=g, dtype=torch.float64),
    }
    x = torch.randn(k, b, d, generator=g, dtype=torch.float64)
    y = torch.randint(0, c, (k, b), generator=g)
    w = torch.rand(k, b, generator=g, dtype=torch.float64)
    grads, losses = make_step_fn(MultinomialLogReg(d, c), {})(params, x, y, w)
    logits = x @ params["linear.weight"].transpose(1, 2) + params["linear.bias"].unsqueeze(1)
    resid = (torch.softmax(logits, -1) - torch.nn.functional.one_hot(y, c)) * w.unsqueeze(-1)
    torch.testing.assert_close(grads["linear.weight"], resid.transpose(1, 2) @ x)
    torch.testing.assert_close(grads["linear.bias"], resid.sum(1))
    ce = -torch.log_softmax(logits, -1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(losses, (ce * w).sum(1))


def test_tape_free_is_the_logistic_regression_through_its_own_step() -> None:
    """The models whose rounds run on one thread: those :func:`make_step_fn` steps by hand."""
    assert tape_free(MultinomialLogReg(3, 2)) and tape_free(MultinomialLogReg(3, 2), "model")
    assert not tape_free(MultinomialLogReg(3, 2), "vmap")
    assert not tape_free(_Taped(3, 2)) and not tape_free(FemnistCNN())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("k", "b", "r"), [(1, 1, 1), (3, 10, 2), (17, 32, 3)])
def test_the_sets_step_is_each_models_step_within_rounding(
    dtype: torch.dtype, k: int, b: int, r: int
) -> None:
    # r models of each client held as one (r C, d + 1) model, the bias as the last column and
    # the rows with a column of ones: each model's gradient and loss are its own step's, within
    # the rounding bound of the by-hand step against autograd
    d, c = 13, 5
    g = torch.Generator().manual_seed(k * 100 + b + r)
    weights = torch.randn(r, k, c, d, generator=g, dtype=dtype)
    biases = torch.randn(r, k, c, generator=g, dtype=dtype)
    x = torch.randn(k, b, d, generator=g, dtype=dtype)
    y = torch.randint(0, c, (k, b), generator=g)
    w = torch.rand(k, b, generator=g, dtype=dtype)
    joint = torch.cat([torch.cat([weights[i], biases[i].unsqueeze(-1)], -1) for i in range(r)], 1)
    xa = torch.cat([x, torch.ones(k, b, 1, dtype=dtype)], -1)
    neg_onehot = torch.zeros(k, b, 1, c, dtype=dtype).scatter_(
        -1, y.view(k, b, 1, 1), -w.view(k, b, 1, 1)
    )
    at = y.view(k, b, 1, 1).expand(k, b, r, 1)
    grad, picked, total = logreg_sets_step(joint, xa, at, w.view(k, b, 1, 1), neg_onehot)
    losses = logreg_sets_losses(picked, total, w.view(k, b, 1, 1))
    assert grad.shape == (k, r * c, d + 1) and losses.shape == (k, r)
    step = make_step_fn(MultinomialLogReg(d, c), {})
    assert joins_sets(step) and not joins_sets(make_step_fn(_Taped(d, c), {}))
    row_scale = 2 * (w.unsqueeze(-1) * xa.abs()).sum(1).unsqueeze(1)  # |w_i (p_i - e_y) x_i| sums
    for i in range(r):
        one = {"linear.weight": weights[i], "linear.bias": biases[i]}
        g_one, l_one = step(one, x, y, w)
        logits = x @ weights[i].transpose(1, 2) + biases[i].unsqueeze(1)
        ce_scale = (w * (2 * logits.abs().amax(-1) + math.log(c))).sum(1)
        _within_rounding(losses[:, i], l_one, ce_scale)
        part = grad[:, i * c : (i + 1) * c]
        _within_rounding(part[..., :d], g_one["linear.weight"], row_scale[..., :d])
        _within_rounding(part[..., d], g_one["linear.bias"], row_scale[..., d])
