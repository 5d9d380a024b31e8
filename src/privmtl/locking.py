"""One writer per directory: an OS advisory lock held for the whole run.

A run that writes into a directory — a checkpoint directory (its ledger, manifest and states), a
``--save-models`` folder, a Flower work directory — first takes :func:`hold_directory` on it: a
non-blocking ``fcntl.flock`` on the file ``.lock`` inside it. The operating system releases the
lock when the process ends, however it ends (a crash or ``SIGKILL`` included), so a stale lock
never blocks the next run. The holder writes its process id, command line and start time into
the lock file; a second process is refused with :class:`DirectoryLockedError`, one line naming
that holder.

Within one process the lock is re-entrant: a run and the trainer it drives may both hold the same
directory (the lock is released when the last holder releases it). Two processes never share it.

Under the lock, :func:`hold_directory` removes the temporary files a killed atomic write left
behind (``.NAME.*.tmp`` of :func:`privmtl.io.write_atomic`): no other process can be writing them.

Where ``fcntl`` does not exist (Windows, which privmtl does not target) the lock degrades to a
no-op that warns (:class:`~privmtl.exceptions.PrivmtlWarning`) and :func:`locking_supported` is
False; importing this module never fails.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from privmtl.exceptions import PrivmtlError, PrivmtlWarning

try:  # POSIX only
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "LOCK_NAME",
    "DirectoryLock",
    "DirectoryLockedError",
    "hold_directory",
    "holding_directories",
    "is_stale_temporary",
    "locking_supported",
    "remove_stale_temporaries",
]

_F = TypeVar("_F", bound=Callable[..., Any])

LOCK_NAME = ".lock"
"""The lock file inside a locked directory (never deleted: deleting a lock file is racy)."""


class DirectoryLockedError(PrivmtlError):
    """Another process holds the directory's lock (it is writing a run there)."""


def locking_supported() -> bool:
    """True where the OS advisory lock exists (``fcntl``); False makes every lock a no-op."""
    return fcntl is not None


def is_stale_temporary(name: str) -> bool:
    """True for the name of a temporary file of :func:`privmtl.io.write_atomic` (``.X.*.tmp``)."""
    return name.startswith(".") and name.endswith(".tmp")


def remove_stale_temporaries(directory: Path) -> list[str]:
    """Delete the temporary files a killed atomic write left in ``directory``; their names.

    Only safe under the directory's lock (no live writer can own them).
    """
    removed = []
    for item in Path(directory).iterdir():
        if item.is_file() and is_stale_temporary(item.name):
            item.unlink(missing_ok=True)
            removed.append(item.name)
    return removed


class DirectoryLock:
    """The lock of one directory held by this process (see the module docstring).

    Use :func:`hold_directory`; :meth:`release` lets go of one hold.
    """

    # resolved path -> (fd, holds, whether this process created the directory)
    _held: ClassVar[dict[Path, tuple[int, int, bool]]] = {}
    _mutex: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, path: Path) -> None:
        self.path = path
        self._released = False

    @classmethod
    def acquire(cls, directory: str | os.PathLike[str], *, name: str) -> DirectoryLock:
        """Take the lock of ``directory`` (created if missing) or raise naming its holder.

        ``name`` is the parameter the directory was given as (named in the error).
        """
        d = Path(directory)
        created = not d.exists()
        d.mkdir(parents=True, exist_ok=True)
        key = d.resolve()
        with cls._mutex:
            if key in cls._held:
                fd, holds, made = cls._held[key]
                cls._held[key] = (fd, holds + 1, made)
                return cls(key)
            if fcntl is None:  # pragma: no cover - Windows
                warnings.warn(
                    f"No OS file locking on this platform (no fcntl): the '{name}' directory "
                    f"{str(d)!r} is not protected against a second process writing to it.",
                    PrivmtlWarning,
                    stacklevel=2,
                )
                cls._held[key] = (-1, 1, created)
                return cls(key)
            path = key / LOCK_NAME
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise DirectoryLockedError(
                    f"The '{name}' directory {str(d)!r} is in use by another privmtl process "
                    f"({_holder(path)}); wait for it to finish or choose another directory."
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, _describe_self().encode(), 0)
            cls._held[key] = (fd, 1, created)
        remove_stale_temporaries(key)
        return cls(key)

    def release(self) -> None:
        """Let go of this hold; the lock is released when the process's last hold goes. A
        directory this process created and left holding nothing but the lock file (e.g. a run
        refused before it wrote anything) is removed, so a refusal leaves nothing behind."""
        if self._released:
            return
        self._released = True
        with self._mutex:
            fd, holds, created = self._held.get(self.path, (-1, 0, False))
            if holds > 1:
                self._held[self.path] = (fd, holds - 1, created)
                return
            self._held.pop(self.path, None)
            if created:  # still holding the flock: no other process can be writing here
                _remove_if_only_lock(self.path)
            if fd >= 0:
                os.close(fd)  # closing the descriptor releases the flock


@contextmanager
def hold_directory(
    directory: str | os.PathLike[str] | None, *, name: str
) -> Iterator[DirectoryLock | None]:
    """Hold the lock of ``directory`` for the ``with`` block (nothing when it is None)."""
    if directory is None:
        yield None
        return
    lock = DirectoryLock.acquire(directory, name=name)
    try:
        yield lock
    finally:
        lock.release()


def holding_directories(*params: str) -> Callable[[_F], _F]:
    """Decorate a keyword-only run function: hold the directory given as each of ``params``.

    The locks are taken, in order, before the function runs and released when it returns or
    raises; a parameter that is None or absent locks nothing.
    """

    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with ExitStack() as stack:
                for name in params:
                    stack.enter_context(hold_directory(kwargs.get(name), name=name))
                return fn(*args, **kwargs)

        return run  # type: ignore[return-value]

    return wrap


def _remove_if_only_lock(directory: Path) -> None:
    """Remove ``directory`` when it holds nothing but :data:`LOCK_NAME` (best effort)."""
    try:
        if any(p.name != LOCK_NAME for p in directory.iterdir()):
            return
        (directory / LOCK_NAME).unlink(missing_ok=True)
        directory.rmdir()
    except OSError:
        pass


def _describe_self() -> str:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    command = " ".join(sys.argv) or sys.executable
    return f"pid {os.getpid()}, started {started}, command: {command}\n"


def _holder(path: Path) -> str:
    try:
        text: Any = path.read_text(errors="replace").strip()
    except OSError:
        text = ""
    return " ".join(str(text).split())[:300] or "holder unknown"
