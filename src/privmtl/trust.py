"""What privmtl believes of a file it reads back: its own signature, and paths kept in their folder.

A folder of saved models (``model.json``) or a result file can name code to run: a user's model
factory. privmtl runs such code only if the user says so (names the factory again, or passes
``--trust-code``) or if the file carries this user's signature: an HMAC-SHA256 of the file's
canonical content (:func:`canonical`, every field but ``signature``) under a secret key kept in the
user's configuration folder (:func:`config_dir`). privmtl signs what it writes and later reloads
code or paths from (:func:`sign`); :func:`is_signed` checks a document read back. A file written by
someone else, or edited after privmtl wrote it, is not signed by this user.

The key is ``signing.key`` in :func:`config_dir`: 32 random bytes (hex), created on first use
with mode 0600 by an atomic link, so two processes starting together end with one key. A key that
other users could read or write (any group or other permission bit), that another user owns, or
that is not a regular file is refused (``chmod 600`` it, or remove it): whoever can read it can
sign for this user. A run that will sign calls :func:`check_signing_key` before its first round,
so a bad key or an unwritable configuration folder stops it before any work.

:func:`folder_file` resolves a file name recorded in a folder's ``model.json``: a name relative
to the folder that stays inside it (no absolute path, no ``..``, no symbolic link out of it).
:func:`followed_data_path` is the rule for a recorded data path: followed for a signed folder;
for an unsigned one only inside the folder, otherwise the user passes ``--data-path``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
import tempfile
from pathlib import Path
from typing import Any

from privmtl.exceptions import DataFormatError, InvalidParameterError

__all__ = [
    "CONFIG_DIR_ENV",
    "SIGNATURE_FIELD",
    "TRUST_ADVICE",
    "canonical",
    "check_signing_key",
    "config_dir",
    "folder_file",
    "followed_data_path",
    "is_signed",
    "sign",
    "untrusted_code",
    "user_key",
]

CONFIG_DIR_ENV = "PRIVMTL_CONFIG_DIR"
"""Environment variable naming the user's privmtl configuration folder (holds the signing key)."""

SIGNATURE_FIELD = "signature"
"""The top-level field of a signed JSON document: ``"hmac-sha256:<hex>"``."""

TRUST_ADVICE = "pass --model SPEC naming your factory, or --trust-code if you trust who wrote it"
"""The ways out of a refusal to run code that this user did not sign."""

_ALGORITHM = "hmac-sha256"
_KEY_FILE = "signing.key"
_KEY_BYTES = 32


def config_dir() -> Path:
    """The user's privmtl configuration folder.

    ``$PRIVMTL_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/privmtl``, else ``~/.config/privmtl``.
    """
    env = os.environ.get(CONFIG_DIR_ENV)
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return Path(xdg if xdg else Path.home() / ".config") / "privmtl"


