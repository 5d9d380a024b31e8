"""Parameter checks with scikit-learn style messages.

Each check names the parameter, the constraint and the value received, e.g.
``The 'epsilon' parameter must be a float in (0, inf); got -1.0.``

Estimators declare their constraints once per class, as scikit-learn does::

    class Ridge(BaseEstimator):
        _parameter_constraints = {
            "lam": Interval(Real, 0.0, None),
            "loss": Options(("squared", "logistic")),
            "step_size": [None, Interval(Real, 0.0, None, closed="neither")],
        }

and call the one checker, :func:`validate_params`, at the start of ``fit``; it returns the checked
(converted) values by name. A list means "any of these"; ``None`` in a list admits ``None``.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from numbers import Integral
from typing import Any

import numpy as np

from privmtl.exceptions import InvalidParameterError

__all__ = [
    "Boolean",
    "InstanceOf",
    "Interval",
    "Options",
    "RandomState",
    "check_choice",
    "check_int",
    "check_memory",
    "check_real",
    "check_rng",
    "physical_memory",
    "validate_params",
]


def _shown(value: Any) -> str:
    """``repr`` of a value as a user wrote it: NumPy scalars as plain numbers (4.23, not
    ``np.float64(4.23)``)."""
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value)


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
            f"The '{name}' parameter must be a real number in {interval}; got {_shown(value)}."
        )
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise InvalidParameterError(
            f"The '{name}' parameter must be a finite real number in {interval}; got {_shown(v)}."
        )
    bad_low = low is not None and (v < low or (v == low and closed in ("right", "neither")))
    bad_high = high is not None and (v > high or (v == high and closed in ("left", "neither")))
    if bad_low or bad_high:
        raise InvalidParameterError(
            f"The '{name}' parameter must be in {interval}; got {_shown(v)}."
        )
    return v


def check_int(name: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """Return ``value`` as an int within ``[low, high]``, or raise :class:`InvalidParameterError`."""
    interval = _interval(low, high, "both")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidParameterError(
            f"The '{name}' parameter must be an integer in {interval}; got {_shown(value)}."
        )
    v = int(value)
    if (low is not None and v < low) or (high is not None and v > high):
        raise InvalidParameterError(
            f"The '{name}' parameter must be in {interval}; got {_shown(v)}."
        )
    return v


#: Bytes each client of a population costs before any of its data is drawn: the synthetic
#: federation's sizes, stream index and id (112 measured) and the run's index of client
#: states and sampling draws.
CLIENT_BYTES = 160
#: Bytes each round costs in memory: the privacy ledger's record of its release (about 1.2 KiB
#: measured), kept for the whole run.
ROUND_BYTES = 1280


def physical_memory() -> int | None:
    """The machine's physical memory in bytes (``os.sysconf``), None where it is not known."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return total if total > 0 else None


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"


def check_memory(name: str, count: int, each: int, what: str) -> None:
    """Refuse, before anything is allocated, a size whose memory exceeds the machine's.

    ``count`` items of ``each`` bytes (``what`` says what they are); an
    :class:`InvalidParameterError` names the parameter, the memory it would need and the
    machine's physical memory (:func:`physical_memory`). Nothing is refused where the machine's
    memory is not known.
    """
    memory = physical_memory()
    need = int(count) * int(each)
    if memory is not None and need > memory:
        raise InvalidParameterError(
            f"The '{name}' parameter must be at most {memory // int(each)} on this machine; got "
            f"{_shown(count)}: that many {what} would need at least {_gib(need)} of memory "
            f"({each} bytes each), more than its {_gib(memory)}."
        )


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """Return ``value`` if it is one of ``choices``, or raise :class:`InvalidParameterError`."""
    options = list(choices)
    if value not in options:
        shown = ", ".join(_shown(c) for c in options)
        raise InvalidParameterError(
            f"The '{name}' parameter must be one of {{{shown}}}; got {_shown(value)}."
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
                f"got {_shown(seed)}."
            )
        return np.random.default_rng(None if seed is None else int(seed))
    if isinstance(seed, np.random.Generator):
        return seed
    raise InvalidParameterError(
        f"The '{name}' parameter must be a non-negative int, a numpy Generator or None; "
        f"got {_shown(seed)}."
    )


