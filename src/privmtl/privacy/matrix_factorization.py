r"""Correlated noise for the prefix sums of a run: banded matrix factorization (MF).

A run releases, round after round, the sum :math:`x_t` of the clients' clipped contributions, and
what the clients use is (a function of) the prefix sums :math:`S_t = x_1 + \dots + x_t`, i.e. the
workload :math:`A x` with :math:`A` the :math:`T\times T` lower-triangular matrix of ones.
Independent noise adds :math:`N(0, \sigma^2)` to every :math:`x_t`. The matrix-factorization
mechanism (Denisov et al. 2022; Choquette-Choo et al. 2023) factors :math:`A = BC` with an
invertible lower-triangular *strategy* :math:`C`, releases :math:`Cx + z` with
:math:`z \sim N(0, \sigma^2 I)` and reports :math:`B(Cx + z) = Ax + Bz`. Round :math:`t`'s noisy
aggregate is :math:`x_t + w_t` with :math:`w = C^{-1} z`: the increment
:math:`(Bz)_t - (Bz)_{t-1}` of the prefix sums' noise (:math:`A^{-1}` takes differences and
:math:`A^{-1}B = C^{-1}`). With a *banded* :math:`C` (``bands`` non-zero diagonals)
:math:`w_t` is computed online from :math:`z_t` and the last ``bands - 1`` values of :math:`w`
(:class:`BandedNoise`).

**Privacy.** The whole run is one Gaussian mechanism :math:`x \mapsto Cx + z` whose add/remove
sensitivity depends on when a client takes part (:class:`CyclicParticipation`): a client of
contributions :math:`u_t` (:math:`\|u_t\| \le 1`, zero in the rounds it skips) moves the release
by :math:`\|Cu\|`. Its ε is that of one :class:`~dp_accounting.GaussianDpEvent` of noise multiplier
:math:`\sigma/\mathrm{sens}(C)` (:func:`banded_event`), composed by the repository's accountants.
Because :math:`C` is lower-triangular the guarantee also holds when round :math:`t`'s
contributions depend on the earlier rounds' releases (adaptive streams, Denisov et al. 2022).
:meth:`BandedStrategy.sensitivity` is :math:`\max_\pi (\sum_{i,j\in\pi}|(C^\top C)_{ij}|)^{1/2}`
over the participation patterns :math:`\pi`: an upper bound for every :math:`C`, exact when the
columns of a pattern do not overlap (``bands <= groups``; then it is
:math:`\sqrt{k}\max_i\|C_{:,i}\|` at worst, Choquette-Choo et al. 2023, "(Amplified) Banded
Matrix Factorization", Thm. 2) or when :math:`C^\top C` is non-negative on the pattern.

**What it buys.** At *full* participation (every client in every round) no factorization beats
independent noise by much: a client contributing the same :math:`e` every round gives
:math:`\mathrm{sens}(C) \ge \|C\mathbf 1\|` and :math:`t = (A\mathbf 1)_t = B_t\cdot C\mathbf 1
\le \|B_t\|\,\|C\mathbf 1\|`, so the total squared error :math:`\sigma_1^2\mathrm{sens}^2
\|B\|_F^2 \ge \sigma_1^2\sum_t t^2`, against :math:`\sigma_1^2 T\sum_t t` for :math:`C = I` at
the same noise multiplier :math:`\sigma_1`: the prefix-sum RMSE improves by at most
:math:`\sqrt{3T/(2T+1)} < 1.23`. With *cyclic* participation (clients in ``groups`` groups, each in
every ``groups``-th round) a client takes part :math:`k = \lceil T/b\rceil` times, and a
``groups``-banded :math:`C` pays :math:`\sqrt{k}` times its column norm only, which lowers the
RMSE several-fold as ``groups`` grows (``benchmarks/results/banded_mf.md``).
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from dp_accounting import dp_event as dpe
from scipy.linalg import solve_triangular

from privmtl._validation import check_int, check_real
from privmtl.exceptions import InvalidParameterError
from privmtl.privacy.accounting import compute_epsilon
from privmtl.privacy.calibration import calibrate_noise_multiplier
from privmtl.privacy.guarantee import DEFAULT_ACCOUNTANT, DEFAULT_RELATION
from privmtl.privacy.noise import NoiseSource

__all__ = [
    "FULL_PARTICIPATION",
    "FULL_PARTICIPATION_BANDS",
    "NOISE_MECHANISMS",
    "STRATEGY_FORMAT",
    "BandedNoise",
    "BandedStrategy",
    "CyclicParticipation",
    "banded_epsilon",
    "banded_event",
    "banded_noise_std",
    "optimal_banded_strategy",
    "prefix_sum_coefficients",
    "run_strategy",
]

#: How a run's rounds get their noise: ``"independent"`` (fresh N(0, σ²I) every round) or
#: ``"banded"`` (the banded matrix-factorization noise of :func:`run_strategy`).
NOISE_MECHANISMS = ("independent", "banded")

#: The bands of the strategy at full participation (one group): the optimum of
#: ``benchmarks/results/banded_mf.md`` (any factorization gains < 1.23x there).
FULL_PARTICIPATION_BANDS = 2

#: The ``format`` tag of :meth:`BandedStrategy.to_dict`.
STRATEGY_FORMAT = "privmtl-banded-mf"
_STRATEGY_VERSION = 1


# ------------------------------------------------------------------------------ participation
@dataclass(frozen=True)
class CyclicParticipation:
    """When a client takes part: the clients are split into ``groups`` fixed groups and group
    ``g`` (0-based) takes part in rounds ``g, g + groups, g + 2 groups, ...`` (0-based).

    ``groups = 1`` is full participation (every client in every round,
    :data:`FULL_PARTICIPATION`). A client then takes part at most
    :meth:`participations` ``= ceil(rounds / groups)`` times, ``groups`` rounds apart. A client
    may also skip any of its rounds (its contribution is then zero): the sensitivities cover it.

    Parameters
    ----------
    groups : int >= 1
    """

    groups: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", check_int("groups", self.groups, low=1))

    @property
    def kind(self) -> str:
        """``"full"`` for one group, ``"cyclic"`` otherwise."""
        return "full" if self.groups == 1 else "cyclic"

    def patterns(self, rounds: int) -> list[np.ndarray]:
        """The rounds (0-based) of each group, for a run of ``rounds`` rounds."""
        rounds = check_int("rounds", rounds, low=1)
        return [np.arange(g, rounds, self.groups) for g in range(min(self.groups, rounds))]

    def participations(self, rounds: int) -> int:
        """The most rounds one client takes part in: ``ceil(rounds / groups)``."""
        return -(-check_int("rounds", rounds, low=1) // self.groups)

    def to_dict(self) -> dict[str, Any]:
        return {"participation": self.kind, "groups": self.groups}


#: Every client in every round.
FULL_PARTICIPATION = CyclicParticipation(1)


def _participation(value: CyclicParticipation | str) -> CyclicParticipation:
    if isinstance(value, CyclicParticipation):
        return value
    if value == "full":
        return FULL_PARTICIPATION
    raise InvalidParameterError(
        "The 'participation' parameter must be 'full' or a CyclicParticipation(groups=b); "
        f"got {value!r}."
    )


# ------------------------------------------------------------------------------- the strategy
def prefix_sum_coefficients(count: int) -> np.ndarray:
    r"""The first ``count`` coefficients :math:`\binom{2j}{j}/4^j` of the Toeplitz square root of
    the prefix-sum matrix (Fichtenberger et al. 2023): the lower-triangular Toeplitz matrix of
    them, squared, is :math:`A`."""
    count = check_int("count", count, low=1)
    out = np.ones(count)
    for j in range(1, count):
        out[j] = out[j - 1] * (2 * j - 1) / (2 * j)
    return out


@dataclass(frozen=True)
class BandedStrategy:
    """A lower-triangular banded strategy matrix :math:`C` (module docstring).

    Parameters
    ----------
    coefficients : sequence of sequences of float, shape (rounds, bands)
        ``coefficients[t][j]`` is :math:`C_{t, t-j}`, the entry ``j`` below the diagonal in row
        ``t``; entries with ``j > t`` (above the first row) must be 0 and the diagonal
        (``j = 0``) positive. Stored as a tuple of tuples of floats.

    Attributes
    ----------
    rounds, bands : int
        :math:`T` and the number of non-zero diagonals.
    """

    coefficients: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        try:
            arr = np.asarray(self.coefficients, dtype=np.float64)
        except (TypeError, ValueError):
            raise InvalidParameterError(
                "The 'coefficients' parameter must be a rectangular (rounds, bands) array of "
                f"real numbers; got {self.coefficients!r:.200}."
            ) from None
        if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1 or arr.shape[1] > arr.shape[0]:
            raise InvalidParameterError(
                "The 'coefficients' parameter must be a (rounds, bands) array with "
                f"1 <= bands <= rounds; got shape {arr.shape}."
            )
        if not np.all(np.isfinite(arr)):
            raise InvalidParameterError("The 'coefficients' parameter must be finite.")
        if np.any(arr[:, 0] <= 0):
            t = int(np.argmax(arr[:, 0] <= 0))
            raise InvalidParameterError(
                "The 'coefficients' parameter must have a positive diagonal (column 0), so that "
                f"C is invertible; got {arr[t, 0]!r} in row {t}."
            )
        rows, cols = np.triu_indices(arr.shape[1], k=1)
        if np.any(arr[rows, cols] != 0):
            raise InvalidParameterError(
                "The 'coefficients' parameter must be 0 where j > t (above the matrix's first "
                "row); coefficients[t][j] is C[t, t - j]."
            )
        object.__setattr__(self, "coefficients", tuple(tuple(map(float, r)) for r in arr))

    # ----------------------------------------------------------------------------- builders
    @classmethod
    def from_array(cls, coefficients: np.ndarray) -> BandedStrategy:
        """The strategy of a (rounds, bands) array of coefficients."""
        return cls(tuple(tuple(map(float, r)) for r in np.asarray(coefficients)))

    @classmethod
    def toeplitz(cls, rounds: int, coefficients: Sequence[float] | np.ndarray) -> BandedStrategy:
        """The Toeplitz strategy :math:`C_{t,t-j} = c_j` for ``j < len(coefficients)``."""
        rounds = check_int("rounds", rounds, low=1)
        c = np.asarray(coefficients, dtype=np.float64)
        bands = check_int("bands", int(c.size), low=1, high=rounds)
        arr = np.tile(c, (rounds, 1))
        arr[np.triu_indices(bands, k=1)] = 0.0
        return cls.from_array(arr)

    @classmethod
    def identity(cls, rounds: int) -> BandedStrategy:
        """:math:`C = I`: independent noise in every round."""
        return cls.toeplitz(rounds, [1.0])

    @classmethod
    def square_root(cls, rounds: int, bands: int | None = None) -> BandedStrategy:
        """The Toeplitz square root of :math:`A` (:func:`prefix_sum_coefficients`), cut to its
        first ``bands`` diagonals (all of them by default; cut, it is the banded square root of
        Kalinin & Lampert 2024)."""
        rounds = check_int("rounds", rounds, low=1)
        bands = rounds if bands is None else check_int("bands", bands, low=1, high=rounds)
        return cls.toeplitz(rounds, prefix_sum_coefficients(bands))

    # ---------------------------------------------------------------------------- the matrix
    @property
    def rounds(self) -> int:
        return len(self.coefficients)

    @property
    def bands(self) -> int:
        return len(self.coefficients[0])

    def array(self) -> np.ndarray:
        """The (rounds, bands) coefficients as a float64 array."""
        return np.asarray(self.coefficients, dtype=np.float64)

    def matrix(self) -> np.ndarray:
        """The dense :math:`T\\times T` matrix :math:`C`."""
        arr, T = self.array(), self.rounds
        C = np.zeros((T, T))
        for j in range(self.bands):
            t = np.arange(j, T)
            C[t, t - j] = arr[j:, j]
        return C

    def prefix_noise_matrix(self) -> np.ndarray:
        """:math:`B = AC^{-1}`: the prefix sums' noise is :math:`Bz`."""
        Cinv = solve_triangular(self.matrix(), np.eye(self.rounds), lower=True)
        return np.cumsum(Cinv, axis=0)

    def prefix_rmse(self, noise_std: float) -> float:
        r"""RMSE over the rounds of the noise on the prefix sums,
        :math:`\sigma\|AC^{-1}\|_F/\sqrt T`, for :math:`z \sim N(0, \sigma^2 I)` (per coordinate)."""
        noise_std = check_real("noise_std", noise_std, low=0.0)
        return (
            noise_std * float(np.linalg.norm(self.prefix_noise_matrix())) / math.sqrt(self.rounds)
        )

    def column_norms(self) -> np.ndarray:
        """:math:`\\|C_{:,i}\\|` for every column ``i``."""
        arr, T = self.array(), self.rounds
        sq = np.zeros(T)
        for j in range(self.bands):
            sq[: T - j] += arr[j:, j] ** 2
        return np.sqrt(sq)

    def sensitivity(self, participation: CyclicParticipation | str = "full") -> float:
        r"""Add/remove L2 sensitivity of :math:`x \mapsto Cx` for contributions of norm <= 1.

        :math:`\max_\pi (\sum_{i,j\in\pi}|(C^\top C)_{ij}|)^{1/2}` over the groups' rounds
        :math:`\pi`: an upper bound for every :math:`C`; exact when ``bands <= groups`` (the
        columns of a group do not overlap: the sum of their squared norms) or when
        :math:`C^\top C` is non-negative on the group's rounds (a contribution equal in every
        round attains it).
        """
        part = _participation(participation)
        patterns = part.patterns(self.rounds)
        if self.bands <= part.groups:
            sq = self.column_norms() ** 2
            return math.sqrt(max(float(sq[p].sum()) for p in patterns))
        G = np.abs(self.matrix().T @ self.matrix())
        return math.sqrt(max(float(G[np.ix_(p, p)].sum()) for p in patterns))

    def sensitivity_is_exact(self, participation: CyclicParticipation | str = "full") -> bool:
        """Whether :meth:`sensitivity` is attained (not only an upper bound)."""
        part = _participation(participation)
        if self.bands <= part.groups:
            return True
        G = self.matrix().T @ self.matrix()
        return all(bool(np.all(G[np.ix_(p, p)] >= 0)) for p in part.patterns(self.rounds))

    # ------------------------------------------------------------------------- serialization
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; :meth:`from_dict` reads it back exactly."""
        return {
            "format": STRATEGY_FORMAT,
            "version": _STRATEGY_VERSION,
            "rounds": self.rounds,
            "bands": self.bands,
            "coefficients": [list(r) for r in self.coefficients],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BandedStrategy:
        """Inverse of :meth:`to_dict`; refuses a dict of another format or version, with other
        keys, or whose ``rounds``/``bands`` disagree with its coefficients, naming what differs."""
        if not isinstance(data, dict):
            raise InvalidParameterError(
                f"A banded strategy must be read from a dict; got {type(data).__name__}."
            )
        expected = {"format", "version", "rounds", "bands", "coefficients"}
        if set(data) != expected:
            raise InvalidParameterError(
                f"A banded strategy dict has the keys {sorted(expected)}; got {sorted(data)}."
            )
        if data["format"] != STRATEGY_FORMAT or data["version"] != _STRATEGY_VERSION:
            raise InvalidParameterError(
                f"A banded strategy dict has format {STRATEGY_FORMAT!r} version "
                f"{_STRATEGY_VERSION}; got format {data['format']!r} version {data['version']!r}."
            )
        strategy = cls(data["coefficients"])
        for key in ("rounds", "bands"):
            if data[key] != getattr(strategy, key):
                raise InvalidParameterError(
                    f"The banded strategy dict states {key}={data[key]!r} but its coefficients "
                    f"have {key}={getattr(strategy, key)}."
                )
        return strategy


# ---------------------------------------------------------------------------- the optimiser
def _objective(strategy: BandedStrategy, participation: CyclicParticipation) -> float:
    """Total squared prefix-sum error per unit noise multiplier: sens² ‖AC⁻¹‖_F²."""
    B = strategy.prefix_noise_matrix()
    return strategy.sensitivity(participation) ** 2 * float(np.sum(B**2))


def optimal_banded_strategy(
    rounds: int,
    bands: int,
    participation: CyclicParticipation | str = "full",
    *,
    max_iter: int = 500,
) -> BandedStrategy:
    """The ``bands``-banded lower-triangular :math:`C` of least prefix-sum error at equal ε.

    Minimises :math:`\\mathrm{sens}(C)^2\\|AC^{-1}\\|_F^2` (:meth:`BandedStrategy.sensitivity`;
    the noise multiplier, hence ε, is then the same for every :math:`C`) over the banded entries
    by L-BFGS (torch, float64), from the banded square root
    (:meth:`BandedStrategy.square_root`). When ``bands <= groups`` the columns are kept at unit
    norm (the sensitivity is then :math:`\\sqrt k`, whatever the entries); otherwise the
    objective carries the sensitivity itself. Deterministic; the result is never worse than the
    banded square root it starts from (the better of the two is returned).

    Parameters
    ----------
    rounds : int >= 1
    bands : int in [1, rounds]
    participation : "full" or CyclicParticipation
    max_iter : int >= 1
        L-BFGS iterations.
    """
    import torch

    rounds = check_int("rounds", rounds, low=1)
    bands = check_int("bands", bands, low=1, high=rounds)
    max_iter = check_int("max_iter", max_iter, low=1)
    part = _participation(participation)
    start = BandedStrategy.square_root(rounds, bands)
    if bands == 1:
        return BandedStrategy.identity(rounds)
    dt = torch.float64
    T = rounds
    t_idx = torch.arange(T)[:, None].expand(T, bands)
    j_idx = torch.arange(bands)[None, :].expand(T, bands)
    mask = t_idx >= j_idx
    rows, cols = t_idx[mask], (t_idx - j_idx)[mask]
    eye = torch.eye(T, dtype=dt)
    normalise = bands <= part.groups
    masks = [torch.zeros(T, T, dtype=dt) for _ in part.patterns(T)]
    for m, p in zip(masks, part.patterns(T), strict=True):
        idx = torch.as_tensor(p)
        m[idx[:, None], idx[None, :]] = 1.0
    params = torch.tensor(start.array(), dtype=dt)[mask].clone().requires_grad_(True)

    def build(values: torch.Tensor) -> torch.Tensor:
        C = torch.zeros(T, T, dtype=dt).index_put((rows, cols), values)
        if normalise:
            C = C / C.norm(dim=0, keepdim=True)
        return C

    def loss_of(values: torch.Tensor) -> torch.Tensor:
        C = build(values)
        B = torch.cumsum(torch.linalg.solve_triangular(C, eye, upper=False), dim=0)
        err = (B**2).sum()
        if normalise:
            return err
        G = torch.sqrt((C.T @ C) ** 2 + 1e-30)
        return err * torch.stack([(G * m).sum() for m in masks]).max()

    opt = torch.optim.LBFGS(
        [params],
        max_iter=max_iter,
        history_size=20,
        line_search_fn="strong_wolfe",
        tolerance_grad=1e-12,
        tolerance_change=1e-15,
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = loss_of(params)
        loss.backward()  # type: ignore[no-untyped-call]
        return loss

    opt.step(closure)
    with torch.no_grad():
        C = build(params).numpy()
    arr = np.zeros((T, bands))
    for j in range(bands):
        t = np.arange(j, T)
        arr[j:, j] = C[t, t - j]
    if not np.all(np.isfinite(arr)) or np.any(arr[:, 0] <= 0):
        return start
    found = BandedStrategy.from_array(arr)
    return found if _objective(found, part) < _objective(start, part) else start


# --------------------------------------------------------------------------------- the noise
StandardNormalDraws = NoiseSource | np.random.Generator | Callable[[tuple[int, ...]], np.ndarray]


class BandedNoise:
    r"""Round by round, the noise :math:`w_t = (C^{-1}z)_t` that round ``t``'s aggregate gets.

    :math:`z_t \sim N(0, \sigma^2 I)` of shape ``shape`` is drawn fresh every round and
    :math:`w_t = (z_t - \sum_{j=1}^{b-1} C_{t,t-j} w_{t-j}) / C_{t,t}` keeps the last
    ``bands - 1`` values of :math:`w` (forward substitution of :math:`Cw = z`). Summed over the
    rounds, :math:`w_1 + \dots + w_t = (AC^{-1}z)_t`: the prefix sums carry exactly the
    factorization's noise :math:`Bz`.

    Parameters
    ----------
    strategy : BandedStrategy
    noise_std : float >= 0
        σ of :math:`z` (calibrate it with :func:`banded_noise_std`).
    source : NoiseSource, numpy Generator, or callable
        Where the standard normals come from: a :class:`~privmtl.privacy.noise.NoiseSource`
        (secure or seeded), a numpy ``Generator``, or ``draw(shape)`` returning standard normals.
    shape : tuple of int
        Shape of one round's noise.
    """

    def __init__(
        self,
        strategy: BandedStrategy,
        noise_std: float,
        source: StandardNormalDraws,
        shape: Sequence[int] = (),
    ) -> None:
        if not isinstance(strategy, BandedStrategy):
            raise InvalidParameterError(
                f"The 'strategy' parameter must be a BandedStrategy; got {type(strategy).__name__}."
            )
        if not (isinstance(source, NoiseSource | np.random.Generator) or callable(source)):
            raise InvalidParameterError(
                "The 'source' parameter must be a NoiseSource, a numpy Generator or a callable "
                f"drawing standard normals; got {type(source).__name__}."
            )
        self.strategy = strategy
        self.noise_std = check_real("noise_std", noise_std, low=0.0)
        self.source = source
        self.shape = tuple(check_int("shape", int(s), low=0) for s in shape)
        self._coef = strategy.array()
        self._past: deque[np.ndarray] = deque(maxlen=max(strategy.bands - 1, 1))
        self.round = 0

    def _draw(self) -> np.ndarray:
        if isinstance(self.source, NoiseSource):
            return np.asarray(self.source.normal_numpy(self.shape, self.noise_std))
        if isinstance(self.source, np.random.Generator):
            return self.source.standard_normal(self.shape) * self.noise_std
        z = np.asarray(self.source(self.shape), dtype=np.float64)
        if z.shape != self.shape:
            raise InvalidParameterError(
                f"The 'source' callable must return an array of shape {self.shape}; got {z.shape}."
            )
        return z * self.noise_std

    def next(self) -> np.ndarray:
        """Round ``self.round``'s noise (then the round advances); refuses rounds past ``T``."""
        t = self.round
        if t >= self.strategy.rounds:
            raise InvalidParameterError(
                f"The banded strategy covers {self.strategy.rounds} rounds; round {t} (0-based) "
                "has no noise under it."
            )
        w = self._draw()
        row = self._coef[t]
        for j, past in enumerate(reversed(self._past), start=1):  # w_{t-1}, w_{t-2}, ...
            w = w - row[j] * past
        w = w / row[0]
        if self.strategy.bands > 1:
            self._past.append(w)
        self.round = t + 1
        return w

    def state_dict(self) -> dict[str, Any]:
        """The round and the past noise the next rounds depend on (secret: they are noise)."""
        return {"round": self.round, "past": [p.tolist() for p in self._past]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (the strategy, σ and source are the caller's)."""
        past = [np.asarray(p, dtype=np.float64).reshape(self.shape) for p in state["past"]]
        if len(past) > max(self.strategy.bands - 1, 0):
            raise InvalidParameterError(
                f"A banded noise state of a {self.strategy.bands}-banded strategy holds at most "
                f"{self.strategy.bands - 1} past rounds; got {len(past)}."
            )
        self.round = check_int("round", state["round"], low=0, high=self.strategy.rounds)
        self._past.clear()
        self._past.extend(past)


@functools.lru_cache(maxsize=16)
def run_strategy(rounds: int, groups: int = 1) -> BandedStrategy:
    """The strategy of a training run with banded noise: :func:`optimal_banded_strategy` for
    ``rounds`` rounds and ``groups`` cyclic groups, with ``groups`` bands (the columns of a group
    then do not overlap and the sensitivity is exact), or :data:`FULL_PARTICIPATION_BANDS` at
    full participation (``groups = 1``); never more bands than rounds. Deterministic (and cached):
    the calibration and the release build the same matrix."""
    rounds = check_int("rounds", rounds, low=1)
    groups = check_int("groups", groups, low=1)
    bands = min(rounds, groups if groups > 1 else FULL_PARTICIPATION_BANDS)
    return optimal_banded_strategy(rounds, bands, CyclicParticipation(groups))


# ------------------------------------------------------------------------------ the privacy
def banded_event(
    strategy: BandedStrategy,
    noise_std: float,
    participation: CyclicParticipation | str = "full",
    *,
    bound: float = 1.0,
) -> dpe.GaussianDpEvent:
    """The whole run's privacy event: one Gaussian of multiplier σ / (bound · sens(C)).

    ``bound`` is the norm bound of one client's contribution to one round's sum (γ/q for the
    mean of ``q`` updates clipped to γ)."""
    noise_std = check_real("noise_std", noise_std, low=0.0, closed="neither")
    bound = check_real("bound", bound, low=0.0, closed="neither")
    return dpe.GaussianDpEvent(noise_std / (bound * strategy.sensitivity(participation)))


def banded_epsilon(
    strategy: BandedStrategy,
    noise_std: float,
    participation: CyclicParticipation | str = "full",
    *,
    delta: float,
    bound: float = 1.0,
    accountant: str = DEFAULT_ACCOUNTANT,
    relation: str = DEFAULT_RELATION,
) -> float:
    """ε at ``delta`` of the run (:func:`banded_event`, composed by
    :func:`~privmtl.privacy.accounting.compute_epsilon`)."""
    event = banded_event(strategy, noise_std, participation, bound=bound)
    return compute_epsilon(event, delta=delta, accountant=accountant, relation=relation)


def banded_noise_std(
    strategy: BandedStrategy,
    participation: CyclicParticipation | str = "full",
    *,
    target_epsilon: float,
    delta: float,
    bound: float = 1.0,
    accountant: str = DEFAULT_ACCOUNTANT,
    relation: str = DEFAULT_RELATION,
) -> float:
    """The σ of :math:`z` that meets (``target_epsilon``, ``delta``): the calibrated multiplier
    of one Gaussian (:func:`~privmtl.privacy.calibration.calibrate_noise_multiplier`) times
    ``bound · sens(C)``."""
    bound = check_real("bound", bound, low=0.0, closed="neither")
    z = calibrate_noise_multiplier(
        dpe.GaussianDpEvent,
        target_epsilon=target_epsilon,
        delta=delta,
        accountant=accountant,
        relation=relation,
    )
    return z * bound * strategy.sensitivity(participation)
