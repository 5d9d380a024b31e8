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

``files_sha256`` (in ``model.json``) holds the SHA-256 of ``coef.npy``; the signature covers it,
and :func:`load_linear_models` refuses a ``coef.npy`` of another hash (copied in from another run).

Files are written in a staging folder inside the directory, ``fsync``\\ ed and moved into place
(``model.json`` last, :func:`privmtl.io.staged_folder`), so a directory with a ``model.json`` is
complete and a save that fails leaves the directory as it was.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from privmtl.exceptions import DataFormatError
from privmtl.io import read_json, staged_folder
from privmtl.per_client import CLIENTS_FILE, encode_rows
from privmtl.saved_files import linear_clients_file
from privmtl.trust import check_signing_key, folder_file, sign

__all__ = [
    "MODELS_FORMAT",
    "MODELS_VERSION",
    "linear_clients_file",
    "load_linear_models",
    "save_linear_models",
]

MODELS_FORMAT = "privmtl-models"
MODELS_VERSION = 2
"""Version 2 records the SHA-256 of ``coef.npy`` (``files_sha256``); version 1 did not."""


def save_linear_models(
    directory: str | os.PathLike[str], coef: np.ndarray, meta: dict[str, Any], clients: Any = None
) -> Path:
    """Write ``coef.npy`` and ``model.json`` (``meta`` plus format, version, shape) into
    ``directory``; ``clients``: the per-task rows (:mod:`privmtl.per_client`), as ``clients.csv``."""
    W = np.ascontiguousarray(np.asarray(coef, dtype=np.float64))
    if W.ndim != 2:
        raise DataFormatError(f"coef must be a (d, m) matrix; got shape {W.shape}.")
    check_signing_key()  # before any file is written
    d = Path(directory)
    with staged_folder(d) as staged:
        hashes = {
            "coef.npy": staged.write("coef.npy", lambda fh: np.save(fh, W, allow_pickle=False))
        }
        extra: dict[str, Any] = {}
        if clients is not None:
            rows = encode_rows(clients, CLIENTS_FILE)
            hashes[CLIENTS_FILE] = staged.write(CLIENTS_FILE, lambda fh: fh.write(rows))
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
            "files_sha256": hashes,
        }
        # signed: this user's folder is followed as it is (its recorded data path), see
        # privmtl.trust; the signature covers the files through their hashes
        text = json.dumps(sign(full), indent=2, sort_keys=True, allow_nan=False) + "\n"
        staged.commit("model.json", text.encode())
    return d


def load_linear_models(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], np.ndarray]:
    """``(meta, coef)`` of a directory written by :func:`save_linear_models` (checked)."""
    d = Path(directory)
    where = str(d / "model.json")
    meta = read_json(d / "model.json", where=where)
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
    digest = (
        meta.get("files_sha256", {}).get("coef.npy")
        if isinstance(meta.get("files_sha256"), dict)
        else None
    )
    if not isinstance(digest, str) or len(digest) != 64:
        raise DataFormatError(
            f"{where}: files_sha256['coef.npy'] must be the SHA-256 of coef.npy; got {digest!r}."
        )
    path = folder_file(d, "coef.npy", where=where, key="coef.file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataFormatError(f"{path} cannot be loaded: {exc.strerror or exc}.") from None
    now = hashlib.sha256(data).hexdigest()
    if not hmac.compare_digest(now, digest):
        raise DataFormatError(
            f"{path} is not the file {where} was written with: its SHA-256 {now[:12]}... "
            f"differs from the recorded {digest[:12]}... (files_sha256); refusing to use it."
        )
    try:
        coef = np.load(io.BytesIO(data), allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DataFormatError(f"{d / 'coef.npy'} cannot be loaded: {exc}.") from None
    if list(coef.shape) != list(meta.get("coef", {}).get("shape", [])):
        raise DataFormatError(
            f"{d / 'coef.npy'} has shape {list(coef.shape)}; model.json says "
            f"{meta.get('coef', {}).get('shape')}."
        )
    return meta, np.asarray(coef, dtype=np.float64)
