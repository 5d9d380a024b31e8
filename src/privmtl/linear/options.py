"""The typed parts of an MP-MTL run beside its :class:`~privmtl.linear.spec.MPMTLSpec`, and their
defaults, defined once.

A run of the MP-MTL family is three typed parts, each a frozen dataclass whose field defaults are
the product's:

* :class:`~privmtl.linear.spec.MPMTLSpec`: the method and privacy settings (what the result
  reports);
* :class:`MPMTLExecution`: how the run executes, not what it computes (checkpointing, resuming,
  where the models are saved);
* :class:`MPMTLOptions`: the data a run fits, the estimator's extra parameters and the per-task
  rows it writes.

:data:`MPMTL_PARAMETERS` maps every keyword ``run_mpmtl`` accepts to the part it belongs to;
:func:`split_mpmtl_settings` checks the names (an unknown one is an
:class:`~privmtl.exceptions.InvalidParameterError` listing the valid ones) and splits them.

The MP-MTL estimators (:mod:`privmtl.linear.mpmtl`) take the settings a user rarely changes as
three grouped parameters, each a frozen dataclass of this module: ``execution``
(:class:`MPMTLExecution`), ``privacy`` (:class:`MPMTLPrivacy`: the settings of the guarantee beside
ε and δ) and ``refit`` (:class:`MPMTLRefit`: how the local refit's metric is built). The estimator
checks their fields when it fits, against the constraints each group declares. A run hands them
by their field names (:meth:`~privmtl.linear.methods.LinearMethod.make` gathers them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Real
from pathlib import Path
from typing import Any, ClassVar

from privmtl._validation import Boolean, Interval
from privmtl.data.multitask import MultiTaskDataset
from privmtl.exceptions import InvalidParameterError
from privmtl.linear.eigen_floor import FLOOR_GRID, VOTE_SHARE
from privmtl.linear.spec import SPEC, MPMTLSpec, spec_constraints

__all__ = [
    "MPMTL_PARAMETERS",
    "REFIT_FLOOR",
    "MPMTLExecution",
    "MPMTLOptions",
    "MPMTLPrivacy",
    "MPMTLRefit",
    "split_mpmtl_settings",
]

#: The floor ``tau`` of the local refit's metric ``D`` (so that ``D > 0``), in units of
#: ``K sqrt(m)``.
REFIT_FLOOR = 1e-3


@dataclass(frozen=True)
class MPMTLExecution:
    """How an MP-MTL run or fit executes, not what it computes.

    ``run_mpmtl`` takes ``checkpoint_dir``, ``resume`` and ``save_models`` by name (its checkpoint
    interval is the spec's ``checkpoint_every``); an MP-MTL estimator's ``execution`` parameter
    takes the whole object but ``save_models`` (the run saves the models, not the estimator).

    Parameters
    ----------
    checkpoint_dir : str, path or None, default=None
        Directory of the run's durable privacy ledger (``ledger.jsonl``, every release recorded
        before it is used) and of its atomic checkpoints (:mod:`privmtl.checkpoint`): iteration,
        models, momentum and sparse state, and the noise generator's state in seeded mode.
    resume : bool, default=False
        Continue the run checkpointed in ``checkpoint_dir``; a checkpoint of another
        configuration, data or format version is refused naming what differs. A seeded run resumed
        after a crash ends exactly as the uninterrupted one, its repeated releases not charged
        twice; a secure run charges the repeated releases again (fresh noise).
    save_models : str, path or None, default=None
        Where ``run_mpmtl`` writes the fitted models (:mod:`privmtl.linear.saved`).
    checkpoint_every : int, default=1
        Iterations between checkpoints (the starting point and the end are always saved).
    callback : callable or None, default=None
        ``callback(stage, t)`` at ``"recorded"`` (release ``t`` is in the ledger and not yet
        used), ``"iteration"`` (iteration ``t`` applied) and ``"checkpoint"`` (state of ``t``
        releases saved): lets a caller observe or interrupt the fit between its steps.
    """

    checkpoint_dir: str | Path | None = None
    resume: bool = False
    save_models: str | Path | None = None
    checkpoint_every: int = SPEC.checkpoint_every
    callback: Callable[[str, int], None] | None = None

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        **spec_constraints("checkpoint_every"),
        "resume": Boolean(),
    }
    """The declared constraint of the checked fields (``checkpoint_dir``, ``callback`` and
    ``save_models`` are checked by the estimator's fit)."""


@dataclass(frozen=True)
class MPMTLPrivacy:
    """The privacy settings of an MP-MTL estimator beside ε and δ: the neighbouring relation and
    accountant of the guarantee, the budget stop and Algorithm 5's instance-level budget.

    Parameters
    ----------
    relation : {"add-remove", "replace-one"}, default="add-remove"
        Neighbouring relation of the guarantee (one whole task added/removed or replaced).
    accountant : {"rdp", "pld"} or None, default=None
        Accountant of the covariance releases; None: the spec's
        (:data:`~privmtl.linear.spec.SPEC`'s ``accountant``).
    budget_epsilon : float or None, default=None
        Stop before the covariance release that would take the ledger's ε above this budget; the
        model is then the output rule applied to the state reached (``stopped_on_budget_``).
        Gaussian releases only (the ledger cannot account the Wishart step).
    instance_epsilon : float or None, default=None
        Alg. 5 (appendix B): each task additionally perturbs its clipped model before the
        covariance step, ``w-_i = clip(w~_i + b_i, K)`` with density
        ``p(b_i) ∝ exp(-ε_dp,t ||b_i|| / (2K))`` (ℓ2 sensitivity 2K); ε_dp,t follow the same
        allocation shape and sum to ``instance_epsilon`` (pure ε, basic composition = CB with
        δ = 0). ``instance_privacy_`` reports the IP-MTL guarantee. The perturbed models are
        clipped to K again before the covariance step: the paper's proof of Prop. 4 bounds the
        covariance density ratio at perturbed models, whose norm is not bounded by K, so without
        re-clipping the covariance release would have unbounded sensitivity. Only the shared
        (curator-side) copy is perturbed; each task projects its own clean clipped model (its own
        state is never released unperturbed). None ⇒ off.
    """

    relation: str = SPEC.relation
    accountant: str | None = None
    budget_epsilon: float | None = SPEC.budget_epsilon
    instance_epsilon: float | None = None

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        **spec_constraints("relation", "budget_epsilon"),
        # None: the spec's accountant (SPEC.accountant)
        "accountant": [None, MPMTLSpec._parameter_constraints["accountant"]],
        "instance_epsilon": [None, Interval(Real, 0.0, None, closed="neither")],
    }
    """The declared constraint of every field."""


