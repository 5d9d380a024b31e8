r"""Federated methods as objects: one class per method, and the registry of their names.

Every method is a :class:`~privmtl.federated.methods.base.Method`: declarations (what a client
starts from, whether it communicates, whether its output is personalized, how a release updates
the billboard, its message, which backends run it) and hooks for its server half, its client
half and its end of run. The backends (the in-process
:class:`~privmtl.federated.protocol.Trainer` and Flower's ServerApp and ClientApp) drive any
method through these hooks; the curator's clip → mean → noise → ledger record is theirs.

============  ==================  ====================  ==================  ===============
method        client starts from  local rule            message             billboard
============  ==================  ====================  ==================  ===============
pmtl          its own model       ProxStep(λ, w̃)        Δw or w − w̃         w̃ + release
fedavg        w̃                   ProxStep(0)           w − w̃               w̃ + release
fedprox       w̃                   ProxStep(μ, w̃)        w − w̃               w̃ + release
local         its own model       ProxStep(0)           (none)              (none)
joint-dp      its released block  ProxStep(λ, mean)     w − block           blocks + release
pp-sgd        (w̃, its own θ)      SplitStep(α, μ)       u − w̃               w̃ + release
workshop      its own model       ProxStep(λ, w̃, B)     w (the model)       release
fedrep        (w̃, its own head)   head, then w̃'s part   φ − w̃ (φ = rep.)    w̃ + release
============  ==================  ====================  ==================  ===============

``pmtl``'s message is Δw (``server_update="delta"``), w − w̃ (``"offset"``) or, with ``"ditto"``,
v − w̃ for a copy v of w̃ trained on the same minibatches with ProxStep(0). ``local-all`` (every
client trains alone, :func:`~privmtl.federated.end_of_run.local.train_local`) and ``clusters`` (one billboard
per fixed cluster, :func:`~privmtl.federated.clusters.train_clusters`) are whole runs of their
own, which the runner above the backends runs (:func:`~privmtl.federated.runner.fit`): the
methods import no backend.

Your own method: subclass :class:`~privmtl.federated.methods.base.Method` and pass the class (or
an instance) as ``run_pmtl(method=...)``, or ``privmtl pmtl --method FILE.py:NAME``; it runs
with the same release, accounting, ledger and checkpointing (``examples/own_method.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from privmtl._validation import check_choice
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.methods.base import ClientStep, Method, TrainFn
from privmtl.federated.methods.clusters import Clusters
from privmtl.federated.methods.fedavg import FedAvg, FedProx
from privmtl.federated.methods.fedrep import FedRep
from privmtl.federated.methods.joint_dp import JointDP
from privmtl.federated.methods.local import Local, LocalAll
from privmtl.federated.methods.pmtl import PMTL
from privmtl.federated.methods.pp_sgd import PPSGD
from privmtl.federated.methods.workshop import Workshop

if TYPE_CHECKING:
    from privmtl.federated.config import TrainConfig

__all__ = [
    "BUILTIN_METHODS",
    "ENGINE_METHODS",
    "FLOWER_METHODS",
    "RUN_METHODS",
    "ClientStep",
    "Method",
    "MethodName",
    "TrainFn",
    "engine_method_class",
    "engine_method_names",
    "get_method",
    "method_class",
    "register_method",
]

BUILTIN_METHODS: dict[str, type[Method]] = {
    cls.name: cls
    for cls in (PMTL, FedAvg, FedProx, Local, JointDP, PPSGD, LocalAll, Workshop, FedRep, Clusters)
}
"""The registry of privmtl's methods: the one list of their names."""

RUN_METHODS = tuple(n for n, c in BUILTIN_METHODS.items() if c.in_runs)
"""The methods of a run (``privmtl pmtl --method``, :func:`~privmtl.experiments.pmtl.run_pmtl`)."""
ENGINE_METHODS = tuple(n for n, c in BUILTIN_METHODS.items() if c.in_engine)
"""The methods of the in-process engine (``TrainConfig.method``)."""
FLOWER_METHODS = tuple(n for n, c in BUILTIN_METHODS.items() if "flower" in c.backends)
"""The methods a Flower run has (those that declare the ``"flower"`` backend)."""

# users' own methods, by name: a class or an instance (copied and bound to each run's config)
_OWN: dict[str, type[Method] | Method] = {}


def _registered() -> dict[str, type[Method] | Method]:
    return {**BUILTIN_METHODS, **_OWN}


def engine_method_names() -> tuple[str, ...]:
    """The names ``TrainConfig.method`` takes: the engine's methods and the registered own ones."""
    return ENGINE_METHODS + tuple(n for n in _OWN if n not in ENGINE_METHODS)


def register_method(method: type[Method] | Method) -> type[Method]:
    """Register a user's method (a :class:`Method` subclass or instance) under its ``name``.

    Registering makes its name a valid ``TrainConfig.method``; a name of privmtl's own methods
    is refused unless it is that very class. Returns the method's class.
    """
    cls = method if isinstance(method, type) else type(method)
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise InvalidParameterError(
            "The 'method' parameter must be a method name, a subclass of "
            f"privmtl.federated.methods.Method or an instance of one; got {method!r}."
        )
    name = cls.name
    if not isinstance(name, str) or not name or ":" in name:
        raise InvalidParameterError(
            f"The 'name' of method class {cls.__name__} must be a non-empty string without "
            f"':'; got {name!r}."
        )
    if name in BUILTIN_METHODS:
        if BUILTIN_METHODS[name] is cls:
            return cls
        raise InvalidParameterError(
            f"The 'name' of method class {cls.__name__} must not be one of privmtl's methods "
            f"{list(BUILTIN_METHODS)}; got {name!r}."
        )
    _OWN[name] = method
    return cls


def engine_method_class(name: str) -> type[Method]:
    """The class of engine method ``name`` (``TrainConfig.method``), the name checked against
    :func:`engine_method_names`."""
    check_choice("method", name, engine_method_names())
    return method_class(name)


def method_class(name: str) -> type[Method]:
    """The class of method ``name`` (privmtl's or a registered own method)."""
    known = _registered()
    check_choice("method", name, known)
    found = known[name]
    return found if isinstance(found, type) else type(found)


def get_method(method: str | type[Method] | Method, config: TrainConfig) -> Method:
    """The method object of a run with ``config``.

    ``method``: a name (privmtl's or a registered own method), a :class:`Method` subclass
    (registered, then made from ``config``) or an instance (registered, then copied and bound
    to ``config``).
    """
    if not isinstance(method, str):
        register_method(method)
        found: type[Method] | Method = method
    else:
        method_class(method)
        found = _registered()[method]
    if isinstance(found, type):
        return found(config)
    return found.with_config(config)


class MethodName:
    """Constraint of a method name (:func:`~privmtl._validation.validate_params`): privmtl's run
    methods, the registered own methods, and ``PATH.py:NAME`` / ``MODULE:NAME`` (loaded by the
    run, :func:`~privmtl.federated.methods.loading.load_method`)."""

    def check(self, name: str, value: Any) -> Any:
        """Return the value or raise InvalidParameterError."""
        if isinstance(value, str) and ":" in value:
            return value
        return check_choice(name, value, RUN_METHODS + tuple(_OWN))

    def describe(self) -> str:
        """Human-readable form used when several constraints are allowed."""
        return "a method name"
