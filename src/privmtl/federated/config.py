"""Configuration and result containers of the federated training engine.

:class:`TrainConfig` takes every algorithm and privacy default from the run spec
(:data:`~privmtl.federated.spec.SPEC`); the data-dependent ones (clients per round, λ, δ) are None
until :func:`resolve_config` fills them in with the spec's resolvers; a target ``epsilon`` becomes
the run's :class:`~privmtl.privacy.calibration.PrivacyTarget`, which the release calibrates
itself to (:func:`~privmtl.federated.backend.setup_run`).
The engine and Flower's ServerApp resolve every configuration they are given this way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any

from torch import nn

from privmtl._device import check_device
from privmtl._validation import check_choice, check_int, check_real
from privmtl.data.federated import FederatedDataset
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.methods import engine_method_class, method_class
from privmtl.federated.spec import (
    DEFAULT_HEAD_EPOCHS,
    EXECUTION,
    SPEC,
    RunSpec,
    check_param_names,
    check_participation,
    check_vote_mechanism,
    default_lam,
    pmtl_delta,
    resolve_clients_per_round,
    resolve_defaults,
)
from privmtl.federated.train_result import TrainResult
from privmtl.privacy.calibration import GivenNoise, PrivacyTarget, default_count_noise_std

__all__ = [
    "CLIENT_CHUNK",
    "DEFAULT_HEAD_EPOCHS",
    "SAMPLINGS",
    "ResolvedRun",
    "TrainConfig",
    "TrainResult",
    "check_param_names",
    "resolve",
    "resolve_config",
    "train_config",
]

SAMPLINGS = ("poisson", "fixed", "all", "cyclic")

CLIENT_CHUNK = 8
"""Clients vectorised together in a round (``client_chunk="auto"``) for a model without the
by-hand logistic step."""


@dataclass(frozen=True)
class TrainConfig:
    r"""Hyper-parameters of one federated training run (PMTL, Algorithm 1, and its baselines).

    Parameters
    ----------
    method : {"pmtl", "fedavg", "fedprox", "local"}, default "pmtl"
        * ``"pmtl"``: each sampled client ``k`` starts from its own persistent model ``w_k`` and
          runs local SGD on :math:`f_k(w) = l_k(w) + \frac{\lambda}{2}\lVert w - \tilde w\rVert^2`;
          the output is the ``m`` personalized models.
        * ``"fedavg"``: clients start from :math:`\tilde w` and minimise :math:`l_k` (λ ignored);
          evaluated with the single global model :math:`\tilde w`.
        * ``"fedprox"``: clients start from :math:`\tilde w` and minimise
          :math:`l_k(w) + \frac{\mu}{2}\lVert w - \tilde w\rVert^2` with :math:`\mu` = ``lam``;
          global model.
        * ``"local"``: no communication: sampled clients run local SGD on :math:`l_k` from their
          own model; no server step, no noise, ε = 0 towards the other clients.
        * ``"fedrep"`` (:mod:`privmtl.federated.fedrep`): a shared representation (the
          ``shared_params``; default every parameter but the last layer's) and a head per client;
          each sampled client trains its head for ``head_epochs`` epochs on the released
          representation, then the representation with its head fixed, and sends the
          representation's change only.
    rounds : int, default 100
        Communication rounds ``T``.
    clients_per_round : int or None, default None
        ``q`` (None: :func:`~privmtl.federated.spec.default_clients_per_round`, ``min(20, m)``,
        filled in by :func:`resolve_config`; above ``m`` is an error): the fixed number of clients per round (``"fixed"``), the expected number
        (``"poisson"``, rate ``q/m``), ignored for ``"all"`` (``q = m``). The server divides the
        sum of clipped updates by this fixed ``q``, never by the realised count.
    server_update : {"offset", "delta", "ditto"}, default "ditto"
        What a sampled client sends (pmtl; the two coincide for fedavg/fedprox, which start from
        :math:`\tilde w^t`). ``"delta"``: :math:`g_k = w_k^{new} - w_k^{old}`, Algorithm 1 as printed.
        ``"offset"``: :math:`g_k = w_k^{new} - \tilde w^t`, what the authors' released code sends
        (``models/model.py``: the update is the personalized model minus the broadcast global
        model). Same sensitivity and guarantee. Without clipping and noise, "delta" moves
        :math:`\tilde w` by :math:`\frac1q\sum_{S_t}\Delta w_k`, ``m/q`` times the change of the mean
        :math:`\bar w` of the :math:`w_k` (:math:`\tilde w^t-\tilde w^0 = \frac mq(\bar w^t-\bar w^0)`),
        so with ``q < m`` it overshoots the mean it is meant to track; with "offset" and fixed-size
        sampling, :math:`\tilde w^{t+1}` is the mean of the sampled personalized models.
        ``"ditto"`` (Li et al. 2021, "Ditto: fair and robust federated learning through
        personalization"): the client also trains a copy :math:`v_k` of :math:`\tilde w^t` on the
        same minibatches with plain local SGD (no pull) and sends
        :math:`g_k = v_k^{new} - \tilde w^t`, FedAvg's update; its personalized model
        :math:`w_k` is trained as above and never sent. The billboard then follows FedAvg's
        (no stale personalized models in the mean, no overshoot), at twice the local work. Same
        sensitivity and guarantee: the message is still clipped to γ.
    local_steps, local_epochs : int or None
        At most one may be set. ``local_steps = E``: every sampled client runs exactly ``E`` SGD
        steps, each on ``min(B, n_k)`` examples drawn uniformly without replacement (fresh draw per
        step). ``local_epochs = e``: each epoch visits a fresh permutation of the client's data in
        ``ceil(n_k / B)`` minibatches (the last one may be smaller), so the number of steps,
        ``e * ceil(n_k / B)``, differs across clients. Both unset: ``local_epochs = 1`` (paper).
    batch_size : int, default 10
        ``B``.
    lr : float, default 0.1
        Local SGD step size ``η``.
    lam : float or None, default None
        ``λ`` of the mean-regularizer (pmtl) or ``μ`` of the proximal term (fedprox); None:
        :func:`~privmtl.federated.spec.default_lam` (filled in by :func:`resolve_config`).
    clip : float or None, default 0.5
        ``γ``: each update ``g_k`` is scaled by ``min(1, γ / ‖g_k‖₂)`` (norm over all
        parameters). ``None`` disables clipping (then the run is not private).
    epsilon : float or None
        Target ε: with ``noise_std`` 0, :func:`resolve` makes it the run's
        :class:`~privmtl.privacy.calibration.PrivacyTarget`, the release calibrates its σ to it
        (:meth:`~privmtl.privacy.release.GaussianMeanRelease.for_target`) and the ledger records
        it with the run. A ``noise_std`` given with it is taken as calibrated; the ε reported is always
        the ledger's. None: no target.
    noise_std : float, default 0.0
        ``σ``: standard deviation of the Gaussian noise added to the *mean* update (0: no noise,
        or calibrated to ``epsilon``). The noise multiplier given to the accountant is
        ``z = σ q / γ`` (:func:`~privmtl.privacy.calibration.noise_multiplier`).
    sampling : {"poisson", "fixed", "all", "cyclic"}, default "poisson"
        Client sampling; the privacy event is the sampler's own (``sampler.event(z)``). The
        accountant supports ``"poisson"`` with either relation (replace-one needs
        ``accountant="pld"``), ``"fixed"`` with ``relation="replace-one"`` and ``"rdp"`` only, and
        ``"all"`` and ``"cyclic"`` with both; other combinations are refused before training
        starts. ``"cyclic"``: ``groups`` public groups, group ``t mod b`` in round ``t``
        (:class:`~privmtl.privacy.sampling.CyclicSampler`; a client takes part in
        ``ceil(T/b)`` rounds, accounted without amplification).
    groups : int, default 1
        ``b`` of ``sampling="cyclic"`` (in [1, m]).
    noise_mechanism : {"independent", "banded"}, default "independent"
        ``"banded"``: banded matrix-factorization noise over the run (needs ``sampling`` "all"
        or "cyclic"; the strategy is :func:`~privmtl.privacy.matrix_factorization.run_strategy`
        and the whole run is one ledger event,
        :meth:`~privmtl.privacy.release.GaussianMeanRelease.run_event`).
    seed : int, default 0
        Seeds three independent streams: client sampling (numpy), local minibatch draws (one numpy
        stream per client and round) and server noise (``torch.Generator``).
    delta : float or None
        Target δ of the reported ε; None: :func:`~privmtl.federated.spec.pmtl_delta`,
        min(1e-5, 1/(100 m)) (below 1/m as DP practice asks; the paper's 1/m must be given
        explicitly), filled in by :func:`resolve_config`.
    accountant : str, default "rdp"
        Accountant of the :class:`~privmtl.privacy.ledger.PrivacyLedger`.
    relation : {"add-remove", "replace-one"}, default "add-remove"
        Neighbouring relation of the guarantee.
    budget : float or None
        Optional ε budget: the run stops before the release that would exceed it
        (:class:`~privmtl.federated.protocol.Trainer`; :func:`~privmtl.federated.engine.train`
        raises :class:`~privmtl.exceptions.PrivacyBudgetError` there instead).
    batched : bool, default True
        Train the sampled clients together with ``torch.func.vmap``; ``False`` runs the per-client
        reference loop (same math, same random draws).
    vectorize : {"auto", "vmap", "model"}, default "auto"
        Batched path: ``"vmap"`` vectorises any module with ``torch.func.vmap``; ``"model"`` uses
        the model's ``forward_batched`` (see :mod:`privmtl.federated.models`); ``"auto"`` prefers
        the latter when the model has it.
    client_chunk : int, None or "auto", default "auto"
        Batched path: vectorise over at most this many clients at a time (``None``: all sampled
        clients). ``"auto"``: all sampled clients for a model with the by-hand logistic step
        (:func:`~privmtl.federated.gradients.tape_free`: a few tiny operations a step, whose
        dispatch, not their arithmetic, is the cost, so one vectorised pass over every client
        beats many passes over a few), :data:`CLIENT_CHUNK` otherwise (a network's activations
        for a few clients at a time). Results do not depend on it; ``benchmarks/pmtl_speed.py``
        measures its effect.
    eval_every : int, default 0
        Every ``eval_every`` rounds, record the validation accuracy of the method's model in the
        history (0: only at the end).
    progress : bool, default True
        Report progress on stderr: a bar on a terminal, about ten plain lines in a log or a
        pipe (see :class:`privmtl._progress.Progress`).
    threads : int, default 2
        ``torch.set_num_threads`` during training (restored afterwards; a logistic regression's
        rounds run on one thread, faster for its few tiny operations a step:
        :func:`~privmtl.federated.gradients.tape_free`); on the CPU, also the
        blocks of clients :func:`~privmtl.experiments.pmtl.run_pmtl`'s end of run computes at once
        (one torch thread each: ``finish_clients``' ``workers``; the same models).
    parallel_chunks : bool, default True
        Batched path on the CPU with ``threads > 1``: train groups of clients concurrently, one group per
        thread with one torch thread each (inter-op instead of intra-op parallelism), instead of
        one chunk after another with ``threads`` torch threads per operation. The sampled clients
        are split into ``threads * ceil(sampled / (threads * client_chunk))`` groups of nearly
        equal work (local steps; greedy longest-first), so that the threads finish together
        although clients hold different amounts of data. The updates are the same
        (``benchmarks/results/pmtl_speed.md`` measures the speed).
    device : {"auto", "cpu", "cuda", "cuda:N"}, default "auto"
        Where the in-process engine computes (:func:`privmtl._device.resolve_device`: ``"auto"``
        is CUDA where available, else the CPU; ``"cuda"`` without CUDA is an error when the
        trainer is built). The model, the data, the billboard and the clients' stored rows live
        there; sampling and the noise of every release are drawn on the CPU and the noise moved
        to the device (the secure source stays the OS's). On the CPU results are those without
        the option; on a GPU the last digits of a seeded run may differ.
    noise_source : {"secure", "seeded"}, default "secure"
        Where the server's Gaussian noise comes from (:mod:`privmtl.privacy.noise`): OS entropy
        (secure, not reproducible, never checkpointed; client sampling then also uses fresh OS
        entropy every round) or a generator seeded from ``seed`` (reproducible research
        simulation only: anyone who knows the seed can subtract the noise).
    pp_alpha : float, default 1.0
        ``pp-sgd``: step-size ratio α of the local part θ_k (Bietti et al. 2022).
    pp_theta_reg : float or None
        ``pp-sgd``: weight μ of (μ/2)‖θ_k‖² (default ``lam``).
    ball : float or None
        ``workshop``: radius B of the ball every task model is projected onto (required).
    server_optimizer : {"none", "momentum", "adam"}, default "none"
        How the billboard absorbs each *released* (noised) mean ``r``
        (:class:`~privmtl.federated.server_optim.ServerOptimizer`; DP-FedAvgM / DP-FedAdam):
        post-processing of the released sequence, no privacy cost. ``"none"``: ``w̃ + r``.
        Methods whose billboard adds releases only (pmtl, fedavg, fedprox, pp-sgd).
    server_lr, server_momentum, server_beta2, server_adam_eps : float
        The server optimizer's step size (default 1.0), β or β₁ (0.9), Adam's β₂ (0.99) and τ
        (1e-3).
    head_epochs : int, default :data:`DEFAULT_HEAD_EPOCHS`
        ``fedrep``: local epochs of head training per round, before the representation's local
        work, and of every client's final head training on the last released representation.
    shared_params : tuple of str or None
        Partial sharing (FedPer/FedRep-style; pmtl, and fedrep whose representation it names):
        only the parameters whose name
        equals an entry or starts with ``entry + "."`` go through the billboard (messages, clip,
        noise, prox anchor); the others stay personal and take plain local SGD steps. The norm
        clipped is that of the shared part; the accounting (z = σq/γ) does not depend on the
        released dimension. None: every parameter is shared.
    personal_init : {"model", "billboard", "auto"}, default "auto"
        Personalized methods with a billboard (pmtl): where a client's persistent model starts.
        ``"model"``: the initial model. ``"billboard"``: the billboard at the client's first
        participation, and clients that never took part are scored with the final billboard
        (what they would download; post-processing of public releases, no privacy cost).
        ``"auto"``: ``"billboard"`` when the noise norm of one release is at most the clip
        (:func:`~privmtl.privacy.release.billboard_carries_signal`), else ``"model"``; the
        run's result reports the choice made.
    subspace_dim : int or None
        ``k``: release the clipped mean in a public random subspace of ``k`` coordinates (of the
        shared parameters), fresh every round, with noise in those ``k`` coordinates only
        (:class:`~privmtl.privacy.release.GaussianMeanRelease`). Same sensitivity and privacy
        event as the full release. Methods whose billboard adds the releases. None: all
        coordinates.
    adaptive_clip_quantile : float in (0, 1) or None
        Adaptive clipping (Andrew et al. 2021): every round the curator also releases the noisy
        fraction of messages not clipped, and the next clip is
        ``clip * exp(-adaptive_clip_lr * (fraction - adaptive_clip_quantile))``; ``clip`` is the
        initial clip. The noise multiplier z = σq/γ of the mean stays fixed (σ follows the clip),
        and each round's event is the sampler's event for the joint multiplier of mean and count
        (:mod:`privmtl.privacy.release`). None: fixed clip. With the ``offset`` message the
        message norms include the billboard's own noise, whose scale follows the clip: when the
        noise norm :math:`\sigma\sqrt d` is far above the clip, the quantile rule then grows the
        clip (and σ with it) without bound — use it where the noise is small against the updates.
    adaptive_clip_lr : float, default 0.2
        :math:`\eta_C` of the clip update.
    adaptive_clip_noise : float or None
        σ_b, the std of the noise on the centred count of unclipped messages (default ``q/20``,
        the paper's recommendation). With an ε target, the mean's multiplier is
        :math:`(z_\Delta^{-2} - (2\sigma_b)^{-2})^{-1/2}` where :math:`z_\Delta` meets the
        target (:func:`~privmtl.federated.baselines.config_for_epsilon`).

    Notes
    -----
    ``method`` also accepts ``"joint-dp"`` (naive client-level DP of the concatenation of all
    models, :func:`~privmtl.federated.baselines.train_joint_dp`), ``"pp-sgd"``
    (:func:`~privmtl.federated.baselines.train_pp_sgd`) and ``"workshop"``
    (:func:`~privmtl.federated.workshop.train_workshop`): all run through
    :class:`~privmtl.federated.protocol.Trainer`. ``progress``, ``threads``, ``parallel_chunks``,
    ``client_chunk``, ``eval_every`` and ``device`` change how a run executes, not its result.
    """

    # the algorithm and privacy defaults are the run spec's (one home: privmtl.federated.spec)
    method: str = SPEC.method
    rounds: int = SPEC.rounds
    clients_per_round: int | None = SPEC.clients_per_round
    server_update: str = SPEC.server_update
    local_steps: int | None = SPEC.local_steps
    local_epochs: int | None = SPEC.local_epochs
    batch_size: int = SPEC.batch_size
    lr: float = SPEC.lr
    lam: float | None = SPEC.lam
    clip: float | None = SPEC.clip
    epsilon: float | None = SPEC.epsilon
    noise_std: float = 0.0  # the engine's "no noise"; RunSpec's None ("not given") becomes 0
    sampling: str = SPEC.sampling
    groups: int = SPEC.groups
    noise_mechanism: str = SPEC.noise_mechanism
    seed: int = SPEC.seed
    delta: float | None = None  # a resolved float; RunSpec's "paper" is resolved before
    accountant: str = SPEC.accountant
    relation: str = SPEC.relation
    budget: float | None = None
    batched: bool = True
    vectorize: str = "auto"
    client_chunk: int | str | None = "auto"
    eval_every: int = EXECUTION.eval_every
    progress: bool = EXECUTION.show_progress
    threads: int = EXECUTION.threads
    parallel_chunks: bool = True
    device: str = EXECUTION.device
    noise_source: str = SPEC.noise_source
    pp_alpha: float = 1.0
    pp_theta_reg: float | None = None
    ball: float | None = None
    head_epochs: int = SPEC.head_epochs
    server_optimizer: str = SPEC.server_optimizer
    server_lr: float = SPEC.server_lr
    server_momentum: float = SPEC.server_momentum
    server_beta2: float = 0.99
    server_adam_eps: float = 1e-3
    shared_params: tuple[str, ...] | None = SPEC.shared_params
    personal_init: str = SPEC.personal_init
    subspace_dim: int | None = SPEC.subspace_dim
    adaptive_clip_quantile: float | None = SPEC.adaptive_clip_quantile
    adaptive_clip_lr: float = SPEC.adaptive_clip_lr
    adaptive_clip_noise: float | None = SPEC.adaptive_clip_noise

    def __post_init__(self) -> None:
        method = engine_method_class(self.method)  # the registry checks the name
        check_int("rounds", self.rounds, low=0)
        if self.clients_per_round is not None:
            check_int("clients_per_round", self.clients_per_round, low=1)
        check_choice("server_update", self.server_update, ("delta", "offset", "ditto"))
        if self.local_steps is not None and self.local_epochs is not None:
            raise InvalidParameterError(
                "Set at most one of 'local_steps' and 'local_epochs'; got "
                f"local_steps={self.local_steps!r}, local_epochs={self.local_epochs!r}."
            )
        if self.local_steps is not None:
            check_int("local_steps", self.local_steps, low=1)
        if self.local_epochs is not None:
            check_int("local_epochs", self.local_epochs, low=1)
        check_int("batch_size", self.batch_size, low=1)
        check_real("lr", self.lr, low=0.0, closed="neither")
        if self.lam is not None:
            check_real("lam", self.lam, low=0.0)
        if self.epsilon is not None:
            check_real("epsilon", self.epsilon, low=0.0, closed="neither")
        if self.clip is not None:
            check_real("clip", self.clip, low=0.0, closed="neither")
        check_real("noise_std", self.noise_std, low=0.0)
        check_choice("sampling", self.sampling, SAMPLINGS)
        check_participation(self.sampling, self.groups, self.noise_mechanism)
        if self.noise_mechanism == "banded":
            for name in ("subspace_dim", "adaptive_clip_quantile"):
                if getattr(self, name) is not None:
                    raise InvalidParameterError(
                        f"The '{name}' parameter must be None with noise_mechanism='banded'; "
                        f"got {getattr(self, name)!r}."
                    )
        check_int("seed", self.seed, low=0)
        if self.delta is not None:
            check_real("delta", self.delta, low=0.0, high=1.0, closed="neither")
        check_choice("relation", self.relation, ("add-remove", "replace-one"))
        if self.budget is not None:
            check_real("budget", self.budget, low=0.0, closed="neither")
        check_choice("vectorize", self.vectorize, ("auto", "vmap", "model"))
        if isinstance(self.client_chunk, str):
            check_choice("client_chunk", self.client_chunk, ("auto",))
        elif self.client_chunk is not None:
            check_int("client_chunk", self.client_chunk, low=1)
        check_int("eval_every", self.eval_every, low=0)
        check_int("threads", self.threads, low=1)
        object.__setattr__(self, "device", check_device(self.device))
        check_choice("noise_source", self.noise_source, ("secure", "seeded"))
        check_real("pp_alpha", self.pp_alpha, low=0.0)
        if self.pp_theta_reg is not None:
            check_real("pp_theta_reg", self.pp_theta_reg, low=0.0)
        if self.ball is not None:
            check_real("ball", self.ball, low=0.0, closed="neither")
        check_choice("server_optimizer", self.server_optimizer, ("none", "momentum", "adam"))
        check_real("server_lr", self.server_lr, low=0.0, closed="neither")
        check_real("server_momentum", self.server_momentum, low=0.0, high=1.0, closed="left")
        check_real("server_beta2", self.server_beta2, low=0.0, high=1.0, closed="left")
        check_real("server_adam_eps", self.server_adam_eps, low=0.0, closed="neither")
        if self.shared_params is not None:
            object.__setattr__(self, "shared_params", check_param_names(self.shared_params))
        check_int("head_epochs", self.head_epochs, low=1)
        check_choice("personal_init", self.personal_init, ("model", "billboard", "auto"))
        if self.subspace_dim is not None:
            check_int("subspace_dim", self.subspace_dim, low=1)
        if self.adaptive_clip_quantile is not None:
            check_real(
                "adaptive_clip_quantile",
                self.adaptive_clip_quantile,
                low=0.0,
                high=1.0,
                closed="neither",
            )
            if self.clip is None:
                raise InvalidParameterError(
                    "The 'adaptive_clip_quantile' parameter needs a finite initial 'clip'; got "
                    "clip=None."
                )
        check_real("adaptive_clip_lr", self.adaptive_clip_lr, low=0.0, closed="neither")
        if self.adaptive_clip_noise is not None:
            check_real("adaptive_clip_noise", self.adaptive_clip_noise, low=0.0, closed="neither")
        # the options the method takes are its declarations (Method.check_config)
        method.check_config(self)

    @property
    def epochs_mode(self) -> bool:
        """True when local work is counted in epochs (the default), False for fixed steps."""
        return self.local_steps is None

    @property
    def n_local_epochs(self) -> int:
        """Local epochs per round (1 when neither ``local_steps`` nor ``local_epochs`` is set)."""
        return 1 if self.local_epochs is None else int(self.local_epochs)

    @property
    def n_local_steps(self) -> int:
        """``local_steps`` (only meaningful when it is set)."""
        return 0 if self.local_steps is None else int(self.local_steps)

    def count_noise_std_for(self, clients_per_round: int) -> float | None:
        """σ_b of adaptive clipping (``adaptive_clip_noise``, or
        :func:`~privmtl.privacy.calibration.default_count_noise_std`); None without it."""
        if self.adaptive_clip_quantile is None:
            return None
        if self.adaptive_clip_noise is not None:
            return float(self.adaptive_clip_noise)
        return default_count_noise_std(clients_per_round)

    def method_class(self) -> Any:
        """The registered class of :attr:`method` (:func:`~privmtl.federated.methods.method_class`)."""
        return method_class(self.method)

    @property
    def is_private(self) -> bool:
        """True when the server release is a Gaussian mechanism (noise > 0 and finite clip)."""
        return bool(method_class(self.method).is_private(self))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ResolvedRun:
    """A run resolved on its data, once: what :func:`resolve` returns and every backend takes.

    A different type from the settings it was made from (a :class:`~privmtl.federated.spec.RunSpec`
    or a :class:`TrainConfig`), so that nothing resolves a run twice: the in-process
    :class:`~privmtl.federated.protocol.Trainer`, :func:`~privmtl.federated.backend.setup_run` and
    Flower's ServerApp use a ``ResolvedRun`` as it is, and resolve only what is not one.

    Attributes
    ----------
    config : TrainConfig
        The engine configuration with ``clients_per_round``, ``lam`` and ``delta`` filled in.
        Its ``noise_std`` is the σ given (0 while a target is to be met: the release calibrates
        itself to :attr:`target`, :func:`~privmtl.federated.backend.setup_run`).
    target : PrivacyTarget or None
        The target ε the run's mean release is calibrated to (ε, δ, accountant, relation and the
        sampling it is charged under); None when σ was given or the method releases nothing.
    spec : RunSpec or None
        The resolved run spec, what a run reports under ``config`` (None when resolved from a
        ``TrainConfig``).
    notes : tuple of str
        Notes the resolution leaves for the result (the paper's δ).
    reserve : DpEvent or None
        A release after the rounds (the end-of-run vote) that the target covers too.
    sampler : ClientSampler or None
        The sampler the run was resolved with (None: the configuration's).
    """

    config: TrainConfig
    target: Any = None
    spec: RunSpec | None = None
    notes: tuple[str, ...] = ()
    reserve: Any = None
    sampler: Any = None

    def with_engine(self, **changes: Any) -> ResolvedRun:
        """This run with engine settings the resolution did not read changed (the engine's name
        of a whole-run method, its own options): still resolved, not resolved again."""
        return dataclasses.replace(self, config=dataclasses.replace(self.config, **changes))

    @property
    def privacy(self) -> Any:
        """How the run sets its noise: its :attr:`target`, the σ given
        (:class:`~privmtl.privacy.calibration.GivenNoise`), or None without noise."""
        if self.target is not None:
            return self.target
        return GivenNoise(self.config.noise_std) if self.config.noise_std > 0 else None


def train_config(resolved: RunSpec, **execution: Any) -> TrainConfig:
    """The engine's :class:`TrainConfig` of a resolved spec
    (:func:`~privmtl.federated.spec.resolve_defaults`).

    ``execution`` sets the options that change how a run executes, not its result (``batched``,
    ``progress``, ``threads``, ...). Methods the engine does not have itself (``joint-dp``,
    ``pp-sgd``, ``local-all``) are configured as ``pmtl``; their trainers read the same fields.
    The config keeps the target ``epsilon``; ``noise_std`` is 0 until
    :func:`resolve_config` calibrates it to that target.
    """
    delta = resolved.delta
    if resolved.clients_per_round is None or resolved.lam is None or not isinstance(delta, float):
        raise InvalidParameterError(
            "train_config needs a resolved spec (resolve_defaults); got "
            f"clients_per_round={resolved.clients_per_round!r}, lam={resolved.lam!r}, "
            f"delta={resolved.delta!r}."
        )
    method = method_class(resolved.method)
    engine = {f.name for f in dataclasses.fields(TrainConfig)}
    # every setting the engine has, by its name (the spec's fields are the engine's), but
    # the method the engine runs and σ, whose "not given" is the engine's 0
    shared = {f.name: getattr(resolved, f.name) for f in dataclasses.fields(resolved)}
    shared = {k: v for k, v in shared.items() if k in engine}
    shared.update(method=method.engine_method or method.name, noise_std=resolved.noise_std or 0.0)
    return TrainConfig(**shared, **execution)


def resolve(
    settings: RunSpec | TrainConfig,
    num_clients: int,
    *,
    sampler: Any = None,
    method: Any = None,
    reserve: Any = None,
    execution: dict[str, Any] | None = None,
) -> ResolvedRun:
    """The one resolution of a run on ``num_clients`` clients.

    ``settings`` is a :class:`~privmtl.federated.spec.RunSpec` (its data-dependent defaults
    filled in by :func:`~privmtl.federated.spec.resolve_defaults`, then the engine configuration
    built with ``execution``'s options by :func:`train_config`) or an
    engine :class:`TrainConfig`. A target ε becomes the run's
    :class:`~privmtl.privacy.calibration.PrivacyTarget` (:func:`_resolve_engine`), which the
    release calibrates itself to. A :class:`ResolvedRun` is refused: it is resolved already.
    """
    if isinstance(settings, ResolvedRun):
        raise InvalidParameterError(
            "The 'settings' parameter must be an unresolved RunSpec or TrainConfig; got a "
            "ResolvedRun (a run is resolved once)."
        )
    m = check_int("num_clients", num_clients, low=1)
    spec: RunSpec | None = None
    notes: tuple[str, ...] = ()
    if isinstance(settings, RunSpec):
        spec = resolve_defaults(settings, m)
        notes = pmtl_delta(settings.delta, m)[1]
        config = train_config(spec, **(execution or {}))
    else:
        config = settings
        if execution:
            config = dataclasses.replace(config, **execution)
    config, target = _resolve_engine(config, m, method=method, reserve=reserve)
    return ResolvedRun(config, target, spec, notes, reserve, sampler)


def resolve_config(
    config: TrainConfig,
    num_clients: int,
    *,
    sampler: Any = None,
    method: Any = None,
    reserve: Any = None,
) -> tuple[TrainConfig, Any]:
    """:func:`resolve` of an engine configuration, as the pair (config, target)."""
    run = resolve(config, num_clients, sampler=sampler, method=method, reserve=reserve)
    return run.config, run.target


def _resolve_engine(
    config: TrainConfig,
    num_clients: int,
    *,
    method: Any = None,
    reserve: Any = None,
) -> tuple[TrainConfig, Any]:
    """``config`` with every data-dependent default of a run on ``num_clients`` clients filled in,
    and its target: the one resolution of the engine and Flower's ServerApp.

    ``clients_per_round`` (:func:`~privmtl.federated.spec.resolve_clients_per_round`: ``m`` with
    ``sampling="all"`` and for ``workshop``, ``min(20, m)`` when None, above ``m`` an error),
    ``lam`` (:func:`~privmtl.federated.spec.default_lam`) and ``delta``
    (:func:`~privmtl.federated.spec.pmtl_delta`). With ``epsilon`` set and ``noise_std`` 0 the
    target is the :class:`~privmtl.privacy.calibration.PrivacyTarget` (ε, the resolved δ, the
    accountant, the relation and the sampling); σ is not computed here: the release calibrates
    itself to the target (:func:`~privmtl.federated.backend.setup_run`). Resolving a resolved
    config changes nothing.

    ``method``: the method (name, class or object) whose declarations apply; default
    ``config.method``'s. ``reserve``: an event released after the rounds (the end-of-run vote),
    which banded noise cannot take.

    Returns
    -------
    (TrainConfig, PrivacyTarget or None)
    """
    m = int(num_clients)
    if method is None or isinstance(method, str):
        method = method_class(config.method if method is None else method)
    q = resolve_clients_per_round(
        config.clients_per_round,
        m,
        sampling=config.sampling,
        # e.g. workshop: the ball's releases cover every client
        every_client=method.full_participation or method.every_client,
        groups=config.groups,
    )
    private = config.epsilon is not None or config.noise_std > 0
    lam = default_lam(config.method, private=private) if config.lam is None else config.lam
    # an explicit δ was checked when the config was built: only None is resolved here
    delta = pmtl_delta(None, m)[0] if config.delta is None else config.delta
    config = dataclasses.replace(config, clients_per_round=q, lam=lam, delta=delta)
    if not (config.epsilon is not None and config.noise_std == 0 and method.communicates):
        return config, None
    if not method.calibrates_mean_release:  # e.g. workshop: models in the ball, not clipped
        raise InvalidParameterError(
            f"method={config.method!r} calibrates its noise to its own release (e.g. "
            "train_workshop's 'epsilon'); give its σ as 'noise_std' with a target "
            f"'epsilon'; got epsilon={config.epsilon!r}, noise_std=0."
        )
    if config.clip is None:
        raise InvalidParameterError("A target 'epsilon' needs a finite 'clip'; got clip=None.")
    if config.noise_mechanism == "banded" and reserve is not None:
        check_vote_mechanism("vote", "banded")  # the run's one event is charged whole, up front
    target = PrivacyTarget(
        config.epsilon, delta, config.accountant, config.relation, sampling=config.sampling
    )
    return config, target


def check_inputs(dataset: Any, model: Any = None) -> None:
    """Raise InvalidParameterError unless ``dataset`` is a FederatedDataset (and ``model``, when
    given, a ``torch.nn.Module``): the shared guard of every federated training entry point."""
    if not isinstance(dataset, FederatedDataset):
        raise InvalidParameterError(
            f"The 'dataset' parameter must be a FederatedDataset; got {type(dataset).__name__}."
        )
    if model is not None and not isinstance(model, nn.Module):
        raise InvalidParameterError(
            f"The 'model' parameter must be a torch.nn.Module; got {type(model).__name__}."
        )
