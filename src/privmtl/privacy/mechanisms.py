"""Clipping and additive-noise primitives, as pure functions.

Solvers call these; none of them computes ε. The privacy event of a release is emitted by the object
that planned it (a sampler for PMTL, a :class:`~privmtl.privacy.covariance.CovarianceSchedule` for
MP-MTL) and composed by :mod:`privmtl.privacy.accounting`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from privmtl._validation import check_real

if TYPE_CHECKING:
    from privmtl.privacy.noise import NoiseSource

__all__ = [
    "clip_columns",
    "clip_rows",
    "l2_laplace_noise",
    "sample_l2_laplace",
    "symmetric_gaussian_noise",
    "wishart_noise",
    "wishart_support_mismatch",
]


def _clip(A: np.ndarray, bound: float, axis: int) -> np.ndarray:
    b = check_real("clip", bound, low=0.0, closed="neither")
    A = np.asarray(A, dtype=float)
    norms = np.linalg.norm(A, axis=axis, keepdims=True)
    return A / np.maximum(1.0, norms / b)


def clip_columns(W: np.ndarray, bound: float) -> np.ndarray:
    """Scale every column w_i of ``W`` (d×m) to ``w_i / max(1, ‖w_i‖₂/bound)``."""
    return _clip(W, bound, axis=0)


def clip_rows(U: np.ndarray, bound: float) -> np.ndarray:
    """Scale every row of ``U`` to ℓ2 norm at most ``bound`` (rows shorter than it are unchanged)."""
    return _clip(U, bound, axis=1)


def _normal(rng: Any, shape: tuple[int, ...], std: float) -> np.ndarray:
    """``N(0, std²)`` draws from a numpy Generator or a :class:`~privmtl.privacy.noise.NoiseSource`."""
    if isinstance(rng, np.random.Generator):
        return rng.standard_normal(shape) * std
    return np.asarray(rng.normal_numpy(shape, std), dtype=np.float64)


def symmetric_gaussian_noise(dim: int, std: float, rng: Any) -> np.ndarray:
    """Symmetric d×d matrix whose upper triangle (diagonal included) is i.i.d. N(0, std²).

    ``rng`` is a numpy Generator or a :class:`~privmtl.privacy.noise.NoiseSource` (secure or
    seeded); a seeded source wrapping a Generator draws exactly what the Generator would.

    This is the noise of the "Analyze Gauss" mechanism: the upper-triangular vector of w wᵀ has ℓ2
    norm ≤ ‖w‖², so releasing Σ̃ + E has sensitivity K² (add/remove one task with ‖w‖ ≤ K).
    """
    upper = np.triu(_normal(rng, (dim, dim), std))
    return upper + np.triu(upper, 1).T


def wishart_noise(dim: int, scale: float, rng: Any) -> np.ndarray:
    """E ~ Wishart_d(ν = d+1, V = scale·I_d), sampled as GᵀG with G (d+1)×d i.i.d. N(0, scale).

    The MP-MTL paper uses ``scale = K²/(2ε_t)``. Equivalent in law to
    ``scipy.stats.wishart(df=d+1, scale=scale*I)``. ``rng``: a Generator or a NoiseSource.
    """
    G = _normal(rng, (dim + 1, dim), float(np.sqrt(scale)))
    return G.T @ G


def wishart_support_mismatch(E: np.ndarray, w: np.ndarray) -> bool:
    """True when E − w wᵀ is not positive definite.

    For neighbouring inputs with w_i = 0 and w_i' = w, a Wishart release Σ̃ + E is then *impossible*
    under the neighbour: the event that breaks the published ε-DP claim (docs/privacy-model.md).
    """
    M = E - np.outer(w, w)
    try:
        np.linalg.cholesky(M)
    except np.linalg.LinAlgError:
        return True
    return False


def sample_l2_laplace(rng: np.random.Generator, dim: int, scale: float, size: int) -> np.ndarray:
    """Draw ``size`` vectors ``b`` in R^dim with density proportional to ``exp(-||b||_2 / scale)``.

    In ``dim`` dimensions the radius ``r = ||b||`` has density proportional to
    ``r^(dim-1) exp(-r/scale)``, i.e. ``r ~ Gamma(shape=dim, scale=scale)`` (mean ``dim*scale``),
    and the direction is uniform on the sphere. Returns an array of shape ``(dim, size)``.
    """
    direction = rng.standard_normal((dim, size))
    norms = np.linalg.norm(direction, axis=0)
    norms[norms == 0] = 1.0
    radius = rng.gamma(shape=float(dim), scale=float(scale), size=size)
    return np.asarray(direction / norms * radius, dtype=np.float64)


def l2_laplace_noise(
    noise: NoiseSource, rng: np.random.Generator, dim: int, scale: float, size: int
) -> NDArray[np.float64]:
    """Alg. 5 noise, density ∝ exp(-||b|| / scale): from ``rng`` when seeded (the same draws as
    :func:`~privmtl.privacy.mechanisms.sample_l2_laplace`), else from the secure source, with the
    Gamma(dim, scale) radius as ``scale/2`` times a chi-square with ``2 dim`` degrees of freedom
    (a sum of ``dim`` exponentials, each half the squared norm of two standard normals)."""
    if noise.kind == "seeded":
        return sample_l2_laplace(rng, dim, scale, size)
    direction = noise.normal_numpy((dim, size), 1.0)
    norms = np.linalg.norm(direction, axis=0)
    norms[norms == 0] = 1.0
    radius = 0.5 * scale * np.sum(noise.normal_numpy((2 * dim, size), 1.0) ** 2, axis=0)
    return np.asarray(direction / norms * radius, dtype=np.float64)
