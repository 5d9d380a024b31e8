r"""Distinguishing experiments against the mechanisms users run: the privacy audit.

Every experiment drives the library's own release code and tries to tell two neighbouring inputs
apart from what is released (the auditor sees only the release, plus, in the ``known-seed``
mutation, the public seed):

``wishart``, ``gaussian-covariance``, ``nonprivate-mtl``
    One MP-MTL covariance release :meth:`~privmtl.privacy.covariance.CovarianceSchedule.release`
    (planned by :func:`~privmtl.privacy.covariance.plan_covariance_releases` for the claimed ε, δ,
    one iteration, add/remove one task, RDP). Neighbours: the canary task's model is ``0`` (``D0``)
    or ``K·u`` for a fixed unit ``u`` (``D1``), after the library's task clip
    (:func:`~privmtl.privacy.mechanisms.clip_columns`; the canary sends ``canary_scale·K·u``).
    Scores: ``uᵀΣu`` for the Gaussian and non-private releases; for the Wishart release the
    support test ``−wᵀΣ⁻¹w`` (``D0`` releases with ``wᵀΣ⁻¹w ≥ 1`` are impossible under ``D1``,
    SPEC §4).
``pmtl-gaussian``
    One :meth:`~privmtl.privacy.release.GaussianMeanRelease.release` of q = 10 clients (full
    participation, fixed divisor q, σ calibrated with RDP to the claimed ε, δ under add/remove).
    ``D0``: nine fixed clients; ``D1``: the same plus a canary client sending
    ``canary_scale·γ·u``. Score: ``⟨release, u⟩``.
``pmtl-run``
    One whole PMTL training run through :class:`~privmtl.federated.protocol.Trainer` (full
    participation, ``rounds`` rounds, σ calibrated so the run meets the claimed ε, δ) on a
    synthetic federation of ``n_real`` ordinary clients plus ``trials`` canary clients. Each canary
    is included with probability 1/2; the trainer's ``message_hook`` replaces an included canary's
    message by ``canary_scale·γ`` on its own coordinate of the flattened model and an excluded
    canary's by zero (with the fixed divisor, a zero message releases exactly what an absent
    client does). Canary ``k``'s score is coordinate ``k`` of the sum of released billboard
    increments; the auditor guesses "in" for the top 10 % and "out" for the bottom 10 % and the
    one-run bound of Steinke, Nasr & Jagielski (2023) turns the correct guesses into ε.
``banded-mf``
    A whole run of :data:`_BANDED_ROUNDS` releases with banded matrix-factorization noise
    (:class:`~privmtl.privacy.release.GaussianMeanRelease` with the strategy of
    :func:`~privmtl.privacy.matrix_factorization.run_strategy` and its
    :class:`~privmtl.privacy.release.BandedMeanNoise`), cyclic participation of
    :data:`_BANDED_GROUPS` groups of :data:`_PMTL_Q` clients, σ calibrated by
    :func:`~privmtl.privacy.matrix_factorization.banded_noise_std` to the claimed ε, δ for the
    whole run. ``D0``: fixed clients; ``D1``: the same plus a canary client of group 0 sending
    ``canary_scale·γ·u`` in each of its rounds (clipped by the library's
    :func:`~privmtl.privacy.release.clip_factors`). Every trial runs at once: coordinate ``i`` of
    the released means (:meth:`~privmtl.privacy.release.GaussianMeanRelease.release_sum`) is
    trial ``i``'s, with its own banded noise. Score: the released means ``y`` along ``u``, round
    by round, whitened by the strategy, ``⟨C y, C c⟩`` with ``c`` the canary's rounds (the
    likelihood-ratio direction, since ``C y = C x + z``).

Mutations (``mutation=``) inject a bug into the real objects: ``"weak-noise"`` draws the noise
with a quarter of the planned standard deviation (a wrapper around the noise source; the release
still claims and accounts the planned σ), ``"no-clip"`` disables the clipping function the release
calls (:func:`privmtl.privacy.release.clip_factors` / the task clip of
:mod:`privmtl.privacy.mechanisms`), ``"known-seed"`` uses noise seeded from the public seed, which
the auditor regenerates and removes, and, for ``banded-mf`` only, ``"one-participation"``
calibrates σ as if each client took part in one round (the sensitivity of a single column of the
strategy, without the factor of its ``k`` participations).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock

import numpy as np
import torch

from privmtl._validation import check_choice, check_int, check_real
from privmtl.audit.stats import one_run_epsilon, threshold_audit
from privmtl.data.federated import make_synthetic_federated
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.config import TrainConfig
from privmtl.federated.models import MultinomialLogReg
from privmtl.federated.trainer import Trainer
from privmtl.privacy import mechanisms as _mechanisms
from privmtl.privacy import release as _release
from privmtl.privacy.calibration import calibrate_mean_noise_std
from privmtl.privacy.covariance import plan_covariance_releases
from privmtl.privacy.guarantee import DEFAULT_ACCOUNTANT, DEFAULT_RELATION
from privmtl.privacy.matrix_factorization import (
    CyclicParticipation,
    banded_noise_std,
    run_strategy,
)
from privmtl.privacy.noise import NoiseSource, SecureNoise, SeededNoise
from privmtl.privacy.release import BandedMeanNoise, GaussianMeanRelease
from privmtl.privacy.sampling import CyclicSampler, FullParticipation

__all__ = [
    "AUDIT_MECHANISMS",
    "DEFAULT_TRIALS",
    "MECHANISM_MUTATIONS",
    "MUTATIONS",
    "ScaledNoise",
    "run_audit",
]

AUDIT_MECHANISMS = (
    "wishart",
    "gaussian-covariance",
    "pmtl-gaussian",
    "pmtl-run",
    "nonprivate-mtl",
    "banded-mf",
)
MUTATIONS = ("none", "weak-noise", "no-clip", "known-seed", "one-participation")
#: The mutations that only one mechanism has.
MECHANISM_MUTATIONS = {"one-participation": "banded-mf"}

#: Trials (canaries for ``pmtl-run``) when none are given: each audit runs in under 3 minutes on
#: 2 cores and gives a non-vacuous bound at ε = 1. A perfect distinguisher (no false positives or
#: negatives) proves at most log(n/3.69) with n = trials/4 evaluated per neighbour: 60000 trials
#: let the cheap covariance audits refute claims up to ε ≈ 8.
DEFAULT_TRIALS = {
    "wishart": 60000,
    "gaussian-covariance": 40000,
    "pmtl-gaussian": 40000,
    "pmtl-run": 10000,
    "nonprivate-mtl": 60000,
    "banded-mf": 100000,
}

#: Weak-noise mutation: the noise std actually drawn, relative to the planned one.
WEAK_NOISE_FACTOR = 0.25
#: Fraction of the canaries guessed "in" (top scores) and, separately, "out" (bottom scores).
GUESS_FRACTION = 0.1
#: The audits' guarantee: the product's default relation and accountant (what users run).
RELATION = DEFAULT_RELATION
ACCOUNTANT = DEFAULT_ACCOUNTANT


class ScaledNoise(NoiseSource):
    """A noise source drawing ``factor·std`` whenever ``std`` is asked for (the weak-noise bug)."""

    def __init__(self, inner: NoiseSource, factor: float) -> None:
        self.inner = inner
        self.factor = check_real("factor", factor, low=0.0)
        self.kind = inner.kind

    def normal(
        self, shape: Sequence[int], std: float, *, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        return self.inner.normal(shape, std * self.factor, dtype=dtype)

    def normal_numpy(self, shape: Sequence[int], std: float) -> np.ndarray:
        return self.inner.normal_numpy(shape, std * self.factor)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)


@contextlib.contextmanager
def _no_clip() -> Iterator[None]:
    """Disable the clipping functions the releases call (the no-clip bug)."""

    def ones(norms: torch.Tensor, clip: float | None) -> torch.Tensor:
        return torch.ones_like(norms)

    def identity(A: np.ndarray, bound: float, axis: int) -> np.ndarray:
        return np.asarray(A, dtype=float)

    with (
        mock.patch.object(_release, "clip_factors", ones),
        mock.patch.object(_mechanisms, "_clip", identity),
    ):
        yield


@dataclass
class _Setting:
    mechanism: str
    epsilon: float
    delta: float
    trials: int
    seed: int
    confidence: float
    mutation: str
    noise: str  # "secure" | "seeded" (unmutated and non-seed mutations)
    canary_scale: float

    def noise_source(self, trial: int) -> NoiseSource:
        """Noise of one trial: the kind audited, or the public-seed stream (known-seed)."""
        if self.mutation == "known-seed" or self.noise == "seeded":
            src: NoiseSource = SeededNoise(self.seed, (2, trial))
        else:
            src = SecureNoise()
        if self.mutation == "weak-noise":
            src = ScaledNoise(src, WEAK_NOISE_FACTOR)
        return src

    def replica(self, trial: int) -> NoiseSource | None:
        """The auditor's copy of the noise (known-seed only): same seed, same stream."""
        return SeededNoise(self.seed, (2, trial)) if self.mutation == "known-seed" else None

    @property
    def noise_label(self) -> str:
        if self.mutation == "known-seed":
            return "seeded (public seed, known to the auditor)"
        return self.noise


