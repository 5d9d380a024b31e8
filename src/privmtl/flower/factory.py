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
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

from privmtl.exceptions import InvalidParameterError
from privmtl.federated.user_model import UserFactory, is_factory_spec, load_factory

__all__ = ["MODEL_DIR", "MODEL_SHA256", "announce", "check_shapes", "load_checked", "source_digest"]

MODEL_DIR = "model-dir"
"""Run-config (and node-config) key: the directory ``--model`` resolves against."""

MODEL_SHA256 = "model-sha256"
"""Run-config key: the SHA-256 of the factory's file every machine must load."""


def source_digest(user: UserFactory) -> str:
    """SHA-256 of the text of the file defining the factory ("" when it has no file).

    The recorded source's hash for a user's file; for a factory of an installed package (whose
    source :mod:`~privmtl.federated.user_model` does not record) the hash of its file as
    installed, so that two machines with different versions of that package are told apart too.
    """
    if user.sha256 is not None:
        return user.sha256
    if user.path is None:
        return ""
    try:
        text = Path(user.path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def announce(run_config: dict[str, Any], cwd: str | Path | None = None) -> dict[str, Any]:
    """``run_config`` with ``model-dir`` and ``model-sha256`` filled in for a factory model.

    Loads the factory here (``model-dir`` if given, else ``cwd``, else the working directory),
    so that a factory that cannot be loaded is refused before any process starts, and records its
    absolute directory and its file's SHA-256; a ``model-sha256`` already given is kept (the
    ServerApp and the nodes then check their own file against it). A built-in model: unchanged.

    Raises
    ------
    InvalidParameterError
        The factory cannot be loaded (one line naming ``--model``).
    """
    out = dict(run_config)
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
