"""Your own method from a file or a module: ``--method PATH.py:NAME`` / ``MODULE:NAME``.

Loaded as a user's model factory is (:func:`~privmtl.federated.user_model.load_factory`: the
working directory first, a file run as a fresh module), then registered under its ``name``
(:func:`~privmtl.federated.methods.register_method`). The run records where it came from and
the file's SHA-256 (``method_source``), as it does for a user's model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from privmtl.exceptions import InvalidParameterError
from privmtl.federated.methods import register_method
from privmtl.federated.methods.base import Method
from privmtl.federated.user_model import UserFactory, is_factory_spec, load_factory

__all__ = ["load_method", "load_method_code", "method_record", "resolve_method"]


def load_method_code(spec: str, *, cwd: str | Path | None = None) -> UserFactory:
    """The code ``spec`` names (``PATH.py:NAME`` or ``MODULE:NAME``), loaded as a user's model
    factory is (:func:`~privmtl.federated.user_model.load_factory`), its errors naming
    ``--method``; a method of either family."""
    try:
        return load_factory(spec, cwd=cwd)
    except InvalidParameterError as exc:
        raise InvalidParameterError(
            str(exc)
            .replace("The 'model' parameter (--model)", "The 'method' parameter (--method)")
            .replace("FACTORY", "NAME")
        ) from None


def method_record(spec: str, cls: type, user: UserFactory) -> dict[str, Any]:
    """Where a loaded method came from (a result's ``method_source``): its spec, its name and
    class, its module, its file and the file's SHA-256."""
    return {
        "spec": spec,
        "name": getattr(cls, "name", None),
        "class": cls.__qualname__,
        "module": user.module,
        "path": user.path,
        "sha256": user.sha256,
    }


def load_method(
    spec: str, *, cwd: str | Path | None = None, register: bool = True
) -> tuple[type[Method] | Method, dict[str, Any]]:
    """Load and register the method ``spec`` names (``PATH.py:NAME`` or ``MODULE:NAME``).

    ``cwd`` is the directory searched first and relative paths resolve against (default: the
    working directory; a Flower machine's ``method-dir``, :mod:`privmtl.flower.factory`).
    ``register=False`` only loads it (the caller registers it once it checked the file).

    Returns the method (a :class:`~privmtl.federated.methods.base.Method` subclass or
    instance) and its source record (``spec``, ``name``, ``module``, ``path``, ``sha256``).

    Raises
    ------
    InvalidParameterError
        The spec cannot be loaded, or does not name a Method subclass or instance (one line
        naming ``--method``).
    """
    user = load_method_code(spec, cwd=cwd)
    found: Any = user.factory
    is_class = isinstance(found, type) and issubclass(found, Method)
    if not is_class and not isinstance(found, Method):
        raise InvalidParameterError(
            f"The 'method' parameter (--method) {spec!r}: {user.attr} must be a subclass of "
            f"privmtl.federated.methods.Method or an instance of one; got {found!r}."
        )
    method: type[Method] | Method = found
    cls: type[Method] = register_method(method) if register else found if is_class else type(found)
    return method, method_record(spec, cls, user)


def resolve_method(
    method: str | type[Method] | Method,
) -> tuple[str | type[Method] | Method, dict[str, Any] | None]:
    """A run's ``method`` as a name or a registered method object, and its source record.

    A name is returned as it is; ``PATH.py:NAME`` / ``MODULE:NAME`` is loaded
    (:func:`load_method`); a Method subclass or instance is registered.
    """
    if isinstance(method, str):
        if is_factory_spec(method):
            return load_method(method)
        return method, None
    register_method(method)
    return method, None
