r"""The privacy ledger: every release a curator makes, recorded before it leaves, re-accountable later.

A :class:`PrivacyLedger` composes the dp-accounting events of the releases of one run (RDP or
PLD, at a fixed δ, under one neighbouring relation) and can refuse a release that would exceed a
budget. With a ``path`` it is also *durable*: each :meth:`PrivacyLedger.record` appends one JSON
line to the file and ``fsync``\ s it before returning, and a curator lets a release leave only
after ``record`` returned (write-ahead). Whatever happens to the process afterwards — a crash, a
``SIGKILL`` between the record and the release — the file never says less than what was released.
A torn last line (the process died *inside* ``record``) belongs to a release that never left and is
dropped when the file is opened again.

File format (JSON Lines, ``privmtl-ledger`` version 1): the first line is a header
``{"format", "version", "delta", "accountant", "relation", "budget"}``, with
``"target_epsilon"`` when the run was calibrated to a target ε (the ε asked for, beside the δ it
is stated at: what the reported ε can be read against); every other line is one release::

    {"index": 0, "release_id": "round:0", "round": 0, "mechanism": "gaussian-mean",
     "params": {...}, "sampling": "poisson", "relation": "add-remove", "accountant": "rdp",
     "delta": 0.0095, "event": {...serialized DpEvent...}, "epsilon": 0.123}

``epsilon`` is the ledger's ε after that release (its own accountant and δ); :func:`reaccount`
recomposes the events of a file with any accountant and δ (``privmtl ledger PATH``).

Authentication. Every line privmtl writes carries ``"mac"``: an HMAC-SHA256, under the user's
signing key (:func:`privmtl.trust.user_key`), of the previous line's MAC and this line's canonical
JSON (sorted keys, compact, without ``mac``) — a chain from the header on. A reader verifies the
chain with the reader's key: a file whose every line verifies is *authenticated* (this user's
runs wrote it, and no line was edited, reordered, inserted or removed before its last line). A
file without MACs (written before they existed), with another user's, or with a broken chain is
not authenticated: :meth:`PrivacyLedger.open` refuses to continue it (naming the first line that
does not verify), :func:`read_ledger` refuses it, and :func:`reaccount` reports
``authenticated: false`` (``privmtl ledger`` refuses it unless given ``--unauthenticated``).

Completeness. A run that ends (``privmtl pmtl``, ``privmtl mpmtl``) appends a *closing* line
``{"closing": true, "releases": N, "epsilon": ...}`` (:meth:`PrivacyLedger.close`, MAC'd like the
others). A file whose last line is a closing line stating its number of releases is complete;
otherwise the run was killed, is still running, or the file was cut, and :func:`reaccount`
reports ``complete: false`` with the releases it holds as a lower bound. A last line that lost
only its newline (a whole record: a write torn by a crash is never valid JSON) is counted, never
silently dropped; a last line that is not a whole record is dropped as the torn write of a
release that never left (write-ahead) and the file is reported incomplete.

Bounds. An event must be one privmtl writes, nested at most :data:`MAX_EVENT_DEPTH` deep, with
counts and sizes in ``[1, MAX_EVENT_COUNT]``, sampling probabilities in ``[0, 1]`` and finite
noise multipliers ``>= 0``; a line nested too deeply for the JSON reader, not UTF-8, or a ledger
that is not a regular file (a device, a symbolic link) is refused in one line.

Loading checks, it does not trust. :meth:`PrivacyLedger.open` (a file) and
:meth:`PrivacyLedger.from_dict` / :meth:`~PrivacyLedger.load_state_dict` (a state dict) compose
every recorded event again with the ledger's own accountant and recompute what the entries state
— the ε after each release, the sampling of its event, its index — and refuse, naming the record
and the value, any entry that disagrees with its events or with the ledger's accountant, relation
and δ, and a state dict whose ``format`` tag or ``version`` is not this ledger's. The ε a loaded
ledger reports is the recomputed one. :func:`check_recorded` (behind :func:`reaccount` and
``privmtl ledger``) checks a file the same way without writing to it.

A file alone cannot tell that its last releases were cut off. A durable ledger therefore keeps the
SHA-256 of its bytes after every line, and :meth:`PrivacyLedger.seen` gives the number of releases
and that digest for a checkpoint to record; :meth:`PrivacyLedger.check_seen` (and ``open(...,
seen=...)``) refuses a file shorter than, or differing in its prefix from, what a checkpoint saw.

A run with banded matrix-factorization noise is ONE Gaussian mechanism over all its rounds: its
ledger holds that event first (mechanism ``"banded-mf"``, release id ``"banded:run"``, recorded
before the first round, with the strategy and the sensitivity in its ``params``), then one entry
per round (``"banded-mf-round"``, a ``NoOpDpEvent``: part of the run's event). The ε after every
entry is the whole run's, and :func:`reaccount` composes the same events to the same ε. A cyclic
run with independent noise records the Gaussian in the rounds of group 0 and a ``NoOpDpEvent``
in the others (:class:`~privmtl.privacy.sampling.CyclicSampler`).

Replays. A run resumed from a checkpoint repeats the releases made after that checkpoint. With
seeded noise the repeated release is bit-identical to the first one (a deterministic function of
the checkpointed state), so recording it again with ``replay_ok=True`` returns the recorded ε
without charging it twice. With secure noise a repeat is a *new* release (fresh noise) and is
charged again.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from dp_accounting import dp_event as dpe

from privmtl._validation import check_real
from privmtl.exceptions import InvalidParameterError, PrivacyBudgetError, PrivmtlWarning
from privmtl.locking import check_held
from privmtl.privacy.accounting import (
    TIGHT_ACCOUNTANTS,
    _check,
    adapt_event,
    event_from_dict,
    event_to_dict,
    make_accountant,
)
from privmtl.privacy.guarantee import DEFAULT_ACCOUNTANT, DEFAULT_RELATION
from privmtl.privacy.ledger_format import (
    _MAC_FIELD,
    LEDGER_FORMAT,
    LEDGER_VERSION,
    MAX_EVENT_COUNT,
    MAX_EVENT_DEPTH,
    _chain_mac,
    _regular_file,
    _scan_ledger,
    check_event_dict,
)
from privmtl.trust import user_key

__all__ = [
    "LEDGER_FORMAT",
    "LEDGER_VERSION",
    "MAX_EVENT_COUNT",
    "MAX_EVENT_DEPTH",
    "PrivacyLedger",
    "check_recorded",
    "check_saved_ledger",
    "reaccount",
    "read_ledger",
    "warn_budget_stop",
]


def warn_budget_stop(
    done: int, total: int, unit: str, epsilon: float, budget: float, flag: str
) -> None:
    """Say that a run stopped before the release that would exceed its budget (a
    :class:`~privmtl.exceptions.PrivmtlWarning`): a library run that stops early is never silent.
    ``done`` of ``total`` ``unit`` ran; ``flag`` names where the result records the stop."""
    import warnings

    warnings.warn(
        f"stopped on the privacy budget: the next release would take ε above "
        f"budget_epsilon={budget:g}; {done} of {total} {unit} ran, ε spent {epsilon:.4g} "
        f"({flag} is True)",
        PrivmtlWarning,
        stacklevel=3,
    )


def _sampling_of(event: dpe.DpEvent) -> str:
    if isinstance(event, dpe.PoissonSampledDpEvent):
        return "poisson"
    if isinstance(event, dpe.SampledWithoutReplacementDpEvent):
        return "fixed"
    if isinstance(event, dpe.SelfComposedDpEvent):
        return _sampling_of(event.event)
    return "all"


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


#: Relative tolerance between a stated ε and the one its events compose to (a few dp-accounting
#: releases may differ in the last digits; any edit of a stated ε is far above it).
_EPSILON_RTOL = 1e-6


def _same_epsilon(stated: Any, computed: float) -> bool:
    if stated is None:  # written as null: the ε was infinite
        return not math.isfinite(computed)
    if isinstance(stated, bool) or not isinstance(stated, int | float):
        return False
    if not math.isfinite(computed):
        return False
    return math.isclose(float(stated), computed, rel_tol=_EPSILON_RTOL, abs_tol=1e-12)


class PrivacyLedger:
    """Records every privatized release and keeps the running ε at a fixed δ.

    Parameters
    ----------
    delta : float
        δ at which ε is reported.
    accountant : {"rdp", "pld"}
    relation : {"add-remove", "replace-one"}
    budget : float or None
        If given, :meth:`check` raises :class:`PrivacyBudgetError` *before* a release whose event
        would take ε above the budget (and :meth:`record` checks too); :meth:`would_exceed` asks
        without raising.
    target_epsilon : float or None
        The ε the run's noise was calibrated to (with ``delta``), recorded with the run in the
        file's header and :meth:`to_dict`; it bounds nothing (the ledger's ε is what the releases
        compose to). None: the run had no target.
    path : str or Path, optional
        Durable ledger file (module docstring). Use :meth:`open` to continue an existing file.

    Notes
    -----
    ``to_dict``/``from_dict`` (and ``state_dict``/``load_state_dict``) round-trip through JSON as
    well; loading recomputes every ε from the recorded events and refuses a state that disagrees
    (module docstring).
    """

    def __init__(
        self,
        *,
        delta: float,
        accountant: str = DEFAULT_ACCOUNTANT,
        relation: str = DEFAULT_RELATION,
        budget: float | None = None,
        path: str | os.PathLike[str] | None = None,
        target_epsilon: float | None = None,
    ) -> None:
        _check(accountant, relation)
        self.target_epsilon = (
            None
            if target_epsilon is None
            else check_real("target_epsilon", target_epsilon, low=0.0, closed="neither")
        )
        self.delta = check_real("delta", delta, low=0.0, high=1.0, closed="neither")
        self.accountant = accountant
        self.relation = relation
        self.budget = (
            None if budget is None else check_real("budget", budget, low=0.0, closed="neither")
        )
        self._acc = make_accountant(accountant, relation)
        self.records: list[dict[str, Any]] = []
        self.history: list[float] = []
        self._ids: set[str | None] = set()
        self.path: Path | None = None
        # SHA-256 of the file's bytes: running hash, and its digest after the header and after
        # each record (what a checkpoint compares its ledger against, :meth:`seen`)
        self._sha = hashlib.sha256()
        self._digests: list[str] = []
        self._file: Path | None = None if path is None else Path(path)  # the file it was read from
        self._prev_mac = ""  # MAC of the file's last line (the chain continues from it)
        self._key: bytes | None = None  # the user's signing key, read on the first append
        self._closed = False  # the file's last line is a closing line for these records
        #: Whether every line of the file it was read from verified under this user's key
        #: (module doc); why not when it did not.
        self.authenticated = True
        self.authentication = "every line carries this user's MAC"
        #: Whether the file it was read from ends with a closing line; why not when it did not.
        self.complete = True
        self.incomplete = ""
        if path is not None:
            self.path = Path(path)
            _regular_file(self.path)
            if self.path.exists() and self.path.stat().st_size > 0:
                raise InvalidParameterError(
                    f"The ledger file {self.path} exists already; continue it with "
                    "PrivacyLedger.open(...) (resume) or choose a new path."
                )
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._append(self._header())

    # ------------------------------------------------------------------------------- file
    def _header(self) -> dict[str, Any]:
        return {
            "format": LEDGER_FORMAT,
            "version": LEDGER_VERSION,
            "delta": self.delta,
            "accountant": self.accountant,
            "relation": self.relation,
            "budget": self.budget,
            **self._target(),
        }

    def _target(self) -> dict[str, float]:
        return {} if self.target_epsilon is None else {"target_epsilon": self.target_epsilon}

    def _append(self, entry: dict[str, Any]) -> None:
        assert self.path is not None

        check_held(self.path.parent)  # a run whose directory lock was taken from it stops here
        row = json.loads(json.dumps(entry))  # as a reader parses it: what the MAC covers
        if self._key is None:
            self._key = user_key(create=True)
        assert self._key is not None
        row[_MAC_FIELD] = _chain_mac(self._key, self._prev_mac, row)
        line = (json.dumps(row, sort_keys=True) + "\n").encode()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(0, "not a regular file")
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise InvalidParameterError(
                f"Cannot write the ledger {self.path} ({exc.strerror or exc}); the ledger must be "
                "a regular file (not a symbolic link or device) in a writable folder."
            ) from None
        self._prev_mac = row[_MAC_FIELD]
        self._sha.update(line)
        self._closed = bool(entry.get("closing"))
        if not self._closed:  # the digests after the header and after each release
            self._digests.append(self._sha.hexdigest())

    def close(self) -> None:
        """Append the closing line (module doc, Completeness) to a durable ledger: the run ended
        with these releases. Nothing to do in memory or when the file already ends with one."""
        if self.path is None or self._closed:
            return
        self._append(
            {"closing": True, "releases": len(self.records), "epsilon": _finite(self.epsilon())}
        )

    def seen(self) -> dict[str, Any]:
        """What a checkpoint records of its durable ledger: the number of releases and the
        SHA-256 of the file's bytes up to the end of the last one (header included)."""
        if self.path is None:
            return {"releases": len(self.records), "sha256": None}
        return {"releases": len(self.records), "sha256": self._digests[len(self.records)]}

    def check_seen(self, seen: Any, *, where: str) -> None:
        """Refuse a durable ledger that does not continue the one a checkpoint saw.

        ``seen`` is :meth:`seen` as the checkpoint ``where`` recorded it. The file must hold at
        least that many releases and its bytes up to the last of them must hash to the recorded
        digest: a ledger deleted, emptied, cut short or edited in its prefix raises
        :class:`InvalidParameterError` (more releases than the checkpoint saw are fine: those made
        after it, which the resumed run replays or charges again).
        """
        if not self._digests:  # not read from or written to a file: nothing to compare
            return
        if not isinstance(seen, dict) or not isinstance(seen.get("releases"), int):
            raise InvalidParameterError(
                f"{where} records no ledger digest; it cannot be checked against {self._file}."
            )
        n = seen["releases"]
        if len(self.records) < n:
            raise InvalidParameterError(
                f"The ledger {self._file} holds {len(self.records)} releases but {where} saw {n}: "
                "the ledger was deleted, emptied or cut short; refusing to resume (the epsilon "
                "reported would leave out releases that were made)."
            )
        if n and self._digests[n] != seen.get("sha256"):
            raise InvalidParameterError(
                f"The ledger {self._file} differs from the one {where} saw in its first {n} "
                "releases (SHA-256 mismatch): the ledger was altered; refusing to resume."
            )

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        delta: float,
        accountant: str = DEFAULT_ACCOUNTANT,
        relation: str = DEFAULT_RELATION,
        budget: float | None = None,
        seen: dict[str, Any] | None = None,
        seen_by: str = "the checkpoint",
        target_epsilon: float | None = None,
    ) -> PrivacyLedger:
        """Create the durable ledger at ``path``, or continue the one there.

        An existing file must have been written with the same accountant, relation and δ;
        otherwise :class:`InvalidParameterError` names what differs. Its releases are composed
        again, so the ledger resumes with every release it ever recorded.

        ``seen`` (what a checkpoint recorded with :meth:`seen`; ``seen_by`` names it in errors)
        makes the ledger the checkpoint's: a missing or empty file when the checkpoint saw
        releases is refused before anything is written, and the file must continue the one it
        saw (:meth:`check_seen`).
        """
        p = Path(path)
        _regular_file(p)
        if seen is not None and (
            not isinstance(seen, dict) or not isinstance(seen.get("releases"), int)
        ):
            raise InvalidParameterError(
                f"{seen_by[:1].upper()}{seen_by[1:]} records no ledger digest; it cannot be "
                f"checked against {p}: refusing to resume."
            )
        if not p.exists() or p.stat().st_size == 0:
            if seen is not None and seen["releases"]:
                raise InvalidParameterError(
                    f"The ledger {p} is missing or empty, but {seen_by} saw {seen['releases']} "
                    "releases: refusing to resume (the epsilon reported would leave out releases "
                    "that were made)."
                )
            return cls(
                delta=delta,
                accountant=accountant,
                relation=relation,
                budget=budget,
                path=p,
                target_epsilon=target_epsilon,
            )
        scan = _scan_ledger(p, repair=True)
        header, entries, digests = scan.header, scan.entries, scan.digests
        wanted = {"accountant": accountant, "relation": relation, "delta": float(delta)}
        for key, value in wanted.items():
            if header.get(key) != value:
                raise InvalidParameterError(
                    f"The ledger {p} was written with {key}={header.get(key)!r}; this run has "
                    f"{key}={value!r}. Resume with the same settings or use a new directory."
                )
        # the target the file's run was calibrated to (its header), else this run's
        ledger = cls(
            delta=delta,
            accountant=accountant,
            relation=relation,
            budget=budget,
            target_epsilon=header.get("target_epsilon", target_epsilon),
        )
        ledger._compose_records(entries, source=f"The ledger {p}")
        if not scan.authenticated:  # after the entries: an edited ε is named as such first
            raise InvalidParameterError(
                f"The ledger {p} is not authenticated: {scan.authentication}; refusing to "
                "continue it (its releases could have been altered or removed)."
            )
        ledger.path = ledger._file = p
        ledger._digests = digests
        ledger._prev_mac, ledger._closed = scan.last_mac, scan.closed
        ledger._sha = hashlib.sha256(p.read_bytes())  # the file as repaired: appends continue it
        if seen is not None:
            ledger.check_seen(seen, where=seen_by)
        return ledger

    def _compose_records(self, records: Any, *, source: str) -> None:
        """Compose the events of ``records`` (checking every entry against them); append both.

        Every entry must hold a readable ``event``; what it states besides that can be recomputed
        (``index``, ``sampling``, ``epsilon``) or must be this ledger's (``accountant``,
        ``relation``, ``delta``) is compared, and the first disagreement raises
        :class:`InvalidParameterError` naming ``source``, the entry and both values.
        """
        if not isinstance(records, list):
            raise InvalidParameterError(
                f"{source}: 'records' must be a list of entries; got {type(records).__name__}."
            )
        for rec in records:
            i = len(self.records)
            if not isinstance(rec, dict) or "event" not in rec:
                raise InvalidParameterError(f"{source}: record {i} has no 'event'.")
            rid = rec.get("release_id")
            where = f"{source}: record {i}" + ("" if rid is None else f" (release {rid!r})")
            try:
                check_event_dict(rec["event"], where="event")
                event = event_from_dict(rec["event"])
            except (InvalidParameterError, KeyError, TypeError, ValueError, AttributeError) as e:
                raise InvalidParameterError(f"{where} has an unreadable event: {e}") from None
            for key in ("accountant", "relation", "delta"):
                if key in rec and rec[key] != getattr(self, key):
                    raise InvalidParameterError(
                        f"{where} was recorded with {key}={rec[key]!r}; the ledger has "
                        f"{key}={getattr(self, key)!r}."
                    )
            if "index" in rec and rec["index"] != i:
                raise InvalidParameterError(
                    f"{where} states index={rec['index']!r}; it is entry {i} of the ledger."
                )
            if "sampling" in rec and rec["sampling"] != _sampling_of(event):
                raise InvalidParameterError(
                    f"{where} states sampling={rec['sampling']!r}, but its event is "
                    f"{_sampling_of(event)!r}."
                )
            self._acc.compose(
                adapt_event(event, accountant=self.accountant, relation=self.relation)
            )
            eps = self._composed_epsilon(self._acc)
            if "epsilon" in rec and not _same_epsilon(rec["epsilon"], eps):
                raise InvalidParameterError(
                    f"{where} states epsilon={rec['epsilon']!r}, but the recorded events compose "
                    f"to epsilon={_finite(eps)!r} ({self.accountant}, {self.relation}, "
                    f"delta={self.delta:g}): the ledger was altered; refusing to load it."
                )
            self.records.append(dict(rec))
            self._ids.add(rid)
            self.history.append(eps)

    # ------------------------------------------------------------------------------- accounting
    def _composed_epsilon(self, acc: Any) -> float:
        eps = float(acc.get_epsilon(self.delta))
        return eps if math.isfinite(eps) else math.inf

    def epsilon_if(self, event: dpe.DpEvent) -> float:
        """ε the ledger would report after also recording ``event``."""
        acc = copy.deepcopy(self._acc)
        acc.compose(adapt_event(event, accountant=self.accountant, relation=self.relation))
        return self._composed_epsilon(acc)

    def would_exceed(self, event: dpe.DpEvent) -> bool:
        """True when a budget is set and recording ``event`` would take ε above it."""
        return self.budget is not None and self.epsilon_if(event) > self.budget

    def check(self, event: dpe.DpEvent) -> float:
        """Raise :class:`PrivacyBudgetError` if recording ``event`` would exceed the budget.

        Returns the ε after the event.
        """
        eps = self.epsilon_if(event)
        if self.budget is not None and eps > self.budget:
            raise PrivacyBudgetError(
                f"Release refused: it would take epsilon from {self.epsilon():.4g} to {eps:.4g}, "
                f"above the budget {self.budget:.4g} (delta={self.delta:g}, "
                f"{self.accountant}, {self.relation})."
            )
        return eps

    def has_release(self, release_id: str) -> bool:
        """True when a release with this id was recorded."""
        return release_id in self._ids

    def record(
        self,
        event: dpe.DpEvent,
        *,
        round: int | None = None,
        mechanism: str | None = None,
        params: dict[str, Any] | None = None,
        release_id: str | None = None,
        replay_ok: bool = False,
    ) -> float:
        """Compose ``event`` (after :meth:`check`), persist it, and return the new ε.

        With a durable file the entry is on disk (``fsync``) when this returns: only then may the
        release leave the curator. ``replay_ok=True`` with a ``release_id`` that was recorded
        before returns that release's ε without composing it again (a bit-identical seeded
        replay after resume; the events must match).
        """
        if replay_ok and release_id is not None:
            for i, rec in enumerate(self.records):
                if rec.get("release_id") == release_id:
                    if rec["event"] != event_to_dict(event):
                        raise InvalidParameterError(
                            f"Release {release_id!r} was recorded with another event; a seeded "
                            "replay must repeat the same release."
                        )
                    return self.history[i]
        adapted = adapt_event(event, accountant=self.accountant, relation=self.relation)
        if self.budget is not None:
            self.check(event)
        acc = copy.deepcopy(self._acc) if self.path is not None else self._acc
        acc.compose(adapted)
        eps = self._composed_epsilon(acc)
        entry = {
            "index": len(self.records),
            "release_id": release_id,
            "round": round,
            "mechanism": mechanism,
            "params": params or {},
            "sampling": _sampling_of(event),
            "relation": self.relation,
            "accountant": self.accountant,
            "delta": self.delta,
            "event": event_to_dict(event),
            "epsilon": _finite(eps),
        }
        if self.path is not None:
            self._append(entry)  # write-ahead: on disk before the release can leave
            self._acc = acc
        self.records.append(entry)
        if release_id is not None:
            self._ids.add(release_id)
        self.history.append(eps)
        return eps

    def epsilon(self) -> float:
        """Current ε at ``delta`` (0 before any release)."""
        if not self.records:
            return 0.0
        return self.history[-1]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready state, tagged with the ledger format and version."""
        return {
            "format": LEDGER_FORMAT,
            "version": LEDGER_VERSION,
            "delta": self.delta,
            "accountant": self.accountant,
            "relation": self.relation,
            "budget": self.budget,
            **self._target(),
            "records": list(self.records),
            "history": [_finite(e) for e in self.history],
        }

    def state_dict(self) -> dict[str, Any]:
        """The same as :meth:`to_dict` (the name checkpointing code expects)."""
        return self.to_dict()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrivacyLedger:
        """Rebuild a ledger from :meth:`to_dict` output, recomputing what it states.

        The ``format`` tag and ``version`` must be this ledger's (a dict without both, written
        before they existed, is read as version 1); every recorded event is composed again and
        each entry's ε, sampling and index, and the ``history``, must agree with the recomputed
        ones (module docstring). The ledger's ε is the recomputed one. Anything else raises
        :class:`InvalidParameterError` naming what disagrees.
        """
        if not isinstance(data, dict):
            raise InvalidParameterError(
                f"A ledger state must be a dict (PrivacyLedger.to_dict()); got {type(data).__name__}."
            )
        src = "The ledger state"
        if "format" in data or "version" in data:
            if data.get("format") != LEDGER_FORMAT:
                raise InvalidParameterError(
                    f"{src} has format tag {data.get('format')!r}; a privmtl ledger has "
                    f"{LEDGER_FORMAT!r}."
                )
            if data.get("version") != LEDGER_VERSION:
                raise InvalidParameterError(
                    f"{src} has format version {data.get('version')!r}; this privmtl reads "
                    f"version {LEDGER_VERSION}."
                )
        missing = [k for k in ("delta", "accountant", "relation", "records") if k not in data]
        if missing:
            raise InvalidParameterError(f"{src} has no {', '.join(map(repr, missing))}.")
        ledger = cls(
            delta=data["delta"],
            accountant=data["accountant"],
            relation=data["relation"],
            budget=data.get("budget"),
            target_epsilon=data.get("target_epsilon"),
        )
        ledger._compose_records(data["records"], source=src)
        if "history" in data:
            history = data["history"]
            if not isinstance(history, list) or len(history) != len(ledger.history):
                n = len(history) if isinstance(history, list) else type(history).__name__
                raise InvalidParameterError(
                    f"{src} has a 'history' of {n} entries for {len(ledger.history)} records."
                )
            for i, (stated, eps) in enumerate(zip(history, ledger.history, strict=True)):
                if not _same_epsilon(stated, eps):
                    raise InvalidParameterError(
                        f"{src} states history[{i}]={stated!r}, but the recorded events compose "
                        f"to epsilon={_finite(eps)!r} after record {i} ({ledger.accountant}, "
                        f"{ledger.relation}, delta={ledger.delta:g}): the ledger was altered; "
                        "refusing to load it."
                    )
        return ledger

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace this ledger's releases by those of ``state`` (checked as by :meth:`from_dict`).

        ``state`` must have been written with this ledger's δ, accountant and relation; this
        ledger keeps its budget. A durable ledger continues from its file
        (:meth:`open`) and refuses a state dict.
        """
        if self.path is not None:
            raise InvalidParameterError(
                f"The ledger is durable ({self.path}): continue it with PrivacyLedger.open(...), "
                "not from a state dict."
            )
        other = type(self).from_dict(state)
        for key in ("delta", "accountant", "relation"):
            if getattr(other, key) != getattr(self, key):
                raise InvalidParameterError(
                    f"The ledger state was written with {key}={getattr(other, key)!r}; this "
                    f"ledger has {key}={getattr(self, key)!r}."
                )
        self._acc, self.records, self.history = other._acc, other.records, other.history
        self._ids = other._ids


