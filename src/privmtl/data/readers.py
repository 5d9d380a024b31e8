"""Readers for multi-task data: MALSAR ``.mat`` files (School) and long CSV/Parquet tables.

Every reader returns a :class:`~privmtl.data.multitask.MultiTaskDataset` and reports unreadable or
malformed input as :class:`~privmtl.exceptions.DataFormatError` naming the path, column or row.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from privmtl._validation import check_choice, physical_memory
from privmtl.data.multitask import TASK_TYPES, MultiTaskDataset, TaskType
from privmtl.exceptions import DataFormatError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "FEMNIST_ENV_VAR",
    "SCHOOL_ENV_VAR",
    "GroupedRows",
    "dataset_from_frame",
    "default_femnist_dir",
    "default_school_path",
    "group_rows",
    "grouped_frame",
    "load_malsar_mat",
    "load_school",
    "read_frame",
    "read_table",
]

SCHOOL_ENV_VAR = "PRIVMTL_SCHOOL_PATH"
_SHARED_ENV_VAR = "PRIVMTL_SHARED_DATA"
_CSV_SUFFIXES = (".csv", ".csv.gz")
_PARQUET_SUFFIXES = (".parquet", ".pq")


def _resolve_task_type(
    y: NDArray[np.float64], task_type: str | None, where: str
) -> tuple[NDArray[np.float64], TaskType]:
    """Infer/check the task type and map {-1, 1} labels to {0, 1}.

    Classification is inferred when the target values are a subset of {0, 1} or of {-1, 1}.
    """
    if task_type is not None:
        check_choice("task_type", task_type, TASK_TYPES)
    values = np.unique(y)
    is01 = bool(np.all(np.isin(values, (0.0, 1.0))))
    is_pm1 = bool(np.all(np.isin(values, (-1.0, 1.0))))
    if task_type == "regression" or (task_type is None and not (is01 or is_pm1)):
        return y, "regression"
    if is01:
        return y, "classification"
    if is_pm1:
        return (y > 0).astype(np.float64), "classification"
    shown = values[~np.isin(values, (-1.0, 0.0, 1.0))][:5].tolist()
    raise DataFormatError(
        f"{where}: classification targets must be 0/1 or -1/1; found values such as {shown}."
    )


# ---------------------------------------------------------------------- MALSAR .mat
def _cells(obj: Any, key: str, path: Path) -> list[Any]:
    arr = np.asarray(obj)
    if arr.dtype != object:
        raise DataFormatError(
            f"{path}: variable {key!r} must be a MATLAB cell array (1 x m or m x 1); "
            f"got a {arr.dtype} array of shape {arr.shape}."
        )
    if arr.ndim != 2 or 1 not in arr.shape:
        raise DataFormatError(
            f"{path}: cell array {key!r} must be 1 x m or m x 1; got shape {arr.shape}."
        )
    return list(arr.ravel())


def load_malsar_mat(
    path: str | os.PathLike[str],
    *,
    task_type: TaskType | None = "regression",
    task_names: Sequence[str] | None = None,
) -> MultiTaskDataset:
    """Read a MALSAR-style MATLAB file with cell arrays ``X`` and ``Y``.

    ``X{i}`` is the ``n_i x d`` feature matrix of task ``i`` and ``Y{i}`` its ``n_i x 1`` targets.
    Cells may be laid out 1 x m or m x 1. Values of any numeric MATLAB class (School stores
    **uint8**) are converted to float64 before any arithmetic. No column is added or removed.

    Parameters
    ----------
    path : path-like
        The ``.mat`` file (MATLAB v4-v7.2, read by :func:`scipy.io.loadmat`).
    task_type : {"regression", "classification"} or None, default="regression"
        ``None`` infers classification when all targets are in {0, 1} or {-1, 1}.
        -1/1 labels are mapped to 0/1.
    task_names : sequence of str, optional
        Default ``("task_0", ...)``.

    Returns
    -------
    MultiTaskDataset

    Raises
    ------
    DataFormatError
        If the file is missing or unreadable, ``X``/``Y`` are missing or not cell arrays of matching
        length, or a cell has an invalid shape or content (the task index is named).
    """
    from scipy.io import loadmat

    p = Path(path)
    if not p.is_file():
        raise DataFormatError(f"MALSAR .mat file not found: {p}")
    try:
        mat = loadmat(str(p))
    except Exception as exc:  # scipy raises several types for corrupt files
        raise DataFormatError(f"{p}: not a readable MATLAB .mat file ({exc}).") from exc
    for key in ("X", "Y"):
        if key not in mat:
            found = sorted(k for k in mat if not k.startswith("__"))
            raise DataFormatError(f"{p}: variable {key!r} not found; the file has {found}.")
    Xc, Yc = _cells(mat["X"], "X", p), _cells(mat["Y"], "Y", p)
    if len(Xc) != len(Yc):
        raise DataFormatError(f"{p}: X has {len(Xc)} cells but Y has {len(Yc)}.")
    Xs: list[NDArray[np.float64]] = []
    ys: list[NDArray[np.float64]] = []
    for i, (xi, yi) in enumerate(zip(Xc, Yc, strict=True)):
        try:
            Xa = np.asarray(xi).astype(np.float64)
            ya = np.asarray(yi).astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise DataFormatError(f"{p}: cell {i + 1} is not numeric ({exc}).") from exc
        if ya.ndim == 2 and 1 in ya.shape:
            ya = ya.ravel()
        if Xa.ndim != 2 or ya.ndim != 1:
            raise DataFormatError(
                f"{p}: cell {i + 1}: X must be n_i x d and Y n_i x 1; "
                f"got {Xa.shape} and {np.asarray(yi).shape}."
            )
        Xs.append(Xa)
        ys.append(ya)
    y_all, kind = _resolve_task_type(np.concatenate(ys), task_type, str(p))
    ys = np.split(y_all, np.cumsum([len(y) for y in ys])[:-1])
    return MultiTaskDataset(
        X=tuple(Xs),
        y=tuple(ys),
        task_names=tuple(task_names) if task_names is not None else (),
        task_type=kind,
    )


FEMNIST_ENV_VAR = "PRIVMTL_FEMNIST_DIR"


def default_femnist_dir() -> Path:
    """``$PRIVMTL_FEMNIST_DIR``, else ``../shared/data/femnist-leaf`` relative to the CWD."""
    env = os.environ.get(FEMNIST_ENV_VAR)
    return Path(env) if env else Path("..") / "shared" / "data" / "femnist-leaf"


def default_school_path() -> Path:
    """Where :func:`load_school` looks by default.

    In order: ``$PRIVMTL_SCHOOL_PATH``; ``$PRIVMTL_SHARED_DATA/school/school.mat``;
    ``../shared/data/school/school.mat`` relative to the current working directory.
    """
    env = os.environ.get(SCHOOL_ENV_VAR)
    if env:
        return Path(env)
    shared = os.environ.get(_SHARED_ENV_VAR)
    if shared:
        return Path(shared) / "school" / "school.mat"
    return Path.cwd().parent / "shared" / "data" / "school" / "school.mat"


def load_school(path: str | os.PathLike[str] | None = None) -> MultiTaskDataset:
    """Load the School data (ILEA, as distributed with MALSAR): 139 regression tasks.

    Each task is a school; ``X_i`` is ``n_i x 28`` (27 attributes and a final constant column of
    ones, kept as is), ``y_i`` the exam scores; 15 362 students in total. Task names are
    ``"school_001"`` ... ``"school_139"``. Apply the MP-MTL protocol yourself:
    ``load_school().train_test_split(0.3, random_state=...)`` and ``normalize_rows()``.

    Parameters
    ----------
    path : path-like, optional
        Default :func:`default_school_path`.

    Raises
    ------
    DataFormatError
        If the file does not exist (the message names the path and ``PRIVMTL_SCHOOL_PATH``).
    """
    p = Path(path) if path is not None else default_school_path()
    if not p.is_file():
        raise DataFormatError(
            f"School data not found at {p}. Pass the path of school.mat or set the environment "
            f"variable {SCHOOL_ENV_VAR} (or {_SHARED_ENV_VAR} to the shared data folder)."
        )
    data = load_malsar_mat(p, task_type="regression")
    names = tuple(f"school_{i + 1:03d}" for i in range(data.n_tasks))
    return MultiTaskDataset(X=data.X, y=data.y, task_names=names, task_type="regression")


# ---------------------------------------------------------------------- tables
def _first_bad_row(
    frame: pd.DataFrame, column: str, mask: NDArray[np.bool_], first_line: int | None
) -> str:
    pos = int(np.argmax(mask))
    if first_line is not None:  # a CSV file: name the line a user sees in an editor
        return f"column {column!r}, line {pos + int(first_line)} of the file"
    return f"column {column!r} row {pos} (index label {frame.index[pos]!r})"


#: Columns a "not found" error lists before "… and N more".
_SHOWN_COLUMNS = 10


def _column_hint(wanted: str, columns: Sequence[str]) -> str:
    """The table's columns for a "not found" error (the end of its sentence): the first few, and
    the ones close to ``wanted``."""
    import difflib

    shown = repr(list(columns[:_SHOWN_COLUMNS]))
    if len(columns) > _SHOWN_COLUMNS:
        shown = f"{shown[:-1]}, … and {len(columns) - _SHOWN_COLUMNS} more]"
    close = difflib.get_close_matches(wanted, list(columns), n=3)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else "."
    return f"columns ({len(columns)}): {shown}{hint}"


def _check_unique_columns(columns: Sequence[str], source: str) -> None:
    """Refuse a table in which two columns have the same name (which one would be meant?)."""
    seen: dict[str, int] = {}
    for position, name in enumerate(columns, start=1):
        if name == "":  # unnamed columns (a written index) get distinct names from pandas
            continue
        if name in seen:
            raise DataFormatError(
                f"{source}: column {name!r} appears more than once (columns {seen[name]} and "
                f"{position}); rename one of them."
            )
        seen[name] = position


def _numeric_block(
    frame: pd.DataFrame,
    feats: list[str],
    target: str,
    source: str,
    first_line: int | None,
    target_hint: str = "",
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The feature matrix and the target column as float64, refusing the first column (in the
    order features, target) that is not numeric or holds a NaN/infinite value (``target_hint``:
    what to do about a target that is not numeric).

    Column by column into one preallocated matrix: no copy of the frame (a CSV file read by
    pandas may hold one block per column, which makes every selection of many columns slow).
    """
    import pandas as pd

    need = len(frame) * (len(feats) + 1) * 8
    memory = physical_memory()
    if memory is not None and need > memory:
        raise DataFormatError(
            f"{source}: {len(frame)} rows of {len(feats)} feature columns would need "
            f"{need / 2**30:.3g} GiB of memory as float64, more than this machine's "
            f"{memory / 2**30:.3g} GiB."
        )
    numeric: dict[Any, bool] = {}
    block = np.empty((len(frame), len(feats) + 1), dtype=np.float64)
    for j, col in enumerate([*feats, target]):
        s = frame[col]
        if s.dtype not in numeric:
            numeric[s.dtype] = pd.api.types.is_numeric_dtype(s.dtype) or pd.api.types.is_bool_dtype(
                s.dtype
            )
        if not numeric[s.dtype]:
            bad = pd.to_numeric(s, errors="coerce").isna().to_numpy() & s.notna().to_numpy()
            where = _first_bad_row(frame, col, bad, first_line) if bad.any() else f"column {col!r}"
            hint = target_hint if col == target else ""
            raise DataFormatError(
                f"{source}: non-numeric value in {where} (dtype {s.dtype}){hint}."
            )
        vals = block[:, j]
        vals[:] = s.to_numpy(dtype=np.float64, na_value=np.nan)
        bad = ~np.isfinite(vals)
        if bad.any():
            raise DataFormatError(
                f"{source}: NaN or infinite value in {_first_bad_row(frame, col, bad, first_line)}."
            )
    return block[:, :-1], block[:, -1].copy()


