"""How the ServerApp waits for the SuperNodes to load their clients, and says which one is stuck.

A SuperNode loads its clients in a thread of its ClientApp (:class:`NodeLoader`), so that the
ClientApp answers the ServerApp's ``query`` while it loads: with its description once it has
loaded, or else, after :data:`QUERY_WAIT_SECONDS`, with what it is doing and for how long
(``loading``). The ServerApp asks again until every node described itself (:func:`discover`). A
large population is therefore waited for as long as its nodes work on it, and the run fails in
one line naming the node and its stage when a node has been loading longer than
:func:`discovery_timeout` (derived from the work unless the run configuration gives it), or when
it does not answer a query within the round timeout (its SuperNode or ClientApp is down).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from privmtl.exceptions import InvalidParameterError
from privmtl.flower._core import NONE, given

__all__ = [
    "DISCOVERY_SECONDS_PER_CLIENT",
    "QUERY_WAIT_SECONDS",
    "NodeLoader",
    "data_fingerprint",
    "discover",
    "discovery_timeout",
    "refusal_line",
    "slow_nodes_line",
]

DISCOVERY_SECONDS_PER_CLIENT = 5e-3
"""Seconds a node may take per client of the population to load (or generate) its data before it
describes itself: a generous bound (the synthetic population takes about 1 ms per client on a
loaded 2-core machine), so that a large population is waited for instead of failing."""

QUERY_WAIT_SECONDS = 2.0
"""How long a loading node holds the ServerApp's ``query`` before it answers that it is still
loading (and what it is doing)."""

T = TypeVar("T")


def discovery_timeout(opts: dict[str, Any]) -> float:
    """The seconds a node may spend loading its clients before the run fails: the run
    configuration's ``discovery-timeout`` when given (> 0), else derived from the work, the
    population's size (``num-clients``; the built-in default population when not given) times
    :data:`DISCOVERY_SECONDS_PER_CLIENT`, plus 60 s, and at least ``round-timeout``."""
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


class NodeLoader(Generic[T]):
    """A node's clients loaded in a thread, with the stage the load has reached.

    ``load(report)`` builds the node; it calls ``report(stage)`` (a few words: "generating the
    population's data") as it goes. :meth:`result` waits for it at most ``wait`` seconds.
    """

    def __init__(self, load: Callable[[Callable[[str], None]], T], name: str = "load") -> None:
        self.stage = "starting"
        self.started = time.monotonic()
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(load,), name=name, daemon=True)
        self._thread.start()

    def report(self, stage: str) -> None:
        self.stage = stage

    def _run(self, load: Callable[[Callable[[str], None]], T]) -> None:
        try:
            self._value = load(self.report)
        except BaseException as exc:  # handed to the caller of result()
            self._error = exc
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def failed(self) -> bool:
        """The load finished with an exception (a later query may try again)."""
        return self._done.is_set() and self._error is not None

    def result(self, wait: float | None = None) -> T | None:
        """The loaded node; None while it still loads after ``wait`` seconds (None: no limit).
        The load's exception is raised here."""
        if not self._done.wait(wait):
            return None
        if self._error is not None:
            raise self._error
        return self._value

    def progress(self, partition: int) -> dict[str, Any]:
        """What a still-loading node answers a ``query`` with."""
        return {
            "partition": int(partition),
            "stage": self.stage,
            "seconds": time.monotonic() - self.started,
        }


def refusal_line(records: Mapping[int, Mapping[str, Any]], num_nodes: int) -> str | None:
    """The first refusal among the nodes' ``query`` records (``error``), with how many refused."""
    refused = [str(r["error"]) for _, r in sorted(records.items()) if "error" in r]
    if not refused:
        return None
    more = f" ({len(refused)} of {num_nodes} SuperNodes refused)" if len(refused) > 1 else ""
    return refused[0] + more


def discover(
    ask: Callable[[list[int]], Mapping[int, Mapping[str, Any]]],
    nodes: list[int],
    timeout: float,
    *,
    answer_timeout: float,
    derived: bool = True,
) -> dict[int, dict[str, Any]]:
    """Ask the ``nodes`` until every one described itself; their descriptions by node id.

    ``ask(pending)`` sends ``query`` to the nodes of ``pending`` and returns the ``node`` record
    of each answer that came back within ``answer_timeout`` seconds: ``describe`` (the node's
    description, JSON), ``loading`` (JSON: ``partition``, ``stage``, ``seconds``) or ``error``.

    Raises
    ------
    InvalidParameterError
        A node refused the run (its one line).
    RuntimeError
        One line naming the node: it has been loading for longer than ``timeout`` seconds (and
        what it was doing), or it did not answer a query within ``answer_timeout`` seconds.
    """
    described: dict[int, dict[str, Any]] = {}
    last: dict[int, dict[str, Any]] = {}
    while pending := [nid for nid in nodes if nid not in described]:
        got = ask(pending)
        line = refusal_line(got, len(nodes))
        if line is not None:
            raise InvalidParameterError(line)
        for nid in pending:
            if nid not in got:
                raise RuntimeError(_silent_line(nid, last.get(nid), answer_timeout))
            record = got[nid]
            if "describe" in record:
                described[nid] = json.loads(str(record["describe"]))
                continue
            last[nid] = json.loads(str(record["loading"]))
            if float(last[nid]["seconds"]) > timeout:
                raise RuntimeError(_stuck_line(nid, last[nid], timeout, derived))
    return described


def data_fingerprint(described: Mapping[int, Mapping[str, Any]]) -> str:
    """One SHA-256 of the nodes' data: of each node's own hash (``data_sha256`` of its
    description), in partition order."""
    import hashlib

    parts = sorted((int(d["partition"]), str(d["data_sha256"])) for d in described.values())
    text = "\n".join(f"{p}:{h}" for p, h in parts)
    return hashlib.sha256(text.encode()).hexdigest()


def _who(nid: int, progress: dict[str, Any] | None) -> str:
    part = "" if progress is None else f"partition-id={int(progress['partition'])}, "
    return f"SuperNode ({part}node {nid})"


def _stuck_line(nid: int, progress: dict[str, Any], timeout: float, derived: bool) -> str:
    why = (
        "derived from the population's size (set the run configuration's discovery-timeout in "
        "seconds to wait longer)"
        if derived
        else "the run configuration's discovery-timeout"
    )
    return (
        f"{_who(nid, progress)} has been loading its clients for {float(progress['seconds']):.0f}"
        f" s, longer than the {timeout:.0f} s {why}; it was {progress['stage']}"
    )


def _silent_line(nid: int, progress: dict[str, Any] | None, timeout: float) -> str:
    doing = "" if progress is None else f" (it was {progress['stage']})"
    return (
        f"{_who(nid, progress)} did not answer the ServerApp's query within {timeout:.0f} s"
        f"{doing}: its SuperNode or ClientApp stopped; see its log"
    )
