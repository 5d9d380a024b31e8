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
    architecture (``model``: name, features, classes, input shape; for a user's
    ``MODULE:FACTORY`` / ``PATH.py:FACTORY`` also ``model.factory``: the text of the factory's file
    and its SHA-256, see :func:`build_model`), ``client_ids``, the data the run used (name,
    absolute path, table columns and scaling, split seed), its configuration, its full privacy guarantee (ε, δ, relation, sampling, accountant,
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

__all__ = ["MODELS_FORMAT", "MODELS_VERSION", "build_model", "load_models", "save_models"]

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
    factory: dict[str, Any] | None = None,
) -> Path:
    """Write a run's models and metadata to ``directory`` (module docstring); returns it.

    ``result`` is the :class:`~privmtl.federated.config.TrainResult`, ``summary`` the run's JSON
    result (its guarantee, accuracies and settings are copied into ``model.json``);
    ``personalized`` replaces the result's personalized models (the fine-tuned ones);
    ``factory`` is a user model's :meth:`~privmtl.federated.user_model.UserFactory.record`.
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
        "mean_client_accuracy", "val_accuracy", "global_test_accuracy",
        "global_mean_client_accuracy", "finetune", "clients_per_final_model", "end_of_run",
        "config",  # the resolved run spec (privmtl.federated.spec): what re-runs the same settings
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
            **({"factory": factory} if factory is not None else {}),
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


def build_model(
    meta: dict[str, Any], *, seed: int = 0, where: str = "model.json"
) -> tuple[torch.nn.Module, list[str]]:
    """The architecture of saved models, ready for ``load_state_dict``; and notes on how.

    ``cnn`` and ``logreg`` are privmtl's models; a user's factory is rebuilt from the source
    recorded in ``meta["model"]["factory"]``
    (:func:`~privmtl.federated.user_model.factory_from_record`: refused if that source's SHA-256
    does not match), so it works from any working directory without ``PYTHONPATH``. The notes
    say when the factory's file on disk has changed since the run (the recorded source is used).

    Raises
    ------
    DataFormatError
        The recorded source was changed, or no source was recorded and the factory cannot be
        loaded.
    """
    from privmtl.federated.models import FemnistCNN, MultinomialLogReg
    from privmtl.federated.user_model import factory_from_record, is_factory_spec, load_factory

    spec = meta["model"]
    name, d, c = str(spec["name"]), int(spec["n_features"]), int(spec["n_classes"])
    notes: list[str] = []
    torch.manual_seed(seed)
    record = spec.get("factory")
    if isinstance(record, dict):
        user = factory_from_record(record, where=where)
        path = record.get("path")
        if record.get("source") is not None and path:
            p = Path(path)
            try:
                now = p.read_text(encoding="utf-8") if p.is_file() else None
            except (OSError, UnicodeDecodeError):
                now = None
            if now is not None and now != record["source"]:
                notes.append(
                    f"{path} changed since the run; the model was rebuilt from the source "
                    "recorded in model.json"
                )
        return user.build(d, c), notes
    if name == "cnn":
        return FemnistCNN(n_classes=c, random_state=seed), notes
    if name == "logreg":
        return MultinomialLogReg(d, c, random_state=seed), notes
    if is_factory_spec(name):  # saved before sources were recorded: load it as it is now
        notes.append(f"no factory source recorded: {name!r} was loaded as it is now")
        return load_factory(name).build(d, c), notes
    raise DataFormatError(f"{where}: unknown model {name!r}.")
