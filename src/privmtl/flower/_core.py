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
import json
import math
import secrets
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privmtl.checkpoint import (
    has_checkpoint,
    ledger_seen,
    load_checkpoint,
    save_checkpoint,
    write_atomic,
)
from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.federated.algorithms import (
    Params,
)
from privmtl.federated.backend import (
    budget_stops,
    fingerprint_base,
    make_curator,
    new_ledger,
    release_noise,
    round_record,
    run_result,
    setup_run,
)
from privmtl.federated.config import ResolvedRun, TrainConfig, TrainResult, resolve
from privmtl.federated.methods import BUILTIN_METHODS, method_class
from privmtl.federated.methods import FLOWER_METHODS as _FLOWER_METHODS
from privmtl.federated.options import OPTIONS
from privmtl.federated.spec import EXECUTION, SPEC, RunSpec, resolve_defaults
from privmtl.flower.secagg import SECAGG_DEFAULTS
from privmtl.locking import DirectoryLock
from privmtl.privacy.ledger import PrivacyLedger
from privmtl.privacy.noise import make_noise_source

__all__ = [
    "FINISH_TIMEOUT",
    "FLOWER_FIXED",
    "FLOWER_METHODS",
    "MODELS_FILE",
    "NONE",
    "NOT_GIVEN",
    "RUN_DEFAULTS",
    "SERVER_DIR",
    "ServerRun",
    "check_options",
    "default_work_dir",
    "discovery_timeout",
    "finish_timeout",
    "from_bytes",
    "given",
    "given_spec",
    "make_config",
    "make_run",
    "partition",
    "read_run_info",
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
}

FINISH_TIMEOUT = 600.0
"""Seconds the ServerApp waits at least for the nodes' end of the run when ``finish-timeout`` is 0
(a node fine-tunes every one of its clients: far more work than one round's client step)."""


def finish_timeout(opts: dict[str, Any]) -> float:
    """The seconds to wait for the nodes' end of the run and evaluation."""
    given = float(opts["finish-timeout"])
    return given if given > 0 else max(FINISH_TIMEOUT, float(opts["round-timeout"]))


DISCOVERY_SECONDS_PER_CLIENT = 5e-3
"""Seconds a node may take per client of the population to load (or generate) its data before it
describes itself: a generous bound (the synthetic population takes about 1 ms per client on a
loaded 2-core machine), so that a large population is waited for instead of failing."""


def discovery_timeout(opts: dict[str, Any]) -> float:
    """The seconds the ServerApp waits for the nodes to connect and describe themselves: the
    run configuration's ``discovery-timeout`` when given (> 0), else derived from the work, the
    population's size (``num-clients``; the built-in default population when not given) times
    :data:`DISCOVERY_SECONDS_PER_CLIENT`, and at least ``round-timeout``."""
    explicit = float(opts.get("discovery-timeout", 0.0) or 0.0)
    if explicit > 0:
        return explicit
    num = given({"num-clients": NONE, **opts}, "num-clients")
    m = 10_000 if num is None else int(num)
    return max(float(opts["round-timeout"]), 60.0 + DISCOVERY_SECONDS_PER_CLIENT * m)


def slow_nodes_line(described: dict[int, Any], num_nodes: int, timeout: float) -> str:
    """The one line of a discovery that timed out: which partitions did not describe themselves
    (``described``: node id to its description, a dict with ``partition``) and what they were
    doing."""
    seen = {int(d["partition"]) for d in described.values() if "partition" in d}
    missing = [p for p in range(num_nodes) if p not in seen]
    which = ", ".join(f"partition-id={p}" for p in missing) or "unknown"
    return (
        f"only {len(described)} of {num_nodes} SuperNodes described themselves within "
        f"{timeout:.0f} s; slow: {which} (still loading its clients' data; set the run "
        "configuration's discovery-timeout in seconds)"
    )


NOT_GIVEN: dict[str, Any] = {
    f.name: NONE for f in dataclasses.fields(RunSpec) if getattr(SPEC, f.name) is None
}
"""The RunSpec fields whose default is None, each encoded as :data:`NONE` (not given)."""

