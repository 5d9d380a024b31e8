"""Flower's waits, shortened: how often a reply or a message's objects are asked for again.

Flower polls for replies every 3 s and retries a message's objects after 1 s; on one machine a
round then costs seconds of waiting for a model that trains in milliseconds. These helpers ask
every :data:`POLL_SECONDS` instead. They hold no privmtl logic; the ServerApp, SecAgg+ and the
node runner (:mod:`privmtl.flower.node`) import them.
"""

from __future__ import annotations

import time
from typing import Any

from privmtl.flower import _flwr_compat

__all__ = [
    "IDLE_POLL_SECONDS",
    "POLL_SECONDS",
    "Backoff",
    "send_and_receive",
    "shorten_object_waits",
]

POLL_SECONDS = 0.05
"""Polling interval (seconds) of the SuperNode and of its ClientApp executor when they have just
had work, and of the ServerApp waiting for replies."""

IDLE_POLL_SECONDS = 0.25
"""The longest wait of an idle SuperNode or ClientApp executor between two polls
(:class:`Backoff`)."""


class Backoff:
    """Waits between polls: ``first`` seconds after work, then 1.5 times longer on every poll
    that finds nothing, up to ``cap``.

    Every poll is a request that another process on the machine serves; polling an idle link
    every ``first`` seconds costs more CPU than the work of a round when many processes share a
    few cores.
    """

    def __init__(self, first: float = POLL_SECONDS, cap: float = IDLE_POLL_SECONDS) -> None:
        self.first, self.cap = first, max(first, cap)
        self.next = first

    def reset(self) -> None:
        """Work was found: the next wait is ``first`` again."""
        self.next = self.first

    def wait(self) -> float:
        """Sleep before the next poll; returns the seconds slept."""
        seconds, self.next = self.next, min(self.cap, self.next * 1.5)
        time.sleep(seconds)
        return seconds


def send_and_receive(grid: Any, messages: list[Any], timeout: float) -> list[Any]:
    """Flower's ``Grid.send_and_receive``, asking for the replies every :data:`POLL_SECONDS`.

    (The Grid's own method asks every 3 s.) Returns the replies that arrived within ``timeout``
    seconds, as soon as every message has its reply.
    """
    waiting = set(grid.push_messages(messages))
    end = time.monotonic() + timeout
    out: list[Any] = []
    while waiting:
        replies = list(grid.pull_messages(waiting))
        out.extend(replies)
        waiting -= {m.metadata.reply_to_message_id for m in replies}
        if not waiting or time.monotonic() >= end:
            break
        time.sleep(POLL_SECONDS)
    return out


def shorten_object_waits(first: float = POLL_SECONDS, cap: float = 1.0) -> None:
    """Retry a message's objects after ``first`` seconds (doubling up to ``cap``), not 1 s.

    A message reaches its receiver (SuperNode, ClientApp, ServerApp) a moment before the objects
    that hold its content; Flower's object pull then waits 1 s, 2 s, ... (up to 10 s) before
    asking again. This sets the defaults of Flower's pull functions for this process
    (:func:`privmtl.flower._flwr_compat.shorten_object_waits`); outside the Flower versions that
    module supports it does nothing.
    """
    _flwr_compat.shorten_object_waits(first, cap)
