r"""Baselines of the PMTL paper that need their own server: joint-model DP and PP-SGD.

Both use the engine's building blocks (client sampler, minibatch plans, local SGD, clipping, noise
stream, ledger), so their privacy events — and hence ε for a given :class:`TrainConfig` — are the
same as PMTL's: the sampler's event with noise multiplier :math:`z = \sigma q/\gamma` per round.

* :func:`train_joint_dp` — naive client-level DP on the *joint* model (the concatenation of all
  ``m`` personalized models; the paper's Fig. 1). Every block gets Gaussian noise of std
  :math:`z\gamma` every round, so the models drown in noise: near random guessing.
* :func:`train_pp_sgd` — PP-SGD (Bietti et al. 2022) for multinomial logistic regression:
  prediction with :math:`(W+\Theta_k)x + (b+\beta_k)`, the shared :math:`(W, b)` trained by the
  private server mechanism, the local :math:`(\Theta_k, \beta_k)` never sent.
* :func:`config_for_epsilon` — the :class:`TrainConfig` whose ``noise_std`` meets a target ε with the
  config's sampler, accountant and relation (what PMTL, joint-DP and PP-SGD all use).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import dp_accounting
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from tqdm.auto import tqdm

from privmtl._validation import check_real
from privmtl.data.federated import FederatedDataset
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import (
    Params,
    clip_factors,
    draw_noise,
    draw_round_plan,
    evaluate,
    noise_generator,
    pad_plan,
    sampling_rng,
)
from privmtl.federated.config import TrainConfig, TrainResult, check_inputs
from privmtl.federated.engine import local_train_batched, make_step_fn
from privmtl.federated.models import MultinomialLogReg
from privmtl.federated.reference import local_train_reference

__all__ = ["config_for_epsilon", "train_joint_dp", "train_pp_sgd"]


# ---------------------------------------------------------------------------- shared setup
def _clients_per_round(config: TrainConfig, m: int) -> int:
    q = m if config.sampling == "all" else config.clients_per_round
    if q > m:
        raise InvalidParameterError(
            f"The 'clients_per_round' parameter must be <= the number of clients ({m}); got {q}."
        )
    return q


def _sampler(config: TrainConfig, m: int, q: int, sampler: Any) -> Any:
    if sampler is not None:
        return sampler
    from privmtl.privacy.sampling import make_sampler

    return make_sampler(config.sampling, m, q)


def config_for_epsilon(
    config: TrainConfig, num_clients: int, target_epsilon: float, *, sampler: Any = None
) -> TrainConfig:
    r"""``config`` with ``noise_std`` set so that ``config.rounds`` rounds meet ``target_epsilon``.

    The noise multiplier ``z`` is calibrated (:func:`~privmtl.privacy.calibrate_noise_multiplier`)
    on ``SelfComposedDpEvent(sampler.event(z), rounds)`` with ``config.accountant``,
    ``config.relation`` and δ = ``config.delta`` or ``1/num_clients``; then
    :math:`\sigma = z\gamma/q` (the PMTL convention: σ is the std of the noise on the mean update).
    :func:`train_joint_dp`, :func:`train_pp_sgd` and the PMTL engine all spend the same ε with it.
    """
    from privmtl.privacy.accounting import calibrate_noise_multiplier

    if config.clip is None:
        raise InvalidParameterError("config_for_epsilon needs a finite 'clip'; got clip=None.")
    m = int(num_clients)
    q = _clients_per_round(config, m)
    smp = _sampler(config, m, q, sampler)
    delta = config.delta if config.delta is not None else 1.0 / m
    z = calibrate_noise_multiplier(
        lambda zz: dp_accounting.SelfComposedDpEvent(smp.event(zz), config.rounds),
        target_epsilon=target_epsilon,
        delta=delta,
        accountant=config.accountant,
        relation=config.relation,
    )
    return dataclasses.replace(config, noise_std=z * config.clip / q)


class _Run:
    """Sampler, ledger, noise multiplier and random streams of one private run (engine order)."""

    def __init__(
        self, dataset: FederatedDataset, config: TrainConfig, sampler: Any, ledger: Any
    ) -> None:
        check_inputs(dataset)
        self.m = dataset.n_clients
        self.q = _clients_per_round(config, self.m)
        self.delta = config.delta if config.delta is not None else 1.0 / self.m
        self.sampler = _sampler(config, self.m, self.q, sampler)
        private = config.noise_std > 0 and config.clip is not None
        self.z = config.noise_std * self.q / config.clip if private and config.clip else None
        if self.z is not None and ledger is None:
            from privmtl.privacy.accounting import PrivacyLedger

            ledger = PrivacyLedger(
                accountant=config.accountant,
                relation=config.relation,
                delta=self.delta,
                budget=config.budget,
            )
        self.ledger = ledger
        if self.z is not None:  # fail fast on an unsupported sampling/relation/accountant
            self.ledger.epsilon_if(self.sampler.event(self.z))
        self.rng = sampling_rng(config.seed)
        self.gen = noise_generator(config.seed)
        self.eps = math.inf
        self.config = config

    def begin_round(self) -> tuple[Any, np.ndarray]:
        event = self.sampler.event(self.z) if self.z is not None else None
        if event is not None and self.config.budget is not None:
            self.ledger.check(event)
        sampled = np.asarray(self.sampler.sample(self.rng), dtype=np.int64).reshape(-1)
        return event, sampled

    def end_round(self, event: Any, t: int) -> float:
        if event is not None:
            self.eps = float(self.ledger.record(event, round=t))
        return self.eps


def _record(
    t: int,
    sampled: np.ndarray,
    losses: list[float],
    norms: np.ndarray,
    clipped: np.ndarray,
    z: float | None,
    eps: float,
    t0: float,
) -> dict[str, Any]:
    return {
        "round": t,
        "sampled": sampled.tolist(),
        "n_sampled": len(sampled),
        "train_loss": float(np.nanmean(losses)) if len(losses) else math.nan,
        "update_norms": [float(v) for v in norms],
        "clipped_fraction": float(clipped.mean()) if len(clipped) else 0.0,
        "noise_multiplier": z,
        "epsilon": eps,
        "seconds": time.perf_counter() - t0,
    }


def _norms_and_factors(deltas: Params, clip: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    sq = sum(t.double().flatten(1).pow(2).sum(1) for t in deltas.values())
    norms = torch.as_tensor(sq).sqrt()
    return norms, clip_factors(norms, clip)


def _evaluate_both(
    model: nn.Module, buffers: Params, dataset: FederatedDataset, personal: Params, glob: Params
) -> dict[str, dict[str, dict[str, float]]]:
    out = {}
    for split in ("val", "test"):
        xs, ys = dataset.split(split)
        out[split] = {
            "personalized": evaluate(model, personal, buffers, xs, ys, personalized=True),
            "global": evaluate(model, glob, buffers, xs, ys, personalized=False),
        }
    return out


# ---------------------------------------------------------------------------- joint-model DP
def train_joint_dp(
    dataset: FederatedDataset,
    model: nn.Module,
    config: TrainConfig | None = None,
    *,
    sampler: Any = None,
    ledger: Any = None,
) -> TrainResult:
    r"""Naive client-level DP on the joint model :math:`W = [w_1; \dots; w_m]` (paper, Fig. 1).

    The released output of every round is the whole concatenation of the ``m`` personalized
    models (so *every* client's model must be DP, including towards the client itself):

    1. the server samples :math:`S_t` with the configured sampler; the current released models
       :math:`\tilde w_k^t` are public;
    2. every :math:`k\in S_t` starts from its released block :math:`\tilde w_k^t` and runs the
       configured local SGD on :math:`l_k(w) + \frac{\lambda}{2}\lVert w - \bar w^t\rVert^2`,
       :math:`\bar w^t = \frac1m\sum_j \tilde w_j^t` the mean of the released blocks
       (mean-regularized MTL; λ = ``config.lam``, ``0`` gives independent local models), giving
       :math:`g_k = w_k - \tilde w_k^t`;
    3. the server releases, for **every** block :math:`k = 1..m` (sampled or not),

       .. math:: \tilde w_k^{t+1} = \tilde w_k^t + \mathbb 1[k\in S_t]\, g_k
                 \min\Bigl(1, \frac{\gamma}{\lVert g_k\rVert_2}\Bigr) + N(0, (z\gamma)^2 I),

       with :math:`z = \sigma q/\gamma` from ``config`` (``noise_std`` σ, ``clip`` γ,
       ``clients_per_round`` q) — the same noise multiplier, sampler event and accountant as PMTL,
       hence the same ε. ``config.method`` is ignored.

    Guarantee: a client touches only its own block, so adding/removing one client (its block's
    update present or zero) moves the released joint vector by at most γ (2γ under replace-one,
    which the ledger's relation accounts for); the per-round release is the Gaussian mechanism
    with multiplier ``z`` on the sampled clients, recorded as ``sampler.event(z)``: (ε, δ)-DP of
    the *whole* output — much stronger than JDP, and useless: each block receives noise of std
    :math:`z\gamma = \sigma q` per coordinate per round (``q`` times PMTL's).

    Returns
    -------
    TrainResult
        ``personalized_params``: the released blocks (these are the models, noise included);
        ``global_params``: their mean (post-processing); ``primary = "personalized"``;
        ``extra["method"] = "joint-dp"``.
    """
    config = TrainConfig() if config is None else config
    check_inputs(dataset, model)
    run = _Run(dataset, config, sampler, ledger)
    m, z = run.m, run.z
    block_std = z * float(config.clip) if z is not None and config.clip is not None else 0.0
    x_all, y_all, offsets = dataset.concat("train")
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    released = {n: p.unsqueeze(0).repeat((m,) + (1,) * p.ndim) for n, p in init.items()}
    step_fn = make_step_fn(model, buffers) if config.batched else None
    lam = float(config.lam)
    history: list[dict[str, Any]] = []
    old_threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    was_training = model.training
    model.train()
    t_start = time.perf_counter()
    try:
        bar = tqdm(range(config.rounds), desc="joint-dp", disable=not config.progress)
        for t in bar:
            t0 = time.perf_counter()
            event, sampled = run.begin_round()
            plan = draw_round_plan(sampled.tolist(), offsets, t, config)
            losses: list[float] = []
            norms, clipped = np.zeros(0), np.zeros(0, dtype=bool)
            if len(sampled):
                sel = torch.from_numpy(sampled)
                centre = {n: p.mean(0) for n, p in released.items()} if lam != 0 else None
                starts = {n: p.index_select(0, sel) for n, p in released.items()}
                news, losses = _local_sgd(
                    model, buffers, step_fn, starts, centre, lam, config, x_all, y_all, plan
                )
                deltas = {n: news[n] - starts[n] for n in news}
                nrm, fac = _norms_and_factors(deltas, config.clip)
                norms, clipped = nrm.numpy(), (fac < 1).numpy()
                with torch.no_grad():
                    for n in released:
                        shape = (-1,) + (1,) * (released[n].ndim - 1)
                        released[n][sel] += deltas[n] * fac.to(deltas[n].dtype).view(shape)
            noise = draw_noise(released, block_std, run.gen)
            if noise is not None:
                for n in released:
                    released[n] = released[n] + noise[n]
            eps = run.end_round(event, t)
            history.append(_record(t, sampled, losses, norms, clipped, z, eps, t0))
            if config.progress:
                bar.set_postfix(eps=f"{eps:.3g}")
        seconds = time.perf_counter() - t_start
        glob = {n: p.mean(0) for n, p in released.items()}
        accuracies = _evaluate_both(model, buffers, dataset, released, glob)
    finally:
        torch.set_num_threads(old_threads)
        model.train(was_training)
    return TrainResult(
        config=config,
        client_ids=list(dataset.client_ids),
        personalized_params=released,
        global_params=glob,
        history=history,
        accuracies=accuracies,
        primary="personalized",
        epsilon=run.eps,
        delta=run.delta,
        ledger=run.ledger,
        seconds=seconds,
        seconds_per_round=sum(r["seconds"] for r in history) / max(len(history), 1),
        extra={
            "method": "joint-dp",
            "notion": "DP of the joint model (all m models released)",
            "block_noise_std": block_std,
        },
    )


def _local_sgd(
    model: nn.Module,
    buffers: Params,
    step_fn: Any,
    starts: Params,
    anchor: Params | None,
    lam: float,
    config: TrainConfig,
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    plan: list[list[np.ndarray]],
) -> tuple[Params, list[float]]:
    """The engine's local SGD (batched or reference) on ``l_k(w) + (lam/2)‖w − anchor‖²``."""
    k = len(plan)
    if step_fn is not None:
        chunk = config.client_chunk or k
        parts, losses = [], []
        for c in range(0, k, chunk):
            sl = slice(c, c + chunk)
            w, ls = local_train_batched(
                step_fn,
                {n: p[sl] for n, p in starts.items()},
                anchor,
                lam,
                config.lr,
                x_all,
                y_all,
                plan[sl],
                config.batch_size,
            )
            parts.append(w)
            losses.extend(ls)
        return {n: torch.cat([w[n] for w in parts]) for n in starts}, losses
    lst = [{n: p[j] for n, p in starts.items()} for j in range(k)]
    outs, losses = local_train_reference(
        model, buffers, lst, anchor, lam, config.lr, x_all, y_all, plan
    )
    return {n: torch.stack([o[n] for o in outs]) for n in starts}, losses


# ---------------------------------------------------------------------------- PP-SGD
Observer = Callable[[dict[str, Any]], None]


def _ppsgd_batched(
    step_fn: Any,
    shared: Params,
    local: Params,
    lr: float,
    alpha: float,
    mu: float,
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    plan: list[list[np.ndarray]],
    batch_size: int,
) -> tuple[Params, Params, list[float]]:
    rows, weights, active = pad_plan(plan, batch_size)
    w = {n: p.clone() for n, p in shared.items()}
    th = {n: p.clone() for n, p in local.items()}
    loss_sum = torch.zeros(len(plan), dtype=torch.float64)
    with torch.no_grad():
        for s in range(rows.shape[0]):
            r = rows[s]
            v = {n: w[n] + th[n] for n in w}
            grads, loss = step_fn(v, x_all[r], y_all[r], weights[s])
            a = active[s]
            for n in w:
                mask = a.view((-1,) + (1,) * (w[n].ndim - 1)).to(w[n].dtype)
                g = grads[n]
                w[n] = w[n] - lr * g * mask
                th[n] = th[n] - alpha * lr * (g + mu * th[n]) * mask
            loss_sum += loss.double() * a.double()
    steps = active.sum(0).double()
    losses = torch.where(steps > 0, loss_sum / steps.clamp_min(1), torch.nan)
    return w, th, losses.tolist()


def _ppsgd_reference(
    model: nn.Module,
    buffers: Params,
    shared: Params,
    local: list[Params],
    lr: float,
    alpha: float,
    mu: float,
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    plan: list[list[np.ndarray]],
) -> tuple[list[Params], list[Params], list[float]]:
    ws, ths, losses = [], [], []
    for th0, steps in zip(local, plan, strict=True):
        w = {n: p.clone() for n, p in shared.items()}
        th = {n: p.clone() for n, p in th0.items()}
        total = 0.0
        for rows in steps:
            idx = torch.from_numpy(np.asarray(rows, dtype=np.int64))
            leaves = {n: (w[n] + th[n]).requires_grad_(True) for n in w}
            with torch.enable_grad():
                logits = functional_call(model, (leaves, buffers), (x_all[idx],))
                loss = F.cross_entropy(logits, y_all[idx])
                gs = torch.autograd.grad(loss, list(leaves.values()))
            total += float(loss.detach())
            with torch.no_grad():
                for n, g in zip(leaves, gs, strict=True):
                    w[n] = w[n] - lr * g
                    th[n] = th[n] - alpha * lr * (g + mu * th[n])
        ws.append(w)
        ths.append(th)
        losses.append(total / len(steps) if steps else math.nan)
    return ws, ths, losses


def train_pp_sgd(
    dataset: FederatedDataset,
    config: TrainConfig | None = None,
    *,
    model: MultinomialLogReg | None = None,
    alpha: float = 1.0,
    theta_reg: float | None = None,
    theta_init: Mapping[str, torch.Tensor] | None = None,
    sampler: Any = None,
    ledger: Any = None,
    observer: Observer | None = None,
) -> TrainResult:
    r"""PP-SGD (Bietti et al. 2022) for multinomial logistic regression, with PMTL's server.

    Client ``k`` predicts with logits :math:`(W+\Theta_k)x + (b+\beta_k)`; :math:`u = (W, b)` is
    shared, :math:`\theta_k = (\Theta_k, \beta_k)` is local and **never sent**. Local objective
    (minibatch :math:`b`, :math:`\mu` = ``theta_reg``):

    .. math:: f_k(u, \theta_k) = \frac{1}{|b|}\sum_{i\in b}
              \mathrm{CE}\bigl((W+\Theta_k)x_i + (b+\beta_k),\, y_i\bigr)
              + \frac{\mu}{2}\lVert\theta_k\rVert_2^2 .

    Round ``t``: the server samples :math:`S_t` and broadcasts :math:`\tilde u^t`; every
    :math:`k\in S_t` sets :math:`u \leftarrow \tilde u^t` and runs the configured local SGD steps
    (``local_steps``/``local_epochs``, ``batch_size``, step η = ``lr``), each step with
    :math:`G = \nabla_{v}\mathrm{CE}` at :math:`v = u+\theta_k` (equal to both partial gradients
    of the data term):

    .. math:: u \leftarrow u - \eta G, \qquad
              \theta_k \leftarrow \theta_k - \alpha\eta\,(G + \mu\theta_k),

    (α = ``alpha``: the personalization step-size ratio of Bietti et al.); it keeps
    :math:`\theta_k` and sends only :math:`g_k = u - \tilde u^t`. The server releases PMTL's
    mechanism on the shared part,
    :math:`\tilde u^{t+1} = \tilde u^t + \frac1q\sum_{k\in S_t} g_k\min(1, \gamma/\lVert g_k\rVert)
    + N(0, \sigma^2 I)`, recorded as ``sampler.event(σq/γ)`` — the same events, hence the same ε,
    as PMTL with this ``config``. ``config.lam`` and ``config.method`` are not used, except that
    ``theta_reg`` defaults to ``config.lam``.

    With ``alpha = 0`` and :math:`\theta_k = 0` this is exactly private FedAvg.

    Parameters
    ----------
    dataset : FederatedDataset
    config : TrainConfig, optional
    model : MultinomialLogReg, optional
        Initial shared model :math:`\tilde u^0` (default ``MultinomialLogReg(d, C)``, zeros).
    alpha : float >= 0, default 1.0
    theta_reg : float >= 0, optional
        :math:`\mu` (default ``config.lam``).
    theta_init : dict, optional
        Initial local parts stacked ``(m, C, d)`` / ``(m, C)`` under the model's parameter names
        (default zeros).
    sampler, ledger : optional
        As in :func:`privmtl.federated.engine.train`.
    observer : callable, optional
        Called after every server release with ``{"round", "sampled", "messages", "released"}``:
        ``messages`` are exactly what the server received (stacked shared-part updates
        :math:`g_k` of the sampled clients, before clipping) and ``released`` is
        :math:`\tilde u^{t+1}`; for audits and tests.

    Returns
    -------
    TrainResult
        ``personalized_params`` :math:`\tilde u^T + \theta_k` stacked; ``global_params``
        :math:`\tilde u^T`; ``primary = "personalized"``; ``extra["method"] = "pp-sgd"``.
    """
    config = TrainConfig() if config is None else config
    run = _Run(dataset, config, sampler, ledger)
    m, q, z = run.m, run.q, run.z
    alpha = check_real("alpha", alpha, low=0.0)
    mu = check_real("theta_reg", config.lam if theta_reg is None else theta_reg, low=0.0)
    if model is None:
        model = MultinomialLogReg(dataset.n_features, dataset.n_classes)
    if not isinstance(model, MultinomialLogReg):
        raise InvalidParameterError(
            "PP-SGD is defined for linear models only: the 'model' parameter must be a "
            f"MultinomialLogReg; got {type(model).__name__}."
        )
    if model.n_features != dataset.n_features or model.n_classes != dataset.n_classes:
        raise InvalidParameterError(
            f"The model has {model.n_features} features and {model.n_classes} classes; the data "
            f"has {dataset.n_features} and {dataset.n_classes}."
        )
    x_all, y_all, offsets = dataset.concat("train")
    glob = {n: p.detach().clone() for n, p in model.named_parameters()}
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    if theta_init is None:
        theta = {n: torch.zeros((m, *p.shape), dtype=p.dtype) for n, p in glob.items()}
    else:
        theta = {}
        for n, p in glob.items():
            if n not in theta_init or tuple(theta_init[n].shape) != (m, *p.shape):
                raise InvalidParameterError(
                    f"The 'theta_init' parameter must hold {n!r} of shape {(m, *p.shape)}."
                )
            theta[n] = torch.as_tensor(theta_init[n], dtype=p.dtype).clone()
    step_fn = make_step_fn(model, buffers) if config.batched else None
    history: list[dict[str, Any]] = []
    old_threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    t_start = time.perf_counter()
    try:
        bar = tqdm(range(config.rounds), desc="pp-sgd", disable=not config.progress)
        for t in bar:
            t0 = time.perf_counter()
            event, sampled = run.begin_round()
            plan = draw_round_plan(sampled.tolist(), offsets, t, config)
            losses: list[float] = []
            norms, clipped = np.zeros(0), np.zeros(0, dtype=bool)
            mean = {n: torch.zeros_like(p) for n, p in glob.items()}
            messages = {n: torch.zeros((0, *p.shape), dtype=p.dtype) for n, p in glob.items()}
            if len(sampled):
                sel = torch.from_numpy(sampled)
                k = len(sampled)
                shared = {n: p.unsqueeze(0).expand((k, *p.shape)).clone() for n, p in glob.items()}
                local = {n: p.index_select(0, sel) for n, p in theta.items()}
                if step_fn is not None:
                    new_u, new_th, losses = _ppsgd_batched(
                        step_fn, shared, local, config.lr, alpha, mu, x_all, y_all, plan,
                        config.batch_size,
                    )  # fmt: skip
                else:
                    us, ths, losses = _ppsgd_reference(
                        model, buffers, {n: p for n, p in glob.items()},
                        [{n: p[j] for n, p in local.items()} for j in range(k)],
                        config.lr, alpha, mu, x_all, y_all, plan,
                    )  # fmt: skip
                    new_u = {n: torch.stack([u[n] for u in us]) for n in glob}
                    new_th = {n: torch.stack([h[n] for h in ths]) for n in glob}
                for n in theta:  # the local part stays on the client
                    theta[n][sel] = new_th[n]
                # ---- what the server receives: the shared-part updates only
                messages = {n: new_u[n] - shared[n] for n in glob}
                nrm, fac = _norms_and_factors(messages, config.clip)
                norms, clipped = nrm.numpy(), (fac < 1).numpy()
                mean = {
                    n: torch.tensordot(fac.to(g.dtype), g, dims=1) / q for n, g in messages.items()
                }
            noise = draw_noise(glob, config.noise_std, run.gen)  # as the engine
            for n in glob:
                glob[n] = glob[n] + mean[n] + (noise[n] if noise is not None else 0.0)
            if observer is not None:
                observer(
                    {
                        "round": t,
                        "sampled": sampled.copy(),
                        "messages": {n: g.clone() for n, g in messages.items()},
                        "released": {n: p.clone() for n, p in glob.items()},
                    }
                )
            eps = run.end_round(event, t)
            history.append(_record(t, sampled, losses, norms, clipped, z, eps, t0))
            if config.progress:
                bar.set_postfix(eps=f"{eps:.3g}")
        seconds = time.perf_counter() - t_start
        personal = {n: glob[n].unsqueeze(0) + theta[n] for n in glob}
        accuracies = _evaluate_both(model, buffers, dataset, personal, glob)
    finally:
        torch.set_num_threads(old_threads)
    return TrainResult(
        config=config,
        client_ids=list(dataset.client_ids),
        personalized_params=personal,
        global_params=glob,
        history=history,
        accuracies=accuracies,
        primary="personalized",
        epsilon=run.eps,
        delta=run.delta,
        ledger=run.ledger,
        seconds=seconds,
        seconds_per_round=sum(r["seconds"] for r in history) / max(len(history), 1),
        extra={"method": "pp-sgd", "alpha": alpha, "theta_reg": mu},
    )
