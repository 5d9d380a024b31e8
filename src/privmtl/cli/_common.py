"""Helpers shared by the CLI commands: error handling, JSON output, atomic writes."""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import numpy as np

from privmtl.exceptions import PrivmtlError, PrivmtlWarning

__all__ = ["atomic_output_dir", "echo_json", "run_cli", "to_jsonable", "write_json_atomic"]

_default_showwarning = warnings.showwarning


def run_cli(group: click.Group, argv: list[str]) -> int:
    """Run ``group`` and turn user errors into one line on stderr with exit code 2."""
    with warnings.catch_warnings():
        warnings.simplefilter("once", PrivmtlWarning)  # repeated runs (sweeps): say it once
        warnings.showwarning = _show_warning
        return _run(group, argv)


def _show_warning(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
    if issubclass(category, PrivmtlWarning):
        click.echo(f"privmtl: warning: {_one_line(str(message))}", err=True)
    else:
        _default_showwarning(message, category, *args, **kwargs)


def _run(group: click.Group, argv: list[str]) -> int:
    try:
        group.main(args=argv, prog_name="privmtl", standalone_mode=False)
    except click.exceptions.Exit as exc:  # --help, --version
        return int(exc.exit_code or 0)
    except click.exceptions.Abort:
        click.echo("privmtl: aborted", err=True)
        return 130
    except click.ClickException as exc:  # usage errors: bad option values, missing options
        click.echo(f"privmtl: error: {_one_line(exc.format_message())}", err=True)
        return 2
    except PrivmtlError as exc:  # invalid parameters, malformed data, budget refusals
        click.echo(f"privmtl: error: {_one_line(str(exc))}", err=True)
        return 2
    except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        click.echo(f"privmtl: error: {_one_line(str(exc))}", err=True)
        return 2
    return 0


def _one_line(text: str) -> str:
    return " ".join(text.split())


def to_jsonable(obj: Any) -> Any:
    """Convert NumPy scalars/arrays and non-finite floats (→ None) for strict JSON."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return to_jsonable(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def echo_json(payload: dict[str, Any]) -> None:
    """Print exactly one JSON object on stdout."""
    click.echo(json.dumps(to_jsonable(payload), indent=None, sort_keys=False))


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON to ``path`` via a temporary file and an atomic rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(to_jsonable(payload), fh, indent=2)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_output_dir(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory; move its files into ``final`` only on success."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}."))
    try:
        yield tmp
        final.mkdir(parents=True, exist_ok=True)
        for item in tmp.iterdir():
            os.replace(item, final / item.name)
        tmp.rmdir()
    except BaseException:
        for item in tmp.iterdir():
            item.unlink()
        tmp.rmdir()
        raise


def progress(iterable: Any, *, desc: str, enabled: bool, total: int | None = None) -> Any:
    """A tqdm progress bar on stderr (quiet when ``enabled`` is False or stderr is not a TTY)."""
    from tqdm.auto import tqdm

    return tqdm(
        iterable,
        desc=desc,
        total=total,
        disable=None if enabled else True,
        file=sys.stderr,
        leave=False,
    )