@dataclass(frozen=True)
class MPMTLRefit:
    """How the low-rank and group-sparse estimators' local refit builds its metric from the last
    release (the refit itself, and its weight, is the estimator's ``refit_lam``).

    Parameters
    ----------
    refit_floor : float, default=1e-3
        ``tau = refit_floor * K * sqrt(m)`` (``K sqrt(m)`` bounds ``sqrt(Lambda)``), so that
        ``D > 0`` (:data:`REFIT_FLOOR`).
    refit_power : "auto" or float > 0, default="auto"
        Low-rank refit only (the group-sparse refit keeps the l2,1 metric, power 1/2): the power
        p of the refit's metric ``D ∝ max(Lambda + c_T, 0)^p`` (:func:`~privmtl.linear.local.
        variational_factor`). 0.5 is the trace norm's variational W-step; 1 makes ``D`` the
        denoised released covariance itself, i.e. the refit is each task's posterior mean under
        the Gaussian prior that covariance describes (empirical-Bayes generalized ridge), which
        leans harder on the top released directions. ``"auto"``: 1 where the last release's
        noise norm ``2 sigma sqrt(d)`` is at most half the estimation-noise edge
        ``e = K^2 (sqrt(m) + sqrt(d))^2 / d`` (non-private runs included), else 0.5
        (:func:`~privmtl.linear.eigen_floor.auto_refit_power`; public quantities only, no budget
        spent). ``refit_power_`` holds the power used.
    eigen_floor : "vote" or float >= 0, default="vote"
        Low-rank refit only: the refit keeps the eigen-directions of the release above
        ``max(2 sigma sqrt(d), eigen_floor * e)`` with ``e = K^2 (sqrt(m) + sqrt(d))^2 / d``, the
        top eigenvalue of m random clipped models (:mod:`privmtl.linear.eigen_floor`). A number
        fixes the floor (0: the privacy cut alone). ``"vote"``: the tasks choose it from
        ``floor_grid`` by a noisy vote recorded in the ledger (each task scores every distinct cut
        of the same release on its own samples; the median of the noisy counts wins), which takes
        ``vote_share`` of the budget from the releases so that ε stays the target; no vote, and
        the floor 0, where the grid's floors are all under the privacy cut or the vote's noise
        would exceed m/4. ``eigen_floor_`` describes the choice.
    floor_grid : sequence of float, default=(0.0, 0.5, 1.0, 2.0)
        The public grid of the vote (multiples of ``e``; strictly increasing).
    vote_share : float in (0, 1), default=0.05
        The vote's share of the budget (of the precision of the Gaussian releases).
    """

    refit_floor: float = REFIT_FLOOR
    refit_power: float | str = SPEC.refit_power
    eigen_floor: float | str = SPEC.eigen_floor
    floor_grid: Sequence[float] = FLOOR_GRID
    vote_share: float = VOTE_SHARE

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "refit_floor": Interval(Real, 0.0, None),
        **spec_constraints("eigen_floor", "refit_power"),
        "vote_share": Interval(Real, 0.0, 1.0, closed="neither"),
    }
    """The declared constraint of the checked fields (``floor_grid`` is checked by
    :func:`~privmtl.linear.eigen_floor.check_grid` when the estimator fits)."""


