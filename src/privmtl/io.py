"""File output shared by every layer: atomic writes, strict-JSON conversion, append-only run logs.

Nothing here knows about privacy or models. A file is either written completely or not at all
(temporary file, ``fsync``, atomic rename); a JSON-lines run log is appended one ``fsync``-ed line
per finished run, and a torn last line (the process killed mid-write) is dropped when read back.

Every temporary file or folder written here has a name only privmtl writes,
``.privmtl-NAME.XXXX.tmp`` (:func:`privmtl.locking.temporary_prefix`): the run that next takes the
directory's lock removes those a killed write left behind, and nothing else. A write into a
directory whose lock this process holds first checks that the lock is still its own
(:func:`privmtl.locking.check_held`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.jsonfile import JSON_MAX_DEPTH, read_json
from privmtl.locking import TEMPORARY_SUFFIX, check_held, temporary_prefix

__all__ = [
    "JSON_MAX_DEPTH",
    "append_jsonl",
    "arrays_sha256",
    "atomic_output_dir",
    "check_output_file",
    "check_writable_dir",
    "fsync_dir",
    "load_jsonl",
    "read_json",
    "remove_durably",
    "staged_folder",
    "to_jsonable",
    "write_atomic",
    "write_atomic_with",
    "write_json_atomic",
]


def to_jsonable(obj: Any) -> Any:
    """Convert NumPy scalars/arrays, paths and non-finite floats (→ None) for strict JSON."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return to_jsonable(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def arrays_sha256(arrays: Iterable[Any]) -> str:
    """SHA-256 of the contents of a sequence of arrays, streamed one array at a time.

    Each array (NumPy, or anything :func:`numpy.asarray` reads without copying it off a device,
    e.g. a CPU tensor) adds its dtype, its shape and its bytes in C order: two sequences hash
    equal only when every array has the same type, shape and values, in the same order.
    """
    h = hashlib.sha256()
    for arr in arrays:
        a = np.ascontiguousarray(np.asarray(arr))
        h.update(f"{a.dtype.str}{a.shape};".encode())
        h.update(a.data if a.size else b"")
    return h.hexdigest()


def fsync_dir(directory: Path) -> None:
    """``fsync`` a directory so that renames and new files in it are durable."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_durably(path: Path) -> None:
    """Remove ``path`` if it exists, durably (its directory fsynced): a folder's index (its
    ``model.json``) goes before the files it lists are rewritten, so a write cut short leaves a
    folder without an index, refused as incomplete, never the old index over new files."""
    if path.exists():
        path.unlink()
        fsync_dir(path.parent)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file, ``fsync`` and an atomic rename."""
    write_atomic_with(path, lambda fh: fh.write(data))


def write_atomic_with(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """:func:`write_atomic` of what ``write`` writes into the open temporary file (streamed to
    disk: nothing is assembled in memory first). The temporary is ``.privmtl-NAME.XXXX.tmp``
    beside ``path``; a directory this process holds is checked to be still its own first."""
    check_held(path.parent)
    fd, tmp = tempfile.mkstemp(
        dir=path.parent, prefix=temporary_prefix(path.name), suffix=TEMPORARY_SUFFIX
    )
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write ``payload`` as strict JSON to ``path`` atomically (creating the parent folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(to_jsonable(payload), indent=2) + "\n").encode())


@contextmanager
def atomic_output_dir(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory (``.privmtl-NAME.XXXX.tmp``); move its files into
    ``final`` only on success."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(
        tempfile.mkdtemp(
            dir=final.parent, prefix=temporary_prefix(final.name), suffix=TEMPORARY_SUFFIX
        )
    )
    try:
        yield tmp
        check_held(final)
        final.mkdir(parents=True, exist_ok=True)
        for item in tmp.iterdir():
            os.replace(item, final / item.name)
        tmp.rmdir()
    except BaseException:
        for item in tmp.iterdir():
            item.unlink()
        tmp.rmdir()
        raise


