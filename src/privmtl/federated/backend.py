"""What every backend of a federated run shares: set-up, ledger, round records and the result.

The in-process :class:`~privmtl.federated.trainer.Trainer` and Flower's ServerApp
(:mod:`privmtl.flower`) both call :func:`setup_run` and :func:`make_curator` (the release, the
billboard, the curator), :func:`new_ledger`, :func:`budget_stops`, :func:`round_record`,
:func:`fingerprint_base` and :func:`run_result`; they differ only in how the clients' data and
states are held and how the messages travel.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privmtl.federated.algorithms import (
    Params,
)
from privmtl.federated.config import ResolvedRun, TrainConfig, TrainResult, resolve
from privmtl.federated.curator import Curator
from privmtl.federated.methods import Method, get_method
from privmtl.federated.server_optim import ServerOptimizer
from privmtl.federated.spec import resolve_personal_init
from privmtl.privacy.ledger import PrivacyLedger
from privmtl.privacy.matrix_factorization import run_strategy
from privmtl.privacy.noise import NoiseSource
from privmtl.privacy.release import (
    AdaptiveClip,
    GaussianMeanRelease,
    Release,
    banded_groups,
)
from privmtl.privacy.sampling import ClientSampler, make_sampler

__all__ = [
    "RoundRecord",
    "RunSetup",
    "budget_stops",
    "fingerprint_base",
    "make_curator",
    "make_release",
    "new_ledger",
    "release_noise",
    "round_record",
    "run_result",
    "setup_run",
]

#: Config fields that change how a run executes but not its result (left out of the fingerprint
#: that a checkpoint must match).
_EXECUTION_ONLY = (
    "progress",
    "threads",
    "parallel_chunks",
    "client_chunk",
    "eval_every",
    "device",
)


@dataclass
class RoundRecord:
    """What one round did; ``released`` is the billboard after the round (public)."""

    round: int
    sampled: np.ndarray
    released: Params
    epsilon: float
    record: dict[str, Any] = field(default_factory=dict)


def run_result(
    config: TrainConfig,
    history: list[dict[str, Any]],
    accuracies: dict[str, dict[str, dict[str, float]]],
    *,
    personalized: Params | None,
    global_params: Params,
    primary: str,
    epsilon: float,
    delta: float,
    ledger: PrivacyLedger | None,
    noise_source: str,
    stopped_on_budget: bool,
    client_ids: list[str],
    extra: dict[str, Any] | None = None,
) -> TrainResult:
    """The :class:`TrainResult` of a run, as every transport assembles it (the training time is
    the sum of the rounds' ``seconds``)."""
    seconds = sum(r["seconds"] for r in history)
    return TrainResult(
        config=config,
        client_ids=client_ids,
        personalized_params=personalized,
        global_params=global_params,
        history=history,
        accuracies=accuracies,
        primary=primary,
        epsilon=epsilon,
        delta=delta,
        ledger=ledger,
        seconds=seconds,
        seconds_per_round=seconds / max(len(history), 1),
        noise_source=noise_source,
        stopped_on_budget=stopped_on_budget,
        extra={} if extra is None else extra,
    )


@dataclass
class RunSetup:
    """What every transport builds from a configuration before its first round (:func:`setup_run`).

    ``config`` has ``personal_init="auto"`` resolved; ``release`` is the mechanism of every round
    (clip, noise, sampler, divisor, subspace, adaptive clipping's count); ``billboard`` the initial
    billboard (the shared parameters, or ``m`` stacked blocks); ``shared`` the parameters that go
    through it; ``personal_init`` the initial values of the others; ``init`` the initial model
    (projected to the ball for the workshop variant).
    """

    config: TrainConfig
    spec: Method
    m: int
    q: int
    release: GaussianMeanRelease
    init: Params
    shared: list[str]
    personal_init: Params
    billboard: Params


def setup_run(
    config: TrainConfig | ResolvedRun,
    m: int,
    init: Params,
    *,
    sampler: ClientSampler | None = None,
    method: Method | type[Method] | str | None = None,
) -> RunSetup:
    """The release, the billboard and the resolved configuration of a run on ``m`` clients.

    Written once for the in-process :class:`Trainer` and the Flower ServerApp: the resolved
    config (``config`` a :class:`~privmtl.federated.config.ResolvedRun`, used as it is, or a
    configuration resolved here by :func:`~privmtl.federated.config.resolve`: ``q``, λ, δ and the
    target), the :class:`~privmtl.privacy.release.GaussianMeanRelease` of the method calibrated
    to the run's target by itself (:meth:`~privmtl.privacy.release.GaussianMeanRelease.
    for_target`, the returned ``config`` then reports its σ), the warning of Algorithm 1's message with partial
    participation, the split into shared and personal parameters and ``personal_init="auto"``'s resolution
    (:func:`~privmtl.federated.spec.resolve_personal_init`), all through the method object's
    server half (``method``: default ``config.method``).
    """
    if isinstance(config, ResolvedRun):  # resolved once, by the caller
        run = config
        chosen = run.config.method if method is None else method
    else:
        chosen = config.method if method is None else method
        run = resolve(config, m, sampler=sampler, method=chosen)
    config, spec, mech = make_release(run, m, sampler=sampler, method=chosen)
    q = int(config.clients_per_round or m)
    spec.setup_warnings(q, m)
    init = spec.prepare_init(init)
    shared = spec.shared_names(init)
    shared_init = {n: init[n] for n in shared}
    board = spec.initial_billboard(init, shared, m)
    if config.personal_init == "auto":
        dim = config.subspace_dim or sum(p.numel() for p in shared_init.values())
        resolved = resolve_personal_init("auto", mech.noise_std, mech.clip, dim)
        config = dataclasses.replace(config, personal_init=resolved)
        spec = spec.with_config(config)
    personal = {n: p for n, p in init.items() if n not in shared}
    return RunSetup(config, spec, m, q, mech, init, shared, personal, board)


def make_curator(
    setup: RunSetup, *, noise: NoiseSource, ledger: PrivacyLedger | None, name: str = ""
) -> Curator:
    """The :class:`Curator` of a run (its server optimizer and adaptive clip from the config)."""
    config = setup.config
    optimizer = None
    if config.server_optimizer != "none":
        optimizer = ServerOptimizer(
            config.server_optimizer,
            lr=config.server_lr,
            momentum=config.server_momentum,
            beta2=config.server_beta2,
            eps=config.server_adam_eps,
        )
    return Curator(
        setup.release,
        setup.billboard,
        noise=noise,
        ledger=ledger,
        update=setup.spec.billboard_update,
        seed=config.seed,
        name=name,
        optimizer=optimizer,
        adaptive_clip=None
        if config.adaptive_clip_quantile is None
        else AdaptiveClip(config.adaptive_clip_quantile, config.adaptive_clip_lr),
    )


def make_release(
    run: ResolvedRun,
    m: int,
    *,
    sampler: ClientSampler | None = None,
    method: Method | type[Method] | str | None = None,
) -> tuple[TrainConfig, Method, GaussianMeanRelease]:
    """The release of a resolved run on ``m`` clients, built once for :func:`setup_run` and
    :func:`release_noise`: the method's :class:`~privmtl.privacy.release.GaussianMeanRelease`,
    calibrated to the run's target by itself
    (:meth:`~privmtl.privacy.release.GaussianMeanRelease.for_target`) or with the σ given, and
    the configuration and method bound to the σ it adds."""
    config = run.config
    sampler = run.sampler if sampler is None else sampler
    q = int(config.clients_per_round or m)
    spec = get_method(config.method if method is None else method, config)
    full = config.sampling == "all" or spec.full_participation
    sampler = (
        sampler
        if sampler is not None
        else make_sampler(
            "all" if full else config.sampling, m, q, groups=None if full else config.groups
        )
    )
    strategy = None
    if config.noise_mechanism == "banded" and spec.communicates:
        strategy = run_strategy(config.rounds, banded_groups(sampler))
    release: dict[str, Any] = {
        "sampler": sampler,
        "subspace_dim": config.subspace_dim,
        "subspace_seed": config.seed,
        "count_noise_std": config.count_noise_std_for(q) if spec.communicates else None,
        "strategy": strategy,
    }
    if run.target is not None and spec.communicates:
        # the release calibrates itself to the run's target (the mean of messages clipped to γ
        # over q); the configuration then reports the σ it adds
        assert config.clip is not None  # a target needs a clip: refused by the resolution
        mech = GaussianMeanRelease.for_target(
            run.target, rounds=config.rounds, clip=config.clip, divisor=q, reserve=run.reserve,
            **release,
        )  # fmt: skip
        config = dataclasses.replace(config, noise_std=mech.noise_std)
        clip, sigma, divisor = spec.release_settings(config.clip, mech.noise_std, q)
        mech = dataclasses.replace(mech, clip=clip, noise_std=sigma, divisor=divisor)
        spec = spec.with_config(config)
    else:
        clip, sigma, divisor = spec.release_settings(config.clip, config.noise_std, q)
        mech = GaussianMeanRelease(clip=clip, noise_std=sigma, divisor=divisor, **release)
    return config, spec, mech


def release_noise(run: ResolvedRun, m: int, *, sampler: ClientSampler | None = None) -> float:
    """σ of the mean release of ``run`` on ``m`` clients, for a caller that needs it before the
    run (a plan, a calibrated configuration): the σ given, or the one the release calibrates to
    the run's target (:func:`setup_run`'s release, asked with the same target object)."""
    if run.target is None:
        return float(run.config.noise_std)
    return float(make_release(run, m, sampler=sampler)[0].noise_std)


def new_ledger(
    config: TrainConfig,
    delta: float,
    budget: float | None,
    path: Path | None = None,
    *,
    seen: dict[str, Any] | None = None,
    seen_by: str = "the checkpoint",
) -> PrivacyLedger:
    """A run's ledger (its accountant, relation, δ, budget and target ε), durable at ``path`` if
    given.

    ``seen``: what the checkpoint being resumed saw of the ledger (``manifest["ledger"]``); the
    file must continue it (:meth:`~privmtl.privacy.ledger.PrivacyLedger.open`).
    """
    kw: dict[str, Any] = {
        "delta": delta,
        "accountant": config.accountant,
        "relation": config.relation,
        "budget": budget,
        "target_epsilon": config.epsilon,
    }
    if path is None:
        return PrivacyLedger(**kw)
    return PrivacyLedger.open(path, **kw, seen=seen, seen_by=seen_by)


def fingerprint_base(config: TrainConfig, noise_source: str, m: int) -> dict[str, Any]:
    """The part of a checkpoint's fingerprint every transport shares: the results-relevant
    configuration (no execution-only field, no budget: a resumed run may be given another), the
    noise source and the number of clients."""
    cfg = {k: v for k, v in config.to_dict().items() if k not in _EXECUTION_ONLY}
    cfg.pop("budget", None)
    cfg.pop("epsilon", None)  # the target: the σ calibrated to it is in the fingerprint
    return {**cfg, "noise_source": noise_source, "num_clients": m}


def budget_stops(curator: Curator, budget: float | None) -> bool:
    """True when the run has a budget that the curator's next release would exceed."""
    return budget is not None and curator.would_exceed_budget()


def round_record(
    t: int,
    sampled: Sequence[int] | np.ndarray,
    losses: Sequence[float],
    out: Release | None,
    noise_multiplier: float | None,
    epsilon: float,
    seconds: float,
    **extra: Any,
) -> dict[str, Any]:
    """The history entry of one round, as every transport records it (``out``: the release, or
    None for a round without one; ``extra`` is added last, e.g. the clients that answered)."""
    norms = np.zeros(0) if out is None else out.norms
    clipped = np.zeros(0, dtype=bool) if out is None else out.clipped
    finite = any(not math.isnan(v) for v in losses)
    return {
        "round": t,
        "sampled": [int(k) for k in sampled],
        "n_sampled": len(sampled),
        "train_loss": float(np.nanmean(losses)) if finite else math.nan,
        "update_norms": [float(v) for v in norms],
        "clipped_fraction": float(clipped.mean()) if len(clipped) else 0.0,
        "noise_multiplier": noise_multiplier,
        **({} if out is None else out.details),
        "epsilon": epsilon,
        "seconds": seconds,
        **extra,
    }
