"""Per-client gradients of the weighted cross-entropy over stacked client parameters.

The function :func:`make_step_fn` returns is what every local SGD step of the batched engine
calls (:func:`~privmtl.federated.client.local_sgd_batched`); the in-process driver
(:class:`~privmtl.federated.protocol.Trainer`) and the Flower client build it here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from privmtl.federated.algorithms import Params
from privmtl.federated.models import MultinomialLogReg

__all__ = [
    "StepFn",
    "joins_sets",
    "logreg_sets_losses",
    "logreg_sets_step",
    "make_step_fn",
    "tape_free",
]

StepFn = Callable[..., tuple[Params, torch.Tensor]]


def tape_free(model: nn.Module, vectorize: str = "auto") -> bool:
    """Whether :func:`make_step_fn` gives ``model`` the by-hand step (:func:`_logreg_step`): a
    few small tensor operations a step, so threads cost more in dispatch and contention than
    they save (the rounds of such a model run on one thread)."""
    return vectorize in ("auto", "model") and type(model) is MultinomialLogReg


def make_step_fn(model: nn.Module, buffers: Params, vectorize: str = "auto") -> StepFn:
    """Per-client ``(grads, losses)`` of the weighted cross-entropy over stacked client params.

    The returned function maps ``params (K, ...)``, ``x (K, B, ...)``, ``y (K, B)`` and row weights
    ``w (K, B)`` to per-client gradients and losses of :math:`\\sum_i w_i\\,\\mathrm{CE}_i`.
    ``vectorize="vmap"`` uses ``vmap(grad_and_value(...))`` over
    :func:`~torch.func.functional_call` (works for any module; ``functional_call`` swaps the
    module's parameters while it runs, so a module must not be shared between threads);
    ``"model"`` uses the model's ``forward_batched`` and differentiates the sum of the
    per-client losses (client ``k``'s gradient is the gradient of that sum with respect to its
    slice); ``"auto"`` picks ``"model"`` when the model has ``forward_batched``. For a
    :class:`~privmtl.federated.models.MultinomialLogReg`, ``"model"`` computes that gradient
    without the autograd tape (:func:`_logreg_step`): the same mathematics with cheaper kernels,
    equal to autograd's within the rounding of each term.
    """
    if vectorize == "auto":
        vectorize = "model" if callable(getattr(model, "forward_batched", None)) else "vmap"
    if tape_free(model, vectorize):
        return _logreg_step
    if vectorize == "model":
        forward_batched: Callable[[Params, torch.Tensor], torch.Tensor] = cast(
            Any, model
        ).forward_batched

        def step(
            params: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor
        ) -> tuple[Params, torch.Tensor]:
            leaves = {name: p.detach().requires_grad_(True) for name, p in params.items()}
            with torch.enable_grad():
                logits = forward_batched(leaves, x)
                ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
                losses = (ce.view_as(w) * w).sum(1)
                grads = torch.autograd.grad(losses.sum(), list(leaves.values()))
            return dict(zip(leaves, grads, strict=True)), losses.detach()

        return step

    def loss_fn(params: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, (params, buffers), (x,))
        return (F.cross_entropy(logits, y, reduction="none") * w).sum()

    return vmap(grad_and_value(loss_fn), in_dims=(0, 0, 0, 0), randomness="different")  # type: ignore[no-any-return]


def _logreg_step(
    params: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor
) -> tuple[Params, torch.Tensor]:
    r""":func:`make_step_fn`'s ``"model"`` step of a multinomial logistic regression, by hand.

    With logits :math:`z = W x + b` (``baddbmm``, as ``forward_batched``), the row's log-sum-exp
    :math:`\ell = m + \log \sum_c e^{z_c - m}` (:math:`m = \max_c z_c`, so no exponential
    overflows), the loss :math:`\sum_i w_i (\ell_i - z_{i, y_i})` and the gradient of that
    sum with respect to the logits, :math:`g_i = w_i (\mathrm{softmax}(z_i) - e_{y_i})`; the
    weights' gradient is the product :math:`g^\top x` and the bias's :math:`\sum_i g_i`. The
    mathematics of autograd's path through ``log_softmax`` and the negative log-likelihood, with
    kernels that cost less at the engine's shapes (the softmax as a maximum, an exponential and
    a sum, and the product :math:`g^\top x`, instead of the log-softmax kernels, whose rows of a
    few classes are slow, and a product with a transposed output); the last bits differ from
    autograd's, within a few units of the dtype's rounding of each term
    (``tests/federated/test_gradients.py``).
    """
    weight, bias = params["linear.weight"], params["linear.bias"]
    k, b = x.shape[:2]
    xf = x.reshape(k, b, weight.shape[-1])
    logits = torch.baddbmm(bias.unsqueeze(1), xf, weight.transpose(1, 2))
    shifted = logits - logits.amax(-1, keepdim=True)
    e = shifted.exp()
    total = e.sum(-1, keepdim=True)
    at = y.unsqueeze(-1)
    losses = ((total.log().squeeze(-1) - shifted.gather(-1, at).squeeze(-1)) * w).sum(1)
    grad = e.mul_(w.unsqueeze(-1) / total)  # w_i softmax(z_i)
    grad.scatter_add_(-1, at, (-w).unsqueeze(-1).to(grad.dtype))  # - w_i e_{y_i}
    grads = {"linear.weight": torch.bmm(grad.transpose(1, 2), xf), "linear.bias": grad.sum(1)}
    return grads, losses


def joins_sets(step_fn: StepFn) -> bool:
    """Whether ``step_fn`` is the by-hand logistic step, whose model several sets of states of
    the same clients can share as one (:func:`logreg_sets_step`)."""
    return step_fn is _logreg_step


def logreg_sets_step(
    weight: torch.Tensor,
    x: torch.Tensor,
    at: torch.Tensor,
    w: torch.Tensor,
    neg_onehot: torch.Tensor,
    picked: torch.Tensor | None = None,
    total: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r""":func:`_logreg_step` of ``r`` logistic models of each client at once, on the same rows.

    ``weight (n, r C, d + 1)`` holds a client's ``r`` models one under the other, each its
    weights with its bias as the last column; ``x (n, B, d + 1)`` the minibatch rows with a
    last column of ones (so that one product gives every model's logits, bias included, and one
    product every model's gradient, each row read once); ``at (n, B, r, 1)`` the labels,
    ``w (n, B, 1, 1)`` the row weights and ``neg_onehot (n, B, 1, C)`` the rows' :math:`-w_i
    e_{y_i}` (or the same for every model, ``(n, B, r, C)``: the same sums, a faster add).
    Returns each model's gradient of its own :math:`\sum_i w_i \mathrm{CE}_i`
    (``(n, r C, d + 1)``, laid out as ``weight``) and what its losses are made of, the logit of
    the label less the row's maximum and the sum of the shifted exponentials (``(n, B, r, 1)``
    each, written to ``picked`` and ``total`` when given; :func:`logreg_sets_losses`): the
    mathematics of :func:`_logreg_step` for each model alone, within the dtype's rounding of it.
    """
    n, b = x.shape[:2]
    r = at.shape[2]
    c = weight.shape[1] // r
    logits = torch.bmm(x, weight.transpose(1, 2)).view(n, b, r, c)
    shifted = logits.sub_(logits.amax(-1, keepdim=True))
    picked = torch.gather(shifted, -1, at, out=picked)  # type: ignore[call-overload]
    e = shifted.exp_()
    total = torch.sum(e, -1, keepdim=True, out=total)  # type: ignore[call-overload]
    grad = e.mul_(w / total).add_(neg_onehot)  # w_i (softmax(z_i) - e_{y_i})
    return torch.bmm(grad.view(n, b, r * c).transpose(1, 2), x), picked, total


def logreg_sets_losses(picked: torch.Tensor, total: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    r"""The losses :math:`\sum_i w_i (\log \sum_c e^{z_{ic} - m_i} - (z_{i y_i} - m_i))` of
    :func:`logreg_sets_step`'s parts, ``(n, r)``."""
    return (total.log().sub_(picked).mul_(w)).sum(1).squeeze(-1)
