r"""One round at a time: the curator, the clients and the driver of every federated method.

The backbone of the PMTL family, written once:

1. the **curator** samples the round's clients (its sampler names the privacy event of the round)
   and broadcasts the billboard;
2. every sampled **client** runs the method's local update from its start model
   (:mod:`privmtl.federated.client`) and sends a message;
3. the curator **releases**: clip every message → mean over the fixed ``q`` → Gaussian noise from
   its noise source → ledger record (write-ahead, durable with a checkpoint directory) → billboard
   update (:class:`~privmtl.privacy.release.GaussianMeanRelease`);
4. the **driver** (:class:`Trainer`) records the round and, every ``checkpoint_every`` rounds,
   saves the curator's and the clients' state atomically.

The protocol is written once for two transports: the in-process :class:`Trainer` and Flower's
ServerApp and ClientApp (:mod:`privmtl.flower`) both call :func:`setup_run` and
:func:`make_curator` (the release, the billboard, the curator), :func:`new_ledger`,
:func:`budget_stops`, :func:`round_record`, :func:`fingerprint_base` and :func:`run_result`, and
drive the method object's client half (:class:`~privmtl.federated.methods.base.Method`: starts,
local update, message, what is kept); they differ only in how the clients' data and states are
held and how the messages travel. Neither names a method: what a client starts from, its update
rule, what it sends and how the billboard absorbs a release are the method's
(:mod:`privmtl.federated.methods`, whose documentation holds the table of the methods).

Randomness (seeded mode reproduces a run bit for bit, and a resumed run equals the uninterrupted
one): client sampling from ``numpy.random.default_rng([seed, 0])``, client ``k``'s minibatches of
round ``t`` from ``default_rng([seed, 1, t, k])``, server noise from
:class:`~privmtl.privacy.noise.SeededNoise` ``(seed, (2,))``. In secure mode (the default) the noise
comes from OS entropy and every round's client sampling from a generator freshly seeded with 128
bits of OS entropy, so that no client can predict who is sampled; neither is ever checkpointed.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from privmtl._progress import Progress
from privmtl._validation import check_choice, check_int, check_real
from privmtl.checkpoint import has_checkpoint, load_checkpoint, save_checkpoint
from privmtl.data.federated import FederatedDataset
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import (
    Params,
    draw_round_plan,
    evaluate,
    partition_plan,
    sampling_rng,
)
from privmtl.federated.client import UpdateRule, local_sgd_batched, local_sgd_reference
from privmtl.federated.config import TrainConfig, TrainResult, check_inputs, resolve_config
from privmtl.federated.gradients import make_step_fn
from privmtl.federated.methods import ClientStep, Method, TrainFn, get_method
from privmtl.federated.server_optim import ServerOptimizer
from privmtl.federated.spec import resolve_personal_init
from privmtl.locking import DirectoryLock
from privmtl.privacy.calibration import noise_std_for
from privmtl.privacy.curator import ReleaseCurator
from privmtl.privacy.ledger import PrivacyLedger, warn_budget_stop
from privmtl.privacy.noise import NoiseSource, make_noise_source
from privmtl.privacy.release import (
    AdaptiveClip,
    GaussianMeanRelease,
    Release,
    billboard_carries_signal,
    billboard_noise_and_bound,
)
from privmtl.privacy.sampling import ClientSampler, make_sampler

__all__ = [
    "ClientStep",
    "Curator",
    "MethodSpec",
    "RoundRecord",
    "RunSetup",
    "Trainer",
    "billboard_carries_signal",
    "billboard_noise_and_bound",
    "budget_stops",
    "client_messages",
    "client_rule",
    "client_starts",
    "client_step",
    "fingerprint_base",
    "make_curator",
    "method_spec",
    "new_ledger",
    "round_record",
    "run_result",
    "setup_run",
]

MessageHook = Callable[[int, np.ndarray, Params], Params]

#: Config fields that change how a run executes but not its result (left out of the fingerprint
#: that a checkpoint must match).
_EXECUTION_ONLY = ("progress", "threads", "parallel_chunks", "client_chunk", "eval_every")


# ---------------------------------------------------------------------------------- methods
MethodSpec = Method
"""A method's declarations: :class:`~privmtl.federated.methods.base.Method`."""