def read_ledger(
    path: str | os.PathLike[str], *, repair: bool = False
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Header and entries (the releases, without closing lines) of an authenticated ledger file.

    A torn last line (a process killed inside :meth:`PrivacyLedger.record`, before the release
    could leave) is skipped, and with ``repair=True`` cut from the file so that appends continue
    on a clean line. Anything else malformed — a line that is not a JSON object, a missing or
    foreign header — and a file that is not authenticated (module doc) raise
    :class:`InvalidParameterError` naming the file and the line.
    """
    scan = _scan_ledger(path, repair=repair)
    if not scan.authenticated:
        raise InvalidParameterError(
            f"The ledger {scan.path} is not authenticated: {scan.authentication}."
        )
    return scan.header, scan.entries


def check_recorded(
    path: str | os.PathLike[str],
    *,
    seen: dict[str, Any] | None = None,
    seen_by: str = "the checkpoint",
) -> PrivacyLedger:
    """The ledger in file ``path``, every entry checked against its events (read-only).

    Composes the recorded events again with the file's own accountant, relation and δ, as
    :meth:`PrivacyLedger.open` does, without repairing the file: an entry without an event, an
    unreadable event, or a stated ε, index, sampling, accountant, relation or δ that the events
    do not reproduce raises :class:`InvalidParameterError` naming the file, the entry and both
    values. With ``seen`` (a checkpoint's record of the ledger, :meth:`PrivacyLedger.seen`) the
    file must also continue what the checkpoint saw (:meth:`PrivacyLedger.check_seen`). Returns
    an in-memory ledger whose ε is the recomputed one, whose ``authenticated`` / ``authentication``
    and ``complete`` / ``incomplete`` say whether the file's MAC chain verifies and whether it ends
    with a closing line (module doc).
    """
    scan = _scan_ledger(path, repair=False)
    header, entries, digests = scan.header, scan.entries, scan.digests
    try:
        ledger = PrivacyLedger(
            delta=header["delta"], accountant=header["accountant"], relation=header["relation"]
        )
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"The ledger {path} has an invalid header: {exc}") from None
    ledger._compose_records(entries, source=f"The ledger {path}")
    ledger._digests, ledger._file = digests, Path(path)
    if seen is not None:
        ledger.check_seen(seen, where=seen_by)
    ledger.authenticated, ledger.authentication = scan.authenticated, scan.authentication
    ledger.complete, ledger.incomplete = not scan.incomplete, scan.incomplete
    return ledger


def check_saved_ledger(record: Any, guarantee: Any, *, where: str) -> bool:
    """Check the ledger that saved models name against what their run saw and reported.

    ``record`` is the ``ledger`` entry of a saved ``model.json`` (the ledger file's ``path`` and
    :meth:`PrivacyLedger.seen` when the models were saved), ``guarantee`` the saved guarantee
    dict. When the file is at hand it must pass :func:`check_recorded` with ``seen=record``, and
    the ε of its first ``releases`` releases must be the guarantee's (when the guarantee was
    computed by the ledger's accountant); a mismatch raises :class:`InvalidParameterError` naming
    ``where``. Returns False when there is no ledger to check (none recorded, or the file is
    gone), True when it was checked.
    """
    if not isinstance(record, dict) or not record.get("path"):
        return False
    path = Path(str(record["path"]))
    if not path.is_file():
        return False
    ledger = check_recorded(path, seen=record, seen_by=where)
    n = int(record.get("releases") or 0)
    eps = ledger.history[n - 1] if n else 0.0
    g = guarantee if isinstance(guarantee, dict) else {}
    if g.get("accountant") == ledger.accountant and not _same_epsilon(g.get("epsilon"), eps):
        raise InvalidParameterError(
            f"{where} state epsilon={g.get('epsilon')!r}, but the {n} releases of the ledger "
            f"{path} compose to epsilon={_finite(eps)!r}: the guarantee or the ledger was altered."
        )
    return True


def reaccount(
    path: str | os.PathLike[str],
    *,
    accountant: str | None = None,
    delta: float | None = None,
    seen: dict[str, Any] | None = None,
    seen_by: str = "the checkpoint",
) -> dict[str, Any]:
    """Compose the events of a ledger file again with ``accountant`` at ``delta``.

    The file is first checked (:func:`check_recorded`): a ledger whose entries state what their
    events do not compose to is refused, never re-accounted, and so is, with ``seen``, a file that
    does not continue what a checkpoint saw of it. Defaults are the file's own.
    Returns ``epsilon``, ``delta``, ``accountant``, ``relation``, ``releases`` (count),
    ``per_release`` (ε after each release), ``recorded_epsilon`` (what the run itself reported
    after its last release), the ``mechanisms`` seen, ``authenticated`` (every line carries this
    user's MAC; ``authentication`` says why not) and ``complete`` (the file ends with a closing
    line; ``incomplete`` says why not: ``releases`` and ``epsilon`` are then lower bounds).
    """
    recorded = check_recorded(path, seen=seen, seen_by=seen_by)
    entries = recorded.records
    acc_name = recorded.accountant if accountant is None else accountant
    if acc_name not in TIGHT_ACCOUNTANTS:
        raise InvalidParameterError(
            f"The 'accountant' parameter must be one of {TIGHT_ACCOUNTANTS}; got {acc_name!r}."
        )
    dlt = recorded.delta if delta is None else check_real("delta", delta, low=0.0, high=1.0)
    relation = recorded.relation
    ledger = PrivacyLedger(delta=dlt, accountant=acc_name, relation=relation)
    per_release = []
    for entry in entries:
        per_release.append(ledger.record(event_from_dict(entry["event"])))
    eps = ledger.epsilon()
    return {
        "epsilon": _finite(eps),
        "delta": dlt,
        "accountant": acc_name,
        "relation": relation,
        "releases": len(entries),
        "per_release": [_finite(e) for e in per_release],
        "recorded_epsilon": entries[-1].get("epsilon") if entries else 0.0,
        "recorded_accountant": recorded.accountant,
        "mechanisms": sorted({str(e.get("mechanism")) for e in entries}),
        "authenticated": recorded.authenticated,
        "authentication": recorded.authentication,
        "complete": recorded.complete,
        "incomplete": recorded.incomplete,
    }
