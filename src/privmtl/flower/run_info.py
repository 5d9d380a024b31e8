"""The ServerApp's storage in a work directory, its ``run.json`` and a run's default work
directory, readable without PyTorch.

The launcher of ``privmtl flower local`` (:mod:`privmtl.flower.launcher`) watches a run's work
directory while the SuperNodes and the ServerApp compute: it imports this module, not the
ServerApp's (:mod:`privmtl.flower.server_run`), so that it holds no numerical library (``run.json``
is read by :mod:`privmtl.jsonfile`, which needs the standard library only).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

from privmtl.exceptions import DataFormatError
from privmtl.jsonfile import read_json

__all__ = ["SERVER_DIR", "default_work_dir", "read_run_info"]

SERVER_DIR = "server"
"""The ServerApp's storage inside the work directory (ledger, checkpoint, billboards, result)."""


def default_work_dir() -> Path:
    """A new durable work directory for a run: ``$XDG_STATE_HOME/privmtl/flower/run-<time>-<id>``.

    ``$XDG_STATE_HOME`` defaults to ``~/.local/state``: the ledger of a private run is a record of
    what was released and is never put in a temporary directory.
    """
    root = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return root / "privmtl" / "flower" / f"run-{stamp}-{secrets.token_hex(3)}"


def read_run_info(path: str | Path) -> dict[str, Any] | None:
    """The ServerApp's ``run.json`` at ``path`` (``run``, ``token``, ``finished``); None if absent.

    Raises
    ------
    DataFormatError
        Not a JSON object of those three keys with their types (a list, text that is not UTF-8,
        deep nesting, ...): one line naming the file.
    """
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        return None
    info = read_json(p)
    ok = (
        isinstance(info, dict)
        and isinstance(info.get("run"), int)
        and not isinstance(info.get("run"), bool)
        and info["run"] >= 0
        and isinstance(info.get("token"), str)
        and isinstance(info.get("finished"), bool)
    )
    if not ok:
        shown = json.dumps(info)[:80] if isinstance(info, dict | list) else repr(info)[:80]
        raise DataFormatError(
            f"{p} must be the ServerApp's JSON object {{run: integer >= 0, token: string, "
            f"finished: true or false}}; got {shown}. Remove the work directory's server/ or "
            "choose another --work-dir."
        )
    return info
