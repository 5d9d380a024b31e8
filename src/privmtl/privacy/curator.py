r"""The release gate shared by every curator: release ids, replays, the budget check, the record.

Both families have a curator that turns the clients' (tasks') messages into releases: the
federated :class:`~privmtl.federated.protocol.Curator` (the clipped, noised mean of a round) and
the MP-MTL :class:`~privmtl.linear.mpmtl.CovarianceCurator` (the noised covariance of the clipped
task models). What they release differs; how a release passes the ledger does not, and lives
here once (:class:`ReleaseCurator`):

**Release id.** Release ``i`` of a curator is recorded as ``"{name}{release_kind}:{i}"``
(``"round:3"``, ``"run1:round:3"``, ``"covariance:3"``); ``name`` tells apart several curators
sharing one ledger.

**Replay policy.** A run resumed from a checkpoint repeats the releases made after that checkpoint.
With seeded noise the repeat is bit-identical to the recorded release (a deterministic function of
the checkpointed state): it is the *same* release, so its id, found in the ledger, returns the
recorded ε and is not charged again, nor refused by the budget. With secure noise the repeat draws
fresh noise: it is a new release, charged and checked like any other.

**Budget check.** :meth:`ReleaseCurator.would_exceed` asks, before any work, whether a new release
would take the ledger's ε above its budget (drivers stop cleanly on it); the ledger's
:meth:`~privmtl.privacy.ledger.PrivacyLedger.record` refuses it in any case.

**Write-ahead record.** :meth:`ReleaseCurator.record` writes the release's event to the ledger (on
disk, ``fsync``-ed, when the ledger is durable) and only then returns: a curator calls it after
computing a release and before the release leaves.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from dp_accounting import dp_event as dpe

from privmtl.privacy.ledger import PrivacyLedger
from privmtl.privacy.noise import NoiseSource

__all__ = ["ReleaseCurator"]


class ReleaseCurator:
    """Base of every curator: names its releases, replays seeded ones, checks and records them.

    Parameters
    ----------
    ledger : PrivacyLedger or None
        Receives every private release before it leaves (None: nothing is recorded). A stand-in
        object with ``record(event, round=...)`` is called with the event and round only.
    noise : NoiseSource
        The curator's noise; its kind fixes the replay policy (module docstring).
    name : str, default ""
        Prefix of the release ids (several curators may share one ledger).

    Attributes
    ----------
    release_kind : str
        Middle part of the release ids (``"round"``, ``"covariance"``); set by each subclass.
    replays_recorded : bool
        True with seeded noise: a release whose id the ledger holds is a replay, not charged again.
    """

    release_kind: ClassVar[str] = "release"

    def __init__(self, *, ledger: PrivacyLedger | None, noise: NoiseSource, name: str = "") -> None:
        self.ledger = ledger
        self.noise = noise
        self.name = name
        self.replays_recorded = noise.kind == "seeded"

    def release_id_at(self, index: int) -> str:
        """The ledger id of release ``index`` of this curator."""
        return f"{self.name}{self.release_kind}:{index}"

    def is_replay(self, release_id: str) -> bool:
        """True when the ledger holds ``release_id`` already and this curator replays seeded runs."""
        return (
            self.replays_recorded
            and self.ledger is not None
            and self.ledger.has_release(release_id)
        )

    def would_exceed(self, event: dpe.DpEvent | None, release_id: str) -> bool:
        """True when recording ``event`` as new release ``release_id`` would exceed the budget.

        False without an event (not private), without a ledger or budget, and for a replay (charged
        when it was first made).
        """
        if event is None or self.ledger is None or self.is_replay(release_id):
            return False
        return bool(self.ledger.would_exceed(event))

    def record(
        self,
        event: dpe.DpEvent | None,
        *,
        release_id: str,
        round: int | None = None,
        mechanism: str | None = None,
        params: dict[str, Any] | None = None,
    ) -> float:
        """Write ``event`` to the ledger before the release may leave; returns the ledger's ε.

        ``inf`` without an event (a non-private release) and ``nan`` without a ledger (a private
        release nobody accounts for). A replay returns the ε recorded with it (module docstring);
        a new release over the budget raises :class:`~privmtl.exceptions.PrivacyBudgetError`.
        """
        if event is None:
            return math.inf
        if self.ledger is None:
            return math.nan
        if not isinstance(self.ledger, PrivacyLedger):  # a stand-in with record(event, round=...)
            return float(self.ledger.record(event, round=round))
        return float(
            self.ledger.record(
                event,
                round=round,
                mechanism=mechanism,
                params=params,
                release_id=release_id,
                replay_ok=self.replays_recorded,
            )
        )
