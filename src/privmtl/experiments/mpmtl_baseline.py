"""Every task alone beside an MP-MTL run: the single-task ridge baseline of its result."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from privmtl.gain import GAIN_LEVEL, gain_interval
from privmtl.linear.metrics import aauc, nmse, per_task_auc
from privmtl.linear.stl import STLRidge

if TYPE_CHECKING:
    from privmtl.experiments.mpmtl import LoadedData

__all__ = ["STL_BASELINE"]

STL_BASELINE = (
    "every task alone: ridge on its own training rows, its penalty chosen on its own samples "
    "(STLRidge(lam='cv'); the logistic loss for classification), no sharing and no privacy cost; "
    f"gain_interval: {GAIN_LEVEL:.0%} normal interval over tasks"
)
"""How an MP-MTL result's baseline is computed (its ``stl_baseline`` key)."""


def _stl_baseline(loaded: LoadedData, pred: list[Any], classification: bool) -> dict[str, Any]:
    """Every task alone beside the run (:data:`STL_BASELINE`): ``stl_nmse`` (``stl_auc``),
    ``gain_over_stl`` (positive: the run is better) and its ``gain_interval`` over tasks
    (:func:`~privmtl.gain.gain_interval`: per-task squared errors over the pooled target
    variance, as the pooled nMSE divides them; per-task AUCs for classification)."""
    train, test = loaded.train, loaded.test
    stl = STLRidge(lam="cv", loss="logistic" if classification else "squared")
    stl.fit(list(train.X), list(train.y))
    ys = [np.asarray(y, dtype=np.float64) for y in test.y]
    if classification:
        alone = stl.decision_function(list(test.X))
        own, base = per_task_auc(list(test.y), pred), per_task_auc(list(test.y), alone)
        has = ~(np.isnan(own) | np.isnan(base))
        gain, (low, high) = gain_interval(own[has], base[has], np.ones(int(has.sum())))
        return {
            "stl_auc": aauc(list(test.y), alone),
            "gain_over_stl": gain,
            "gain_interval": [low, high],
            "stl_baseline": STL_BASELINE,
            "_pred": alone,  # the per-task rows' scores; popped by the caller
        }
    alone = [p + o for p, o in zip(stl.predict(list(test.X)), loaded.offsets, strict=True)]
    var = float(np.var(np.concatenate(ys))) if ys else 0.0
    sse = np.array([float(((y - np.asarray(p)) ** 2).sum()) for y, p in zip(ys, pred, strict=True)])
    sse_stl = np.array(
        [float(((y - np.asarray(p)) ** 2).sum()) for y, p in zip(ys, alone, strict=True)]
    )
    n = np.array([len(y) for y in ys], dtype=np.float64)
    scale = var if var > 0 else 1.0
    gain, (low, high) = gain_interval(-sse / scale, -sse_stl / scale, n)
    return {
        "stl_nmse": nmse(list(test.y), alone),
        "gain_over_stl": gain,
        "gain_interval": [low, high],
        "stl_baseline": STL_BASELINE,
        "_pred": alone,  # the per-task rows' predictions; popped by the caller
    }
