"""Atomic checkpoints of a run's state, refused when they do not belong to the run resuming them.

A checkpoint directory holds

* ``state-<step>.pt`` — ``torch.save`` of the run's state: nested dicts/lists of tensors and JSON
  scalars (curator and client states, generator states in seeded mode);
* ``manifest.json`` — format name and version, the kind of run, its configuration and the
  configuration's fingerprint (for the data: a SHA-256 of its contents), the step (round or
  iteration) reached, the noise source, the name of the state file and its SHA-256, and what the
  checkpoint saw of the ledger (``ledger``: the number of releases and the SHA-256 of the ledger
  file up to the last of them, :meth:`~privmtl.privacy.ledger.PrivacyLedger.seen`), signed with
  the user's key (:func:`privmtl.trust.sign`);
* ``ledger.jsonl`` — the run's durable privacy ledger (:mod:`privmtl.privacy.ledger`), appended to
  by the curator before every release and never rewritten by a checkpoint;
* ``.privmtl.lock`` — the lock of the run writing the directory (:mod:`privmtl.locking`).

:func:`save_checkpoint` writes the state to a new file (temporary name, ``fsync``, rename), then
replaces the manifest the same way (the manifest names the new state file and its hash), syncs the
directory, and only then deletes the previous state file. A process killed at any instant leaves
a manifest naming a complete state file: the previous checkpoint or the new one. A state file
that does not match its manifest is reported as corrupt, never loaded.

The manifest is what makes the state file and the ledger the run's, so it is authenticated: it
carries the user's signature (an HMAC under the key in the user's configuration folder,
:mod:`privmtl.trust`), and :func:`load_checkpoint` and :func:`ledger_seen` refuse a manifest
that is not signed by this user's key — edited (a cut ledger's length and hash, another state
file's hash written into it), or written by another user. Its ``state_file`` must name a file
inside the directory (:func:`privmtl.trust.folder_file`). A manifest that is not a JSON object,
not UTF-8, or nested beyond what the JSON reader takes is refused in one line as unreadable.

The ledger is the truth about what was released: a run resumed from a checkpoint opens its ledger
with what the manifest saw (:meth:`PrivacyLedger.open(..., seen=manifest["ledger"])
<privmtl.privacy.ledger.PrivacyLedger.open>`), which refuses a ledger shorter than the one the
checkpoint saw or whose prefix differs from it (deleted, emptied, truncated, edited), so that no
resumed run reports an ε below that of the releases that were made.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import torch

from privmtl import trust
from privmtl.exceptions import PrivmtlError
from privmtl.io import fsync_dir as _fsync_dir
from privmtl.io import write_atomic
from privmtl.locking import check_held

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "CheckpointError",
    "config_fingerprint",
    "has_checkpoint",
    "ledger_seen",
    "load_checkpoint",
    "save_checkpoint",
    "write_atomic",
]

FORMAT = "privmtl-checkpoint"
FORMAT_VERSION = 3
_MANIFEST = "manifest.json"


class CheckpointError(PrivmtlError):
    """A checkpoint is missing, corrupt, of another format, or from another configuration."""


def _canonical(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=str, separators=(",", ":"))


def config_fingerprint(config: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a configuration."""
    return hashlib.sha256(_canonical(config).encode()).hexdigest()


def has_checkpoint(directory: str | os.PathLike[str]) -> bool:
    """True when ``directory`` holds a checkpoint manifest."""
    return (Path(directory) / _MANIFEST).is_file()


