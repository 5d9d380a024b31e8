"""One writer per directory: an OS advisory lock held for the whole run, on a file of its own.

A run that writes into a directory — a checkpoint directory (its ledger, manifest and states), a
``--save-models`` folder, a Flower work directory — first takes :func:`hold_directory` on it: a
non-blocking ``fcntl.flock`` on the file ``.privmtl.lock`` (:data:`LOCK_NAME`) inside it. The
operating system releases the lock when the process ends, however it ends (a crash or ``SIGKILL``
included), so a stale lock never blocks the next run. The holder writes its process id, command
line and start time into the lock file; a second process is refused with
:class:`DirectoryLockedError`, one line naming that holder.

The lock touches no file but its own. The lock file is opened with ``O_NOFOLLOW``: a symbolic
link, or anything but a regular file with a single link, at :data:`LOCK_NAME` is refused in one
line before anything is written, and the file it might point to is left as it is. Files of
other tools (a ``.lock`` of their own, their ``.foo.tmp``) are never opened, truncated or
deleted. The only file the lock deletes is its own lock file, in a directory this process
created and left holding nothing else.

A lock file deleted or replaced under a live holder would let a second writer in (it locks a new
file at the same path). So, after ``flock``, the held descriptor's device and inode are compared
with the path's; a mismatch (the file was deleted or replaced between the open and the lock) is
retried once, then refused. While a run holds a directory, :meth:`DirectoryLock.verify` and
:func:`check_held` make the same comparison, and raise :class:`DirectoryLockedError` when the
path no longer names the held file: every durable write into a held directory
(:func:`privmtl.io.write_atomic`, :func:`privmtl.io.append_jsonl`, the ledger's append, a
checkpoint) checks first, so a run whose lock was taken from it stops before writing again.

Within one process the lock is re-entrant: a run and the trainer it drives may both hold the same
directory (the lock is released when the last holder releases it). Two processes never share it.

Under the lock, :func:`hold_directory` removes the temporary files a killed atomic write left
behind: privmtl names its temporaries ``.privmtl-NAME.XXXX.tmp`` (:func:`temporary_prefix`,
:data:`TEMPORARY_SUFFIX`), no other process can be writing them, and no other name is removed.

Where ``fcntl`` does not exist (Windows, which privmtl does not target) the lock degrades to a
no-op that warns (:class:`~privmtl.exceptions.PrivmtlWarning`) and :func:`locking_supported` is
False; importing this module never fails.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from privmtl.exceptions import PrivmtlError, PrivmtlWarning

try:  # POSIX only
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "LOCK_NAME",
    "TEMPORARY_PREFIX",
    "TEMPORARY_SUFFIX",
    "DirectoryLock",
    "DirectoryLockedError",
    "check_held",
    "hold_directory",
    "holding_directories",
    "is_stale_temporary",
    "locking_supported",
    "remove_stale_temporaries",
    "temporary_prefix",
]

_F = TypeVar("_F", bound=Callable[..., Any])

LOCK_NAME = ".privmtl.lock"
"""The lock file inside a locked directory: a name only privmtl writes (deleted only in a
directory the holder created and left holding nothing else)."""

TEMPORARY_PREFIX = ".privmtl-"
"""How the name of every temporary file privmtl writes begins (a name only privmtl writes)."""

TEMPORARY_SUFFIX = ".tmp"
"""How the name of every temporary file privmtl writes ends."""

_OPEN_FLAGS = (
    os.O_RDWR
    | os.O_CREAT
    | getattr(os, "O_NOFOLLOW", 0)  # a symbolic link at the lock path is refused (ELOOP)
    | getattr(os, "O_NONBLOCK", 0)  # a FIFO put there does not block the open
    | getattr(os, "O_CLOEXEC", 0)
)


class DirectoryLockedError(PrivmtlError):
    """A directory's lock cannot be taken or kept: another process holds it, its lock file is
    not privmtl's own regular file, or it was deleted or replaced while this process held it."""


def locking_supported() -> bool:
    """True where the OS advisory lock exists (``fcntl``); False makes every lock a no-op."""
    return fcntl is not None


def temporary_prefix(name: str) -> str:
    """The prefix of privmtl's temporary files for the file or folder ``name``
    (``.privmtl-NAME.``; with :data:`TEMPORARY_SUFFIX` after the random part)."""
    return f"{TEMPORARY_PREFIX}{name}."


