"""Trained federated models as files a user can load without privmtl.

A models directory written by :func:`save_models` (``privmtl pmtl --save-models DIR``; ``privmtl
flower local --save-models DIR`` through :func:`privmtl.flower.saved.collect_models`) holds

``global.pt``
    ``torch.save`` of a plain dict ``{parameter name: tensor}``: the released billboard
    :math:`\\tilde w^T` (for joint-model DP: the mean of the released blocks). It is a PyTorch
    ``state_dict`` of the model: ``model.load_state_dict(torch.load("global.pt"))``.
``personalized.pt`` (methods with personalized models, at most :data:`MODEL_SHARD_CLIENTS` clients)
    ``{parameter name: tensor of shape (m, *shape)}``: client ``k``'s model is
    ``{name: t[k] for name, t in torch.load("personalized.pt").items()}``, in the order of
    ``client_ids`` in ``model.json`` (``files.personalized`` names it).
``personalized-00000.pt``, ``personalized-00001.pt``, ... (larger populations)
    The same stack cut into shards of at most :data:`MODEL_SHARD_CLIENTS` consecutive clients,
    so that no step of writing or reading holds every client's model. ``model.json`` lists them
    as ``files.personalized_shards`` = ``[{"file": ..., "start": k0, "stop": k1}, ...]`` in client
    order, contiguous from 0 to ``len(client_ids)`` (and has no ``files.personalized``); shard
    ``{"file": f, "start": k0, "stop": k1}`` holds ``{name: tensor of shape (k1 - k0, *shape)}``,
    so client ``k`` (``k0 <= k < k1``) has the model
    ``{name: t[k - k0] for name, t in torch.load(f).items()}``. :func:`iter_personalized`
    reads them one shard at a time, :func:`load_models` stacks them all.
``clients.csv`` (written by ``privmtl pmtl``)
    One row per client (:mod:`privmtl.per_client`): its sizes, the model it kept, its test
    accuracy, its local-only accuracy and the gain (``files.clients`` names it).
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

``files_sha256``
    (in ``model.json``) ``{file name: SHA-256}`` of every file ``files`` names, computed while
    the file is written. The signature covers these hashes, so a reader checks each file against
    its hash before using it (:func:`load_global`, :func:`iter_personalized`): a model file copied
    in from another run is refused, naming the file.

The files are written into a hidden staging folder inside the directory and moved into place
once all are written and ``model.json`` is signed (``model.json`` last,
:func:`privmtl.io.staged_folder`), so a directory with a ``model.json`` is complete and a save that
fails (the signing key, the disk) leaves no new file behind. Each file is written straight from
the tensors (one shard's copy at a time), never assembled in memory for the whole population.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privmtl.data.synthetic_federated import SYNTHETIC_STREAM
from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.federated.blocks import END_OF_RUN_BLOCK, client_blocks
from privmtl.federated.client_models import ClientModels
from privmtl.federated.models import MODELS, FemnistCNN, MultinomialLogReg
from privmtl.federated.scoring import block_rows
from privmtl.federated.spec import SPEC
from privmtl.federated.user_model import factory_from_record, is_factory_spec, load_factory
from privmtl.io import StagedFolder, read_json, staged_folder
from privmtl.per_client import CLIENTS_FILE, encode_rows
from privmtl.saved_files import check_file_digest, recorded_digest
from privmtl.trust import check_signing_key, folder_file, is_signed, sign, untrusted_code

__all__ = [
    "MODELS_FORMAT",
    "MODELS_VERSION",
    "MODEL_SHARD_CLIENTS",
    "build_model",
    "check_meta",
    "check_params",
    "iter_personalized",
    "load_global",
    "load_models",
    "personalized_blocks",
    "read_meta",
    "save_models",
]

MODELS_FORMAT = "privmtl-models"
MODELS_VERSION = 2
"""Version 2 lists the SHA-256 of every file in ``files_sha256`` (version 1 had none)."""

MODEL_SHARD_CLIENTS = 16_384
"""Most clients whose personalized models one saved file holds (a logistic regression on the
synthetic data, 610 parameters: 40 MB a shard); a population this size or smaller is saved as the
single ``personalized.pt``."""

_SHARDS_KEY = "files.personalized_shards"

Params = dict[str, torch.Tensor]


def _write_tensors(
    staged: StagedFolder, name: str, params: Params, start: int = 0, stop: int | None = None
) -> str:
    """``torch.save`` of ``params`` (rows ``start:stop`` of each, when ``stop`` is given) straight
    into the staged file ``name``; its SHA-256. Each tensor is copied first, so that the file
    holds its values alone (``torch.save`` of a view writes the whole storage under it)."""
    if isinstance(params, ClientModels):  # read by rows: never every client's model at once
        rows = params.rows(np.arange(start, params.m if stop is None else stop))
        return staged.write(name, lambda fh: torch.save(rows, fh))
    rows = {
        n: (p if stop is None else p[start:stop]).detach().clone().contiguous()
        for n, p in params.items()
    }
    return staged.write(name, lambda fh: torch.save(rows, fh))


def _shard_name(i: int) -> str:
    return f"personalized-{i:05d}.pt"


def _save_personalized(
    staged: StagedFolder, pers: Params, m: int, hashes: dict[str, str]
) -> dict[str, Any]:
    """Write the stacked personalized models (module docstring's layout); their ``files`` keys.
    Each file's SHA-256 goes into ``hashes``."""
    if m <= MODEL_SHARD_CLIENTS:
        hashes["personalized.pt"] = _write_tensors(staged, "personalized.pt", pers)
        return {"personalized": "personalized.pt"}
    shards = []
    for i, start in enumerate(range(0, m, MODEL_SHARD_CLIENTS)):
        stop = min(start + MODEL_SHARD_CLIENTS, m)
        hashes[_shard_name(i)] = _write_tensors(staged, _shard_name(i), pers, start, stop)
        shards.append({"file": _shard_name(i), "start": start, "stop": stop})
    return {"personalized_shards": shards}


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
    clients: Any = None,
) -> Path:
    """Write a run's models and metadata to ``directory`` (module docstring); returns it.

    ``result`` is the :class:`~privmtl.federated.config.TrainResult`, ``summary`` the run's JSON
    result (its guarantee, accuracies and settings are copied into ``model.json``);
    ``personalized`` replaces the result's personalized models (the fine-tuned ones);
    ``factory`` is a user model's :meth:`~privmtl.federated.user_model.UserFactory.record`;
    ``clients`` the per-client rows (:mod:`privmtl.per_client`), written as ``clients.csv``.
    """
    check_signing_key()  # a key that cannot sign stops the save before any file is written
    d = Path(directory)
    with staged_folder(d) as staged:
        meta = _save_files(staged, result, summary, model=model, dataset=dataset, data=data,
                           personalized=personalized, factory=factory, clients=clients)  # fmt: skip
        text = json.dumps(sign(meta), indent=2) + "\n"  # signed: this user's models reload anywhere
        staged.commit("model.json", text.encode())
    _remove_stale(d, meta["files"])
    return d


