"""Every client's local training over a grid of (epochs, step size) at once: the closed-form
gradient of a logistic regression, the batched SGD and Adam steps, and the early stop on the
client's own validation split (the grid of
:func:`~privmtl.federated.end_of_run.local.train_local`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import grad, vmap

from privmtl.data.federated import FederatedDataset
from privmtl.federated.algorithms import Params
from privmtl.federated.end_of_run.finetune import (
    _pad_own,
    _plan_arrays,
    finetune,
    finetune_objective,
)
from privmtl.federated.end_of_run.local_budget import client_epochs
from privmtl.federated.gradients import make_step_fn
from privmtl.federated.models import MultinomialLogReg
from privmtl.federated.scoring import client_scores

__all__ = ["ADAM_BETAS", "ADAM_EPS"]

ADAM_BETAS = (0.9, 0.999)
"""Adam's decay rates of the first and second moments (those of :class:`torch.optim.Adam`)."""
ADAM_EPS = 1e-8
"""Adam's term added to the root of the second moment (that of :class:`torch.optim.Adam`)."""


def _logreg_grad(p: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> Params:
    r"""Per-row gradient of :math:`\sum_i w_i \mathrm{CE}(W x_i + b, y_i)` for stacked ``W, b``."""
    weight, bias = p["linear.weight"], p["linear.bias"]
    xf = x.reshape(x.shape[0], x.shape[1], -1).to(weight.dtype)
    logits = torch.baddbmm(bias.unsqueeze(1), xf, weight.transpose(1, 2))
    g = torch.softmax(logits, dim=-1)
    g.scatter_add_(-1, y.unsqueeze(-1), -torch.ones_like(y, dtype=g.dtype).unsqueeze(-1))
    g = g * w.unsqueeze(-1).to(g.dtype)
    return {"linear.weight": torch.bmm(g.transpose(1, 2), xf), "linear.bias": g.sum(1)}


def _batched_grad(
    model: nn.Module, buffers: Params
) -> Callable[[Params, torch.Tensor, torch.Tensor, torch.Tensor], Params]:
    """The gradient of the same objective (:math:`\\sum_i w_i\\,\\mathrm{CE}_i`, no penalty)
    through the model's ``forward_batched``: the step of the rounds
    (:func:`~privmtl.federated.gradients.make_step_fn`), which for the FEMNIST CNN runs one
    grouped convolution for all rows instead of ``vmap``'s batching rules."""
    both = make_step_fn(model, buffers, "model")

    def step(p: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> Params:
        return both(p, x, y, w)[0]

    return step


def _sgd_step(
    step: Callable[[Params, torch.Tensor, torch.Tensor, torch.Tensor], Params],
    w: Params,
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    rows: torch.Tensor,
    weights: torch.Tensor,
    sizes: torch.Tensor,
    shape: dict[str, tuple[int, ...]],
    adam: _Adam | None = None,
) -> None:
    """One step of every run of the vectorised grid, in place: ``w -= sizes * step(w, batch)``
    (``sizes``: each run's step size, 0 for a run without a step here), or Adam's step."""
    g = step(w, x_all[rows], y_all[rows], weights)
    if adam is not None:
        adam.update(g, w, sizes, shape)
        return
    for n, p in w.items():
        p.sub_(g[n] * sizes.view(shape[n]))


class _Adam:
    """Adam's steps for every run of the vectorised grid (the update of :class:`torch.optim.Adam`
    without weight decay, each run with its own step size and moments, all starting at zero).

    Every run takes its ``t``-th step at the grid's ``t``-th step (a client's minibatches come
    first, its padding after), so one step count serves all; a run without a step here (step
    size 0) is not moved."""

    def __init__(self, w: Params) -> None:
        self.t = 0
        self.m = {n: torch.zeros_like(p) for n, p in w.items()}
        self.v = {n: torch.zeros_like(p) for n, p in w.items()}

    def update(
        self, g: Params, w: Params, sizes: torch.Tensor, shape: dict[str, tuple[int, ...]]
    ) -> None:
        """Move every run of ``w`` by its gradient ``g``, in place."""
        self.t += 1
        b1, b2 = ADAM_BETAS
        c1, c2 = 1.0 - b1**self.t, 1.0 - b2**self.t
        for n, p in w.items():
            m, v = self.m[n], self.v[n]
            m.lerp_(g[n], 1.0 - b1)
            v.mul_(b2).addcmul_(g[n], g[n], value=1.0 - b2)
            denom = (v.sqrt() / c2**0.5).add_(ADAM_EPS)
            p.sub_(m / denom * (sizes / c1).view(shape[n]))


def _train_grid(
    model: nn.Module,
    buffers: Params,
    init: Params,
    dataset: FederatedDataset,
    grid: list[tuple[int, float]],
    batch_size: int,
    seed: int,
    client_chunk: int | None,
    batched: bool,
    client_index: Sequence[int] | None = None,
    on_clients: Callable[[int], None] | None = None,
    patience: int | None = None,
    adam: bool = False,
    epoch_steps: int | None = None,
) -> list[Params]:
    """The models of every grid point, stacked ``(m, ...)``, in grid order (``on_clients`` is
    called with the number of clients done after each chunk of them; ``patience``:
    :func:`_early_stopping`; ``adam``: Adam's steps instead of SGD's, :class:`_Adam`, batched;
    ``epoch_steps``: a grid point's ``e`` epochs are every client's
    :func:`~privmtl.federated.end_of_run.local_budget.client_epochs`, batched).

    The model of ``(e, lr)`` is the state after the first ``e`` epochs of one run of
    ``max(epochs)`` epochs at step size ``lr`` (the first ``e`` epochs of
    :func:`~privmtl.federated.end_of_run.finetune.finetune_plan` do not depend on the number of epochs
    planned), i.e. exactly ``finetune(init, start="global", epochs=e, lr=lr)``. The batched path
    trains every step size at once: each client appears once per step size in the vectorised
    call, with its own step size.
    """
    m = dataset.n_clients
    e_max = max(e for e, _ in grid)
    lr_list = sorted({lr for _, lr in grid})
    if not batched:
        out = []
        for e, lr in grid:
            params, _ = finetune(
                init, dataset, model, method="vanilla", start="global", epochs=e, lr=lr,
                batch_size=batch_size, seed=seed, batched=False, client_index=client_index,
            )  # fmt: skip
            out.append(params)
        if on_clients is not None:
            on_clients(m)
        return out
    device = next(iter(init.values())).device  # the grid trains where init lives
    x_all, y_all, _ = dataset.concat("train")
    x_all, y_all = x_all.to(device), y_all.to(device)
    per_epoch = -(-dataset.sizes("train").astype(np.int64) // batch_size)
    epochs_wanted = sorted({e for e, _ in grid})
    each = {e: client_epochs(e, per_epoch, epoch_steps) for e in epochs_wanted}
    plan = _plan_arrays(dataset, each[e_max], batch_size, seed, client_index)
    snaps = {
        (e, lr): {n: p.unsqueeze(0).repeat((m,) + (1,) * p.ndim) for n, p in init.items()}
        for e, lr in grid
    }
    n_lr = len(lr_list)
    lr_row = torch.tensor(lr_list, dtype=next(iter(init.values())).dtype, device=device)

    def obj(p: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return finetune_objective(
            model, p, init, x, y, w, method="vanilla", lam=0.0, buffers=buffers
        )

    step: Callable[[Params, torch.Tensor, torch.Tensor, torch.Tensor], Params] = vmap(
        grad(obj), in_dims=(0, 0, 0, 0)
    )
    if isinstance(model, MultinomialLogReg) and set(init) == {"linear.weight", "linear.bias"}:
        step = _logreg_grad  # the same gradient in closed form, several times faster
    elif callable(getattr(model, "forward_batched", None)):
        step = _batched_grad(model, buffers)  # the rounds' step: a grouped convolution, no vmap
    order = np.argsort([len(c) for _, c in plan], kind="stable")
    chunk = client_chunk or m
    with torch.no_grad():
        for c in range(0, m, chunk):
            idx = order[c : c + chunk]
            k = len(idx)
            rows, weights, active = _pad_own([plan[int(i)] for i in idx], batch_size)
            rows, weights, active = rows.to(device), weights.to(device), active.to(device)
            # rows of the vectorised call: (step size j, client i) -> j * k + i
            rows = rows.repeat(1, n_lr, 1)
            weights = weights.repeat(1, n_lr, 1)
            active = active.repeat(1, n_lr)
            lr_vec = lr_row.repeat_interleave(k)
            w = {n: p.unsqueeze(0).repeat((n_lr * k,) + (1,) * p.ndim) for n, p in init.items()}
            ti = torch.from_numpy(idx).to(device)
            # the steps after which some clients have done e epochs: (e, those clients)
            snap_at: dict[int, list[tuple[int, np.ndarray]]] = {}
            for e in epochs_wanted:
                ends = per_epoch[idx] * each[e][idx]
                for s_end in np.unique(ends[ends > 0]):
                    snap_at.setdefault(int(s_end), []).append((e, np.flatnonzero(ends == s_end)))
            steps = (active * lr_vec).to(lr_row.dtype)  # each row's step size, 0 once done
            if patience is not None:
                _early_stopping(
                    model, buffers, dataset, idx, per_epoch[idx], e_max, patience, step,
                    (rows, weights, steps), w, x_all, y_all, snap_at, snaps, lr_list,
                    step is _logreg_grad,
                )  # fmt: skip
                if on_clients is not None:
                    on_clients(k)
                continue
            shape = {n: (-1,) + (1,) * (p.ndim - 1) for n, p in w.items()}
            moments = _Adam(w) if adam else None
            for s in range(rows.shape[0]):
                _sgd_step(step, w, x_all, y_all, rows[s], weights[s], steps[s], shape, moments)
                for e, done in snap_at.get(s + 1, ()):
                    for j, lr in enumerate(lr_list):
                        if (e, lr) not in snaps:
                            continue
                        src = torch.from_numpy(j * k + done).to(device)
                        dst = ti[torch.from_numpy(done).to(device)]
                        for n, p in w.items():
                            snaps[(e, lr)][n][dst] = p[src]
            if on_clients is not None:
                on_clients(k)
    return [snaps[key] for key in grid]


def _early_stopping(
    model: nn.Module,
    buffers: Params,
    dataset: FederatedDataset,
    idx: np.ndarray,
    per_epoch: np.ndarray,
    e_max: int,
    patience: int,
    step: Callable[[Params, torch.Tensor, torch.Tensor, torch.Tensor], Params],
    plan: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    w: Params,
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    snap_at: dict[int, list[tuple[int, np.ndarray]]],
    snaps: dict[tuple[int, float], Params],
    lr_list: list[float],
    compact: bool,
) -> None:
    """One chunk of :func:`_train_grid` where every (client, step size) stops early.

    After each of its epochs a run counts the correct predictions of its model on the client's
    own validation split; a run whose best count has not improved for ``patience`` epochs stops
    (a client without validation data never does): its model stays where it is, and the
    snapshots of its later epochs are that model; the chunk ends when all its runs have stopped
    or finished. With ``compact`` (the closed-form logistic-regression step, whose rows are
    computed bit for bit alike in any batch) stopped and finished runs also leave the vectorised
    call once an eighth of the chunk has, so the chunk costs what its running runs cost; other
    models keep the batch of the run without stopping (a vectorised network's rows round
    differently in another batch: the batch must not depend on other clients' validation data).
    A run reads its own client's training and validation data only.
    """
    rows, weights, steps = plan
    k = len(idx)
    n_rows = len(lr_list) * k
    device = rows.device
    val_x, val_y = dataset.split("val")
    has_val = np.array([len(val_y[int(i)]) > 0 for i in idx] * len(lr_list))
    epoch_at: dict[int, list[np.ndarray]] = {}  # step -> rows whose epoch ends there
    for e in range(1, e_max + 1):
        ends = np.tile(per_epoch * e, len(lr_list))
        for s_end in np.unique(ends[ends > 0]):
            epoch_at.setdefault(int(s_end), []).append(np.flatnonzero(ends == s_end))
    last = np.tile(per_epoch * e_max, len(lr_list))  # the step of each run's last epoch
    best = np.full(n_rows, -1.0)
    since = np.zeros(n_rows, dtype=np.int64)
    stopped = np.zeros(n_rows, dtype=bool)
    where = np.arange(n_rows)  # position of each run in the vectorised call, -1 once left
    orig = torch.arange(n_rows, device=device)  # run at each position
    shape = {n: (-1,) + (1,) * (p.ndim - 1) for n, p in w.items()}

    def save(runs: np.ndarray, after: int) -> None:
        """Write the snapshots of ``runs`` after step ``after`` from their current models."""
        for s_end, events in snap_at.items():
            if s_end <= after:
                continue
            for e, done in events:
                for j, lr in enumerate(lr_list):
                    if (e, lr) not in snaps:
                        continue
                    mine = np.intersect1d(j * k + done, runs)
                    if mine.size == 0:
                        continue
                    src = torch.from_numpy(where[mine]).to(device)
                    dst = torch.from_numpy(idx[mine - j * k]).to(device)
                    for n, p in w.items():
                        snaps[(e, lr)][n][dst] = p[src]

    for s in range(rows.shape[0]):
        if orig.numel() == 0:
            break
        _sgd_step(step, w, x_all, y_all, rows[s], weights[s], steps[s], shape)
        for e, done in snap_at.get(s + 1, ()):
            for j, lr in enumerate(lr_list):
                runs = j * k + done
                runs = runs[where[runs] >= 0]
                if (e, lr) not in snaps or runs.size == 0:
                    continue
                src = torch.from_numpy(where[runs]).to(device)
                dst = torch.from_numpy(idx[runs - j * k]).to(device)
                for n, p in w.items():
                    snaps[(e, lr)][n][dst] = p[src]
        for runs in epoch_at.get(s + 1, ()):
            runs = runs[(where[runs] >= 0) & ~stopped[runs] & has_val[runs]]
            if runs.size == 0:
                continue
            at = torch.from_numpy(where[runs]).to(device)
            mine = [int(idx[r_ % k]) for r_ in runs]
            correct, _ = client_scores(
                model, {n: p[at] for n, p in w.items()}, buffers,
                [val_x[i] for i in mine], [val_y[i] for i in mine],
            )  # fmt: skip
            better = correct > best[runs]
            best[runs] = np.where(better, correct, best[runs])
            since[runs] = np.where(better, 0, since[runs] + 1)
            now = runs[since[runs] >= patience]
            if now.size:
                stopped[now] = True
                steps[s + 1 :, torch.from_numpy(where[now]).to(device)] = 0.0
        # runs that stopped or finished leave the call once an eighth of it has (``compact``),
        # else once all of it has
        out = np.flatnonzero((where >= 0) & (stopped | (last <= s + 1)))
        enough = out.size >= max(1, len(orig) // 8) if compact else False
        if out.size and (enough or out.size == len(orig)):
            save(out[stopped[out]], s + 1)
            keep_runs = np.flatnonzero((where >= 0) & ~np.isin(np.arange(n_rows), out))
            keep = torch.from_numpy(where[keep_runs]).to(device)
            for n in list(w):
                w[n] = w[n][keep].contiguous()
            rows, weights, steps = rows[:, keep], weights[:, keep], steps[:, keep]
            orig = orig[keep]
            where[:] = -1
            where[keep_runs] = np.arange(len(keep_runs))
