"""Per-client gradients of the batched engine (``privmtl.federated.gradients``)."""

from __future__ import annotations

import pytest
import torch

from privmtl.federated.gradients import make_step_fn, tape_free
from privmtl.federated.models import FemnistCNN, MultinomialLogReg


class _Taped(MultinomialLogReg):
    """The same model through the generic path: autograd over ``forward_batched``."""


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("k", "b"), [(1, 1), (3, 10), (64, 10), (17, 32)])
def test_the_logreg_step_is_autograds_bit_for_bit(dtype: torch.dtype, k: int, b: int) -> None:
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
    assert torch.equal(l_fast, l_taped)
    for name in params:
        assert g_fast[name].dtype == dtype
        assert torch.equal(g_fast[name], g_taped[name]), name


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
