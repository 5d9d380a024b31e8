"""Exceptions raised by privmtl.

Every user-facing error is a subclass of :class:`PrivmtlError`, so the CLI can turn it into a one-line
message and exit code 2 without hiding genuine bugs (which are not subclasses).
"""

from __future__ import annotations

__all__ = [
    "DataFormatError",
    "InvalidParameterError",
    "PrivacyBudgetError",
    "PrivmtlError",
    "PrivmtlWarning",
]


class PrivmtlError(Exception):
    """Base class of every error privmtl raises on purpose."""


class InvalidParameterError(PrivmtlError, ValueError):
    """A parameter has a value outside its documented constraint."""


class DataFormatError(PrivmtlError, ValueError):
    """Input data is missing, unreadable or malformed (NaN, wrong shape, unknown format...)."""


class PrivacyBudgetError(PrivmtlError, RuntimeError):
    """An operation would exceed, or cannot be accounted within, the privacy budget."""


class PrivmtlWarning(UserWarning):
    """A valid but risky setting (the CLI prints it as one ``privmtl: warning:`` line)."""
