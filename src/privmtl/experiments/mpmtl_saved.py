"""The saved models of an MP-MTL run: written beside the run's result, scored again later.

:func:`_save_models` writes the fitted ``W`` and its description (:mod:`privmtl.linear.saved`;
``model.json`` names the data, its protocol, the guarantee, the ledger and, for a user's method,
its file's SHA-256); :func:`evaluate_saved` reloads it and scores it on the same test split.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from privmtl._validation import check_int
from privmtl.checkpoint import write_atomic
from privmtl.data.multitask import MultiTaskDataset
from privmtl.data.registry import (
    SCHOOL_TRAIN_FRACTION,
    load_mpmtl_data,
)
from privmtl.exceptions import DataFormatError
from privmtl.linear.metrics import aauc, nmse
from privmtl.linear.rows import mpmtl_rows
from privmtl.linear.saved import linear_clients_file, load_linear_models, save_linear_models
from privmtl.per_client import check_rows_path, read_rows, with_mpmtl_gain, write_rows
from privmtl.privacy.ledger import check_saved_ledger
from privmtl.trust import followed_data_path, is_signed

__all__ = ["evaluate_saved"]


def _jsonable(value: Any) -> Any:

    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _write_json(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode())


def _save_models(
    directory: str | Path,
    est: Any,
    out: dict[str, Any],
    *,
    data: dict[str, Any],
    rows: Any = None,
) -> Path:
    metric = "nmse" if "nmse" in out else "auc"
    # the run's test metric and its baseline's (every task alone)
    baseline = ("stl_nmse", "stl_auc", "gain_over_stl", "gain_interval")
    metrics: dict[str, Any] = {metric: out[metric], **{k: out[k] for k in baseline if k in out}}
    meta = {
        "family": "mpmtl",
        "method": out["method"],
        "estimator": f"{type(est).__module__}.{type(est).__name__}",
        "loss": getattr(est, "loss", "squared"),
        "params": _jsonable(out["params"]),
        "data": _jsonable(data),
        "guarantee": _jsonable(out["guarantee"]),
        "summary": out["summary"],
        "noise_source": out["noise_source"],
        "stopped_on_budget": out["stopped_on_budget"],
        "iterations_run": out.get("iterations_run"),
        **({"method_source": out["method_source"]} if "method_source" in out else {}),
        "metrics": metrics,
    }
    ledger = getattr(est, "ledger_", None)
    if ledger is not None and ledger.path is not None:  # privmtl evaluate checks it
        meta["ledger"] = {"path": str(Path(ledger.path).resolve()), **ledger.seen()}
    return save_linear_models(directory, est.coef_, meta, clients=rows)


def evaluate_saved(
    models_dir: str | Path,
    *,
    data: str | None = None,
    data_path: str | Path | None = None,
    seed: int | None = None,
    task_column: str | None = None,
    target_column: str | None = None,
    feature_columns: list[str] | tuple[str, ...] | None = None,
    normalize: str | None = None,
    train_fraction: float | None = None,
    per_client: str | Path | None = None,
) -> dict[str, Any]:
    """Reload a model saved by ``run_mpmtl(save_models=...)`` and score it on the test split.

    The data set, its absolute path, the table's columns, the scaling, the training fraction and
    the split seed default to the run's (``model.json``); the same data and split give exactly the
    run's ``nmse`` (regression) or ``auc`` (classification). Models saved before the scaling was
    recorded were made with the paper's protocol (unit-norm rows, 30% training). The recorded data
    path is followed only for a folder this user signed (:mod:`privmtl.trust`); otherwise pass
    ``data_path``. ``per_client`` (a ``.csv`` or ``.parquet`` file) receives every task's row
    (:func:`~privmtl.linear.rows.mpmtl_rows`): its score now, beside its score alone as the run
    recorded it in the folder's ``clients.csv``.
    """
    import numpy as np

    if per_client is not None:
        per_client = check_rows_path(per_client)

    meta, coef = load_linear_models(models_dir)

    checked = check_saved_ledger(
        meta.get("ledger") if is_signed(meta) else None,  # outside paths: signed folders only
        meta.get("guarantee"),
        where=f"the saved model in {models_dir}",
    )
    if meta.get("family") != "mpmtl":
        raise DataFormatError(
            f"{models_dir} holds {meta.get('family')!r} models, not MP-MTL (linear) models."
        )
    saved = meta.get("data", {})
    name = data if data is not None else saved.get("data")
    path = followed_data_path(
        saved.get("data_path"),
        data_path,
        folder=Path(models_dir),
        signed=is_signed(meta),
        where=str(Path(models_dir) / "model.json"),
    )
    sd = check_int("seed", seed if seed is not None else saved.get("seed", 0), low=0)
    legacy = "scaling" not in saved  # written before scaling was recorded: the paper's protocol
    train, test = load_mpmtl_data(
        str(name),
        data_path=path,
        seed=sd,
        task_column=task_column or saved.get("task_column", "task"),
        target_column=target_column or saved.get("target_column", "y"),
        feature_columns=(
            feature_columns if feature_columns is not None else saved.get("feature_columns")
        ),
        normalize=normalize or ("unit-norm" if legacy else saved.get("scaling", "auto")),
        train_fraction=(
            train_fraction
            if train_fraction is not None
            else saved.get("train_fraction") or (SCHOOL_TRAIN_FRACTION if legacy else None)
        ),
    )
    d, m = coef.shape
    if (test.n_features, test.n_tasks) != (d, m):
        raise DataFormatError(
            f"The saved model has d={d} features and m={m} tasks; the data {name!r} has "
            f"d={test.n_features}, m={test.n_tasks}. Pass the --data the run used."
        )
    offsets = saved.get("target_offsets") or [0.0] * m  # absent: saved without intercepts
    scores = [
        np.asarray(x @ coef[:, i] + offsets[i], dtype=np.float64) for i, x in enumerate(test.X)
    ]
    out: dict[str, Any] = {
        "family": "mpmtl",
        "method": meta.get("method"),
        "data": name,
        "seed": sd,
        "models_dir": str(Path(models_dir).resolve()),
        "n_tasks": m,
        "n_features": d,
        "noise_source": meta.get("noise_source"),
        "stopped_on_budget": meta.get("stopped_on_budget"),
        "guarantee": meta.get("guarantee"),
        "covered": (meta.get("guarantee") or {}).get("covered"),
        "ledger_checked": checked,
        "summary": meta.get("summary"),
    }
    if test.task_type == "classification":
        out["auc"] = aauc(list(test.y), scores)
    else:
        out["nmse"] = nmse(list(test.y), scores)
    if per_client is not None:
        rows = _saved_task_rows(Path(models_dir), meta, train, test, scores)
        out["per_client_file"] = str(write_rows(per_client, rows))
    return out


def _saved_task_rows(
    models_dir: Path,
    meta: dict[str, Any],
    train: MultiTaskDataset,
    test: MultiTaskDataset,
    scores: list[Any],
) -> Any:
    """:func:`evaluate_saved`'s per-task rows: the scores now, each task alone as recorded in
    the folder's ``clients.csv`` (NaN without one)."""
    classification = test.task_type == "classification"
    rows = mpmtl_rows(
        test.task_names, [len(y) for y in train.y], list(test.y), scores, str(meta.get("method")),
        classification=classification,
    )  # fmt: skip
    name = linear_clients_file(models_dir, meta)  # inside the folder, its SHA-256 checked
    if name is not None:
        recorded = read_rows(name)
        columns = [c for c in rows.columns if c.startswith("stl_")]
        if list(recorded["client"]) != list(rows["client"]) or not set(columns) <= set(recorded):
            raise DataFormatError(f"{name} does not hold the {test.n_tasks} tasks' rows.")
        for column in columns:
            rows[column] = recorded[column].to_numpy(np.float64)
        rows = with_mpmtl_gain(rows)
    return rows
