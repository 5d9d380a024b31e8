"""Trained linear multi-task models as files a user can load without privmtl.

A models directory written by :func:`save_linear_models` (``privmtl mpmtl --save-models DIR``)
holds

``coef.npy``
    The fitted ``W`` as a float64 NumPy array of shape ``(d, m)`` (``numpy.load("coef.npy")``):
    column ``i`` is task ``i``'s weight vector ``w_i``, in the order of the tasks of the data set
    (``data.task_ids`` in ``model.json`` when the data has task names). Task ``i`` scores a
    feature row ``x`` (preprocessed as the run did, see ``data.preprocessing``) as
    ``s = x @ w_i + b_i``, ``b_i = data.target_offsets[i]`` in ``model.json`` (the task's mean
    training target on a user's regression table; zero or absent otherwise); regression predicts ``s``, logistic classification ``P(y = 1) = 1/(1+e^-s)``.
``clients.csv``
    One row per task (:mod:`privmtl.per_client`): its sizes, its test score, its score alone
    and the gain (``clients.file`` in ``model.json``).
``model.json``
    ``format`` (``"privmtl-models"``), ``version``, ``family`` (``"mpmtl"``), ``method``, the
    estimator and its parameters, ``loss``, the data the run used (name, path, split seed, train
    fraction, preprocessing, shape), the full privacy guarantee (ε, δ, relation, sampling,
    accountant, noise source; ``valid`` false for mechanisms that do not meet their claim), whether
    the run stopped on its budget, and the run's test metric.

Files are written to temporary names, ``fsync``\\ ed and renamed (``model.json`` last), so a
directory with a ``model.json`` is complete.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from privmtl.checkpoint import write_atomic
from privmtl.exceptions import DataFormatError
from privmtl.io import remove_durably
from privmtl.trust import folder_file, sign

__all__ = ["MODELS_FORMAT", "MODELS_VERSION", "load_linear_models", "save_linear_models"]

MODELS_FORMAT = "privmtl-models"
MODELS_VERSION = 1


def save_linear_models(
    directory: str | os.PathLike[str], coef: np.ndarray, meta: dict[str, Any], clients: Any = None
) -> Path:
    """Write ``coef.npy`` and ``model.json`` (``meta`` plus format, version, shape) into
    ``directory``; ``clients``: the per-task rows (:mod:`privmtl.per_client`), as ``clients.csv``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    remove_durably(d / "model.json")  # overwriting: incomplete until the new one is written
    W = np.ascontiguousarray(np.asarray(coef, dtype=np.float64))
    if W.ndim != 2:
        raise DataFormatError(f"coef must be a (d, m) matrix; got shape {W.shape}.")
    buf = io.BytesIO()
    np.save(buf, W, allow_pickle=False)
    write_atomic(d / "coef.npy", buf.getvalue())
    extra: dict[str, Any] = {}
    if clients is not None:
        from privmtl.per_client import CLIENTS_FILE, write_rows

        write_rows(d / CLIENTS_FILE, clients)
        extra["clients"] = {"file": CLIENTS_FILE}
    full = {
        "format": MODELS_FORMAT,
        "version": MODELS_VERSION,
        **meta,
        "coef": {
            "file": "coef.npy",
            "shape": list(W.shape),
            "dtype": "float64",
            "layout": "column i is task i's weight vector; score = x @ coef[:, i] + "
            "data.target_offsets[i] (0 when absent)",
        },
        **extra,
    }
    # signed: this user's folder is followed as it is (its recorded data path), see privmtl.trust
    text = json.dumps(sign(full), indent=2, sort_keys=True, allow_nan=False) + "\n"
    write_atomic(d / "model.json", text.encode())
    return d


def load_linear_models(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], np.ndarray]:
    """``(meta, coef)`` of a directory written by :func:`save_linear_models` (checked)."""
    d = Path(directory)
    where = str(d / "model.json")
    try:
        meta = json.loads((d / "model.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataFormatError(f"{d} holds no readable model.json: {exc}.") from None
    if not isinstance(meta, dict):
        raise DataFormatError(f"{where} must hold a JSON object; got {type(meta).__name__}.")
    if meta.get("format") != MODELS_FORMAT or meta.get("version") != MODELS_VERSION:
        raise DataFormatError(
            f"{d / 'model.json'} is not a privmtl models file of version {MODELS_VERSION} "
            f"(format {meta.get('format')!r}, version {meta.get('version')!r})."
        )
    for key in ("data", "coef"):
        if not isinstance(meta.get(key, {}), dict):
            raise DataFormatError(f"{where}: {key} must be an object; got {meta.get(key)!r}.")
    try:
        coef = np.load(folder_file(d, "coef.npy", where=where, key="coef.file"), allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DataFormatError(f"{d / 'coef.npy'} cannot be loaded: {exc}.") from None
    if list(coef.shape) != list(meta.get("coef", {}).get("shape", [])):
        raise DataFormatError(
            f"{d / 'coef.npy'} has shape {list(coef.shape)}; model.json says "
            f"{meta.get('coef', {}).get('shape')}."
        )
    return meta, np.asarray(coef, dtype=np.float64)
