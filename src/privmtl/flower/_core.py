"""The PMTL protocol split into a server side and a node side, independent of the transport.

Both sides are thin: the protocol itself is :mod:`privmtl.federated.protocol`'s, written once for
the in-process :class:`~privmtl.federated.protocol.Trainer` and for Flower.

:class:`~privmtl.flower.node_clients.NodeClients` (:mod:`privmtl.flower.node_clients`) is what
one SuperNode runs: it holds the data of its clients (a partition
of the population chosen by ``partition-id``/``num-partitions``) and their persistent
personalized models, and drives the method object's client half as the in-process engine does
(:meth:`~privmtl.federated.methods.base.Method.starts`, ``client_update`` and ``keep``: starts,
update rule, Ditto's copy, message, what is kept) with the minibatch plan of :func:`~privmtl.federated.algorithms.draw_round_plan`. At the
end of the run it runs its clients' end of the run on their own data
(:func:`~privmtl.federated.finish.finish_clients`, as ``run_pmtl`` does for all clients).

:class:`ServerRun` is what the ServerApp runs: PMTL's :class:`~privmtl.federated.protocol.Curator`
(sampling, clip → mean over the fixed ``q`` → noise → write-ahead ledger → billboard) set up by
:func:`~privmtl.federated.protocol.setup_run` and
:func:`~privmtl.federated.protocol.make_curator` as the Trainer sets it up, with the Trainer's
ledger, checkpoint fingerprint, budget stop and round record, so a seeded run releases the same
billboards. The server never sees a personalized model: it receives the clients' messages and
per-client evaluation counts (and, with ``finetune="auto"``, each client's choice), and releases the
clients' end-of-run vote from the nodes' summed shares (:mod:`privmtl.flower.vote`).

The settings of a run are :class:`~privmtl.federated.spec.RunSpec`'s, every one a key of the run
configuration (:data:`RUN_DEFAULTS`, :func:`run_options`, :func:`run_spec`).

The Flower apps (:mod:`privmtl.flower.apps`) only move these objects' inputs and outputs as
``ArrayRecord``/``ConfigRecord`` messages.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import numpy as np
import torch

from privmtl._validation import check_choice, check_int, check_real
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.backend import release_noise
from privmtl.federated.config import ResolvedRun, TrainConfig, resolve
from privmtl.federated.methods import BUILTIN_METHODS, method_class
from privmtl.federated.methods import FLOWER_METHODS as _FLOWER_METHODS
from privmtl.federated.options import OPTIONS
from privmtl.federated.spec import EXECUTION, SPEC, RunSpec, resolve_defaults
from privmtl.flower.factory import checked_method
from privmtl.flower.run_info import SERVER_DIR, default_work_dir
from privmtl.flower.secagg import SECAGG_DEFAULTS

__all__ = [
    "FINISH_TIMEOUT",
    "FLOWER_FIXED",
    "FLOWER_METHODS",
    "MODELS_FILE",
    "NONE",
    "NOT_GIVEN",
    "RUN_DEFAULTS",
    "SERVER_DIR",
    "check_options",
    "default_work_dir",
    "finish_timeout",
    "from_bytes",
    "given",
    "given_spec",
    "make_config",
    "make_run",
    "partition",
    "run_options",
    "run_spec",
    "to_bytes",
]


def _key(name: str) -> str:
    return name.replace("_", "-")


NONE = ""
"""The run configuration's one encoding of None (a TOML value cannot be None): the empty string.

