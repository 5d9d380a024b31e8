"""The wall time of a run and its breakdown by phase.

A run's ``seconds`` is its wall time, from the start of its entry point (``run_pmtl``,
``run_mpmtl``) to the end of its result, and its ``phases`` split that time: each named phase is
measured once, around the code that does it, by a :class:`PhaseTimer`, and ``other`` is what is
left (checking the settings, assembling the result), so that the phases add up to ``seconds``.

Every measure reads :data:`clock`, this module's one clock; tests replace it with a counter so
that the sums they check are exact. This module imports nothing heavy, so every layer may use it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = [
    "MPMTL_PHASES",
    "OTHER",
    "PHASE_LABELS",
    "PMTL_PHASES",
    "STARTUP",
    "PhaseTimer",
    "added_phase",
    "clock",
    "describe_phases",
    "process_seconds",
    "with_startup",
]

clock: Callable[[], float] = time.perf_counter
"""The clock of every measure (seconds, monotonic)."""

OTHER = "other"
"""The phase of the time outside the named phases: the run's own bookkeeping between them."""

PMTL_PHASES = ("data", "setup", "rounds", "end_of_run", "scoring", "saving", OTHER)
"""The phases of a PMTL-family run (``run_pmtl``): loading or generating the data; the model, the
method and the noise calibration (and a user's model factory); the federated rounds (the engine's
own time of its rounds); the end of the run (fine-tuning, ``finetune="auto"``'s candidates, the
extra fine-tunes, with the scoring of their models); the scoring of the trained models on the
validation and test splits (the part of the method's fit outside its rounds, which includes the
engine's set-up before round 1); writing the models (``save_models``); and the rest."""

MPMTL_PHASES = ("data", "setup", "tuning", "fit", "scoring", "saving", OTHER)
"""The phases of an MP-MTL run (``run_mpmtl``): loading the data; checking the checkpoint, budget
and fixed settings; the hyper-parameter search (0 when there is none); the final fit; the test
predictions and metric; writing the models; and the rest."""

STARTUP = "startup"
"""The phase a command line adds before a run's own phases (:func:`with_startup`): from the start
of the process to the run's entry point (the interpreter, importing torch and the libraries,
reading the options). A library call has none: its process is the caller's."""

PHASE_LABELS = {
    STARTUP: "start-up",
    "data": "data",
    "setup": "setup",
    "rounds": "rounds",
    "end_of_run": "end of run",
    "scoring": "scoring",
    "saving": "saving",
    "tuning": "tuning",
    "fit": "fit",
    OTHER: "other",
}
"""How the human output names each phase."""


class PhaseTimer:
    """Measure a run's wall time and the seconds of each of its ``names`` phases.

    The run starts when the timer is made. :meth:`phase` measures one phase (a phase measured
    twice adds up); phases do not nest. :meth:`record` ends the run and writes its ``seconds``
    and ``phases`` into the result.

    Parameters
    ----------
    names : sequence of str
        The phases, in the order the result lists them; the last one, :data:`OTHER`, receives
        the time outside the others.
    """

    def __init__(self, names: Sequence[str]) -> None:
        if not names or names[-1] != OTHER:
            raise ValueError(f"The 'names' parameter must end with {OTHER!r}; got {names!r}.")
        self.names = tuple(names)
        self._seconds = dict.fromkeys(self.names, 0.0)
        self._open: str | None = None
        self.start = clock()

    def _check(self, name: str) -> None:
        if name not in self.names or name == OTHER:
            raise ValueError(
                f"The 'name' parameter must be one of {self.names[:-1]}; got {name!r}."
            )

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Measure the ``with`` block as (part of) phase ``name``."""
        self._check(name)
        if self._open is not None:
            raise RuntimeError(f"Phase {name!r} started inside phase {self._open!r}.")
        self._open = name
        t0 = clock()
        try:
            yield
        finally:
            self._seconds[name] += clock() - t0
            self._open = None

    def carve(self, source: str, into: str, seconds: float) -> None:
        """Move ``seconds`` (at most what ``source`` has) of phase ``source`` into ``into``: a
        phase measured as a whole whose part was measured inside it (the engine's rounds inside
        the method's fit)."""
        self._check(source)
        self._check(into)
        moved = min(max(float(seconds), 0.0), self._seconds[source])
        self._seconds[source] -= moved
        self._seconds[into] += moved

    def seconds(self, name: str) -> float:
        """The seconds measured so far in phase ``name``."""
        self._check(name)
        return self._seconds[name]

    def record(self, out: dict[str, Any]) -> dict[str, Any]:
        """End the run: set ``out["seconds"]`` (the wall time since the timer was made) and
        ``out["phases"]`` (every phase's seconds, :data:`OTHER` the rest); returns ``out``."""
        total = clock() - self.start
        named = {n: self._seconds[n] for n in self.names[:-1]}
        out["seconds"] = total
        out["phases"] = {**named, OTHER: max(0.0, total - sum(named.values()))}
        return out


@contextmanager
def added_phase(out: dict[str, Any], name: str) -> Iterator[None]:
    """Add the ``with`` block to a recorded result's ``name`` phase and to its ``seconds``: work
    that belongs to the run but happens after its entry point returned (a sweep scoring every
    client of a candidate run)."""
    t0 = clock()
    try:
        yield
    finally:
        spent = clock() - t0
        phases = out.get("phases")
        if phases is None or name not in phases:
            raise ValueError(f"The result has no phase {name!r} to add to.")
        phases[name] += spent
        out["seconds"] += spent


def process_seconds() -> float | None:
    """Seconds since this process started, or ``None`` where the system does not say (Linux's
    ``/proc/self/stat`` start time against the boot clock, to a clock tick)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()  # the name, in (...), may hold spaces
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time in ticks
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def with_startup(out: dict[str, Any], seconds: float) -> dict[str, Any]:
    """``out`` (a recorded result) with :data:`STARTUP` ``seconds`` put first in its ``phases``
    and added to its ``seconds``: the time its process spent before the run's entry point, so
    that a command's ``seconds`` is the process's wall time up to its result."""
    phases = out.get("phases")
    if phases is None:
        raise ValueError("The result has no phases to add the start-up to.")
    out["phases"] = {STARTUP: float(seconds), **phases}
    out["seconds"] += float(seconds)
    return out


def describe_phases(out: dict[str, Any], *, per_round: float | None = None) -> str:
    """The human line of a result's time: the whole wall time, then every phase that took time
    with its share, e.g. ``555.0s (rounds 0.9s, 0.030s/round; end of run 540.1s = 97%; ...)``.

    ``per_round`` (seconds per round) is shown beside the rounds. A phase takes its share when it
    is at least 1 % of the run; a result without ``phases`` shows its ``seconds`` only.
    """
    total = float(out["seconds"])
    shown = f"{total:.1f}s" if total >= 0.95 else f"{total:.3f}s"  # a quick run is not "0.0s"
    phases = out.get("phases")
    if not phases:
        return shown
    parts = []
    for name, secs in phases.items():
        if name != "rounds" and secs < 0.05:
            continue  # shown as 0.0s: nothing to say
        text = f"{PHASE_LABELS.get(name, name)} {secs:.1f}s"
        if name == "rounds" and per_round is not None:
            text += f", {per_round:.3f}s/round"
        share = secs / total if total > 0 else 0.0
        if share >= 0.01:
            text += f" = {share:.0%}"
        parts.append(text)
    return f"{shown} ({'; '.join(parts)})" if parts else shown
