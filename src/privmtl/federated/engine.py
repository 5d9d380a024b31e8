r"""Training engine for PMTL (Algorithm 1 of Hu, Wu & Smith) and its federated baselines.

One round ``t`` of ``method="pmtl"``:

1. the server samples clients :math:`S_t` with the configured sampler and broadcasts
   :math:`\tilde w^t`;
2. every :math:`k\in S_t` starts from its *own persistent* model :math:`w_k` and runs local SGD
   (minibatch ``B``, step ``η``, no per-example clipping) on

   .. math:: f_k(w) = \frac{1}{|b|}\sum_{i\in b}\mathrm{CE}(h_w(x_i), y_i)
             + \frac{\lambda}{2}\lVert w-\tilde w^t\rVert_2^2,

   i.e. :math:`w \leftarrow w - \eta(\nabla l_k(w) + \lambda(w-\tilde w^t))`, and sends
   :math:`g_k = w_k^{new} - w_k^{old}`; the client keeps :math:`w_k^{new}`;
3. the server releases

   .. math:: \tilde w^{t+1} = \tilde w^t + \frac1q\sum_{k\in S_t} g_k
             \min\Bigl(1,\frac{\gamma}{\lVert g_k\rVert_2}\Bigr) + N(0,\sigma^2 I)

   with the *fixed* ``q`` = ``clients_per_round`` (so the add/remove sensitivity is
   :math:`\gamma/q` and the noise multiplier :math:`z=\sigma q/\gamma`), and the ledger records
   ``sampler.event(z)``.

``fedavg``/``fedprox`` start each round from :math:`\tilde w^t` (λ = 0, resp. μ = ``lam``) and are
evaluated with the global model; ``local`` never communicates. The batched path trains the sampled
clients together: ``vmap(grad(loss))`` over stacked parameters ``(K, ...)`` and per-client
minibatches padded to ``B`` with per-row weights; clients that have finished their steps (local
epochs with unequal data sizes) are frozen by an activity mask.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap
from tqdm.auto import tqdm

from privmtl.data.federated import FederatedDataset
from privmtl.exceptions import InvalidParameterError, PrivmtlWarning
from privmtl.federated.algorithms import (
    Params,
    clip_factors,
    draw_noise,
    draw_round_plan,
    evaluate,
    method_spec,
    noise_generator,
    pad_plan,
    partition_plan,
    sampling_rng,
)
from privmtl.federated.config import TrainConfig, TrainResult, check_inputs
from privmtl.federated.reference import aggregate_reference, local_train_reference

__all__ = ["aggregate_batched", "local_train_batched", "make_step_fn", "train"]

StepFn = Callable[..., tuple[Params, torch.Tensor]]


def make_step_fn(model: nn.Module, buffers: Params, vectorize: str = "auto") -> StepFn:
    """Per-client ``(grads, losses)`` of the weighted cross-entropy over stacked client params.

    The returned function maps ``params (K, ...)``, ``x (K, B, ...)``, ``y (K, B)`` and row weights
    ``w (K, B)`` to per-client gradients and losses of :math:`\\sum_i w_i\\,\\mathrm{CE}_i`.
    ``vectorize="vmap"`` uses ``vmap(grad_and_value(...))`` over
    :func:`~torch.func.functional_call` (works for any module); ``"model"`` uses the model's
    ``forward_batched`` and differentiates the sum of the per-client losses (client ``k``'s
    gradient is the gradient of that sum with respect to its slice); ``"auto"`` picks
    ``"model"`` when the model has ``forward_batched``.
    """
    if vectorize == "auto":
        vectorize = "model" if callable(getattr(model, "forward_batched", None)) else "vmap"
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


def local_train_batched(
    step_fn: StepFn,
    starts: Params,
    anchor: Params | None,
    prox_weight: float,
    lr: float,
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    plan: list[list[np.ndarray]],
    batch_size: int,
) -> tuple[Params, list[float]]:
    """Local SGD of all clients of ``plan`` at once (same update as the reference loop).

    ``starts`` holds stacked parameters ``(K, ...)``; returns the new stacked parameters and each
    client's mean minibatch loss. Step ``s`` runs on the clients that still have a ``s``-th
    minibatch only (the others are dropped from the batch, not masked, which saves the ~15% of
    client-steps that padding to the longest client would waste on FEMNIST); inside a step,
    minibatches shorter than ``batch_size`` are padded with zero-weight rows.
    """
    rows, weights, active = pad_plan(plan, batch_size)
    names = list(starts)
    weights = weights.to(starts[names[0]].dtype)
    ps = [starts[name].clone() for name in names]
    anchors = [anchor[name] for name in names] if anchor is not None and prox_weight else None
    loss_sum = torch.zeros(len(plan), dtype=torch.float64)
    with torch.no_grad():
        for s in range(rows.shape[0]):
            a = active[s]
            idx = None if bool(a.all()) else torch.nonzero(a).flatten()
            cur = ps if idx is None else [p.index_select(0, idx) for p in ps]
            r, wts = (rows[s], weights[s]) if idx is None else (rows[s][idx], weights[s][idx])
            grads, loss = step_fn(dict(zip(names, cur, strict=True)), x_all[r], y_all[r], wts)
            gs = [grads[name] for name in names]
            steps: list[torch.Tensor]
            if anchors is not None:  # step = g + ρ (w − w~)
                steps = list(torch._foreach_sub(cur, anchors))
                torch._foreach_mul_(steps, prox_weight)
                torch._foreach_add_(steps, gs)
            else:
                steps = gs
            torch._foreach_add_(cur, steps, alpha=-lr)
            if idx is None:
                loss_sum += loss.double()
            else:
                for p, c in zip(ps, cur, strict=True):
                    p.index_copy_(0, idx, c)
                loss_sum.index_add_(0, idx, loss.double())
    w = dict(zip(names, ps, strict=True))
    n_steps = active.sum(0).double()
    losses = torch.where(n_steps > 0, loss_sum / n_steps.clamp_min(1), torch.nan)
    return w, losses.tolist()


@torch.no_grad()
def aggregate_batched(
    deltas: Params, template: Params, clip: float | None, q: int
) -> tuple[Params, np.ndarray, np.ndarray]:
    """Vectorised :func:`~privmtl.federated.reference.aggregate_reference` on ``(K, ...)`` updates."""
    first = next(iter(deltas.values()))
    if first.shape[0] == 0:
        zeros = {name: torch.zeros_like(p) for name, p in template.items()}
        return zeros, np.zeros(0), np.zeros(0, dtype=bool)
    sq = sum(t.double().flatten(1).pow(2).sum(1) for t in deltas.values())
    norms = torch.as_tensor(sq).sqrt()
    factors = clip_factors(norms, clip)
    mean = {name: torch.tensordot(factors.to(t.dtype), t, dims=1) / q for name, t in deltas.items()}
    return mean, norms.numpy(), (factors < 1).numpy()


def _stack(params: list[Params]) -> Params:
    return {name: torch.stack([p[name] for p in params]) for name in params[0]}


def _resolve_sampler(config: TrainConfig, m: int, q: int, sampler: Any) -> Any:
    if sampler is not None:
        return sampler
    from privmtl.privacy.sampling import make_sampler

    return make_sampler(config.sampling, m, q)


def _resolve_ledger(config: TrainConfig, delta: float, ledger: Any) -> Any:
    if ledger is not None or not config.is_private:
        return ledger
    from privmtl.privacy.accounting import PrivacyLedger

    return PrivacyLedger(
        accountant=config.accountant, relation=config.relation, delta=delta, budget=config.budget
    )


def train(
    dataset: FederatedDataset,
    model: nn.Module,
    config: TrainConfig | None = None,
    *,
    sampler: Any = None,
    ledger: Any = None,
) -> TrainResult:
    r"""Train ``config.method`` on ``dataset`` starting every client from ``model``'s parameters.

    Parameters
    ----------
    dataset : FederatedDataset
        One client per task; training uses the ``train`` split, evaluation ``val`` and ``test``.
    model : torch.nn.Module
        Architecture and initial parameters :math:`w_k^0 = \tilde w^0` (not modified). Called
        functionally with per-client parameters; buffers are shared and read-only.
    config : TrainConfig, optional
        Hyper-parameters (defaults: :class:`TrainConfig`).
    sampler : ClientSampler, optional
        Object with ``.sample(rng) -> indices`` and ``.event(noise_multiplier) -> DpEvent``;
        default ``privmtl.privacy.sampling.make_sampler(config.sampling, m, q)``.
    ledger : PrivacyLedger, optional
        Receives one event per round when the run is private (``noise_std > 0``, finite
        ``clip``, method other than ``local``); default a new ledger with ``config.accountant``,
        ``config.relation``, δ = ``config.delta`` or ``1/m`` and ``config.budget``.

    Returns
    -------
    TrainResult
    """
    config = TrainConfig() if config is None else config
    check_inputs(dataset, model)
    m = dataset.n_clients
    q = m if config.sampling == "all" else config.clients_per_round
    if q > m:
        raise InvalidParameterError(
            f"The 'clients_per_round' parameter must be <= the number of clients ({m}); got {q}."
        )
    spec = method_spec(config)
    if config.method == "pmtl" and config.server_update == "delta" and q < m:
        warnings.warn(
            f"server_update='delta' (Algorithm 1 as printed) with partial participation (q={q} "
            f"of m={m} clients per round) moves the billboard m/q = {m / q:.3g} times faster than "
            "the mean of the personalized models and can diverge; server_update='offset' (the "
            "authors' code) has the same privacy guarantee.",
            PrivmtlWarning,
            stacklevel=2,
        )
    delta = config.delta if config.delta is not None else 1.0 / m
    sampler = _resolve_sampler(config, m, q, sampler)
    ledger = _resolve_ledger(config, delta, ledger)
    z = config.noise_std * q / config.clip if config.is_private and config.clip else None
    if z is not None:  # fail fast on a sampling/relation/accountant combination it cannot bound
        ledger.epsilon_if(sampler.event(z))

    init = {name: p.detach().clone() for name, p in model.named_parameters()}
    if not init:
        raise InvalidParameterError("The 'model' parameter must have at least one parameter.")
    x_all, y_all, offsets = dataset.concat("train")
    x_all = x_all.to(next(iter(init.values())).dtype)  # compute in the model's dtype
    buffers = {name: b.detach() for name, b in model.named_buffers()}
    glob = {name: p.clone() for name, p in init.items()}
    personal: Params | None = None
    if spec.personalized:
        personal = {name: p.unsqueeze(0).repeat((m,) + (1,) * p.ndim) for name, p in init.items()}
    rng = sampling_rng(config.seed)
    gen = noise_generator(config.seed)
    step_fn = make_step_fn(model, buffers, config.vectorize) if config.batched else None
    chunk = config.client_chunk or max(q, 1)
    history: list[dict[str, Any]] = []
    eps = 0.0 if config.method == "local" else math.inf

    old_threads = torch.get_num_threads()
    pool = None
    if config.parallel_chunks and config.batched and config.threads > 1:
        from concurrent.futures import ThreadPoolExecutor

        torch.set_num_threads(1)
        # torch ops release the GIL; each worker pins its own OpenMP/MKL thread count to 1 too
        # (thread-local settings that a new thread would otherwise take from the environment)
        pool = ThreadPoolExecutor(
            max_workers=config.threads, initializer=torch.set_num_threads, initargs=(1,)
        )
    else:
        torch.set_num_threads(config.threads)
    was_training = model.training
    model.train()
    t_start = time.perf_counter()
    try:
        bar = tqdm(range(config.rounds), desc=config.method, disable=not config.progress)
        for t in bar:
            t0, c0 = time.perf_counter(), time.process_time()
            event = sampler.event(z) if z is not None else None
            if event is not None and config.budget is not None:
                ledger.check(event)
            sampled = np.asarray(sampler.sample(rng), dtype=np.int64).reshape(-1)
            plan = draw_round_plan(sampled, offsets, t, config)
            anchor = glob if spec.prox_weight != 0 else None
            news: Params | None = None
            starts: Params | None = None
            losses: list[float] = []
            norms, clipped = np.zeros(0), np.zeros(0, dtype=bool)
            if len(sampled):
                sel = torch.from_numpy(sampled)
                if spec.start_from_global:
                    starts = {
                        n: p.unsqueeze(0).expand((len(sampled), *p.shape)).clone()
                        for n, p in glob.items()
                    }
                else:
                    assert personal is not None
                    starts = {n: p.index_select(0, sel) for n, p in personal.items()}
                if step_fn is not None:

                    def train_group(
                        pos: np.ndarray,
                        starts: Params = starts,
                        anchor: Any = anchor,
                        plan: Any = plan,
                    ) -> tuple[Params, list]:
                        idx = torch.from_numpy(pos)
                        return local_train_batched(
                            step_fn,
                            {n: p.index_select(0, idx) for n, p in starts.items()},
                            anchor,
                            spec.prox_weight,
                            config.lr,
                            x_all,
                            y_all,
                            [plan[j] for j in pos],
                            config.batch_size,
                        )

                    if pool is not None:  # groups of equal work, one per thread at a time
                        groups = partition_plan(plan, config.threads, config.client_chunk)
                        results = list(pool.map(train_group, groups))
                    else:
                        groups = [
                            np.arange(c, min(c + chunk, len(sampled)))
                            for c in range(0, len(sampled), chunk)
                        ]
                        results = [train_group(g) for g in groups]
                    order = torch.from_numpy(np.argsort(np.concatenate(groups), kind="stable"))
                    for _, ls in results:
                        losses.extend(ls)
                    losses = [losses[int(i)] for i in order]
                    news = {
                        n: torch.cat([w[n] for w, _ in results]).index_select(0, order)
                        for n in starts
                    }
                else:
                    lst = [{n: p[j] for n, p in starts.items()} for j in range(len(sampled))]
                    outs, losses = local_train_reference(
                        model,
                        buffers,
                        lst,
                        anchor,
                        spec.prox_weight,
                        config.lr,
                        x_all,
                        y_all,
                        plan,
                    )
                    news = _stack(outs)
                if personal is not None:
                    for n in personal:
                        personal[n][sel] = news[n]
            if spec.communicates:
                if news is None or starts is None:
                    mean = {n: torch.zeros_like(p) for n, p in glob.items()}
                else:
                    # g_k = w_k^new − w_k^old (Algorithm 1), or w_k^new − w~^t ("offset")
                    base = glob if config.server_update == "offset" else None
                    if step_fn is not None:
                        deltas = {
                            n: news[n] - (starts[n] if base is None else base[n]) for n in news
                        }
                        mean, norms, clipped = aggregate_batched(deltas, glob, config.clip, q)
                    else:
                        dl = [
                            {
                                n: news[n][j] - (starts[n][j] if base is None else base[n])
                                for n in news
                            }
                            for j in range(len(sampled))
                        ]
                        mean, norms, clipped = aggregate_reference(dl, glob, config.clip, q)
                noise = draw_noise(glob, config.noise_std, gen)
                for n in glob:
                    glob[n] = glob[n] + mean[n] + (noise[n] if noise is not None else 0.0)
            if event is not None:
                eps = float(ledger.record(event, round=t))
            rec: dict[str, Any] = {
                "round": t,
                "sampled": sampled.tolist(),
                "n_sampled": len(sampled),
                "train_loss": float(np.mean(losses)) if losses else math.nan,
                "update_norms": [float(v) for v in norms],
                "clipped_fraction": float(clipped.mean()) if len(clipped) else 0.0,
                "noise_multiplier": z,
                "epsilon": eps,
                "seconds": time.perf_counter() - t0,
                "cpu_seconds": time.process_time() - c0,
            }
            if config.eval_every and (t + 1) % config.eval_every == 0:
                ev = _evaluate_split(model, buffers, dataset, "val", glob, personal, spec)
                main = ev["personalized" if spec.personalized else "global"]
                rec["val_accuracy"] = main["accuracy"]
                rec["val_mean_client_accuracy"] = main["mean_client_accuracy"]
            history.append(rec)
            if config.progress:
                bar.set_postfix(loss=f"{rec['train_loss']:.3f}", eps=f"{eps:.3g}")
        seconds = time.perf_counter() - t_start
        accuracies = {
            split: _evaluate_split(model, buffers, dataset, split, glob, personal, spec)
            for split in ("val", "test")
        }
    finally:
        if pool is not None:
            pool.shutdown()
        torch.set_num_threads(old_threads)
        model.train(was_training)
    train_seconds = sum(r["seconds"] for r in history)
    return TrainResult(
        config=config,
        client_ids=list(dataset.client_ids),
        personalized_params=personal,
        global_params=glob,
        history=history,
        accuracies=accuracies,
        primary="personalized" if spec.personalized else "global",
        epsilon=eps,
        delta=delta,
        ledger=ledger,
        seconds=seconds,
        seconds_per_round=train_seconds / max(len(history), 1),
    )


def _evaluate_split(
    model: nn.Module,
    buffers: Params,
    dataset: FederatedDataset,
    split: str,
    glob: Params,
    personal: Params | None,
    spec: Any,
) -> dict[str, dict[str, float]]:
    xs, ys = dataset.split(split)
    out = {}
    if personal is not None:
        out["personalized"] = evaluate(model, personal, buffers, xs, ys, personalized=True)
    if spec.communicates:
        out["global"] = evaluate(model, glob, buffers, xs, ys, personalized=False)
    return out
