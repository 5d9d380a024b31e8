"""A user's model factory on a Flower run: every machine loads its own copy, and it is the same code.

``--model MODULE:FACTORY`` or ``PATH.py:FACTORY`` (:mod:`privmtl.federated.user_model`) reaches
the Flower apps as three run-configuration keys:

``model``
    The spec as the user wrote it (``"mymodels:make_mlp"``, ``"./mymodels.py:make_mlp"``).
``model-dir``
    The directory the spec resolves against: the file of a relative path, and the module of
    ``MODULE:FACTORY`` (searched there first, then in the installed packages). ``privmtl flower
    local`` passes the absolute directory it ran in, since the ServerApp and the ClientApps run as
    other processes with other working directories. A SuperNode's node config ``model-dir``
    overrides it on that machine (the file sits elsewhere there); empty: the process's own
    working directory.
``model-sha256``
    The SHA-256 of the factory's file (its UTF-8 text) as the submitting machine loaded it
    (:func:`announce`).

No source code travels in a message: the ServerApp and every ClientApp import the factory from
their own file system (:func:`load_checked`) and refuse to run when that file's SHA-256 is not the
announced one, with one line naming both hashes. The ServerApp also builds the model itself and
checks that the nodes' initial parameters have its names and shapes (:func:`check_shapes`).

A user's method (``--method PATH.py:NAME`` / ``MODULE:NAME``,
:mod:`privmtl.federated.methods.loading`) reaches the apps the same way, under ``method``,
``method-dir`` (also a node config key) and ``method-sha256``: every machine loads its own copy of
the file and checks its hash (:func:`load_checked_method`); the method must declare the
``"flower"`` backend (:attr:`~privmtl.federated.methods.base.Method.backends`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

from privmtl.exceptions import InvalidParameterError
from privmtl.federated.methods import register_method
from privmtl.federated.methods.loading import load_method
from privmtl.federated.user_model import UserFactory, is_factory_spec, load_factory

__all__ = [
    "METHOD_DIR",
    "METHOD_SHA256",
    "MODEL_DIR",
    "MODEL_SHA256",
    "announce",
    "check_shapes",
    "checked_method",
    "load_checked",
    "load_checked_method",
    "source_digest",
]

MODEL_DIR = "model-dir"
"""Run-config (and node-config) key: the directory ``--model`` resolves against."""

MODEL_SHA256 = "model-sha256"
"""Run-config key: the SHA-256 of the factory's file every machine must load."""

METHOD_DIR = "method-dir"
"""Run-config (and node-config) key: the directory a user's ``--method`` resolves against."""

METHOD_SHA256 = "method-sha256"
"""Run-config key: the SHA-256 of the file of a user's method every machine must load."""

# the users' methods this process loaded and checked: (spec, announced SHA-256) -> source record
_CHECKED: dict[tuple[str, str], dict[str, Any]] = {}


def source_digest(user: UserFactory) -> str:
    """SHA-256 of the text of the file defining the factory ("" when it has no file).

    The recorded source's hash for a user's file; for a factory of an installed package (whose
    source :mod:`~privmtl.federated.user_model` does not record) the hash of its file as
    installed, so that two machines with different versions of that package are told apart too.
    """
    return _digest(user.sha256, user.path)


def _digest(sha256: str | None, path: str | None) -> str:
    if sha256 is not None:
        return sha256
    if path is None:
        return ""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def announce(run_config: dict[str, Any], cwd: str | Path | None = None) -> dict[str, Any]:
    """``run_config`` with ``model-dir`` and ``model-sha256`` filled in for a factory model (and
    ``method-dir`` and ``method-sha256`` for a user's method file, loaded and registered here).

    Loads the factory here (``model-dir`` if given, else ``cwd``, else the working directory),
    so that a factory that cannot be loaded is refused before any process starts, and records its
    absolute directory and its file's SHA-256; a ``model-sha256`` already given is kept (the
    ServerApp and the nodes then check their own file against it). A built-in model: unchanged.

    Raises
    ------
    InvalidParameterError
        The factory (or method) cannot be loaded (one line naming ``--model`` or ``--method``).
    """
    out = dict(run_config)
    method = str(out.get("method") or "")
    if is_factory_spec(method):  # a user's method: the same, under method-dir / method-sha256
        where = Path(str(out.get(METHOD_DIR) or cwd or Path.cwd())).absolute()
        _, record = load_method(method, cwd=where)
        out[METHOD_DIR] = str(where)
        if not out.get(METHOD_SHA256):
            out[METHOD_SHA256] = _digest(record["sha256"], record["path"])
        _CHECKED[(method, str(out[METHOD_SHA256]))] = record
    model = str(out.get("model") or "")
    if not is_factory_spec(model):
        return out
    where = Path(str(out.get(MODEL_DIR) or cwd or Path.cwd())).absolute()
    user = load_factory(model, cwd=where)
    out[MODEL_DIR] = str(where)
    if not out.get(MODEL_SHA256):
        out[MODEL_SHA256] = source_digest(user)
    return out


