"""A user's federated classification table: one row per example, a client column, a label column.

Features are the other numeric columns (or the ones named). Every client's rows are split at random
into train / validation / test, each client with its own stream seeded by (seed, client name), as
:func:`~privmtl.data.federated.load_leaf` splits a writer's training data.

By default every client then standardizes its features with the mean and standard deviation of its
**own training split** (:func:`~privmtl.data.multitask.standardization`), applied to its own
train, validation and test rows, and clips every standardized value to ``±SCALING_CLIP``. Statistics pooled over clients would read every client's data
outside the private releases; per-client statistics are part of each client's local computation,
like its personalized model, and leave the guarantee unchanged.
"""

from __future__ import annotations

import os
import warnings
import zlib
from collections.abc import Callable, Sequence

import numpy as np

from privmtl._validation import check_choice, check_int, check_real
from privmtl.data.multitask import standardization
from privmtl.data.readers import grouped_frame, read_frame
from privmtl.data.row_federation import ContiguousFederation
from privmtl.exceptions import DataFormatError, PrivmtlWarning

__all__ = [
    "CLIENT_SCALINGS",
    "DEFAULT_CLIENT_SCALING",
    "MIN_CLIENT_ROWS",
    "SCALING_CLIP",
    "SCALING_DESCRIPTIONS",
    "client_scaling",
    "load_federated_table",
]

#: Rows a client needs: at least one training and one test example.
MIN_CLIENT_ROWS = 2

CLIENT_SCALINGS = ("per-client-clipped", "per-client", "none")
"""Feature scaling of a federated table, always with the statistics of each client's own training
split: ``per-client-clipped`` (the default) standardizes and then clips every standardized value
to ``[-SCALING_CLIP, SCALING_CLIP]``; ``per-client`` standardizes without the clip; ``none`` uses
the features as they are."""

DEFAULT_CLIENT_SCALING = CLIENT_SCALINGS[0]

SCALING_CLIP = 3.0
"""Bound on a standardized feature value under ``per-client-clipped``. A column that barely varies
on a client's training rows (a pixel that is almost always blank) has a tiny standard deviation, so
an ordinary value of it on a validation or test row would become tens of standard deviations; the
clip keeps every feature within a few standard deviations, whatever the column's unit. Chosen by
measurement (``benchmarks/results/digits_scaling.md``)."""

#: What each scaling did, as results and saved models report it (``"scaling"``).
SCALING_DESCRIPTIONS = {
    "per-client-clipped": "per-client standardization (own training split), "
    f"clipped to +-{SCALING_CLIP:g} standard deviations",
    "per-client": "per-client standardization (own training split)",
    "none": "none",
}


def _label_space(labels: np.ndarray, n_classes: int | None, src: str, column: str) -> int:
    """The number of classes ``K`` of a table's labels (see :func:`load_federated_table`)."""
    where = f"{src}: label column (--label-column) {column!r}"
    bad = (labels != np.round(labels)) | (labels < 0)
    if bad.any():
        raise DataFormatError(
            f"{where} must hold class labels 0, 1, 2, ...; got {labels[bad][0].item():g}."
        )
    values = np.unique(labels).astype(np.int64)
    shown = ", ".join(str(v) for v in values[:6]) + (", ..." if len(values) > 6 else "")
    if len(values) < 2:
        raise DataFormatError(
            f"{where} holds one class only (every label is {values[0]}); a classifier needs "
            "examples of at least two classes."
        )
    top = int(values[-1])
    if n_classes is None:
        if top + 1 > len(labels):
            raise DataFormatError(
                f"{where} holds label {top}: labels must be 0..K-1, so the model would have "
                f"{top + 1} classes, more than the table's {len(labels)} rows; the column has "
                f"{len(values)} distinct labels ({shown}). Relabel it to 0..{len(values) - 1} "
                "(e.g. each value's rank among the distinct values)."
            )
        n_classes = top + 1
        absent = np.setdiff1d(np.arange(n_classes), values)
        if len(absent):
            gaps = ", ".join(str(v) for v in absent[:6]) + (", ..." if len(absent) > 6 else "")
            warnings.warn(
                f"{where} has no row with label(s) {gaps} of 0..{top}: the model gets {n_classes} "
                f"classes, {len(absent)} of them never seen. If these classes do not exist, "
                f"relabel the column to 0..{len(values) - 1}.",
                PrivmtlWarning,
                stacklevel=3,
            )
    n_classes = check_int("n_classes", n_classes, low=2)
    if top >= n_classes:
        raise DataFormatError(
            f"{where} holds label {top}, out of range for n_classes={n_classes} (labels must be "
            f"in [0, {n_classes - 1}])."
        )
    return n_classes


