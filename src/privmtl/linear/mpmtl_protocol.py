"""The MP-MTL protocol as explicit state and steps: what every estimator of
:mod:`privmtl.linear.mpmtl` runs, once.

:class:`MPMTLState` is everything a run needs to continue (serializable, checkpointed);
:class:`CovarianceCurator` is the curator's step (clip, covariance, budget check, write-ahead ledger
record, then noise); the strategies are what differs between Algorithms 2, 3, 4 and the
``W~^T W~`` variant (the projection given a release); :class:`TaskStep` is the tasks' side of an
iteration (projection, momentum, local gradient step), batched over tasks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg
from numpy.typing import NDArray

from privmtl.linear.common import (
    _clip_columns,
)
from privmtl.linear.local import (
    _apply_lowrank_left,
    _apply_lowrank_right,
    _group_shrink,
)
from privmtl.linear.losses import TaskBatch
from privmtl.privacy.curator import ReleaseCurator
from privmtl.privacy.ledger import PrivacyLedger
from privmtl.privacy.mechanisms import l2_laplace_noise
from privmtl.privacy.noise import NoiseSource

__all__ = [
    "CALLBACK_STAGES",
    "CovarianceCurator",
    "CovarianceRelease",
    "MPMTLState",
    "TaskStep",
]

FloatArray = NDArray[np.float64]

CALLBACK_STAGES = ("recorded", "iteration", "checkpoint")


@dataclass
class MPMTLState:
    """Everything an MP-MTL run needs to continue after ``iteration`` releases (serializable).

    Attributes
    ----------
    iteration : int
        Number of covariance releases made (the index of the next one).
    W : ndarray of shape (d, m)
        The tasks' models after their last local gradient step (``W^(0)`` initially).
    W_hat_prev : ndarray of shape (d, m)
        The tasks' last projected models (momentum term, and the output ``W^(t)``); ``clip(W^(0))``
        before the first release.
    Q, Q_hat_prev : ndarray of shape (d, m) or None
        Sparse part and its last soft-thresholded value (low-rank + sparse estimator only).
    noise_to_signal : ndarray of shape (T,)
        ``||E||_F / ||S~||_F`` of the releases made so far (0 after them).
    last_release : ndarray or None
        The last released matrix (raw, before the eigenvalue fix), for the local refit.
    last_shift : float or None
        Its eigenvalue shift (see :func:`privmtl.privacy.covariance.eigen_shift`).
    stopped_on_budget : bool
        True when the next release would have exceeded ``budget_epsilon``.
    """

    iteration: int
    W: FloatArray
    W_hat_prev: FloatArray
    Q: FloatArray | None
    Q_hat_prev: FloatArray | None
    noise_to_signal: FloatArray
    last_release: FloatArray | None = None
    last_shift: float | None = None
    stopped_on_budget: bool = False

    _ARRAYS = ("W", "W_hat_prev", "Q", "Q_hat_prev", "noise_to_signal", "last_release")

    def to_dict(self) -> dict[str, Any]:
        """Tensors and JSON scalars (for :func:`privmtl.checkpoint.save_checkpoint`)."""
        import torch

        out: dict[str, Any] = {
            "iteration": int(self.iteration),
            "last_shift": self.last_shift,
            "stopped_on_budget": bool(self.stopped_on_budget),
        }
        for name in self._ARRAYS:
            value = getattr(self, name)
            out[name] = None if value is None else torch.from_numpy(np.array(value, copy=True))
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MPMTLState:
        """Inverse of :meth:`to_dict` (float64 bits preserved)."""

        def arr(name: str) -> FloatArray | None:
            value = data[name]
            if value is None:
                return None
            return np.asarray(value.numpy(), dtype=np.float64).copy()

        W, W_hat_prev, nsr = arr("W"), arr("W_hat_prev"), arr("noise_to_signal")
        assert W is not None and W_hat_prev is not None and nsr is not None
        shift = data["last_shift"]
        return cls(
            iteration=int(data["iteration"]),
            W=W,
            W_hat_prev=W_hat_prev,
            Q=arr("Q"),
            Q_hat_prev=arr("Q_hat_prev"),
            noise_to_signal=nsr,
            last_release=arr("last_release"),
            last_shift=None if shift is None else float(shift),
            stopped_on_budget=bool(data["stopped_on_budget"]),
        )


@dataclass(frozen=True)
class CovarianceRelease:
    """One release of the curator: ``Sigma`` (raw, symmetrized) and its eigenvalue shift.

    ``shared`` are the clipped models the curator saw; only the ``covariance="WtW"`` projection
    uses them (which is why that variant has no MP-MTL guarantee).
    """

    iteration: int
    Sigma: FloatArray
    shift: float | None
    shared: FloatArray
    noise_to_signal: float


class CovarianceCurator(ReleaseCurator):
    """The MP-MTL curator: clip → ``W~W~^T`` → budget check → ledger record → noisy release.

    The ledger entry (mechanism ``schedule.mechanism``, the schedule's event and parameters of
    release ``t``, ``release_id="covariance:t"``) is recorded — on disk, when the ledger is durable —
    *before* the noise is drawn and the release leaves (write-ahead), through the gate of
    :class:`~privmtl.privacy.curator.ReleaseCurator`: a seeded run resumed from a checkpoint
    repeats bit-identical releases, whose ids are in the ledger already, so they are not charged
    again; a secure run's repeat is a new release (fresh noise) and is charged.

    Parameters
    ----------
    schedule : CovarianceSchedule
    covariance : {"WWt", "WtW"}
    clip : float
        K: the curator clips every model to norm K before forming the covariance (the schedule
        of the ``"WtW"`` variant is planned with a larger equivalent clip, see ``_plan``).
    noise : NoiseSource
    ledger : PrivacyLedger
    eigen_fix : str
        The fix whose shift accompanies every release (:meth:`CovarianceSchedule.eigen_shift`).
    notify : callable or None
        ``notify("recorded", t)`` once the entry is written and before the release is used.
    """

    def __init__(
        self,
        schedule: Any,
        *,
        covariance: str,
        clip: float,
        noise: NoiseSource,
        ledger: PrivacyLedger,
        eigen_fix: str,
        notify: Callable[[str, int], None] | None = None,
    ) -> None:
        super().__init__(ledger=ledger, noise=noise)
        self.schedule = schedule
        self.covariance = covariance
        self.clip = clip
        self.eigen_fix = eigen_fix
        self.notify = notify

    release_kind = "covariance"

    def release_id(self, t: int) -> str:
        """The ledger id of release ``t``."""
        return self.release_id_at(t)

    def would_exceed_budget(self, t: int) -> bool:
        """True when release ``t`` is new and would take the ledger above its budget."""
        return self.would_exceed(self.schedule.event(t), self.release_id(t))

    def release(self, t: int, messages: FloatArray) -> CovarianceRelease:
        """Release ``t`` of the covariance of the tasks' ``messages`` (their models, d x m)."""
        shared = _clip_columns(messages, self.clip)
        cov = shared.T @ shared if self.covariance == "WtW" else shared @ shared.T
        self.record(
            self.schedule.event(t),
            release_id=self.release_id(t),
            round=t,
            mechanism=self.schedule.mechanism,
            params=self.schedule.params(t),
        )
        if self.notify is not None:
            self.notify("recorded", t)
        Sigma = np.asarray(self.schedule.noisy(t, cov, self.noise), dtype=np.float64)
        Sigma = 0.5 * (Sigma + Sigma.T)
        cov_norm = float(np.linalg.norm(cov))
        err = float(np.linalg.norm(Sigma - cov))  # ||E||_F of the raw release
        nsr = err / cov_norm if cov_norm > 0 else (0.0 if err == 0 else math.inf)
        shift = (
            None if self.schedule.noise == "none" else self.schedule.eigen_shift(t, self.eigen_fix)
        )
        return CovarianceRelease(t, Sigma, shift, shared, nsr)


