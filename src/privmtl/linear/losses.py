"""Per-task losses of linear multi-task learning, as pure functions.

Conventions
-----------
Task ``i`` owns ``X_i`` (``n_i x d``) and ``y_i`` (``n_i``); its model is the column ``w_i`` of
``W`` (``d x m``). The per-task empirical loss is the **mean** over the task's samples::

    L_i(w) = (1 / n_i) * sum_j l(x_j^T w, y_j) + (mu / 2) * ||w||^2

with the per-sample losses (``s = x^T w`` is the score)

* ``"squared"``:  ``l(s, y) = 0.5 * (s - y)^2``,                   ``dl/ds = s - y``;
* ``"logistic"``: ``l(s, y) = log(1 + exp(-(2y - 1) * s))``, labels ``y`` in ``{0, 1}``,
  ``dl/ds = sigmoid(s) - y``.

``mu >= 0`` (keyword, default ``0``) adds the strong-convexity term of the MP-MTL paper
(they use ``mu = 1e-3``). The gradient is ``(1/n_i) X_i^T l'(X_i w) + mu * w`` and its Lipschitz
constant is ``c * ||X_i||_2^2 / n_i + mu`` with ``c = 1`` (squared) or ``c = 1/4`` (logistic).
A multi-task objective ``sum_i L_i(w_i)`` therefore weights tasks equally whatever their sizes.

Speed
-----
Functions taking sequences of per-task arrays loop over tasks in Python, which is fine for a few
thousand small tasks. For large ``m`` build a :class:`TaskBatch` once (tasks zero-padded to a common
length with a mask) and pass it instead: every evaluation is then two batched matrix products,
``O(m * n_max * d)`` with no Python loop. Padding wastes work when task sizes differ a lot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import expit

from privmtl._validation import check_choice, check_real
from privmtl.exceptions import DataFormatError

__all__ = [
    "LOSSES",
    "LossKind",
    "TaskBatch",
    "lipschitz",
    "loss_conjugate",
    "loss_derivative",
    "loss_grad",
    "loss_value",
    "per_sample_loss",
    "public_lipschitz_bound",
    "task_gradients",
    "task_lipschitz",
    "task_losses",
]

LossKind = Literal["squared", "logistic"]
LOSSES: tuple[str, ...] = ("squared", "logistic")

FloatArray = NDArray[np.float64]


def _kind(kind: str) -> str:
    return str(check_choice("kind", kind, LOSSES))


def _mu(mu: float) -> float:
    return check_real("mu", mu, low=0.0)


def per_sample_loss(kind: LossKind, scores: ArrayLike, y: ArrayLike) -> FloatArray:
    """Per-sample loss ``l(s, y)`` for scores ``s`` and targets ``y`` (any matching shapes).

    Parameters
    ----------
    kind : {"squared", "logistic"}
        ``0.5 * (s - y)^2`` or ``log(1 + exp(-(2y - 1) s))`` (labels in ``{0, 1}``).
    scores, y : array_like
        Scores ``x^T w`` and targets, broadcastable.

    Returns
    -------
    ndarray
        The loss of every sample (numerically stable for large ``|s|``).
    """
    k = _kind(kind)
    s = np.asarray(scores, dtype=np.float64)
    t = np.asarray(y, dtype=np.float64)
    if k == "squared":
        return np.asarray(0.5 * (s - t) ** 2, dtype=np.float64)
    return np.asarray(np.logaddexp(0.0, -(2.0 * t - 1.0) * s), dtype=np.float64)


def loss_derivative(kind: LossKind, scores: ArrayLike, y: ArrayLike) -> FloatArray:
    """Derivative ``dl/ds`` of the per-sample loss with respect to the score.

    ``s - y`` for the squared loss, ``sigmoid(s) - y`` for the logistic loss. Its largest absolute
    value over a task is the per-sample Lipschitz constant used by DP-MTRL output perturbation.
    """
    k = _kind(kind)
    s = np.asarray(scores, dtype=np.float64)
    t = np.asarray(y, dtype=np.float64)
    if k == "squared":
        return np.asarray(s - t, dtype=np.float64)
    return np.asarray(expit(s) - t, dtype=np.float64)


def loss_conjugate(kind: LossKind, a: ArrayLike, y: ArrayLike) -> FloatArray:
    """Convex conjugate ``l*(a) = sup_s (a s - l(s, y))`` of the per-sample loss in its score.

    ``0.5 a^2 + a y`` for the squared loss; for the logistic loss, with ``p = a + y`` (finite only
    for ``p`` in ``[0, 1]``), the negative binary entropy ``p log p + (1 - p) log(1 - p)``. Used by
    the duality-gap certificates of :mod:`privmtl.linear.solvers`, whose dual points are
    ``a = c * dl/ds`` with ``c`` in ``[0, 1]`` (always in the domain).
    """
    from scipy.special import xlogy

    k = _kind(kind)
    aa = np.asarray(a, dtype=np.float64)
    t = np.asarray(y, dtype=np.float64)
    if k == "squared":
        return np.asarray(0.5 * aa * aa + aa * t, dtype=np.float64)
    p = np.clip(aa + t, 0.0, 1.0)
    return np.asarray(xlogy(p, p) + xlogy(1.0 - p, 1.0 - p), dtype=np.float64)


def loss_value(
    kind: LossKind, X: ArrayLike, y: ArrayLike, w: ArrayLike, *, mu: float = 0.0
) -> float:
    """Task loss ``L(w) = (1/n) sum_j l(x_j^T w, y_j) + (mu/2) ||w||^2``.

    Parameters
    ----------
    kind : {"squared", "logistic"}
        Per-sample loss (see the module docstring).
    X : array_like of shape (n, d)
        Features of one task.
    y : array_like of shape (n,)
        Targets (labels in ``{0, 1}`` for the logistic loss).
    w : array_like of shape (d,)
        Model.
    mu : float, default=0.0
        Strong-convexity weight.

    Returns
    -------
    float
    """
    Xa = np.asarray(X, dtype=np.float64)
    wa = np.asarray(w, dtype=np.float64)
    m = _mu(mu)
    value = float(np.mean(per_sample_loss(kind, Xa @ wa, y)))
    return value + 0.5 * m * float(wa @ wa) if m else value


def loss_grad(
    kind: LossKind, X: ArrayLike, y: ArrayLike, w: ArrayLike, *, mu: float = 0.0
) -> FloatArray:
    """Gradient ``(1/n) X^T l'(X w, y) + mu w`` of :func:`loss_value`, shape ``(d,)``."""
    Xa = np.asarray(X, dtype=np.float64)
    wa = np.asarray(w, dtype=np.float64)
    m = _mu(mu)
    r = loss_derivative(kind, Xa @ wa, y)
    g = Xa.T @ r / Xa.shape[0]
    return np.asarray(g + m * wa if m else g, dtype=np.float64)