def check_writable_dir(path: Path, *, name: str, create: bool = False) -> Path:
    """Check, before any computation, that folder ``path`` exists or can be created, and is writable.

    The nearest existing folder on the way to ``path`` must be a folder where a probe file can be
    written and removed; ``path`` is created only when ``create`` is true. Raises
    :class:`~privmtl.exceptions.InvalidParameterError` naming the parameter ``name`` otherwise.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InvalidParameterError(
            f"The '{name}' parameter must be a folder; got {str(path)!r}, which is a file."
        )
    probe_dir = path.absolute()
    while not probe_dir.exists():
        probe_dir = probe_dir.parent
    try:
        if not probe_dir.is_dir():
            raise NotADirectoryError(20, f"{str(probe_dir)!r} is not a folder")
        fd, probe = tempfile.mkstemp(
            dir=probe_dir, prefix=temporary_prefix("write-probe"), suffix=TEMPORARY_SUFFIX
        )
        os.close(fd)
        os.unlink(probe)
        if create:
            path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidParameterError(
            f"The '{name}' parameter must be a writable folder; got {str(path)!r} "
            f"({exc.strerror or exc})."
        ) from None
    return path


def check_output_file(
    path: str | os.PathLike[str], *, name: str, suffixes: tuple[str, ...], kind: str
) -> Path:
    """``path`` as a :class:`~pathlib.Path`, checked before any computation: a file name ending
    in one of ``suffixes`` (``kind`` names them in the error), not a folder, in a folder that
    exists or can be created and is writable. Raises
    :class:`~privmtl.exceptions.InvalidParameterError` naming the parameter ``name``."""
    p = Path(path)
    if p.suffix.lower() not in suffixes:
        raise InvalidParameterError(
            f"The '{name}' parameter must name {kind} file; got {str(p)!r}."
        )
    if p.is_dir():
        raise InvalidParameterError(
            f"The '{name}' parameter must name a file; got {str(p)!r}, which is a folder."
        )
    try:
        check_writable_dir(p.parent, name=name)
    except InvalidParameterError:
        raise InvalidParameterError(
            f"The '{name}' parameter must name a file in a writable folder; got {str(p)!r} "
            f"(cannot write in {str(p.parent)!r})."
        ) from None
    return p


def append_jsonl(path: Path, row: dict[str, Any]) -> None:
    """Append one record as a JSON line and ``fsync`` it (a finished run survives a kill)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    check_held(path.parent)
    line = (json.dumps(to_jsonable(row)) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines log; a torn last line (killed mid-write) is dropped and cut off.

    Only a last line without its newline can be torn: it is removed from the file so that the next
    :func:`append_jsonl` starts on a fresh line. A malformed complete line is an error.
    """
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        with path.open("r+b") as fh:
            fh.truncate(cut)
            fh.flush()
            os.fsync(fh.fileno())
        data = data[:cut]
    rows = []
    for number, line in enumerate(data.decode().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataFormatError(
                    f"{path}, line {number}: not a JSON object ({exc})."
                ) from None
    return rows


class _HashingWriter:
    """A binary file's ``write`` that also feeds a SHA-256 (the hash of what reaches the file)."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh, self.sha256 = fh, hashlib.sha256()

    def write(self, data: Any) -> int:
        self.sha256.update(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


class StagedFolder:
    """Files of a folder written in a hidden staging folder inside it, hashed while written.

    :meth:`write` writes one payload file and returns its SHA-256; :meth:`commit` writes the
    folder's index (``model.json``, which lists the payload's hashes) and moves everything into
    place, the old index removed first and the new one moved last: a folder is never left with
    payload files of one write and the index of another, and a write that fails before
    :meth:`commit` leaves the folder as it was (:func:`staged_folder` removes the staging folder).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        # a name only privmtl writes, ending in .tmp: a folder a killed save left is a temporary
        self.staging = Path(
            tempfile.mkdtemp(dir=self.folder, prefix=".privmtl-staging-", suffix=".tmp")
        )
        self.names: list[str] = []

    def write(self, name: str, write: Callable[[BinaryIO], object]) -> str:
        """Write payload file ``name`` with ``write(file)``, streamed; its SHA-256 (hex)."""
        with (self.staging / name).open("xb") as fh:
            hashing = _HashingWriter(fh)
            write(hashing)  # type: ignore[arg-type]
            fh.flush()
            os.fsync(fh.fileno())
        self.names.append(name)
        return hashing.sha256.hexdigest()

    def commit(self, index: str, data: bytes) -> None:
        """Write the index file ``index`` and move the payload, then the index, into the folder."""
        with (self.staging / index).open("xb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        fsync_dir(self.staging)
        remove_durably(self.folder / index)
        for name in self.names:
            os.replace(self.staging / name, self.folder / name)
        fsync_dir(self.folder)
        os.replace(self.staging / index, self.folder / index)
        fsync_dir(self.folder)
        self.staging.rmdir()


@contextmanager
def staged_folder(folder: str | os.PathLike[str]) -> Iterator[StagedFolder]:
    """A :class:`StagedFolder` of ``folder``; its staging folder is removed however the block
    ends (after :meth:`StagedFolder.commit` it is already gone)."""
    staged = StagedFolder(Path(folder))
    try:
        yield staged
    finally:
        if staged.staging.exists():
            shutil.rmtree(staged.staging, ignore_errors=True)
