"""The shared solver of the MP-MTL estimators (:mod:`privmtl.linear.mpmtl`): its parameters,
their checks, the privacy plan, the protocol's loop and the output rule."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator

from privmtl._validation import (
    Boolean,
    InstanceOf,
    Interval,
    Options,
    check_choice,
    check_rng,
    validate_params,
)
from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.linear.common import (
    PreparedTasks,
    _clip_columns,
    _LinearMTLMixin,
    resolve_delta,
    task_steps,
)
from privmtl.linear.eigen_floor import (
    FLOOR_VOTE,
    POWER_AUTO,
    auto_refit_power,
    check_grid,
    plan_floor,
    refit_metric,
)
from privmtl.linear.local import (
    TRACE_POWER,
    local_ridge,
    refit_with_metric,
    select_ridge_per_task,
    variational_factor,
)
from privmtl.linear.losses import LOSSES, public_lipschitz_bound
from privmtl.linear.methods import LowRank
from privmtl.linear.mpmtl_checkpoint import _Checkpointer
from privmtl.linear.mpmtl_protocol import (
    CovarianceCurator,
    MPMTLState,
    TaskStep,
    _strategy,
)
from privmtl.linear.options import MPMTLExecution, MPMTLPrivacy, MPMTLRefit
from privmtl.linear.spec import SPEC, spec_constraints
from privmtl.privacy.calibration import PrivacyTarget
from privmtl.privacy.composition import allocation_weights
from privmtl.privacy.covariance import cached_covariance_plan, eigen_shift, task_covariance_clip
from privmtl.privacy.guarantee import PrivacyGuarantee
from privmtl.privacy.ledger import PrivacyLedger, warn_budget_stop
from privmtl.privacy.noise import NoiseSource, NumpySeededNoise, SecureNoise
from privmtl.privacy.selection import VOTE_MECHANISM

__all__ = ["ALLOCATIONS", "COVARIANCES", "CV", "EIGEN_FIXES", "SEEDED_NOISE_NOTE"]

FloatArray = NDArray[np.float64]

COVARIANCES = ("WWt", "WtW")
ALLOCATIONS = ("power", "geometric")
EIGEN_FIXES = ("shift", "denoise", "clip", "none")
#: ``init_alpha="cv"`` / ``refit_lam="cv"``: every task chooses its own ridge weight by k-fold
#: cross-validation on its own samples (:func:`~privmtl.linear.local.select_ridge_per_task`).
CV = "cv"
SEEDED_NOISE_NOTE = (
    "seeded noise (noise_source='seeded', --reproducible-noise): anyone who knows the seed can "
    "regenerate and subtract it; for research simulation only, it protects nobody"
)


@dataclass(frozen=True)
class _RunSetup:
    """What a fit fixes before its first release (:meth:`_MPMTLBase._setup`)."""

    strategy: Any
    lips: FloatArray
    eta: FloatArray
    delta: float
    schedule: Any
    floor_plan: Any
    inst_eps: FloatArray | None
    beta: Callable[[int], float | FloatArray]
    rng: np.random.Generator
    noise: NoiseSource
    accountant: str


def _fields(group: Any) -> dict[str, Any]:
    """A grouped parameter's fields by name."""
    return {f.name: getattr(group, f.name) for f in dataclasses.fields(group)}


def _refuse_moved(estimator: type, moved: dict[str, Any]) -> None:
    """Refuse keywords ``estimator`` does not take, naming the grouped parameter that holds a
    setting given by its field's name (``relation=...`` is ``privacy=MPMTLPrivacy(relation=...)``)."""
    for key, value in moved.items():
        for name, group in estimator._param_groups.items():  # type: ignore[attr-defined]
            if key in {f.name for f in dataclasses.fields(group)}:
                raise InvalidParameterError(
                    f"The '{key}' parameter of {estimator.__name__} is a field of its '{name}' "
                    f"parameter: pass {name}={group.__name__}({key}={value!r}); got "
                    f"{key}={value!r}."
                )
        raise TypeError(
            f"{estimator.__name__}.__init__() got an unexpected keyword argument {key!r}"
        )


