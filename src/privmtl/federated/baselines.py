r"""Baselines of the PMTL paper that need their own server: joint-model DP and PP-SGD.

Both run through :class:`~privmtl.federated.protocol.Trainer` (client sampler, minibatch plans,
local SGD, the one server release, noise source, ledger), so their privacy events — and hence ε for a given :class:`TrainConfig` — are the
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
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from privmtl._validation import check_real
from privmtl.data.federated import FederatedDataset
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import Params
from privmtl.federated.backend import release_noise
from privmtl.federated.config import (
    ResolvedRun,
    TrainConfig,
    TrainResult,
    check_inputs,
    resolve,
)
from privmtl.federated.models import MultinomialLogReg
from privmtl.federated.trainer import Trainer

__all__ = ["config_for_epsilon", "train_joint_dp", "train_pp_sgd"]


# ---------------------------------------------------------------------------- shared setup
def config_for_epsilon(
    config: TrainConfig, num_clients: int, target_epsilon: float, *, sampler: Any = None
) -> TrainConfig:
    r"""``config`` resolved for ``num_clients`` clients with the target ``target_epsilon`` and
    ``noise_std`` calibrated to it so that ``config.rounds`` rounds meet it.

    :func:`~privmtl.federated.config.resolve` of ``config`` with ``epsilon`` set, and σ the
    run's release calibrates to its target (:func:`~privmtl.federated.backend.release_noise`):
    :func:`~privmtl.privacy.calibration.calibrate_release`'s for the sampler's event composed
    ``config.rounds`` times, with ``config.accountant``, ``config.relation``, the resolved δ,
    γ = ``config.clip`` and q the clients per round (the PMTL convention: σ is the std of the
    noise on the mean update), and with adaptive clipping the count's σ_b. The config keeps the
    target, which the run's ledger records. :func:`train_joint_dp`, :func:`train_pp_sgd` and the
    PMTL engine all spend the same ε with it.
    """
    if config.clip is None:
        raise InvalidParameterError("config_for_epsilon needs a finite 'clip'; got clip=None.")
    target = check_real("target_epsilon", target_epsilon, low=0.0, closed="neither")
    run = resolve(
        dataclasses.replace(config, epsilon=target, noise_std=0.0), num_clients, sampler=sampler
    )  # the σ the run's release calibrates to its target, asked of the release
    return dataclasses.replace(
        run.config, noise_std=release_noise(run, num_clients, sampler=sampler)
    )


# ---------------------------------------------------------------------------- joint-model DP
def train_joint_dp(
    dataset: FederatedDataset,
    model: nn.Module,
    config: TrainConfig | ResolvedRun | None = None,
    *,
    sampler: Any = None,
    ledger: Any = None,
    **run: Any,
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
    if isinstance(config, ResolvedRun):  # resolved by the run: the Trainer takes it as it is
        settings: TrainConfig | ResolvedRun = config.with_engine(method="joint-dp")
        config = config.config
    else:
        settings = dataclasses.replace(config, method="joint-dp")
    cfg = settings.config if isinstance(settings, ResolvedRun) else settings
    trainer = Trainer(dataset, model, settings, sampler=sampler, ledger=ledger, **run)
    result = trainer.run()
    z = trainer.curator.release_mechanism.noise_multiplier
    block_std = z * float(cfg.clip) if z is not None and cfg.clip is not None else 0.0
    result.config = dataclasses.replace(config, noise_std=trainer.config.noise_std)
    result.extra.update(
        {
            "method": "joint-dp",
            "notion": "DP of the joint model (all m models released)",
            "block_noise_std": block_std,
        }
    )
    return result


# ---------------------------------------------------------------------------- PP-SGD
Observer = Callable[[dict[str, Any]], None]


def train_pp_sgd(
    dataset: FederatedDataset,
    config: TrainConfig | ResolvedRun | None = None,
    *,
    model: MultinomialLogReg | None = None,
    alpha: float = 1.0,
    theta_reg: float | None = None,
    theta_init: Mapping[str, torch.Tensor] | None = None,
    sampler: Any = None,
    ledger: Any = None,
    observer: Observer | None = None,
    **run: Any,
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
    check_inputs(dataset)
    run_ = (
        config
        if isinstance(config, ResolvedRun)
        else resolve(config, dataset.n_clients, sampler=sampler)
    )  # λ: theta_reg's default
    config = run_.config
    alpha = check_real("alpha", alpha, low=0.0)
    mu = check_real("theta_reg", config.lam if theta_reg is None else theta_reg, low=0.0)
    model, initial = _pp_sgd_start(dataset, model, theta_init)
    resolved = run_.with_engine(method="pp-sgd", pp_alpha=alpha, pp_theta_reg=mu)
    seen: dict[str, Any] = {}

    def capture(t: int, sampled: np.ndarray, messages: Params) -> Params:
        seen["messages"] = {n: g.clone() for n, g in messages.items()}
        return messages

    trainer = Trainer(
        dataset,
        model,
        resolved,
        sampler=sampler,
        ledger=ledger,
        initial_state=initial,
        message_hook=capture if observer is not None else None,
        **run,
    )
    for rec in trainer:
        if observer is not None:
            observer(
                {
                    "round": rec.round,
                    "sampled": rec.sampled.copy(),
                    "messages": seen["messages"],
                    "released": {n: p.clone() for n, p in rec.released.items()},
                }
            )
    result = trainer.run()
    result.config = dataclasses.replace(config, noise_std=trainer.config.noise_std)
    result.extra.update({"method": "pp-sgd", "alpha": alpha, "theta_reg": mu})
    return result


def _pp_sgd_start(
    dataset: FederatedDataset,
    model: MultinomialLogReg | None,
    theta_init: Mapping[str, torch.Tensor] | None,
) -> tuple[MultinomialLogReg, dict[str, Any] | None]:
    """PP-SGD's model (a linear one matching the data; default: a fresh one) and its initial
    state (``theta_init``: every client's own model, stacked, its shapes checked)."""
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
    m = dataset.n_clients
    initial = None
    if theta_init is not None:
        for n, p in model.named_parameters():
            if n not in theta_init or tuple(theta_init[n].shape) != (m, *p.shape):
                raise InvalidParameterError(
                    f"The 'theta_init' parameter must hold {n!r} of shape {(m, *p.shape)}."
                )
        initial = {"theta": dict(theta_init)}
    return model, initial
