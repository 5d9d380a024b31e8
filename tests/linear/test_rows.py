"""MP-MTL's per-client rows: one row per task, each scored on its own test rows."""

from __future__ import annotations

import numpy as np
import pytest

from privmtl.linear.metrics import nmse
from privmtl.linear.rows import mpmtl_rows
from privmtl.per_client import MPMTL_COLUMNS


def test_mpmtl_rows_read_each_task_alone_and_add_up_to_the_pooled_nmse():
    rng = np.random.default_rng(0)
    ys = [rng.normal(size=n) for n in (5, 9, 4)]
    pred = [y + rng.normal(scale=0.3, size=y.size) for y in ys]
    alone = [y + rng.normal(scale=0.5, size=y.size) for y in ys]
    rows = mpmtl_rows(["t0", "t1", "t2"], [10, 20, 30], ys, pred, "lowrank", alone)
    assert list(rows.columns) == list(MPMTL_COLUMNS)
    for k, y in enumerate(ys):  # each task's own targets only
        mse = float(np.mean((pred[k] - y) ** 2))
        assert rows["test_mse"][k] == pytest.approx(mse)
        assert rows["test_nmse"][k] == pytest.approx(mse / np.var(y))
    pooled = (
        (rows["test_mse"] * rows["n_test"]).sum()
        / rows["n_test"].sum()
        / np.var(np.concatenate(ys))
    )
    assert pooled == pytest.approx(nmse(ys, pred))
    assert np.allclose(rows["gain"], rows["stl_nmse"] - rows["test_nmse"])
