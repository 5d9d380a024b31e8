"""Your own MP-MTL (linear) method, run by ``privmtl mpmtl`` like privmtl's own.

``MeanShrinkage`` is none of privmtl's methods: every task fits its own ridge model, then every
model is pulled towards the tasks' mean model by a factor ``shrink`` (0: every task alone, 1: one
shared model). Its estimator, ``MeanShrunkRidge``, is a scikit-learn style estimator (here a
subclass of :class:`~privmtl.linear.STLRidge`: ``fit(Xs, ys)``, ``predict(Xs)``, ``coef_`` of shape
``(d, m)``); the :class:`~privmtl.linear.methods.LinearMethod` subclass declares what a run needs
to know about it: its name, its estimator, its tuning grid (non-private: ``tune="covered"``
searches it by k-fold cross-validation over the tasks' training data).

Run: ``privmtl mpmtl --method examples/own_linear_method.py:MeanShrinkage --data
synthetic-lowrank`` (the result records this file's SHA-256 under ``method_source``), or
``python examples/own_linear_method.py`` (``PRIVMTL_EXAMPLE_SMALL=1``: a few seconds).
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from privmtl.exceptions import InvalidParameterError
from privmtl.experiments.mpmtl import run_mpmtl
from privmtl.linear import STLRidge
from privmtl.linear.methods import LinearMethod

SMALL = os.environ.get("PRIVMTL_EXAMPLE_SMALL") == "1"


class MeanShrunkRidge(STLRidge):
    """Every task's ridge model, shrunk towards the mean model by ``shrink``."""

    def __init__(
        self,
        *,
        lam: float | str = 1.0,
        shrink: float = 0.5,
        loss: str = "squared",
        tol: float = 1e-6,
        max_iter: int = 1000,
    ) -> None:
        super().__init__(lam=lam, loss=loss, tol=tol, max_iter=max_iter)
        self.shrink = shrink

    def fit(self, Xs: Any, ys: Any = None) -> MeanShrunkRidge:
        if not 0.0 <= self.shrink <= 1.0:
            raise InvalidParameterError(
                f"The 'shrink' parameter must be in [0, 1]; got {self.shrink!r}."
            )
        super().fit(Xs, ys)
        mean = self.coef_.mean(axis=1, keepdims=True)
        self.coef_ = (1.0 - self.shrink) * self.coef_ + self.shrink * mean
        return self


class MeanShrinkage(LinearMethod):
    """The method object: what ``--method ...:MeanShrinkage`` names."""

    name: ClassVar[str] = "mean-shrink"
    estimator: ClassVar[type] = MeanShrunkRidge
    grid: ClassVar[list[dict[str, list[Any]]]] = [
        {"lam": [1e-3, 1e-2, 1e-1], "shrink": [0.0, 0.5, 0.9]}
    ]


def main() -> None:
    out = run_mpmtl(
        method=MeanShrinkage,
        data="synthetic-lowrank",
        n_splits=2 if SMALL else 5,
        seed=0,
    )
    print(
        f"{out['method']}: test nMSE {out['nmse']:.4f} (every task alone: {out['stl_nmse']:.4f}) "
        f"with {out['params']}; {out['summary']}"
    )


if __name__ == "__main__":
    main()
