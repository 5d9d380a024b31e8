r"""The :class:`Method` base class: what a federated method declares and its two halves.

A method is a client half (what a client starts from, its local update, its message, what it
keeps) and a server half (how the release is set up and how it updates the billboard), as in
pfl-research's ``FederatedAlgorithm``. A backend drives it: the in-process engine
(:class:`~privmtl.federated.protocol.Trainer`) and Flower's ServerApp and ClientApp
(:mod:`privmtl.flower`) call the same hooks and never name a method. The curator's clip →
mean → noise → ledger record of every release is the backend's and no method changes it: a
method chooses *what* is released (its message), never how it is protected.

Every hook has a default written for the common case (a billboard that adds the releases,
clients that keep their own model); a method overrides what it does differently.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

import torch

from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import Params
from privmtl.federated.client import ProxStep, UpdateRule
from privmtl.federated.client_models import StoredModels
from privmtl.federated.store import ClientStore

if TYPE_CHECKING:
    from privmtl.federated.config import ResolvedRun, TrainConfig

__all__ = [
    "DEFAULT_LAM_NONPRIVATE",
    "DEFAULT_LAM_PRIVATE",
    "ClientStep",
    "Method",
    "State",
    "TrainFn",
    "shared_names",
    "stack",
    "train_sets",
]

#: Default λ: PMTL's mean-regularization weight chosen on validation accuracy in the committed
#: FEMNIST sweep (benchmarks/results/pmtl_femnist_tradeoff.md: 0.001 at every private ε, within
#: one seed's noise of the best at ε = 4; 1.0 without noise).
DEFAULT_LAM_PRIVATE = 0.001
DEFAULT_LAM_NONPRIVATE = 1.0

State = ClientStore
"""The clients' stored state: a :class:`~privmtl.federated.store.ClientStore` by field
(``"personal"``: their models, ``"theta"``: PP-SGD's local part), rows only for the clients
written (:meth:`~privmtl.federated.store.ClientStore.written`: whether a client took part
before); a checkpoint saves its :meth:`~privmtl.federated.store.ClientStore.state_dict`."""


class TrainFn(Protocol):
    """``train(starts, rule, *, stream=None, epochs=None) -> (news, losses)``: local SGD of the
    round's clients as the backend runs it (in process: the round's plan, threads; on a Flower
    node: its own clients). ``stream`` and ``epochs`` ask for other minibatches than the round's
    (another random stream of :func:`~privmtl.federated.algorithms.draw_round_plan`, that many
    epochs): FedRep's head training."""

    def __call__(
        self,
        starts: Params,
        rule: UpdateRule,
        *,
        stream: int | None = None,
        epochs: int | None = None,
    ) -> tuple[Params, list[float]]: ...


def train_sets(
    train: TrainFn, sets: Sequence[tuple[Params, UpdateRule]]
) -> list[tuple[Params, list[float]]]:
    """``[train(starts, rule) for starts, rule in sets]``: several sets of states of the round's
    clients trained on the round's minibatches, each with its own rule. A backend whose train
    function has a ``sets`` attribute (the in-process engine, a round in one pass) trains them
    together (:func:`~privmtl.federated.client.local_sgd_sets`: each set's mathematics, the
    last bits may differ)."""
    together = getattr(train, "sets", None)
    if together is not None:
        return cast(list[tuple[Params, list[float]]], together(sets))
    return [train(starts, rule) for starts, rule in sets]


@dataclass
class ClientStep:
    """One round of the sampled clients: what they keep, what they send, their training loss.

    ``kept`` is the clients' new state (stacked ``(K, ...)``: personalized models, PP-SGD's
    ``θ`` under ``split_names``), ``messages`` their messages (the shared parameters only).
    """

    kept: Params
    messages: Params
    losses: list[float]


def stack(params: Params, m: int) -> Params:
    """``params`` repeated ``m`` times along a new first axis."""
    return {n: p.unsqueeze(0).repeat((m,) + (1,) * p.ndim) for n, p in params.items()}


def shared_names(init: Params, shared: Sequence[str] | None) -> list[str]:
    """The parameters that go through the billboard (all when ``shared`` is None)."""
    if shared is None:
        return list(init)
    names = [n for n in init if any(n == s or n.startswith(s + ".") for s in shared)]
    unknown = [s for s in shared if not any(n == s or n.startswith(s + ".") for n in init)]
    if unknown or not names:
        raise InvalidParameterError(
            f"The 'shared_params' parameter must name parameters (or module prefixes) of the "
            f"model {list(init)}; got {list(shared)} (unmatched: {unknown})."
        )
    return names