SERVER_DIR = "server"
"""The ServerApp's storage inside the work directory (ledger, checkpoint, billboards, result)."""


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


def default_work_dir() -> Path:
    """A new durable work directory for a run: ``$XDG_STATE_HOME/privmtl/flower/run-<time>-<id>``.

    ``$XDG_STATE_HOME`` defaults to ``~/.local/state``: the ledger of a private run is a record of
    what was released and is never put in a temporary directory.
    """
    import os
    import secrets

    root = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return root / "privmtl" / "flower" / f"run-{stamp}-{secrets.token_hex(3)}"


def check_options(run_config: dict[str, Any], num_supernodes: int) -> None:
    """Refuse invalid run options before any process starts (InvalidParameterError)."""
    from privmtl._validation import check_choice, check_int, check_real

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
    from privmtl.flower.factory import checked_method

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


def _accuracy(correct: np.ndarray, counts: np.ndarray) -> dict[str, float]:
    has = counts > 0
    return {
        "accuracy": float(correct.sum() / counts.sum()),
        "mean_client_accuracy": float(np.mean(correct[has] / counts[has])),
        "n": float(counts.sum()),
    }


def read_run_info(path: str | Path) -> dict[str, Any] | None:
    """The ServerApp's ``run.json`` at ``path`` (``run``, ``token``, ``finished``); None if absent.

    Raises
    ------
    DataFormatError
        Not a JSON object of those three keys with their types (a list, text that is not UTF-8,
        deep nesting, ...): one line naming the file.
    """
    from privmtl.io import read_json

    p = Path(path)
    if not p.exists() and not p.is_symlink():
        return None
    info = read_json(p)
    ok = (
        isinstance(info, dict)
        and isinstance(info.get("run"), int)
        and not isinstance(info.get("run"), bool)
        and info["run"] >= 0
        and isinstance(info.get("token"), str)
        and isinstance(info.get("finished"), bool)
    )
    if not ok:
        shown = json.dumps(info)[:80] if isinstance(info, dict | list) else repr(info)[:80]
        raise DataFormatError(
            f"{p} must be the ServerApp's JSON object {{run: integer >= 0, token: string, "
            f"finished: true or false}}; got {shown}. Remove the work directory's server/ or "
            "choose another --work-dir."
        )
    return info


