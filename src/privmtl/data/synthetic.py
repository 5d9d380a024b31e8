"""Synthetic multi-task data of the MP-MTL paper (Liang et al., section 5.4 and Fig. 2).

Common design (paper defaults): ``m = 320`` tasks, ``n_i = 30`` training samples, ``d = 30``
features; the rows of every ``X_i`` are drawn from ``N(0, I_d)`` and then scaled to unit l2 norm;
``y_i = X_i w_i + noise`` with i.i.d. ``N(0, noise_std^2)`` noise; the test set is drawn the same way
with ``test_factor * n_i`` samples per task and the same ``W``.

Random draws happen in a fixed order (``W``, then the training set, then the test set, each task
in order), so the same seed gives the same data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, overload

import numpy as np
from numpy.typing import NDArray

from privmtl._validation import check_int, check_real, check_rng
from privmtl.data.multitask import MultiTaskDataset
from privmtl.exceptions import InvalidParameterError

__all__ = [
    "lowrank_task_covariance",
    "make_anomaly_tasks",
    "make_groupsparse_tasks",
    "make_lowrank_tasks",
    "make_tasks_from_coef",
]

FloatArray = NDArray[np.float64]
Seed = int | np.random.Generator | None
Split = tuple[MultiTaskDataset, MultiTaskDataset]


def _unit_rows(rng: np.random.Generator, n: int, d: int) -> FloatArray:
    X = rng.standard_normal((n, d))
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return np.asarray(X / np.where(norms > 0, norms, 1.0), dtype=np.float64)


def _sizes(n_samples: int | Sequence[int], m: int) -> list[int]:
    if isinstance(n_samples, int | np.integer):
        return [check_int("n_samples", n_samples, low=1)] * m
    sizes = [check_int("n_samples", int(n), low=1) for n in n_samples]
    if len(sizes) != m:
        raise InvalidParameterError(
            f"The 'n_samples' parameter must be an int or have one entry per task ({m}); "
            f"got {len(sizes)} entries."
        )
    return sizes


def make_tasks_from_coef(
    W: FloatArray,
    *,
    n_samples: int | Sequence[int] = 30,
    test_factor: int = 9,
    noise_std: float = 1.0,
    random_state: Seed,
) -> Split:
    """Draw unit-norm Gaussian inputs and noisy linear targets for given task models.

    Parameters
    ----------
    W : ndarray of shape (d, m)
        Task models as columns.
    n_samples : int or sequence of int, default=30
        Training samples per task.
    test_factor : int, default=9
        The test set has ``test_factor * n_i`` samples per task (``0`` is not allowed).
    noise_std : float, default=1.0
        Standard deviation of the additive Gaussian noise.
    random_state : int, Generator or None

    Returns
    -------
    train, test : MultiTaskDataset
        Regression datasets; task ``i`` uses column ``i`` of ``W``.
    """
    Wa = np.asarray(W, dtype=np.float64)
    if Wa.ndim != 2:
        raise InvalidParameterError(f"The 'W' parameter must be a (d, m) matrix; got {Wa.shape}.")
    d, m = Wa.shape
    sizes = _sizes(n_samples, m)
    factor = check_int("test_factor", test_factor, low=1)
    sigma = check_real("noise_std", noise_std, low=0.0)
    rng = check_rng(random_state)
    sets = []
    for mult in (1, factor):
        Xs, ys = [], []
        for i in range(m):
            X = _unit_rows(rng, sizes[i] * mult, d)
            Xs.append(X)
            ys.append(X @ Wa[:, i] + sigma * rng.standard_normal(X.shape[0]))
        sets.append(MultiTaskDataset(X=tuple(Xs), y=tuple(ys)))
    return sets[0], sets[1]


def lowrank_task_covariance(n_tasks: int, rank: int) -> FloatArray:
    """Structured, low-rank task covariance ``Sigma = A A^T`` (``m x m``) used by the generator.

    Tasks ``0..m-1`` are cut into ``rank`` contiguous clusters of near-equal size. Within cluster
    ``c``, task ``i`` at relative position ``t in [0, 1)`` loads on latent factor ``c`` with weight
    ``cos(t * pi / 2)`` and on factor ``c + 1 (mod rank)`` with weight ``sin(t * pi / 2)``. Hence
    ``Sigma_ii = 1``, tasks of a cluster are strongly correlated, neighbouring clusters are linked
    through their boundary tasks (a ring graph of clusters, a block-banded picture like the paper's
    Fig. 3a), and ``rank(Sigma) = rank`` (for ``rank <= m``).

    Parameters
    ----------
    n_tasks : int
        ``m >= 1``.
    rank : int
        Number of clusters/latent factors, ``1 <= rank <= n_tasks``.

    Returns
    -------
    ndarray of shape (n_tasks, n_tasks)
    """
    m = check_int("n_tasks", n_tasks, low=1)
    r = check_int("rank", rank, low=1, high=m)
    A = np.zeros((m, r))
    for c, block in enumerate(np.array_split(np.arange(m), r)):
        t = np.arange(len(block)) / len(block)
        A[block, c] = np.cos(t * np.pi / 2)
        if r > 1:
            A[block, (c + 1) % r] += np.sin(t * np.pi / 2)
        else:
            A[block, c] = 1.0
    return np.asarray(A @ A.T, dtype=np.float64)


@overload
def make_lowrank_tasks(
    *,
    n_tasks: int = ...,
    n_samples: int | Sequence[int] = ...,
    n_features: int = ...,
    rank: int = ...,
    coef_scale: float = ...,
    test_factor: int = ...,
    noise_std: float = ...,
    return_coef: Literal[False] = ...,
    random_state: Seed,
) -> Split: ...


@overload
def make_lowrank_tasks(
    *,
    n_tasks: int = ...,
    n_samples: int | Sequence[int] = ...,
    n_features: int = ...,
    rank: int = ...,
    coef_scale: float = ...,
    test_factor: int = ...,
    noise_std: float = ...,
    return_coef: Literal[True],
    random_state: Seed,
) -> tuple[MultiTaskDataset, MultiTaskDataset, FloatArray]: ...


def make_lowrank_tasks(
    *,
    n_tasks: int = 320,
    n_samples: int | Sequence[int] = 30,
    n_features: int = 30,
    rank: int = 5,
    coef_scale: float = 10.0,
    test_factor: int = 9,
    noise_std: float = 1.0,
    return_coef: bool = False,
    random_state: Seed,
) -> Split | tuple[MultiTaskDataset, MultiTaskDataset, FloatArray]:
    """Tasks whose model matrix is low rank (the MP-MTL paper's low-rank simulation).

    ``W ~ coef_scale * MVN(0, I_d, Sigma)`` (matrix normal: rows independent, columns correlated by
    ``Sigma``), with ``Sigma`` from :func:`lowrank_task_covariance`; it is drawn as
    ``W = coef_scale * Z A^T`` with ``Z`` a ``d x rank`` standard normal matrix, so that
    ``rank(W) = min(rank, d)`` almost surely.

    The paper does not print ``Sigma`` or its scale (only a picture, Fig. 3a). The defaults here
    (``rank=5``, ``coef_scale=10``) give a signal ``x^T w_i`` of standard deviation ``coef_scale``
    (``Sigma_ii = 1`` and ``||x|| = 1``) against unit noise, so an oracle's nMSE is about
    ``1 / (1 + 100) = 0.01``, the order of the paper's non-private MTL result (0.014); single-task
    least squares with ``n_i = d = 30`` is far worse, which is the regime the paper studies.

    Parameters
    ----------
    n_tasks, n_samples, n_features : int
        ``m``, ``n_i`` (int or one per task) and ``d``.
    rank : int, default=5
        Rank of ``Sigma`` (number of task clusters), ``1 <= rank <= n_tasks``.
    coef_scale : float, default=10.0
        Standard deviation of the entries of ``W``.
    test_factor, noise_std :
        See :func:`make_tasks_from_coef`.
    return_coef : bool, default=False
        Also return ``W`` (``d x m``).
    random_state : int, Generator or None

    Returns
    -------
    train, test : MultiTaskDataset
    W : ndarray of shape (d, m), only if ``return_coef``
    """
    m = check_int("n_tasks", n_tasks, low=1)
    d = check_int("n_features", n_features, low=1)
    scale = check_real("coef_scale", coef_scale, low=0.0)
    rng = check_rng(random_state)
    Sigma = lowrank_task_covariance(m, rank)
    # A with A A^T = Sigma, rebuilt from the eigen-decomposition (exact up to rounding).
    vals, vecs = np.linalg.eigh(Sigma)
    top = vals > vals.max() * 1e-10
    A = vecs[:, top] * np.sqrt(vals[top])
    W = scale * rng.standard_normal((d, A.shape[1])) @ A.T
    train, test = make_tasks_from_coef(
        W, n_samples=n_samples, test_factor=test_factor, noise_std=noise_std, random_state=rng
    )
    return (train, test, W) if return_coef else (train, test)


@overload
def make_groupsparse_tasks(
    *,
    n_tasks: int = ...,
    n_samples: int | Sequence[int] = ...,
    n_features: int = ...,
    n_nonzero_rows: int = ...,
    low: float = ...,
    high: float = ...,
    test_factor: int = ...,
    noise_std: float = ...,
    return_coef: Literal[False] = ...,
    random_state: Seed,
) -> Split: ...


@overload
def make_groupsparse_tasks(
    *,
    n_tasks: int = ...,
    n_samples: int | Sequence[int] = ...,
    n_features: int = ...,
    n_nonzero_rows: int = ...,
    low: float = ...,
    high: float = ...,
    test_factor: int = ...,
    noise_std: float = ...,
    return_coef: Literal[True],
    random_state: Seed,
) -> tuple[MultiTaskDataset, MultiTaskDataset, FloatArray]: ...


def make_groupsparse_tasks(
    *,
    n_tasks: int = 320,
    n_samples: int | Sequence[int] = 30,
    n_features: int = 30,
    n_nonzero_rows: int = 4,
    low: float = 1.0,
    high: float = 50.0,
    test_factor: int = 9,
    noise_std: float = 1.0,
    return_coef: bool = False,
    random_state: Seed,
) -> Split | tuple[MultiTaskDataset, MultiTaskDataset, FloatArray]:
    """Tasks sharing a few features (the MP-MTL paper's group-sparse simulation).

    Only the first ``n_nonzero_rows`` rows of ``W`` (``d x m``) are non-zero; their entries are
    uniform on ``[-high, -low] U [low, high]`` (a random sign times ``U(low, high)``).

    Parameters
    ----------
    n_tasks, n_samples, n_features : int
        ``m``, ``n_i`` (int or one per task) and ``d``.
    n_nonzero_rows : int, default=4
        Number of shared features, ``1 <= n_nonzero_rows <= n_features``.
    low, high : float, default=1.0, 50.0
        Magnitude range of the non-zero entries, ``0 <= low <= high``.
    test_factor, noise_std :
        See :func:`make_tasks_from_coef`.
    return_coef : bool, default=False
        Also return ``W``.
    random_state : int, Generator or None

    Returns
    -------
    train, test : MultiTaskDataset
    W : ndarray of shape (d, m), only if ``return_coef``
    """
    m = check_int("n_tasks", n_tasks, low=1)
    d = check_int("n_features", n_features, low=1)
    k = check_int("n_nonzero_rows", n_nonzero_rows, low=1, high=d)
    lo = check_real("low", low, low=0.0)
    hi = check_real("high", high, low=lo)
    rng = check_rng(random_state)
    W = np.zeros((d, m))
    W[:k] = rng.choice([-1.0, 1.0], size=(k, m)) * rng.uniform(lo, hi, size=(k, m))
    train, test = make_tasks_from_coef(
        W, n_samples=n_samples, test_factor=test_factor, noise_std=noise_std, random_state=rng
    )
    return (train, test, W) if return_coef else (train, test)


def make_anomaly_tasks(
    random_state: Seed, *, n_tasks: int = 10, n_features: int = 5, factor: float = 100.0
) -> FloatArray:
    """The model matrix ``W0`` of the paper's leakage example (Fig. 2).

    ``W0`` (``d x m``, default ``5 x 10``) has i.i.d. ``U(0, 1)`` entries and its last column
    (the anomalous task) multiplied by ``factor``. The paper then runs one step of its low-rank
    estimator with ``eta = 1``, ``K = 100 sqrt(5)``, ``lambda = 50`` (no data are involved).

    Returns
    -------
    ndarray of shape (n_features, n_tasks)
    """
    m = check_int("n_tasks", n_tasks, low=1)
    d = check_int("n_features", n_features, low=1)
    f = check_real("factor", factor)
    rng = check_rng(random_state)
    W0 = rng.uniform(0.0, 1.0, size=(d, m))
    W0[:, -1] *= f
    return W0