class _Strategy:
    """What differs between the MP-MTL algorithms: the projection given a release (and Alg. 4's
    sparse part). ``project(release, own, thr)`` maps the task's own clipped models to ``W^``."""

    name = "base"
    decomposed = False
    refit_penalty: str | None = None

    def project(self, release: CovarianceRelease, own: FloatArray, thr: FloatArray) -> FloatArray:
        raise NotImplementedError


class _LowRank(_Strategy):
    """Alg. 2: ``W^ = U diag(max(0, 1 - thr/sqrt(Λ))) U^T W~`` from the released ``W~W~^T``."""

    name = "lowrank"
    refit_penalty = "lowrank"

    def project(self, release: CovarianceRelease, own: FloatArray, thr: FloatArray) -> FloatArray:
        return _apply_lowrank_left(release.Sigma, thr, own, release.shift)


class _LowRankTaskCovariance(_Strategy):
    """Alg. 1 alternative (``covariance="WtW"``): ``W^ = W~ V diag(...) V^T`` from ``W~^T W~``."""

    name = "lowrank-WtW"

    def project(self, release: CovarianceRelease, own: FloatArray, thr: FloatArray) -> FloatArray:
        return _apply_lowrank_right(release.Sigma, thr, release.shared, own, release.shift)


class _GroupSparse(_Strategy):
    """Alg. 3: ``W^ = diag(max(0, 1 - thr/sqrt(S_jj))) W~`` (after the eigenvalue fix)."""

    name = "groupsparse"
    refit_penalty = "groupsparse"

    def project(self, release: CovarianceRelease, own: FloatArray, thr: FloatArray) -> FloatArray:
        Sigma, shift = release.Sigma, release.shift
        if shift is None:
            diag = np.abs(np.diag(Sigma))
        else:
            vals, U = scipy.linalg.eigh(Sigma, check_finite=False, driver="evd")
            diag = (U * U) @ np.maximum(vals + shift, 0.0)
        shrink = _group_shrink(diag, thr)
        return (shrink if shrink.ndim == 2 else shrink[:, None]) * own


