"""The data options every command that reads data takes: one definition, used by all of them.

``privmtl pmtl``, ``pmtl-sweep``, ``mpmtl``, ``mpmtl-sweep`` and ``evaluate`` read a data path
(a file or a folder), a user's table columns and its scaling through the decorators below, and turn
them into keyword arguments of the experiment functions with :func:`pmtl_data_kwargs` /
:func:`mpmtl_data_kwargs`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from privmtl.data.federated_table import CLIENT_SCALINGS, DEFAULT_CLIENT_SCALING, SCALING_CLIP
from privmtl.data.registry import MPMTL_SCALINGS

__all__ = [
    "evaluate_data_options",
    "mpmtl_data_kwargs",
    "mpmtl_data_options",
    "pmtl_data_kwargs",
    "pmtl_data_options",
]

F = TypeVar("F", bound=Callable[..., Any])

_PATH_HELP = {
    "pmtl": "femnist-leaf: a LEAF folder with train/ and test/ (default: $PRIVMTL_FEMNIST_DIR or "
    "../shared/data/femnist-leaf); table: a CSV/Parquet file with one row per example.",
    "mpmtl": "school: the .mat file (default: $PRIVMTL_SCHOOL_PATH or "
    "../shared/data/school/school.mat); table: a CSV/Parquet file with one row per sample.",
    "evaluate": "Where the data is now (default: the absolute path the run recorded).",
}
_FEATURES_HELP = (
    "table: comma-separated feature columns (default: every other column, all numeric)."
)
_PMTL_SCALING_HELP = (
    "table: per-client-clipped (default): each client standardizes its features with the mean "
    "and standard deviation of its OWN training split (never statistics pooled over clients, "
    f"which would read the other clients' data), then clips every value to +-{SCALING_CLIP:g} "
    "(a feature that barely varies on a client's training rows cannot blow up on its other "
    "rows); per-client: the same without the clip; none: features as in the file."
)
_MPMTL_SCALING_HELP = (
    "auto (default): unit-norm for --data school (the MP-MTL paper's protocol) and for dp-aggr "
    "(its proof needs rows of norm <= 1), per-task for a table; per-task: each task's features standardized with its own training split's mean and "
    "standard deviation; unit-norm: every row scaled to unit l2 norm; none: as in the file. "
    "(--normalize is the former name.)"
)
_FRACTION_HELP = (
    "school/table: fraction of each task's rows used for training, the rest is the test split "
    "(default: 0.3 for school, the paper's protocol; 0.7 for a table)."
)


def _path_option(family: str) -> Callable[[F], F]:
    return click.option(
        "--data-path",
        type=click.Path(path_type=Path),
        help=_PATH_HELP[family] + ("" if family == "evaluate" else " Saved models record it."),
    )


def _apply(options: list[Callable[[F], F]]) -> Callable[[F], F]:
    def decorate(f: F) -> F:
        for opt in reversed(options):
            f = opt(f)
        return f

    return decorate


def pmtl_data_options() -> Callable[[F], F]:
    """``--data-path``, ``--client-column``, ``--label-column``, ``--feature-columns``, ``--scaling``."""
    return _apply(
        [
            _path_option("pmtl"),
            click.option("--client-column", help="table: the column naming each row's client."),
            click.option(
                "--label-column", help="table: the class label column (integers 0, 1, ...)."
            ),
            click.option("--feature-columns", help=_FEATURES_HELP),
            click.option(
                "--scaling", type=click.Choice(list(CLIENT_SCALINGS)), help=_PMTL_SCALING_HELP
            ),
        ]
    )


def mpmtl_data_options() -> Callable[[F], F]:
    """``--data-path``, ``--task-column``, ``--target-column``, ``--feature-columns``,
    ``--scaling`` (alias ``--normalize``), ``--train-fraction``."""
    return _apply(
        [
            _path_option("mpmtl"),
            click.option(
                "--task-column",
                default="task",
                show_default=True,
                help="table: the column naming the task.",
            ),
            click.option(
                "--target-column", default="y", show_default=True, help="table: the target column."
            ),
            click.option("--feature-columns", help=_FEATURES_HELP),
            click.option(
                "--scaling",
                "--normalize",
                "scaling",
                type=click.Choice(list(MPMTL_SCALINGS)),
                default="auto",
                show_default=True,
                help=_MPMTL_SCALING_HELP,
            ),
            click.option(
                "--train-fraction",
                type=click.FloatRange(0, 1, min_open=True, max_open=True),
                help=_FRACTION_HELP,
            ),
        ]
    )


def evaluate_data_options() -> Callable[[F], F]:
    """Every data option of both families, each defaulting to what the run recorded."""
    recorded = " Default: what the run recorded in model.json."
    return _apply(
        [
            _path_option("evaluate"),
            click.option("--client-column", help="PMTL table: the client column." + recorded),
            click.option("--label-column", help="PMTL table: the label column." + recorded),
            click.option("--task-column", help="MP-MTL table: the task column." + recorded),
            click.option("--target-column", help="MP-MTL table: the target column." + recorded),
            click.option(
                "--feature-columns", help="table: comma-separated feature columns." + recorded
            ),
            click.option(
                "--scaling",
                type=click.Choice(sorted({*CLIENT_SCALINGS, *MPMTL_SCALINGS})),
                help="Feature scaling (see privmtl pmtl/mpmtl --help)." + recorded,
            ),
            click.option(
                "--train-fraction",
                type=click.FloatRange(0, 1, min_open=True, max_open=True),
                help="MP-MTL: training fraction of the split." + recorded,
            ),
        ]
    )


def _columns(text: str | None) -> list[str] | None:
    if text is None:
        return None
    cols = [c.strip() for c in text.split(",") if c.strip()]
    if not cols:
        raise click.BadParameter(
            f"must name at least one column; got {text!r}", param_hint="--feature-columns"
        )
    return cols


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def pmtl_data_kwargs(kw: dict[str, Any], data: str) -> dict[str, Any]:
    """Pop the PMTL data options from ``kw``, check them against ``data``, return run keywords.

    A table needs ``--data-path``, ``--client-column`` and ``--label-column``; the column and
    scaling options apply to a table only. The scaling defaults to
    :data:`~privmtl.data.federated_table.DEFAULT_CLIENT_SCALING`.
    """
    names = ("data_path", "client_column", "label_column", "feature_columns", "scaling")
    opts = {n: kw.pop(n) for n in names}
    if data == "table":
        for name in ("data_path", "client_column", "label_column"):
            if opts[name] is None:
                raise click.BadParameter("required with --data table", param_hint=_flag(name))
        if opts["scaling"] is None:
            opts["scaling"] = DEFAULT_CLIENT_SCALING
    else:
        for name in names[1:]:
            if opts[name] is not None:
                raise click.BadParameter("only with --data table", param_hint=_flag(name))
        opts["scaling"] = DEFAULT_CLIENT_SCALING  # ignored by the papers' data sets
    opts["feature_columns"] = _columns(opts["feature_columns"])
    return opts


def mpmtl_data_kwargs(kw: dict[str, Any], data: str) -> dict[str, Any]:
    """Pop the MP-MTL data options from ``kw`` and return run keywords (``normalize``: the scaling)."""
    opts = {
        n: kw.pop(n)
        for n in (
            "data_path",
            "task_column",
            "target_column",
            "feature_columns",
            "scaling",
            "train_fraction",
        )
    }
    if data != "table" and opts["feature_columns"] is not None:
        raise click.BadParameter("only with --data table", param_hint="--feature-columns")
    opts["feature_columns"] = _columns(opts["feature_columns"])
    opts["normalize"] = opts.pop("scaling")
    return opts
