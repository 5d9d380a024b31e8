"""Tests of privmtl.linear.prox against the defining optimisation problems."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.linear.prox import (
    l1_norm,
    l21_norm,
    prox_l1,
    prox_l2sq,
    prox_l21,
    prox_trace_norm,
    trace_norm,
)


def _objective(h, V: np.ndarray, tau: float):
    def f(w: np.ndarray) -> float:
        W = w.reshape(V.shape)
        return 0.5 * float(np.sum((W - V) ** 2)) + tau * h(W)

    return f


@pytest.mark.parametrize(
    ("prox", "h"),
    [
        (prox_trace_norm, trace_norm),
        (prox_l21, l21_norm),
        (prox_l1, l1_norm),
        (prox_l2sq, lambda W: 0.5 * float(np.sum(W**2))),
    ],
)
def test_prox_is_no_worse_than_generic_solver_and_perturbations(prox, h) -> None:
    rng = np.random.default_rng(0)
    V = rng.normal(size=(4, 3))
    tau = 0.8
    P = prox(V, tau)
    f = _objective(h, V, tau)
    fP = f(P.ravel())
    # A generic derivative-free solver must not beat the closed form.
    res = minimize(f, V.ravel(), method="Powell", options={"xtol": 1e-10, "ftol": 1e-12})
    assert fP <= res.fun + 1e-8
    # Strong convexity: f(P + D) >= f(P) + 0.5 ||D||^2 for every perturbation D.
    for _ in range(200):
        D = rng.normal(size=V.shape) * rng.choice([1e-3, 1e-1, 1.0])
        assert f((P + D).ravel()) >= fP + 0.5 * np.sum(D**2) - 1e-10


def test_prox_trace_norm_subgradient_optimality() -> None:
    rng = np.random.default_rng(1)
    V = rng.normal(size=(6, 4))
    s = np.linalg.svd(V, compute_uv=False)
    tau = float((s[1] + s[2]) / 2)  # keeps rank 2
    P = prox_trace_norm(V, tau)
    assert np.linalg.matrix_rank(P, tol=1e-10) == 2
    # V - P in tau * subdifferential of ||P||_*:
    # G = (V - P)/tau = U V^T + R with U^T R = 0, R V = 0, ||R||_2 <= 1.
    G = (V - P) / tau
    U, _, Vt = np.linalg.svd(P)
    Ur, Vr = U[:, :2], Vt[:2].T
    np.testing.assert_allclose(Ur.T @ G @ Vr, np.eye(2), atol=1e-10)
    R = G - Ur @ Ur.T @ G @ Vr @ Vr.T
    np.testing.assert_allclose(Ur.T @ R, 0, atol=1e-10)
    assert np.linalg.norm(R, 2) <= 1 + 1e-10
    np.testing.assert_allclose(np.linalg.svd(P, compute_uv=False)[:2], s[:2] - tau, rtol=1e-10)


def test_prox_l21_rows() -> None:
    V = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    P = prox_l21(V, 1.0)
    np.testing.assert_allclose(P, [[2.4, 3.2], [0.0, 0.0], [0.0, 0.0]])
    assert l21_norm(V) == pytest.approx(5.5)


def test_simple_values_and_zero_tau() -> None:
    V = np.array([[1.5, -0.2], [-3.0, 0.0]])
    np.testing.assert_allclose(prox_l1(V, 0.5), [[1.0, 0.0], [-2.5, 0.0]])
    np.testing.assert_allclose(prox_l2sq(V, 1.0), V / 2)
    for prox in (prox_trace_norm, prox_l21, prox_l1, prox_l2sq):
        np.testing.assert_allclose(prox(V, 0.0), V, atol=1e-12)
    assert trace_norm(np.diag([3.0, 1.0])) == pytest.approx(4.0)
    assert l1_norm(V) == pytest.approx(4.7)


def test_bad_arguments() -> None:
    with pytest.raises(InvalidParameterError, match="tau"):
        prox_trace_norm(np.eye(2), -1.0)
    with pytest.raises(DataFormatError, match="2-D"):
        prox_l21(np.ones(3), 1.0)
