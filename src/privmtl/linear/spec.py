r"""The settings of an MP-MTL run and their product defaults, defined once.

:class:`MPMTLSpec` holds the method and privacy settings of one run of the MP-MTL family (the
linear methods of :mod:`privmtl.linear`): the method, the covariance mechanism, ε and δ, the
iterations, the seed, how hyper-parameters are chosen, the neighbouring relation, the accountant,
the output rule, where the noise comes from, the budget stop and the checkpoint interval. Every
entry point reads its defaults from here: the estimators' ``__init__``
(:class:`~privmtl.linear.mpmtl.MPMTLLowRank` and the other MP-MTL estimators,
:class:`~privmtl.linear.dp_baselines.DPMTRL`), :func:`~privmtl.experiments.mpmtl.run_mpmtl`,
:func:`~privmtl.experiments.mpmtl_sweep.run_mpmtl_sweep`, ``privmtl mpmtl`` and
``privmtl mpmtl-sweep``. Their constraints are declared once, in
:attr:`MPMTLSpec._parameter_constraints`; the estimators check the settings they share with the
spec against the same entries (:func:`spec_constraints`).

Two defaults are not a single value:

* ``delta`` depends on the number of tasks ``m``; :func:`resolve_defaults` is the one function that
  fills it in: None ⇒ min(1e-5, 1/(100 m)) (below 1/m, as DP practice asks), ``"paper"`` ⇒ the
  MP-MTL paper's 1/(m log m), a number ⇒ itself (warned when ≥ 1/m);
* ``iterations`` depends on the method (:func:`default_iterations`, declared by the method,
  :attr:`~privmtl.linear.methods.LinearMethod.default_iterations`):
  one covariance release for the low-rank and group-sparse estimators (their local refit uses it),
  the paper's 50 for the low-rank + sparse one. None keeps it open: the method's default, or the
  searched value when hyper-parameters are tuned on pooled data (``tune="pooled"``).

The data options (data set, path, columns, scaling, training fraction) are not run settings of
the family: :mod:`privmtl.data.registry` declares them and
:func:`~privmtl.data.registry.data_protocol` resolves them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, ClassVar

from privmtl._validation import Interval, Options, validate_params
from privmtl.exceptions import InvalidParameterError
from privmtl.linear.common import PAPER_DELTA, resolve_delta
from privmtl.linear.eigen_floor import FLOOR_VOTE, POWER_AUTO
from privmtl.linear.methods import (
    DEFAULT_ITERATIONS,
    LinearMethodName,
    is_method_spec,
    linear_method,
    method_names,
)
from privmtl.linear.selection import FINAL_STEPS
from privmtl.privacy.accounting import TIGHT_ACCOUNTANTS
from privmtl.privacy.delta import check_delta
from privmtl.privacy.guarantee import DEFAULT_ACCOUNTANT, DEFAULT_RELATION, RELATIONS
from privmtl.privacy.noise import NOISE_SOURCES

__all__ = [
    "DEFAULT_ITERATIONS",
    "NOISES",
    "SPEC",
    "TUNE_MODES",
    "MPMTLSpec",
    "default_iterations",
    "resolve_defaults",
    "spec_constraints",
]

NOISES = ("gaussian", "wishart")
"""Covariance mechanisms: the Analyze-Gauss mechanism (a valid guarantee) or the published
Wishart step (kept for reproduction; reported with its real δ)."""

TUNE_MODES = ("covered", "pooled", "none")
"""How a run chooses hyper-parameters: ``"covered"`` (per task, or public, or — for non-private
methods only — pooled), ``"pooled"`` (k-fold CV over all tasks for every method, not covered for
private ones), ``"none"`` (the estimators' defaults)."""


def default_iterations(method: str) -> int | None:
    """T of ``method`` when none is given (its
    :attr:`~privmtl.linear.methods.LinearMethod.default_iterations`); None for the methods that
    have no iterations setting."""
    return linear_method(method).default_iterations


@dataclass(frozen=True)
class MPMTLSpec:
    """The method and privacy settings of one MP-MTL run, with the product's defaults.

    Built once per run and checked against :attr:`_parameter_constraints` (an
    :class:`~privmtl.exceptions.InvalidParameterError` names the parameter, the constraint and
    the value). ``None`` marks a default that :func:`resolve_defaults` or the method fills in.

    Parameters
    ----------
    method : str, default "lowrank"
        A method of :mod:`privmtl.linear.methods` (the CLI asks for it explicitly).
    noise : {"gaussian", "wishart"}, default "gaussian"
        Covariance mechanism (:data:`NOISES`).
    epsilon : float or None, default None
        Total budget ε; None: non-private. Only the private methods
        (:data:`~privmtl.linear.selection.PRIVATE_METHODS`) take it.
    delta : float, "paper" or None, default None
        δ; None: min(1e-5, 1/(100 m)); ``"paper"``: 1/(m log m) (:func:`resolve_defaults`).
    iterations : int or None, default None
        T, covariance releases / proximal-gradient iterations; None: the method's
        (:func:`default_iterations`), searched with ``tune="pooled"``.
    seed : int, default 0
        Seed of the split, the folds and (with ``noise_source="seeded"``) the noise.
    tune : {"covered", "pooled", "none"}, default "covered"
        How hyper-parameters are chosen (:data:`TUNE_MODES`).
    n_splits : int, default 5
        Folds of the k-fold cross-validation.
    relation : {"add-remove", "replace-one"}, default "add-remove"
        Neighbouring relation of the guarantee (one whole task added/removed or replaced).
    accountant : {"rdp", "pld"}, default "rdp"
        Accountant of the Gaussian releases.
    final_step : {"auto", "projection", "refit"}, default "auto"
        Output rule of the low-rank / group-sparse estimators: the paper's projected models, the
        local variational refit, or ``"auto"`` (the refit, unless a pooled search chooses).
    noise_source : {"secure", "seeded"}, default "secure"
        OS entropy, or a generator seeded from ``seed`` (research simulation only).
    budget_epsilon : float or None, default None
        Stop before the release that would take ε above this budget (MP-MTL estimators).
    checkpoint_every : int, default 1
        Iterations between checkpoints (when the run checkpoints).
    eigen_floor : "vote" or float >= 0, default "vote"
        Floor τ of the low-rank refit's eigenvalue cut, in multiples of the estimation-noise edge
        (:mod:`privmtl.linear.eigen_floor`): ``"vote"`` lets the tasks choose it from a public
        grid by a recorded vote charged to ε (when it can matter and carry signal); a number fixes
        it (0: the privacy cut 2σ√d alone).
    refit_power : "auto" or float > 0, default "auto"
        Power p of the low-rank refit's metric ``D ∝ Λ^p`` (:func:`~privmtl.linear.local.
        variational_factor`): ``"auto"`` takes 1 where the release's noise norm 2σ√d is at most
        half the estimation-noise edge, else 1/2 (:func:`~privmtl.linear.eigen_floor.
        auto_refit_power`; public, nothing spent); a number fixes it (0.5: the trace norm's
        W-step, the behaviour before the rule).
    """

    method: str = "lowrank"
    noise: str = "gaussian"
    epsilon: float | None = None
    delta: float | str | None = None
    iterations: int | None = None
    seed: int = 0
    tune: str = "covered"
    n_splits: int = 5
    relation: str = DEFAULT_RELATION
    accountant: str = DEFAULT_ACCOUNTANT
    final_step: str = "auto"
    noise_source: str = "secure"
    budget_epsilon: float | None = None
    checkpoint_every: int = 1
    eigen_floor: float | str = FLOOR_VOTE
    refit_power: float | str = POWER_AUTO

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "tune": Options(TUNE_MODES),
        "method": LinearMethodName(),
        "noise": Options(NOISES),
        "seed": Interval(Integral, 0, None),
        "final_step": Options(FINAL_STEPS),
        "epsilon": [None, Interval(Real, 0.0, None, closed="neither")],
        "delta": [None, Options((PAPER_DELTA,)), Interval(Real, 0.0, 1.0, closed="neither")],
        "iterations": [None, Interval(Integral, 1, None)],
        "n_splits": Interval(Integral, 2, None),
        "relation": Options(RELATIONS),
        "accountant": Options(TIGHT_ACCOUNTANTS),
        "noise_source": Options(NOISE_SOURCES),
        "budget_epsilon": [None, Interval(Real, 0.0, None, closed="neither")],
        "checkpoint_every": Interval(Integral, 1, None),
        "eigen_floor": [Options((FLOOR_VOTE,)), Interval(Real, 0.0, None)],
        "refit_power": [Options((POWER_AUTO,)), Interval(Real, 0.0, None, closed="neither")],
    }
    """The declared constraint of every setting (a list: any of these; None admits None)."""

    def __post_init__(self) -> None:
        for name, value in validate_params(self).items():
            object.__setattr__(self, name, value)
        private = is_method_spec(self.method) or linear_method(self.method).private
        if self.epsilon is not None and not private:
            raise InvalidParameterError(
                f"The 'epsilon' parameter applies to the private methods "
                f"{method_names(private=True)}; "
                f"method={self.method!r} is a non-private or single-task baseline (omit --epsilon)."
            )

    @property
    def private(self) -> bool:
        """True when the run asks for noise (an ε target)."""
        return self.epsilon is not None

    def replace(self, **changes: Any) -> MPMTLSpec:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The settings by name (JSON-ready)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


