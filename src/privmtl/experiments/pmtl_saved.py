"""A saved PMTL run, scored again: :func:`evaluate_saved` reloads the models a run saved
(``run_pmtl(save_models=...)``, ``privmtl pmtl --save-models``) and scores them on the test split
of the data the run used, with every client's row (``per_client``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from privmtl.data.federated import FederatedDataset
from privmtl.data.registry import load_federated
from privmtl.data.synthetic_federated import SYNTHETIC_STREAM
from privmtl.exceptions import DataFormatError
from privmtl.federated.algorithms import Params
from privmtl.federated.blocks import client_blocks
from privmtl.federated.methods import method_class
from privmtl.federated.saved import (
    build_model,
    check_params,
    iter_personalized,
    load_global,
    personalized_blocks,
    read_meta,
)
from privmtl.federated.scoring import BlockScores
from privmtl.federated.spec import RUN_METHODS
from privmtl.gain import GAIN_LEVEL, gain_interval
from privmtl.per_client import check_rows_path, pmtl_rows, read_rows, write_rows
from privmtl.privacy.ledger import check_saved_ledger
from privmtl.saved_files import verified_file
from privmtl.trust import followed_data_path, is_signed

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["NO_RELEASE_METHODS", "evaluate_saved"]

NO_RELEASE_METHODS = tuple(n for n in RUN_METHODS if not method_class(n).communicates)
"""The methods that train every client alone: nothing is released, there is no shared model."""


def evaluate_saved(
    models_dir: str | Path,
    *,
    data: str | None = None,
    data_path: str | Path | None = None,
    seed: int | None = None,
    client_column: str | None = None,
    label_column: str | None = None,
    feature_columns: Sequence[str] | None = None,
    scaling: str | None = None,
    model: str | None = None,
    trust_code: bool = False,
    per_client: str | Path | None = None,
) -> dict[str, Any]:
    """Reload models saved by ``run_pmtl(save_models=...)`` and score them on the test split.

    The data set defaults to the one the run used (its name, absolute path, columns, scaling and
    seed, recorded in ``model.json``); the same data and split give exactly the run's
    ``test_accuracy``. A folder this user's privmtl saved (signed, :mod:`privmtl.trust`) is
    followed as it is: its recorded data path, and a user's model rebuilt from the factory source
    recorded in ``model.json`` (:func:`~privmtl.federated.saved.build_model`), so neither the
    working directory nor ``PYTHONPATH`` matters. For a folder someone else wrote, a user's model
    needs ``model`` (the factory named again, checked against the recorded SHA-256) or
    ``trust_code``, and a recorded data path outside the folder needs ``data_path``.

    ``per_client`` (a ``.csv`` or ``.parquet`` file) receives one row per client
    (:mod:`privmtl.per_client`): its test accuracy as scored now, beside the model it kept and
    its local-only accuracy as the run recorded them in the folder's ``clients.csv`` (blank for a
    folder without one); the same data give the run's rows.
    """
    if per_client is not None:
        per_client = check_rows_path(per_client)
    meta = read_meta(models_dir)
    glob = load_global(models_dir, meta)
    where = str(Path(models_dir) / "model.json")
    saved = meta.get("data", {})
    sd = int(seed if seed is not None else saved.get("seed") or 0)
    # the model first: code this user did not allow is refused before any data is read
    net, notes = build_model(meta, seed=sd, where=where, trust_code=trust_code, factory=model)
    check_params(glob, net, where=where, key="files.global")
    has_pers = False
    for _ in iter_personalized(models_dir, meta, net=net, mmap=True):  # every file, mapped: cheap
        has_pers = True
    name, path, ds = _saved_data(
        models_dir, meta, where, sd, data, data_path,
        {"client_column": client_column, "label_column": label_column,
         "feature_columns": None if feature_columns is None else list(feature_columns)},
        scaling,
    )  # fmt: skip
    personalized = meta["primary"] == "personalized" and has_pers
    released = meta.get("method") not in NO_RELEASE_METHODS
    scores, correct = _score_saved(
        models_dir, meta, net, glob, ds, personalized=personalized, shared=has_pers or released
    )
    acc = scores["own"]
    guarantee = meta.get("guarantee")

    # a recorded path outside the folder is followed only for a folder this user signed (trust)
    record = meta.get("ledger") if is_signed(meta) else None
    checked = check_saved_ledger(record, guarantee, where=f"the saved models in {models_dir}")
    out = {
        "family": "pmtl",
        "method": meta.get("method"),
        "data": name,
        "data_path": None if path is None else str(path),
        "scaling": ds.scaling,
        "model": meta["model"]["name"],
        "models_dir": str(Path(models_dir).resolve()),
        "primary": meta["primary"],
        "test_accuracy": acc["accuracy"],
        "mean_client_accuracy": acc["mean_client_accuracy"],
        "n_test": acc["n"],
        "noise_source": meta.get("run", {}).get("noise_source"),
        "guarantee": guarantee,
        "covered": None if not isinstance(guarantee, dict) else guarantee.get("covered"),
        "summary": meta.get("summary"),
        "notes": notes,
        "ledger_checked": checked,
    }
    if "shared" in scores:
        shared = scores["shared"]
        out["global_test_accuracy"] = shared["accuracy"]
        if released:
            # the released global model on every client's own test data, averaged over clients
            out["global_mean_client_accuracy"] = shared["mean_client_accuracy"]
            out["shared_params"] = meta.get("config", {}).get("shared_params")
    run = meta.get("run", {})
    for key in ("clients_per_final_model", "end_of_run"):  # recorded at training
        if key in run:
            out[key] = run[key]
    rows = _saved_rows(models_dir, meta, ds, correct)
    out.update(_saved_baseline(rows))
    if per_client is not None:
        out["per_client_file"] = str(write_rows(per_client, rows))
    return out


def _saved_baseline(rows: pd.DataFrame) -> dict[str, Any]:
    """The baseline keys of a reloaded folder: its clients' local-only accuracies recorded at
    training (``clients.csv``) beside their models scored now; none without recorded ones."""
    local = rows["local_test_accuracy"].to_numpy(np.float64)
    has = np.isfinite(local)
    if not has.any():
        return {}
    n = rows["n_test"].to_numpy(np.float64)[has]
    final = rows["test_accuracy"].to_numpy(np.float64)[has] * n
    alone = np.round(local[has] * n)  # the correct predictions the recorded accuracy counts
    final = np.round(np.nan_to_num(final))
    gain, (low, high) = gain_interval(final, alone, n)
    total = float(n.sum())
    return {
        "local_test_accuracy": float(alone.sum() / total) if total else float("nan"),
        "gain_over_local": gain,
        "gain_interval": [low, high],
        "baseline_clients": int(has.sum()),
        "baseline": (
            "each client's local training alone as recorded at training (clients.csv), beside "
            f"its saved model scored now; gain_interval: {GAIN_LEVEL:.0%} normal interval over "
            "clients"
        ),
    }


def _saved_data(
    models_dir: str | Path,
    meta: dict[str, Any],
    where: str,
    sd: int,
    data: str | None,
    data_path: str | Path | None,
    given: dict[str, Any],
    scaling: str | None,
) -> tuple[Any, Path | None, FederatedDataset]:
    """The data a saved run is scored on: its recorded data set, path (followed as
    :func:`~privmtl.trust.followed_data_path` allows), columns and scaling, each replaced by the
    one given; checked to hold the saved models' clients, features and classes."""
    saved = meta.get("data", {})
    name = data if data is not None else saved.get("data")
    path = followed_data_path(
        saved.get("data_path"),
        data_path,
        folder=Path(models_dir),
        signed=is_signed(meta),
        where=where,
    )
    if (
        name == "synthetic"
        and saved.get("data") == "synthetic"
        and saved.get("stream") != SYNTHETIC_STREAM
    ):
        raise DataFormatError(
            f"{where}: the models were trained on synthetic data drawn by another random stream "
            f"(data.stream {saved.get('stream')!r}; this version's is {SYNTHETIC_STREAM!r}): the "
            "same seed now gives other examples, so the saved models cannot be scored on theirs."
        )
    table: dict[str, Any] = {k: v if v is not None else saved.get(k) for k, v in given.items()}
    scale = scaling if scaling is not None else saved.get("scaling", "none")
    if name == "table":
        table["scaling"] = scale
    ds = load_federated(
        str(name), data_path=path, seed=sd, **table, num_clients=saved.get("num_clients")
    )
    if list(ds.client_ids) != list(meta["client_ids"]):
        raise DataFormatError(
            f"The data has other clients than the saved models ({ds.n_clients} vs "
            f"{len(meta['client_ids'])}); pass the --data the run used."
        )
    if (ds.n_features, ds.n_classes) != (meta["model"]["n_features"], meta["model"]["n_classes"]):
        raise DataFormatError(
            f"The data has {ds.n_features} features and {ds.n_classes} classes; the saved models "
            f"{meta['model']['n_features']} and {meta['model']['n_classes']}."
        )
    return name, path, ds