def _save_files(
    staged: StagedFolder,
    result: Any,
    summary: dict[str, Any],
    *,
    model: str,
    dataset: Any,
    data: dict[str, Any],
    personalized: Params | None,
    factory: dict[str, Any] | None,
    clients: Any = None,
) -> dict[str, Any]:
    """Write the model files into ``staged``; the ``model.json`` document that lists them."""
    files: dict[str, Any] = {"global": "global.pt"}
    hashes = {"global.pt": _write_tensors(staged, "global.pt", result.global_params)}
    pers = personalized if personalized is not None else result.personalized_params
    if pers is not None:
        files.update(_save_personalized(staged, pers, len(result.client_ids), hashes))
    if clients is not None:
        # the rows' module loads pandas: only a run that writes per-client rows pays for it

        rows = encode_rows(clients, CLIENTS_FILE)
        hashes[CLIENTS_FILE] = staged.write(CLIENTS_FILE, lambda fh: fh.write(rows))
        files["clients"] = CLIENTS_FILE
    keep = (
        "method", "epsilon", "delta", "accountant", "sampling", "relation", "noise_source",
        "noise_std", "noise_multiplier", "clip", "clients_per_round", "num_clients", "rounds",
        "rounds_run", "lam", "lr", "seed", "server_update", "stopped_on_budget", "test_accuracy",
        "mean_client_accuracy", "val_accuracy", "global_test_accuracy",
        "global_mean_client_accuracy", "finetune", "clients_per_final_model", "end_of_run",
        "method_source",  # a user's method: its file's SHA-256 (a --config rerun loads it again)
        "epsilon_per_round", "val_accuracy_per_round", "local_test_accuracy", "gain_over_local",
        "gain_interval", "baseline_clients",
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
        "data": {
            **data,
            "seed": summary.get("seed"),
            # the synthetic examples are the seed's through this stream: a reader of another
            # version, whose stream draws other examples, refuses to score on them
            **({"stream": SYNTHETIC_STREAM} if data.get("data") == "synthetic" else {}),
        },
        "primary": (
            "personalized"
            if pers is not None and (result.primary == "personalized" or personalized is not None)
            else "global"
        ),
        "finetuned": personalized is not None,
        "files": files,
        "files_sha256": hashes,
        "config": result.config.to_dict(),
        "run": {k: summary[k] for k in keep if k in summary},
        "guarantee": summary.get("guarantee"),
        "summary": summary.get("summary"),
    }
    ledger = getattr(result, "ledger", None)
    if ledger is not None and ledger.path is not None:  # privmtl evaluate checks it
        meta["ledger"] = {"path": str(Path(ledger.path).resolve()), **ledger.seen()}
    return meta


