r"""The workshop variant of PMTL (Hu, Wu & Smith, "Private multi-task learning: formulation and
methods", Alg. 1 of ``pmtl-jdp-workshop.txt``): noisy mean of *models* in a ball.

Algorithm (all ``m`` tasks every round; :math:`\Pi_B` is the Euclidean projection onto
:math:`\{w: \lVert w\rVert_2 \le B\}` over all parameters jointly):

1. :math:`w_k^0 = \Pi_B(w^0)` for every task (the model's initial parameters),
   :math:`\tilde w^0 = \frac1m\sum_k w_k^0`;
2. for :math:`t = 0..T-1`: every task runs the configured local steps (minibatches as in the engine:
   ``local_steps`` or ``local_epochs``, ``batch_size``) of projected SGD from its own persistent
   :math:`w_k`,

   .. math:: w_k \leftarrow \Pi_B\bigl(w_k - \eta\,(\nabla l_k(w_k) + \lambda(w_k-\tilde w^t))\bigr)

   (η = ``config.lr``, λ = ``config.lam``, :math:`l_k` the minibatch mean cross-entropy), and
   sends :math:`w_k` (the model, not an update);
3. the server releases :math:`\tilde w^{t+1} = \frac1m\sum_{k=1}^m w_k + N(0, \sigma^2 I)`;
4. after ``T`` rounds every task fine-tunes locally against :math:`\tilde w^T` (the paper's line 11:
   :math:`w_k \leftarrow w_k - \eta_l(\nabla l_k(w_k) + \lambda(w_k - \tilde w^T))`, no projection) —
   :func:`privmtl.federated.finetune.finetune` with ``method="mr"`` — post-processing.

Privacy of the released sequence :math:`\tilde w^{1..T}` (then JDP by the billboard lemma):

* **sensitivity** — every sent model lies in the ball. Under *replace-one* (one task's data
  replaced, ``m`` fixed) the mean moves by at most :math:`\lVert w_k - w_k'\rVert/m \le 2B/m`
  (the workshop proof's :math:`\Delta_2 h = 2B`). Under *add/remove* with the fixed divisor ``m``
  (a removed task contributes the zero vector, the convention of all privmtl servers) it moves by
  :math:`\lVert w_k\rVert/m \le B/m`.
* **tight accountant** — each round is a Gaussian mechanism; the ledger records
  ``GaussianDpEvent(z)`` with :math:`z = \sigma m / B` (the add/remove convention of
  :mod:`privmtl.privacy.accounting`, which doubles the sensitivity itself for
  ``relation="replace-one"``), with ``config.accountant``, ``config.relation`` and δ =
  ``config.delta`` or ``1/m``; that ε is the reported ``epsilon``.
* **closed form** (workshop Thm 2, replace-one): :math:`\sigma = 8B\sqrt{T\log(1/\delta)}/(\varepsilon
  m)` (:func:`~privmtl.privacy.closed_form.workshop_noise_std`); we also report its inverse
  :math:`\varepsilon_{paper} = 8B\sqrt{T\log(1/\delta)}/(\sigma m)`, valid when
  :math:`\varepsilon_{paper} \le 2\log(1/\delta)` (the step :math:`\log(1/\delta)/(\alpha-1) \le
  \varepsilon/2` of the proof). The proof also uses the Gaussian RDP
  :math:`2\alpha\Delta^2/\sigma^2` where the exact value is :math:`\alpha\Delta^2/(2\sigma^2)`, so
  the closed form is valid but loose (about 4× in ε²); the tight ε is smaller at the same σ.
"""

from __future__ import annotations

import math
import time
from typing import Any

import dp_accounting
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from tqdm.auto import tqdm

from privmtl._validation import check_int, check_real
from privmtl.data.federated import FederatedDataset
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import (
    Params,
    draw_noise,
    draw_round_plan,
    evaluate,
    noise_generator,
    pad_plan,
)
from privmtl.federated.config import TrainConfig, TrainResult, check_inputs
from privmtl.federated.engine import make_step_fn
from privmtl.federated.finetune import finetune
from privmtl.privacy.closed_form import pmtl_theorem1_valid, workshop_noise_std

