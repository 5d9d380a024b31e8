"""A user's linear method from a file or a module: ``--method PATH.py:NAME`` / ``MODULE:NAME``.

Loaded as a user's federated method is (:func:`~privmtl.federated.user_model.load_factory`: the
working directory first, a file run as a fresh module), only when the user names it, then
registered under its ``name`` (:func:`~privmtl.linear.methods.register_linear_method`). The run
records where it came from and the file's SHA-256 (``method_source``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from privmtl.exceptions import InvalidParameterError
from privmtl.federated.methods.loading import load_method_code, method_record
from privmtl.linear.methods import LinearMethod, is_method_spec, linear_method

__all__ = ["load_linear_method", "resolve_linear_method"]


def load_linear_method(
    spec: str, *, cwd: str | Path | None = None
) -> tuple[type[LinearMethod], dict[str, Any]]:
    """Load and register the method ``spec`` names (``PATH.py:NAME`` or ``MODULE:NAME``).

    Returns the :class:`~privmtl.linear.methods.LinearMethod` subclass and its source record
    (``spec``, ``name``, ``class``, ``module``, ``path``, ``sha256``).

    Raises
    ------
    InvalidParameterError
        The spec cannot be loaded, or does not name a LinearMethod subclass (one line naming
        ``--method``).
    """
    user = load_method_code(spec, cwd=cwd)
    found: Any = user.factory
    if not (isinstance(found, type) and issubclass(found, LinearMethod)):
        raise InvalidParameterError(
            f"The 'method' parameter (--method) {spec!r}: {user.attr} must be a subclass of "
            f"privmtl.linear.methods.LinearMethod; got {found!r}."
        )
    cls = linear_method(found)  # registers it
    return cls, method_record(spec, cls, user)


def resolve_linear_method(
    method: str | type[LinearMethod],
) -> tuple[type[LinearMethod], dict[str, Any] | None]:
    """A run's ``method`` as its method object, and the source record of a loaded one.

    A name is looked up; ``PATH.py:NAME`` / ``MODULE:NAME`` is loaded (:func:`load_linear_method`);
    a LinearMethod subclass is registered.
    """
    if is_method_spec(method):
        return load_linear_method(str(method))
    return linear_method(method), None
