"""Privatized task-covariance releases for MP-MTL: the published Wishart step and a correct Gaussian one.

MP-MTL (Liang et al.) releases, at every iteration t, Σ = W̃W̃ᵀ + E where W̃ holds the clipped task
models (‖w̃_i‖ ≤ K). Two noise distributions are offered:

``noise="gaussian"`` (default, correct)
    E is a symmetric Gaussian matrix ("Analyze Gauss"). The ℓ2 sensitivity of the upper-triangular
    part of W̃W̃ᵀ is K² under add/remove one task and √2·K² under replace-one. Every release is a
    Gaussian mechanism composed with dp-accounting (RDP or PLD). Budget allocation follows the paper's
    strategies on the *noise* scale: z_t ∝ 1/w_t (w_t = t^α or Q^{−t}), so budgets are non-decreasing
    as the paper recommends; the common factor is calibrated so the composition meets (ε, δ).
    Post-processing (no privacy cost) makes Σ positive semi-definite: ``eigen_fix="shift"`` adds
    c_t·I with c_t = ``shift_scale``·σ_t·√d (≈ 1.5× the spectral norm of E) and clips negative
    eigenvalues at 0, so under high noise the projection tends to the identity and MP-MTL degrades
    to single-task learning, as the paper's Prop. 1 promises for Wishart noise.

``noise="wishart"`` (published, for reproduction)
    E ~ Wishart_d(d+1, K²/(2ε_t)·I) with ε_t from :func:`~privmtl.privacy.composition.allocate_budgets`.
    The paper claims each release is ε_t-DP. It is not: for neighbours w_i = 0 and ‖w_i'‖ = K the
    release is impossible under the neighbour with probability exactly 1 − e^{−ε_t} (docs/privacy-model.md). The
    schedule therefore reports ``valid=False`` and the real δ: at least 1 − e^{−Σ_t ε_t} over T
    releases (for any ε), alongside the claimed CB ε.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any

import dp_accounting
import numpy as np
import scipy.linalg

from privmtl._validation import check_choice, check_int, check_real
from privmtl.exceptions import InvalidParameterError
from privmtl.privacy.accounting import TIGHT_ACCOUNTANTS, compute_epsilon
from privmtl.privacy.calibration import PrivacyTarget, calibrate_covariance_noise
from privmtl.privacy.composition import allocate_budgets, allocation_weights, composition_bound
from privmtl.privacy.guarantee import (
    DEFAULT_ACCOUNTANT,
    DEFAULT_RELATION,
    RELATIONS,
    PrivacyGuarantee,
)
from privmtl.privacy.mechanisms import symmetric_gaussian_noise, wishart_noise
from privmtl.privacy.noise import NoiseSource, NumpySeededNoise

__all__ = [
    "COVARIANCE_NOISES",
    "EIGEN_FIXES",
    "CovarianceSchedule",
    "cached_covariance_plan",
    "eigen_shift",
    "noise_norm",
    "plan_covariance_releases",
    "reserve_share",
    "signal_to_noise_bound",
    "task_covariance_clip",
    "wishart_real_delta",
]

COVARIANCE_NOISES = ("gaussian", "wishart", "none")
EIGEN_FIXES = ("shift", "denoise", "clip", "none")
MPMTL_NOTION = "MP-MTL (model-protected; JDP over model sequences)"


def wishart_real_delta(epsilons: np.ndarray) -> float:
    """Lower bound on δ of T Wishart releases: P(some release is impossible under the neighbour)."""
    return float(-np.expm1(-np.sum(epsilons)))


def eigen_shift(
    noise: str, std: float, dim: int, fix: str, shift_scale: float = 3.0
) -> float | None:
    """Eigenvalue shift ``c`` of the PSD fix of one Gaussian release, or None (no fix).

    The fix maps every eigenvalue ``Λ`` of the released matrix to ``max(Λ + c, 0)`` (post-processing,
    no privacy cost). With ``edge = std·√dim`` (≈ half the spectral norm of the symmetric noise):
    ``"shift"`` → ``c = shift_scale·edge`` (under high noise the projection tends to the identity:
    single-task learning); ``"denoise"`` → ``c = −2·edge`` (drop the eigenvalues the noise alone
    would produce); ``"clip"`` → ``c = 0``; ``"none"`` (or a non-Gaussian release) → None, the raw
    matrix. This is the one definition of the fix: :meth:`CovarianceSchedule.release` applies it to
    the matrix, the MP-MTL solvers to the eigenvalues of the decomposition they compute anyway.
    """
    check_choice("eigen_fix", fix, EIGEN_FIXES)
    if noise != "gaussian" or fix == "none":
        return None
    if fix == "clip":
        return 0.0
    edge = std * math.sqrt(dim)
    if fix == "denoise":
        return float(-noise_norm(std, dim))
    return float(shift_scale * edge)


def noise_norm(std: float, dim: int) -> float:
    """``2·std·√dim``: about the spectral norm of a ``dim × dim`` symmetric Gaussian noise of
    entry std ``std``, the eigenvalues the noise alone produces (``eigen_fix="denoise"`` cuts
    below it)."""
    return 2.0 * std * math.sqrt(dim)


@dataclass(frozen=True)
class CovarianceSchedule:
    """A planned sequence of T privatized covariance releases and its guarantee.

    Attributes
    ----------
    noise : {"gaussian", "wishart", "none"}
    per_release : tuple of float
        Wishart: the budgets ε_t. Gaussian: the noise std σ_t of each upper-triangular entry.
    clip : float
        Bound K on the norm of each task model.
    guarantee : PrivacyGuarantee
    eigen_fix : {"shift", "clip", "none"}
    shift_scale : float
    target : PrivacyTarget or None
        The target the releases were calibrated to (recorded with release 0); None when not
        private.
    """

    noise: str
    per_release: tuple[float, ...]
    clip: float
    dim: int
    guarantee: PrivacyGuarantee
    eigen_fix: str = "shift"
    shift_scale: float = 3.0
    target: PrivacyTarget | None = None

    @property
    def iterations(self) -> int:
        return len(self.per_release)

    def noise_frobenius_scale(self, t: int) -> float:
        """Expected ‖E‖_F of release t (0 when non-private); for noise-to-signal reports."""
        if self.noise == "none":
            return 0.0
        d = self.dim
        if self.noise == "gaussian":
            return self.per_release[t] * d
        scale = self.clip**2 / (2.0 * self.per_release[t])
        # E‖E‖_F² = scale²·ν·(ν d + d² + d)/… ; report the exact mean of the diagonal-dominated norm.
        nu = d + 1
        return scale * math.sqrt(nu * d * (nu + d + 1))

    # ------------------------------------------------------------------ one release
    @property
    def mechanism(self) -> str:
        """Ledger name of the mechanism: ``gaussian-covariance``, ``wishart`` or ``exact-covariance``."""
        return {"gaussian": "gaussian-covariance", "wishart": "wishart"}.get(
            self.noise, "exact-covariance"
        )

    def _check_index(self, t: int) -> None:
        if not 0 <= t < self.iterations:
            raise IndexError(f"release index {t} outside the planned {self.iterations} releases")

    def event(self, t: int) -> dp_accounting.DpEvent:
        """The privacy event of release ``t`` for a :class:`~privmtl.privacy.ledger.PrivacyLedger`.

        Gaussian: ``GaussianDpEvent(z_t)`` (the noise multiplier relative to the add/remove
        sensitivity, as planned). Wishart and non-private releases: ``NonPrivateDpEvent`` — no RDP
        or PLD bound holds for the published Wishart step (each release is impossible under a
        neighbour with probability ``1 − e^{−ε_t}``), so an accountant composing it must report
        ε = ∞; the claimed per-release ε_t is kept in :meth:`params` and the schedule's
        ``guarantee`` (``valid=False``) states the claimed ε with the real δ.
        """
        self._check_index(t)
        if self.noise == "gaussian":
            z = self.guarantee.details["noise_multipliers"][t]
            return dp_accounting.GaussianDpEvent(float(z))
        return dp_accounting.NonPrivateDpEvent()

    def params(self, t: int) -> dict[str, Any]:
        """JSON parameters of release ``t`` as written to the ledger (release 0 also the target)."""
        self._check_index(t)
        out: dict[str, Any] = {
            "iteration": t,
            "iterations": self.iterations,
            "dim": self.dim,
            "clip": self.clip,
        }
        if self.noise == "gaussian":
            out["noise_std"] = self.per_release[t]
            out["noise_multiplier"] = float(self.guarantee.details["noise_multipliers"][t])
            out["sensitivity"] = float(self.guarantee.details["sensitivity"])
        elif self.noise == "wishart":
            out["claimed_epsilon_t"] = self.per_release[t]
            out["scale"] = self.clip**2 / (2.0 * self.per_release[t])
            out["dof"] = self.dim + 1
            out["note"] = "published Wishart step: not epsilon-DP, no RDP/PLD bound (ledger: inf)"
        if t == 0 and self.target is not None:
            out["target"] = self.target.to_dict()
        return out

    def eigen_shift(self, t: int, fix: str | None = None) -> float | None:
        """Shift of the PSD fix of release ``t`` (:func:`eigen_shift`); ``fix`` defaults to ours."""
        self._check_index(t)
        return eigen_shift(
            self.noise,
            self.per_release[t],
            self.dim,
            self.eigen_fix if fix is None else fix,
            self.shift_scale,
        )

    def noisy(
        self, t: int, cov: np.ndarray, noise: NoiseSource | np.random.Generator
    ) -> np.ndarray:
        """``cov + E_t``: release ``t`` of ``cov`` before any eigenvalue fix.

        ``noise`` is a :class:`~privmtl.privacy.noise.NoiseSource` (``"secure"`` or ``"seeded"``)
        or a numpy Generator (wrapped as seeded noise; the same draws).
        """
        cov = np.asarray(cov, dtype=float)
        if self.noise == "none":
            return cov
        self._check_index(t)
        src = NumpySeededNoise(noise) if isinstance(noise, np.random.Generator) else noise
        if self.noise == "wishart":
            scale = self.clip**2 / (2.0 * self.per_release[t])
            return cov + wishart_noise(cov.shape[0], scale, src)
        return cov + symmetric_gaussian_noise(cov.shape[0], self.per_release[t], src)

    def release(
        self, t: int, cov: np.ndarray, rng: NoiseSource | np.random.Generator
    ) -> np.ndarray:
        """Privatized version of ``cov`` (= W̃W̃ᵀ of the clipped models) for iteration ``t``.

        :meth:`noisy`, then (Gaussian) the schedule's eigenvalue fix (:func:`eigen_shift`) applied
        to the matrix.
        """
        noisy = self.noisy(t, cov, rng)
        if self.noise != "gaussian":
            return noisy
        return self._fix(noisy, self.eigen_shift(t))

    @staticmethod
    def _fix(S: np.ndarray, shift: float | None) -> np.ndarray:
        if shift is None:
            return S
        if shift != 0.0:
            S = S + shift * np.eye(S.shape[0])
        vals, vecs = scipy.linalg.eigh(S, check_finite=False, driver="evd")
        return (vecs * np.maximum(vals, 0.0)) @ vecs.T

    def identity(self) -> dict[str, object]:
        """What identifies this schedule (for checkpoints): mechanism, per-release noise, K, dim."""
        return {
            "noise": self.noise,
            "per_release": list(self.per_release),
            "clip": self.clip,
            "dim": self.dim,
            "eigen_fix": self.eigen_fix,
            "shift_scale": self.shift_scale,
            "epsilon": self.guarantee.epsilon if math.isfinite(self.guarantee.epsilon) else None,
            "delta": self.guarantee.delta,
            "accountant": self.guarantee.accountant,
        }


def plan_covariance_releases(
    *,
    noise: str = "gaussian",
    epsilon: float | None = None,
    delta: float | None = None,
    iterations: int,
    clip: float,
    dim: int,
    relation: str = DEFAULT_RELATION,
    accountant: str = DEFAULT_ACCOUNTANT,
    allocation: str = "power",
    alpha: float = 0.0,
    Q: float | None = None,
    eigen_fix: str = "shift",
    shift_scale: float = 3.0,
    target: PrivacyTarget | None = None,
) -> CovarianceSchedule:
    """Plan T covariance releases meeting (ε, δ) for m tasks with models clipped to ``clip``.

    The privacy is either ``target`` (a :class:`~privmtl.privacy.calibration.PrivacyTarget`: ε,
    δ, accountant and relation, the same type the federated release is calibrated to; the
    schedule keeps it and its release 0 records it) or the keywords ``epsilon``, ``delta``,
    ``accountant`` and ``relation``. ``epsilon=None`` (no target) or ``noise="none"`` plans
    non-private releases (the covariance is used as is). See the module docstring for the two
    mechanisms. ``accountant`` applies to the Gaussian mechanism ("rdp" or "pld"); the Wishart
    mechanism is reported with the paper's composition bound ("kairouz-cb") and its real δ.
    """
    if target is not None:
        if not isinstance(target, PrivacyTarget):
            raise InvalidParameterError(
                f"The 'target' parameter must be a PrivacyTarget or None; got {target!r}."
            )
        if epsilon is not None or delta is not None:
            raise InvalidParameterError(
                "Give the privacy as 'target' or as 'epsilon' and 'delta', not both; got "
                f"target={target!r}, epsilon={epsilon!r}, delta={delta!r}."
            )
        epsilon, delta = target.epsilon, target.delta
        accountant, relation = target.accountant, target.relation
    check_choice("noise", noise, COVARIANCE_NOISES)
    T = check_int("iterations", iterations, low=1)
    K = check_real("clip", clip, low=0.0, closed="neither")
    d = check_int("dim", dim, low=1)
    check_choice("relation", relation, RELATIONS)
    check_choice("eigen_fix", eigen_fix, EIGEN_FIXES)
    dlt = check_real("delta", delta, low=0.0, high=1.0, closed="neither")
    if epsilon is None or noise == "none":
        g = PrivacyGuarantee.non_private(notion=MPMTL_NOTION, relation=relation, sampling="all")
        return CovarianceSchedule("none", (0.0,) * T, K, d, g, eigen_fix, shift_scale)
    eps = check_real("epsilon", epsilon, low=0.0, closed="neither")
    if noise == "wishart":
        budgets = allocate_budgets(eps, dlt, T, strategy=allocation, alpha=alpha, Q=Q)
        real_delta = max(dlt, wishart_real_delta(budgets))
        g = PrivacyGuarantee(
            epsilon=composition_bound(budgets, dlt),
            delta=real_delta,
            relation=relation,
            sampling="all",
            accountant="kairouz-cb",
            notion=MPMTL_NOTION,
            valid=False,
            notes=(
                "published Wishart mechanism: NOT epsilon-DP as claimed; each release is impossible "
                "under a neighbour with probability 1-exp(-eps_t), so delta >= 1-exp(-sum eps_t) "
                f"= {wishart_real_delta(budgets):.4g} for every epsilon",
                f"claimed (paper): ({composition_bound(budgets, dlt):.4g}, {dlt:.3g})-MP-MTL",
            ),
            details={"claimed_delta": dlt, "epsilon_t": budgets.tolist(), "iterations": T},
        )
        return CovarianceSchedule(
            "wishart", tuple(budgets.tolist()), K, d, g, eigen_fix, shift_scale, target
        )
    check_choice("accountant", accountant, TIGHT_ACCOUNTANTS)
    weights = allocation_weights(T, strategy=allocation, alpha=alpha, Q=Q)
    cal = calibrate_covariance_noise(
        1.0 / weights,  # noise multiplier of release t is z0 / w_t
        clip=K,
        target_epsilon=eps,
        delta=dlt,
        accountant=accountant,
        relation=relation,
    )
    sens = cal.sensitivity
    g = PrivacyGuarantee(
        epsilon=cal.epsilon,
        delta=dlt,
        relation=relation,
        sampling="all",
        accountant=accountant,
        notion=MPMTL_NOTION,
        notes=(
            f"Gaussian covariance mechanism, ℓ2 sensitivity {sens:.4g} (K={K:g}), {T} releases",
        ),
        details={
            "noise_multipliers": list(cal.multipliers),
            "iterations": T,
            "sensitivity": sens,
        },
    )
    return CovarianceSchedule("gaussian", cal.stds, K, d, g, eigen_fix, shift_scale, target)


def reserve_share(schedule: CovarianceSchedule, share: float) -> tuple[CovarianceSchedule, float]:
    r"""Give ``share`` of a Gaussian schedule's budget to one more Gaussian release (a vote).

    Gaussian mechanisms compose exactly into one Gaussian mechanism whose precision is the sum of
    theirs: T releases with noise multipliers :math:`z_t` (relative to the add/remove sensitivity)
    and a vote with multiplier :math:`z_v` have the privacy loss of a single Gaussian mechanism
    with :math:`z^{-2} = \sum_t z_t^{-2} + z_v^{-2}`, under every neighbouring relation (the
    accountant scales every sensitivity alike) and every accountant that is exact for Gaussians
    (RDP: the Rényi curves add; PLD: the privacy-loss distributions of Gaussians convolve to a
    Gaussian). With :math:`P = \sum_t z_t^{-2}` of the planned schedule, the releases get
    :math:`z_t / \sqrt{1 - s}` (precision :math:`(1 - s) P`) and the vote
    :math:`z_v = (s P)^{-1/2}`: together they spend exactly the planned (ε, δ).

    Parameters
    ----------
    schedule : CovarianceSchedule
        A Gaussian schedule planned for the whole target (ε, δ).
    share : float in (0, 1)
        ``s``, the vote's share of the precision (the zCDP budget ρ = 1 / (2 z²) splits the same).

    Returns
    -------
    (CovarianceSchedule, float)
        The releases' schedule (its ``guarantee.epsilon`` is the releases' own ε, below the target;
        its details keep the ``planned_epsilon`` and the ``vote_share``) and :math:`z_v`.
    """
    s = check_real("share", share, low=0.0, high=1.0, closed="neither")
    if schedule.noise != "gaussian":
        raise InvalidParameterError(
            f"Only a Gaussian schedule can share its budget with a vote; got noise={schedule.noise!r}."
        )
    g = schedule.guarantee
    z = np.asarray(g.details["noise_multipliers"], dtype=np.float64)
    precision = float(np.sum(z**-2.0))
    scale = 1.0 / math.sqrt(1.0 - s)
    z_new = z * scale
    z_vote = 1.0 / math.sqrt(s * precision)
    events = [dp_accounting.GaussianDpEvent(float(v)) for v in z_new]
    own = compute_epsilon(
        dp_accounting.ComposedDpEvent(events),
        delta=g.delta,
        accountant=g.accountant,
        relation=g.relation,
    )
    details = {
        **g.details,
        "noise_multipliers": z_new.tolist(),
        "planned_epsilon": g.epsilon,
        "vote_share": s,
    }
    guarantee = replace(g, epsilon=own, details=details)
    stds = tuple(float(v) * scale for v in schedule.per_release)
    return replace(schedule, per_release=stds, guarantee=guarantee), z_vote


def signal_to_noise_bound(schedule: CovarianceSchedule, n_tasks: int) -> float:
    r"""The most signal the last release of a Gaussian schedule can carry, over its noise edge.

    ``m`` models clipped to norm K give :math:`\tilde W\tilde W^\top` a largest eigenvalue of
    at most :math:`m K^2` (every model of norm K, all aligned); the release's symmetric Gaussian
    noise of entry std σ has a spectrum within about :math:`2\sigma\sqrt d` (the edge that
    ``eigen_fix="denoise"`` cuts at). Their ratio :math:`m K^2 / (2\sigma\sqrt d)` is a
    function of public quantities only (m, d, K, σ; not of K itself, as σ ∝ K²): below 1, no
    direction of any data can stand out of the noise and the release is noise whatever the
    models (a refit from it falls back to single-task learning; a projection onto it adds noise
    to every model). ``inf`` for a non-private schedule.
    """
    m = check_int("n_tasks", n_tasks, low=1)
    if schedule.noise == "none":
        return math.inf
    if schedule.noise != "gaussian":
        raise InvalidParameterError(
            "The signal-to-noise bound is that of a Gaussian schedule; got "
            f"noise={schedule.noise!r}."
        )
    return m * schedule.clip**2 / noise_norm(schedule.per_release[-1], schedule.dim)


def task_covariance_clip(clip: float, n_tasks: int, relation: str) -> float:
    """The clip K' whose d x d covariance sensitivity equals that of the m x m task covariance
    ``W~^T W~`` of models clipped to ``clip`` (the ``covariance="WtW"`` variant).

    The m x m task covariance changes in a whole row and column when one task changes. The
    Gaussian mechanism perturbs its upper triangle, whose change has squared norm
    sum_{j != i} ((w_i - w_i')^T w_j)^2 + (||w_i||^2 - ||w_i'||^2)^2, i.e. at most m K^4
    (add/remove, the task replaced by a zero column) or (4m - 3) K^4 (replace-one), instead of
    K^4 / 2 K^4 for W W^T. The plan uses the clip K' whose d x d sensitivity (K'^2, resp.
    sqrt(2) K'^2) equals that.
    """
    if relation == "add-remove":
        return clip * float(n_tasks) ** 0.25
    return clip * ((4.0 * n_tasks - 3.0) / 2.0) ** 0.25


@functools.lru_cache(maxsize=512)
def cached_covariance_plan(items: tuple[tuple[str, Any], ...]) -> CovarianceSchedule:
    """:func:`plan_covariance_releases` of the keywords ``items`` (sorted pairs), cached. Plans
    depend only on (ε, δ, T, K, dim, ...), not on data: calibrating the Gaussian noise takes
    ~0.1-0.5 s, so cross-validation would otherwise recalibrate for every fold."""
    return plan_covariance_releases(**dict(items))