def method_spec(config: TrainConfig) -> Method:
    """The method object of ``config.method`` (:func:`~privmtl.federated.methods.get_method`)."""
    return get_method(config.method, config)


def client_rule(spec: Method, config: TrainConfig, anchor: Params | None) -> UpdateRule:
    """The local update rule of method ``spec`` (:meth:`Method.rule`)."""
    return spec.with_config(config).rule(anchor)


def client_starts(
    spec: Method,
    billboard: Params,
    sel: torch.Tensor,
    *,
    personal: Params | None = None,
    joined: torch.Tensor | None = None,
    theta: Params | None = None,
) -> tuple[Params, Params | None]:
    """Start states of the clients ``sel`` and the anchor of the local rule (:meth:`Method.starts`
    of the clients' stored states, stacked over the index space of ``sel``)."""
    state: dict[str, Params] = {}
    if personal is not None:
        state["personal"] = personal
    if joined is not None:
        state["joined"] = {"mask": joined}
    if theta is not None:
        state["theta"] = theta
    return spec.starts(billboard, sel, state)


def client_messages(
    spec: Method, billboard: Params, shared: Sequence[str], starts: Params, news: Params
) -> Params:
    """The clients' messages (shared parameters only) from their starts and new states."""
    return spec.messages(billboard, shared, starts, news)


def client_step(
    spec: Method,
    config: TrainConfig,
    billboard: Params,
    shared: Sequence[str],
    starts: Params,
    anchor: Params | None,
    train: TrainFn,
) -> ClientStep:
    """The client step of method ``spec``, written once for every transport
    (:meth:`Method.client_update`)."""
    return spec.with_config(config).client_update(billboard, shared, starts, anchor, train)