def curvature(kind: LossKind) -> float:
    """``c`` with ``|l''| <= c``: 1 for the squared loss, 1/4 for the logistic loss."""
    return 1.0 if _kind(kind) == "squared" else 0.25


def public_lipschitz_bound(kind: LossKind, mu: float = 0.0, *, row_norm: float = 1.0) -> float:
    """``c row_norm^2 + mu``: a bound on every task's Lipschitz constant that reads no data.

    Valid whenever every row has ``||x|| <= row_norm`` (``||X||_2^2 / n <= max_j ||x_j||^2``);
    ``row_norm = 1`` is the MP-MTL paper's normalization (unit-length rows).
    """
    return curvature(kind) * float(row_norm) ** 2 + _mu(mu)


def lipschitz(kind: LossKind, X: ArrayLike, *, mu: float = 0.0) -> float:
    """Lipschitz constant of :func:`loss_grad`: ``c ||X||_2^2 / n + mu``.

    ``c = 1`` for the squared loss and ``1/4`` for the logistic loss; ``||X||_2`` is the spectral
    norm.
    The bound is tight for the squared loss (it is the largest Hessian eigenvalue).
    """
    Xa = np.asarray(X, dtype=np.float64)
    c = curvature(kind)
    if Xa.size == 0:
        return _mu(mu)
    spec = float(np.linalg.norm(Xa, 2))
    return c * spec**2 / Xa.shape[0] + _mu(mu)