A run-configuration key of a setting whose type admits None (a field of
:class:`~privmtl.federated.spec.RunSpec` such as ``epsilon`` or ``clients_per_round``, and the
run's ``num-clients``, ``data-path`` and ``budget-epsilon``) is ``""`` when not given: its
default is the spec's rule (:func:`~privmtl.federated.spec.resolve_defaults`). No number stands
in for None."""


def _encode(value: Any) -> Any:
    """A setting's value in the run configuration: None as :data:`NONE`, a tuple of names as
    comma-separated names."""
    if value is None:
        return NONE
    return ",".join(str(v) for v in value) if isinstance(value, tuple) else value


def given(opts: dict[str, Any], key: str) -> Any:
    """The value of run-configuration ``key``, None when it is :data:`NONE` (not given)."""
    value = opts[key]
    return None if isinstance(value, str) and value == NONE else value


# run-config keys (pyproject [tool.flwr.app.config]) -> run_pmtl's meaning. Every RunSpec field
# is a key (its name with "-" for "_"), its default the spec's, generated from the spec's fields;
# the other keys' defaults are run_pmtl's (RunOptions, Execution) where it has the option.
RUN_DEFAULTS: dict[str, Any] = {
    "data": OPTIONS.data,
    "data-path": NONE,
    "num-clients": NONE,  # synthetic only; not given: the generator's default m
    # a table (data "table"): its columns ("feature-columns" comma-separated; "": every other)
    # and its per-client scaling; every node reads its own copy of the file
    "client-column": "",
    "label-column": "",
    "feature-columns": "",
    "scaling": OPTIONS.scaling,
    "model": OPTIONS.model,  # or a user's MODULE:FACTORY / PATH.py:FACTORY (privmtl.flower.factory)
    "model-dir": "",  # where a factory resolves; "": the process's working directory
    "model-sha256": "",  # the SHA-256 of the factory's file every machine must load
    # the method may be a user's PATH.py:NAME / MODULE:NAME (privmtl.flower.factory)
    **{_key(f.name): _encode(getattr(SPEC, f.name)) for f in dataclasses.fields(RunSpec)},
    "method-dir": "",  # where a user's method resolves; "": the process's working directory
    "method-sha256": "",  # the SHA-256 of the method's file every machine must load
    "paper-delta": False,  # True: the PMTL paper's delta = 1/m (reproductions); else DP practice
    "num-supernodes": 1,
    "work-dir": "",  # "": default_work_dir() of the machine running the ServerApp
    "on-missing": "fail",  # "fail" | "proceed"
    "round-timeout": 120.0,
    # seconds to wait for the nodes' end of the run (fine-tuning, finetune="auto"'s choice) and
    # evaluation, which trains all of a node's clients; 0: FINISH_TIMEOUT or round-timeout if longer
    "finish-timeout": 0.0,
    **SECAGG_DEFAULTS,
    "budget-epsilon": _encode(OPTIONS.budget_epsilon),  # not given: no budget
    "checkpoint-every": EXECUTION.checkpoint_every,
    "resume": EXECUTION.resume,
    # True: the ServerApp writes its released global model and every node its clients' final
    # models, each in its own storage (MODELS_FILE), for privmtl.flower.saved to assemble
    "save-models": False,
    # a file (.csv or .parquet) the ServerApp writes one row per client to; "": none
    "per-client": "",
    # seconds to wait for the nodes to load their data and describe themselves; 0: derived
    # from the population's size (discovery_timeout)
    "discovery-timeout": 0.0,
    # where every node runs its clients' step (privmtl pmtl's --device: auto, cpu, cuda, cuda:N);
    # a node that does not have it refuses the run in one line
    "device": EXECUTION.device,
}

FINISH_TIMEOUT = 600.0
"""Seconds the ServerApp waits at least for the nodes' end of the run when ``finish-timeout`` is 0
(a node fine-tunes every one of its clients: far more work than one round's client step)."""

FINISH_SECONDS_PER_CLIENT = 0.05
"""Seconds a node may take per client it serves for its end of the run (fine-tuning, the vote,
scoring) when ``finish-timeout`` is 0: a generous bound (the in-process end of run takes a few
ms per client on a loaded 2-core machine), so that a large node is waited for instead of failing."""


def finish_timeout(opts: dict[str, Any], clients_per_node: int = 0) -> float:
    """The seconds to wait for the nodes' end of the run and evaluation: the run configuration's
    ``finish-timeout`` when given (> 0), else derived from the work, :data:`FINISH_SECONDS_PER_CLIENT`
    times the clients of the largest node, and at least :data:`FINISH_TIMEOUT` and
    ``round-timeout``."""
    given = float(opts["finish-timeout"])
    if given > 0:
        return given
    work = FINISH_SECONDS_PER_CLIENT * max(0, int(clients_per_node))
    return max(FINISH_TIMEOUT, float(opts["round-timeout"]), work)


NOT_GIVEN: dict[str, Any] = {
    f.name: NONE for f in dataclasses.fields(RunSpec) if getattr(SPEC, f.name) is None
}
"""The RunSpec fields whose default is None, each encoded as :data:`NONE` (not given)."""


MODELS_FILE = "final-models.pt"
"""The end-of-run models a run with ``save-models`` leaves: the ServerApp's released global model
in ``<work-dir>/server``, each SuperNode's own clients' final models in its ``state-dir``
(:meth:`ServerRun.models_state`, :meth:`NodeClients.save_models`)."""


def run_options(run_config: dict[str, Any]) -> dict[str, Any]:
    """The run configuration with every key present (defaults filled in), ready for TOML.

    Keys are :data:`RUN_DEFAULTS`'s; a :class:`~privmtl.federated.spec.RunSpec` field is also
    accepted by its own name (``personal_init`` for ``personal-init``). A value None is "not
    given" (the default); ``delta="paper"`` is ``paper-delta``;
    ``shared_params`` may be a sequence of names. Keys that are not options are ignored.
    """
    out = dict(RUN_DEFAULTS)
    for name, value in run_config.items():
        key = name if name in RUN_DEFAULTS else _key(name)
        if key not in RUN_DEFAULTS:
            continue
        field = key.replace("-", "_")
        if value is None:  # not given: the default
            value = NOT_GIVEN.get(field, RUN_DEFAULTS[key])
        elif field == "delta" and value == "paper":
            out["paper-delta"], value = True, NONE
        elif field == "shared_params" and not isinstance(value, str):
            value = ",".join(str(v) for v in value)
        out[key] = value
    return out


def check_options(run_config: dict[str, Any], num_supernodes: int) -> None:
    """Refuse invalid run options before any process starts (InvalidParameterError)."""
    run_config = run_options(run_config)
    check_int("num_supernodes", num_supernodes, low=1)
    check_int("rounds", run_config["rounds"], low=1)
    if given(run_config, "clients-per-round") is not None:  # not given: the spec's default
        check_int("clients_per_round", run_config["clients-per-round"], low=1)
    check_int("seed", run_config["seed"], low=0)
    spec = given_spec(run_config)  # every RunSpec setting, checked; other methods refused
    if bool(run_config.get("secagg")) and spec.adaptive_clip_quantile is not None:
        raise InvalidParameterError(
            "The 'adaptive_clip_quantile' parameter needs every message's norm, which secure "
            "aggregation hides from the curator; give it without secagg, got "
            f"adaptive_clip_quantile={spec.adaptive_clip_quantile!r} with secagg=True."
        )
    num = int(given(run_config, "num-clients") or 0)
    if num:
        check_int("num_clients", num, low=num_supernodes)
        if run_config.get("data") != "synthetic":
            raise InvalidParameterError(
                "The 'num_clients' parameter applies to --data synthetic only; got data="
                f"{run_config.get('data')!r}."
            )
        q = int(given(run_config, "clients-per-round") or 0)
        if q > num:  # known here: no process starts for a run that every node would refuse
            raise InvalidParameterError(
                "The 'clients_per_round' parameter must be at most the number of clients "
                f"m={num} of the data; got {q}."
            )
    check_real("clip", run_config["clip"], low=0.0, closed="neither")
    eps, std = given(run_config, "epsilon"), given(run_config, "noise-std")
    if eps is not None:
        check_real("epsilon", eps, low=0.0, closed="neither")
    if std is not None:
        check_real("noise_std", std, low=0.0)
    check_real("round_timeout", run_config["round-timeout"], low=0.0, closed="neither")
    check_real("finish_timeout", run_config["finish-timeout"], low=0.0)
    check_int("checkpoint_every", run_config["checkpoint-every"], low=1)
    budget = given(run_config, "budget-epsilon")
    if budget is not None:
        check_real("budget_epsilon", budget, low=0.0, closed="neither")
    check_choice("on_missing", run_config["on-missing"], ("fail", "proceed"))


FLOWER_FIXED: dict[str, Any] = {}
"""Settings of the run spec that a Flower run does not take as options: none (every RunSpec field
is a run-configuration key; :data:`FLOWER_METHODS` are the methods a Flower run has)."""

FLOWER_METHODS = _FLOWER_METHODS
"""The methods of a Flower run: those that declare the ``"flower"`` backend
(:attr:`~privmtl.federated.methods.base.Method.backends`; the others are refused by
:func:`run_spec`)."""


def _given(opts: dict[str, Any], field: str) -> Any:
    """The value of RunSpec ``field`` in the run configuration, None when not given
    (:data:`NONE`)."""
    return given(opts, _key(field))


def run_spec(opts: dict[str, Any], m: int) -> RunSpec:
    """The resolved :class:`~privmtl.federated.spec.RunSpec` of a run with ``m`` clients.

    Every field is read from the run configuration by its name (:func:`run_options`); "not given"
    values are the spec's defaults, resolved by :func:`~privmtl.federated.spec.resolve_defaults`
    as ``run_pmtl`` resolves them (``personal_init="auto"`` is resolved by the ServerApp once the
    noise is calibrated). An explicit ``clients-per-round`` above ``m`` is an error, as in every
    run (:func:`~privmtl.federated.spec.resolve_clients_per_round`). A setting
    a Flower run does not have (a method other than :data:`FLOWER_METHODS`) is refused with an
    :class:`~privmtl.exceptions.InvalidParameterError` naming it.
    """
    return resolve_defaults(given_spec(opts), m)


def given_spec(opts: dict[str, Any]) -> RunSpec:
    """The :class:`~privmtl.federated.spec.RunSpec` the run configuration gives (checked, before
    the data-dependent defaults are resolved); a method a Flower run does not have is refused."""
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(RunSpec):
        fields[f.name] = _given(opts, f.name)
    fields["method"], _ = checked_method(opts)  # a user's method file: loaded, by its name
    if bool(opts["paper-delta"]):
        if fields["delta"] is not None:
            raise InvalidParameterError(
                "Give at most one of 'delta' and 'paper_delta'; got "
                f"delta={fields['delta']!r}, paper_delta=True."
            )
        fields["delta"] = "paper"
    shared = fields["shared_params"]
    if shared is not None:
        fields["shared_params"] = tuple(n.strip() for n in str(shared).split(",") if n.strip())
    spec = RunSpec(**fields)
    cls = method_class(spec.method)
    if "flower" not in cls.backends:
        if spec.method not in BUILTIN_METHODS:  # a user's method declares where it runs
            raise InvalidParameterError(
                f"The 'method' parameter on Flower needs a method whose backends include "
                f"'flower'; got {spec.method!r} ({cls.__qualname__}) with backends "
                f"{tuple(cls.backends)!r} (declare backends = ('in-process', 'flower') when its "
                "hooks only train, keep and send the clients' models)."
            )
        raise InvalidParameterError(
            f"The 'method' parameter must be one of {list(FLOWER_METHODS)} on Flower; got "
            f"{spec.method!r} (run it in process: privmtl pmtl --method {spec.method})."
        )
    return spec


def make_run(opts: dict[str, Any], m: int, reserve: Any = None) -> ResolvedRun:
    """The one resolution of a run with ``m`` clients (:func:`~privmtl.federated.config.resolve`
    of the run configuration's :func:`given_spec`), as ``run_pmtl`` resolves it: the resolved
    spec, and the engine configuration with the target ``epsilon`` kept and ``noise_std``
    calibrated to it when one is given (``reserve``: the end-of-run vote's event, composed in)."""
    return resolve(
        given_spec(opts), m, reserve=reserve,
        execution={"batched": True, "progress": False, "threads": 1},
    )  # fmt: skip


def make_config(opts: dict[str, Any], m: int) -> tuple[TrainConfig, float]:
    """The resolved :class:`TrainConfig` of :func:`make_run` and the noise standard deviation of
    the released mean."""
    run = make_run(opts, m)
    sigma = release_noise(run, m)  # the release's σ for the run's target (or the σ given)
    return dataclasses.replace(run.config, noise_std=sigma), sigma


def partition(m: int, partition_id: int, num_partitions: int) -> np.ndarray:
    """The clients (global indices) that node ``partition_id`` of ``num_partitions`` serves."""
    if not 0 <= partition_id < num_partitions:
        raise InvalidParameterError(
            "The 'partition-id' node config must be in [0, num-partitions); got "
            f"partition-id={partition_id}, num-partitions={num_partitions}."
        )
    if num_partitions > m:
        raise InvalidParameterError(
            f"The 'num-partitions' node config must be <= the number of clients ({m}); "
            f"got {num_partitions}."
        )
    return np.array_split(np.arange(m), num_partitions)[partition_id]


#: The sub-folder of a node's storage that holds its clients' personalized models.
PERSONAL_DIR = "personal"


def to_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def from_bytes(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True)