# ------------------------------------------------------------------------------ covariance
_COV_DIM = 2
_COV_CLIP = 1.0


def _covariance(s: _Setting) -> dict[str, Any]:
    kind = {"wishart": "wishart", "gaussian-covariance": "gaussian", "nonprivate-mtl": "none"}[
        s.mechanism
    ]
    sched = plan_covariance_releases(
        noise=kind,
        epsilon=None if kind == "none" else s.epsilon,
        delta=s.delta,
        iterations=1,
        clip=_COV_CLIP,
        dim=_COV_DIM,
        relation=RELATION,
        accountant=ACCOUNTANT,
    )
    d, K = _COV_DIM, _COV_CLIP
    u = np.zeros(d)
    u[0] = 1.0
    others = np.zeros((d, 0))  # the other tasks: fixed and public (zero, the worst case)

    def cov_of(present: bool) -> np.ndarray:
        W = np.column_stack([others, s.canary_scale * K * u]) if present else others
        Wc = _mechanisms.clip_columns(W, K) if W.shape[1] else W
        return np.asarray(Wc @ Wc.T) if W.shape[1] else np.zeros((d, d))

    w = K * u
    n = s.trials // 2
    scores = {False: np.empty(n), True: np.empty(n)}
    cov0 = cov_of(False)
    for i in range(n):
        for present in (False, True):
            trial = 2 * i + int(present)
            out = sched.release(0, cov_of(present), s.noise_source(trial))
            rep = s.replica(trial)
            if rep is not None:  # rerun the public algorithm on D0 with the known noise
                ref = sched.release(0, cov0, rep)
                score = float(np.linalg.norm(out - ref))
            elif kind == "wishart":
                score = -float(w @ np.linalg.solve(out, w))
            else:
                score = float(u @ out @ u)
            scores[present][i] = score
    res = threshold_audit(scores[False], scores[True], delta=s.delta, confidence=s.confidence)
    score_name = (
        "distance to the D0 release rebuilt with the known noise"
        if s.mutation == "known-seed"
        else ("-w^T Sigma^-1 w (support test)" if kind == "wishart" else "u^T Sigma u")
    )
    return {
        **res,
        "score": score_name,
        "relation": "add-remove one task",
        "canary": (
            f"task model {s.canary_scale:g}*K*u clipped to norm K={K:g} (D1) vs no task (D0), "
            f"dim {d}"
        ),
        "planned_guarantee": sched.guarantee.describe()
        if hasattr(sched.guarantee, "describe")
        else None,
        "analysis": "Clopper-Pearson on FPR/FNR, threshold chosen on a separate half",
    }


