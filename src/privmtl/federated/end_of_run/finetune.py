r"""Local fine-tuning after private training (PMTL paper, §5.3 and Table 1).

After training, every client ``k`` holds a starting model :math:`w_k^{(0)}` — its own personalized
MTL model (``start="personalized"``) or the released private global model :math:`\tilde w`
(``start="global"``) — and runs local minibatch SGD on its *own* training data only, on one of the
objectives below (``x_i, y_i`` its examples, :math:`b` the current minibatch,
:math:`\mathrm{CE}` the cross-entropy of the model's logits, :math:`\lambda` = ``lam``):

``"vanilla"`` (local ERM)
    .. math:: L_k(w) = \frac{1}{|b|}\sum_{i\in b}\mathrm{CE}(h_w(x_i), y_i)

``"mr"`` (mean-regularization towards the released global model)
    .. math:: L_k(w) + \frac{\lambda}{2}\lVert w-\tilde w\rVert_2^2,
              \qquad \nabla = \nabla L_k(w) + \lambda (w-\tilde w)

``"skl"`` (symmetrized KL between local and global predictions on local data)
    .. math:: L_k(w) + \lambda\,\frac{1}{|b|}\sum_{i\in b}\Bigl[
              \mathrm{KL}\bigl(p_{\tilde w}(x_i)\,\Vert\,p_w(x_i)\bigr)
              + \mathrm{KL}\bigl(p_w(x_i)\,\Vert\,p_{\tilde w}(x_i)\bigr)\Bigr]
              = L_k(w) + \lambda\,\frac{1}{|b|}\sum_{i\in b}\sum_c
              (p_{\tilde w,c} - p_{w,c})(\log p_{\tilde w,c} - \log p_{w,c})

    with :math:`p_w(x) = \mathrm{softmax}(h_w(x))`; :math:`\tilde w` is fixed (no gradient).

``"ewc"`` (elastic weight consolidation towards the released global model)
    .. math:: L_k(w) + \frac{\lambda}{2}\sum_j F_{k,j}\,(w_j-\tilde w_j)^2,
              \qquad \nabla = \nabla L_k(w) + \lambda\,F_k\odot(w-\tilde w)

    with the diagonal *empirical* Fisher of client ``k`` at :math:`\tilde w`, computed once on all
    of the client's training examples (true labels):
    :math:`F_{k,j} = \frac{1}{n_k}\sum_{i=1}^{n_k}\bigl(\partial_{w_j}\mathrm{CE}(h_{\tilde w}(x_i),
    y_i)\bigr)^2`.

Minibatches: ``epochs`` passes, each over a fresh permutation of the client's training data in
``ceil(n_k / batch_size)`` minibatches (the last may be smaller), drawn from a numpy Generator
seeded by ``(seed, 3, k)`` — so a client's draws depend on nothing but its own index and size.

Privacy: fine-tuning reads only the client's own data and the released :math:`\tilde w` (and the
client's own personalized model), so it is post-processing of the billboard and costs no privacy
towards the other clients (billboard privacy ⇒ joint DP). The batched path pads each client's
minibatch with copies of *its own* first example (weight 0), so no client's computation ever touches
another client's rows.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from privmtl._device import resolve_device, to_device
from privmtl._validation import check_choice, check_int, check_real
from privmtl.data.federated import FederatedDataset
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import Params
from privmtl.federated.config import TrainResult, check_inputs
from privmtl.federated.scoring import evaluate
from privmtl.federated.spec import FINETUNE_METHODS

__all__ = [
    "FINETUNE_METHODS",
    "FINETUNE_STARTS",
    "check_client_index",
    "empirical_fisher",
    "finetune",
    "finetune_objective",
    "finetune_plan",
]

FINETUNE_STARTS = ("personalized", "global")


# ---------------------------------------------------------------------------- objective
def _penalty(
    method: str, params: Params, anchor: Params, lam: float, fisher: Params | None
) -> torch.Tensor:
    first = next(iter(params.values()))
    total = torch.zeros((), dtype=first.dtype, device=first.device)
    if method == "mr":
        for n, p in params.items():
            total = total + (p - anchor[n]).pow(2).sum()
        return 0.5 * lam * total
    if method == "ewc":
        assert fisher is not None
        for n, p in params.items():
            total = total + (fisher[n] * (p - anchor[n]).pow(2)).sum()
        return 0.5 * lam * total
    return total


def _symmetric_kl_rows(logits: torch.Tensor, anchor_logits: torch.Tensor) -> torch.Tensor:
    """Per-row KL(p_g‖p_w) + KL(p_w‖p_g) = Σ_c (p_g − p_w)(log p_g − log p_w)."""
    lp_w = F.log_softmax(logits, dim=-1)
    lp_g = F.log_softmax(anchor_logits, dim=-1)
    return ((lp_g.exp() - lp_w.exp()) * (lp_g - lp_w)).sum(-1)


def finetune_objective(
    model: nn.Module,
    params: Params,
    anchor: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    weights: torch.Tensor | None = None,
    *,
    method: str,
    lam: float,
    fisher: Params | None = None,
    buffers: Params | None = None,
) -> torch.Tensor:
    r"""The fine-tuning objective of one client on one minibatch (see the module docstring).

    Parameters
    ----------
    model : nn.Module
        Architecture, called functionally with ``params`` (and ``anchor`` for ``"skl"``).
    params, anchor : dict of str to Tensor
        Current local model :math:`w` and released global model :math:`\tilde w` (unstacked).
    x, y : Tensor
        Minibatch ``(B, d)`` and labels ``(B,)``.
    weights : Tensor, optional
        Per-row weights (default ``1/B`` each); the data term is :math:`\sum_i
        \mathrm{weight}_i\,\mathrm{CE}_i` and the ``"skl"`` term uses the same weights.
    method : {"vanilla", "mr", "skl", "ewc"}
    lam : float
        :math:`\lambda`.
    fisher : dict of str to Tensor, optional
        Diagonal Fisher :math:`F_k` (same shapes as ``params``); required for ``"ewc"``.
    buffers : dict of str to Tensor, optional
        Model buffers (default: the model's own).

    Returns
    -------
    Tensor
        Scalar objective value, differentiable in ``params``.
    """
    check_choice("method", method, FINETUNE_METHODS)
    if method == "ewc" and fisher is None:
        raise InvalidParameterError("The 'fisher' parameter is required for method='ewc'.")
    buffers = dict(model.named_buffers()) if buffers is None else buffers
    if weights is None:
        weights = torch.full(
            (y.shape[0],), 1.0 / max(y.shape[0], 1), dtype=x.dtype, device=x.device
        )
    logits = functional_call(model, (params, buffers), (x,))
    value = (F.cross_entropy(logits, y, reduction="none") * weights).sum()
    if method == "skl":
        with torch.no_grad():
            anchor_logits = functional_call(model, (anchor, buffers), (x,))
        value = value + lam * (_symmetric_kl_rows(logits, anchor_logits) * weights).sum()
    return value + _penalty(method, params, anchor, lam, fisher)


# ---------------------------------------------------------------------------- Fisher
def empirical_fisher(
    model: nn.Module,
    anchor: Params,
    dataset: FederatedDataset,
    *,
    batched: bool = True,
    chunk: int = 256,
) -> Params:
    r"""Per-client diagonal empirical Fisher at ``anchor`` on each client's training data.

    :math:`F_{k,j} = \frac{1}{n_k}\sum_{i\in D_k}(\partial_{w_j}\mathrm{CE}(h_{\tilde w}(x_i),
    y_i))^2`, stacked over clients: shapes ``(m, *param.shape)``. The batched path computes
    per-example gradients with ``vmap(grad)`` over chunks of ``chunk`` rows and sums their squares
    into the owner's slot; the reference path loops over clients and examples with autograd. It
    computes on the device of ``anchor`` (and ``model``).
    """
    check_int("chunk", chunk, low=1)
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    anchor = {n: p.detach() for n, p in anchor.items()}
    m = dataset.n_clients
    device = next(iter(anchor.values())).device
    sums = {n: torch.zeros((m, *p.shape), dtype=p.dtype, device=device) for n, p in anchor.items()}
    sizes = torch.as_tensor(dataset.sizes("train"), dtype=torch.float64, device=device)

    def ce_one(params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, (params, buffers), (x.unsqueeze(0),))
        return F.cross_entropy(logits, y.unsqueeze(0))

    if batched:
        x_all, y_all, offsets = dataset.concat("train")
        x_all, y_all = x_all.to(device), y_all.to(device)
        owner = torch.from_numpy(np.repeat(np.arange(m), np.diff(offsets))).to(device)
        per_example = vmap(grad(ce_one), in_dims=(None, 0, 0))
        for i in range(0, y_all.shape[0], chunk):
            g = per_example(anchor, x_all[i : i + chunk], y_all[i : i + chunk])
            for n in sums:
                sums[n].index_add_(0, owner[i : i + chunk], g[n].pow(2))
    else:
        xs, ys = dataset.split("train")
        for k in range(m):
            for i in range(ys[k].shape[0]):
                leaves = {n: p.clone().requires_grad_(True) for n, p in anchor.items()}
                with torch.enable_grad():
                    loss = ce_one(leaves, xs[k][i].to(device), ys[k][i].to(device))
                    gs = torch.autograd.grad(loss, list(leaves.values()))
                for n, gg in zip(leaves, gs, strict=True):
                    sums[n][k] += gg.pow(2)
    shape = (-1,)
    return {n: s / sizes.to(s.dtype).view(shape + (1,) * (s.ndim - 1)) for n, s in sums.items()}


# ---------------------------------------------------------------------------- plan
def check_client_index(client_index: Sequence[int] | None, m: int) -> np.ndarray:
    """The population indices of a data set's ``m`` clients (default ``range(m)``), checked."""
    if client_index is None:
        return np.arange(m)
    index = np.asarray(client_index, dtype=np.int64).reshape(-1)
    if len(index) != m or (len(index) and int(index.min()) < 0):
        raise InvalidParameterError(
            f"The 'client_index' parameter must hold one index >= 0 per client ({m}); got "
            f"{list(client_index)!r}."
        )
    return index


def finetune_plan(
    dataset: FederatedDataset,
    *,
    epochs: int,
    batch_size: int,
    seed: int,
    client_index: Sequence[int] | None = None,
) -> list[list[np.ndarray]]:
    """Minibatches of every client as rows of ``dataset.concat("train")``.

    ``plan[k][s]`` holds the rows of step ``s`` of client ``k``: ``epochs`` fresh permutations of
    the client's ``n_k`` examples cut into ``ceil(n_k / batch_size)`` minibatches, drawn from
    ``numpy.random.default_rng([seed, 3, i])`` with ``i = client_index[k]`` (default ``k``): the
    index of the client in the whole population, so that a part of the population (one Flower
    node's clients) draws what the same clients draw in the whole.
    """
    return [
        [r[:c] for r, c in zip(rows, counts, strict=True)]
        for rows, counts in _plan_arrays(dataset, epochs, batch_size, seed, client_index)
    ]


def _plan_arrays(
    dataset: FederatedDataset,
    epochs: int | np.ndarray,
    batch_size: int,
    seed: int,
    client_index: Sequence[int] | None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`finetune_plan` as arrays: per client, its steps' rows ``(S, batch_size)`` (a short
    last minibatch of an epoch padded with the client's first row) and their sizes ``(S,)``
    (``epochs``: one count for all, or every client's; a client's first epochs do not depend on
    it)."""
    offsets = dataset.offsets("train")
    index = check_client_index(client_index, dataset.n_clients)
    each = np.broadcast_to(np.asarray(epochs, dtype=np.int64), (dataset.n_clients,))
    out = []
    for k in range(dataset.n_clients):
        first, n = int(offsets[k]), int(offsets[k + 1] - offsets[k])
        epochs = int(each[k])
        rng = np.random.default_rng([seed, 3, int(index[k])])
        per_epoch = -(-n // batch_size)
        rows = np.full((epochs, per_epoch * batch_size), first, dtype=np.int64)
        for e in range(epochs):
            rows[e, :n] += rng.permutation(n)
        counts = np.full((epochs, per_epoch), batch_size, dtype=np.int64)
        if per_epoch:
            counts[:, -1] = n - (per_epoch - 1) * batch_size
        out.append((rows.reshape(-1, batch_size), counts.reshape(-1)))
    return out


def _pad_own(
    plan: Sequence[tuple[np.ndarray, np.ndarray]], batch_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Like :func:`~privmtl.federated.algorithms.pad_plan`, for :func:`_plan_arrays`' clients,
    padding with the client's own first row: rows and weights ``(S, k, batch_size)`` and the
    active steps ``(S, k)``."""
    k = len(plan)
    s = max((len(c) for _, c in plan), default=0)
    rows = np.zeros((s, k, batch_size), dtype=np.int64)
    weights = np.zeros((s, k, batch_size), dtype=np.float32)
    active = np.zeros((s, k), dtype=np.float32)
    slots = np.arange(batch_size)
    for j, (steps, counts) in enumerate(plan):
        t = len(counts)
        if t == 0:
            continue
        rows[:, j, :] = steps.min()  # the client's first row: its rows are first, first + 1, ...
        rows[:t, j, :] = steps
        weights[:t, j, :] = np.where(slots < counts[:, None], 1.0 / counts[:, None], 0.0)
        active[:t, j] = 1.0
    return torch.from_numpy(rows), torch.from_numpy(weights), torch.from_numpy(active)


# ---------------------------------------------------------------------------- training paths
def _finetune_batched(
    model: nn.Module,
    buffers: Params,
    starts: Params,
    anchor: Params,
    fisher: Params | None,
    plan: Sequence[tuple[np.ndarray, np.ndarray]],
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    *,
    method: str,
    lam: float,
    lr: float,
    batch_size: int,
) -> Params:
    def obj(
        p: Params, fk: Params | None, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor
    ) -> torch.Tensor:
        return finetune_objective(
            model, p, anchor, x, y, w, method=method, lam=lam, fisher=fk, buffers=buffers
        )

    step: Callable[..., Params] = vmap(
        grad(obj), in_dims=(0, 0 if fisher is not None else None, 0, 0, 0)
    )
    rows, weights, active = _pad_own(plan, batch_size)
    rows, weights, active = rows.to(x_all.device), weights.to(x_all.device), active.to(x_all.device)
    w = {n: p.clone() for n, p in starts.items()}
    with torch.no_grad():
        for s in range(rows.shape[0]):
            r = rows[s]
            g = step(w, fisher, x_all[r], y_all[r], weights[s])
            a = active[s]
            for n, p in w.items():
                w[n] = p - lr * g[n] * a.view((-1,) + (1,) * (p.ndim - 1)).to(p.dtype)
    return w


def _finetune_reference(
    model: nn.Module,
    buffers: Params,
    start: Params,
    anchor: Params,
    fisher: Params | None,
    steps: list[np.ndarray],
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    *,
    method: str,
    lam: float,
    lr: float,
) -> Params:
    """One client, plain autograd; the mr/ewc penalty gradients are added in closed form."""
    w = {n: p.detach().clone() for n, p in start.items()}
    for rows in steps:
        idx = torch.from_numpy(np.asarray(rows, dtype=np.int64))
        x, y = x_all[idx], y_all[idx]
        leaves = {n: p.detach().requires_grad_(True) for n, p in w.items()}
        with torch.enable_grad():
            logits = functional_call(model, (leaves, buffers), (x,))
            loss = F.cross_entropy(logits, y)
            if method == "skl":
                with torch.no_grad():
                    anchor_logits = functional_call(model, (anchor, buffers), (x,))
                loss = loss + lam * _symmetric_kl_rows(logits, anchor_logits).mean()
            grads = torch.autograd.grad(loss, list(leaves.values()))
        with torch.no_grad():
            for (n, p), g in zip(leaves.items(), grads, strict=True):
                if method == "mr":
                    g = g + lam * (p - anchor[n])
                elif method == "ewc":
                    assert fisher is not None
                    g = g + lam * fisher[n] * (p - anchor[n])
                w[n] = p.detach() - lr * g
    return w


# ---------------------------------------------------------------------------- inputs
def _is_stacked(params: Mapping[str, torch.Tensor], shapes: dict[str, torch.Size], m: int) -> bool:
    if set(params) != set(shapes):
        raise InvalidParameterError(
            f"The parameters must have the model's names {sorted(shapes)}; got {sorted(params)}."
        )
    if all(tuple(params[n].shape) == tuple(s) for n, s in shapes.items()):
        return False
    if all(tuple(params[n].shape) == (m, *s) for n, s in shapes.items()):
        return True
    raise InvalidParameterError(
        "The parameters must match the model's shapes, either single or stacked over the "
        f"{m} clients; got shapes {[tuple(p.shape) for p in params.values()]}."
    )


def _resolve_inputs(
    result_or_params: Any,
    global_params: Mapping[str, torch.Tensor] | None,
    shapes: dict[str, torch.Size],
    m: int,
) -> tuple[Params | None, Params | None, Any]:
    """(stacked personalized or None, global or None, config or None)."""
    if isinstance(result_or_params, TrainResult):
        r = result_or_params
        pers = None if r.personalized_params is None else dict(r.personalized_params)
        glob = dict(global_params) if global_params is not None else dict(r.global_params)
        if pers is not None and not _is_stacked(pers, shapes, m):
            raise InvalidParameterError(
                "The result's personalized_params must be stacked (m, ...)."
            )
        if _is_stacked(glob, shapes, m):
            raise InvalidParameterError("The global model must be a single (unstacked) model.")
        return pers, glob, r.config
    if not isinstance(result_or_params, Mapping):
        raise InvalidParameterError(
            "The 'result_or_params' parameter must be a TrainResult or a dict of parameters; "
            f"got {type(result_or_params).__name__}."
        )
    params = {n: torch.as_tensor(p) for n, p in result_or_params.items()}
    if _is_stacked(params, shapes, m):
        anchor = None if global_params is None else dict(global_params)
        if anchor is not None and _is_stacked(anchor, shapes, m):
            raise InvalidParameterError("The 'global_params' must be a single (unstacked) model.")
        return params, anchor, None
    if global_params is not None:
        raise InvalidParameterError(
            "Give 'global_params' only with stacked personalized parameters; a single model is "
            "already the global model."
        )
    return None, params, None


def finetune(
    result_or_params: TrainResult | Mapping[str, torch.Tensor],
    dataset: FederatedDataset,
    model: nn.Module,
    *,
    method: str = "vanilla",
    start: str = "personalized",
    epochs: int = 1,
    lr: float | None = None,
    batch_size: int | None = None,
    lam: float | None = None,
    seed: int | None = None,
    batched: bool = True,
    global_params: Mapping[str, torch.Tensor] | None = None,
    client_chunk: int | None = None,
    fisher_chunk: int = 256,
    client_index: Sequence[int] | None = None,
    device: str | torch.device = "cpu",
) -> tuple[Params, dict[str, dict[str, float]]]:
    r"""Fine-tune every client locally after private training (post-processing, no privacy cost).

    Parameters
    ----------
    result_or_params : TrainResult or dict of str to Tensor
        A training result (its ``personalized_params`` and released ``global_params``
        :math:`\tilde w`), or parameters: a single model is taken as the global model
        :math:`\tilde w`; parameters stacked ``(m, ...)`` are personalized models (then pass
        ``global_params`` for the anchor of ``"mr"``, ``"skl"``, ``"ewc"`` or for
        ``start="global"``).
    dataset : FederatedDataset
        Client ``k`` fine-tunes on ``dataset``'s ``train`` split of client ``k`` only; accuracies
        are measured on ``val`` and ``test``.
    model : nn.Module
        Architecture (called functionally; its own parameters are not used or modified).
    method : {"vanilla", "mr", "skl", "ewc"}, default "vanilla"
        Objective (module docstring). ``"vanilla"`` ignores ``lam`` and the anchor.
    start : {"personalized", "global"}, default "personalized"
        Start every client from its personalized MTL model or from :math:`\tilde w`.
    epochs : int, default 1
        Local passes over the client's data (0: no step, just evaluate the start models).
    lr, batch_size, lam, seed : optional
        SGD step size, minibatch size, :math:`\lambda` and seed; default to the result's
        ``config`` (``lr``, ``batch_size``, ``lam``, ``seed``) when a :class:`TrainResult` is given,
        else 0.1, 10, 0.1, 0.
    batched : bool, default True
        Train all clients together with ``torch.func.vmap(grad(...))``; ``False`` runs the
        per-client reference loop (same minibatches; agrees up to float rounding).
    global_params : dict, optional
        Anchor :math:`\tilde w` overriding the result's global model.
    client_chunk : int, optional
        Batched path: vectorise over at most this many clients at a time (clients grouped by
        their number of steps; the models do not depend on the grouping).
    fisher_chunk : int, default 256
        Rows per ``vmap`` chunk of the per-example gradients of the EWC Fisher.
    client_index : sequence of int, optional
        The population index of every client of ``dataset``, which seeds its minibatches
        (:func:`finetune_plan`; default: its position in ``dataset``).
    device : {"cpu", "auto", "cuda", "cuda:N"} or torch.device, default "cpu"
        Where the batched path fine-tunes and scores (:func:`~privmtl._device.resolve_device`);
        the returned models are CPU tensors. The reference loop (``batched=False``) runs on the
        CPU.

    Returns
    -------
    params : dict of str to Tensor
        Fine-tuned models stacked ``(m, *shape)``.
    accuracies : dict
        ``{"val": metrics, "test": metrics}`` with ``metrics`` as returned by
        :func:`~privmtl.federated.scoring.evaluate` for per-client models (``accuracy`` pooled
        over all examples, ``mean_client_accuracy``, ``loss``, ``n``).
    """
    check_choice("method", method, FINETUNE_METHODS)
    check_choice("start", start, FINETUNE_STARTS)
    epochs = check_int("epochs", epochs, low=0)
    check_inputs(dataset, model)
    if client_chunk is not None:
        check_int("client_chunk", client_chunk, low=1)
    on = resolve_device(device) if batched else torch.device("cpu")
    m = dataset.n_clients
    shapes = {n: p.shape for n, p in model.named_parameters()}
    pers, glob, config = _resolve_inputs(result_or_params, global_params, shapes, m)
    if on.type != "cpu":  # the caller's module and tensors stay where they are
        model = copy.deepcopy(model).to(on)
        pers, glob = to_device(pers, on), to_device(glob, on)

    lr, batch_size, lam, seed = _settings(config, lr, batch_size, lam, seed)

    starts, anchor = _starts_and_anchor(method, start, pers, glob, shapes, m, on)
    buffers = {n: b.detach() for n, b in model.named_buffers()}

    was_training = model.training
    model.train()
    try:
        fisher = (
            empirical_fisher(model, anchor, dataset, batched=batched, chunk=fisher_chunk)
            if method == "ewc"
            else None
        )
        x_all, y_all, _ = dataset.concat("train")
        x_all, y_all = x_all.to(on), y_all.to(on)
        if epochs == 0:
            out = starts
        else:
            run = _FinetuneRun(model, buffers, anchor, fisher, x_all, y_all, method, lam, lr)
            if batched:
                plan = _plan_arrays(dataset, epochs, batch_size, seed, client_index)
                out = run.batched(starts, plan, client_chunk or m, batch_size, on)
            else:
                steps = finetune_plan(
                    dataset, epochs=epochs, batch_size=batch_size, seed=seed,
                    client_index=client_index,
                )  # fmt: skip
                out = run.reference(starts, steps)
        accuracies = {}
        for split in ("val", "test"):
            xs, ys = dataset.split(split)
            accuracies[split] = evaluate(model, out, buffers, xs, ys, personalized=True)
    finally:
        model.train(was_training)
    return to_device(out, "cpu"), accuracies


def _settings(
    config: Any, lr: float | None, batch_size: int | None, lam: float | None, seed: int | None
) -> tuple[float, int, float, int]:
    """The step size, batch size, penalty weight and seed of the fine-tuning, checked: each
    given one, else the trained run's (``config``), else 0.1, 10, 0.1 and 0."""

    def default(value: Any, attr: str, fallback: Any) -> Any:
        if value is not None:
            return value
        return getattr(config, attr) if config is not None else fallback

    lr = check_real("lr", default(lr, "lr", 0.1), low=0.0, closed="neither")
    batch_size = check_int("batch_size", default(batch_size, "batch_size", 10), low=1)
    lam = check_real("lam", default(lam, "lam", 0.1), low=0.0)
    seed = check_int("seed", default(seed, "seed", 0), low=0)
    return lr, batch_size, lam, seed


def _starts_and_anchor(
    method: str,
    start: str,
    pers: Params | None,
    glob: Params | None,
    shapes: dict[str, torch.Size],
    m: int,
    on: torch.device,
) -> tuple[Params, Params]:
    """Every client's starting model (its personalized one, or the released global model
    repeated) and the anchor the rules pull towards (the global model; zeros without one)."""
    needs_anchor = method != "vanilla" or start == "global"
    if needs_anchor and glob is None:
        raise InvalidParameterError(
            f"method={method!r} with start={start!r} needs the released global model; pass a "
            "TrainResult or 'global_params'."
        )
    if start == "personalized":
        if pers is None:
            raise InvalidParameterError(
                "start='personalized' needs personalized models, but the input has none (a "
                "global-model method such as fedavg); use start='global'."
            )
        starts = {n: p.detach().clone() for n, p in pers.items()}
    else:
        assert glob is not None
        starts = {n: p.detach().unsqueeze(0).repeat((m,) + (1,) * p.ndim) for n, p in glob.items()}
    anchor: Params = (
        {n: p.detach() for n, p in glob.items()}
        if glob is not None
        else {n: torch.zeros(s, device=on) for n, s in shapes.items()}
    )
    return starts, anchor


@dataclass(frozen=True)
class _FinetuneRun:
    """What the fine-tuning of every client shares: the model, its buffers, the anchor, the EWC
    weights (or None), the pooled training data, and the rule with its penalty weight and step
    size."""

    model: nn.Module
    buffers: Params
    anchor: Params
    fisher: Params | None
    x_all: torch.Tensor
    y_all: torch.Tensor
    method: str
    lam: float
    lr: float

    def batched(
        self, starts: Params, plan: list[Any], chunk: int, batch_size: int, on: torch.device
    ) -> Params:
        """All clients at once (``torch.func``), ``chunk`` clients at a time."""
        m = len(plan)
        fisher = self.fisher
        # chunks of clients with similar numbers of steps: a chunk runs as many steps as its
        # busiest client, so mixing a 5-example and a 1000-example client wastes the steps
        order = np.argsort([len(c) for _, c in plan], kind="stable")
        out = {n: torch.empty_like(p) for n, p in starts.items()}
        for c in range(0, m, chunk):
            idx = order[c : c + chunk]
            ti = torch.from_numpy(idx).to(on)
            part = _finetune_batched(
                self.model, self.buffers, {n: p[ti] for n, p in starts.items()}, self.anchor,
                None if fisher is None else {n: f[ti] for n, f in fisher.items()},
                [plan[int(k)] for k in idx], self.x_all, self.y_all, method=self.method,
                lam=self.lam, lr=self.lr, batch_size=batch_size,
            )  # fmt: skip
            for n in out:
                out[n][ti] = part[n]
        return out

    def reference(self, starts: Params, steps: list[Any]) -> Params:
        """One client after the other (the reference path)."""
        fisher = self.fisher
        outs = [
            _finetune_reference(
                self.model,
                self.buffers,
                {n: p[k] for n, p in starts.items()},
                self.anchor,
                None if fisher is None else {n: f[k] for n, f in fisher.items()},
                steps[k],
                self.x_all,
                self.y_all,
                method=self.method,
                lam=self.lam,
                lr=self.lr,
            )
            for k in range(len(steps))
        ]
        return {n: torch.stack([o[n] for o in outs]) for n in starts}
