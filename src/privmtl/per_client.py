"""Per-client results: one row per client (task), written as CSV or Parquet.

A result's pooled accuracy says how the population did; the rows say which clients gained or lost.
Every row holds the client's id, its train/validation/test sizes, the model it kept (``kept``: a
``finetune="auto"`` candidate name, else the kind of final model), its test score, its local-only
score and the gain of the first over the second. PMTL rows score accuracy
(:data:`PMTL_COLUMNS`), MP-MTL rows a task's nMSE (:data:`MPMTL_COLUMNS`) or AUC.

A row is the client's own output: its score is its final model on its own test split, so it
depends on the other clients only through the recorded releases (the mediation audit compares the
rows of two runs on neighbouring data, :mod:`privmtl.audit.mediation`). The local score is blank
(NaN) for a client outside the baseline's sample (:func:`~privmtl.federated.baseline.baseline_sample`).

Files are written atomically (:func:`privmtl.io.write_atomic`): a file at the path is complete.

pandas loads when rows are built (:func:`pmtl_rows`) or read (:func:`read_rows`), not when this
module is imported: a run imports it at its top to check its ``per_client`` path up front and
writes rows only when asked, and every Flower SuperNode imports it with the ServerApp's module.
MP-MTL's rows are built by :func:`privmtl.linear.rows.mpmtl_rows`.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from privmtl.exceptions import DataFormatError
from privmtl.io import check_output_file, write_atomic

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "CLIENTS_FILE",
    "MPMTL_AUC_COLUMNS",
    "MPMTL_COLUMNS",
    "PER_CLIENT_SUFFIXES",
    "PMTL_COLUMNS",
    "check_rows_path",
    "encode_rows",
    "pmtl_rows",
    "ratio",
    "read_rows",
    "with_mpmtl_gain",
    "write_rows",
]

CLIENTS_FILE = "clients.csv"
"""The per-client rows' file in a folder of saved models (``files.clients`` of ``model.json``)."""
PER_CLIENT_SUFFIXES = (".csv", ".parquet")
PMTL_COLUMNS = (
    "client", "n_train", "n_val", "n_test", "kept", "test_accuracy", "local_test_accuracy", "gain",
)  # fmt: skip
"""PMTL rows: ``gain`` is ``test_accuracy - local_test_accuracy`` (accuracy points, as a fraction)."""
MPMTL_COLUMNS = (
    "client", "n_train", "n_test", "kept", "test_mse", "test_nmse", "stl_mse", "stl_nmse", "gain",
)  # fmt: skip
"""MP-MTL rows of a regression (a task is a client): the task's test MSE, and its nMSE (the MSE
over the variance of the task's own test targets), of the run and of the task alone (``stl_``);
``gain`` is ``stl_nmse - test_nmse`` (positive: the task did better than alone). The rows' test
MSEs weighted by ``n_test`` over the pooled targets' variance give the run's ``nmse``."""
MPMTL_AUC_COLUMNS = ("client", "n_train", "n_test", "kept", "test_auc", "stl_auc", "gain")
"""MP-MTL rows of a classification: the task's test AUC, alone and shared; ``gain`` is
``test_auc - stl_auc``."""


def check_rows_path(path: str | Path, *, name: str = "per_client") -> Path:
    """``path`` as a :class:`~pathlib.Path`, checked before any computation: a ``.csv`` or
    ``.parquet`` file name whose folder exists or can be created and is writable. Raises
    :class:`~privmtl.exceptions.InvalidParameterError` naming ``name`` otherwise."""
    return check_output_file(
        path, name=name, suffixes=PER_CLIENT_SUFFIXES, kind="a .csv or .parquet"
    )


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``num / den`` element-wise, NaN where ``den`` is 0 (a client without test examples)."""
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    out = np.full(num.shape, np.nan)
    np.divide(num, den, out=out, where=den > 0)
    return out


def pmtl_rows(
    client_ids: Sequence[str],
    sizes: dict[str, np.ndarray],
    kept: Sequence[str],
    correct: np.ndarray,
    local_accuracy: np.ndarray | None = None,
) -> pd.DataFrame:
    """PMTL rows (:data:`PMTL_COLUMNS`) from every client's correct test predictions of its final
    model (``correct``), its local-only test accuracy (NaN where not computed; None: none) and its
    split ``sizes`` (``{"train", "val", "test"}``)."""
    import pandas as pd

    n_test = np.asarray(sizes["test"])
    acc = ratio(correct, n_test)
    local = (
        np.full(len(client_ids), np.nan)
        if local_accuracy is None
        else np.asarray(local_accuracy, np.float64)
    )
    return pd.DataFrame(
        {
            "client": [str(c) for c in client_ids],
            "n_train": np.asarray(sizes["train"], np.int64),
            "n_val": np.asarray(sizes["val"], np.int64),
            "n_test": n_test.astype(np.int64),
            "kept": [str(k) for k in kept],
            "test_accuracy": acc,
            "local_test_accuracy": local,
            "gain": acc - local,
        },
        columns=list(PMTL_COLUMNS),
    )


def with_mpmtl_gain(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with their ``gain`` column (again): ``test_auc - stl_auc``, or
    ``stl_nmse - test_nmse`` (positive: the task did better than alone)."""
    if "test_auc" in rows:
        rows["gain"] = rows["test_auc"] - rows["stl_auc"]
    else:
        rows["gain"] = rows["stl_nmse"] - rows["test_nmse"]
    return rows


def encode_rows(rows: pd.DataFrame, name: str | Path) -> bytes:
    """The bytes of ``rows`` as the file ``name`` holds them: Parquet for a ``.parquet`` name,
    else CSV (floats written as they round-trip)."""
    if Path(name).suffix.lower() == ".parquet":
        buf = io.BytesIO()
        rows.to_parquet(buf, index=False)
        return buf.getvalue()
    return rows.to_csv(index=False).encode()


def write_rows(path: str | Path, rows: pd.DataFrame) -> Path:
    """Write ``rows`` to ``path`` atomically (:func:`encode_rows`)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(p, encode_rows(rows, p))
    return p


def read_rows(path: str | Path) -> pd.DataFrame:
    """Rows written by :func:`write_rows` (the ``client`` column read as text). Raises
    :class:`~privmtl.exceptions.DataFormatError` for a file that is not such a table."""
    import pandas as pd

    p = Path(path)
    try:
        if p.suffix.lower() == ".parquet":
            rows = pd.read_parquet(p)
        else:
            rows = pd.read_csv(p, dtype={"client": str, "kept": str}, keep_default_na=False,
                               na_values=[""])  # fmt: skip
    except (OSError, ValueError) as exc:
        raise DataFormatError(f"{p} is not a table of per-client rows: {exc}.") from None
    if "client" not in rows.columns or "gain" not in rows.columns:
        raise DataFormatError(
            f"{p} is not a table of per-client rows (columns {list(rows.columns)[:8]}; "
            "expected 'client' and 'gain')."
        )
    return rows
