"""Trained federated models as files a user can load without privmtl.

A models directory written by :func:`save_models` (``privmtl pmtl --save-models DIR``) holds

``global.pt``
    ``torch.save`` of a plain dict ``{parameter name: tensor}``: the released billboard
    :math:`\\tilde w^T` (for joint-model DP: the mean of the released blocks). It is a PyTorch
    ``state_dict`` of the model: ``model.load_state_dict(torch.load("global.pt"))``.
``personalized.pt`` (methods with personalized models)
    ``{parameter name: tensor of shape (m, *shape)}``: client ``k``'s model is
    ``{name: t[k] for name, t in torch.load("personalized.pt").items()}``, in the order of
    ``client_ids`` in ``model.json``.
``model.json``
    ``format`` (``"privmtl-models"``), ``version``, ``family`` (``"pmtl"``), ``method``, the model
    architecture (``model``: name, features, classes, input shape), ``client_ids``, the data the
    run used, its configuration, its full privacy guarantee (ε, δ, relation, sampling, accountant,
    noise source), the model the method is evaluated with (``primary``), whether the personalized
    models were fine-tuned, and the run's accuracies.

Files are written to temporary names and renamed (``model.json`` last), so a directory with a
``model.json`` is complete.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import torch

from privmtl.checkpoint import write_atomic
from privmtl.exceptions import DataFormatError

__all__ = ["MODELS_FORMAT", "MODELS_VERSION", "load_models", "save_models"]

MODELS_FORMAT = "privmtl-models"
MODELS_VERSION = 1

Params = dict[str, torch.Tensor]


def _tensors(params: Params) -> bytes:
    buf = io.BytesIO()
    torch.save({n: p.detach().clone().contiguous() for n, p in params.items()}, buf)
    return buf.getvalue()


def save_models(
    directory: str | os.PathLike[str],
    result: Any,
    summary: dict[str, Any],
    *,
    model: str,
    dataset: Any,
    data: dict[str, Any],
    personalized: Params | None = None,
) -> Path:
    """Write a run's models and metadata to ``directory`` (module docstring); returns it.

    ``result`` is the :class:`~privmtl.federated.config.TrainResult`, ``summary`` the run's JSON
    result (its guarantee, accuracies and settings are copied into ``model.json``);
    ``personalized`` replaces the result's personalized models (the fine-tuned ones).
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    files = {"global": "global.pt"}
    write_atomic(d / "global.pt", _tensors(result.global_params))
    pers = personalized if personalized is not None else result.personalized_params
    if pers is not None:
        write_atomic(d / "personalized.pt", _tensors(pers))
        files["personalized"] = "personalized.pt"
    keep = (
        "method", "epsilon", "delta", "accountant", "sampling", "relation", "noise_source",
        "noise_std", "noise_multiplier", "clip", "clients_per_round", "num_clients", "rounds",
        "rounds_run", "lam", "lr", "seed", "server_update", "stopped_on_budget", "test_accuracy",
        "mean_client_accuracy", "val_accuracy", "global_test_accuracy", "finetune",
    )  # fmt: skip
    meta = {
        "format": MODELS_FORMAT,
        "version": MODELS_VERSION,
        "family": "pmtl",
        "method": summary.get("method"),
        "model": {
            "name": model,
            "n_features": int(dataset.n_features),
            "n_classes": int(dataset.n_classes),
            "feature_shape": list(dataset.feature_shape),
        },
        "client_ids": list(result.client_ids),
        "data": {**data, "seed": summary.get("seed")},
        "primary": (
            "personalized"
            if pers is not None and (result.primary == "personalized" or personalized is not None)
            else "global"
        ),
        "finetuned": personalized is not None,
        "files": files,
        "config": result.config.to_dict(),
        "run": {k: summary[k] for k in keep if k in summary},
        "guarantee": summary.get("guarantee"),
        "summary": summary.get("summary"),
    }
    write_atomic(d / "model.json", (json.dumps(meta, indent=2, default=str) + "\n").encode())
    return d


def load_models(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], Params, Params | None]:
    """``(metadata, global parameters, stacked personalized parameters or None)``."""
    d = Path(directory)
    mpath = d / "model.json"
    if not mpath.is_file():
        raise DataFormatError(f"No saved models in {d} (no model.json).")
    try:
        meta = json.loads(mpath.read_text())
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"{mpath} is not valid JSON: {exc}.") from None
    if meta.get("format") != MODELS_FORMAT or meta.get("version") != MODELS_VERSION:
        raise DataFormatError(
            f"{mpath} is not a privmtl models file of version {MODELS_VERSION} "
            f"(format {meta.get('format')!r}, version {meta.get('version')!r})."
        )
    glob = torch.load(d / meta["files"]["global"], weights_only=True)
    pers = None
    if "personalized" in meta["files"]:
        pers = torch.load(d / meta["files"]["personalized"], weights_only=True)
    return meta, glob, pers