def save_checkpoint(
    directory: str | os.PathLike[str],
    *,
    kind: str,
    config: dict[str, Any],
    state: dict[str, Any],
    step: int,
    noise_source: str,
    ledger: dict[str, Any] | None = None,
) -> None:
    """Write ``state`` atomically as the checkpoint of a ``kind`` run at ``step`` (module doc).

    ``ledger`` is what the run's durable ledger holds now
    (:meth:`~privmtl.privacy.ledger.PrivacyLedger.seen`; None: the run has no ledger).
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    check_held(d)  # a run whose directory lock was taken from it writes no checkpoint
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    state_file = f"state-{int(step):08d}.pt"
    write_atomic(d / state_file, data)
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "kind": kind,
        "step": int(step),
        "noise_source": noise_source,
        "config": json.loads(_canonical(config)),
        "config_fingerprint": config_fingerprint(config),
        "state_file": state_file,
        "state_sha256": hashlib.sha256(data).hexdigest(),
        "ledger": ledger,
    }
    signed = trust.sign(manifest)
    write_atomic(d / _MANIFEST, (json.dumps(signed, indent=2, sort_keys=True) + "\n").encode())
    _fsync_dir(d)
    for old in d.glob("state-*.pt"):  # the manifest no longer names them
        if old.name != state_file:
            old.unlink(missing_ok=True)


def _differing_keys(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    keys = sorted(set(saved) | set(current))
    return [k for k in keys if _canonical({"v": saved.get(k)}) != _canonical({"v": current.get(k)})]


def load_checkpoint(
    directory: str | os.PathLike[str], *, kind: str, config: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(state, manifest)`` of the checkpoint in ``directory``, after checking that it is ours.

    Raises :class:`CheckpointError` (one line naming what differs) for a missing or unreadable
    manifest, another format or version, another kind of run, another configuration (the first
    differing keys and their two values), or a state file whose hash does not match.
    """
    d = Path(directory)
    mpath = d / _MANIFEST
    if not mpath.is_file():
        raise CheckpointError(f"No checkpoint in {d} (no {_MANIFEST}).")
    manifest = _read_manifest(d)
    if manifest.get("kind") != kind:
        raise CheckpointError(
            f"The checkpoint in {d} is of a {manifest.get('kind')!r} run, not {kind!r}."
        )
    if manifest.get("config_fingerprint") != config_fingerprint(config):
        saved = manifest.get("config", {})
        current = json.loads(_canonical(config))
        diff = _differing_keys(saved, current)
        shown = "; ".join(
            f"{k}: {saved.get(k)!r} (checkpoint) vs {current.get(k)!r} (now)" for k in diff[:3]
        )
        raise CheckpointError(
            f"The checkpoint in {d} is from another configuration: {shown or 'fingerprint differs'}."
        )
    try:
        spath = trust.folder_file(
            d,
            manifest.get("state_file"),
            where=f"The checkpoint manifest {mpath}",
            key="state_file",
        )
    except PrivmtlError as exc:
        raise CheckpointError(str(exc)) from None
    try:
        data = spath.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"The checkpoint state {spath} is unreadable: {exc}.") from None
    if hashlib.sha256(data).hexdigest() != manifest.get("state_sha256"):
        raise CheckpointError(f"The checkpoint state {spath} is corrupt (its hash does not match).")
    try:
        state = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"The checkpoint state {spath} cannot be loaded: {exc}.") from None
    return state, manifest


def ledger_seen(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """What the checkpoint in ``directory`` saw of its ledger (``manifest["ledger"]``).

    None without a checkpoint; ``{}`` when the checkpoint recorded no ledger (a run without one:
    a ledger checked against ``{}`` is refused). A manifest that is unreadable or of another
    format or version raises :class:`CheckpointError`: the ledger could not be checked against it.
    """
    mpath = Path(directory) / _MANIFEST
    if not mpath.is_file():
        return None
    seen = _read_manifest(Path(directory)).get("ledger")
    return seen if isinstance(seen, dict) else {}  # {}: a checkpoint that recorded no digest


def _read_manifest(d: Path) -> dict[str, Any]:
    """The manifest in ``d``, checked to be a privmtl manifest of this version signed by this
    user (module doc); :class:`CheckpointError` in one line otherwise."""
    mpath = d / _MANIFEST
    try:
        manifest = json.loads(mpath.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # JSON, UTF-8, nesting
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise CheckpointError(f"The checkpoint manifest {mpath} is unreadable: {why}.") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise CheckpointError(f"{mpath} is not a privmtl checkpoint (format {got!r}).")
    if manifest.get("version") != FORMAT_VERSION:
        raise CheckpointError(
            f"The checkpoint in {d} has format version {manifest.get('version')!r}; this privmtl "
            f"reads version {FORMAT_VERSION} (an older checkpoint cannot be resumed: start the "
            "run again in a new directory)."
        )
    if not trust.is_signed(manifest):
        raise CheckpointError(
            f"The checkpoint manifest {mpath} is not signed by this user's key: it was edited "
            "or written by another user; refusing to use it (a checkpoint that is not this "
            "user's could hide releases from the epsilon reported)."
        )
    return manifest