def _remove_stale(d: Path, files: dict[str, Any]) -> None:
    """Remove personalized-model files of an earlier layout in a folder written again
    (``--overwrite``), which ``model.json`` no longer lists."""
    kept = {files.get("personalized")} | {s["file"] for s in files.get("personalized_shards", [])}
    for old in d.glob("personalized*.pt"):
        if old.name not in kept and re.fullmatch(r"personalized(-\d{5,})?\.pt", old.name):
            old.unlink(missing_ok=True)


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


def _load_params(path: Path, where: str, key: str, digest: str, *, mmap: bool = False) -> Params:
    """A dict of tensors saved by :func:`save_models`, loaded without unpickling any object,
    after its SHA-256 is checked against ``digest`` (the one ``model.json`` records)."""
    if not path.is_file():
        raise DataFormatError(f"{where}: {key} names {path.name!r}, which is not in {path.parent}.")
    check_file_digest(path, digest, where, key)
    try:
        params = torch.load(path, weights_only=True, mmap=mmap)
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


def read_meta(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The folder's ``model.json``, checked (:func:`check_meta`, and the layout of its ``files``:
    ``global``, and ``personalized`` or ``personalized_shards``, see the module docstring).

    Raises
    ------
    DataFormatError
        No ``model.json``, not JSON, a key missing or of the wrong type, an unknown ``files`` key,
        or shards that are not contiguous ranges covering ``client_ids`` in order (one line
        naming the key).
    """
    d = Path(directory)
    mpath = d / "model.json"
    if not mpath.is_file():
        raise DataFormatError(f"No saved models in {d} (no model.json).")
    meta = read_json(mpath)
    where = str(mpath)
    check_meta(meta, where)
    files = meta["files"]
    allowed = ("global", "personalized", "personalized_shards", "clients")
    unknown = sorted(set(files) - set(allowed))
    if unknown:
        raise _malformed(
            where, f"files.{unknown[0]}", f"absent (files: {', '.join(allowed)})", files[unknown[0]]
        )
    if "personalized" in files and "personalized_shards" in files:
        raise _malformed(
            where, _SHARDS_KEY, "absent when files.personalized is given (one layout)",
            files["personalized_shards"],
        )  # fmt: skip
    if "personalized_shards" in files:
        _check_shards(files["personalized_shards"], len(meta["client_ids"]), where)
    for key, name in _named_files(files):
        folder_file(d, name, where=where, key=key)
    _check_hashes(meta, where)
    return meta


def _named_files(files: dict[str, Any]) -> list[tuple[str, Any]]:
    """``(key, file name)`` of every file a checked ``files`` object names."""
    named = [("files.global", files["global"])]
    if "personalized" in files:
        named.append(("files.personalized", files["personalized"]))
    for i, shard in enumerate(files.get("personalized_shards", [])):
        named.append((f"{_SHARDS_KEY}[{i}].file", shard["file"]))
    if "clients" in files:
        named.append(("files.clients", files["clients"]))
    return named


def _check_hashes(meta: dict[str, Any], where: str) -> None:
    """Refuse a ``files_sha256`` that is not an object holding a SHA-256 (64 lowercase hex
    digits) of every file ``files`` names (the signature covers them through it)."""
    hashes = meta.get("files_sha256")
    if not isinstance(hashes, dict):
        raise _malformed(where, "files_sha256", "an object {file: sha256}", hashes)
    for key, name in _named_files(meta["files"]):
        recorded_digest(meta, name, where, key)


def _check_shards(shards: Any, m: int, where: str) -> None:
    """Refuse a shard list that is not contiguous ranges covering clients 0 to ``m`` in order."""
    if not isinstance(shards, list) or not shards:
        raise _malformed(where, _SHARDS_KEY, "a non-empty list of shards", shards)
    expected = 0
    for i, shard in enumerate(shards):
        key = f"{_SHARDS_KEY}[{i}]"
        if expected == m:
            raise _malformed(
                where, key, f"absent (the shards before it cover the {m} clients)", shard
            )
        if not isinstance(shard, dict) or set(shard) != {"file", "start", "stop"}:
            raise _malformed(where, key, "an object with keys file, start, stop", shard)
        start, stop = shard["start"], shard["stop"]
        if not _is_int(start) or start != expected:
            what = "0 (the first client)" if i == 0 else f"{expected} (the previous shard's stop)"
            raise _malformed(where, f"{key}.start", what, start)
        if not _is_int(stop) or not start < stop <= m:
            raise _malformed(
                where, f"{key}.stop", f"an integer in ({start}, {m}] (the clients: {m})", stop
            )
        expected = stop
    if expected != m:
        raise DataFormatError(
            f"{where}: {_SHARDS_KEY} must cover the {m} clients of client_ids; its shards stop at "
            f"{expected}."
        )


def load_global(directory: str | os.PathLike[str], meta: dict[str, Any]) -> Params:
    """The released global model of a folder whose ``model.json`` is ``meta`` (:func:`read_meta`)."""
    d = Path(directory)
    where = str(d / "model.json")
    key, name = "files.global", meta["files"]["global"]
    path = folder_file(d, name, where=where, key=key)
    return _load_params(path, where, key, recorded_digest(meta, name, where, key))


def iter_personalized(
    directory: str | os.PathLike[str],
    meta: dict[str, Any],
    *,
    net: torch.nn.Module | None = None,
    mmap: bool = False,
) -> Iterator[tuple[int, int, Params]]:
    """The personalized models of a folder, one file at a time: ``(start, stop, params)``, where
    ``params`` stacks the models of clients ``start`` to ``stop - 1`` (positions in ``client_ids``).

    A single ``personalized.pt`` is one item ``(0, m, params)``. ``meta`` is the folder's checked
    ``model.json`` (:func:`read_meta`); nothing is yielded without personalized models. Each file
    must lie inside the folder (:func:`~privmtl.trust.folder_file`), load with
    ``torch.load(weights_only=True)`` and hold, for every parameter, ``stop - start`` rows of one
    shape: ``net``'s parameters when given (:func:`check_params`), else the first file's. ``mmap``
    maps the files instead of reading them (``torch.load(mmap=True)``): checking every file's
    names and shapes then costs almost no memory or time.

    Raises
    ------
    DataFormatError
        A missing or foreign file, or tensors of other names or shapes (one line naming the key).
    """
    d = Path(directory)
    where = str(d / "model.json")
    files = meta["files"]
    m = len(meta["client_ids"])
    if "personalized" in files:
        items = [("files.personalized", files["personalized"], 0, m)]
    else:
        items = [
            (f"{_SHARDS_KEY}[{i}].file", s["file"], s["start"], s["stop"])
            for i, s in enumerate(files.get("personalized_shards", []))
        ]
    first: dict[str, tuple[int, ...]] | None = None
    for key, name, start, stop in items:
        path = folder_file(d, name, where=where, key=key)
        params = _load_params(path, where, key, recorded_digest(meta, name, where, key), mmap=mmap)
        if net is not None:
            check_params(params, net, where=where, key=key, clients=stop - start)
        else:
            first = _check_rows(params, first, where=where, key=key, clients=stop - start)
        yield start, stop, params


def personalized_blocks(
    directory: str | os.PathLike[str],
    meta: dict[str, Any],
    *,
    net: torch.nn.Module | None = None,
    block: int = END_OF_RUN_BLOCK,
) -> Iterator[tuple[np.ndarray, Params]]:
    """:func:`iter_personalized` in blocks of at most ``block`` clients (a block never spans two
    files): ``(positions in client_ids, their stacked models)``. One file is held at a time,
    mapped from disk (``mmap``), and one block's models are copied out of it."""
    for start, stop, params in iter_personalized(directory, meta, net=net, mmap=True):
        for pos in client_blocks(stop - start, block):
            yield start + pos, block_rows(params, pos)


