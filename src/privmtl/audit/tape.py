"""The mediation audit's release tape, injected around the release mechanisms.

The mediation audit (:mod:`privmtl.audit.mediation`) runs an output path twice, on data sets
that differ in one client. In the first run (``mode="record"``) the tape keeps a copy of every
released value in order; in the second (``mode="replay"``) each release still computes
everything it would (clipping, mean, noise draws, ledger record), then emits the recorded value
of the same position instead of its own. All other code runs unchanged, so any difference in
another client's outputs is a dependence on the replaced client that does not pass through a
release.

Nothing in the product calls the tape: :func:`release_tape` wraps the mechanisms whose values
leave a curator — :meth:`~privmtl.privacy.release.GaussianMeanRelease.release`,
:meth:`~privmtl.privacy.release.GaussianMeanRelease.release_sum`,
:meth:`~privmtl.privacy.release.GaussianMeanRelease.release_blocks` and the MP-MTL covariance
release :meth:`~privmtl.privacy.covariance.CovarianceSchedule.noisy` — for as long as the
context is active, and puts them back when it ends. Not thread-safe; not for training.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

from privmtl.exceptions import InvalidParameterError
from privmtl.privacy.covariance import CovarianceSchedule
from privmtl.privacy.release import GaussianMeanRelease, Release
from privmtl.privacy.selection import ClientVote, VoteResult

__all__ = ["ReleaseTape", "release_tape"]


class ReleaseTape:
    """Record the values every release emits, or emit recorded values instead.

    Parameters
    ----------
    mode : {"record", "replay"}
    values : list, optional
        The recorded values a replaying tape emits, in order.
    """

    def __init__(self, mode: str, values: list[Any] | None = None) -> None:
        if mode not in ("record", "replay"):
            raise InvalidParameterError(
                f"The 'mode' parameter must be 'record' or 'replay'; got {mode!r}."
            )
        self.mode = mode
        self.values: list[Any] = [] if values is None else list(values)
        self.position = 0

    def __call__(self, value: Any) -> Any:
        """``value`` (recorded) when recording; the next recorded value when replaying."""
        if self.mode == "record":
            self.values.append(copy.deepcopy(value))
            return value
        if self.position >= len(self.values):
            raise InvalidParameterError(
                f"Replay asks for release {self.position + 1}, but only {len(self.values)} "
                "were recorded: the replayed run makes more releases than the recorded one "
                "(a choice outside the releases changed how many are made)."
            )
        out = copy.deepcopy(self.values[self.position])
        self.position += 1
        return out

    def replay(self) -> ReleaseTape:
        """A replaying tape of the values recorded here."""
        return ReleaseTape("replay", self.values)


def _mean_release(tape: ReleaseTape, original: Callable[..., Release]) -> Callable[..., Release]:
    """A mean release whose value and released unclipped fraction go through ``tape``."""

    def taped(self: GaussianMeanRelease, *args: Any, **kw: Any) -> Release:
        out = original(self, *args, **kw)
        details = dict(out.details)
        released = tape(
            {"value": out.value, "unclipped_fraction": details.get("unclipped_fraction")}
        )
        if released["unclipped_fraction"] is not None:
            details["unclipped_fraction"] = released["unclipped_fraction"]
        return dataclasses.replace(out, value=released["value"], details=details)

    return taped


def _block_release(tape: ReleaseTape, original: Callable[..., Release]) -> Callable[..., Release]:
    def taped(self: GaussianMeanRelease, *args: Any, **kw: Any) -> Release:
        out = original(self, *args, **kw)
        return dataclasses.replace(out, value=tape(out.value))

    return taped


def _covariance_release(tape: ReleaseTape, original: Callable[..., Any]) -> Callable[..., Any]:
    def taped(self: CovarianceSchedule, *args: Any, **kw: Any) -> Any:
        return tape(original(self, *args, **kw))

    return taped


def _vote_release(tape: ReleaseTape, original: Callable[..., VoteResult]) -> Callable[..., Any]:
    """A client vote whose noisy counts (and so its winner) go through ``tape``."""

    def taped(self: ClientVote, *args: Any, **kw: Any) -> VoteResult:
        out = original(self, *args, **kw)
        counts = tuple(float(c) for c in tape(list(out.noisy_counts)))
        winner = max(range(len(counts)), key=lambda j: (counts[j], -j))  # argmax, first on ties
        return dataclasses.replace(out, noisy_counts=counts, winner=winner)

    return taped


@contextlib.contextmanager
def release_tape(tape: ReleaseTape) -> Iterator[ReleaseTape]:
    """Route every release's value through ``tape`` while the context is active.

    Each mechanism is wrapped as it is when the context starts (a mutant patched in before stays
    inside the wrapper), after its ledger record: what the tape sees is what would have left the
    curator.
    """
    wraps = (
        (GaussianMeanRelease, "release", _mean_release),
        (GaussianMeanRelease, "release_sum", _mean_release),
        (GaussianMeanRelease, "release_blocks", _block_release),
        (CovarianceSchedule, "noisy", _covariance_release),
        (ClientVote, "select", _vote_release),
    )
    with contextlib.ExitStack() as stack:
        for owner, name, wrap in wraps:
            stack.enter_context(mock.patch.object(owner, name, wrap(tape, getattr(owner, name))))
        yield tape
