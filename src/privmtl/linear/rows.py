"""MP-MTL's per-client rows: one row per task (a client), in :mod:`privmtl.per_client`'s format.

A task's scores read its own test rows only (its nMSE divides by its own targets' variance, its
AUC ranks its own scores), so a row depends on the other tasks only through the released model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from privmtl.linear.metrics import per_task_auc
from privmtl.per_client import ratio, with_mpmtl_gain

__all__ = ["mpmtl_rows"]


def mpmtl_rows(
    task_names: Sequence[str],
    n_train: Sequence[int],
    y_test: Sequence[Any],
    pred: Sequence[Any],
    kept: str,
    stl_pred: Sequence[Any] | None = None,
    *,
    classification: bool = False,
) -> pd.DataFrame:
    """MP-MTL rows (:data:`MPMTL_COLUMNS`; :data:`MPMTL_AUC_COLUMNS` for ``classification``):
    every task's test score of the method's predictions ``pred`` and, given ``stl_pred`` (each
    task alone), the same of it and the gain. Every number reads the task's own test rows only
    (its nMSE divides by its own targets' variance, never the pooled one)."""
    ys = [np.ravel(np.asarray(t, np.float64)) for t in y_test]
    m = len(ys)
    var = np.array([float(np.var(y)) if y.size else 0.0 for y in ys])

    def scores(p: Sequence[Any] | None) -> dict[str, np.ndarray]:
        if p is None:
            nan = np.full(m, np.nan)
            return {"auc": nan} if classification else {"mse": nan, "nmse": nan}
        if classification:
            return {"auc": np.asarray(per_task_auc(list(y_test), list(p)), np.float64)}
        mse = np.array(
            [
                float(np.mean((np.ravel(q) - y) ** 2)) if y.size else np.nan
                for q, y in zip(p, ys, strict=True)
            ]
        )
        return {"mse": mse, "nmse": ratio(mse, var)}

    own, alone = scores(pred), scores(stl_pred)
    table: dict[str, Any] = {
        "client": [str(t) for t in task_names],
        "n_train": np.asarray(n_train, np.int64),
        "n_test": np.array([y.size for y in ys], np.int64),
        "kept": [kept] * m,
    }
    table.update({f"test_{k}": v for k, v in own.items()})
    table.update({f"stl_{k}": v for k, v in alone.items()})
    rows = pd.DataFrame(table)
    return with_mpmtl_gain(rows)