__all__ = ["project_to_ball", "train_workshop", "workshop_epsilon_closed_form"]


def workshop_epsilon_closed_form(
    noise_std: float, bound: float, num_clients: int, rounds: int, delta: float
) -> float:
    """ε = 8B√(T·log(1/δ))/(σ·m): the inverse of :func:`workshop_noise_std` (replace-one)."""
    s = check_real("noise_std", noise_std, low=0.0, closed="neither")
    b = check_real("bound", bound, low=0.0, closed="neither")
    m = check_int("num_clients", num_clients, low=1)
    t = check_int("rounds", rounds, low=1)
    d = check_real("delta", delta, low=0.0, high=1.0, closed="neither")
    return 8.0 * b * math.sqrt(t * math.log(1.0 / d)) / (s * m)


def project_to_ball(params: Params, bound: float, *, stacked: bool) -> Params:
    r""":math:`\Pi_B(w) = w\min(1, B/\lVert w\rVert_2)`, the norm over all parameters jointly.

    With ``stacked=True`` every leading index ``k`` is one model, projected on its own.
    """
    if stacked:
        sq = sum(p.double().flatten(1).pow(2).sum(1) for p in params.values())
        norms = torch.as_tensor(sq).sqrt()
        fac = torch.where(norms > bound, bound / norms.clamp_min(1e-30), torch.ones_like(norms))
        return {n: p * fac.to(p.dtype).view((-1,) + (1,) * (p.ndim - 1)) for n, p in params.items()}
    norm = math.sqrt(sum(float(p.double().pow(2).sum()) for p in params.values()))
    f = bound / norm if norm > bound else 1.0
    return {n: p * f for n, p in params.items()}


def _model_norms(params: Params) -> torch.Tensor:
    sq = sum(p.double().flatten(1).pow(2).sum(1) for p in params.values())
    return torch.as_tensor(sq).sqrt()


def _local_batched(
    step_fn: Any,
    w: Params,
    anchor: Params,
    lam: float,
    lr: float,
    bound: float,
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    plan: list[list[np.ndarray]],
    batch_size: int,
) -> tuple[Params, list[float]]:
    rows, weights, active = pad_plan(plan, batch_size)
    w = {n: p.clone() for n, p in w.items()}
    loss_sum = torch.zeros(len(plan), dtype=torch.float64)
    with torch.no_grad():
        for s in range(rows.shape[0]):
            r = rows[s]
            grads, loss = step_fn(w, x_all[r], y_all[r], weights[s])
            a = active[s]
            new = {}
            for n, p in w.items():
                mask = a.view((-1,) + (1,) * (p.ndim - 1)).to(p.dtype)
                new[n] = p - lr * (grads[n] + lam * (p - anchor[n])) * mask
            w = project_to_ball(new, bound, stacked=True)  # identity for inactive (in the ball)
            loss_sum += loss.double() * a.double()
    steps = active.sum(0).double()
    return w, torch.where(steps > 0, loss_sum / steps.clamp_min(1), torch.nan).tolist()


def _local_reference(
    model: nn.Module,
    buffers: Params,
    w: Params,
    anchor: Params,
    lam: float,
    lr: float,
    bound: float,
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    plan: list[list[np.ndarray]],
) -> tuple[Params, list[float]]:
    outs, losses = [], []
    for k, steps in enumerate(plan):
        wk = {n: p[k].clone() for n, p in w.items()}
        total = 0.0
        for rows in steps:
            idx = torch.from_numpy(np.asarray(rows, dtype=np.int64))
            leaves = {n: p.detach().requires_grad_(True) for n, p in wk.items()}
            with torch.enable_grad():
                loss = F.cross_entropy(
                    functional_call(model, (leaves, buffers), (x_all[idx],)), y_all[idx]
                )
                gs = torch.autograd.grad(loss, list(leaves.values()))
            total += float(loss.detach())
            with torch.no_grad():
                new = {
                    n: p.detach() - lr * (g + lam * (p.detach() - anchor[n]))
                    for (n, p), g in zip(leaves.items(), gs, strict=True)
                }
            wk = project_to_ball(new, bound, stacked=False)
        outs.append(wk)
        losses.append(total / len(steps) if steps else math.nan)
    return {n: torch.stack([o[n] for o in outs]) for n in w}, losses