@dataclass(frozen=True)
class MPMTLOptions:
    """The data of one ``run_mpmtl`` call (a registered data set, or a given ``split``), the
    estimator's ``extra_params`` and the ``per_client`` rows file; documented in
    :func:`~privmtl.experiments.mpmtl.run_mpmtl`. ``data`` has no default: a run names it."""

    data: str | None = None
    data_path: str | Path | None = None
    split: tuple[MultiTaskDataset, MultiTaskDataset] | None = None
    train_fraction: float | None = None
    task_column: str = "task"
    target_column: str = "y"
    normalize: str = "auto"
    feature_columns: list[str] | tuple[str, ...] | None = None
    extra_params: dict[str, Any] | None = None
    per_client: str | Path | None = None


#: The fields of :class:`MPMTLExecution` that ``run_mpmtl`` takes by name (the checkpoint
#: interval is the spec's; a callback is the estimator's alone).
_RUN_EXECUTION = ("checkpoint_dir", "resume", "save_models")

MPMTL_PARAMETERS: dict[str, type] = {
    **{f.name: MPMTLSpec for f in dataclasses.fields(MPMTLSpec)},
    **{name: MPMTLExecution for name in _RUN_EXECUTION},
    **{f.name: MPMTLOptions for f in dataclasses.fields(MPMTLOptions)},
}
"""Every keyword of ``run_mpmtl``, mapped to the part that defines it (and its default)."""

if len(MPMTL_PARAMETERS) != len(dataclasses.fields(MPMTLSpec)) + len(_RUN_EXECUTION) + len(
    dataclasses.fields(MPMTLOptions)
):
    raise AssertionError("the three parts of an MP-MTL run must not share a name")


def split_mpmtl_settings(
    spec: MPMTLSpec | None, settings: dict[str, Any]
) -> tuple[dict[str, Any], MPMTLExecution, MPMTLOptions]:
    """``settings`` (``run_mpmtl``'s keywords) split into the spec's settings (on top of
    ``spec``'s, when given), the :class:`MPMTLExecution` and the :class:`MPMTLOptions`.

    An unknown name is refused naming it and listing the valid ones; so is a run without
    ``data``. The spec's settings are returned by name (``method`` may be a user's method class
    or ``PATH.py:NAME``, which an :class:`MPMTLSpec` cannot hold; ``tune`` may be a bool),
    checked when the run builds its spec."""
    unknown = sorted(set(settings) - set(MPMTL_PARAMETERS))
    if unknown:
        raise InvalidParameterError(
            f"Invalid parameter {unknown[0]!r} for run_mpmtl. Valid parameters are: "
            f"{sorted(MPMTL_PARAMETERS)!r}."
        )
    if spec is not None and not isinstance(spec, MPMTLSpec):
        raise InvalidParameterError(
            f"The 'spec' parameter of run_mpmtl must be an MPMTLSpec or None; got {spec!r}."
        )
    base = {} if spec is None else {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}

    def part(cls: type) -> dict[str, Any]:
        return {k: v for k, v in settings.items() if MPMTL_PARAMETERS[k] is cls}

    options = MPMTLOptions(**part(MPMTLOptions))
    if options.data is None:
        raise InvalidParameterError(
            "The 'data' parameter of run_mpmtl must name a data set of the 'mpmtl' family; "
            "got None."
        )
    return {**base, **part(MPMTLSpec)}, MPMTLExecution(**part(MPMTLExecution)), options