@dataclass(frozen=True)
class TaskBatch:
    """Tasks zero-padded to a common length, for loop-free batched evaluation.

    Attributes
    ----------
    X : ndarray of shape (m, n_max, d)
        Features; rows past ``n[i]`` are zero.
    y : ndarray of shape (m, n_max)
        Targets; entries past ``n[i]`` are zero.
    mask : ndarray of shape (m, n_max)
        1.0 for real samples, 0.0 for padding.
    n : ndarray of shape (m,)
        Number of samples of every task (all ``>= 1``).
    """

    X: FloatArray
    y: FloatArray
    mask: FloatArray
    n: FloatArray

    @classmethod
    def from_tasks(cls, Xs: Sequence[ArrayLike], ys: Sequence[ArrayLike]) -> TaskBatch:
        """Pad per-task arrays ``Xs[i]`` (``n_i x d``) and ``ys[i]`` (``n_i``) into a batch."""
        if len(Xs) != len(ys):
            raise DataFormatError(f"got {len(Xs)} feature arrays but {len(ys)} target arrays.")
        if len(Xs) == 0:
            raise DataFormatError("at least one task is required.")
        Xl = [np.asarray(x, dtype=np.float64) for x in Xs]
        yl = [np.asarray(t, dtype=np.float64).ravel() for t in ys]
        d = Xl[0].shape[1] if Xl[0].ndim == 2 else -1
        for i, (x, t) in enumerate(zip(Xl, yl, strict=True)):
            if x.ndim != 2 or x.shape[1] != d:
                raise DataFormatError(
                    f"task {i}: features must be a 2-D array with {d} columns; got shape {x.shape}."
                )
            if x.shape[0] != t.shape[0] or x.shape[0] == 0:
                raise DataFormatError(
                    f"task {i}: {x.shape[0]} feature rows but {t.shape[0]} targets "
                    "(both must be equal and >= 1)."
                )
        n = np.array([x.shape[0] for x in Xl], dtype=np.float64)
        m, n_max = len(Xl), int(n.max())
        Xp = np.zeros((m, n_max, d))
        yp = np.zeros((m, n_max))
        mask = np.zeros((m, n_max))
        for i, (x, t) in enumerate(zip(Xl, yl, strict=True)):
            k = x.shape[0]
            Xp[i, :k] = x
            yp[i, :k] = t
            mask[i, :k] = 1.0
        return cls(X=Xp, y=yp, mask=mask, n=n)

    @property
    def n_tasks(self) -> int:
        """Number of tasks ``m``."""
        return int(self.X.shape[0])

    @property
    def n_features(self) -> int:
        """Number of features ``d``."""
        return int(self.X.shape[2])

    def scores(self, W: ArrayLike) -> FloatArray:
        """Scores ``x_j^T w_i`` of every (padded) sample, shape ``(m, n_max)``; padding gives 0."""
        Wa = self._check_W(W)
        return np.matmul(self.X, Wa.T[:, :, None])[:, :, 0]

    def losses(self, kind: LossKind, W: ArrayLike, *, mu: float = 0.0) -> FloatArray:
        """Per-task losses ``L_i(w_i)``, shape ``(m,)``."""
        Wa = self._check_W(W)
        m_ = _mu(mu)
        per = per_sample_loss(kind, self.scores(Wa), self.y) * self.mask
        out = per.sum(axis=1) / self.n
        return out + 0.5 * m_ * np.einsum("dm,dm->m", Wa, Wa) if m_ else out

    def gradients(self, kind: LossKind, W: ArrayLike, *, mu: float = 0.0) -> FloatArray:
        """Per-task gradients ``grad L_i(w_i)`` as the columns of a ``(d, m)`` matrix."""
        Wa = self._check_W(W)
        m_ = _mu(mu)
        r = loss_derivative(kind, self.scores(Wa), self.y) * self.mask / self.n[:, None]
        G = np.matmul(r[:, None, :], self.X)[:, 0, :].T
        return np.asarray(G + m_ * Wa if m_ else G, dtype=np.float64)

    def lipschitz(self, kind: LossKind, *, mu: float = 0.0) -> FloatArray:
        """Per-task Lipschitz constants of the gradients, shape ``(m,)``."""
        c = curvature(kind)
        n_max, d = self.X.shape[1], self.X.shape[2]
        # The spectral norm from the smaller Gram matrix (padding rows are zero, so harmless).
        if n_max <= d:
            gram = np.matmul(self.X, self.X.transpose(0, 2, 1))
        else:
            gram = np.matmul(self.X.transpose(0, 2, 1), self.X)
        top = np.linalg.eigvalsh(gram)[:, -1]
        return np.asarray(c * np.maximum(top, 0.0) / self.n + _mu(mu), dtype=np.float64)

    def _check_W(self, W: ArrayLike) -> FloatArray:
        Wa = np.asarray(W, dtype=np.float64)
        if Wa.shape != (self.n_features, self.n_tasks):
            raise DataFormatError(
                f"W must have shape (d, m) = ({self.n_features}, {self.n_tasks}); got {Wa.shape}."
            )
        return Wa