def _broadcast(billboard: Params, k: int) -> Params:
    return {n: p.unsqueeze(0).expand((k, *p.shape)).clone() for n, p in billboard.items()}


class Method:
    r"""A federated method: declarations, a server half, a client half and an end of run.

    Subclass it to bring your own method (``examples/own_method.py``): set :attr:`name`, the
    declarations that differ, and override the hooks that differ. An instance is made from the
    run's resolved :class:`~privmtl.federated.config.TrainConfig` (``Method(config)``) and holds
    it as :attr:`config`.

    Declarations (class attributes)
    -------------------------------
    name : str
        The method's name (``--method``, ``TrainConfig.method``, the results' ``method``).
    start : {"own", "global", "block", "split"}
        What a sampled client starts from: its own model, the billboard, its block of the
        billboard (joint-dp) or the billboard plus its own local part (PP-SGD).
    communicates : bool
        False for a method whose clients never send anything (no release, ε = 0).
    personalized : bool
        Whether the output is ``m`` personalized models (else the billboard).
    billboard_update : {"add", "replace", "blocks"}
        How a release enters the billboard (:class:`~privmtl.federated.protocol.Curator`).
    message : {"offset", "delta", "model", "ditto"}
        What a client sends: its model minus the billboard, minus its start, the model itself,
        or Ditto's copy trained without the pull, minus the billboard.
    pulls : bool
        Whether the local rule pulls towards an anchor with weight ``lam``.
    backends : tuple of str
        Which backends run it: ``"in-process"`` and/or ``"flower"``.

    Client state
    ------------
    What the clients keep between rounds is a :class:`~privmtl.federated.store.ClientStore`
    (:data:`State`): :meth:`initial_state` builds it (fields and their default rows), :meth:`starts`
    gathers the sampled clients' rows, :meth:`keep` scatters their new ones and :meth:`outputs`
    materializes them at the end of the run. Only the clients written hold rows of their own, so
    a method never holds ``(m, ...)`` state for clients that were never sampled.

    Whole run
    ---------
    A method imports no backend: :func:`privmtl.federated.runner.fit` runs it (the in-process
    backend round by round, or the whole-run loop of joint-dp, pp-sgd, local-all and clusters).
    A method of your own with a loop of its own defines ``fit(dataset, model, **run) ->
    TrainResult``, which the runner then calls instead.
    """

    name: ClassVar[str] = ""
    start: ClassVar[str] = "own"
    communicates: ClassVar[bool] = True
    personalized: ClassVar[bool] = True
    billboard_update: ClassVar[str] = "add"
    message: ClassVar[str] = "offset"
    pulls: ClassVar[bool] = False
    backends: ClassVar[tuple[str, ...]] = ("in-process",)
    #: Whether ``lam`` is among the hyper-parameters a sweep tunes for it.
    tunes_lam: ClassVar[bool] = False
    #: Whether every client takes part in every round whatever ``sampling`` says.
    full_participation: ClassVar[bool] = False
    #: Whether ``shared_params`` (partial sharing) applies.
    partial_sharing: ClassVar[bool] = False
    #: Whether ``personal_init="billboard"`` applies (a client's first start is the billboard).
    joins_from_billboard: ClassVar[bool] = True
    #: Whether it is a method of a run (``privmtl pmtl --method``) and of the engine
    #: (``TrainConfig.method``, :class:`~privmtl.federated.protocol.Trainer`).
    in_runs: ClassVar[bool] = True
    in_engine: ClassVar[bool] = True
    #: The ``TrainConfig.method`` a run configures it with (None: its own name), for whole-run
    #: methods whose trainers set their own.
    engine_method: ClassVar[str | None] = None
    #: Whether a target ε is calibrated for the engine's clipped-mean release (False: the method
    #: calibrates its own release, e.g. workshop's models in a ball).
    calibrates_mean_release: ClassVar[bool] = True
    #: Whether every client trains (``clients_per_round`` does not apply).
    every_client: ClassVar[bool] = False
    #: The models (``--model`` names) it runs with; None: any.
    models: ClassVar[tuple[str, ...] | None] = None
    #: What the guarantee of its release covers.
    notion: ClassVar[str] = "JDP (billboard)"
    #: Keys of :meth:`extra` that a run's JSON reports.
    result_keys: ClassVar[tuple[str, ...]] = ()
    #: Run options its whole run reads besides the backend's (e.g. ``local_select``;
    #: :func:`privmtl.federated.runner.fit`).
    fit_options: ClassVar[tuple[str, ...]] = ()

    run: Any = None
    """The :class:`~privmtl.federated.config.ResolvedRun` the method is bound to
    (:meth:`with_run`), which the runner (:func:`~privmtl.federated.runner.fit`) hands to the
    backend as it is: None when bound to a configuration only (the backend then resolves it)."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    def with_config(self, config: TrainConfig) -> Method:
        """A copy of this method bound to ``config`` (the run's resolved configuration)."""
        out = copy.copy(self)
        out.config = config
        return out

    def with_run(self, run: ResolvedRun) -> Method:
        """A copy of this method bound to a resolved run (its configuration and the run itself,
        which the runner passes on so that the backend does not resolve it again)."""
        out = self.with_config(run.config)
        out.run = run
        return out

    def settings(self) -> TrainConfig | ResolvedRun:
        """What the backend is given: the bound :class:`ResolvedRun` while the method's
        configuration is its own, else the configuration (resolved by the backend)."""
        run = self.run
        return run if run is not None and run.config is self.config else self.config

    # ------------------------------------------------------------------ resolution
    @classmethod
    def default_lam(cls, *, private: bool) -> float:
        """The λ used when none is given."""
        return DEFAULT_LAM_PRIVATE if private else DEFAULT_LAM_NONPRIVATE

    @classmethod
    def adds_releases(cls) -> bool:
        """Whether the billboard adds the releases (server optimizer, subspace and adaptive
        clipping apply)."""
        return cls.communicates and cls.billboard_update == "add"

    @classmethod
    def check_config(cls, config: TrainConfig) -> None:
        """Refuse the options of ``config`` this method does not take (``TrainConfig``'s
        checks of the method's declarations)."""
        if config.server_optimizer != "none" and not cls.adds_releases():
            raise InvalidParameterError(
                "The 'server_optimizer' parameter needs a method whose billboard adds the "
                f"releases (pmtl, fedavg, fedprox, pp-sgd); got method={config.method!r}."
            )
        if config.shared_params is not None and not cls.partial_sharing:
            raise InvalidParameterError(
                "The 'shared_params' parameter (partial sharing) needs method='pmtl' or "
                f"'fedrep' (clients keep their personal layers); got method={config.method!r}."
            )
        if config.noise_mechanism == "banded" and cls.billboard_update == "replace":
            raise InvalidParameterError(
                "The 'noise_mechanism' parameter 'banded' needs a method whose billboard adds "
                "the releases (banded noise lowers the error of their running sums); "
                f"method={config.method!r} uses each release as it is, where banded noise is "
                "never below independent noise; got noise_mechanism='banded'."
            )
        for name in ("subspace_dim", "adaptive_clip_quantile"):
            if getattr(config, name) is not None and not cls.adds_releases():
                raise InvalidParameterError(
                    f"The '{name}' parameter needs a method whose billboard adds the releases "
                    f"(pmtl, fedavg, fedprox, pp-sgd); got method={config.method!r}."
                )

    @classmethod
    def is_private(cls, config: TrainConfig) -> bool:
        """True when the release is a Gaussian mechanism (noise > 0 and a finite clip)."""
        return cls.communicates and config.noise_std > 0 and config.clip is not None

    @classmethod
    def guarantee_sampling(cls, config: TrainConfig) -> str:
        """The sampling of the release's privacy event."""
        return "all" if cls.full_participation else config.sampling

    # ------------------------------------------------------------------ server half
    @property
    def prox_weight(self) -> float:
        """ρ of the local rule: ``lam`` when the method pulls, else 0 (a config not yet resolved,
        ``lam=None``, has no pull)."""
        return float(self.config.lam or 0.0) if self.pulls else 0.0

    def setup_warnings(self, q: int, m: int) -> None:
        """Warn about settings that run but may not do what the user wants."""

    def prepare_init(self, init: Params) -> Params:
        """The initial model every client and the billboard start from."""
        return init

    def shared_names(self, init: Params) -> list[str]:
        """The parameters that go through the billboard."""
        return shared_names(init, self.config.shared_params)

    def release_settings(
        self, clip: float | None, sigma: float, q: int
    ) -> tuple[Any, float, float]:
        """``(clip, σ, divisor)`` of every release (the config's, divided by the fixed ``q``)."""
        return clip, sigma, float(q)

    def initial_billboard(self, init: Params, shared: Sequence[str], m: int) -> Params:
        """The billboard before the first release: the shared part of the initial model."""
        return {n: init[n] for n in shared}

    # ------------------------------------------------------------------ client half
    def initial_state(
        self, init: Params, m: int, initial_state: dict[str, Any] | None = None
    ) -> State:
        """The ``m`` clients' stored state before the first round: a store whose ``"personal"``
        field defaults to the initial model (``start="own"``), no row written."""
        fields = {"personal": init} if self.start == "own" else {}
        return ClientStore(m, fields)

    @property
    def joins_billboard(self) -> bool:
        """Whether a client's first start is the billboard (``personal_init="billboard"`` for
        a method that communicates and :attr:`joins_from_billboard`)."""
        joins = self.joins_from_billboard and self.communicates
        return joins and self.config.personal_init == "billboard"

    def starts(
        self, billboard: Params, sel: torch.Tensor, state: State
    ) -> tuple[Params, Params | None]:
        """Start states of the clients ``sel`` (indices into ``state``) and the anchor of the
        local rule.

        ``"own"``: a client's own model (the billboard at its first participation with
        ``personal_init="billboard"``, :attr:`joins_billboard`); ``"global"``: the billboard.
        """
        anchor = billboard if self.prox_weight else None
        if self.start == "global":
            return _broadcast(billboard, len(sel)), anchor
        starts = state.gather("personal", sel)
        if self.joins_billboard:  # first participation: start from the billboard
            new = ~state.written(sel)
            if bool(new.any()):
                for n, b in billboard.items():
                    starts[n][new] = b
        return starts, anchor

    def rule(self, anchor: Params | None) -> UpdateRule:
        """The local update rule (:mod:`privmtl.federated.client`): SGD with the pull."""
        return ProxStep(lr=self.config.lr, anchor=anchor, weight=self.prox_weight)

    def messages(
        self, billboard: Params, shared: Sequence[str], starts: Params, news: Params
    ) -> Params:
        """The clients' messages (shared parameters only) from their starts and new states."""
        if self.message == "model":
            return {n: news[n] for n in shared}
        if self.message == "delta":
            return {n: news[n] - starts[n] for n in shared}
        return {n: news[n] - billboard[n] for n in shared}

    def client_update(
        self,
        billboard: Params,
        shared: Sequence[str],
        starts: Params,
        anchor: Params | None,
        train: TrainFn,
    ) -> ClientStep:
        """Local training from ``starts`` with :meth:`rule`; the clients keep the result and
        send :meth:`messages`."""
        news, losses = train(starts, self.rule(anchor))
        return ClientStep(news, self.messages(billboard, shared, starts, news), losses)

    def keep(self, state: State, sel: torch.Tensor, kept: Params) -> None:
        """The clients ``sel`` keep their new state (in place; they are then written)."""
        if "personal" in state:
            state.scatter("personal", sel, {n: kept[n] for n in state.names("personal")})

    @property
    def keeps_model(self) -> bool:
        """Whether a client keeps its own model between rounds."""
        return self.start == "own"

    def message_template(self, billboard: Params) -> Params:
        """One message's shapes (an empty round sends zero messages of these shapes)."""
        return billboard

    # ------------------------------------------------------------------ end of run
    def outputs(
        self,
        billboard: Params,
        state: State,
        *,
        personal_init: Params,
        names: Sequence[str],
        round: int,
        train_all: TrainFn,
    ) -> tuple[Params | None, Params]:
        """``(personalized models or None, global model)`` at the end of round ``round``.

        The global model is the billboard, with the initial values of the parameters that are
        not shared (``personal_init``); clients that never took part hold the billboard they
        would download. ``train_all`` trains all ``m`` clients (a function of the releases and
        each client's own data: post-processing).
        """
        board = billboard
        if personal_init:  # partial sharing: the global model keeps the initial personal part
            board = {n: board[n] if n in board else personal_init[n] for n in names}
        if "personal" not in state:
            return None, board
        # read a block of clients at a time by the end of run: never every client's model at once
        fill = {n: board[n] for n in state.names("personal")} if self.joins_billboard else None
        return StoredModels(state, "personal", fill), board

    def extra(self, shared: Sequence[str], names: Sequence[str]) -> dict[str, Any]:
        """What the run's result reports beyond the common keys."""
        return {}


MethodFactory = Callable[["TrainConfig"], Method]
