"""The one parameter checker: declared constraints, converted values, messages naming the value."""

from __future__ import annotations

from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
import pytest

from privmtl._validation import (
    Boolean,
    InstanceOf,
    Interval,
    Options,
    RandomState,
    validate_params,
)
from privmtl.exceptions import InvalidParameterError


class _Est:
    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "lam": Interval(Real, 0.0, None),
        "tol": Interval(Real, 0.0, None, closed="neither"),
        "max_iter": Interval(Integral, 1, None),
        "loss": Options(("squared", "logistic")),
        "step": [None, Interval(Real, 0.0, None, closed="neither")],
        "alpha": [Interval(Real, 0.0, 1.0), Options(("auto",))],
        "accelerate": Boolean(),
        "random_state": RandomState(),
        "group": [None, InstanceOf(dict)],
    }

    def __init__(self, **kw: object) -> None:
        self.lam, self.tol, self.max_iter, self.loss = 1, 1e-6, 10, "squared"
        self.step, self.alpha, self.accelerate, self.random_state = None, "auto", True, 0
        self.group = None
        self.__dict__.update(kw)


def test_valid_values_are_converted() -> None:
    out = validate_params(_Est(lam=np.int64(2), accelerate=np.bool_(False), alpha=0.5))
    assert out["lam"] == 2.0 and type(out["lam"]) is float
    assert out["max_iter"] == 10 and type(out["max_iter"]) is int
    assert out["accelerate"] is False
    assert out["step"] is None and out["alpha"] == 0.5 and out["random_state"] == 0
    group = {"a": 1}
    assert validate_params(_Est(group=group))["group"] is group  # an instance is kept as given


@pytest.mark.parametrize(
    ("param", "value", "message"),
    [
        ("lam", -1.0, r"The 'lam' parameter must be in \[0, inf\); got -1.0"),
        ("tol", 0.0, r"The 'tol' parameter must be in \(0, inf\); got 0.0"),
        ("max_iter", 1.5, r"The 'max_iter' parameter must be an integer in \[1, inf\); got 1.5"),
        ("loss", "hinge", r"The 'loss' parameter must be one of \{'squared', 'logistic'\}"),
        ("step", 0.0, r"The 'step' parameter must be in \(0, inf\); got 0.0"),
        ("alpha", 2.0, r"The 'alpha' parameter must be a real number in \[0, 1\] or one of"),
        ("accelerate", 1, r"The 'accelerate' parameter must be a bool; got 1"),
        ("random_state", -3, r"The 'random_state' parameter must be a non-negative int"),
        ("group", [1], r"The 'group' parameter must be a dict; got \[1\]"),
    ],
)
def test_invalid_values_name_parameter_constraint_and_value(
    param: str, value: object, message: str
) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        validate_params(_Est(**{param: value}))