def is_stale_temporary(name: str) -> bool:
    """True for the name of a temporary file privmtl writes (``.privmtl-NAME.XXXX.tmp``); the
    temporaries of other tools (``.foo.tmp``) are not privmtl's."""
    return (
        name.startswith(TEMPORARY_PREFIX)
        and name.endswith(TEMPORARY_SUFFIX)
        and len(name) > len(TEMPORARY_PREFIX) + len(TEMPORARY_SUFFIX)
    )


def remove_stale_temporaries(directory: Path) -> list[str]:
    """Delete the temporary files a killed privmtl write left in ``directory``; their names.

    Only regular files with a name only privmtl writes (:func:`is_stale_temporary`) are removed,
    and only safely under the directory's lock (no live writer can own them).
    """
    removed = []
    for item in Path(directory).iterdir():
        if is_stale_temporary(item.name) and item.is_file() and not item.is_symlink():
            item.unlink(missing_ok=True)
            removed.append(item.name)
    return removed


@dataclass
class _Hold:
    """What this process holds of one directory's lock."""

    fd: int  # -1: no OS locking on this platform
    holds: int
    created: bool  # whether this process created the directory
    name: str  # the parameter the directory was first given as
    dev: int = 0
    ino: int = 0


class DirectoryLock:
    """The lock of one directory held by this process (see the module docstring).

    Use :func:`hold_directory`; :meth:`release` lets go of one hold, :meth:`verify` checks that
    the lock file is still the one held.
    """

    # resolved path -> this process's hold of it
    _held: ClassVar[dict[Path, _Hold]] = {}
    _mutex: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, path: Path) -> None:
        self.path = path
        self._released = False

    @classmethod
    def acquire(cls, directory: str | os.PathLike[str], *, name: str) -> DirectoryLock:
        """Take the lock of ``directory`` (created if missing) or raise naming its holder.

        ``name`` is the parameter the directory was given as (named in the error). Raises
        :class:`DirectoryLockedError` when another process holds it, when its lock file is not a
        regular file of its own (a symbolic link, a FIFO, a hard link), or when the lock file
        this process already holds was deleted or replaced.
        """
        d = Path(directory)
        created = not d.exists()
        d.mkdir(parents=True, exist_ok=True)
        key = d.resolve()
        with cls._mutex:
            held = cls._held.get(key)
            if held is not None:
                _check_same(held, key)
                held.holds += 1
                return cls(key)
            if fcntl is None:  # pragma: no cover - Windows
                warnings.warn(
                    f"No OS file locking on this platform (no fcntl): the '{name}' directory "
                    f"{str(d)!r} is not protected against a second process writing to it.",
                    PrivmtlWarning,
                    stacklevel=2,
                )
                cls._held[key] = _Hold(-1, 1, created, name)
                return cls(key)
            path = key / LOCK_NAME
            for _attempt in range(2):
                if not key.exists():  # removed by a holder that created it and just let go
                    key.mkdir(parents=True, exist_ok=True)
                    created = True
                fd = _open_lock_file(path, name=name, shown=d)
                if fd is None:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    os.close(fd)
                    raise DirectoryLockedError(
                        f"The '{name}' directory {str(d)!r} is in use by another privmtl process "
                        f"({_holder(path)}); wait for it to finish or choose another directory."
                    ) from None
                st = os.fstat(fd)
                if _names(path, st.st_dev, st.st_ino):
                    break
                os.close(fd)  # deleted or replaced between the open and the lock: once more
            else:
                raise DirectoryLockedError(
                    f"The lock file {str(path)!r} of the '{name}' directory was deleted or "
                    "replaced while privmtl was taking it; another process may be writing "
                    "there: wait for it to finish or choose another directory."
                )
            os.ftruncate(fd, 0)  # the file is privmtl's own (name, regular, one link, held)
            os.pwrite(fd, _describe_self().encode(), 0)
            cls._held[key] = _Hold(fd, 1, created, name, st.st_dev, st.st_ino)
        remove_stale_temporaries(key)
        return cls(key)

    def verify(self) -> None:
        """Raise :class:`DirectoryLockedError` when the lock file this process holds for the
        directory was deleted or replaced (its path no longer names the held file): another
        process may be writing there. Nothing happens once this hold was released."""
        if self._released:
            return
        with self._mutex:
            held = self._held.get(self.path)
            if held is not None:
                _check_same(held, self.path)

    def release(self) -> None:
        """Let go of this hold; the lock is released when the process's last hold goes. A
        directory this process created and left holding nothing but its own lock file (e.g. a
        run refused before it wrote anything) is removed, so a refusal leaves nothing behind."""
        if self._released:
            return
        self._released = True
        with self._mutex:
            held = self._held.get(self.path)
            if held is None:
                return
            if held.holds > 1:
                held.holds -= 1
                return
            del self._held[self.path]
            if held.fd >= 0:
                try:
                    if held.created:  # still holding the flock: no other process writes here
                        _remove_if_only_lock(self.path, held)
                finally:
                    os.close(held.fd)  # closing the descriptor releases the flock