# ---------------------------------------------------------------------------------- curator
class Curator(ReleaseCurator):
    """The server: billboard, round index, sampler and its randomness, the release, the ledger.

    Its releases pass the gate of :class:`~privmtl.privacy.curator.ReleaseCurator` (release ids
    ``"{name}round:{t}"``, replays of seeded runs, budget check, write-ahead record).

    Parameters
    ----------
    release : GaussianMeanRelease
        Clip, noise and sampler of every release (the sampler also draws the clients).
    billboard : dict of str to Tensor
        The initial billboard :math:`\\tilde w^0` (stacked ``(m, ...)`` blocks for ``"blocks"``).
    noise : NoiseSource
    ledger : PrivacyLedger or None
        Receives every private release before it leaves (None: not private).
    update : {"add", "replace", "blocks"}
        How a release enters the billboard: :math:`\\tilde w + r`, :math:`r`, or block-wise add.
    seed : int
        Seed of the client-sampling stream in seeded mode.
    name : str
        Prefix of the release ids in the ledger (several curators may share one).
    optimizer : ServerOptimizer, optional
        With ``update="add"``: the billboard adds ``optimizer.step(r)`` instead of the released
        value ``r`` (post-processing of what was released; it never sees the un-noised mean).
    adaptive_clip : AdaptiveClip, optional
        With a release that also releases the noisy unclipped fraction (``count_noise_std``):
        after every release the clip moves to ``adaptive_clip.next_clip(clip, fraction)`` and the
        noise std to :math:`zC/q` with the initial multiplier ``z`` fixed, so that the next
        release is clipped with, and accounted for, the same clip.
    """

    def __init__(
        self,
        release: GaussianMeanRelease,
        billboard: Params,
        *,
        noise: NoiseSource,
        ledger: PrivacyLedger | None,
        update: str = "add",
        seed: int = 0,
        name: str = "",
        optimizer: ServerOptimizer | None = None,
        adaptive_clip: AdaptiveClip | None = None,
    ) -> None:
        if adaptive_clip is not None and (release.count_noise_std is None or release.clip is None):
            raise InvalidParameterError(
                "An adaptive clip needs a release with a finite clip and a noisy count "
                "('count_noise_std')."
            )
        super().__init__(ledger=ledger, noise=noise, name=name)
        self.adaptive_clip = adaptive_clip
        self._z = release.noise_multiplier
        self.release_mechanism = release
        self.billboard = {n: p.clone() for n, p in billboard.items()}
        self.update = check_choice("update", update, ("add", "replace", "blocks"))
        if optimizer is not None and self.update != "add":
            raise InvalidParameterError(
                f"A server optimizer needs update='add'; got update={update!r}."
            )
        self.optimizer = optimizer
        self.round = 0
        self._rng = sampling_rng(seed) if noise.kind == "seeded" else None

    @property
    def sampler(self) -> ClientSampler:
        return self.release_mechanism.sampler

    def event(self) -> Any:
        """The privacy event of the next release (None when not private)."""
        return self.release_mechanism.event()

    release_kind = "round"

    def release_id(self) -> str:
        """The ledger id of the next release."""
        return self.release_id_at(self.round)

    def would_exceed_budget(self) -> bool:
        """True when the ledger has a budget that the next release would exceed.

        A seeded replay of a release the ledger holds already (a resumed run) was charged when it
        was first made, so it never exceeds the budget.
        """
        return self.would_exceed(self.event(), self.release_id())

    def sample_round(self) -> np.ndarray:
        """The sorted indices of this round's clients."""
        rng = self._rng if self._rng is not None else np.random.default_rng(secrets.randbits(128))
        return np.asarray(self.sampler.sample(rng), dtype=np.int64).reshape(-1)

    def release(self, messages: Params, rows: np.ndarray | None = None) -> Release:
        """Clip → mean → noise → record → billboard update; returns what was released."""
        # this curator is the mechanism's ledger gate: it records with its ids and replay policy
        common: dict[str, Any] = {
            "ledger": self,
            "round": self.round,
            "release_id": self.release_id(),
        }
        mech = self.release_mechanism
        if self.update == "blocks":
            assert rows is not None
            num = next(iter(self.billboard.values())).shape[0]
            out = mech.release_blocks(messages, rows, num, self.noise, **common)
        else:
            out = mech.release(messages, self.noise, template=self.billboard, **common)
        self._apply(out)
        return out

    def release_sum(self, total: Params) -> Release:
        """Like :meth:`release` from the sum of messages clipped elsewhere (secure aggregation).

        ``total`` is the sum over this round's answering clients of their messages, each clipped
        by the client to ℓ2 norm at most γ; the rest (fixed divisor, noise, write-ahead ledger
        record, billboard update) is :meth:`release`'s. Only for ``update="add"``.
        """
        if self.update != "add":
            raise InvalidParameterError(
                f"A release from a clipped sum needs update='add'; got update={self.update!r}."
            )
        out = self.release_mechanism.release_sum(
            total,
            self.noise,
            ledger=self,
            round=self.round,
            release_id=self.release_id(),
        )
        self._apply(out)
        return out

    def _apply(self, out: Release) -> None:
        # the ledger has the release on disk: it may now leave the curator
        if self.update == "replace":
            self.billboard = out.value
        elif self.optimizer is not None:  # post-processing of the released (noised) value only
            inc = self.optimizer.step(out.value)
            self.billboard = {n: self.billboard[n] + inc[n] for n in self.billboard}
        else:
            self.billboard = {n: self.billboard[n] + out.value[n] for n in self.billboard}
        if self.adaptive_clip is not None:  # post-processing of the released count
            mech = self.release_mechanism
            assert mech.clip is not None
            self._set_clip(
                self.adaptive_clip.next_clip(mech.clip, out.details["unclipped_fraction"])
            )
        self.round += 1

    def _set_clip(self, clip: float) -> None:
        mech = self.release_mechanism
        sigma = 0.0 if self._z is None else noise_std_for(self._z, mech.q, clip)
        self.release_mechanism = dataclasses.replace(mech, clip=clip, noise_std=sigma)

    def state_dict(self) -> dict[str, Any]:
        """Billboard, round and (seeded mode only) the sampling and noise generator states."""
        state: dict[str, Any] = {"billboard": self.billboard, "round": self.round}
        if self._rng is not None:
            state["sampling_rng"] = json.dumps(self._rng.bit_generator.state)
            state["noise"] = self.noise.state_dict()
        if self.optimizer is not None:
            state["server_optimizer"] = self.optimizer.state_dict()
        if self.adaptive_clip is not None:
            state["clip"] = self.release_mechanism.clip
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.billboard = {n: p.clone() for n, p in state["billboard"].items()}
        self.round = int(state["round"])
        if self._rng is not None:
            self._rng.bit_generator.state = json.loads(state["sampling_rng"])
            self.noise.load_state_dict(state["noise"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state.get("server_optimizer", {}))
        if self.adaptive_clip is not None:
            self._set_clip(float(state["clip"]))


# ---------------------------------------------------------------------------------- driver
@dataclass
class RoundRecord:
    """What one round did; ``released`` is the billboard after the round (public)."""

    round: int
    sampled: np.ndarray
    released: Params
    epsilon: float
    record: dict[str, Any] = field(default_factory=dict)


def _refuse_running_buffers(model: nn.Module) -> None:
    for name, mod in model.named_modules():
        batch_norm = isinstance(mod, nn.modules.batchnorm._BatchNorm)
        running = isinstance(mod, nn.modules.instancenorm._InstanceNorm) and mod.track_running_stats
        if batch_norm or running:
            raise InvalidParameterError(
                f"The 'model' parameter has a {type(mod).__name__} ({name or 'root'}): it "
                "normalizes with statistics of the minibatch or keeps running statistics, which "
                "would mix examples across the padded minibatches of the batched engine and "
                "clients' data in shared buffers. Use LayerNorm or GroupNorm instead."
            )


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
    config: TrainConfig,
    m: int,
    init: Params,
    *,
    sampler: ClientSampler | None = None,
    method: Method | type[Method] | str | None = None,
) -> RunSetup:
    """The release, the billboard and the resolved configuration of a run on ``m`` clients.

    Written once for the in-process :class:`Trainer` and the Flower ServerApp: the resolved
    config (:func:`~privmtl.federated.config.resolve_config`: ``q``, λ, δ, and σ calibrated to a
    target ``epsilon``), the warning of Algorithm 1's message with partial
    participation, the :class:`~privmtl.privacy.release.GaussianMeanRelease` of the method, the
    split into shared and personal parameters and ``personal_init="auto"``'s resolution
    (:func:`~privmtl.federated.spec.resolve_personal_init`), all through the method object's
    server half (``method``: default ``config.method``).
    """
    chosen = config.method if method is None else method
    config = resolve_config(config, m, sampler=sampler, method=chosen)[0]
    q = int(config.clients_per_round or m)
    spec = get_method(chosen, config)
    full = config.sampling == "all" or spec.full_participation
    spec.setup_warnings(q, m)
    sampler = (
        sampler if sampler is not None else make_sampler("all" if full else config.sampling, m, q)
    )
    clip, sigma, divisor = spec.release_settings(config.clip, config.noise_std, q)
    mech = GaussianMeanRelease(
        clip=clip,
        noise_std=sigma,
        sampler=sampler,
        divisor=divisor,
        subspace_dim=config.subspace_dim,
        subspace_seed=config.seed,
        count_noise_std=config.count_noise_std_for(q) if spec.communicates else None,
    )
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