class ServerRun:
    """The server side: PMTL's curator, built as the in-process Trainer builds it.

    Parameters
    ----------
    opts : dict
        The run options (:func:`run_options`); ``budget-epsilon``, ``checkpoint-every`` and
        ``resume`` act as ``budget_epsilon``, ``checkpoint_every`` and ``resume`` of the
        in-process :class:`~privmtl.federated.protocol.Trainer`.
    init : dict of str to Tensor
        The initial billboard (the model's initial parameters, reported by the nodes).
    num_clients : int
    ledger_path : path or None
        Where the ledger is written ahead of every release when there is no ``server_dir``.
    server_dir : path or None
        The server's durable storage. ``ledger.jsonl``: the write-ahead ledger of every release
        made from this directory — a later run continues it, since its clients continue their
        personalized models, so its ε composes every release they took part in. The checkpoint
        (``manifest.json``, ``state-*.pt``; :mod:`privmtl.checkpoint`) of the current run, saved
        before its first release and every ``checkpoint-every`` rounds. ``run.json``: the current
        run's index, token and whether it finished; a directory whose run did not finish is
        refused unless ``resume`` continues it.

    Notes
    -----
    A resumed run repeats the rounds after its checkpoint. With seeded noise a repeated release
    is the one the ledger holds (same id and event) and is not charged again; with secure noise
    it is a new release and is charged. The nodes keep their clients' models from before the round
    they trained last, so a repeated round starts from the same personalized models.
    """

    def __init__(
        self,
        opts: dict[str, Any],
        init: Params,
        num_clients: int,
        *,
        ledger_path: str | Path | None = None,
        server_dir: str | Path | None = None,
    ) -> None:
        from privmtl.flower.vote import vote_plan

        m = num_clients
        self.opts, self.m = opts, m
        # the clients' end-of-run vote where run_pmtl holds it: its event reserved in the budget
        self.vote = vote_plan(given_spec(opts), m, str(opts["model"]))
        self.vote_record: dict[str, Any] | None = None
        # the clients' feature scaling, as the nodes describe their data (a table's)
        self.data_scaling = "none"
        self.winner: str | None = None
        reserve = None if self.vote is None else self.vote.event()
        self.run = run = make_run(opts, m, reserve)  # resolved once
        self.spec: RunSpec = run.spec  # type: ignore[assignment]  # resolved from a RunSpec
        # the release (calibrated to the run's target), billboard, shared parameters and
        # personal_init as the Trainer sets them up
        self.setup = setup = setup_run(run, m, init)
        self.sigma = float(setup.config.noise_std)
        self.config = cfg = setup.config
        self.q = setup.q
        budget = given(opts, "budget-epsilon")
        self.budget = None if budget is None else float(budget)
        self.checkpoint_every = int(opts["checkpoint-every"])
        self.server_dir = None if server_dir is None else Path(server_dir)
        seen = None
        if self.server_dir is not None:
            # one writer per directory, for as long as this server lives (or its process)
            lock = DirectoryLock.acquire(self.server_dir, name="work_dir")
            weakref.finalize(self, lock.release)
            ledger_path = self.server_dir / "ledger.jsonl"
            seen = ledger_seen(self.server_dir)  # the ledger must continue what it saw
        mech = setup.release
        self.delta = float(cfg.delta or 0.0)  # resolved by setup_run
        self.ledger: PrivacyLedger | None = None
        if mech.private:
            self.ledger = new_ledger(
                cfg,
                self.delta,
                self.budget,
                None if ledger_path is None else Path(ledger_path),
                seen=seen,
                seen_by=f"the checkpoint in {self.server_dir}",
            )
            self.ledger.epsilon_if(mech.event())
        self.noise_source = cfg.noise_source
        self.curator = make_curator(
            setup, noise=make_noise_source(cfg.noise_source, cfg.seed), ledger=self.ledger
        )
        self.shapes = {n: [int(v) for v in p.shape] for n, p in init.items()}
        self.run_index = 0
        self.token = secrets.token_hex(8)
        self.stopped_on_budget = False
        self.history: list[dict[str, Any]] = []
        self.billboards: list[Params] = []
        if self.server_dir is not None:
            self._open(bool(opts["resume"]))

    # ------------------------------------------------------------------------- durable state
    @property
    def epsilon(self) -> float:
        """ε of everything the ledger holds (inf without a ledger: not private)."""
        return math.inf if self.ledger is None else self.ledger.epsilon()

    @property
    def finished(self) -> bool:
        return self.curator.round >= self.config.rounds or self.stopped_on_budget

    def round_key(self) -> str:
        """The name of the next round for the nodes (this run's token and the round index)."""
        return f"{self.token}:{self.curator.round}"

    def fingerprint_config(self) -> dict[str, Any]:
        """What a checkpoint must match to be resumed (as the Trainer's, plus data and run)."""
        return {
            **fingerprint_base(self.config, self.noise_source, self.m),
            "data": str(self.opts["data"]),
            "data_path": str(self.opts["data-path"]),
            "model": str(self.opts["model"]),
            # a user's factory or method: a resumed run must load the same code
            **({"model_sha256": sha} if (sha := str(self.opts.get("model-sha256") or "")) else {}),
            **({"method_sha256": h} if (h := str(self.opts.get("method-sha256") or "")) else {}),
            "shapes": self.shapes,
            "run": self.run_index,
            "token": self.token,
        }

    def _open(self, resume: bool) -> None:
        assert self.server_dir is not None
        d = self.server_dir
        info = read_run_info(d / "run.json")
        if info is not None and not info.get("finished") and not resume:
            raise InvalidParameterError(
                f"{d} holds run {info['run']}, which did not finish (it was killed, failed or "
                "interrupted); resume it (--resume) or use another work directory."
            )
        load = False
        if info is not None and resume:
            self.run_index, self.token = int(info["run"]), str(info["token"])
            if has_checkpoint(d):
                manifest = json.loads((d / "manifest.json").read_text())
                load = manifest.get("config", {}).get("token") == self.token
        elif info is not None:
            self.run_index = int(info["run"]) + 1
        self.curator.name = f"run{self.run_index}:" if self.run_index else ""
        if load:
            state, _ = load_checkpoint(d, kind="flower-pmtl", config=self.fingerprint_config())
            self.load_state_dict(state)
        self._write_info(finished=False)
        self.save()  # before the first release: a killed run always has a checkpoint

    def _write_info(self, *, finished: bool) -> None:
        assert self.server_dir is not None
        info = {"run": self.run_index, "token": self.token, "finished": finished}
        write_atomic(self.server_dir / "run.json", (json.dumps(info) + "\n").encode())

    def state_dict(self) -> dict[str, Any]:
        """Curator state, history and the released billboards (no personalized model)."""
        return {
            "curator": self.curator.state_dict(),
            "history": json.dumps(self.history),
            "billboards": self.billboards,
            "stopped_on_budget": self.stopped_on_budget,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.curator.load_state_dict(state["curator"])
        self.history = json.loads(state["history"])
        self.billboards = [{n: p.clone() for n, p in b.items()} for b in state["billboards"]]
        # a budget stop is decided again (the resumed run may have another budget)
        self.stopped_on_budget = False

    def save(self) -> None:
        """Checkpoint the run now (atomic; the ledger is already on disk)."""
        if self.server_dir is None:
            return
        save_checkpoint(
            self.server_dir,
            kind="flower-pmtl",
            config=self.fingerprint_config(),
            state=self.state_dict(),
            step=self.curator.round,
            noise_source=self.noise_source,
            ledger=None if self.ledger is None else self.ledger.seen(),
        )

    def stop_on_budget(self) -> bool:
        """True (and ``stopped_on_budget`` set) when the next release would exceed the budget."""
        if budget_stops(self.curator, self.budget):
            self.stopped_on_budget = True
        return self.stopped_on_budget

    def finish(self) -> None:
        """Save the final checkpoint and mark the run finished (once its result is computed)."""
        if self.server_dir is None:
            return
        self.save()
        self._write_info(finished=True)

    def release(
        self,
        sampled: np.ndarray,
        messages: dict[int, Params],
        losses: dict[int, float],
        seconds: float,
        *,
        secure: tuple[Params, list[int]] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Release the round from the messages of the clients that answered.

        A sampled client without a message contributes nothing to the sum (which is still divided
        by the fixed ``q``): the release has the sensitivity it is accounted for. With
        ``secure = (total, answered)`` the curator has only the sum of the answering clients'
        messages, clipped by the clients (secure aggregation, :mod:`privmtl.flower.secagg`).
        """
        t = self.curator.round
        if secure is not None:
            total, answered = secure
            out = self.curator.release_sum(total)
        else:
            answered = [int(k) for k in sampled if int(k) in messages]
            names = list(self.curator.billboard)
            stacked = {
                n: (
                    torch.stack([messages[k][n] for k in answered])
                    if answered
                    else self.curator.billboard[n].new_zeros((0, *self.curator.billboard[n].shape))
                )
                for n in names
            }
            out = self.curator.release(stacked, rows=np.asarray(answered, dtype=np.int64))
        rec = round_record(
            t,
            sampled,
            [losses[k] for k in answered if k in losses],
            out,
            self.curator.release_mechanism.noise_multiplier,
            float(out.epsilon) if self.ledger is not None else math.inf,
            seconds,
            answered=answered,
            **(extra or {}),
        )
        if secure is not None and not len(out.clipped):
            rec["clipped_fraction"] = math.nan  # the curator never sees a message (secagg)
        self.history.append(rec)
        self.billboards.append({n: p.clone() for n, p in self.curator.billboard.items()})
        r = self.curator.round
        if r % self.checkpoint_every == 0 or r == self.config.rounds:
            self.save()

    def result(self, evaluations: list[dict[str, list[float]]], started: float) -> TrainResult:
        """A :class:`TrainResult` (no personalized models: they stay on the nodes)."""
        personalized = self.setup.spec.personalized
        kinds = (("personalized", "personal"),) if personalized else ()
        acc: dict[str, dict[str, dict[str, float]]] = {}
        for split in ("val", "test"):
            n = np.concatenate([np.asarray(e[f"{split}_n"]) for e in evaluations])
            acc[split] = {
                kind: _accuracy(
                    np.concatenate([np.asarray(e[f"{split}_{key}"]) for e in evaluations]), n
                )
                for kind, key in (*kinds, ("global", "global"))
            }
        return run_result(
            self.config,
            self.history,
            acc,
            personalized=None,
            global_params=self.global_model(),
            primary="personalized" if personalized else "global",
            epsilon=self.epsilon,
            delta=self.delta,
            ledger=self.ledger,
            noise_source=self.noise_source,
            stopped_on_budget=self.stopped_on_budget,
            client_ids=[],
            extra={
                "wall_seconds": time.perf_counter() - started,
                # what the method reports beyond the common keys (FedRep's split), as the Trainer
                **self.setup.spec.extra(self.setup.shared, list(self.setup.init)),
            },
        )

    def global_model(self) -> Params:
        """The released global model: the billboard and, with partial sharing, the initial
        values of the parameters that are not shared (as the in-process engine reports it)."""
        board = self.curator.billboard
        return {n: board.get(n, p) for n, p in {**self.setup.init, **board}.items()}

    def models_state(self) -> dict[str, Any]:
        """What the ServerApp keeps for a models folder (``save-models``): the released global
        model (:meth:`global_model`), the run's token, the resolved :class:`TrainConfig` (JSON)
        and the model the method is evaluated with; never a personalized model."""
        personalized = self.setup.spec.personalized
        return {
            "token": self.token,
            "global": {n: p.detach().contiguous().clone() for n, p in self.global_model().items()},
            "config": json.dumps(self.config.to_dict(), default=float),
            "primary": "personalized" if personalized else "global",
        }

    def finish_settings(self) -> dict[str, Any]:
        """The public settings of every client's end of the run, sent to the nodes with the
        final billboard (:meth:`NodeClients.evaluate`): what ``run_pmtl`` passes to
        :func:`~privmtl.federated.finish.finish_clients` for the same run."""
        cfg = self.config
        dim = next((h["released_dim"] for h in self.history if "released_dim" in h), None)
        personalized = self.setup.spec.personalized
        return {
            "method": cfg.method,
            "finetune": self.spec.finetune,
            "start": "personalized" if personalized else "global",
            "personal_init": cfg.personal_init,
            "shared_params": None if cfg.shared_params is None else list(cfg.shared_params),
            "noise_std": float(self.sigma or 0.0),
            "clip": cfg.clip,
            "released_dim": int(dim or 0),
            "rounds": len(self.history) or cfg.rounds,
            "batch_size": cfg.batch_size,
            "seed": cfg.seed,
            "lr": cfg.lr,
            "lam": float(cfg.lam or 0.0),
            # the resolved TrainConfig: the method's end of run on the nodes (NodeClients.outputs)
            "config": cfg.to_dict(),
            # the vote: held (the nodes first count their clients' shares), then its winner
            "vote": self.vote is not None,
            "winner": self.winner,
            "num_clients": self.m,
            "noise_source": self.noise_source,
            "baseline": True,  # every run reports the clients' training alone beside its result
        }

    def client_rows(self, evaluations: list[dict[str, Any]], result: dict[str, Any]) -> Any:
        """The run's per-client rows (:func:`~privmtl.per_client.pmtl_rows`) from the nodes'
        evaluations (in partition order: the population's) and the run's ``result``."""
        from privmtl.federated.finish import auto_plan
        from privmtl.per_client import pmtl_rows, ratio

        # the nodes' evaluations in population order (they come in the order nodes answered)
        evaluations = sorted(evaluations, key=lambda e: int(e["clients"][0]) if e["clients"] else 0)

        def cat(key: str) -> np.ndarray:
            return np.concatenate([np.asarray(e[key], dtype=np.float64) for e in evaluations])

        ids = [cid for e in evaluations for cid in e["client_ids"]]
        sizes = {s: cat(f"{s}_n").astype(np.int64) for s in ("train", "val", "test")}
        if all("test_final" in e for e in evaluations):
            correct = cat("test_final")
        elif self.setup.spec.personalized:
            correct = cat("test_personal")
        else:
            correct = cat("test_global")
        if all("choice" in e for e in evaluations):
            fin = self.finish_settings()
            plan = auto_plan(
                fin["method"], fin["shared_params"], fin["noise_std"], fin["clip"],
                fin["released_dim"], fin["rounds"],
            )  # fmt: skip
            choice = np.concatenate([np.asarray(e["choice"], dtype=np.int64) for e in evaluations])
            kept = [str(v) for v in np.asarray(plan.names, dtype=object)[choice]]
        else:
            (name,) = result["clients_per_final_model"]
            kept = [str(name)] * len(ids)
        local = None
        parts = [e["baseline"] for e in evaluations if e.get("baseline")]
        if parts:
            local = np.full(len(ids), np.nan)
            for p in parts:
                idx = np.asarray(p["clients"], dtype=np.int64)
                local[idx] = ratio(np.asarray(p["local"]), np.asarray(p["n"]))
        return pmtl_rows(ids, sizes, kept, correct, local)

    def baseline_keys(self, evaluations: list[dict[str, Any]]) -> dict[str, Any]:
        """The result's baseline keys (:func:`~privmtl.federated.baseline.local_keys`) from the
        nodes' parts (:meth:`NodeClients.baseline_scores`), in population order; ``{}`` where no
        node sent one."""
        from privmtl.federated.baseline import local_keys

        parts = [e["baseline"] for e in evaluations if e.get("baseline")]
        if not parts:
            return {}
        cat = {
            k: np.concatenate([np.asarray(p[k], dtype=np.float64) for p in parts])
            for k in ("clients", "final", "local", "n")
        }
        order = np.argsort(cat["clients"], kind="stable")
        solver = next((str(p["solver"]) for p in parts if "solver" in p), "sgd")
        keys = local_keys(
            cat["final"][order], cat["local"][order], cat["n"][order], m=self.m, solver=solver
        )
        # the nodes train their clients alone in parallel: the slowest node's time
        keys["baseline_seconds"] = max(float(e.get("baseline_seconds", 0.0)) for e in evaluations)
        return keys

    def elect(self, shares: np.ndarray) -> str | None:
        """Release the clients' vote from the nodes' summed ``shares`` (the candidates of
        :func:`~privmtl.federated.finish.vote_candidates`) through the ledger, as ``run_pmtl``
        does; returns the winner (None: no room left in the budget, every client chooses)."""
        from privmtl.federated.finish import auto_plan, vote_candidates
        from privmtl.flower.vote import elect

        assert self.vote is not None
        fin = self.finish_settings()
        plan = auto_plan(
            fin["method"], fin["shared_params"], fin["noise_std"], fin["clip"],
            fin["released_dim"], fin["rounds"],
        )  # fmt: skip
        names = vote_candidates(plan, "ridge")
        won, self.vote_record, _ = elect(
            self.vote, shares, names, ledger=self.ledger, noise_source=self.noise_source,
            seed=int(self.config.seed), delta=self.delta, accountant=self.config.accountant,
        )  # fmt: skip
        if won is None:
            self.vote = None  # every client chooses on its own
        self.winner = None if won is None else names[won]
        return self.winner

    def _finish_part(
        self, evaluations: list[dict[str, Any]], pre_test_accuracy: float
    ) -> tuple[dict[str, Any], list[str]]:
        """The result keys of the clients' end of the run (as ``run_pmtl``'s) and its notes."""
        from privmtl.federated.finish import (
            AUTO_NOTE,
            FINETUNE_NOTE,
            FINETUNE_VOTE_NOTE,
            auto_info,
            auto_plan,
        )

        fin = self.finish_settings()
        if fin["finetune"] == "none":
            return {}, []
        acc = {}
        for split in ("val", "test"):
            n = np.concatenate([np.asarray(e[f"{split}_n"]) for e in evaluations])
            final = np.concatenate([np.asarray(e[f"{split}_final"]) for e in evaluations])
            acc[split] = _accuracy(final, n)
        part: dict[str, Any] = {"finetune": fin["finetune"]}
        notes: list[str] = []
        if fin["finetune"] == "auto":
            plan = auto_plan(
                fin["method"], fin["shared_params"], fin["noise_std"], fin["clip"],
                fin["released_dim"], fin["rounds"],
            )  # fmt: skip
            choice = np.concatenate([np.asarray(e["choice"], dtype=np.int64) for e in evaluations])
            counts = np.bincount(choice, minlength=len(plan.names)).tolist()
            grids: dict[str, Any] = next((e["grids"] for e in evaluations if e.get("grids")), {})
            held = self.winner is not None
            record = self.vote_record
            if record is not None and held:
                record = {**record, "voters": int(sum(e.get("voters", 0) for e in evaluations))}
            part["finetune_auto"] = auto_info(
                plan, counts, grids, "ridge" if held else "sgd", record
            )
            notes.append(FINETUNE_VOTE_NOTE if held else AUTO_NOTE)
        else:
            part["finetune_start"] = fin["start"]
        part.update(
            {
                "pre_finetune_test_accuracy": pre_test_accuracy,
                "test_accuracy": acc["test"]["accuracy"],
                "mean_client_accuracy": acc["test"]["mean_client_accuracy"],
                "val_accuracy": acc["val"]["accuracy"],
            }
        )
        if fin["finetune"] != "auto":
            part["finetune_note"] = FINETUNE_NOTE
        return part, notes

    def result_dict(self, evaluations: list[dict[str, Any]], started: float) -> dict:
        """The JSON of ``privmtl pmtl`` for this run, plus ``engine``."""
        from privmtl.federated.finish import final_models_keys
        from privmtl.federated.report import result_dict, scaling_note

        res = self.result(evaluations, started)
        part, notes = self._finish_part(evaluations, float(res.test_accuracy))
        notes = [*scaling_note(self.data_scaling), *notes]
        out = result_dict(
            res,
            method=self.config.method,
            model=str(self.opts["model"]),
            data=str(self.opts["data"]),
            sigma=self.sigma,
            q=self.q,
            m=self.m,
            notes=notes,
        )
        out.update(part)
        out.update({k: res.extra[k] for k in self.setup.spec.result_keys if k in res.extra})
        out.update(
            final_models_keys(
                str(self.spec.finetune),
                self.m,
                auto=part.get("finetune_auto"),
                from_billboard=False,
                personalized=self.setup.spec.personalized,
            )
        )
        # the resolved settings (personal_init as the ServerApp resolved it), as run_pmtl's
        out["config"] = self.spec.replace(personal_init=self.config.personal_init).to_dict()
        out["clients_per_round_default"] = given(self.opts, "clients-per-round") is None
        out["scaling"] = self.data_scaling  # as the nodes describe their data
        out.update(self.baseline_keys(evaluations))
        out["engine"] = "flower-deployment"
        out["device"] = "cpu"  # the nodes train and score on their CPUs (no --device on Flower)
        if self.opts.get("model-sha256"):  # the factory code every machine checked it ran
            out["model_sha256"] = str(self.opts["model-sha256"])
        from privmtl.flower.factory import checked_method

        _, source = checked_method(self.opts)
        if source is not None:  # a user's method: its file, as run_pmtl records it
            out["method_source"] = dict(source)
        out["on_missing"] = str(self.opts["on-missing"])
        out["clients_answered_per_round"] = [len(h["answered"]) for h in self.history]
        out["budget_epsilon"] = self.budget
        out["run_index"] = self.run_index
        out["ledger_releases"] = 0 if self.ledger is None else len(self.ledger.records)
        if self.server_dir is not None:
            out["server_dir"] = str(self.server_dir)
        return json.loads(json.dumps(out, default=float))
