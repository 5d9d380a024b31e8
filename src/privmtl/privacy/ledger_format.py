"""The ledger file's format, line by line: its header constants, the limits on a recorded event
(:func:`check_event_dict`), the MAC chain of its lines, and the scan that parses, verifies and
(when asked) repairs a file. :mod:`privmtl.privacy.ledger` writes and reads ledgers through it;
the format itself is described there."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privmtl.exceptions import InvalidParameterError
from privmtl.trust import user_key

__all__ = [
    "LEDGER_FORMAT",
    "LEDGER_VERSION",
    "MAX_EVENT_COUNT",
    "MAX_EVENT_DEPTH",
    "check_event_dict",
]

LEDGER_FORMAT = "privmtl-ledger"
LEDGER_VERSION = 1

#: The largest count a recorded event may state (self-composition count, population, sample).
MAX_EVENT_COUNT = 10**6
#: The deepest nesting of events a recorded event may have.
MAX_EVENT_DEPTH = 8
_MAC_FIELD = "mac"
_MAC_DOMAIN = b"privmtl-ledger-mac\n"
_EVENT_TYPES = ("noop", "non_private", "gaussian", "poisson", "fixed", "self_composed", "composed")


def _body_bytes(row: dict[str, Any]) -> bytes:
    body = {k: v for k, v in row.items() if k != _MAC_FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _chain_mac(key: bytes, prev: str, row: dict[str, Any]) -> str:
    """The MAC of ``row`` after a line whose MAC is ``prev`` ("" for the header)."""
    msg = _MAC_DOMAIN + prev.encode("ascii", "replace") + b"\n" + _body_bytes(row)
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def _check_count(data: dict[str, Any], key: str, where: str, low: int = 1) -> int:
    v = data.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= MAX_EVENT_COUNT:
        raise InvalidParameterError(
            f"{where}: {key} must be an integer in [{low}, {MAX_EVENT_COUNT}]; got {v!r}."
        )
    return v


def _check_real_field(data: dict[str, Any], key: str, where: str, high: float | None) -> None:
    v = data.get(key)
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
    if not ok or (high is not None and float(v) > high):  # type: ignore[arg-type]
        bound = "[0, 1]" if high is not None else "a finite number >= 0"
        raise InvalidParameterError(f"{where}: {key} must be {bound}; got {v!r}.")


def check_event_dict(data: Any, *, where: str = "the event", depth: int = 0) -> None:
    """Refuse a serialized event that privmtl would not write (module doc, Bounds): an unknown
    type, a count outside ``[1, MAX_EVENT_COUNT]``, a probability outside ``[0, 1]``, a noise
    multiplier that is negative or not finite, nesting deeper than ``MAX_EVENT_DEPTH``.
    :class:`InvalidParameterError` in one line naming ``where`` and the value."""
    if depth > MAX_EVENT_DEPTH:
        raise InvalidParameterError(f"{where} is nested deeper than {MAX_EVENT_DEPTH} events.")
    if not isinstance(data, dict) or data.get("type") not in _EVENT_TYPES:
        got = data.get("type") if isinstance(data, dict) else type(data).__name__
        raise InvalidParameterError(f"{where}: unknown privacy event type {got!r}.")
    kind = data["type"]
    if kind == "gaussian":
        _check_real_field(data, "noise_multiplier", where, None)
    elif kind == "poisson":
        _check_real_field(data, "sampling_probability", where, 1.0)
    elif kind == "fixed":
        n = _check_count(data, "source_dataset_size", where)
        m = _check_count(data, "sample_size", where, low=0)
        if m > n:
            raise InvalidParameterError(
                f"{where}: sample_size {m} exceeds source_dataset_size {n}."
            )
    elif kind == "self_composed":
        _check_count(data, "count", where)
    if kind in ("poisson", "fixed", "self_composed"):
        check_event_dict(data.get("event"), where=where, depth=depth + 1)
    elif kind == "composed":
        events = data.get("events")
        if not isinstance(events, list) or len(events) > MAX_EVENT_COUNT:
            raise InvalidParameterError(
                f"{where}: events must be a list of at most {MAX_EVENT_COUNT} events."
            )
        for e in events:
            check_event_dict(e, where=where, depth=depth + 1)


def _regular_file(p: Path) -> None:
    """Refuse a ledger path that exists and is not a regular file (no link, no device)."""
    try:
        mode = os.lstat(p).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise InvalidParameterError(f"The ledger {p} cannot be read: {exc.strerror}.") from None
    if not stat.S_ISREG(mode):
        raise InvalidParameterError(
            f"The ledger {p} must be a regular file (not a symbolic link, device or folder)."
        )


@dataclass
class _Scan:
    path: Path
    header: dict[str, Any]
    entries: list[dict[str, Any]]  # the releases
    digests: list[str]  # SHA-256 of the bytes up to the header and up to each release
    authenticated: bool
    authentication: str  # why not, when not
    last_mac: str
    closed: bool  # the last line is a closing line for every release
    incomplete: str  # why the file is not complete ("" when it is)


def _parse_line(p: Path, i: int, line: bytes) -> dict[str, Any]:
    try:
        row = json.loads(line.decode("utf-8"))
    except RecursionError:
        raise InvalidParameterError(
            f"The ledger {p} is corrupt at line {i + 1} (nested too deeply)."
        ) from None
    except ValueError:  # JSON or UTF-8
        raise InvalidParameterError(
            f"The ledger {p} is corrupt at line {i + 1} (not JSON)."
        ) from None
    if not isinstance(row, dict):
        raise InvalidParameterError(
            f"The ledger {p} is corrupt at line {i + 1} (not a JSON object)."
        )
    return row


def _scan_ledger(path: str | os.PathLike[str], *, repair: bool) -> _Scan:
    """The lines of a ledger file, their digests (what :meth:`PrivacyLedger.check_seen`
    compares), whether the MAC chain verifies and whether the file is complete (module doc)."""
    p = Path(path)
    if p.is_dir():
        p = p / "ledger.jsonl"
    _regular_file(p)
    if not p.is_file():
        raise InvalidParameterError(f"No ledger file at {p}.")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InvalidParameterError(f"The ledger {p} cannot be read: {exc.strerror}.") from None
    lines = raw.split(b"\n")
    complete, tail = lines[:-1], lines[-1]
    incomplete = ""
    if tail.strip():
        try:  # a whole record that lost only its newline is counted, never dropped
            _parse_line(p, len(complete), tail)
            complete.append(tail)
            incomplete = "its last line has no newline (the file was cut)"
            fix: bytes | None = b"\n"
        except InvalidParameterError:  # torn: record() never returned, the release never left
            incomplete = (
                "its last line is torn (the run was killed while writing it, or the file was cut)"
            )
            fix = None
        if repair:
            with open(p, "r+b") as fh:
                if fix is None:
                    fh.truncate(len(raw) - len(tail))
                else:
                    fh.seek(0, os.SEEK_END)
                    fh.write(fix)
                fh.flush()
                os.fsync(fh.fileno())
    key = user_key(create=False)
    prev, why = "", "" if key is not None else "this user has no signing key to verify it with"
    parsed: list[dict[str, Any]] = []
    digests: list[str] = []
    closed = False
    sha = hashlib.sha256()
    for i, line in enumerate(complete):
        sha.update(line + b"\n")
        if not line.strip():
            continue
        row = _parse_line(p, i, line)
        if not why:
            mac = row.get(_MAC_FIELD)
            assert key is not None
            if not isinstance(mac, str):
                why = (
                    f"line {i + 1} carries no MAC (written before ledgers carried them, or edited)"
                )
            elif not hmac.compare_digest(
                mac.encode("ascii", "replace"), _chain_mac(key, prev, row).encode()
            ):
                why = (
                    f"line {i + 1} does not carry this user's MAC (edited, moved, or a line before "
                    "it removed; or written by another user)"
                )
            else:
                prev = mac
        if parsed and row.get("closing") is True:
            n = len(parsed) - 1
            if row.get("releases") != n:
                raise InvalidParameterError(
                    f"The ledger {p} is corrupt at line {i + 1}: its closing line states "
                    f"{row.get('releases')!r} releases after {n}."
                )
            closed = True
            continue
        closed = False
        parsed.append(row)
        digests.append(sha.hexdigest())
    if not parsed or parsed[0].get("format") != LEDGER_FORMAT:
        raise InvalidParameterError(f"{p} is not a privmtl ledger (no '{LEDGER_FORMAT}' header).")
    header = parsed[0]
    if header.get("version") != LEDGER_VERSION:
        raise InvalidParameterError(
            f"The ledger {p} has format version {header.get('version')!r}; this privmtl reads "
            f"version {LEDGER_VERSION}."
        )
    missing = [k for k in ("delta", "accountant", "relation") if k not in header]
    if missing:
        raise InvalidParameterError(
            f"The ledger {p} has a header without {', '.join(map(repr, missing))}."
        )
    if not closed and not incomplete:
        incomplete = "no closing line (the run was killed or is still running, or the file was cut)"
    return _Scan(
        path=p,
        header=header,
        entries=parsed[1:],
        digests=digests,
        authenticated=not why,
        authentication=why or "every line carries this user's MAC",
        last_mac=prev,
        closed=closed,
        incomplete="" if closed and not incomplete else incomplete,
    )
