"""Tests of privmtl.linear.losses: values, gradients (finite differences), Lipschitz constants."""

from __future__ import annotations

import numpy as np
import pytest

from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.linear.losses import (
    TaskBatch,
    lipschitz,
    loss_derivative,
    loss_grad,
    loss_value,
    per_sample_loss,
    task_gradients,
    task_lipschitz,
    task_losses,
)


def _task(rng: np.random.Generator, n: int, d: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    X = rng.normal(size=(n, d))
    y = rng.integers(0, 2, size=n).astype(float) if kind == "logistic" else rng.normal(size=n)
    return X, y


def _tasks(seed: int, kind: str, sizes=(5, 9, 1, 7), d: int = 4):
    rng = np.random.default_rng(seed)
    pairs = [_task(rng, n, d, kind) for n in sizes]
    Xs = [p[0] for p in pairs]
    ys = [p[1] for p in pairs]
    W = rng.normal(size=(d, len(sizes)))
    return Xs, ys, W


def test_values_match_definitions() -> None:
    X = np.array([[1.0, 2.0], [0.0, -1.0], [3.0, 1.0]])
    y = np.array([1.0, 0.0, 1.0])
    w = np.array([0.5, -0.25])
    s = X @ w  # [0, 0.25, 1.25]
    sq = 0.5 * np.mean((s - y) ** 2)
    assert loss_value("squared", X, y, w) == pytest.approx(sq, rel=1e-14)
    lg = np.mean(np.log1p(np.exp(-(2 * y - 1) * s)))
    assert loss_value("logistic", X, y, w) == pytest.approx(lg, rel=1e-14)
    assert loss_value("squared", X, y, w, mu=0.2) == pytest.approx(sq + 0.1 * (w @ w), rel=1e-14)


def test_logistic_is_stable_for_large_scores() -> None:
    vals = per_sample_loss("logistic", np.array([1e4, -1e4, 1e4]), np.array([1.0, 0.0, 0.0]))
    np.testing.assert_allclose(vals, [0.0, 0.0, 1e4], atol=1e-12)
    np.testing.assert_allclose(
        loss_derivative("logistic", np.array([1e4, -1e4]), np.array([0.0, 1.0])), [1.0, -1.0]
    )


@pytest.mark.parametrize("kind", ["squared", "logistic"])
@pytest.mark.parametrize("mu", [0.0, 0.3])
def test_gradient_matches_finite_differences(kind: str, mu: float) -> None:
    rng = np.random.default_rng(0)
    X, y = _task(rng, 11, 5, kind)
    w = rng.normal(size=5)
    g = loss_grad(kind, X, y, w, mu=mu)
    h = 1e-6
    fd = np.array(
        [
            (loss_value(kind, X, y, w + h * e, mu=mu) - loss_value(kind, X, y, w - h * e, mu=mu))
            / (2 * h)
            for e in np.eye(5)
        ]
    )
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("kind", ["squared", "logistic"])
def test_lipschitz_bounds_hessian(kind: str) -> None:
    rng = np.random.default_rng(1)
    X, _ = _task(rng, 20, 6, kind)
    L = lipschitz(kind, X, mu=0.1)
    if kind == "squared":
        hess = X.T @ X / 20 + 0.1 * np.eye(6)
        assert L == pytest.approx(np.linalg.eigvalsh(hess)[-1], rel=1e-10)
    else:
        # Hessian at w = 0 attains the 1/4 curvature bound; elsewhere it is smaller.
        for w in (np.zeros(6), rng.normal(size=6)):
            p = 1 / (1 + np.exp(-X @ w))
            hess = (X.T * (p * (1 - p))) @ X / 20 + 0.1 * np.eye(6)
            assert np.linalg.eigvalsh(hess)[-1] <= L * (1 + 1e-12)
        p = np.full(20, 0.5)
        hess0 = (X.T * (p * (1 - p))) @ X / 20 + 0.1 * np.eye(6)
        assert L == pytest.approx(np.linalg.eigvalsh(hess0)[-1], rel=1e-10)


@pytest.mark.parametrize("kind", ["squared", "logistic"])
def test_task_functions_and_batch_agree(kind: str) -> None:
    Xs, ys, W = _tasks(2, kind)
    losses = task_losses(kind, Xs, ys, W, mu=0.05)
    grads = task_gradients(kind, Xs, ys, W, mu=0.05)
    lips = task_lipschitz(kind, Xs, mu=0.05)
    for i in range(W.shape[1]):
        assert losses[i] == pytest.approx(loss_value(kind, Xs[i], ys[i], W[:, i], mu=0.05))
        np.testing.assert_allclose(grads[:, i], loss_grad(kind, Xs[i], ys[i], W[:, i], mu=0.05))
    batch = TaskBatch.from_tasks(Xs, ys)
    assert batch.n_tasks == 4 and batch.n_features == 4
    np.testing.assert_allclose(task_losses(kind, batch, None, W, mu=0.05), losses, rtol=1e-12)
    np.testing.assert_allclose(task_gradients(kind, batch, None, W, mu=0.05), grads, atol=1e-12)
    np.testing.assert_allclose(task_lipschitz(kind, batch, mu=0.05), lips, rtol=1e-10)
    np.testing.assert_allclose(batch.scores(W)[0, :5], Xs[0] @ W[:, 0])


def test_batch_lipschitz_with_tall_tasks() -> None:
    Xs, ys, _ = _tasks(3, "squared", sizes=(12, 3), d=2)
    np.testing.assert_allclose(
        TaskBatch.from_tasks(Xs, ys).lipschitz("squared"), task_lipschitz("squared", Xs), rtol=1e-10
    )


def test_bad_inputs() -> None:
    Xs, ys, W = _tasks(4, "squared")
    with pytest.raises(InvalidParameterError, match="kind"):
        loss_value("hinge", Xs[0], ys[0], W[:, 0])  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="mu"):
        loss_grad("squared", Xs[0], ys[0], W[:, 0], mu=-1.0)
    with pytest.raises(DataFormatError, match="shape"):
        task_gradients("squared", Xs, ys, W[:, :2])
    with pytest.raises(DataFormatError, match="target"):
        task_losses("squared", Xs, ys[:2], W)
    with pytest.raises(DataFormatError, match="task 1"):
        TaskBatch.from_tasks([np.ones((2, 3)), np.ones((2, 4))], [np.ones(2), np.ones(2)])
    with pytest.raises(DataFormatError, match="W must have shape"):
        TaskBatch.from_tasks(Xs, ys).gradients("squared", W[:, :3])