@dataclass(frozen=True)
class Interval:
    """Numbers of ``kind`` (:class:`numbers.Real` or :class:`numbers.Integral`) in an interval.

    ``low`` / ``high`` of ``None`` are unbounded; ``closed`` is ``"both"``, ``"left"``,
    ``"right"`` or ``"neither"`` (ignored for integers, whose bounds are always included).
    """

    kind: type
    low: float | None
    high: float | None
    closed: str = "both"

    def check(self, name: str, value: Any) -> Any:
        """Return the value converted (``float`` or ``int``) or raise InvalidParameterError."""
        if self.kind is Integral:
            low = None if self.low is None else int(self.low)
            high = None if self.high is None else int(self.high)
            return check_int(name, value, low=low, high=high)
        return check_real(name, value, low=self.low, high=self.high, closed=self.closed)

    def describe(self) -> str:
        """Human-readable form used when several constraints are allowed."""
        what = "an integer" if self.kind is Integral else "a real number"
        return f"{what} in {_interval(self.low, self.high, self.closed)}"


@dataclass(frozen=True)
class Options:
    """One of a fixed set of values (compared with ``==``)."""

    values: tuple[Any, ...]

    def check(self, name: str, value: Any) -> Any:
        """Return the value or raise InvalidParameterError."""
        return check_choice(name, value, self.values)

    def describe(self) -> str:
        """Human-readable form used when several constraints are allowed."""
        return "one of {" + ", ".join(_shown(v) for v in self.values) + "}"


@dataclass(frozen=True)
class Boolean:
    """``True`` or ``False`` (numpy booleans accepted and converted)."""

    def check(self, name: str, value: Any) -> bool:
        """Return the value as a bool or raise InvalidParameterError."""
        if not isinstance(value, bool | np.bool_):
            raise InvalidParameterError(
                f"The '{name}' parameter must be a bool; got {_shown(value)}."
            )
        return bool(value)

    def describe(self) -> str:
        """Human-readable form used when several constraints are allowed."""
        return "a bool"


@dataclass(frozen=True)
class RandomState:
    """``None``, a non-negative int seed or a :class:`numpy.random.Generator` (kept as given)."""

    def check(self, name: str, value: Any) -> Any:
        """Return the value unchanged after :func:`check_rng` accepted it."""
        check_rng(value, name)
        return value

    def describe(self) -> str:
        """Human-readable form used when several constraints are allowed."""
        return "a non-negative int, a numpy Generator or None"


@dataclass(frozen=True)
class InstanceOf:
    """An instance of ``kind`` (a parameter that groups settings in a typed object)."""

    kind: type

    def check(self, name: str, value: Any) -> Any:
        """Return the value unchanged or raise InvalidParameterError."""
        if not isinstance(value, self.kind):
            raise InvalidParameterError(
                f"The '{name}' parameter must be {self.describe()}; got {_shown(value)}."
            )
        return value

    def describe(self) -> str:
        """Human-readable form used when several constraints are allowed."""
        return f"a {self.kind.__name__}"


Constraint = Interval | Options | Boolean | RandomState | InstanceOf | None


def _check_one(name: str, value: Any, constraint: Constraint) -> Any:
    if constraint is None:
        if value is not None:
            raise InvalidParameterError(
                f"The '{name}' parameter must be None; got {_shown(value)}."
            )
        return None
    return constraint.check(name, value)


def validate_params(
    obj: Any, constraints: Mapping[str, Constraint | list[Constraint]] | None = None
) -> dict[str, Any]:
    """Check every declared parameter of ``obj``; return the checked values by name.

    Parameters
    ----------
    obj : object
        An estimator; its parameters are read as attributes of the same name.
    constraints : mapping, optional
        Parameter name to a constraint or a list of alternatives (``None`` admits ``None``).
        Defaults to ``type(obj)._parameter_constraints``.

    Returns
    -------
    dict
        Converted values (floats for real intervals, ints for integer ones, bools) by name.

    Raises
    ------
    InvalidParameterError
        Naming the parameter, the constraint and the value received.
    """
    spec = type(obj)._parameter_constraints if constraints is None else constraints
    out: dict[str, Any] = {}
    for name, constraint in spec.items():
        value = getattr(obj, name)
        if not isinstance(constraint, list):
            out[name] = _check_one(name, value, constraint)
            continue
        if value is None and None in constraint:
            out[name] = None
            continue
        real = [c for c in constraint if c is not None]
        if len(real) == 1:
            out[name] = _check_one(name, value, real[0])
            continue
        for c in real:
            try:
                out[name] = _check_one(name, value, c)
                break
            except InvalidParameterError:
                continue
        else:
            shown = " or ".join(
                [c.describe() for c in real] + (["None"] if None in constraint else [])
            )
            raise InvalidParameterError(
                f"The '{name}' parameter must be {shown}; got {_shown(value)}."
            )
    return out
