"""Reading a JSON file strictly, with the standard library only.

:func:`read_json` is :mod:`privmtl.io`'s (which re-exports it) and lives here so that a process
that must hold no numerical library (``privmtl flower local``'s waiting process, through
:mod:`privmtl.flower.run_info`) reads a run's JSON files the same way as every other layer.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from privmtl.exceptions import DataFormatError

__all__ = ["JSON_MAX_DEPTH", "read_json"]


JSON_MAX_DEPTH = 64
"""Deepest nesting of objects and lists :func:`read_json` accepts (privmtl's own files nest a few
levels; a deeper file would only exhaust the stack of whatever walks it next)."""


def _depth_exceeds(doc: Any, limit: int) -> bool:
    """Whether ``doc`` nests objects or lists more than ``limit`` levels (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > limit:
                return True
            items = node.values() if isinstance(node, dict) else node
            stack.extend((v, depth + 1) for v in items if isinstance(v, dict | list))
    return False


def read_json(path: str | os.PathLike[str], *, where: str | None = None) -> Any:
    """The JSON document in the regular file ``path``; every way it can be unreadable is one
    :class:`~privmtl.exceptions.DataFormatError` naming ``where`` (default: the path).

    Refused: a path that is not a regular file (a folder, a FIFO, a device: never read), a file
    that cannot be opened, text that is not UTF-8, malformed JSON, and nesting deeper than
    :data:`JSON_MAX_DEPTH` (however deep: no ``RecursionError`` escapes). The caller checks the
    document's shape (an object, its keys' types).
    """
    name = str(path) if where is None else where
    data: bytes | None = None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                with os.fdopen(fd, "rb", closefd=False) as fh:
                    data = fh.read()
        finally:
            os.close(fd)
    except OSError as exc:
        raise DataFormatError(f"{name} cannot be read ({exc.strerror or exc}).") from None
    except ValueError as exc:  # a NUL in the path
        raise DataFormatError(f"{name} cannot be read ({exc}).") from None
    if data is None:
        raise DataFormatError(f"{name} is not a regular file.")
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DataFormatError(
            f"{name} is not valid JSON: not UTF-8 text (byte {exc.start})."
        ) from None
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"{name} is not valid JSON: {exc}.") from None
    except RecursionError:
        doc = None
        deep = True
    else:
        deep = _depth_exceeds(doc, JSON_MAX_DEPTH)
    if deep:
        raise DataFormatError(
            f"{name} is not valid JSON for privmtl: it nests objects or lists more than "
            f"{JSON_MAX_DEPTH} levels deep."
        )
    return doc