def _check_rows(
    params: Params, first: dict[str, tuple[int, ...]] | None, *, where: str, key: str, clients: int
) -> dict[str, tuple[int, ...]]:
    """Refuse a file of stacked models without ``clients`` rows, or of other names or per-client
    shapes than ``first``; returns the per-client shapes."""
    shapes = {n: tuple(p.shape[1:]) for n, p in params.items()}
    for n, p in params.items():
        if p.dim() == 0 or p.shape[0] != clients:
            raise DataFormatError(
                f"{where}: {key} parameter {n!r} has shape {tuple(p.shape)}; the shard holds "
                f"{clients} clients."
            )
    if first is not None and shapes != first:
        raise DataFormatError(
            f"{where}: {key} holds other parameters or shapes than the first file of "
            "personalized models."
        )
    return shapes


def load_models(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], Params, Params | None]:
    """``(metadata, global parameters, stacked personalized parameters or None)``.

    ``model.json`` is checked (:func:`read_meta`), its ``files`` must name files inside the
    directory (:func:`~privmtl.trust.folder_file`) and the tensors load with
    ``torch.load(weights_only=True)``: a malformed or foreign folder is refused in one line.
    Shards (module docstring) are stacked into one tensor per parameter: every client's model in
    memory at once; :func:`iter_personalized` reads them one at a time.
    """
    meta = read_meta(directory)
    glob = load_global(directory, meta)
    parts = list(iter_personalized(directory, meta))
    pers: Params | None = None
    if len(parts) == 1:
        pers = parts[0][2]
    elif parts:
        pers = {n: torch.cat([p[n] for _, _, p in parts]) for n in parts[0][2]}
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

    ``cnn`` and ``logreg`` (:data:`~privmtl.federated.models.MODELS`, a fixed list) are
    privmtl's models, rebuilt from the data alone: the only models a folder this user did not sign
    may name. Any other model is code (a user's factory, or a module of the Python installation),
    and is built only in one of three ways:

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
    installation only, never from the working directory, and only in these three ways: importing
    a module runs it. Otherwise nothing is imported: the refusal of
    :func:`~privmtl.trust.untrusted_code`, before any code runs. A model name that is itself a
    factory spec with no recorded source (older folders) is loaded only with ``factory`` or
    ``trust_code``. The notes say when the factory's file on disk has changed since the run
    (signed folders).

    Raises
    ------
    DataFormatError
        Code this user did not sign and did not allow, a recorded source that was changed, a
        named factory whose source differs from the recorded one.
    """
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
        signed = is_signed(meta)
        if not (signed or trust_code):  # nothing is imported from a file nobody vouched for
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
    raise DataFormatError(f"{where}: unknown model {name!r} (privmtl's: {', '.join(MODELS)}).")