# ------------------------------------------------------------------------------ pmtl: one release
_PMTL_Q = 10
_PMTL_DIM = 8
_PMTL_CLIP = 1.0


def _calibrated_std(epsilon: float, delta: float, rounds: int, q: int, clip: float) -> float:
    return calibrate_mean_noise_std(
        FullParticipation(q, q),
        rounds=rounds,
        clip=clip,
        divisor=q,
        target_epsilon=epsilon,
        delta=delta,
        accountant=ACCOUNTANT,
        relation=RELATION,
    )


def _pmtl_gaussian(s: _Setting) -> dict[str, Any]:
    q, d, g = _PMTL_Q, _PMTL_DIM, _PMTL_CLIP
    sigma = _calibrated_std(s.epsilon, s.delta, 1, q, g)
    mech = GaussianMeanRelease(clip=g, noise_std=sigma, sampler=FullParticipation(q, q))
    rng = np.random.default_rng([s.seed, 7])
    others = torch.as_tensor(rng.standard_normal((q - 1, d)) * (g / math.sqrt(d)))
    u = torch.zeros(d, dtype=torch.float64)
    u[0] = 1.0
    canary = (s.canary_scale * g * u).unsqueeze(0)
    inputs = {False: {"w": others}, True: {"w": torch.cat([others, canary])}}
    n = s.trials // 2
    scores = {False: np.empty(n), True: np.empty(n)}
    for i in range(n):
        for present in (False, True):
            trial = 2 * i + int(present)
            value = mech.release(inputs[present], s.noise_source(trial)).value["w"]
            rep = s.replica(trial)
            if rep is not None:  # subtract the regenerated noise
                value = value - rep.normal_like({"w": value}, sigma)["w"]
            scores[present][i] = float(value @ u)
    res = threshold_audit(scores[False], scores[True], delta=s.delta, confidence=s.confidence)
    return {
        **res,
        "score": "<release, u>",
        "relation": "add-remove one client",
        "sampling": f"all ({q} clients, fixed divisor q)",
        "canary": f"client update {s.canary_scale:g}*gamma*u, clipped to gamma={g:g} (D1) vs "
        "no such client (D0)",
        "noise_std": sigma,
        "noise_multiplier": mech.noise_multiplier,
        "analysis": "Clopper-Pearson on FPR/FNR, threshold chosen on a separate half",
    }