def load_checked(
    opts: dict[str, Any], who: str, model_dir: str | Path | None = None
) -> UserFactory | None:
    """Load the run's factory from this machine's file system and check it is the announced code.

    Parameters
    ----------
    opts : dict
        The run options (:func:`~privmtl.flower._core.run_options`).
    who : str
        This process, for the error (``"the ServerApp"``, ``"SuperNode partition 2"``).
    model_dir : path, optional
        This machine's directory of the factory (a node's ``model-dir`` node config); default the
        run configuration's ``model-dir``, else the working directory.

    Returns
    -------
    UserFactory or None
        None for a built-in model.

    Raises
    ------
    InvalidParameterError
        The factory does not load here, the run configuration announces no hash, or this
        machine's file has another SHA-256 than the announced one: one line naming both.
    """
    model = str(opts["model"])
    if not is_factory_spec(model):
        return None
    where = model_dir or opts.get(MODEL_DIR) or None
    user = load_factory(model, cwd=where)
    got, expected = source_digest(user), str(opts.get(MODEL_SHA256) or "")
    place = user.path or model
    if not expected:
        raise InvalidParameterError(
            f"The '{MODEL_SHA256}' run configuration must name the SHA-256 of the factory's file "
            f"of model={model!r} (every machine checks its own copy against it); {who} loaded "
            f"{place} with sha256 {got}."
        )
    if got != expected:
        raise InvalidParameterError(
            f"The 'model' parameter {model!r}: {who} loaded {place} with sha256 {got}, but the "
            f"run announces {MODEL_SHA256} {expected}; every machine must run the same factory "
            "code, refusing."
        )
    return user


def load_checked_method(
    opts: dict[str, Any], who: str, method_dir: str | Path | None = None
) -> str:
    """Load the run's own method from this machine's file system, check it is the announced code,
    and register it; return its name (a built-in name as it is).

    Parameters
    ----------
    opts : dict
        The run options (:func:`~privmtl.flower._core.run_options`): ``method`` (the spec),
        ``method-dir`` and ``method-sha256``.
    who : str
        This process, for the error (``"the ServerApp"``, ``"SuperNode partition 2"``).
    method_dir : path, optional
        This machine's directory of the method's file (a node's ``method-dir`` node config);
        default the run configuration's ``method-dir``, else the working directory.

    Raises
    ------
    InvalidParameterError
        The method does not load here, the run configuration announces no hash, or this
        machine's file has another SHA-256 than the announced one: one line naming both.
    """
    spec = str(opts["method"])
    if not is_factory_spec(spec):
        return spec
    where = method_dir or opts.get(METHOD_DIR) or None
    method, record = load_method(spec, cwd=where, register=False)  # registered once checked
    got, expected = _digest(record["sha256"], record["path"]), str(opts.get(METHOD_SHA256) or "")
    place = record["path"] or spec
    if not expected:
        raise InvalidParameterError(
            f"The '{METHOD_SHA256}' run configuration must name the SHA-256 of the file of "
            f"method={spec!r} (every machine checks its own copy against it); {who} loaded "
            f"{place} with sha256 {got}."
        )
    if got != expected:
        raise InvalidParameterError(
            f"The 'method' parameter {spec!r}: {who} loaded {place} with sha256 {got}, but the "
            f"run announces {METHOD_SHA256} {expected}; every machine must run the same method "
            "code, refusing."
        )
    register_method(method)
    _CHECKED[(spec, expected)] = record
    return str(record["name"])


def checked_method(opts: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """The run's method name and, for a user's method, its source record (``spec``, ``name``,
    ``class``, ``module``, ``path``, ``sha256``, as ``run_pmtl``'s ``method_source``).

    A method this process already loaded and checked (:func:`announce`,
    :func:`load_checked_method`) is not loaded again; otherwise it is loaded from the run
    configuration's ``method-dir`` and checked.
    """
    spec = str(opts["method"])
    if not is_factory_spec(spec):
        return spec, None
    key = (spec, str(opts.get(METHOD_SHA256) or ""))
    if key not in _CHECKED:
        load_checked_method(opts, "this process")
    record = _CHECKED[key]
    return str(record["name"]), record


def check_shapes(
    user: UserFactory, n_features: int, n_classes: int, init: dict[str, torch.Tensor]
) -> None:
    """Build the model here and check the nodes' initial parameters have its names and shapes.

    The build runs under a forked random state: the process's random streams are left alone.

    Raises
    ------
    InvalidParameterError
        The names or shapes differ (one line naming both).
    """
    with torch.random.fork_rng(devices=[]):
        net = user.build(n_features, n_classes)
    here = {n: tuple(p.shape) for n, p in net.named_parameters()}
    there = {n: tuple(p.shape) for n, p in init.items()}
    if here != there:
        raise InvalidParameterError(
            f"The 'model' parameter {user.spec!r}: the ServerApp's model has parameters {here}, "
            f"the nodes' {there}; every machine must build the same model."
        )