class Trainer:
    r"""The in-process driver of every federated method: steppable, checkpointable, resumable.

    Parameters
    ----------
    dataset : FederatedDataset
        One client per task; training uses ``train``, evaluation ``val`` and ``test``.
    model : torch.nn.Module
        Architecture and initial parameters (copied: the module itself is never modified).
        Modules whose buffers change in training (BatchNorm with running statistics) are refused.
    config : TrainConfig, optional
    noise_source : {"secure", "seeded"}, optional
        Default ``config.noise_source``. ``"seeded"`` is for research simulation only.
    sampler : ClientSampler, optional
        Default ``make_sampler(config.sampling, m, q)``.
    ledger : PrivacyLedger, optional
        Default: a new ledger (``config.accountant``, ``config.relation``, the resolved δ and
        the target ``config.epsilon``), durable at ``checkpoint_dir/ledger.jsonl`` when a checkpoint directory is
        given.
    checkpoint_dir : path, optional
        Where the run's state is saved atomically every ``checkpoint_every`` rounds and at the end.
    checkpoint_every : int, default 1
    resume : bool, default False
        Continue the run checkpointed in ``checkpoint_dir`` (refused if it is from another
        configuration). Without ``resume`` a directory that already holds a checkpoint is refused.
    budget_epsilon : float, optional
        Stop before the release that would take ε above it (default ``config.budget``).
    on_budget : {"stop", "raise"}, default "stop"
        Stop cleanly (``result().stopped_on_budget``) or raise :class:`PrivacyBudgetError`.
    message_hook : callable, optional
        ``hook(round, sampled, messages) -> messages``: sees (and may replace) the clients'
        messages before the curator clips them — for audits with adversarial canary clients.
    initial_state : dict, optional
        Client states to start from instead of the model's parameters (e.g. PP-SGD's ``θ``:
        ``{"theta": {name: (m, ...)}}``).

    Examples
    --------
    >>> trainer = Trainer(dataset, model, TrainConfig(rounds=10), noise_source="seeded")
    >>> for rec in trainer:                     # doctest: +SKIP
    ...     print(rec.round, rec.epsilon)
    >>> result = trainer.result()               # doctest: +SKIP
    """

    def __init__(
        self,
        dataset: FederatedDataset,
        model: nn.Module,
        config: TrainConfig | None = None,
        *,
        noise_source: str | None = None,
        sampler: ClientSampler | None = None,
        ledger: PrivacyLedger | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_every: int = 1,
        resume: bool = False,
        budget_epsilon: float | None = None,
        on_budget: str = "stop",
        message_hook: MessageHook | None = None,
        initial_state: dict[str, Any] | None = None,
        method: Method | type[Method] | str | None = None,
    ) -> None:
        config = TrainConfig() if config is None else config
        check_inputs(dataset, model)
        _refuse_running_buffers(model)
        # q, λ, δ and σ of a target ε, once (setup_run's own resolution then changes nothing)
        config = resolve_config(config, dataset.n_clients, sampler=sampler)[0]
        self.dataset, self.config = dataset, config
        self.model = copy.deepcopy(model)
        m = dataset.n_clients
        self.m = m
        self.noise_source = check_choice(
            "noise_source", noise_source or config.noise_source, ("secure", "seeded")
        )
        self.checkpoint_every = check_int("checkpoint_every", checkpoint_every, low=1)
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.on_budget = check_choice("on_budget", on_budget, ("stop", "raise"))
        budget = config.budget if budget_epsilon is None else budget_epsilon
        if budget is not None:
            budget = check_real("budget_epsilon", budget, low=0.0, closed="neither")
        self.budget = budget
        self.message_hook = message_hook

        init = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        if not init:
            raise InvalidParameterError("The 'model' parameter must have at least one parameter.")
        self.buffers = {n: b.detach() for n, b in self.model.named_buffers()}
        x_all, y_all, offsets = dataset.concat("train")
        self.x_all = x_all.to(next(iter(init.values())).dtype)
        self.y_all, self.offsets = y_all, offsets

        # ---- the release of this method, the billboard and the curator
        setup = setup_run(config, m, init, sampler=sampler, method=method)
        self.spec = self.method = spec = setup.spec
        config, q = setup.config, setup.q
        self.delta = float(config.delta or 0.0)  # resolved by setup_run
        self.config, self.q, self.shared = config, q, setup.shared
        self._personal_init = setup.personal_init
        init = setup.init
        mech = setup.release
        if spec.communicates and mech.private:
            if ledger is None:
                ledger = self._make_ledger()
            ledger.epsilon_if(mech.event())  # fail fast on an unsupported combination
        if budget is not None and ledger is not None:
            ledger.budget = budget
        self.ledger = ledger if spec.communicates and mech.private else None
        noise = make_noise_source(self.noise_source, config.seed)
        self.curator = make_curator(setup, noise=noise, ledger=self.ledger)
        self.clients: dict[str, Params] = spec.initial_state(init, m, initial_state)
        self.names = list(init)
        self.history: list[dict[str, Any]] = []
        self.epsilon = 0.0 if not spec.communicates else (math.inf if self.ledger is None else 0.0)
        self.stopped_on_budget = False
        self._train_seconds = 0.0
        self._data_sha256: str | None = None
        self._step_fn: Any = None
        self._local = threading.local()
        if self.checkpoint_dir is not None:
            self._open_checkpoint(resume)

    # ---------------------------------------------------------------------------- setup
    def _make_ledger(self, path: Path | None = None) -> PrivacyLedger:
        return new_ledger(self.config, self.delta, self.budget, path)

    def fingerprint_config(self) -> dict[str, Any]:
        """What a checkpoint must match: results-relevant config, data, model and noise source."""
        sizes = self.dataset.sizes("train").tolist()
        ids = hashlib.sha256("\n".join(self.dataset.client_ids).encode()).hexdigest()
        if self._data_sha256 is None:  # the data never changes during a run: hashed once
            self._data_sha256 = self.dataset.content_sha256()
        return {
            **fingerprint_base(self.config, self.noise_source, self.m),
            "client_ids_sha256": ids,
            "train_sizes_sha256": hashlib.sha256(str(sizes).encode()).hexdigest(),
            "data_sha256": self._data_sha256,
            "model": {n: list(p.shape) for n, p in self.model.named_parameters()},
        }

    def _open_checkpoint(self, resume: bool) -> None:
        assert self.checkpoint_dir is not None
        d = self.checkpoint_dir
        # one writer per directory, for as long as this trainer lives (released with it, or by
        # the OS when the process ends)
        lock = DirectoryLock.acquire(d, name="checkpoint_dir")
        weakref.finalize(self, lock.release)
        exists = has_checkpoint(d)
        if exists and not resume:
            raise InvalidParameterError(
                f"The checkpoint directory {d} already holds a run; pass resume=True (--resume) "
                "to continue it, or choose an empty directory."
            )
        state, manifest = None, None
        if exists:
            state, manifest = load_checkpoint(
                d, kind="pmtl-family", config=self.fingerprint_config()
            )
        if self.ledger is not None:
            if not exists and not resume and (d / "ledger.jsonl").exists():
                # killed before its first checkpoint: the spent budget is in the ledger
                raise InvalidParameterError(
                    f"{d} holds the privacy ledger of a run killed before its first checkpoint; "
                    "pass resume=True (--resume) to restart it from round 0 with that ledger."
                )
            if self.ledger.records:
                raise InvalidParameterError(
                    "Give either a ledger or a checkpoint directory, not a ledger with releases."
                )
            # the ledger must continue the one the checkpoint saw (deleted, cut or edited: refused)
            durable = new_ledger(
                self.config,
                self.delta,
                self.ledger.budget,
                d / "ledger.jsonl",
                seen=None if manifest is None else (manifest.get("ledger") or {}),
                seen_by=f"the checkpoint of round {manifest['step']} in {d}" if manifest else "",
            )
            self.ledger = self.curator.ledger = durable
        if state is not None:
            self.load_state_dict(state)
            if self.ledger is not None:
                # the ε reached is the ledger's, of every release it holds (a release recorded
                # after the checkpoint may have left); a seeded replay of it reports the same ε
                self.epsilon = self.ledger.epsilon()

    # ---------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Curator and client states, history and the ε reached (no secret noise state)."""
        return {
            "curator": self.curator.state_dict(),
            "clients": self.clients,
            "history": json.dumps(self.history),
            "epsilon": self.epsilon,
            "stopped_on_budget": self.stopped_on_budget,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.curator.load_state_dict(state["curator"])
        self.clients = {
            k: {n: p.clone() for n, p in v.items()} for k, v in state["clients"].items()
        }
        self.history = json.loads(state["history"])
        self.epsilon = float(state["epsilon"])
        if self.ledger is not None and self.history and self.noise_source == "secure":
            self.epsilon = self.ledger.epsilon()  # every release is charged, repeats included

    def save(self) -> None:
        """Save a checkpoint now (atomic; the ledger file is already up to date)."""
        if self.checkpoint_dir is None:
            raise InvalidParameterError("save() needs a checkpoint_dir.")
        save_checkpoint(
            self.checkpoint_dir,
            kind="pmtl-family",
            config=self.fingerprint_config(),
            state=self.state_dict(),
            step=self.round,
            noise_source=self.noise_source,
            ledger=None if self.ledger is None else self.ledger.seen(),
        )

    @property
    def round(self) -> int:
        return self.curator.round

    @property
    def finished(self) -> bool:
        return self.round >= self.config.rounds or self.stopped_on_budget

    # ---------------------------------------------------------------------------- one round
    def _thread_step_fn(self) -> Any:
        fn = getattr(self._local, "step_fn", None)
        if fn is None:  # functional_call swaps a module's parameters: one module per thread
            model = (
                self.model
                if threading.current_thread() is threading.main_thread()
                else copy.deepcopy(self.model)
            )
            fn = make_step_fn(model, self.buffers, self.config.vectorize)
            self._local.step_fn = fn
        return fn

    def _train_clients(
        self, starts: Params, rule: UpdateRule, plan: list[list[np.ndarray]], pool: Any
    ) -> tuple[Params, list[float]]:
        cfg = self.config
        k = len(plan)
        if not cfg.batched:
            return local_sgd_reference(
                self.model, self.buffers, starts, rule, self.x_all, self.y_all, plan
            )

        def train_group(pos: np.ndarray) -> tuple[Params, list[float]]:
            idx = torch.from_numpy(pos)
            return local_sgd_batched(
                self._thread_step_fn(),
                {n: p.index_select(0, idx) for n, p in starts.items()},
                rule,
                self.x_all,
                self.y_all,
                [plan[j] for j in pos],
                cfg.batch_size,
            )

        if pool is not None:  # groups of equal work, one per thread at a time
            groups = partition_plan(plan, cfg.threads, cfg.client_chunk)
            results = list(pool.map(train_group, groups))
        else:
            chunk = cfg.client_chunk or max(k, 1)
            groups = [np.arange(c, min(c + chunk, k)) for c in range(0, k, chunk)]
            results = [train_group(g) for g in groups]
        order = torch.from_numpy(np.argsort(np.concatenate(groups), kind="stable"))
        losses: list[float] = [v for _, ls in results for v in ls]
        news = {n: torch.cat([w[n] for w, _ in results]).index_select(0, order) for n in starts}
        return news, [losses[int(i)] for i in order]

    def _train_fn(
        self,
        sampled: np.ndarray,
        round_index: int,
        plan: list[list[np.ndarray]] | None,
        pool: Any,
    ) -> TrainFn:
        """The backend's local training of the clients ``sampled`` in round ``round_index``
        (:class:`~privmtl.federated.methods.base.TrainFn`): the round's ``plan``, or the
        minibatches of another stream / number of epochs."""
        cfg = self.config

        def train(
            starts: Params,
            rule: UpdateRule,
            *,
            stream: int | None = None,
            epochs: int | None = None,
        ) -> tuple[Params, list[float]]:
            if plan is not None and stream is None and epochs is None:
                return self._train_clients(starts, rule, plan, pool)
            c = (
                cfg
                if epochs is None
                else dataclasses.replace(cfg, local_epochs=epochs, local_steps=None)
            )
            kw = {} if stream is None else {"stream": stream}
            own = draw_round_plan(sampled, self.offsets, round_index, c, **kw)
            return self._train_clients(starts, rule, own, pool)

        return train

    def step(self, pool: Any = None) -> RoundRecord | None:
        """Run one round; None when the run is finished or stops on its budget."""
        if self.finished:
            return None
        if budget_stops(self.curator, self.budget):
            if self.on_budget == "raise":
                assert self.ledger is not None
                self.ledger.check(self.curator.event())
            if not self.stopped_on_budget:
                warn_budget_stop(
                    self.round, self.config.rounds, "rounds", float(self.epsilon),
                    float(self.budget or 0.0), "result().stopped_on_budget",
                )  # fmt: skip
            self.stopped_on_budget = True
            return None
        t0, c0 = time.perf_counter(), time.process_time()
        t, spec = self.round, self.spec
        sampled = self.curator.sample_round()
        plan = draw_round_plan(sampled, self.offsets, t, self.config)
        losses: list[float] = []
        out = None
        template = spec.message_template(self.curator.billboard)
        messages = {n: p.new_zeros((0, *p.shape)) for n, p in template.items()}
        if len(sampled):
            sel = torch.from_numpy(sampled)
            starts, anchor = spec.starts(self.curator.billboard, sel, self.clients)
            done = spec.client_update(
                self.curator.billboard,
                self.shared,
                starts,
                anchor,
                self._train_fn(sampled, t, plan, pool),
            )
            spec.keep(self.clients, sel, done.kept)
            messages, losses = done.messages, done.losses
        if self.message_hook is not None:
            messages = self.message_hook(t, sampled, messages)
        if spec.communicates:
            out = self.curator.release(messages, rows=sampled)
            if self.ledger is not None:
                self.epsilon = out.epsilon
        else:
            self.curator.round += 1  # local training: a round without a release
        z = self.curator.release_mechanism.noise_multiplier if spec.communicates else None
        rec = round_record(
            t,
            sampled,
            losses,
            out,
            z,
            self.epsilon,
            time.perf_counter() - t0,
            cpu_seconds=time.process_time() - c0,
        )
        if self.config.eval_every and (t + 1) % self.config.eval_every == 0:
            ev = self._evaluate_split("val")
            main = ev["personalized" if self.spec.personalized else "global"]
            rec["val_accuracy"] = main["accuracy"]
            rec["val_mean_client_accuracy"] = main["mean_client_accuracy"]
        self.history.append(rec)
        if self.checkpoint_dir is not None and (
            self.round % self.checkpoint_every == 0 or self.round == self.config.rounds
        ):
            self.save()
        return RoundRecord(t, sampled, self.curator.billboard, self.epsilon, rec)

    # ---------------------------------------------------------------------------- loop
    def __iter__(self) -> Iterator[RoundRecord]:
        """Run the remaining rounds, yielding one :class:`RoundRecord` per round."""
        cfg = self.config
        old_threads = torch.get_num_threads()
        pool = None
        if cfg.parallel_chunks and cfg.batched and cfg.threads > 1:
            from concurrent.futures import ThreadPoolExecutor

            torch.set_num_threads(1)
            pool = ThreadPoolExecutor(
                max_workers=cfg.threads, initializer=torch.set_num_threads, initargs=(1,)
            )
        else:
            torch.set_num_threads(cfg.threads)
        self.model.train()
        bar = Progress(
            total=cfg.rounds,
            initial=self.round,
            desc=self.spec.name,
            enabled=cfg.progress,
            unit="round",
        )
        try:
            while True:
                t0 = time.perf_counter()
                rec = self.step(pool)
                if rec is None:
                    break
                self._train_seconds += time.perf_counter() - t0
                # only released quantities on the progress line: the training loss of the sampled
                # clients is a curator diagnostic (``run_pmtl(diagnostics=True)``)
                bar.update(1, eps=f"{rec.epsilon:.3g}")
                yield rec
        finally:
            bar.close()
            if pool is not None:
                pool.shutdown()
            torch.set_num_threads(old_threads)

    def run(self) -> TrainResult:
        """Run every remaining round and return :meth:`result`."""
        for _ in self:
            pass
        if self.checkpoint_dir is not None and self.history:
            self.save()
        return self.result()

    # ---------------------------------------------------------------------------- output
    def _outputs(self) -> tuple[Params | None, Params]:
        all_clients = np.arange(self.m)
        return self.spec.outputs(
            self.curator.billboard,
            self.clients,
            personal_init=self._personal_init,
            names=self.names,
            round=self.round,
            train_all=self._train_fn(all_clients, 0, None, None),
        )

    def _evaluate_split(self, split: str) -> dict[str, dict[str, float]]:
        personal, glob = self._outputs()
        xs, ys = self.dataset.split(split)
        out = {}
        if personal is not None and self.spec.personalized:
            out["personalized"] = evaluate(
                self.model, personal, self.buffers, xs, ys, personalized=True
            )
        if self.spec.communicates:
            out["global"] = evaluate(self.model, glob, self.buffers, xs, ys, personalized=False)
        return out

    def result(self) -> TrainResult:
        """The :class:`TrainResult` of the rounds run so far (evaluates on val and test)."""
        personal, glob = self._outputs()
        accuracies = {split: self._evaluate_split(split) for split in ("val", "test")}
        return run_result(
            self.config,
            self.history,
            accuracies,
            personalized=personal if self.spec.personalized else None,
            global_params=glob,
            primary="personalized" if self.spec.personalized else "global",
            epsilon=self.epsilon,
            delta=self.delta,
            ledger=self.ledger,
            noise_source=self.noise_source,
            stopped_on_budget=self.stopped_on_budget,
            client_ids=list(self.dataset.client_ids),
            extra=self._extra(),
        )

    def _extra(self) -> dict[str, Any]:
        return self.spec.extra(self.shared, self.names)