def train_workshop(
    dataset: FederatedDataset,
    model: nn.Module,
    config: TrainConfig | None = None,
    *,
    bound: float,
    epsilon: float | None = None,
    noise_std: float | None = None,
    finetune_epochs: int = 1,
    finetune_lr: float | None = None,
    ledger: Any = None,
) -> TrainResult:
    r"""Run the workshop algorithm (module docstring) and fine-tune every task against
    :math:`\tilde w^T`.

    Parameters
    ----------
    dataset : FederatedDataset
    model : nn.Module
        Architecture and initial parameters (projected onto the ball).
    config : TrainConfig, optional
        Uses ``rounds`` (T), ``lr`` (η), ``lam`` (λ), ``local_steps``/``local_epochs``,
        ``batch_size``, ``seed``, ``delta`` (default ``1/m``), ``accountant``, ``relation``,
        ``batched``, ``progress``, ``threads``. Participation is always all ``m`` tasks
        (``sampling``, ``clients_per_round`` and ``clip`` are ignored: the projection bounds the
        sensitivity); ``noise_std`` is σ unless ``epsilon`` or ``noise_std`` is given here.
    bound : float > 0
        Radius ``B`` of the ball.
    epsilon : float, optional
        Target ε of the workshop's closed form: :math:`\sigma` = ``workshop_noise_std(ε, B, m, T,
        δ)``. The reported ``epsilon`` is still the tight accountant's for that σ.
    noise_std : float, optional
        σ given directly (at most one of ``epsilon`` and ``noise_std``).
    finetune_epochs : int, default 1
        Epochs of the final local mean-regularized fine-tuning (0: output :math:`w_k^T`).
    finetune_lr : float, optional
        :math:`\eta_l` (default ``config.lr``).
    ledger : PrivacyLedger, optional

    Returns
    -------
    TrainResult
        ``personalized_params``: the fine-tuned models; ``global_params``: :math:`\tilde w^T`;
        ``epsilon``: the tight accountant's ε of the T releases; ``history`` records ``epsilon``
        and ``max_model_norm`` (largest :math:`\lVert w_k\rVert` sent that round) per round;
        ``extra`` holds ``bound``, ``noise_std``, ``noise_multiplier`` (σm/B),
        ``sensitivity`` (B/m add/remove, 2B/m replace-one, for the configured relation),
        ``epsilon_closed_form`` and ``closed_form_valid`` (workshop Thm 2, replace-one) and
        ``pre_finetune_accuracies``.
    """
    config = TrainConfig() if config is None else config
    check_inputs(dataset, model)
    bound = check_real("bound", bound, low=0.0, closed="neither")
    finetune_epochs = check_int("finetune_epochs", finetune_epochs, low=0)
    if epsilon is not None and noise_std is not None:
        raise InvalidParameterError(
            "Give at most one of 'epsilon' and 'noise_std'; got "
            f"epsilon={epsilon!r}, noise_std={noise_std!r}."
        )
    m = dataset.n_clients
    T = config.rounds
    delta = config.delta if config.delta is not None else 1.0 / m
    if epsilon is not None:
        sigma = workshop_noise_std(epsilon, bound, m, max(T, 1), delta)
    elif noise_std is not None:
        sigma = check_real("noise_std", noise_std, low=0.0)
    else:
        sigma = float(config.noise_std)
    z = sigma * m / bound if sigma > 0 else None
    if z is not None and ledger is None:
        from privmtl.privacy.accounting import PrivacyLedger

        ledger = PrivacyLedger(
            accountant=config.accountant,
            relation=config.relation,
            delta=delta,
            budget=config.budget,
        )
    eps_closed = (
        workshop_epsilon_closed_form(sigma, bound, m, T, delta) if sigma > 0 and T > 0 else math.inf
    )

    x_all, y_all, offsets = dataset.concat("train")
    init = project_to_ball(
        {n: p.detach().clone() for n, p in model.named_parameters()}, bound, stacked=False
    )
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    w = {n: p.unsqueeze(0).repeat((m,) + (1,) * p.ndim) for n, p in init.items()}
    glob = {n: p.clone() for n, p in init.items()}
    gen = noise_generator(config.seed)
    step_fn = make_step_fn(model, buffers) if config.batched else None
    everyone = list(range(m))
    history: list[dict[str, Any]] = []
    eps = math.inf
    old_threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    was_training = model.training
    model.train()
    t_start = time.perf_counter()
    try:
        bar = tqdm(range(T), desc="workshop", disable=not config.progress)
        for t in bar:
            t0 = time.perf_counter()
            event = dp_accounting.GaussianDpEvent(z) if z is not None else None
            if event is not None and config.budget is not None:
                ledger.check(event)
            plan = draw_round_plan(everyone, offsets, t, config)
            if step_fn is not None:
                w, losses = _local_batched(
                    step_fn, w, glob, config.lam, config.lr, bound, x_all, y_all, plan,
                    config.batch_size,
                )  # fmt: skip
            else:
                w, losses = _local_reference(
                    model, buffers, w, glob, config.lam, config.lr, bound, x_all, y_all, plan
                )
            noise = draw_noise(glob, sigma, gen)
            glob = {n: p.mean(0) + (noise[n] if noise is not None else 0.0) for n, p in w.items()}
            if event is not None:
                eps = float(ledger.record(event, round=t))
            history.append(
                {
                    "round": t,
                    "sampled": everyone,
                    "n_sampled": m,
                    "train_loss": float(np.nanmean(losses)) if losses else math.nan,
                    "max_model_norm": float(_model_norms(w).max()),
                    "noise_multiplier": z,
                    "epsilon": eps,
                    "seconds": time.perf_counter() - t0,
                }
            )
            if config.progress:
                bar.set_postfix(eps=f"{eps:.3g}")
        seconds = time.perf_counter() - t_start
        pre = {}
        for split in ("val", "test"):
            xs, ys = dataset.split(split)
            pre[split] = evaluate(model, w, buffers, xs, ys, personalized=True)
        tuned, acc = finetune(
            w,
            dataset,
            model,
            method="mr",
            start="personalized",
            global_params=glob,
            epochs=finetune_epochs,
            lr=config.lr if finetune_lr is None else finetune_lr,
            batch_size=config.batch_size,
            lam=config.lam,
            seed=config.seed,
            batched=config.batched,
        )
        accuracies: dict[str, dict[str, dict[str, float]]] = {}
        for split in ("val", "test"):
            xs, ys = dataset.split(split)
            accuracies[split] = {
                "personalized": acc[split],
                "global": evaluate(model, glob, buffers, xs, ys, personalized=False),
            }
    finally:
        torch.set_num_threads(old_threads)
        model.train(was_training)
    factor = 2.0 if config.relation == "replace-one" else 1.0
    return TrainResult(
        config=config,
        client_ids=list(dataset.client_ids),
        personalized_params=tuned,
        global_params=glob,
        history=history,
        accuracies=accuracies,
        primary="personalized",
        epsilon=eps,
        delta=delta,
        ledger=ledger,
        seconds=seconds,
        seconds_per_round=sum(r["seconds"] for r in history) / max(len(history), 1),
        extra={
            "method": "workshop",
            "bound": bound,
            "noise_std": sigma,
            "noise_multiplier": z,
            "sensitivity": factor * bound / m,
            "sensitivity_relation": config.relation,
            "epsilon_closed_form": eps_closed,
            "closed_form_relation": "replace-one",
            "closed_form_valid": bool(
                math.isfinite(eps_closed) and pmtl_theorem1_valid(eps_closed, delta)
            ),
            "finetune_epochs": finetune_epochs,
            "pre_finetune_accuracies": {s: {"personalized": v} for s, v in pre.items()},
        },
    )
