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
   :func:`privmtl.federated.end_of_run.finetune.finetune` with ``method="mr"`` — post-processing.

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
  ``config.delta`` or its default (:func:`~privmtl.federated.config.resolve_config`); that ε is the reported ``epsilon``.
* **closed form** (workshop Thm 2, replace-one): :math:`\sigma = 8B\sqrt{T\log(1/\delta)}/(\varepsilon
  m)` (:func:`~privmtl.privacy.closed_form.workshop_noise_std`); we also report its inverse
  :math:`\varepsilon_{paper} = 8B\sqrt{T\log(1/\delta)}/(\sigma m)`, valid when
  :math:`\varepsilon_{paper} \le 2\log(1/\delta)` (the step :math:`\log(1/\delta)/(\alpha-1) \le
  \varepsilon/2` of the proof). The proof also uses the Gaussian RDP
  :math:`2\alpha\Delta^2/\sigma^2` where the exact value is :math:`\alpha\Delta^2/(2\sigma^2)`, so
  the closed form is valid but loose (about 4× in ε²); the tight ε is smaller at the same σ.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from torch import nn

from privmtl._validation import check_int, check_real
from privmtl.data.federated import FederatedDataset
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import Params
from privmtl.federated.config import TrainConfig, TrainResult, check_inputs, resolve_config
from privmtl.federated.end_of_run.finetune import finetune
from privmtl.federated.projection import project_to_ball
from privmtl.federated.scoring import evaluate
from privmtl.federated.spec import default_lam
from privmtl.federated.trainer import Trainer
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
    **run: Any,
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
        ``batch_size``, ``seed``, ``delta`` (default: :func:`~privmtl.federated.config.resolve_config`'s), ``accountant``, ``relation``,
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
    # λ and δ; the ball's releases cover every client (q = m) and ε is calibrated below
    private = epsilon is not None or bool(noise_std) or config.noise_std > 0
    lam = default_lam(config.method, private=private) if config.lam is None else config.lam
    config = resolve_config(
        dataclasses.replace(config, epsilon=None, clients_per_round=None, sampling="all", lam=lam),
        m,
    )[0]
    delta = float(config.delta or 0.0)
    sigma, eps_closed = _ball_noise(config, epsilon, noise_std, bound, m, T, delta)
    cfg = dataclasses.replace(
        config, method="workshop", ball=bound, noise_std=sigma, epsilon=epsilon
    )
    trainer = Trainer(dataset, model, cfg, ledger=ledger, **run)
    for rec in trainer:  # the models sent are in the ball: their norms are the messages' norms
        rec.record["max_model_norm"] = max(rec.record["update_norms"], default=0.0)
    trained = trainer.run()
    w, glob = trained.personalized_params, trained.global_params
    assert w is not None
    z = trainer.curator.release_mechanism.noise_multiplier
    pre, tuned, accuracies = _finetune_and_score(
        dataset, model, w, glob, config, finetune_epochs, finetune_lr
    )
    history, eps = trained.history, trained.epsilon
    seconds = trained.seconds
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
        ledger=trained.ledger,
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
        noise_source=trained.noise_source,
        stopped_on_budget=trained.stopped_on_budget,
    )


def _ball_noise(
    config: TrainConfig,
    epsilon: float | None,
    noise_std: float | None,
    bound: float,
    m: int,
    T: int,
    delta: float,
) -> tuple[float, float]:
    """The noise of the ball's releases (calibrated to ``epsilon``, or ``noise_std``, or the
    config's) and the closed-form ε it gives over ``T`` rounds (∞ without noise)."""
    if epsilon is not None:
        sigma = workshop_noise_std(epsilon, bound, m, max(T, 1), delta)
    elif noise_std is not None:
        sigma = check_real("noise_std", noise_std, low=0.0)
    else:
        sigma = float(config.noise_std)
    eps_closed = (
        workshop_epsilon_closed_form(sigma, bound, m, T, delta) if sigma > 0 and T > 0 else math.inf
    )
    return sigma, eps_closed


def _finetune_and_score(
    dataset: FederatedDataset,
    model: nn.Module,
    w: Params,
    glob: Params,
    config: TrainConfig,
    finetune_epochs: int,
    finetune_lr: float | None,
) -> tuple[dict[str, Any], Params, dict[str, dict[str, dict[str, float]]]]:
    """The workshop's end of run: every client's trained model scored, then fine-tuned towards
    the released model (``"mr"``) and scored with the released model; ``model`` is left in the
    mode it was in. Returns the scores before fine-tuning, the fine-tuned models and the
    accuracies."""
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    was_training = model.training
    try:
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
        model.train(was_training)
    return pre, tuned, accuracies
