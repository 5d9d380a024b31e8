r"""The one client step of the federated family: local SGD of the sampled clients.

Every federated method runs the same local loop on the clients sampled in a round; they differ
only in the *update rule* applied after each minibatch gradient :math:`g` of the data term (the
minibatch mean cross-entropy):

:class:`ProxStep`
    :math:`w \leftarrow w - \eta\,(g + \rho\,(w - a))`, then optionally
    :math:`w \leftarrow \Pi_B(w) = w\min(1, B/\lVert w\rVert_2)` (norm over all parameters). With
    :math:`\rho = 0` this is plain SGD (FedAvg, local training); :math:`\rho = \lambda` and
    :math:`a = \tilde w` is PMTL's mean-regularized step (FedProx: :math:`\rho = \mu`); the
    projection is the workshop variant's.
:class:`SplitStep`
    PP-SGD (Bietti et al. 2022): the client holds a shared part :math:`u` and a local part
    :math:`\theta`, predicts with :math:`u + \theta`, and with :math:`g` the gradient at
    :math:`u+\theta` steps :math:`u \leftarrow u - \eta g` and
    :math:`\theta \leftarrow \theta - \alpha\eta\,(g + \mu\theta)`.

:func:`local_sgd_batched` trains all clients of a round together (one vectorised gradient per
step over stacked parameters ``(K, ...)``; a client without a ``s``-th minibatch is dropped from
step ``s``, not masked); :func:`local_sgd_reference` is the per-client loop with ordinary
autograd, the oracle the batched path is tested against. Both consume the same minibatch plan
(:func:`~privmtl.federated.algorithms.draw_round_plan`) and apply the same rule.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from privmtl.federated.algorithms import PackedPlan, Params, pack_plan
from privmtl.federated.gradients import joins_sets, logreg_sets_losses, logreg_sets_step

__all__ = [
    "GATHER_BYTES",
    "ProxStep",
    "SplitStep",
    "UpdateRule",
    "local_sgd_batched",
    "local_sgd_reference",
    "local_sgd_sets",
    "split_names",
]

StepFn = Callable[..., tuple[Params, torch.Tensor]]

#: The most bytes of minibatch rows :func:`local_sgd_batched` gathers at once for a whole plan
#: (beyond it, each step gathers its own rows).
GATHER_BYTES = 64 << 20

#: Prefix of the local part's entries in a :class:`SplitStep` state.
_LOCAL = "local::"


def split_names(name: str) -> str:
    """The state key of the local (PP-SGD) part of parameter ``name``."""
    return _LOCAL + name


class UpdateRule:
    """How a client's state moves after a minibatch gradient (see the module docstring).

    ``params_at(state)`` gives the model parameters at which the gradient is taken (stacked
    ``(K, ...)``); ``apply_(names, state, grads)`` updates the listed state tensors in place.
    """

    def params_at(self, state: Params) -> Params:
        return state

    def apply_(self, state: Params, grads: Params) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class ProxStep(UpdateRule):
    """:math:`w \\leftarrow \\Pi_B(w - \\eta(g + \\rho(w - a)))` (no projection when ``ball`` is None).

    Parameters missing from ``anchor`` (the personal layers of partial sharing) take the plain
    step :math:`w - \\eta g`.
    """

    lr: float
    anchor: Params | None = None
    weight: float = 0.0
    ball: float | None = None

    def apply_(self, state: Params, grads: Params) -> None:
        names = list(state)
        cur = [state[n] for n in names]
        gs = [grads[n] for n in names]
        anchor = self.anchor if self.anchor is not None and self.weight else None
        steps: list[torch.Tensor]
        if anchor is not None and all(n in anchor for n in names):
            steps = list(torch._foreach_sub(cur, [anchor[n] for n in names]))
            torch._foreach_mul_(steps, self.weight)
            torch._foreach_add_(steps, gs)
        elif anchor is not None:  # partial sharing: only the anchor's parameters are pulled to it
            steps = [
                g + self.weight * (c - anchor[n]) if n in anchor else g
                for n, c, g in zip(names, cur, gs, strict=True)
            ]
        else:
            steps = gs
        torch._foreach_add_(cur, steps, alpha=-self.lr)
        if self.ball is not None:
            sq = sum(p.double().flatten(1).pow(2).sum(1) for p in cur)
            norms = torch.as_tensor(sq).sqrt()
            fac = torch.where(norms > self.ball, self.ball / norms.clamp_min(1e-30), 1.0)
            for p in cur:
                p.mul_(fac.to(p.dtype).view((-1,) + (1,) * (p.ndim - 1)))


@dataclass(frozen=True)
class SplitStep(UpdateRule):
    """PP-SGD: shared ``u`` (the model's names) and local ``θ`` (``split_names(name)``)."""

    lr: float
    alpha: float
    mu: float

    def params_at(self, state: Params) -> Params:
        return {n: p + state[split_names(n)] for n, p in state.items() if not n.startswith(_LOCAL)}

    def apply_(self, state: Params, grads: Params) -> None:
        for n, g in grads.items():
            th = state[split_names(n)]
            state[n].sub_(self.lr * g)
            th.sub_(self.alpha * self.lr * (g + self.mu * th))


def local_sgd_batched(
    step_fn: StepFn,
    starts: Params,
    rule: UpdateRule,
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    plan: list[list[np.ndarray]] | PackedPlan,
    batch_size: int,
) -> tuple[Params, list[float]]:
    """Local SGD of all clients of ``plan`` at once (module docstring).

    ``starts`` holds the stacked state ``(K, ...)`` of the ``K`` clients of ``plan``; returns
    their new state and each client's mean minibatch loss (NaN for a client without steps).
    Minibatches shorter than ``batch_size`` are padded with zero-weight rows. Everything runs on
    the device of ``starts`` (and of ``x_all``, ``y_all``); the plan is drawn on the CPU and
    moved there.

    The clients train in the plan's packed order (:func:`~privmtl.federated.algorithms.pack_plan`:
    by decreasing number of steps), so that those still training at a step are a leading slice
    of the stacked state: each step computes on views of it, in place, and reads its minibatches
    from rows gathered once for the whole plan (when they fit :data:`GATHER_BYTES`; else one
    gather a step). A client's arithmetic is the same whichever clients train beside it.
    """
    packed = plan if isinstance(plan, PackedPlan) else pack_plan(plan, batch_size)
    names = list(starts)
    first = starts[names[0]]
    device, dtype, k = first.device, first.dtype, packed.n_clients
    identity = bool((packed.order == np.arange(k)).all())
    order = torch.from_numpy(packed.order).to(device)
    state = {n: starts[n].clone() if identity else starts[n].index_select(0, order) for n in names}
    rows = torch.from_numpy(packed.rows).to(device)
    weights = torch.from_numpy(packed.weights).to(device=device, dtype=dtype)
    row_bytes = x_all[:1].numel() * x_all.element_size() + y_all.element_size()
    gathered = rows.numel() * row_bytes <= GATHER_BYTES
    x_rows, y_rows = _gather(x_all, y_all, rows) if gathered else (x_all, y_all)
    loss_sum = torch.zeros(k, dtype=torch.float64, device=device)
    bounds = packed.bounds.tolist()
    with torch.no_grad():
        for a, b in itertools.pairwise(bounds):
            n = b - a
            cur = state if n == k else {name: p[:n] for name, p in state.items()}
            if gathered:
                x, y = x_rows[a:b], y_rows[a:b]
            else:
                x, y = _gather(x_all, y_all, rows[a:b])
            grads, loss = step_fn(rule.params_at(cur), x, y, weights[a:b])
            rule.apply_(cur, grads)
            if n == k:
                loss_sum += loss.double()
            else:
                loss_sum[:n] += loss.double()
    n_steps = torch.from_numpy(packed.steps[packed.order]).to(device).double()
    losses = torch.where(n_steps > 0, loss_sum / n_steps.clamp_min(1), torch.nan)
    if identity:
        return state, losses.tolist()
    back = torch.from_numpy(np.argsort(packed.order)).to(device)
    news = {n: p.index_select(0, back) for n, p in state.items()}
    return news, losses.index_select(0, back).tolist()


def local_sgd_sets(
    step_fn: StepFn,
    sets: Sequence[tuple[Params, UpdateRule]],
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    plan: list[list[np.ndarray]] | PackedPlan,
    batch_size: int,
) -> list[tuple[Params, list[float]]]:
    """:func:`local_sgd_batched` of several sets of states of the same clients on the same plan,
    each ``(starts, rule)`` with its own rule (Ditto: the personal models pulled to the
    billboard, the billboard's copies not pulled): ``[local_sgd_batched(step_fn, starts, rule,
    ...) for starts, rule in sets]``.

    For the by-hand logistic step (:func:`~privmtl.federated.gradients.joins_sets`) and
    :class:`ProxStep` rules of one learning rate without a ball, a client's models of every set
    are held as one model (:func:`~privmtl.federated.gradients.logreg_sets_step`): a step reads
    each minibatch row once and takes every set's gradients in two products and one update, each
    set's mathematics its own (its loss, its pull); the last bits differ from the trainings one
    after the other. Other steps and rules train the sets one after the other.
    """
    packed = plan if isinstance(plan, PackedPlan) else pack_plan(plan, batch_size)
    row_bytes = (x_all[:1].numel() + 1) * x_all.element_size() + y_all.element_size()
    if not (_joint_rules(sets) and joins_sets(step_fn)) or (
        packed.rows.size * row_bytes > GATHER_BYTES
    ):
        return [local_sgd_batched(step_fn, s, r, x_all, y_all, packed, batch_size) for s, r in sets]
    return _logreg_sets(sets, x_all, y_all, packed)


_LOGREG = ("linear.weight", "linear.bias")


def _joint_rules(sets: Sequence[tuple[Params, UpdateRule]]) -> bool:
    """Whether every set is a logistic model's state under a :class:`ProxStep` of one learning
    rate, without a ball, whose anchor (if it pulls) covers the whole model."""
    if not all(type(r) is ProxStep for _, r in sets):
        return False
    rules = [cast(ProxStep, r) for _, r in sets]
    if len({r.lr for r in rules}) != 1 or any(r.ball is not None for r in rules):
        return False
    for (starts, _), rule in zip(sets, rules, strict=True):
        whole = rule.anchor is None or not rule.weight or set(rule.anchor) == set(_LOGREG)
        if tuple(starts) != _LOGREG or not whole:
            return False
    return True


def _logreg_sets(
    sets: Sequence[tuple[Params, UpdateRule]],
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    packed: PackedPlan,
) -> list[tuple[Params, list[float]]]:
    """:func:`local_sgd_sets`'s loop with every set's logistic models of a client as one
    ``(r C, d + 1)`` model (the bias as the last column, the rows with a last column of ones).

    Everything a step needs beyond its products is prepared once for the plan (the rows, their
    labels, weights and :math:`-w_i e_{y_i}`; each set's pull as one anchor and one weight per
    row of the joint model), and the losses are computed after the loop from what each step
    wrote into two buffers, so that a step is a few tensor operations whatever the sets."""
    rules = [cast(ProxStep, r) for _, r in sets]
    r, lr = len(sets), rules[0].lr
    first = sets[0][0]["linear.weight"]
    device, dtype, k = first.device, first.dtype, packed.n_clients
    c, d = first.shape[1:]
    order = torch.from_numpy(packed.order).to(device)
    joint = [torch.cat([s["linear.weight"], s["linear.bias"].unsqueeze(-1)], -1) for s, _ in sets]
    state = torch.cat(joint, 1).index_select(0, order)  # (K, r C, d + 1), packed order
    pulls = [bool(rule.weight and rule.anchor is not None) for rule in rules]
    anchor = rho = None
    if any(pulls):  # each set's rows pulled to its anchor with its weight (0: not pulled)
        zero = first.new_zeros((c, d + 1))
        anchor = torch.cat([
            torch.cat([rl.anchor["linear.weight"], rl.anchor["linear.bias"].unsqueeze(-1)], -1)
            if p and rl.anchor is not None else zero
            for rl, p in zip(rules, pulls, strict=True)
        ]).unsqueeze(0)  # fmt: skip
        rho = torch.tensor(
            [float(rl.weight) if p else 0.0 for rl, p in zip(rules, pulls, strict=True)],
            dtype=dtype, device=device,
        ).repeat_interleave(c).view(1, r * c, 1)  # fmt: skip
        # one weight a parameter, laid out as a model: a product broadcast only over the
        # clients (over the features too, it costs a step a third more)
        rho = rho.expand(1, r * c, d + 1).contiguous()
    rows = torch.from_numpy(packed.rows).to(device)
    slots, b = rows.shape
    flat = rows.reshape(-1)
    x_rows = _gather_with_ones(x_all.reshape(len(x_all), d), flat).view(slots, b, d + 1)
    y_rows = y_all.index_select(0, flat).view(slots, b, 1, 1)
    w_rows = torch.from_numpy(packed.weights).to(device=device, dtype=dtype).view(slots, b, 1, 1)
    neg_onehot = torch.zeros((slots, b, 1, c), dtype=dtype, device=device)
    neg_onehot.scatter_(-1, y_rows, -w_rows)
    # laid out for every model of a client: an added term of the model's shape (a broadcast
    # add over the models costs a step several times the same add of a whole tensor)
    neg_onehot = neg_onehot.expand(slots, b, r, c).contiguous()
    at = y_rows.expand(slots, b, r, 1)
    picked = torch.empty((slots, b, r, 1), dtype=dtype, device=device)
    total = torch.empty_like(picked)
    sizes = np.diff(packed.bounds).tolist()  # the clients a step trains: the plan's first
    # every step's rows, as views made in one call a tensor (not seven slices a step)
    steps = zip(
        *(t.split(sizes) for t in (x_rows, at, w_rows, neg_onehot, picked, total)), strict=True
    )
    with torch.no_grad():
        for size, (xs, ats, ws, negs, picks, totals) in zip(sizes, steps, strict=True):
            cur = state[:size]
            grad = logreg_sets_step(cur, xs, ats, ws, negs, picks, totals)[0]
            if (
                anchor is not None and rho is not None
            ):  # each pulled set's gradient plus rho (w - a)
                grad.addcmul_(cur - anchor, rho)
            cur.add_(grad, alpha=-lr)
        # a slot's losses to its client (the slots of step s are the plan's first clients)
        ends = packed.bounds[1:]
        client = np.arange(slots) - np.repeat(packed.bounds[:-1], ends - packed.bounds[:-1])
        per_slot = logreg_sets_losses(picked, total, w_rows).double()
        loss_sum = per_slot.new_zeros((k, r)).index_add_(
            0, torch.from_numpy(client).to(device), per_slot
        )
    n_steps = torch.from_numpy(packed.steps[packed.order]).to(device).double().unsqueeze(-1)
    losses = torch.where(n_steps > 0, loss_sum / n_steps.clamp_min(1), torch.nan)
    back = torch.from_numpy(np.argsort(packed.order)).to(device)
    state, losses = state.index_select(0, back), losses.index_select(0, back)
    out = []
    for i in range(r):
        own = state[:, i * c : (i + 1) * c]
        news = {"linear.weight": own[..., :d].contiguous(), "linear.bias": own[..., d].contiguous()}
        out.append((news, losses[:, i].tolist()))
    return out


#: Rows :func:`_gather_with_ones` copies through one buffer at a time.
_ONES_CHUNK = 2048


def _gather_with_ones(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``x[rows]`` with a last column of ones, ``(len(rows), d + 1)``: the rows are gathered a
    chunk at a time through one small buffer, so that the round holds one array of its rows."""
    n, d = len(rows), x.shape[1]
    out = x.new_empty((n, d + 1))
    out[:, d] = 1
    buf = x.new_empty((min(n, _ONES_CHUNK), d))
    for lo in range(0, n, _ONES_CHUNK):
        hi = min(lo + _ONES_CHUNK, n)
        part = torch.index_select(x, 0, rows[lo:hi], out=buf[: hi - lo])
        out[lo:hi, :d] = part
    return out


def _gather(
    x_all: torch.Tensor, y_all: torch.Tensor, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_all[rows], y_all[rows])`` by whole rows (``index_select``: a row is one copy,
    where advanced indexing copies it element by element)."""
    flat = rows.reshape(-1)
    x = x_all.index_select(0, flat).view(*rows.shape, *x_all.shape[1:])
    return x, y_all.index_select(0, flat).view(rows.shape)


def local_sgd_reference(
    model: nn.Module,
    buffers: Params,
    starts: Params,
    rule: UpdateRule,
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    plan: list[list[np.ndarray]],
) -> tuple[Params, list[float]]:
    """The same local SGD one client after the other, with ordinary autograd per minibatch."""
    outs: list[Params] = []
    losses: list[float] = []
    for j, steps in enumerate(plan):
        state = {n: p[j : j + 1].detach().clone() for n, p in starts.items()}
        total = 0.0
        for rows in steps:
            idx = torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(x_all.device)
            at = rule.params_at(state)
            leaves = {n: p[0].detach().requires_grad_(True) for n, p in at.items()}
            with torch.enable_grad():
                logits = functional_call(model, (leaves, buffers), (x_all[idx],))
                loss = F.cross_entropy(logits, y_all[idx])
                grads = torch.autograd.grad(loss, list(leaves.values()))
            total += float(loss.detach())
            with torch.no_grad():
                rule.apply_(state, {n: g.unsqueeze(0) for n, g in zip(leaves, grads, strict=True)})
        outs.append(state)
        losses.append(total / len(steps) if steps else math.nan)
    return {n: torch.cat([o[n] for o in outs]) for n in starts}, losses