def client_scaling(X_train: np.ndarray, scaling: str) -> Callable[[np.ndarray], np.ndarray]:
    """The feature transform one client fits on its own training rows ``X_train``.

    Parameters
    ----------
    X_train : ndarray of shape (n, d)
        The client's training rows (never another client's).
    scaling : {"per-client-clipped", "per-client", "none"}
        See :data:`CLIENT_SCALINGS`. Standardization is
        :func:`~privmtl.data.multitask.standardization` (columns constant on ``X_train`` keep
        their values before the clip).

    Returns
    -------
    callable
        Maps the client's rows (any split) to float64 features.
    """
    check_choice("scaling", scaling, CLIENT_SCALINGS)
    if scaling == "none":
        return lambda X: np.asarray(X, dtype=np.float64)
    mean, scale = standardization(X_train)
    if scaling == "per-client":
        return lambda X: (np.asarray(X, dtype=np.float64) - mean) / scale
    bound = SCALING_CLIP
    return lambda X: np.clip((np.asarray(X, dtype=np.float64) - mean) / scale, -bound, bound)


def load_federated_table(
    path: str | os.PathLike[str],
    *,
    client_column: str,
    label_column: str,
    feature_columns: Sequence[str] | None = None,
    n_classes: int | None = None,
    test_fraction: float = 0.2,
    val_fraction: float = 0.1,
    random_state: int = 0,
    scaling: str = DEFAULT_CLIENT_SCALING,
) -> ContiguousFederation:
    """Read a CSV/Parquet table into a federation stored client after client.

    Parameters
    ----------
    path : path-like
        ``.csv`` / ``.csv.gz`` / ``.parquet`` / ``.pq`` file, one row per example.
    client_column : str
        Column naming each row's client (any values; names become ``str``).
    label_column : str
        Class labels: integers ``0..K-1`` with ``K`` the number of classes (the model has one
        output per class). At least two distinct labels. Labels are never remapped: with
        ``n_classes`` not given, ``K`` is the largest label + 1; a label space larger than the
        table (``K`` above the number of rows: a label such as 999999 among a few classes, most
        of them without any example) is refused, and labels that leave classes of ``0..K-1``
        without any row (e.g. only 3 and 7) are taken with a :class:`PrivmtlWarning` naming
        the missing ones. Relabel the column to ``0..K-1`` if those classes do not exist.
    feature_columns : sequence of str, optional
        Feature columns in this order; default: every other column (all must be numeric).
    n_classes : int, optional
        Number of classes ``K``; default: the largest label + 1 (checked as above).
    test_fraction, val_fraction : float in [0, 1)
        Each client's test split is ``max(1, round(test_fraction * n_k))`` of its rows; its
        validation split ``floor(val_fraction * rest)`` of the remaining rows (at least one row
        stays for training).
    random_state : int, default 0
        Seed of the splits.
    scaling : {"per-client-clipped", "per-client", "none"}, default "per-client-clipped"
        ``"per-client"``: each client's features are centred and scaled with the mean and
        standard deviation of its own training split (columns constant there are left as they
        are); never with statistics pooled over clients. ``"per-client-clipped"``: the same, then
        every value clipped to ``[-SCALING_CLIP, SCALING_CLIP]`` (:data:`SCALING_CLIP`), so a
        column that barely varies on a client's training rows cannot blow up on its other rows.
        ``"none"``: as in the file.

    Returns
    -------
    ContiguousFederation
        A :class:`~privmtl.data.federated.FederatedDataset` whose clients (in the order of their
        first row, or the category order) own ranges of one array per split; the file is read
        and sorted by client once (one stable sort, no pass per client over the rows), and
        :meth:`~privmtl.data.row_federation.RowFederation.partition` keeps some of the clients
        (a Flower node's own) in arrays of their own.

    Raises
    ------
    DataFormatError
        Unreadable file, missing or repeated column, non-numeric or NaN/infinite value (column
        and row named), a label that is not an integer in ``[0, n_classes)``, a single class, a
        label space larger than the table, or a client with fewer than :data:`MIN_CLIENT_ROWS`
        rows.
    """
    src = str(path)
    test_fraction = check_real("test_fraction", test_fraction, low=0.0, high=1.0, closed="neither")
    val_fraction = check_real("val_fraction", val_fraction, low=0.0, high=1.0, closed="left")
    seed = check_int("random_state", random_state, low=0)
    check_choice("scaling", scaling, CLIENT_SCALINGS)
    g = grouped_frame(
        read_frame(path),
        task_column=client_column,
        target_column=label_column,
        feature_columns=feature_columns,
        task_type="regression",  # numeric check only; labels are checked below
        source=src,
        roles=("client", "client column (--client-column)", "label column (--label-column)"),
    )
    n_classes = _label_space(g.y, n_classes, src, label_column)
    n = np.diff(g.offsets)
    small = np.flatnonzero(n < MIN_CLIENT_ROWS)
    if small.size:
        name, count = g.names[small[0]], int(n[small[0]])
        raise DataFormatError(
            f"{src}: client {name!r} (--client-column {client_column!r}) has {count} row(s); every "
            f"client needs at least {MIN_CLIENT_ROWS} (one training and one test example)."
        )
    # every client's rows split into test / val / train (sizes as one vectorised rule) and
    # scaled with its own training rows, written client after client into one array per split
    n_test = np.minimum(np.maximum(1, np.round(test_fraction * n)), n - 1).astype(np.int64)
    n_val = np.minimum(np.floor(val_fraction * (n - n_test)), n - n_test - 1).astype(np.int64)
    sizes = {"test": n_test, "val": n_val, "train": n - n_test - n_val}
    offsets = {k: np.concatenate([[0], np.cumsum(v)]).astype(np.int64) for k, v in sizes.items()}
    d = g.X.shape[1]
    blocks = {
        k: (np.empty((int(o[-1]), d), np.float32), np.empty(int(o[-1]), np.int64), o)
        for k, o in offsets.items()
    }
    labels = g.y.astype(np.int64)
    for k, name in enumerate(g.names):
        a, b = int(g.offsets[k]), int(g.offsets[k + 1])
        perm = np.random.default_rng([seed, zlib.crc32(name.encode())]).permutation(b - a)
        cut = int(n_test[k]), int(n_test[k] + n_val[k])
        parts = dict(zip(("test", "val", "train"), np.split(perm, cut), strict=True))
        parts = {split: a + np.sort(rows) for split, rows in parts.items()}
        transform = client_scaling(g.X[parts["train"]], scaling)  # its own training rows only
        for split, rows in parts.items():
            x, y, o = blocks[split]
            x[o[k] : o[k + 1]] = transform(g.X[rows])
            y[o[k] : o[k + 1]] = labels[rows]
    return ContiguousFederation(
        list(g.names),
        {k: blocks[k] for k in ("train", "val", "test")},
        n_classes,
        (d,),
        os.path.basename(src),
        SCALING_DESCRIPTIONS[scaling],
    )