# ------------------------------------------------------------------------------ pmtl: whole run
_RUN_ROUNDS = 3
_RUN_REAL = 20
_RUN_CLASSES = 10


def _pmtl_run(s: _Setting, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    M, g, T = s.trials, _PMTL_CLIP, _RUN_ROUNDS
    C = _RUN_CLASSES
    F = max(2, math.ceil((M + 1) / C))  # C·F + C parameters: one coordinate per canary
    m = M + _RUN_REAL
    data = make_synthetic_federated(
        n_clients=m,
        n_features=F,
        n_classes=C,
        samples_per_client=3,
        test_fraction=0.0,
        val_fraction=0.0,
        random_state=s.seed,
    )
    sigma = _calibrated_std(s.epsilon, s.delta, T, m, g)
    config = TrainConfig(
        method="pmtl",
        rounds=T,
        clients_per_round=m,
        sampling="all",
        local_steps=1,
        batch_size=3,
        lr=0.1,
        clip=g,
        noise_std=sigma,
        # the message, λ and start the audit was designed and committed with
        lam=0.1,
        server_update="offset",
        personal_init="model",
        delta=s.delta,
        accountant=ACCOUNTANT,
        relation=RELATION,
        seed=s.seed,
        progress=False,
    )
    rng = np.random.default_rng([s.seed, 11])
    canary_ids = np.sort(rng.choice(m, size=M, replace=False))
    included = rng.random(M) < 0.5
    # canary j's direction u_j is coordinate j of the flattened model: unit vectors, orthogonal to
    # each other, so no canary leaks into another's score
    coords = torch.arange(M)
    values = torch.as_tensor(s.canary_scale * g * included.astype(float))
    seeded = s.mutation == "known-seed" or s.noise == "seeded"

    def hook(round: int, sampled: np.ndarray, messages: dict[str, torch.Tensor]) -> Any:
        pos = torch.as_tensor(np.searchsorted(sampled, canary_ids))
        names = list(messages)
        flat = torch.cat([messages[n].reshape(len(sampled), -1) for n in names], 1)
        flat[pos] = 0.0
        flat[pos, coords] = values.to(flat.dtype)
        out, start = {}, 0
        for n in names:
            size = messages[n][0].numel()
            out[n] = flat[:, start : start + size].reshape(messages[n].shape)
            start += size
        return out

    trainer = Trainer(
        data,
        MultinomialLogReg(F, C),
        config,
        noise_source="seeded" if seeded else "secure",
        message_hook=hook,
    )
    if s.mutation == "weak-noise":
        trainer.curator.noise = ScaledNoise(trainer.curator.noise, WEAK_NOISE_FACTOR)
    replica = SeededNoise(s.seed, (2,)) if s.mutation == "known-seed" else None
    board = {n: p.clone() for n, p in trainer.curator.billboard.items()}
    total = None
    for rec in trainer:
        step = {n: rec.released[n] - board[n] for n in board}
        if replica is not None:  # the auditor regenerates this round's noise and removes it
            noise = replica.normal_like(step, sigma)
            step = {n: step[n] - noise[n] for n in step}
        flat = torch.cat([v.reshape(-1) for v in step.values()]).double()
        total = flat if total is None else total + flat
        board = {n: p.clone() for n, p in rec.released.items()}
        if progress is not None:
            progress(rec.round)
    assert total is not None
    scores = total[:M].numpy()  # <sum of released increments, u_j>
    k = max(1, int(GUESS_FRACTION * M))
    order = np.argsort(scores, kind="stable")
    correct = int(included[order[-k:]].sum() + (~included[order[:k]]).sum())
    eps = one_run_epsilon(M, 2 * k, correct, delta=s.delta, confidence=s.confidence)
    return {
        "epsilon_lower_bound": eps,
        "canaries": M,
        "guesses": 2 * k,
        "correct_guesses": correct,
        "rounds": T,
        "clients": m,
        "accounted_epsilon": trainer.epsilon,
        "score": "<sum of released billboard increments, u_j>",
        "relation": "add-remove one client",
        "sampling": f"all ({m} clients per round, fixed divisor)",
        "canary": f"client sending {s.canary_scale:g}*gamma*u_j every round (u_j: coordinate j of "
        f"the flattened model), gamma={g:g}, included with probability 1/2 (else a zero "
        "message, which releases exactly what an absent client does)",
        "noise_std": sigma,
        "noise_multiplier": trainer.curator.release_mechanism.noise_multiplier,
        "analysis": "one-run bound (Steinke, Nasr & Jagielski 2023), top/bottom "
        f"{GUESS_FRACTION:.0%} guessed in/out",
    }


# ------------------------------------------------------------------------------ banded MF: whole run
_BANDED_ROUNDS = 16
_BANDED_GROUPS = 2


def _banded_mf(s: _Setting) -> dict[str, Any]:
    """Every trial's run at once: coordinate ``i`` of the released means is trial ``i``'s
    (its own noise: the banded noise of a ``(trials,)`` tensor draws independent ``z`` per
    coordinate), each trial's sum of clipped updates formed with the library's clipping."""
    q, d, g, T, b = _PMTL_Q, _PMTL_DIM, _PMTL_CLIP, _BANDED_ROUNDS, _BANDED_GROUPS
    strategy = run_strategy(T, b)
    part = CyclicParticipation(b)
    # the bug: the sensitivity of one participation (a client in one round only)
    accounted = CyclicParticipation(T) if s.mutation == "one-participation" else part
    sigma = banded_noise_std(
        strategy, accounted, target_epsilon=s.epsilon, delta=s.delta, bound=g / q,
        accountant=ACCOUNTANT, relation=RELATION,
    )  # fmt: skip
    mech = GaussianMeanRelease(
        clip=g, noise_std=sigma, sampler=CyclicSampler(q * b, q, groups=b), strategy=strategy
    )
    rng = np.random.default_rng([s.seed, 13])
    others = torch.as_tensor(rng.standard_normal((q - 1, d)) * (g / math.sqrt(d)))
    u = torch.zeros(d, dtype=torch.float64)
    u[0] = 1.0
    rows = torch.cat([others, (s.canary_scale * g * u).unsqueeze(0)])
    clipped = rows * _release.clip_factors(rows.norm(dim=1), g).unsqueeze(1)  # the library's clip
    base, canary = float(clipped[:-1].sum(0) @ u), float(clipped[-1] @ u)
    n = s.trials // 2
    present = np.arange(2 * n) % 2 == 1  # trial 2i: D0, trial 2i + 1: D1
    noise = s.noise_source(0)
    banded = BandedMeanNoise(strategy, sigma, noise)
    rep = s.replica(0)
    copy = None if rep is None else BandedMeanNoise(strategy, sigma, rep)
    y = np.empty((T, 2 * n))
    for t in range(T):
        total = np.full(2 * n, base) + (canary * present if t % b == 0 else 0.0)
        value = mech.release_sum({"w": torch.as_tensor(total)}, noise, round=t, banded=banded)
        out = value.value["w"]
        if copy is not None:  # subtract the regenerated noise
            out = out - copy.draw({"w": out}, t)["w"]
        y[t] = out.numpy()
    C = strategy.matrix()
    pattern = np.array([1.0 if t % b == 0 else 0.0 for t in range(T)])  # the canary's rounds
    scores = (C @ pattern) @ (C @ y)  # <C c, C y> per trial
    res = threshold_audit(scores[~present], scores[present], delta=s.delta, confidence=s.confidence)
    return {
        **res,
        "score": "<C c, C y> (y: the released means along u, round by round; c: the canary's "
        "rounds)",
        "relation": "add-remove one client",
        "sampling": f"cyclic ({b} groups of {q} clients, group t mod {b} in round t; fixed "
        f"divisor q), {T} rounds, {part.participations(T)} participations per client",
        "canary": f"client of group 0 sending {s.canary_scale:g}*gamma*u in each of its rounds, "
        f"clipped to gamma={g:g} (D1) vs no such client (D0)",
        "noise_mechanism": "banded",
        "bands": strategy.bands,
        "noise_std": sigma,
        "run_noise_multiplier": mech.run_params()["run_noise_multiplier"],
        "analysis": "Clopper-Pearson on FPR/FNR, threshold chosen on a separate half",
    }


# ------------------------------------------------------------------------------ entry point
def run_audit(
    mechanism: str,
    *,
    epsilon: float,
    delta: float = 1e-5,
    trials: int | None = None,
    seed: int = 0,
    confidence: float = 0.95,
    mutation: str = "none",
    noise: str = "secure",
    canary_scale: float = 10.0,
) -> dict[str, Any]:
    """Audit ``mechanism`` against its claim (ε, δ); returns the JSON-ready result.

    Parameters
    ----------
    mechanism : {"wishart", "gaussian-covariance", "pmtl-gaussian", "pmtl-run", "nonprivate-mtl", \
            "banded-mf"}
    epsilon, delta : float
        The claim audited: the mechanism is planned for it and the bound is computed at ``delta``.
    trials : int, optional
        Releases (half on each neighbour), or canaries for ``pmtl-run``; default
        :data:`DEFAULT_TRIALS`.
    seed : int
        Seeds the fixed inputs (other clients, canary choice) and, with ``noise="seeded"`` or the
        ``known-seed`` mutation, the noise: it is the *public* seed.
    confidence : float
        Confidence of the lower bound (default 0.95).
    mutation : {"none", "weak-noise", "no-clip", "known-seed", "one-participation"}
        A deliberately broken build (module docstring); ``"one-participation"`` with
        ``"banded-mf"`` only.
    noise : {"secure", "seeded"}
        Noise source of the audited build (secure: what users run; seeded: reproducible tests).
    canary_scale : float
        The canary sends ``canary_scale`` times the clip norm (clipped to exactly the clip norm by
        a correct build; a build that skips clipping leaks the excess).

    Returns
    -------
    dict
        ``mechanism``, ``claimed_epsilon``, ``claimed_delta``, ``epsilon_lower_bound``,
        ``confidence``, ``trials``, ``violation`` (bound > claimed ε), ``seconds`` and what was
        done (relation, sampling, noise source, canary, score, analysis, counts).
    """
    check_choice("mechanism", mechanism, AUDIT_MECHANISMS)
    check_choice("mutation", mutation, MUTATIONS)
    only = MECHANISM_MUTATIONS.get(mutation)
    if only is not None and mechanism != only:
        raise InvalidParameterError(
            f"The 'mutation' parameter {mutation!r} applies to mechanism={only!r} only; got "
            f"mechanism={mechanism!r}."
        )
    check_choice("noise", noise, ("secure", "seeded"))
    eps = check_real("epsilon", epsilon, low=0.0, closed="neither")
    dlt = check_real("delta", delta, low=0.0, high=1.0, closed="neither")
    conf = check_real("confidence", confidence, low=0.0, high=1.0, closed="neither")
    n = DEFAULT_TRIALS[mechanism] if trials is None else check_int("trials", trials, low=4)
    if mechanism == "pmtl-run" and n < 10:
        raise InvalidParameterError(
            f"The 'trials' parameter (canaries) must be >= 10 for pmtl-run; got {n}."
        )
    check_int("seed", seed, low=0)
    scale = check_real("canary_scale", canary_scale, low=1.0)
    s = _Setting(mechanism, eps, dlt, n, seed, conf, mutation, noise, scale)
    t0 = time.perf_counter()
    ctx = _no_clip() if mutation == "no-clip" else contextlib.nullcontext()
    with ctx:
        if mechanism == "pmtl-gaussian":
            res = _pmtl_gaussian(s)
        elif mechanism == "pmtl-run":
            res = _pmtl_run(s)
        elif mechanism == "banded-mf":
            res = _banded_mf(s)
        else:
            res = _covariance(s)
    bound = float(res.pop("epsilon_lower_bound"))
    out: dict[str, Any] = {
        "mechanism": mechanism,
        "claimed_epsilon": eps,
        "claimed_delta": dlt,
        "epsilon_lower_bound": bound,
        "confidence": conf,
        "trials": n,
        "violation": bool(bound > eps),
        "seconds": time.perf_counter() - t0,
        "mutation": mutation,
        "noise_source": s.noise_label,
        "accountant": ACCOUNTANT,
        "seed": seed,
    }
    if mechanism == "nonprivate-mtl":
        out["note"] = (
            "non-private MTL releases the exact covariance; the claimed epsilon is the claim "
            "audited, which it cannot meet"
        )
    out.update(res)
    return out