def _saved_rows(
    models_dir: str | Path, meta: dict[str, Any], ds: FederatedDataset, correct: np.ndarray
) -> pd.DataFrame:
    """:func:`evaluate_saved`'s per-client rows: the accuracies scored now (``correct``), the
    kept models and local-only accuracies recorded in the folder's ``clients.csv``."""
    m = ds.n_clients
    kept: list[str] = [""] * m
    local = np.full(m, np.nan)
    path = verified_file(models_dir, meta, "clients")  # inside the folder, its SHA-256 checked
    if path is not None:
        recorded = read_rows(path)
        if list(recorded["client"]) != list(ds.client_ids):
            raise DataFormatError(
                f"{path} lists other clients than the data ({len(recorded)} rows, {m} clients)."
            )
        kept = [str(k) for k in recorded["kept"]]
        local = recorded["local_test_accuracy"].to_numpy(np.float64)
    sizes = {split: ds.sizes(split) for split in ("train", "val", "test")}
    return pmtl_rows(ds.client_ids, sizes, kept, correct, local)


def _score_saved(
    models_dir: str | Path,
    meta: dict[str, Any],
    net: torch.nn.Module,
    glob: Params,
    ds: FederatedDataset,
    *,
    personalized: bool,
    shared: bool,
) -> tuple[dict[str, dict[str, float]], np.ndarray]:
    """:func:`evaluate_saved`'s test scores, streamed: ``"own"`` (each client's own model: its
    personalized one when ``personalized``, else the global one) and, when ``shared``, ``"shared"``
    (the global model on every client). A block of clients at a time is read from the saved files
    (:func:`~privmtl.federated.saved.personalized_blocks`) and drawn from ``ds``
    (:meth:`~privmtl.data.federated.FederatedDataset.subset`), so one file of models and one
    block's test data are held at once; the sums equal scoring every client at once. Also
    every client's correct test predictions of its own model."""
    buffers = {n: b.detach() for n, b in net.named_buffers()}
    book = BlockScores(net, buffers, ("test",))
    if personalized:
        blocks: Any = personalized_blocks(models_dir, meta, net=net)
    else:
        blocks = ((pos, None) for pos in client_blocks(ds.n_clients))
    with torch.no_grad():
        for pos, own in blocks:
            piece = ds if len(pos) == ds.n_clients else ds.subset(pos.tolist())
            if own is not None:
                book.add("own", own, True, piece)
                if shared:
                    book.add("shared", glob, False, piece)
            else:
                book.add("own", glob, False, piece)
    scores = book.summary()["test"]
    if shared and not personalized:  # the global model is the clients' own: scored once
        scores["shared"] = scores["own"]
    return scores, book.per_client("test", "own")[0]
