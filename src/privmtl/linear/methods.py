r"""The linear (MP-MTL) methods as objects: one class per method, and the registry of their names.

Every method of the MP-MTL family is a :class:`LinearMethod`: the estimator that fits it and what
a run needs to know about it — whether it is private, whether it shares nothing between tasks,
its number of iterations when none is given, its tuning grid, whether it has an output rule,
whether its estimator runs the MP-MTL protocol (ledger, checkpoints, budget stop), whether its
privacy proof needs unit-norm rows, which run settings its estimator takes. The run
(:func:`~privmtl.experiments.mpmtl.run_mpmtl`), the sweep, the tuning
(:func:`~privmtl.linear.selection.tune_method`), the spec and the data protocol read these
declarations and never compare method names; this module is the one place that names them.

==============  =====================  ========  ========  ===========  ==================
method          private                isolated  protocol  output rule  default iterations
==============  =====================  ========  ========  ===========  ==================
lowrank         yes                              yes       yes          1
groupsparse     yes                              yes       yes          1
lowrank-sparse  yes                              yes                    50
stl-l2                                 yes
stl-l1                                 yes
mtl-trace
mtl-l21
mtrl
average
dp-mtrl         yes                                                     1
dp-aggr         yes (unit-norm rows)
==============  =====================  ========  ========  ===========  ==================

Your own method: subclass :class:`LinearMethod`, set :attr:`~LinearMethod.name` and
:attr:`~LinearMethod.estimator` (a scikit-learn style estimator class with ``fit(Xs, ys)``,
``predict(Xs)`` and ``coef_`` of shape ``(d, m)``) and the declarations that differ, and pass the
class as ``run_mpmtl(method=...)`` or ``privmtl mpmtl --method FILE.py:NAME``
(``examples/own_linear_method.py``).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from privmtl._validation import check_choice
from privmtl.exceptions import InvalidParameterError
from privmtl.linear.local import RIDGE_GRID

__all__ = [
    "BUILTIN_LINEAR_METHODS",
    "DEFAULT_GRIDS",
    "DEFAULT_ITERATIONS",
    "DEFAULT_SWEEP_METHODS",
    "ESTIMATOR_PROTOCOL_METHODS",
    "ISOLATED_METHODS",
    "METHODS",
    "METHOD_ESTIMATORS",
    "MPMTL_METHODS",
    "PRIVATE_METHODS",
    "RELATIVE_KEYS",
    "RUN_SETTINGS",
    "STL_WEIGHT",
    "UNIT_NORM_METHODS",
    "VOTE_GRIDS",
    "LinearMethod",
    "LinearMethodName",
    "grouped_params",
    "is_method_spec",
    "linear_method",
    "method_names",
    "register_linear_method",
]

#: The run settings a run hands to the estimator of its method, where the method declares them
#: (:attr:`LinearMethod.settings`); a setting left at None keeps the estimator's default.
RUN_SETTINGS: tuple[str, ...] = (
    "epsilon",
    "delta",
    "noise",
    "iterations",
    "relation",
    "accountant",
    "random_state",
    "noise_source",
    "eigen_floor",
    "refit_power",
    "loss",
)

_MPMTL_SETTINGS = (*RUN_SETTINGS[:-3], "loss")
_REFIT_SETTINGS = RUN_SETTINGS


Grid = list[dict[str, list[Any]]]
"""A tuning grid: a list of dicts of lists (scikit-learn ``ParameterGrid`` format)."""


def _decades(lo: int, hi: int, per_decade: int = 1) -> list[float]:
    n = (hi - lo) * per_decade
    return [float(10.0 ** (lo + k / per_decade)) for k in range(n + 1)]


# ----------------------------------------------------------------------- the tuning grids

#: The relative ``init_alpha`` of the MP-MTL templates: the ridge weight the STL-l2 baseline
#: selects (:func:`~privmtl.linear.selection.resolve_grid` replaces it by that number).
STL_WEIGHT = "stl-l2"

# Optimization strategies searched for the MP-MTL estimators (paper §5.2: acceleration on/off,
# strong convexity on/off, allocation alpha or Q). alpha/Q = None means the paper's optimum (§4.5).
_NO_ACC = {"accelerate": False, "mu": 0.0, "allocation": "power", "alpha": 0.0}
_ACC = {"accelerate": True, "mu": 0.0, "allocation": "power", "alpha": 0.4}
_ACC_SC = {"accelerate": True, "mu": 1e-3, "allocation": "geometric", "Q": None}
# (T, strategy) pairs. With T = 1 the output is M clip(W^(0)): no gradient step reaches it, so the
# strategy is irrelevant there and only one is listed.
_SCHEDULES: tuple[tuple[int, dict[str, Any]], ...] = (
    (1, _NO_ACC),
    (3, _NO_ACC),
    (10, _NO_ACC),
    (3, _ACC),
    (5, _ACC),
    (10, _ACC),
    (20, _ACC),
    (10, _ACC_SC),
    (20, _ACC_SC),
)

#: Relative grid keys of the MP-MTL templates, resolved by
#: :func:`~privmtl.linear.selection.resolve_grid`: ``clip = clip_factor * scale`` (scale: median
#: norm of the tasks' own tuned ridge models), ``lam = lam_per_clip * clip``,
#: ``lam_sparse = lam_sparse_per_clip * clip`` and ``init_alpha =`` :data:`STL_WEIGHT` -> the
#: ridge weight selected for the STL-l2 baseline, and ``refit_lam = refit_lam_per_stl * (that
#: weight)``.
RELATIVE_KEYS: tuple[str, ...] = (
    "clip_factor",
    "lam_per_clip",
    "lam_sparse_per_clip",
    "refit_lam_per_stl",
)

#: Grid points of the local variational refit (``refit_lam``): all the budget on ONE release of the
#: STL models' covariance (T = 1), then every task refits on its own data; the denoise fix (drop
#: eigenvalues below the noise edge) or the shift fix (STL limit); ``lam`` is irrelevant (the
#: projected output is replaced) and fixed to 0.
_REFIT_POINT: dict[str, list[Any]] = {
    "clip_factor": [0.5, 1.0, 1.5, 2.5],
    "lam_per_clip": [0.0],
    "refit_lam_per_stl": [1.0, 3.0, 10.0, 30.0],
    "eigen_fix": ["denoise", "shift"],
    "iterations": [1],
    "init": ["stl"],
    "init_alpha": [STL_WEIGHT],
    **{k: [v] for k, v in _NO_ACC.items()},
}


def _mpmtl_template(
    *,
    extra: Mapping[str, Sequence[Any]] | None = None,
    schedules: Sequence[tuple[int, dict[str, Any]]] = _SCHEDULES,
    eigen_fixes: Sequence[str] = ("shift", "clip"),
) -> list[dict[str, list[Any]]]:
    grid: list[dict[str, list[Any]]] = []
    for T, strat in schedules:
        point: dict[str, list[Any]] = {
            "clip_factor": [0.75, 1.0, 1.5, 2.5],
            "lam_per_clip": [1e-4, 1e-3, 1e-2, 1e-1],
            "eigen_fix": list(eigen_fixes),
            "iterations": [T],
            "init": ["stl"],
            "init_alpha": [STL_WEIGHT],
        }
        point.update({k: [v] for k, v in strat.items()})
        if extra:
            point.update({k: list(v) for k, v in extra.items()})
        grid.append(point)
    return grid


# ----------------------------------------------------------------------- the method object


class LinearMethod:
    """A method of the MP-MTL family: its estimator and what a run needs to know about it.

    Subclass it to bring your own method (``examples/own_linear_method.py``): set :attr:`name`,
    :attr:`estimator` and the declarations that differ. Every declaration is a class attribute;
    the class itself is the method object (it is never instantiated).

    Declarations (class attributes)
    -------------------------------
    name : str
        What ``--method`` / ``method=`` calls it (no ``:``).
    estimator : type or str
        The estimator class, or ``"module:Class"`` (imported on use): ``Estimator(**params)``
        with ``fit(Xs, ys)``, ``predict(Xs)`` and ``coef_`` of shape ``(d, m)``.
    private : bool
        Its estimator takes ``epsilon`` / ``delta`` / ``random_state`` and adds noise.
    isolated : bool
        It shares nothing between tasks (ε = 0 towards every other task); its hyper-parameters are
        chosen per task (``tune="covered"``).
    protocol : bool
        Its estimator runs the MP-MTL protocol: a ledger, checkpoints, a budget stop.
    output_rule : bool
        It has the ``final_step`` choice (the paper's projection or the local refit,
        ``refit_lam``).
    relative_grid : bool
        Its :attr:`grid` is a template in relative units, tuned around the tasks' own ridge models
        (:func:`~privmtl.linear.selection.tune_method`).
    unit_norm : bool
        Its privacy proof assumes feature rows of norm at most 1: ``scaling="auto"`` keeps
        unit-norm rows for it on every data set that is scaled.
    default_iterations : int or None
        T when none is given (None: the method has no iterations setting).
    grid : list of dicts
        Its tuning grid (scikit-learn ``ParameterGrid`` format); [] for none.
    vote_grid : list of dicts or None
        Its public candidate grid for a covered selection in a sweep (None: the default grid).
    sweep_default : bool
        It is one of the methods ``privmtl mpmtl-sweep`` runs when none are named.
    settings : tuple of str
        The run settings (:data:`RUN_SETTINGS`) its estimator takes; the others are not handed to
        it (``iterations`` means nothing to a closed-form ridge).
    floor_vote : bool
        Its refit cuts eigenvalues below a floor its tasks can vote on (``eigen_floor``,
        :mod:`privmtl.linear.eigen_floor`; with the ``"denoise"`` or ``"clip"`` fix).
    per_task_params : dict or None
        An isolated method's covered tuning: the parameters with which its estimator chooses every
        task's own weight on the task's own samples (None: every task selects over :attr:`grid`
        on its own folds, :class:`~privmtl.linear.selection.PerTaskSelected`).
    """

    name: ClassVar[str] = ""
    estimator: ClassVar[type | str] = ""
    private: ClassVar[bool] = False
    isolated: ClassVar[bool] = False
    protocol: ClassVar[bool] = False
    output_rule: ClassVar[bool] = False
    relative_grid: ClassVar[bool] = False
    unit_norm: ClassVar[bool] = False
    default_iterations: ClassVar[int | None] = None
    grid: ClassVar[list[dict[str, list[Any]]]] = []
    vote_grid: ClassVar[list[dict[str, list[Any]]] | None] = None
    sweep_default: ClassVar[bool] = False
    settings: ClassVar[tuple[str, ...]] = ("loss",)
    per_task_params: ClassVar[dict[str, Any] | None] = None
    floor_vote: ClassVar[bool] = False

    def __init__(self) -> None:
        raise TypeError(f"{type(self).__name__} is a method declaration: use the class itself.")

    @classmethod
    def estimator_class(cls) -> Any:
        """The estimator class (a ``"module:Class"`` string is imported now)."""
        found = cls.estimator
        if isinstance(found, str):
            module, _, attr = found.partition(":")
            found = getattr(importlib.import_module(module), attr)
        return found

    @classmethod
    def make(cls, **params: Any) -> Any:
        """An unfitted estimator with ``params``: its own parameters, or the fields of a grouped
        parameter by their names (:func:`grouped_params`), as a run's settings come."""
        est = cls.estimator_class()
        return est(**grouped_params(est, params))

    @classmethod
    def parameters(cls) -> tuple[str, ...]:
        """The names :meth:`make` takes: the estimator's parameters (its ``__init__``'s
        keywords) and the fields of its grouped parameters."""
        est = cls.estimator_class()
        names = getattr(est, "_get_param_names", None)
        if callable(names):
            own = tuple(names())
        else:
            sig = inspect.signature(est.__init__)
            own = tuple(
                n for n, p in sig.parameters.items() if n != "self" and p.kind != p.VAR_KEYWORD
            )
        groups = getattr(est, "_param_groups", {})
        return own + tuple(f.name for g in groups.values() for f in dataclasses.fields(g))

    @classmethod
    def estimator_params(
        cls, run: Mapping[str, Any], extra: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """The estimator keywords of a run: the run settings ``run`` this method declares
        (:attr:`settings`; None keeps the estimator's default), then the user's ``extra``
        estimator parameters, each checked to be one of the estimator's (:meth:`parameters`).

        Raises
        ------
        InvalidParameterError
            ``extra`` names a parameter the estimator does not take.
        """
        out = {k: v for k, v in run.items() if k in cls.settings and v is not None}
        if extra:
            known = cls.parameters()
            unknown = sorted(k for k in extra if k not in known)
            if unknown:
                raise InvalidParameterError(
                    f"The 'extra_params' parameter must name parameters of method {cls.name!r}'s "
                    f"estimator {sorted(known)}; got {unknown}."
                )
            out.update(extra)
        return out


def grouped_params(estimator: type, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` for ``estimator`` with the fields of its grouped parameters gathered.

    An estimator may group settings in typed parameters: its class attribute ``_param_groups``
    maps each such parameter to its frozen dataclass (the MP-MTL estimators' ``privacy``,
    ``refit`` and ``execution``). A setting named by a group's field is moved into that group,
    on top of the group given in ``params`` (None: the group's defaults); the others are kept.
    """
    out = dict(params)
    for name, group in getattr(estimator, "_param_groups", {}).items():
        fields = {f.name for f in dataclasses.fields(group)}
        flat = {k: out.pop(k) for k in list(out) if k in fields}
        if flat:
            given = out.get(name)
            out[name] = dataclasses.replace(group() if given is None else given, **flat)
    return out


class LowRank(LinearMethod):
    """MP-MTL low-rank (Algorithm 2): :class:`~privmtl.linear.mpmtl.MPMTLLowRank`."""

    name = "lowrank"
    estimator = "privmtl.linear.mpmtl:MPMTLLowRank"
    private = protocol = output_rule = relative_grid = sweep_default = floor_vote = True
    default_iterations: ClassVar[int] = 1
    # MP-MTL (Alg. 2/3/4) — templates in relative units, resolved by resolve_grid/tune_method:
    # W^(0) = the tasks' own ridge models with the STL-l2-selected weight; K = {0.75, 1, 1.5, 2.5}
    # x their median norm; lam = {1e-4, 1e-3, 1e-2, 1e-1} x K; eigenvalue fix shift | clip;
    # (T, strategy) in _SCHEDULES (no acceleration T = 1, 3, 10; acceleration T = 3, 5, 10, 20;
    # acceleration + mu = 1e-3 with geometric allocation T = 10, 20). 288 points.
    # Plus the local variational refit (_REFIT_POINT: 32 points); `final_step` in tune_method
    # restricts the search to one of the two output rules.
    # (the projection points pin refit_lam=None: the estimators' default is the refit)
    grid: ClassVar[Grid] = [*_mpmtl_template(extra={"refit_lam": [None]}), _REFIT_POINT]
    # The low-rank and group-sparse grids are the estimator's public defaults alone (one
    # release, the local refit, K = 1): see privmtl.experiments.mpmtl_sweep.
    vote_grid: ClassVar[Grid | None] = [{"clip": [1.0]}]
    settings = _REFIT_SETTINGS


class GroupSparse(LowRank):
    """MP-MTL group-sparse (Algorithm 3): :class:`~privmtl.linear.mpmtl.MPMTLGroupSparse`."""

    name = "groupsparse"
    estimator = "privmtl.linear.mpmtl:MPMTLGroupSparse"
    sweep_default = floor_vote = False
    grid: ClassVar[Grid] = [*_mpmtl_template(extra={"refit_lam": [None]}), _REFIT_POINT]
    vote_grid: ClassVar[Grid | None] = [{"clip": [1.0]}]


class LowRankSparse(LinearMethod):
    """MP-MTL low-rank + sparse (Algorithm 4): :class:`~privmtl.linear.mpmtl.MPMTLLowRankSparse`."""

    name = "lowrank-sparse"
    estimator = "privmtl.linear.mpmtl:MPMTLLowRankSparse"
    private = protocol = relative_grid = True
    default_iterations: ClassVar[int] = 50
    # Alg. 4 also searches the l1 weight of the outlier part Q (accelerated schedules and the
    # shift fix only: 160 points).
    grid: ClassVar[Grid] = _mpmtl_template(
        extra={"lam_sparse_per_clip": [1e-4, 1e-2]},
        schedules=[sc for sc in _SCHEDULES if sc[0] == 1 or sc[1] is _ACC],
        eigen_fixes=("shift",),
    )
    vote_grid: ClassVar[Grid | None] = [
        {"clip": [clip], "lam": [0.01 * clip], "iterations": [10]} for clip in (30.0, 100.0, 300.0)
    ]
    settings = _MPMTL_SETTINGS


# Non-private baselines (solver tolerances left at their defaults: never weakened).


class STLL2(LinearMethod):
    """Every task alone, ridge: :class:`~privmtl.linear.stl.STLRidge`."""

    name = STL_WEIGHT
    estimator = "privmtl.linear.stl:STLRidge"
    isolated = sweep_default = True
    grid: ClassVar[Grid] = [
        {"lam": list(RIDGE_GRID)}
    ]  # closed form: cheap, so half-decades 1e-6..10
    per_task_params: ClassVar[dict[str, Any] | None] = {
        "lam": "cv"
    }  # every task: exact leave-one-out on its own samples


class STLL1(LinearMethod):
    """Every task alone, lasso: :class:`~privmtl.linear.regularized.STLLasso`."""

    name = "stl-l1"
    estimator = "privmtl.linear.regularized:STLLasso"
    isolated = True
    grid: ClassVar[Grid] = [{"lam": _decades(-5, -2)}]


class TraceNorm(LinearMethod):
    """Trace-norm MTL: :class:`~privmtl.linear.regularized.TraceNormMTL`."""

    name = "mtl-trace"
    estimator = "privmtl.linear.regularized:TraceNormMTL"
    sweep_default = True
    grid: ClassVar[Grid] = [{"lam": [0.03, 0.1, 0.3, 1.0, 3.0]}]


class L21(LinearMethod):
    """ℓ2,1 (group-sparse) MTL: :class:`~privmtl.linear.regularized.L21MTL`."""

    name = "mtl-l21"
    estimator = "privmtl.linear.regularized:L21MTL"
    grid: ClassVar[Grid] = [{"lam": [0.03, 0.1, 0.3, 1.0, 3.0]}]


class MTRLMethod(LinearMethod):
    """Multi-task relationship learning: :class:`~privmtl.linear.mtrl.MTRL`."""

    name = "mtrl"
    estimator = "privmtl.linear.mtrl:MTRL"
    grid: ClassVar[Grid] = [{"lam1": [1e-5], "lam2": [1e-6, 1e-5, 1e-4]}]


class Average(LinearMethod):
    """Model averaging: :class:`~privmtl.linear.stl.ModelAveraging`."""

    name = "average"
    estimator = "privmtl.linear.stl:ModelAveraging"
    grid: ClassVar[Grid] = [{"lam": _decades(-5, 0)}]


# IP-MTL baselines made MP-MTL by group privacy.


class DPMTRLMethod(LinearMethod):
    """DP-MTRL (squared loss only): :class:`~privmtl.linear.dp_baselines.DPMTRL`."""

    name = "dp-mtrl"
    estimator = "privmtl.linear.dp_baselines:DPMTRL"
    private = True
    default_iterations: ClassVar[int] = 1
    grid: ClassVar[Grid] = [
        {"lam1": _decades(-4, 2), "lam2": [1e-4, 1e-2], "iterations": [1, 2, 5]}
    ]
    settings = ("epsilon", "delta", "iterations", "random_state")


class DPAGGRMethod(LinearMethod):
    """DP-AGGR: :class:`~privmtl.linear.dp_baselines.DPAGGR`."""

    name = "dp-aggr"
    estimator = "privmtl.linear.dp_baselines:DPAGGR"
    private = unit_norm = True
    grid: ClassVar[Grid] = [{"lam": _decades(-4, 2)}]
    settings = ("epsilon", "delta", "random_state", "loss")


BUILTIN_LINEAR_METHODS: dict[str, type[LinearMethod]] = {
    cls.name: cls
    for cls in (
        LowRank,
        GroupSparse,
        LowRankSparse,
        STLL2,
        STLL1,
        TraceNorm,
        L21,
        MTRLMethod,
        Average,
        DPMTRLMethod,
        DPAGGRMethod,
    )
}
"""The registry of privmtl's linear methods, in display order: the one list of their names."""

# users' own methods, by name
_OWN: dict[str, type[LinearMethod]] = {}


def _registered() -> dict[str, type[LinearMethod]]:
    return {**BUILTIN_LINEAR_METHODS, **_OWN}


def is_method_spec(method: Any) -> bool:
    """Whether ``method`` names a user's method in a file or module (``PATH.py:NAME`` /
    ``MODULE:NAME``)."""
    return isinstance(method, str) and ":" in method


def register_linear_method(method: Any) -> type[LinearMethod]:
    """Register a user's method (a :class:`LinearMethod` subclass) under its ``name``.

    A name of privmtl's own methods is refused unless it is that very class. Returns the class.
    """
    if not (isinstance(method, type) and issubclass(method, LinearMethod)):
        raise InvalidParameterError(
            "The 'method' parameter must be a method name or a subclass of "
            f"privmtl.linear.methods.LinearMethod; got {method!r}."
        )
    name = method.name
    if not isinstance(name, str) or not name or ":" in name:
        raise InvalidParameterError(
            f"The 'name' of method class {method.__name__} must be a non-empty string without "
            f"':'; got {name!r}."
        )
    if not method.estimator:
        raise InvalidParameterError(
            f"The 'estimator' of method class {method.__name__} must be an estimator class; "
            f"got {method.estimator!r}."
        )
    if name in BUILTIN_LINEAR_METHODS:
        if BUILTIN_LINEAR_METHODS[name] is method:
            return method
        raise InvalidParameterError(
            f"The 'name' of method class {method.__name__} must not be one of privmtl's methods "
            f"{list(BUILTIN_LINEAR_METHODS)}; got {name!r}."
        )
    unknown = sorted(set(method.settings) - set(RUN_SETTINGS))
    if unknown:
        raise InvalidParameterError(
            f"The 'settings' of method class {method.__name__} must be run settings "
            f"{list(RUN_SETTINGS)}; got {unknown}."
        )
    _OWN[name] = method
    return method


def linear_method(method: str | type[LinearMethod]) -> type[LinearMethod]:
    """The method object of ``method``: a name (privmtl's or a registered own method) or a
    :class:`LinearMethod` subclass (registered now)."""
    if not isinstance(method, str):
        return register_linear_method(method)
    known = _registered()
    check_choice("method", method, known)
    return known[method]


def method_names(**flags: bool) -> tuple[str, ...]:
    """The names of the registered methods whose declarations equal ``flags`` (all: none given),
    e.g. ``method_names(private=True)``."""
    return tuple(
        n for n, c in _registered().items() if all(getattr(c, k) == v for k, v in flags.items())
    )


class LinearMethodName:
    """Constraint of a linear method name (:func:`~privmtl._validation.validate_params`):
    privmtl's methods, the registered own methods, and ``PATH.py:NAME`` / ``MODULE:NAME``."""

    def check(self, name: str, value: Any) -> Any:
        """Return the value or raise InvalidParameterError."""
        if is_method_spec(value):
            return value
        return check_choice(name, value, tuple(_registered()))

    def describe(self) -> str:
        """Human-readable form used when several constraints are allowed."""
        return "a method name"


# Views of the built-in declarations, under the names the rest of the package and users import.
METHODS: tuple[str, ...] = tuple(BUILTIN_LINEAR_METHODS)
"""privmtl's linear method names, in display order."""
PRIVATE_METHODS = tuple(n for n, c in BUILTIN_LINEAR_METHODS.items() if c.private)
"""Methods whose estimator takes ``epsilon`` / ``delta`` / ``random_state``."""
ISOLATED_METHODS = tuple(n for n, c in BUILTIN_LINEAR_METHODS.items() if c.isolated)
"""Methods that share nothing between tasks (epsilon = 0 towards every other task)."""
MPMTL_METHODS = tuple(n for n, c in BUILTIN_LINEAR_METHODS.items() if c.relative_grid)
"""The MP-MTL estimators proper (relative tuning templates)."""
ESTIMATOR_PROTOCOL_METHODS = tuple(n for n, c in BUILTIN_LINEAR_METHODS.items() if c.protocol)
"""Methods whose estimator runs the MP-MTL protocol (ledger, checkpoints, budget)."""
UNIT_NORM_METHODS = tuple(n for n, c in BUILTIN_LINEAR_METHODS.items() if c.unit_norm)
"""Methods whose privacy proof assumes feature rows of norm at most 1."""
DEFAULT_SWEEP_METHODS = tuple(n for n, c in BUILTIN_LINEAR_METHODS.items() if c.sweep_default)
"""The methods ``privmtl mpmtl-sweep`` runs when none are named."""
METHOD_ESTIMATORS: dict[str, tuple[str, str]] = {
    n: tuple(c.estimator.split(":"))  # type: ignore[union-attr,misc]
    for n, c in BUILTIN_LINEAR_METHODS.items()
}
"""Module and class name of the estimator behind every built-in method."""
DEFAULT_GRIDS: dict[str, list[dict[str, list[Any]]]] = {
    n: c.grid for n, c in BUILTIN_LINEAR_METHODS.items()
}
"""The documented default grid of every method (lists of dicts, ParameterGrid format)."""
DEFAULT_ITERATIONS: dict[str, int] = {
    n: c.default_iterations
    for n, c in BUILTIN_LINEAR_METHODS.items()
    if c.default_iterations is not None
}
"""T of every method that iterates over releases when none is given."""
VOTE_GRIDS: dict[str, list[dict[str, list[Any]]]] = {
    n: c.vote_grid for n, c in BUILTIN_LINEAR_METHODS.items() if c.vote_grid is not None
}
"""Public candidate grids of the private MP-MTL estimators for a covered selection."""