#: Per-task features, or a prebuilt batch.
TaskData = Sequence[ArrayLike] | TaskBatch
#: Per-task targets (``None`` with a TaskBatch).
Targets = Sequence[ArrayLike] | None


def _unbatched(
    Xs: Sequence[ArrayLike], ys: Targets, W: ArrayLike
) -> tuple[FloatArray, Sequence[ArrayLike]]:
    """``(W as float64, ys)`` after checking the per-task lists against each other and ``W``."""
    Wa = np.asarray(W, dtype=np.float64)
    if ys is None:
        raise DataFormatError("ys is required unless Xs is a TaskBatch.")
    if len(Xs) != len(ys):
        raise DataFormatError(f"got {len(Xs)} feature arrays but {len(ys)} target arrays.")
    if Wa.ndim != 2 or Wa.shape[1] != len(Xs):
        raise DataFormatError(f"W must have shape (d, m) with m = {len(Xs)} tasks; got {Wa.shape}.")
    return Wa, ys


def task_losses(
    kind: LossKind, Xs: TaskData, ys: Targets, W: ArrayLike, *, mu: float = 0.0
) -> FloatArray:
    """Per-task losses ``[L_1(w_1), ..., L_m(w_m)]``.

    Parameters
    ----------
    kind : {"squared", "logistic"}
        Per-sample loss.
    Xs : sequence of arrays (n_i, d) or TaskBatch
        Features per task, or a prebuilt :class:`TaskBatch` (then ``ys`` is ignored, pass ``None``).
    ys : sequence of arrays (n_i,) or None
        Targets per task.
    W : array_like of shape (d, m)
        Models as columns.
    mu : float, default=0.0
        Strong-convexity weight.

    Returns
    -------
    ndarray of shape (m,)
    """
    if isinstance(Xs, TaskBatch):
        return Xs.losses(kind, W, mu=mu)
    Wa, yl = _unbatched(Xs, ys, W)
    pairs = enumerate(zip(Xs, yl, strict=True))
    return np.array([loss_value(kind, X, y, Wa[:, i], mu=mu) for i, (X, y) in pairs])


def task_gradients(
    kind: LossKind, Xs: TaskData, ys: Targets, W: ArrayLike, *, mu: float = 0.0
) -> FloatArray:
    """Per-task gradients ``grad L_i(w_i)`` stacked as the columns of a ``(d, m)`` matrix.

    Same arguments as :func:`task_losses`. Passing a :class:`TaskBatch` avoids the Python loop.
    """
    if isinstance(Xs, TaskBatch):
        return Xs.gradients(kind, W, mu=mu)
    Wa, yl = _unbatched(Xs, ys, W)
    G = np.empty_like(Wa)
    for i, (X, y) in enumerate(zip(Xs, yl, strict=True)):
        G[:, i] = loss_grad(kind, X, y, Wa[:, i], mu=mu)
    return G


def task_lipschitz(
    kind: LossKind, Xs: Sequence[ArrayLike] | TaskBatch, *, mu: float = 0.0
) -> FloatArray:
    """Per-task Lipschitz constants of the gradients, shape ``(m,)`` (see :func:`lipschitz`).

    The joint objective ``sum_i L_i(w_i)`` has a gradient Lipschitz constant equal to the maximum.
    """
    if isinstance(Xs, TaskBatch):
        return Xs.lipschitz(kind, mu=mu)
    return np.array([lipschitz(kind, X, mu=mu) for X in Xs], dtype=np.float64)
