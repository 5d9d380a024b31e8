"""The ServerApp's storage in a work directory and its ``run.json``, readable without PyTorch.

The launcher of ``privmtl flower local`` (:mod:`privmtl.flower.launcher`) watches a run's work
directory while the SuperNodes and the ServerApp compute: it imports this module, not the
ServerApp's (:mod:`privmtl.flower.server_run`), so that it holds no numerical library.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from privmtl.exceptions import DataFormatError

__all__ = ["SERVER_DIR", "read_run_info"]

SERVER_DIR = "server"
"""The ServerApp's storage inside the work directory (ledger, checkpoint, billboards, result)."""


def read_run_info(path: str | Path) -> dict[str, Any] | None:
    """The ServerApp's ``run.json`` at ``path`` (``run``, ``token``, ``finished``); None if absent.

    Raises
    ------
    DataFormatError
        Not a JSON object of those three keys with their types (a list, text that is not UTF-8,
        deep nesting, ...): one line naming the file.
    """
    from privmtl.io import read_json

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