_TABLE_ROLES = ("task", "task column (--task-column)", "target column (--target-column)")
"""What a multi-task table's rows are grouped by, and its two columns as errors name them."""


class GroupedRows(NamedTuple):
    """A long table's rows sorted by group (task or client), stably: group ``k`` owns rows
    ``offsets[k]:offsets[k + 1]`` of ``X`` and ``y``, in the order they appear in the table."""

    X: NDArray[np.float64]
    y: NDArray[np.float64]
    offsets: NDArray[np.int64]
    names: tuple[str, ...]
    feature_names: tuple[str, ...]
    task_type: TaskType


def group_rows(codes: NDArray[np.integer[Any]], n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows of each group one after the other: ``(order, offsets)``, group ``k`` being rows
    ``order[offsets[k]:offsets[k + 1]]`` (increasing), from one stable sort of the codes."""
    order = np.argsort(codes, kind="stable")
    counts = np.bincount(codes, minlength=n_groups)
    return order, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def dataset_from_frame(
    frame: pd.DataFrame,
    *,
    task_column: str = "task",
    target_column: str = "y",
    feature_columns: Sequence[str] | None = None,
    task_type: TaskType | None = None,
    source: str = "table",
    roles: tuple[str, str, str] = _TABLE_ROLES,
) -> MultiTaskDataset:
    """Build a dataset from a long table with one row per sample.

    Tasks appear in the order of their first row (for a categorical task column: the category
    order). See :func:`read_table` for the rules. ``roles`` names, in error messages, what a row's
    group is and how the task and target columns are called (``("client", "--client-column",
    "--label-column")`` for a federated table read by the CLI).
    """
    g = grouped_frame(
        frame,
        task_column=task_column,
        target_column=target_column,
        feature_columns=feature_columns,
        task_type=task_type,
        source=source,
        roles=roles,
    )
    cuts = g.offsets[1:-1]
    return MultiTaskDataset(
        X=tuple(np.split(g.X, cuts)),
        y=tuple(np.split(g.y, cuts)),
        task_names=g.names,
        task_type=g.task_type,
        feature_names=g.feature_names,
    )


def grouped_frame(
    frame: pd.DataFrame,
    *,
    task_column: str,
    target_column: str,
    feature_columns: Sequence[str] | None = None,
    task_type: TaskType | None = None,
    source: str = "table",
    roles: tuple[str, str, str] = _TABLE_ROLES,
) -> GroupedRows:
    """A long table's rows checked and sorted by group, contiguous (:class:`GroupedRows`):
    :func:`dataset_from_frame`'s rules and errors, one vectorised sort, no copy per group."""
    import pandas as pd

    unit, task_role, target_role = roles
    columns = [str(c) for c in frame.columns]
    first_line = frame.attrs.get("privmtl_first_line")
    _check_unique_columns(frame.attrs.get("privmtl_header", columns), source)
    # pandas deep-copies ``attrs`` into every column or sub-frame taken from a frame: with the
    # header kept there, reading n columns one by one would cost n copies of n names
    frame = frame.set_axis(columns, axis=1)
    frame.attrs = {}
    for col, what in ((task_column, task_role), (target_column, target_role)):
        if col not in columns:
            raise DataFormatError(
                f"{source}: {what} {col!r} not found; {_column_hint(col, columns)}"
            )
    if feature_columns is None:
        feats = [c for c in columns if c not in (task_column, target_column)]
    else:
        feats = [str(c) for c in feature_columns]
        missing = [c for c in feats if c not in columns]
        if missing:
            raise DataFormatError(
                f"{source}: feature column(s) {missing} not found; "
                f"{_column_hint(missing[0], columns)}"
            )
        overlap = [c for c in feats if c in (task_column, target_column)]
        if overlap:
            raise DataFormatError(
                f"{source}: column(s) {overlap} cannot be both a feature and the "
                f"{task_role} or {target_role}."
            )
    if not feats:
        raise DataFormatError(f"{source}: no feature columns (columns: {columns}).")
    if len(frame) == 0:
        raise DataFormatError(f"{source}: the table has no rows.")

    tasks = frame[task_column]
    if tasks.isna().any():
        raise DataFormatError(
            f"{source}: missing {unit} in "
            f"{_first_bad_row(frame, task_column, tasks.isna().to_numpy(), first_line)}."
        )
    hint = (
        "; class labels must be the integers 0..C-1: map yours to them first (e.g. with "
        "pandas.factorize)"
        if unit == "client"
        else "; the target must be a number (binary labels as 0/1 or -1/1)"
    )
    X_all, y_all = _numeric_block(frame, feats, target_column, source, first_line, hint)
    y_all, kind = _resolve_task_type(y_all, task_type, f"{source}: column {target_column!r}")

    if isinstance(tasks.dtype, pd.CategoricalDtype):
        order = list(tasks.cat.categories)
        codes = tasks.cat.codes.to_numpy()
        present = np.bincount(codes, minlength=len(order)) > 0
        empty = [str(c) for k, c in enumerate(order) if not present[k]]
        if empty:
            raise DataFormatError(
                f"{source}: {unit}(s) {empty[:5]} have 0 rows in {task_role} {task_column!r}."
            )
    else:
        codes_, uniques = pd.factorize(tasks, sort=False)
        codes, order = np.asarray(codes_), list(uniques)
    names = [str(t) for t in order]
    if len(set(names)) != len(names):
        raise DataFormatError(
            f"{source}: {unit} labels in {task_role} {task_column!r} collide as strings."
        )
    rows, offsets = group_rows(np.asarray(codes, dtype=np.int64), len(order))
    return GroupedRows(X_all[rows], y_all[rows], offsets, tuple(names), tuple(feats), kind)


def read_table(
    path: str | os.PathLike[str],
    *,
    task_column: str = "task",
    target_column: str = "y",
    feature_columns: Sequence[str] | None = None,
    task_type: TaskType | None = None,
) -> MultiTaskDataset:
    """Read a long CSV or Parquet table (one row per sample) into a multi-task dataset.

    Parameters
    ----------
    path : path-like
        ``.csv`` / ``.csv.gz`` (read with :func:`pandas.read_csv`) or ``.parquet`` / ``.pq``
        (:func:`pandas.read_parquet`); the format is chosen by suffix.
    task_column : str, default="task"
        Column identifying the task of each row (any hashable values; names become ``str``).
        Tasks are ordered by first appearance, or by category order for a categorical column.
    target_column : str, default="y"
        Numeric target column.
    feature_columns : sequence of str, optional
        Feature columns in this order; default: every other column, in table order.
    task_type : {"regression", "classification"} or None, default=None
        ``None`` infers classification when the target values are a subset of {0, 1} or of
        {-1, 1} (-1/1 labels are mapped to 0/1), regression otherwise.

    Returns
    -------
    MultiTaskDataset

    Raises
    ------
    DataFormatError
        Missing file, unknown suffix, unreadable file, a column name used twice, missing column
        (the error lists the first columns and the close matches), non-numeric feature or
        target, NaN/infinite value or missing task label (the column and row are named), a task
        (category) with 0 rows, or classification targets that are not binary.
    """
    p = Path(path)
    return dataset_from_frame(
        read_frame(p),
        task_column=task_column,
        target_column=target_column,
        feature_columns=feature_columns,
        task_type=task_type,
        source=str(p),
    )


def read_frame(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a CSV (``.csv``, ``.csv.gz``) or Parquet (``.parquet``, ``.pq``) file into a frame.

    Raises :class:`~privmtl.exceptions.DataFormatError` for a missing file, an unknown suffix or
    an unreadable file. When pandas renamed a repeated column name of a CSV file (``"a", "a"`` ->
    ``"a", "a.1"``), the header as written is kept in ``frame.attrs["privmtl_header"]``, which
    :func:`dataset_from_frame` then refuses.
    """
    import pandas as pd

    p = Path(path)
    name = p.name.lower()
    if name.endswith(_CSV_SUFFIXES):
        reader: Any = pd.read_csv
    elif name.endswith(_PARQUET_SUFFIXES):
        reader = pd.read_parquet
    else:
        raise DataFormatError(
            f"{p}: unknown table format {''.join(p.suffixes) or '(no suffix)'!r}; "
            f"supported suffixes: {', '.join(_CSV_SUFFIXES + _PARQUET_SUFFIXES)}."
        )
    if not p.is_file():
        raise DataFormatError(f"table file not found: {p}")
    # pandas' chunked CSV parser reads about 2**20 cells per chunk and builds every column of
    # every chunk: for a wide table that is time quadratic in the number of columns
    options = {"low_memory": not _wide_csv(p)} if reader is pd.read_csv else {}
    try:
        frame = reader(p, **options)
    except Exception as exc:  # pandas/pyarrow raise many types for corrupt input
        raise DataFormatError(f"{p}: could not be read as a table ({exc}).") from exc
    if reader is pd.read_csv:
        frame.attrs["privmtl_first_line"] = 2  # line 1 is the header
        names = [str(c) for c in frame.columns]
        present = set(names)
        if any(m and m.group(1) in present for m in map(_RENAMED.fullmatch, names)):
            # pandas renames a repeated name ("a", "a" -> "a", "a.1"): keep the header as written
            header = pd.read_csv(p, header=None, nrows=1, dtype=str, keep_default_na=False)
            frame.attrs["privmtl_header"] = [str(c) for c in header.iloc[0]] if len(header) else []
    return frame


#: A column name pandas may have made from a repeated one (``"a.1"`` beside ``"a"``).
_RENAMED = re.compile(r"(.*)\.[0-9]+", re.DOTALL)
#: Bytes of a CSV file looked at, and fields its first line must reach there, for "wide".
_WIDE_PEEK = 1 << 16
_WIDE_FIELDS = 1024


def _wide_csv(path: Path) -> bool:
    """Whether a CSV file's first line has at least :data:`_WIDE_FIELDS` fields (or is longer
    than :data:`_WIDE_PEEK` bytes); such a file is parsed in one piece."""
    import gzip

    opener: Any = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            head = fh.read(_WIDE_PEEK)
    except Exception:  # an unreadable file: pandas reports it
        return False
    line, newline, _ = head.partition(b"\n")
    return line.count(b",") + 1 >= _WIDE_FIELDS or (not newline and len(head) == _WIDE_PEEK)
