"""Fixtures of the Flower tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest


def _alive_with_home(home: Path) -> list[str]:
    """Live processes whose environment names this run's Flower home, as ``"pid: cmdline"``.

    An oracle independent of the launcher's own teardown: it reads ``/proc`` directly.
    """
    found = []
    marker = f"FLWR_HOME={home}\0".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes() + b"\0"
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in env and stat.split(") ")[1][0] != "Z":
            found.append(f"{pid}: {cmd}")
    return found


@pytest.fixture
def alive_with_home() -> Callable[[Path], list[str]]:
    """``alive_with_home(home)``: the processes still carrying the run's ``FLWR_HOME``."""
    return _alive_with_home
