"""Parameter checks with scikit-learn style messages.

Each check names the parameter, the constraint and the value received, e.g.
``The 'epsilon' parameter must be a float in (0, inf); got -1.0.``
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

import numpy as np

from privmtl.exceptions import InvalidParameterError

__all__ = ["check_choice", "check_int", "check_real", "check_rng"]


def _interval(low: float | None, high: float | None, closed: str) -> str:
    lo = "-inf" if low is None else f"{low:g}"
    hi = "inf" if high is None else f"{high:g}"
    left = "[" if closed in ("both", "left") and low is not None else "("
    right = "]" if closed in ("both", "right") and high is not None else ")"
    return f"{left}{lo}, {hi}{right}"


def check_real(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    closed: str = "both",
    allow_inf: bool = False,
) -> float:
    """Return ``value`` as a float, or raise :class:`InvalidParameterError`.

    ``closed`` is one of ``"both"``, ``"left"``, ``"right"``, ``"neither"`` and says which of the
    bounds belong to the interval.
    """
    interval = _interval(low, high, closed)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidParameterError(
            f"The '{name}' parameter must be a real number in {interval}; got {value!r}."
        )
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise InvalidParameterError(
            f"The '{name}' parameter must be a finite real number in {interval}; got {v!r}."
        )
    bad_low = low is not None and (v < low or (v == low and closed in ("right", "neither")))
    bad_high = high is not None and (v > high or (v == high and closed in ("left", "neither")))
    if bad_low or bad_high:
        raise InvalidParameterError(f"The '{name}' parameter must be in {interval}; got {v!r}.")
    return v


def check_int(name: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """Return ``value`` as an int within ``[low, high]``, or raise :class:`InvalidParameterError`."""
    interval = _interval(low, high, "both")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidParameterError(
            f"The '{name}' parameter must be an integer in {interval}; got {value!r}."
        )
    v = int(value)
    if (low is not None and v < low) or (high is not None and v > high):
        raise InvalidParameterError(f"The '{name}' parameter must be in {interval}; got {v!r}.")
    return v


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """Return ``value`` if it is one of ``choices``, or raise :class:`InvalidParameterError`."""
    options = list(choices)
    if value not in options:
        shown = ", ".join(repr(c) for c in options)
        raise InvalidParameterError(
            f"The '{name}' parameter must be one of {{{shown}}}; got {value!r}."
        )
    return value


def check_rng(seed: Any, name: str = "random_state") -> np.random.Generator:
    """Turn ``None``, an int seed or a Generator into a :class:`numpy.random.Generator`.

    Passing a Generator returns it unchanged (its state is shared, as in scikit-learn).
    Legacy ``RandomState`` objects are refused: all privmtl randomness is explicit.
    """
    if seed is None or (isinstance(seed, numbers.Integral) and not isinstance(seed, bool)):
        if seed is not None and int(seed) < 0:
            raise InvalidParameterError(
                f"The '{name}' parameter must be a non-negative int, a numpy Generator or None; "
                f"got {seed!r}."
            )
        return np.random.default_rng(None if seed is None else int(seed))
    if isinstance(seed, np.random.Generator):
        return seed
    raise InvalidParameterError(
        f"The '{name}' parameter must be a non-negative int, a numpy Generator or None; "
        f"got {seed!r}."
    )
