"""Resumable sweeps: every finished run is appended to ``runs.jsonl`` in the sweep's output folder.

A run is keyed by its full configuration (every argument that can change its result). Re-running a
sweep into the same folder reuses the logged runs whose key matches and computes only the others;
runs of other configurations stay in the log and are simply not used. The sweep's tables and plots
are written only when every run is finished; a sweep removes the previous tables when it logs its
first run, so an interrupted sweep leaves the log (plainly partial) and no table that looks
complete. A sweep refused before its first run (bad input) creates and removes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from privmtl.io import append_jsonl, check_writable_dir, load_jsonl, to_jsonable

__all__ = ["RUN_LOG", "RunLog", "run_key"]

#: Name of the append-only log of finished runs inside a sweep's output folder.
RUN_LOG = "runs.jsonl"


def run_key(config: dict[str, Any]) -> str:
    """Canonical JSON of a run's configuration (the identity of a run in the log)."""
    return json.dumps(config, sort_keys=True, default=str, separators=(",", ":"))


class RunLog:
    """The finished runs of a sweep writing to ``out_dir`` (checked writable now, created when
    the first run is logged).

    Parameters
    ----------
    out_dir : path
        The sweep's output folder; ``out_dir/runs.jsonl`` is the log.
    outputs : sequence of str
        File names of the sweep's final tables and plots in ``out_dir``: removed when the first
        run is logged, written again (atomically) when the sweep finishes.
    param : str, default "out"
        The parameter named in errors about ``out_dir``.
    """

    def __init__(self, out_dir: Path, *, outputs: Sequence[str] = (), param: str = "out") -> None:
        self.out_dir = check_writable_dir(Path(out_dir), name=param)
        self.path = self.out_dir / RUN_LOG
        self._rows: dict[str, dict[str, Any]] = {}
        for rec in load_jsonl(self.path):
            if isinstance(rec, dict) and "key" in rec and "row" in rec:
                self._rows[rec["key"]] = rec["row"]
        self._stale = list(outputs)
        self.reused = 0
        self.computed = 0

    def has(self, config: dict[str, Any]) -> bool:
        """Whether the run with this configuration is logged."""
        return run_key(config) in self._rows

    def get(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """The logged result of the run with this configuration, or ``None``."""
        row = self._rows.get(run_key(config))
        if row is not None:
            self.reused += 1
        return None if row is None else dict(row)

    def add(self, config: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
        """Append a finished run (``fsync``-ed before returning); returns the row as logged.

        The returned row is what a resumed sweep reads back (strict JSON: non-finite floats are
        ``None``), so tables built from it are the same whether or not the sweep was interrupted.
        """
        key = run_key(config)
        logged = to_jsonable(row)
        for name in self._stale:  # the previous sweep's tables no longer describe the folder
            (self.out_dir / name).unlink(missing_ok=True)
        self._stale = []
        append_jsonl(self.path, {"key": key, "row": logged})
        self._rows[key] = logged
        self.computed += 1
        return dict(logged)