SPEC = MPMTLSpec()
"""The product defaults (every setting at its default, before resolution)."""


def spec_constraints(*names: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """The spec's declared constraints of ``names``, for an estimator's own table.

    ``required`` names settings the estimator needs a value for: their ``None`` alternative is
    dropped (e.g. ``iterations``, which the estimator always has).
    """
    table = MPMTLSpec._parameter_constraints
    out: dict[str, Any] = {}
    for name in names:
        constraint = table[name]
        if name in required and isinstance(constraint, list):
            kept = [c for c in constraint if c is not None]
            constraint = kept[0] if len(kept) == 1 else kept
        out[name] = constraint
    return out


def resolve_defaults(spec: MPMTLSpec, data: Any) -> MPMTLSpec:
    """``spec`` with its data-dependent default filled in for ``data`` (a
    :class:`~privmtl.data.multitask.MultiTaskDataset` or the number of tasks ``m``).

    ``delta``: None ⇒ :func:`~privmtl.privacy.delta.user_data_delta` (min(1e-5, 1/(100 m)));
    ``"paper"`` ⇒ :func:`~privmtl.linear.common.paper_delta` (1/(m log m), needs m ≥ 2); a number
    ⇒ itself, checked by :func:`~privmtl.privacy.delta.check_delta` (a warning when ≥ 1/m).
    ``iterations`` stays as given (None: the method's, see :func:`default_iterations`).
    """
    m = int(data if isinstance(data, Integral) else data.n_tasks)
    delta = spec.delta
    if delta is None or isinstance(delta, str):
        resolved = resolve_delta(delta, m)
    else:
        resolved = check_delta(delta, m, unit="task")
    return spec.replace(delta=resolved)