def _read_key(path: Path) -> bytes | None:
    """The key in ``path``; None when there is none. Raises on a key that is unsafe or unusable."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (FileNotFoundError, NotADirectoryError):  # no key there (yet)
        return None
    except OSError as exc:
        raise _key_error(path, f"cannot be opened ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _key_error(path, "is not a regular file")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise _key_error(path, f"belongs to another user (uid {st.st_uid})")
        if st.st_mode & 0o077:
            raise InvalidParameterError(
                f"The signing key {path} has mode {stat.S_IMODE(st.st_mode):04o}: other users "
                f"could read or change it; run `chmod 600 {path}` (or remove it: privmtl makes a "
                "new one, and folders signed with the old key are no longer signed)."
            )
        with os.fdopen(fd, "rb", closefd=False) as fh:
            raw = fh.read(4 * _KEY_BYTES + 2)
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) < _KEY_BYTES:
        raise _key_error(path, f"does not hold {_KEY_BYTES} hex bytes")
    return key


def _key_error(path: Path, why: str) -> InvalidParameterError:
    return InvalidParameterError(
        f"The signing key {path} {why}; remove it (privmtl makes a new one) or set "
        f"{CONFIG_DIR_ENV} to another folder."
    )


def user_key(*, create: bool = True) -> bytes | None:
    """This user's signing key; created (mode 0600, atomically) when missing and ``create``.

    Returns None when there is no key and ``create`` is false.

    Raises
    ------
    InvalidParameterError
        The key cannot be created, or the file there is not a usable key of this user's alone
        (other users' permission bits, another owner, not a regular file, not hex): one line
        naming the file and the way out.
    """
    folder = config_dir()
    path = folder / _KEY_FILE
    key = _read_key(path)
    if key is not None or not create:
        return key
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".privmtl-{_KEY_FILE}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="ascii") as fh:  # mkstemp: mode 0600
                fh.write(secrets.token_bytes(_KEY_BYTES).hex() + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, path)  # fails if another process made the key first: keep theirs
            except FileExistsError:
                pass
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError as exc:
        raise InvalidParameterError(
            f"cannot create the signing key in {folder} ({exc.strerror or exc}); set "
            f"{CONFIG_DIR_ENV} to a writable folder."
        ) from None
    key = _read_key(path)
    if key is None:  # pragma: no cover - removed between the link and the read
        raise _key_error(path, "disappeared while it was made")
    return key


def check_signing_key() -> None:
    """Make sure this user can sign, before a run that will sign does any work.

    Reads the key (refusing an unsafe or malformed one, as :func:`user_key` does) or creates it
    (so an uncreatable configuration folder is reported now, not after training).

    Raises
    ------
    InvalidParameterError
        One line naming the key file or folder and what to do.
    """
    user_key(create=True)


def canonical(doc: dict[str, Any]) -> bytes:
    """The bytes a signature covers: ``doc`` without its signature, sorted keys, compact JSON."""
    body = {k: v for k, v in doc.items() if k != SIGNATURE_FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _mac(key: bytes, doc: dict[str, Any]) -> str:
    return hmac.new(key, canonical(doc), hashlib.sha256).hexdigest()


def sign(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` as its JSON text reads back, with this user's signature (creates the key if needed).

    The signature is computed over the document as ``json.loads(json.dumps(doc, default=str))``
    returns it (tuples as lists, other objects as strings), which is what a reader verifies.
    """
    plain = json.loads(json.dumps(doc, default=str))
    plain.pop(SIGNATURE_FIELD, None)
    key = user_key(create=True)
    assert key is not None
    return {**plain, SIGNATURE_FIELD: f"{_ALGORITHM}:{_mac(key, plain)}"}


def is_signed(doc: Any) -> bool:
    """Whether ``doc`` (a parsed JSON document) carries a valid signature of this user's key."""
    if not isinstance(doc, dict):
        return False
    value = doc.get(SIGNATURE_FIELD)
    if not isinstance(value, str) or not value.startswith(_ALGORITHM + ":"):
        return False
    key = user_key(create=False)
    if key is None:
        return False
    given = value[len(_ALGORITHM) + 1 :]
    return hmac.compare_digest(given.encode("ascii", "replace"), _mac(key, doc).encode("ascii"))


def untrusted_code(where: str, model: str, kind: str = "model") -> DataFormatError:
    """The one-line refusal to run code for ``model`` (a ``kind``: model or method) that
    ``where`` holds, unsigned."""
    advice = (
        TRUST_ADVICE
        if kind == "model"
        else TRUST_ADVICE.replace(
            "--model SPEC naming your factory", f"--{kind} SPEC naming your {kind}"
        )
    )
    return DataFormatError(
        f"{where} holds code for {kind} {model!r} that this user did not sign; {advice}."
    )


def folder_file(folder: Path, name: Any, *, where: str, key: str) -> Path:
    """The file ``name`` recorded under ``key`` in ``where``, checked to stay inside ``folder``.

    Raises
    ------
    DataFormatError
        ``name`` is not a string, is absolute, has a ``..`` part, or resolves (symbolic links
        followed) outside ``folder``.
    """
    bad = (
        not isinstance(name, str)
        or not name
        or "\x00" in name
        or Path(name).is_absolute()
        or ".." in Path(name).parts
        or "\\" in name
    )
    if not bad:
        path = folder / name
        bad = not path.resolve().is_relative_to(folder.resolve())
    if bad:
        raise DataFormatError(
            f"{where}: {key} = {name!r} must name a file inside {folder} (a relative name, no "
            "'..', no link out of the folder)."
        )
    return path


def followed_data_path(recorded: Any, given: Any, *, folder: Path, signed: bool, where: str) -> Any:
    """The data path an evaluation reads: ``given``, else the recorded one where that is allowed.

    A recorded path is followed for a signed folder (this user wrote it) or when it lies inside
    ``folder``; otherwise the user passes ``--data-path``.

    Raises
    ------
    DataFormatError
        Unsigned folder, no ``given`` path, recorded path outside the folder (one line).
    """
    if given is not None or recorded is None:
        return given
    if signed:
        return recorded
    if isinstance(recorded, str) and (folder / recorded).resolve().is_relative_to(folder.resolve()):
        return str(folder / recorded)
    raise DataFormatError(
        f"{where} is not signed by this user: its recorded data path {recorded!r} is not "
        "followed; pass --data-path naming the data."
    )
