"""Progress output that fits where it goes.

On a terminal a :class:`Progress` is a tqdm bar that redraws in place and disappears when done. In a
log file or a pipe, where carriage-return redraws pile up as hundreds of lines, it writes one plain
line every ``every`` steps (by default about ten lines for the whole loop, or one line per step for
short loops such as a sweep's runs) and a last line when the loop ends. The process-wide verbosity
(:func:`set_verbosity`; the CLI's ``--quiet`` and ``--verbose``) turns it off or makes it write a
line per step.

This module imports nothing heavy, so every layer (the federated engine, the experiment drivers, the
CLI) may use it.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO, TypeVar

from privmtl._validation import check_choice

__all__ = [
    "NORMAL",
    "QUIET",
    "VERBOSE",
    "Progress",
    "get_verbosity",
    "progress",
    "set_verbosity",
    "summarize_warnings",
]

QUIET = 0
"""Verbosity level: no progress output."""
NORMAL = 1
"""Verbosity level: a bar on a terminal, about ten lines per loop elsewhere."""
VERBOSE = 2
"""Verbosity level: a bar on a terminal, one line per step elsewhere."""

_verbosity = NORMAL

T = TypeVar("T")


def set_verbosity(level: int) -> None:
    """Set the process-wide verbosity (:data:`QUIET`, :data:`NORMAL` or :data:`VERBOSE`)."""
    global _verbosity

    _verbosity = check_choice("level", level, (QUIET, NORMAL, VERBOSE))


def get_verbosity() -> int:
    """The process-wide verbosity set by :func:`set_verbosity` (default :data:`NORMAL`)."""
    return _verbosity


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Progress:
    """Report the progress of a loop of ``total`` steps on ``stream``.

    Parameters
    ----------
    total : int or None
        Number of steps, if known.
    desc : str
        Short label that starts every line (for example ``"pmtl"`` or ``"mpmtl sweep"``).
    enabled : bool, default True
        False silences this reporter whatever the verbosity.
    initial : int, default 0
        Steps already done (a resumed run).
    unit : str, default "step"
        Name of one step in the plain lines (``"round"``, ``"run"``).
    every : int or None
        Steps between plain lines when the stream is not a terminal. ``None`` chooses about ten
        lines per loop (every step when ``total`` is at most 20); at verbosity :data:`VERBOSE`
        every step gets a line.
    stream : file-like or None
        Where to write; default ``sys.stderr``.

    Notes
    -----
    Use it as a context manager, or call :meth:`close` when the loop ends. :meth:`update` accepts
    keyword values (a loss, the ε spent so far) that are shown next to the count.
    """

    def __init__(
        self,
        *,
        total: int | None,
        desc: str,
        enabled: bool = True,
        initial: int = 0,
        unit: str = "step",
        every: int | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.total = total
        self.desc = desc
        self.unit = unit
        self.n = initial
        self._stream = sys.stderr if stream is None else stream
        self._start = time.perf_counter()
        self._postfix: dict[str, Any] = {}
        self._last_line = initial
        self._bar: Any = None
        self._closed = False
        self._lock = threading.Lock()
        active = enabled and get_verbosity() > QUIET
        self._lines = active and not _is_terminal(self._stream)
        if get_verbosity() >= VERBOSE:
            every = 1
        elif every is None:
            every = 1 if total is None or total <= 20 else math.ceil(total / 10)
        self._every = max(1, int(every))
        if active and not self._lines:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total, initial=initial, desc=desc, file=self._stream, leave=False, unit=unit
            )

    def update(self, n: int = 1, **postfix: Any) -> None:
        """Record ``n`` finished steps; ``postfix`` values are shown with the count (safe to
        call from several threads)."""
        with self._lock:
            self.n += n
            self._postfix = postfix
            if self._bar is not None:
                if postfix:
                    self._bar.set_postfix(postfix, refresh=False)
                self._bar.update(n)
            elif self._lines and self.n - self._last_line >= self._every:
                self._write_line()

    def _write_line(self) -> None:
        self._last_line = self.n
        count = f"{self.n}/{self.total}" if self.total is not None else f"{self.n}"
        extra = "".join(f" {k}={v}" for k, v in self._postfix.items())
        elapsed = time.perf_counter() - self._start
        print(
            f"{self.desc}: {count} {self.unit}s{extra} ({elapsed:.1f} s)",
            file=self._stream,
            flush=True,
        )

    def close(self) -> None:
        """End the report: close the bar, or write the last plain line if it is not out yet."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        elif self._lines and self.n != self._last_line:
            self._write_line()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(
    iterable: Iterable[T],
    *,
    desc: str,
    total: int | None = None,
    enabled: bool = True,
    unit: str = "step",
    every: int | None = None,
    stream: TextIO | None = None,
) -> Iterator[T]:
    """Yield the items of ``iterable`` while reporting them with a :class:`Progress`.

    ``total`` defaults to ``len(iterable)`` when it has one; the other parameters are those of
    :class:`Progress`.
    """
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    with Progress(
        total=total, desc=desc, enabled=enabled, unit=unit, every=every, stream=stream
    ) as bar:
        for item in iterable:
            yield item
            bar.update()


def summarize_warnings(records: Iterable[tuple[str, str]]) -> str | None:
    """One line that sums up numerical warnings, or None when there are none.

    ``records`` holds ``(category name, message)`` pairs. NumPy's floating-point messages
    ("overflow encountered in ...") are counted by kind; privmtl's own messages, which say what
    diverged and what to change, are quoted (the first two distinct ones).
    """
    kinds: dict[str, int] = {}
    notes: list[str] = []
    total = 0
    for _category, message in records:
        total += 1
        text = " ".join(str(message).split())
        if text.startswith(_NUMPY_PREFIXES):
            kind = text.split(" encountered")[0]
            kinds[kind] = kinds.get(kind, 0) + 1
        elif text not in notes:
            notes.append(text)
    if total == 0:
        return None
    parts = [f"{total} numerical warning{'s' if total != 1 else ''}"]
    if kinds:
        parts[0] += " (" + ", ".join(f"{k} ×{v}" for k, v in kinds.items()) + ")"
    quoted = "; ".join(n if len(n) <= 240 else n[:237] + "..." for n in notes[:2])
    line = parts[0] + (f": {quoted}" if quoted else "")
    return (
        line + ". Non-finite fits are scored as failed (NaN) and ranked last in tuning;"
        " --verbose shows every warning."
    )


_NUMPY_PREFIXES = (
    "overflow encountered",
    "invalid value encountered",
    "divide by zero encountered",
    "underflow encountered",
    "Mean of empty slice",
    "Degrees of freedom",
)