class _LowRankSparse(_Strategy):
    """Alg. 4: the low-rank part projected as in Alg. 2 (or its WtW variant), plus a local
    entry-wise soft-thresholded sparse part."""

    name = "lowrank-sparse"
    decomposed = True

    def __init__(self, lowrank: _Strategy) -> None:
        self.lowrank = lowrank

    def project(self, release: CovarianceRelease, own: FloatArray, thr: FloatArray) -> FloatArray:
        return self.lowrank.project(release, own, thr)


def _strategy(penalty: str, covariance: str) -> _Strategy:
    lowrank: _Strategy = _LowRankTaskCovariance() if covariance == "WtW" else _LowRank()
    if penalty == "groupsparse":
        return _GroupSparse()
    if penalty == "lowrank-sparse":
        return _LowRankSparse(lowrank)
    return lowrank


class TaskStep:
    """The tasks' side of an iteration, batched over tasks (each column only reads its own data).

    :meth:`messages` is what every task hands to the curator (its model; under Alg. 5 its clipped
    model plus l2-Laplace noise); :meth:`update` is the local step given the release: projection
    (through the strategy), momentum, the sparse part of Alg. 4, and a gradient step on the task's
    own loss (skipped after the last release: the output is the projection ``W^(T)``).
    """

    def __init__(
        self,
        strategy: _Strategy,
        batch: TaskBatch,
        *,
        loss: str,
        clip: float,
        eta: FloatArray,
        lam: float,
        mu: float,
        lam_sparse: float,
        beta: Callable[[int], float | FloatArray],
        iterations: int,
        instance_epsilons: FloatArray | None,
        noise: NoiseSource,
        rng: np.random.Generator,
    ) -> None:
        self.strategy = strategy
        self.batch = batch
        self.loss: Any = loss
        self.clip = clip
        self.eta = eta
        self.lam = lam
        self.mu = mu
        self.lam_sparse = lam_sparse
        self.beta = beta
        self.iterations = iterations
        self.instance_epsilons = instance_epsilons
        self.noise = noise
        self.rng = rng

    def messages(self, state: MPMTLState) -> FloatArray:
        """The models sent to the curator for release ``state.iteration``."""
        if self.instance_epsilons is None:
            return state.W
        Wc = _clip_columns(state.W, self.clip)
        d, m = Wc.shape
        scale = 2.0 * self.clip / self.instance_epsilons[state.iteration]
        return Wc + l2_laplace_noise(self.noise, self.rng, d, scale, m)

    def update(self, state: MPMTLState, release: CovarianceRelease) -> None:
        """Apply release ``t = state.iteration`` to every task, in place, and advance ``t``."""
        t = state.iteration
        eta = self.eta
        if self.instance_epsilons is None:
            # the curator clipped exactly the task's own model: the same array, not recomputed
            Wc = release.shared
        else:
            Wc = _clip_columns(state.W, self.clip)
        W_hat = self.strategy.project(release, Wc, eta * self.lam)
        bt = self.beta(t + 1)
        momentum = bool(np.any(bt))
        Z = W_hat + bt * (W_hat - state.W_hat_prev) if momentum else W_hat
        Q_hat = None
        if self.strategy.decomposed:
            assert state.Q is not None
            Q_hat = np.sign(state.Q) * np.maximum(np.abs(state.Q) - eta * self.lam_sparse, 0.0)
        if t < self.iterations - 1:  # the last gradient step would not reach the output W^(T)
            if self.strategy.decomposed:
                assert Q_hat is not None and state.Q_hat_prev is not None
                Zq = Q_hat + bt * (Q_hat - state.Q_hat_prev) if momentum else Q_hat
                G = self.batch.gradients(self.loss, Z + Zq, mu=self.mu)
                state.W = Z - eta * G
                state.Q = Zq - eta * G
            else:
                G = self.batch.gradients(self.loss, Z, mu=self.mu)
                state.W = Z - eta * G
        state.W_hat_prev = W_hat
        if Q_hat is not None:
            state.Q_hat_prev = Q_hat
        state.noise_to_signal[t] = release.noise_to_signal
        state.last_release = release.Sigma
        state.last_shift = release.shift
        state.iteration = t + 1
