"""The files of a folder of saved models, checked against its ``model.json``, without PyTorch.

A folder's ``model.json`` records the SHA-256 of every file it lists (``files_sha256``): a file is
used only from inside the folder and only if it is the one written. The checks need the standard
library only, so ``privmtl report`` reads a folder's per-client rows through them without loading
the saved-model modules (:mod:`privmtl.federated.saved`, :mod:`privmtl.linear.saved`, which use
them for every file they load).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from pathlib import Path
from typing import Any

from privmtl.exceptions import DataFormatError
from privmtl.trust import folder_file

__all__ = ["check_file_digest", "linear_clients_file", "recorded_digest", "verified_file"]


_HASH_CHUNK = 1 << 20

# files whose SHA-256 this process checked: (path, device, inode, size, mtime) -> digest
_VERIFIED: dict[tuple[str, int, int, int, int], str] = {}


def check_file_digest(path: Path, digest: str, where: str, key: str) -> None:
    """Refuse ``path`` unless its SHA-256 is ``digest`` (streamed; a file checked before and not
    changed since is not read again)."""
    st = path.stat()
    seen = (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if _VERIFIED.get(seen) == digest:
        return
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            h.update(chunk)
    now = h.hexdigest()
    if not hmac.compare_digest(now, digest):
        raise DataFormatError(
            f"{path} ({where} {key}) is not the file model.json was written with: its SHA-256 "
            f"{now[:12]}... differs from the recorded {digest[:12]}... (files_sha256); "
            "refusing to use it."
        )
    _VERIFIED[seen] = digest


_SHA256 = re.compile(r"[0-9a-f]{64}")


def recorded_digest(meta: dict[str, Any], name: str, where: str, key: str) -> str:
    """The SHA-256 ``meta`` records for file ``name`` (refused when there is none)."""
    hashes = meta.get("files_sha256")
    digest = hashes.get(name) if isinstance(hashes, dict) else None
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
        raise DataFormatError(
            f"{where}: files_sha256[{name!r}] must be the SHA-256 of {key}; got {digest!r}."
        )
    return digest


def verified_file(
    directory: str | os.PathLike[str], meta: dict[str, Any], key: str, *, where: str | None = None
) -> Path | None:
    """The file ``files[key]`` of a folder whose ``model.json`` is ``meta``, inside the folder and
    with the SHA-256 the signed ``model.json`` records; None when ``files`` names none.

    Raises
    ------
    DataFormatError
        A name outside the folder, no recorded SHA-256, or a file that is not the one written.
    """
    d = Path(directory)
    where = where or str(d / "model.json")
    name = meta.get("files", {}).get(key)
    if name is None:
        return None
    path = folder_file(d, name, where=where, key=f"files.{key}")
    check_file_digest(
        path, recorded_digest(meta, name, where, f"files.{key}"), where, f"files.{key}"
    )
    return path


def linear_clients_file(directory: str | os.PathLike[str], meta: dict[str, Any]) -> Path | None:
    """The per-task rows file (``clients.file``) of a folder whose ``model.json`` is ``meta``,
    inside the folder and with the SHA-256 the signed ``model.json`` records; None without one.

    Raises
    ------
    DataFormatError
        A name outside the folder, no recorded SHA-256, or a file that is not the one written.
    """
    d = Path(directory)
    where = str(d / "model.json")
    record = meta.get("clients")
    if not isinstance(record, dict):
        return None
    path = folder_file(d, record.get("file"), where=where, key="clients.file")
    hashes = meta.get("files_sha256")
    digest = hashes.get(path.name) if isinstance(hashes, dict) else None
    if not isinstance(digest, str) or len(digest) != 64:
        raise DataFormatError(f"{where}: files_sha256[{path.name!r}] must be its SHA-256.")
    try:
        now = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise DataFormatError(f"{path} cannot be read: {exc.strerror or exc}.") from None
    if not hmac.compare_digest(now, digest):
        raise DataFormatError(
            f"{path} is not the file model.json was written with (its SHA-256 differs from "
            "files_sha256); refusing to use it."
        )
    return path