def check_held(directory: str | os.PathLike[str]) -> None:
    """Before a durable write into ``directory``: raise :class:`DirectoryLockedError` when this
    process holds the directory's lock and its lock file was deleted or replaced (another
    process may be writing there). A directory this process does not hold is not checked."""
    if not DirectoryLock._held:
        return
    key = Path(directory).resolve()
    with DirectoryLock._mutex:
        held = DirectoryLock._held.get(key)
        if held is not None:
            _check_same(held, key)


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


def _open_lock_file(path: Path, *, name: str, shown: Path) -> int | None:
    """A descriptor of the lock file at ``path``, created if missing; None when its directory
    vanished. Refuses (one line) anything but a regular file with one link, following no link
    and writing nothing."""
    where = f"The lock file {str(path)!r} of the '{name}' directory {str(shown)!r}"
    try:
        st: os.stat_result | None = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None:
        _check_regular(st, where)
    try:
        fd = os.open(path, _OPEN_FLAGS, 0o644)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link put there since the stat
            raise DirectoryLockedError(
                f"{where} is a symbolic link; privmtl locks only a regular file of its own and "
                "follows no link: remove it or choose another directory."
            ) from None
        raise DirectoryLockedError(
            f"{where} cannot be opened ({exc.strerror or exc}); remove it or choose another "
            "directory."
        ) from None
    try:
        _check_regular(os.fstat(fd), where)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_regular(st: os.stat_result, where: str) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise DirectoryLockedError(
            f"{where} is a symbolic link; privmtl locks only a regular file of its own and "
            "follows no link: remove it or choose another directory."
        )
    if not stat.S_ISREG(st.st_mode):
        raise DirectoryLockedError(
            f"{where} is not a regular file; privmtl locks only a regular file of its own: "
            "remove it or choose another directory."
        )
    if st.st_nlink > 1:
        raise DirectoryLockedError(
            f"{where} has {st.st_nlink} hard links (another file shares it); privmtl locks only "
            "a file of its own: remove it or choose another directory."
        )


def _names(path: Path, dev: int, ino: int) -> bool:
    """Whether ``path`` (not followed) names the file of device ``dev`` and inode ``ino``."""
    try:
        now = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (dev, ino)


def _check_same(held: _Hold, directory: Path) -> None:
    """Raise when the lock file of ``directory`` is no longer the one ``held``."""
    if held.fd < 0:
        return
    path = directory / LOCK_NAME
    if not _names(path, held.dev, held.ino):
        raise DirectoryLockedError(
            f"The lock file {str(path)!r} of the '{held.name}' directory was deleted or replaced "
            "while this run held it; another process may be writing here: this run stops "
            "without writing more there."
        )


def _remove_if_only_lock(directory: Path, held: _Hold) -> None:
    """Remove ``directory`` when it holds nothing but the lock file ``held`` (best effort; a
    lock file that is no longer the one held is another process's and stays)."""
    path = directory / LOCK_NAME
    try:
        if any(p.name != LOCK_NAME for p in directory.iterdir()):
            return
        if not _names(path, held.dev, held.ino):
            return
        path.unlink()
        directory.rmdir()
    except OSError:
        pass


def _describe_self() -> str:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    command = " ".join(sys.argv) or sys.executable
    return f"pid {os.getpid()}, started {started}, command: {command}\n"


def _holder(path: Path) -> str:
    try:
        fd = os.open(
            path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        )
    except OSError:
        return "holder unknown"
    try:
        text = os.read(fd, 4096).decode(errors="replace")
    except OSError:
        text = ""
    finally:
        os.close(fd)
    return " ".join(text.split())[:300] or "holder unknown"