class _MPMTLBase(_LinearMTLMixin, BaseEstimator):
    _penalty = "lowrank"

    _param_groups: ClassVar[dict[str, type]] = {
        "privacy": MPMTLPrivacy,
        "refit": MPMTLRefit,
        "execution": MPMTLExecution,
    }
    """The grouped parameters and their types (:func:`~privmtl.linear.methods.grouped_params`)."""

    def __init__(
        self,
        *,
        lam: float = 1.0,
        epsilon: float | None = SPEC.epsilon,
        delta: float | str | None = SPEC.delta,
        noise: str = SPEC.noise,
        clip: float = 1.0,
        iterations: int = LowRank.default_iterations,
        step_size: float | None = None,
        accelerate: bool = True,
        mu: float = 0.0,
        allocation: str = "power",
        alpha: float | None = None,
        Q: float | None = None,
        covariance: str = "WWt",
        loss: str = "squared",
        eigen_fix: str = "denoise",
        init: Any = "stl",
        init_alpha: float | str = CV,
        refit_lam: float | str | None = CV,
        random_state: Any = None,
        noise_source: str = SPEC.noise_source,
        privacy: MPMTLPrivacy | None = None,
        refit: MPMTLRefit | None = None,
        execution: MPMTLExecution | None = None,
        **moved: Any,
    ) -> None:
        if moved:
            _refuse_moved(type(self), moved)
        self.lam = lam
        self.epsilon = epsilon
        self.delta = delta
        self.noise = noise
        self.clip = clip
        self.iterations = iterations
        self.step_size = step_size
        self.accelerate = accelerate
        self.mu = mu
        self.allocation = allocation
        self.alpha = alpha
        self.Q = Q
        self.covariance = covariance
        self.loss = loss
        self.eigen_fix = eigen_fix
        self.init = init
        self.init_alpha = init_alpha
        self.refit_lam = refit_lam
        self.random_state = random_state
        self.noise_source = noise_source
        self.privacy = privacy
        self.refit = refit
        self.execution = execution

    # ---------------------------------------------------------------------------------- checks
    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "lam": Interval(Real, 0.0, None),
        **spec_constraints("epsilon", "delta", "noise"),
        "clip": Interval(Real, 0.0, None, closed="neither"),
        **spec_constraints("iterations", required=("iterations",)),
        "step_size": [None, Interval(Real, 0.0, None, closed="neither")],
        "accelerate": Boolean(),
        "mu": Interval(Real, 0.0, None),
        "allocation": Options(ALLOCATIONS),
        "alpha": [None, Interval(Real, None, None)],
        "Q": [None, Interval(Real, 0.0, None, closed="neither")],
        "covariance": Options(COVARIANCES),
        "loss": Options(LOSSES),
        "eigen_fix": Options(EIGEN_FIXES),
        "init_alpha": [Options((CV,)), Interval(Real, 0.0, None, closed="neither")],
        "refit_lam": [None, Options((CV,)), Interval(Real, 0.0, None, closed="neither")],
        **spec_constraints("noise_source"),
        **{name: [None, InstanceOf(group)] for name, group in _param_groups.items()},
    }
    """The declared constraint of every checked parameter (the settings an MP-MTL run shares
    with :class:`~privmtl.linear.spec.MPMTLSpec` are the spec's); the fields of the grouped
    parameters are checked against their group's constraints; ``init``, ``random_state``,
    ``checkpoint_dir``, ``callback`` and the combinations are checked in :meth:`_validate`."""

    def _groups(self) -> dict[str, Any]:
        """Every grouped parameter's object (its defaults where the parameter is None, or where
        the estimator does not take it)."""
        out: dict[str, Any] = {}
        for name, group in _MPMTLBase._param_groups.items():
            given = getattr(self, name, None)
            out[name] = group() if given is None else given
        return out

    def _flat_params(self) -> dict[str, Any]:
        """The parameters with every group's fields by their own names (what a checkpoint
        identifies a run by)."""
        params = self.get_params(deep=False)
        for name, group in self._groups().items():
            params.pop(name, None)
            params.update(_fields(group))
        return params

    def _validate(self) -> dict[str, Any]:
        """The checked parameters by name, every group's fields among them (checked against
        the group's constraints)."""
        p: dict[str, Any] = validate_params(self)
        for name, group in self._groups().items():
            p.pop(name, None)
            p.update(_fields(group), **validate_params(group))
        if p["covariance"] == "WtW" and self._penalty == "groupsparse":
            raise InvalidParameterError(
                "The 'covariance' parameter must be 'WWt' for the group-sparse estimator (the l2,1 "
                "prox needs the feature norms, the diagonal of W W^T); got 'WtW'."
            )
        if isinstance(self.init, str):
            p["init"] = check_choice("init", self.init, ("zeros", "stl"))
        else:
            p["init"] = self.init
        if p["resume"] and p["checkpoint_dir"] is None:
            raise InvalidParameterError(
                "The 'resume' parameter needs a checkpoint_dir to resume from; got "
                "checkpoint_dir=None."
            )
        if p["callback"] is not None and not callable(p["callback"]):
            raise InvalidParameterError(
                f"The 'callback' parameter must be callable or None; got {p['callback']!r}."
            )
        if p["save_models"] is not None:
            raise InvalidParameterError(
                "The 'save_models' field of the 'execution' parameter must be None for an "
                "estimator (run_mpmtl saves the models, the estimator does not); got "
                f"{p['save_models']!r}."
            )
        if p["refit_lam"] is not None and p["covariance"] == "WtW":
            raise InvalidParameterError(
                "The 'refit_lam' parameter must be None with covariance='WtW' (the refit needs the "
                f"d x d feature covariance); got {self.refit_lam!r}."
            )
        p["floor_grid"] = check_grid(p["floor_grid"])
        if p["eigen_floor"] != FLOOR_VOTE and p["eigen_floor"] > 0 and not self._floor_applies(p):
            raise InvalidParameterError(
                "The 'eigen_floor' parameter must be 0 or 'vote' without a low-rank refit with "
                "eigen_fix 'denoise' or 'clip' (the floor cuts the refit's eigenvalues); got "
                f"{p['eigen_floor']!r} with refit_lam={self.refit_lam!r}, "
                f"eigen_fix={self.eigen_fix!r}, covariance={self.covariance!r}."
            )
        return p

    def _floor_applies(self, p: dict[str, Any]) -> bool:
        """True when the run's output is a low-rank refit whose cut a floor can raise."""
        return (
            p["refit_lam"] is not None
            and _strategy(self._penalty, p["covariance"]).refit_penalty == "lowrank"
            and p["eigen_fix"] in ("denoise", "clip")
        )

    # ------------------------------------------------------------------------------------ fit
    def fit(
        self, Xs: Sequence[ArrayLike] | PreparedTasks, ys: Sequence[ArrayLike] | None = None
    ) -> Any:
        """Fit on per-task data ``Xs[i]`` (``n_i x d``) and ``ys[i]`` (``n_i``).

        ``Xs`` may also be a :class:`PreparedTasks` built with :meth:`prepare_tasks` (then ``ys``
        is ignored): cross-validation reuses it for every grid point of a split.
        """
        p = self._validate()
        prepared = Xs if isinstance(Xs, PreparedTasks) else self.prepare_tasks(Xs, ys)
        if prepared.loss != p["loss"]:
            raise InvalidParameterError(
                f"The prepared tasks were validated for loss={prepared.loss!r}; the estimator has "
                f"loss={p['loss']!r}."
            )
        self._fit_batch(prepared, p)
        return self

    def prepare_tasks(
        self, Xs: Sequence[ArrayLike], ys: Sequence[ArrayLike] | None
    ) -> PreparedTasks:
        """Validate and pad the tasks once (see :class:`PreparedTasks`)."""
        return PreparedTasks(Xs, ys, loss=check_choice("loss", self.loss, LOSSES))

    def _fit_batch(self, prepared: PreparedTasks, p: dict[str, Any]) -> None:
        self.init_alpha_: FloatArray | None = None
        self.refit_lam_: FloatArray | None = None
        self.eigen_floor_: dict[str, Any] | None = None
        self.refit_power_: float | None = None
        run = self._setup(prepared, p)
        state, ledger = self._run_protocol(prepared, p, run)
        self._output_rule(prepared, p, run, state, ledger)
        d = prepared.batch.n_features
        schedule = run.schedule
        self.state_ = state
        self.noise_to_signal_ = state.noise_to_signal
        self.step_size_ = np.asarray(run.eta, dtype=np.float64)
        self.lipschitz_ = np.asarray(run.lips, dtype=np.float64)
        self.delta_ = float(run.delta)
        self.n_iter_ = state.iteration
        self.stopped_on_budget_ = bool(state.stopped_on_budget)
        self.noise_source_ = "none" if schedule.noise == "none" else run.noise.kind
        if isinstance(ledger, PrivacyLedger):
            ledger.close()  # the run's releases are all on record (its closing line)
        self.ledger_ = ledger
        per = getattr(schedule, "per_release", None)
        self.epsilons_ = None if per is None else np.asarray(per, dtype=np.float64)
        self.privacy_ = self._guarantee(schedule, p, ledger=ledger, state=state)
        self.instance_privacy_ = self._instance_guarantee(p, run.inst_eps)
        self.n_features_in_ = d

    def _setup(self, prepared: PreparedTasks, p: dict[str, Any]) -> _RunSetup:
        """Everything fixed before the first release: the strategy, every task's step, δ, the
        momentum and allocation, the release schedule, the refit floor's plan, Alg. 5's per-release
        budgets and the noise source."""
        rng = check_rng(self.random_state)
        batch = prepared.batch
        m, d = batch.n_tasks, batch.n_features
        T, K, mu = p["iterations"], p["clip"], p["mu"]
        strategy = _strategy(self._penalty, p["covariance"])
        # Every task's step comes from its own data (task_steps), never from the other tasks'.
        lips, eta = task_steps(prepared, mu, decomposed=strategy.decomposed)
        if p["step_size"] is not None:
            eta = np.full(m, float(p["step_size"]))
        delta = resolve_delta(p["delta"], m)

        # momentum and allocation defaults (paper §4.5); the allocation is part of the privacy
        # schedule, so its default uses the public Lipschitz bound, not the tasks' data
        if p["alpha"] is None:
            alpha = 0.4 if p["accelerate"] else 0.0
        else:
            alpha = p["alpha"]
        if p["Q"] is None:
            ratio_pub = min(mu / public_lipschitz_bound(p["loss"], mu), 1.0)
            Q = (1.0 - math.sqrt(ratio_pub)) ** 0.2 if p["accelerate"] else (1.0 - ratio_pub) ** 0.4
            Q = Q if Q > 0 else 1.0
        else:
            Q = p["Q"]
        ratio = np.minimum(mu / lips, 1.0)  # per task: each task's own momentum

        dim = m if p["covariance"] == "WtW" else d
        # the run's privacy, typed once: the covariance releases are calibrated to it
        accountant = SPEC.accountant if p["accountant"] is None else p["accountant"]
        target = (
            None
            if p["epsilon"] is None
            else PrivacyTarget(p["epsilon"], delta, accountant, p["relation"], sampling="all")
        )
        schedule = self._plan(p, target, delta=delta, dim=dim, alpha=alpha, Q=Q, n_tasks=m)
        # the refit's floor: a public plan, and the budget share of its vote (eigen_floor.py)
        floor_plan, schedule = plan_floor(
            p["eigen_floor"],
            grid=p["floor_grid"],
            share=p["vote_share"],
            schedule=schedule,
            eigen_fix=p["eigen_fix"],
            applicable=self._floor_applies(p),
            n_tasks=m,
            dim=d,
            clip=K,
        )
        if p["budget_epsilon"] is not None and schedule.noise != "gaussian":
            raise InvalidParameterError(
                "The 'budget_epsilon' parameter needs releases a ledger can account (epsilon set, "
                f"noise='gaussian'); got noise={p['noise']!r}, epsilon={p['epsilon']!r}."
            )

        inst_eps = None
        if p["instance_epsilon"] is not None:
            w = allocation_weights(T, strategy=p["allocation"], alpha=alpha, Q=Q)
            inst_eps = np.asarray(p["instance_epsilon"] * w / float(w.sum()), dtype=np.float64)

        def beta(t1: int) -> float | FloatArray:  # t1 is the 1-based iteration index
            if not p["accelerate"]:
                return 0.0
            if mu > 0:
                r = np.sqrt(ratio)
                return np.asarray((1.0 - r) / (1.0 + r), dtype=np.float64)
            return (t1 - 1.0) / (t1 + 2.0)

        noise: NoiseSource = (
            NumpySeededNoise(rng) if p["noise_source"] == "seeded" else SecureNoise()
        )
        accountant = SPEC.accountant if p["accountant"] is None else p["accountant"]
        return _RunSetup(
            strategy, lips, eta, delta, schedule, floor_plan, inst_eps, beta, rng, noise, accountant
        )

    def _run_protocol(
        self, prepared: PreparedTasks, p: dict[str, Any], run: _RunSetup
    ) -> tuple[MPMTLState, Any]:
        """The loop, once: messages -> release (write-ahead) -> local update -> checkpoint, from
        the initial models or the checkpoint; returns the state reached and the run's ledger."""
        batch, strategy, noise, T, K = (
            prepared.batch,
            run.strategy,
            run.noise,
            p["iterations"],
            p["clip"],
        )
        m, d = batch.n_tasks, batch.n_features
        ckpt = _Checkpointer.create(
            self,
            p,
            prepared=prepared,
            schedule=run.schedule,
            delta=run.delta,
            accountant=run.accountant,
        )
        state = ckpt.restore(noise)  # checks the checkpoint is this run's; opens the ledger
        self.resumed_from_ = None if state is None else state.iteration
        if state is None:
            W0 = self._initial_models(prepared, p)
            state = MPMTLState(
                iteration=0,
                W=W0,
                W_hat_prev=_clip_columns(W0, K),
                Q=np.zeros((d, m)) if strategy.decomposed else None,
                Q_hat_prev=np.zeros((d, m)) if strategy.decomposed else None,
                noise_to_signal=np.zeros(T),
            )
            ckpt.save(state, noise)  # the starting point, before any release
        ledger = ckpt.ledger
        tasks = TaskStep(
            strategy,
            batch,
            loss=p["loss"],
            clip=K,
            eta=run.eta,
            lam=p["lam"],
            mu=p["mu"],
            lam_sparse=p.get("lam_sparse", 0.0),
            beta=run.beta,
            iterations=T,
            instance_epsilons=run.inst_eps,
            noise=noise,
            rng=run.rng,
        )
        curator = CovarianceCurator(
            run.schedule,
            covariance=p["covariance"],
            clip=K,
            noise=noise,
            ledger=ledger,
            eigen_fix=p["eigen_fix"],
            notify=p["callback"],
        )

        # ---- the loop, once: messages -> release (write-ahead) -> local update -> checkpoint
        while state.iteration < T and not state.stopped_on_budget:
            t = state.iteration
            messages = tasks.messages(state)
            if curator.would_exceed_budget(t):
                state.stopped_on_budget = True
                assert ledger is not None
                warn_budget_stop(
                    t, T, "iterations", ledger.epsilon(), float(p["budget_epsilon"]),
                    "stopped_on_budget_",
                )  # fmt: skip
                break
            release = curator.release(t, messages)
            tasks.update(state, release)
            if p["callback"] is not None:
                p["callback"]("iteration", t)
            ckpt.maybe_save(state, noise)
        ckpt.save(state, noise)
        return state, ledger

    def _output_rule(
        self,
        prepared: PreparedTasks,
        p: dict[str, Any],
        run: _RunSetup,
        state: MPMTLState,
        ledger: Any,
    ) -> None:
        """The output rule on the state reached: Alg. 4's parts, the local refit against the last
        release, or the last projected models (the paper's output); sets ``coef_``."""
        batch, strategy, schedule, noise = prepared.batch, run.strategy, run.schedule, run.noise
        m, d, K = batch.n_tasks, batch.n_features, p["clip"]
        # ---- output rule on the state reached
        if strategy.decomposed:
            assert state.Q_hat_prev is not None
            self.lowrank_ = state.W_hat_prev
            self.sparse_ = state.Q_hat_prev
            self.coef_ = state.W_hat_prev + state.Q_hat_prev
        elif p["refit_lam"] is not None:
            # local refit against the last release (post-processing + own data, see linear.local);
            # before any release the metric is the identity (single-task ridge)
            voted: FloatArray | None = None
            if state.last_release is not None and strategy.refit_penalty == "lowrank":
                self.refit_power_ = self._refit_power(p, schedule, state.iteration - 1, m, d)
            power = TRACE_POWER if self.refit_power_ is None else self.refit_power_
            if state.last_release is None or strategy.refit_penalty is None:
                A = np.eye(d)
            elif strategy.refit_penalty == "lowrank" and self._floor_applies(p):
                # the floor of the cut, fixed or chosen by the tasks' recorded vote
                A, voted, self.eigen_floor_ = refit_metric(
                    run.floor_plan,
                    Sigma=state.last_release,
                    shift=state.last_shift,
                    batch=batch,
                    loss=p["loss"],
                    refit_floor=p["refit_floor"] * K * math.sqrt(m),
                    power=power,
                    cv_seed=self._cv_seed(),
                    noise=noise,
                    ledger=ledger,
                    delta=run.delta,
                    accountant=run.accountant,
                    replay_ok=noise.kind == "seeded",
                )
            else:
                A = variational_factor(
                    state.last_release,
                    penalty=strategy.refit_penalty,
                    shift=state.last_shift,
                    floor=p["refit_floor"] * K * math.sqrt(m),
                    power=power,
                )
            rho = p["refit_lam"]
            if rho == CV and voted is not None:
                rho = voted  # the weights each task chose, by CV given the winning metric
            elif rho == CV:  # every task its own weight, by CV on its own samples given A
                rho = select_ridge_per_task(batch, p["loss"], A=A, seed=self._cv_seed())
            self.refit_lam_ = np.broadcast_to(np.asarray(rho, dtype=np.float64), (m,)).copy()
            self.coef_ = refit_with_metric(batch, p["loss"], rho, A)
        else:
            self.coef_ = state.W_hat_prev

    @staticmethod
    def _refit_power(p: dict[str, Any], schedule: Any, t: int, m: int, d: int) -> float:
        """The low-rank refit's power after release ``t``: the parameter, or for ``"auto"`` the
        rule of :func:`~privmtl.linear.eigen_floor.auto_refit_power` at release t's noise std
        (Wishart releases, which have no Gaussian std: the trace norm's 1/2)."""
        if p["refit_power"] != POWER_AUTO:
            return float(p["refit_power"])
        if schedule.noise == "wishart":
            return TRACE_POWER
        std = 0.0 if schedule.noise == "none" else float(schedule.per_release[t])
        return auto_refit_power(std, clip=p["clip"], n_tasks=m, dim=d)

    def _cv_seed(self) -> int:
        """Seed of the tasks' own folds: ``random_state`` when it is an int, else 0."""
        rs = self.random_state
        return int(rs) if isinstance(rs, int | np.integer) and not isinstance(rs, bool) else 0

    def _initial_models(self, prepared: PreparedTasks, p: dict[str, Any]) -> FloatArray:
        d, m = prepared.batch.n_features, prepared.batch.n_tasks
        if isinstance(p["init"], str) and p["init"] == "zeros":
            return np.zeros((d, m))
        if isinstance(p["init"], str):
            alpha = p["init_alpha"]
            if alpha == CV:  # every task its own ridge weight, by CV on its own samples
                alpha = select_ridge_per_task(prepared.batch, p["loss"], seed=self._cv_seed())
                self.init_alpha_ = np.asarray(alpha, dtype=np.float64)
                return local_ridge(prepared.batch, p["loss"], alpha + p["mu"])
            self.init_alpha_ = np.full(m, float(alpha))
            return prepared.ridge(alpha + p["mu"])
        W0 = np.asarray(p["init"], dtype=np.float64)
        if W0.shape != (d, m):
            raise DataFormatError(
                f"The 'init' array must have shape (d, m) = ({d}, {m}); got {W0.shape}."
            )
        if not np.all(np.isfinite(W0)):
            raise DataFormatError("The 'init' array contains NaN or infinite values.")
        return W0.copy()

    def _plan(
        self,
        p: dict[str, Any],
        target: PrivacyTarget | None,
        *,
        delta: float,
        dim: int,
        alpha: float,
        Q: float,
        n_tasks: int,
    ) -> Any:
        """The covariance releases' schedule, calibrated to ``target`` (None: not private)."""
        privacy: dict[str, Any] = (
            {"target": target}
            if target is not None
            else {"epsilon": None, "delta": delta, "relation": p["relation"]}
        )
        kwargs: dict[str, Any] = {
            "noise": "none" if target is None else p["noise"],
            **privacy,
            "iterations": p["iterations"],
            "clip": p["clip"],
            "dim": dim,
            "allocation": p["allocation"],
            "alpha": alpha,
            "Q": Q if p["allocation"] == "geometric" else None,
            # the eigenvalue fix is applied here, inside the one eigendecomposition per
            # iteration (identical post-processing, see _eigen_shift)
            "eigen_fix": "none",
        }
        if p["covariance"] == "WtW" and target is not None and p["noise"] == "gaussian":
            # the m x m task covariance's sensitivity, as the clip of a d x d one
            kwargs["clip"] = task_covariance_clip(p["clip"], n_tasks, target.relation)
        if target is None:
            kwargs["accountant"] = SPEC.accountant if p["accountant"] is None else p["accountant"]
        return cached_covariance_plan(tuple(sorted(kwargs.items())))

    @staticmethod
    def _eigen_shift(schedule: Any, t: int, fix: str, dim: int) -> float | None:
        """Shift of the PSD fix ``fix`` for release ``t`` (one home: :func:`~privmtl.privacy.
        covariance.eigen_shift`; ``dim`` is the released matrix's dimension)."""
        return eigen_shift(schedule.noise, schedule.per_release[t], dim, fix, schedule.shift_scale)

    def _guarantee(
        self, schedule: Any, p: dict[str, Any], *, ledger: PrivacyLedger, state: MPMTLState
    ) -> Any:
        """The schedule's guarantee, with ε from the ledger (what was actually recorded)."""
        from dataclasses import replace

        g = schedule.guarantee
        notes = list(g.notes)
        details = dict(g.details)
        T = schedule.iterations
        floor = self.eigen_floor_
        if schedule.noise == "gaussian":
            spent = ledger.epsilon()
            votes = sum(r.get("mechanism") == VOTE_MECHANISM for r in ledger.records)
            releases = len(ledger.records) - votes
            details.update(
                planned_epsilon=g.details.get("planned_epsilon", g.epsilon),
                releases=releases,
                iterations_run=state.iteration,
            )
            if floor is not None and floor["mode"] == "vote":
                notes.append(
                    f"the refit's eigenvalue floor was chosen by the tasks' recorded vote "
                    f"(client-vote, noise std {floor['vote_noise_std']:.4g}, its own epsilon "
                    f"{floor['vote_epsilon']:.4g}) among the cuts {floor['candidate_cuts']}; the "
                    f"vote holds {floor['vote_share']:g} of the budget and the epsilon above "
                    "composes it with the covariance releases"
                )
            if state.stopped_on_budget:
                notes.append(
                    f"stopped on budget: {state.iteration} of {T} planned releases made, "
                    f"epsilon spent {spent:.4g} <= budget {p['budget_epsilon']:g}; the model is "
                    "the output rule applied to the state reached"
                )
            if releases > state.iteration:
                notes.append(
                    f"the ledger holds {releases} releases for {state.iteration} "
                    "iterations: a resumed run with secure noise repeats the releases made after "
                    "its checkpoint with fresh noise, and each is charged"
                )
            g = replace(g, epsilon=spent)
        elif schedule.noise == "wishart":
            notes.append(
                "ledger: each Wishart release is recorded as a non-private event (no RDP/PLD bound "
                "holds), so re-accounting the ledger gives epsilon = inf; the epsilon above is the "
                "paper's claim, with the real delta"
            )
        if p["covariance"] == "WtW" and math.isfinite(g.epsilon):
            g = replace(g, valid=False)
            notes.append(
                "covariance='WtW': the projection W^ = W~ M mixes other tasks' unperturbed "
                "clipped models into each task's output, which is not post-processing of the "
                "private release; the stated epsilon is NOT an MP-MTL guarantee."
            )
        if p["instance_epsilon"] is not None:
            notes.append(
                "Alg. 5: models are perturbed (and re-clipped to K) before the covariance step; "
                "the instance-level guarantee is in instance_privacy_."
            )
        noise_source = p["noise_source"] if schedule.noise != "none" else "none"
        if noise_source == "seeded":
            notes.append(SEEDED_NOISE_NOTE)
        return replace(g, notes=tuple(notes), details=details, noise_source=noise_source)

    def _instance_guarantee(self, p: dict[str, Any], inst_eps: FloatArray | None) -> Any:
        if p["instance_epsilon"] is None or inst_eps is None:
            return None

        return PrivacyGuarantee(
            epsilon=float(p["instance_epsilon"]),
            delta=0.0,
            relation="replace-one",
            sampling="all",
            accountant="kairouz-cb",
            notion="IP-MTL",
            notes=(
                "MP-MTL Alg. 5 (appendix B): output perturbation of each clipped model with density "
                "exp(-eps_t ||b|| / (2K)) (l2 sensitivity 2K, which bounds ANY change of a task's "
                "model, so it also protects the whole task); T pure-eps releases composed with "
                "CB({eps_t}, 0) = sum eps_t.",
            ),
            details={"per_release": [float(e) for e in inst_eps]},
            noise_source=p["noise_source"],
        )
