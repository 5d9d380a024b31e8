"""Trained federated models as files a user can load without privmtl.

A models directory written by :func:`save_models` (``privmtl pmtl --save-models DIR``; ``privmtl
flower local --save-models DIR`` through :func:`privmtl.flower.saved.collect_models`) holds

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
    models were fine-tuned, and the run's accuracies; ``signature``: this user's HMAC of the rest
    (:func:`privmtl.trust.sign`), which lets the folder's code and data path be followed as
    recorded (:func:`build_model`).

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
from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.federated.spec import SPEC
from privmtl.trust import folder_file, is_signed, sign, untrusted_code

__all__ = [
    "MODELS_FORMAT",
    "MODELS_VERSION",
    "build_model",
    "check_meta",
    "check_params",
    "load_models",
    "save_models",
]

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
    ledger = getattr(result, "ledger", None)
    if ledger is not None and ledger.path is not None:  # privmtl evaluate checks it
        meta["ledger"] = {"path": str(Path(ledger.path).resolve()), **ledger.seen()}
    text = json.dumps(sign(meta), indent=2) + "\n"  # signed: this user's models reload anywhere
    write_atomic(d / "model.json", text.encode())
    return d


def _malformed(where: str, key: str, expected: str, value: Any) -> DataFormatError:
    return DataFormatError(f"{where}: {key} must be {expected}; got {value!r}.")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_meta(meta: Any, where: str) -> dict[str, Any]:
    """``meta`` (a parsed ``model.json`` of PMTL models) with the types evaluation relies on.

    Raises
    ------
    DataFormatError
        Not a privmtl models file of this version and family, or a key missing or of the wrong
        type (one line naming the key, the expected type and the value).
    """
    if not isinstance(meta, dict):
        raise _malformed(where, "the document", "a JSON object", type(meta).__name__)
    if meta.get("format") != MODELS_FORMAT or meta.get("version") != MODELS_VERSION:
        raise DataFormatError(
            f"{where} is not a privmtl models file of version {MODELS_VERSION} "
            f"(format {meta.get('format')!r}, version {meta.get('version')!r})."
        )
    if meta.get("family") != "pmtl":
        raise _malformed(where, "family", "'pmtl'", meta.get("family"))
    model = meta.get("model")
    if not isinstance(model, dict):
        raise _malformed(where, "model", "an object", model)
    if not isinstance(model.get("name"), str):
        raise _malformed(where, "model.name", "a string", model.get("name"))
    for key in ("n_features", "n_classes"):
        if not _is_int(model.get(key)) or model[key] < 1:
            raise _malformed(where, f"model.{key}", "an integer >= 1", model.get(key))
    record = model.get("factory")
    if record is not None:
        if not isinstance(record, dict):
            raise _malformed(where, "model.factory", "an object", record)
        for key in ("spec", "factory"):
            if not isinstance(record.get(key), str):
                raise _malformed(where, f"model.factory.{key}", "a string", record.get(key))
        for key in ("module", "path", "source", "sha256"):
            if record.get(key) is not None and not isinstance(record[key], str):
                raise _malformed(where, f"model.factory.{key}", "a string or null", record[key])
    ids = meta.get("client_ids")
    if not isinstance(ids, list):
        raise _malformed(where, "client_ids", "a list", ids)
    files = meta.get("files")
    if not isinstance(files, dict) or "global" not in files:
        raise _malformed(where, "files", "an object with 'global'", files)
    if meta.get("primary") not in ("global", "personalized"):
        raise _malformed(where, "primary", "'global' or 'personalized'", meta.get("primary"))
    for key in ("data", "run"):
        if not isinstance(meta.get(key, {}), dict):
            raise _malformed(where, key, "an object", meta.get(key))
    data = meta.get("data", {})
    if data.get("seed") is not None and not _is_int(data["seed"]):
        raise _malformed(where, "data.seed", "an integer or null", data["seed"])
    if data.get("data_path") is not None and not isinstance(data["data_path"], str):
        raise _malformed(where, "data.data_path", "a string or null", data["data_path"])
    return meta


def _load_params(path: Path, where: str, key: str) -> Params:
    """A dict of tensors saved by :func:`save_models`, loaded without unpickling any object."""
    try:
        params = torch.load(path, weights_only=True)
    except Exception as exc:  # not a torch file, or a pickle of objects other than tensors
        raise DataFormatError(
            f"{path} ({where} {key}) is not a file of tensors that loads with "
            f"weights_only=True ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})."
        ) from None
    if not isinstance(params, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in params.items()
    ):
        raise DataFormatError(f"{path} ({where} {key}) is not a dict of named tensors.")
    return params


def load_models(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], Params, Params | None]:
    """``(metadata, global parameters, stacked personalized parameters or None)``.

    ``model.json`` is checked (:func:`check_meta`), its ``files`` must name files inside the
    directory (:func:`~privmtl.trust.folder_file`) and the tensors load with
    ``torch.load(weights_only=True)``: a malformed or foreign folder is refused in one line.
    """
    d = Path(directory)
    mpath = d / "model.json"
    if not mpath.is_file():
        raise DataFormatError(f"No saved models in {d} (no model.json).")
    try:
        meta = json.loads(mpath.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataFormatError(f"{mpath} is not valid JSON: {exc}.") from None
    where = str(mpath)
    check_meta(meta, where)
    files = meta["files"]
    unknown = sorted(set(files) - {"global", "personalized"})
    if unknown:
        raise _malformed(
            where, f"files.{unknown[0]}", "absent (files: global, personalized)", files[unknown[0]]
        )
    glob = _load_params(
        folder_file(d, files["global"], where=where, key="files.global"), where, "files.global"
    )
    pers = None
    if "personalized" in files:
        path = folder_file(d, files["personalized"], where=where, key="files.personalized")
        pers = _load_params(path, where, "files.personalized")
    return meta, glob, pers


def check_params(
    params: Params, net: torch.nn.Module, *, where: str, key: str, clients: int | None = None
) -> None:
    """Refuse saved tensors that are not ``net``'s parameters (``clients``: stacked per client).

    Raises
    ------
    DataFormatError
        Other parameter names, or a tensor of another shape (one line naming the first).
    """
    expected = {n: tuple(p.shape) for n, p in net.named_parameters()}
    if set(params) != set(expected):
        missing = sorted(set(expected) ^ set(params))
        raise DataFormatError(
            f"{where}: {key} holds other parameters than the model (first difference: "
            f"{missing[0]!r})."
        )
    for n, shape in expected.items():
        want = shape if clients is None else (clients, *shape)
        if tuple(params[n].shape) != want:
            raise DataFormatError(
                f"{where}: {key} parameter {n!r} has shape {tuple(params[n].shape)}; the model "
                f"needs {want}."
            )


def build_model(
    meta: dict[str, Any],
    *,
    seed: int = SPEC.seed,
    where: str = "model.json",
    trust_code: bool = False,
    factory: str | None = None,
) -> tuple[torch.nn.Module, list[str]]:
    """The architecture of saved models, ready for ``load_state_dict``; and notes on how.

    ``cnn`` and ``logreg`` are privmtl's models, rebuilt from the data alone. A user's factory
    is rebuilt by running code only in one of three ways:

    ``factory`` (``--model SPEC``)
        The user names the factory again (``MODULE:FACTORY`` or ``PATH.py:FACTORY``, loaded as
        :func:`~privmtl.federated.user_model.load_factory` does); refused if its file's SHA-256
        differs from the recorded one.
    a signed ``meta``
        ``meta`` carries this user's signature (:func:`~privmtl.trust.is_signed`: privmtl wrote
        it for this user): the source recorded in ``meta["model"]["factory"]`` is run
        (:func:`~privmtl.federated.user_model.factory_from_record`: refused if that source's
        SHA-256 does not match), from any working directory without ``PYTHONPATH``.
    ``trust_code`` (``--trust-code``)
        The recorded source is run although nobody signed it (its SHA-256 still checked).

    A recorded installed module (``module`` without source) is imported from the Python
    installation only, never from the working directory. Otherwise nothing runs: the refusal of
    :func:`~privmtl.trust.untrusted_code`. A model name that is itself a factory spec with no
    recorded source (older folders) is loaded only with ``factory`` or ``trust_code``. The notes
    say when the factory's file on disk has changed since the run (signed folders).

    Raises
    ------
    DataFormatError
        Code this user did not sign and did not allow, a recorded source that was changed, a
        named factory whose source differs from the recorded one.
    """
    from privmtl.federated.models import FemnistCNN, MultinomialLogReg
    from privmtl.federated.user_model import factory_from_record, is_factory_spec, load_factory

    spec = meta["model"]
    name, d, c = str(spec["name"]), int(spec["n_features"]), int(spec["n_classes"])
    notes: list[str] = []
    torch.manual_seed(seed)
    record = spec.get("factory")
    if factory is not None:
        if not isinstance(record, dict) and not is_factory_spec(name):
            raise InvalidParameterError(
                f"The 'model' parameter (--model) {factory!r}: {where} holds privmtl's model "
                f"{name!r}, not a user's factory; leave --model out."
            )
        user = load_factory(factory)
        recorded = record.get("sha256") if isinstance(record, dict) else None
        if recorded is not None and user.sha256 != recorded:
            now = user.sha256 or "none"
            raise InvalidParameterError(
                f"The 'model' parameter (--model) {factory!r}: its source (sha256 {now[:12]}...) "
                f"differs from the one the models in {where} were trained with ({recorded[:12]}...)."
            )
        return user.build(d, c), notes
    if isinstance(record, dict):
        installed = record.get("source") is None and bool(record.get("module"))
        signed = is_signed(meta)
        if not (installed or signed or trust_code):
            raise untrusted_code(where, name)
        user = factory_from_record(record, where=where)
        path = record.get("path")
        if signed and record.get("source") is not None and path:
            p = Path(path)
            try:
                current = p.read_text(encoding="utf-8") if p.is_file() else None
            except (OSError, UnicodeDecodeError):
                current = None
            if current is not None and current != record["source"]:
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
        if not trust_code:
            raise untrusted_code(where, name)
        notes.append(f"no factory source recorded: {name!r} was loaded as it is now")
        return load_factory(name).build(d, c), notes
    raise DataFormatError(f"{where}: unknown model {name!r}.")
