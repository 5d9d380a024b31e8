import itertools
import json
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event as dpe
from scipy import optimize, stats

from privmtl.exceptions import InvalidParameterError
from privmtl.privacy.matrix_factorization import (
    FULL_PARTICIPATION,
    BandedNoise,
    BandedStrategy,
    CyclicParticipation,
    banded_epsilon,
    banded_event,
    banded_noise_std,
    optimal_banded_strategy,
)
from privmtl.privacy.noise import SeededNoise


def _prefix(T):
    return np.tril(np.ones((T, T)))


def _random_banded(rng, rounds, bands, *, nonnegative=False):
    arr = (
        rng.uniform(0.2, 1.0, (rounds, bands)) if nonnegative else rng.normal(size=(rounds, bands))
    )
    arr[:, 0] = rng.uniform(0.5, 1.5, rounds)
    arr[np.triu_indices(bands, k=1)] = 0.0
    return BandedStrategy.from_array(arr)


def _brute_sensitivity(C, patterns):
    """max over the patterns and over every sign vector of ‖C u‖ (a convex function of u in the
    box [-1, 1]^π is largest at a vertex)."""
    best = 0.0
    for p in patterns:
        for signs in itertools.product((-1.0, 1.0), repeat=len(p)):
            best = max(best, float(np.linalg.norm(C[:, list(p)] @ np.asarray(signs))))
    return best


def _separated_patterns(T, k, b):
    """Every set of at most k rounds, any two at least b apart (the (k, b)-participation schema)."""
    for size in range(1, k + 1):
        for p in itertools.combinations(range(T), size):
            if all(q - r >= b for r, q in itertools.pairwise(p)):
                yield p


def _analytic_gaussian_epsilon(z, delta):
    """The exact ε of one Gaussian of multiplier z (Balle & Wang 2018, Thm. 8)."""

    def gap(eps):
        return (
            stats.norm.cdf(0.5 / z - eps * z)
            - math.exp(eps) * stats.norm.cdf(-0.5 / z - eps * z)
            - delta
        )

    return optimize.brentq(gap, 0.0, 100.0, xtol=1e-12)


# -------------------------------------------------------------------------------- the strategy
def test_the_square_root_squares_to_the_prefix_sum_matrix():
    C = BandedStrategy.square_root(30).matrix()
    np.testing.assert_allclose(C @ C, _prefix(30), atol=1e-12)
    # cut to 4 bands it keeps the first 4 coefficients 1, 1/2, 3/8, 5/16
    cut = BandedStrategy.square_root(30, 4)
    assert cut.coefficients[10] == (1.0, 0.5, 0.375, 0.3125)
    assert cut.coefficients[1] == (1.0, 0.5, 0.0, 0.0)


def test_prefix_noise_matrix_is_a_times_c_inverse():
    s = _random_banded(np.random.default_rng(0), 12, 4)
    B = s.prefix_noise_matrix()
    np.testing.assert_allclose(B @ s.matrix(), _prefix(12), atol=1e-10)
    assert s.prefix_rmse(2.0) == pytest.approx(2.0 * np.linalg.norm(B) / math.sqrt(12))


# ----------------------------------------------------------------------------------- the noise
@pytest.mark.parametrize("bands", [1, 2, 5])
def test_online_noise_is_the_dense_factorizations_noise(bands):
    T, shape, std = 11, (3, 2), 0.7
    s = _random_banded(np.random.default_rng(bands), T, bands)
    noise = BandedNoise(s, std, np.random.default_rng(5), shape)
    W = np.stack([noise.next() for _ in range(T)]).reshape(T, -1)
    Z = std * np.random.default_rng(5).standard_normal((T, *shape)).reshape(T, -1)
    C, B = s.matrix(), s.prefix_noise_matrix()
    np.testing.assert_allclose(W, np.linalg.solve(C, Z), atol=1e-10)
    BZ = B @ Z  # the noise of the prefix sums
    np.testing.assert_allclose(np.cumsum(W, axis=0), BZ, atol=1e-10)
    np.testing.assert_allclose(W[1:], BZ[1:] - BZ[:-1], atol=1e-10)
    with pytest.raises(InvalidParameterError, match="covers 11 rounds"):
        noise.next()


def test_noise_sources_seeded_and_callable_give_the_same_correlation():
    s = BandedStrategy.square_root(6, 3)
    seeded = BandedNoise(s, 1.5, SeededNoise(3), (4,))
    W = np.stack([seeded.next() for _ in range(6)])
    reference = SeededNoise(3)
    Z = np.stack([reference.normal_numpy((4,), 1.5) for _ in range(6)])
    np.testing.assert_allclose(s.matrix() @ W, Z, atol=1e-12)
    rng = np.random.default_rng(1)
    drawn = BandedNoise(s, 1.0, rng.standard_normal, (4,))
    Wc = np.stack([drawn.next() for _ in range(6)])
    np.testing.assert_allclose(
        s.matrix() @ Wc, np.random.default_rng(1).standard_normal((6, 4)), atol=1e-12
    )
    bad = BandedNoise(s, 1.0, lambda shape: np.zeros(3), (4,))
    with pytest.raises(InvalidParameterError, match=r"shape \(4,\)"):
        bad.next()
    with pytest.raises(InvalidParameterError, match="'source'"):
        BandedNoise(s, 1.0, 7, (4,))
    with pytest.raises(InvalidParameterError, match="'noise_std'"):
        BandedNoise(s, -1.0, rng, (4,))


# ----------------------------------------------------------------------------- the sensitivity
@pytest.mark.parametrize(("T", "groups", "bands"), [(8, 1, 1), (9, 3, 3), (9, 3, 2), (10, 2, 2)])
def test_sensitivity_is_exact_against_brute_force_when_columns_do_not_overlap(T, groups, bands):
    rng = np.random.default_rng(T * 10 + groups)
    for _ in range(3):
        s = _random_banded(rng, T, bands)  # any signs
        part = CyclicParticipation(groups)
        assert s.sensitivity_is_exact(part)
        brute = _brute_sensitivity(s.matrix(), part.patterns(T))
        assert s.sensitivity(part) == pytest.approx(brute, rel=1e-12)
        # and within the (k, b)-participation bound sqrt(k) · max column norm (Choquette-Choo
        # et al. 2023, Thm. 2), which every (k, b)-separated pattern respects
        k = part.participations(T)
        bound = math.sqrt(k) * s.column_norms().max()
        assert s.sensitivity(part) <= bound + 1e-12
        schema = _brute_sensitivity(s.matrix(), list(_separated_patterns(T, k, groups)))
        assert schema <= bound + 1e-12


def test_the_k_b_bound_is_attained_by_a_toeplitz_band():
    T, b = 9, 3
    s = BandedStrategy.toeplitz(T, [1.0, -0.4, 0.3])
    part = CyclicParticipation(b)
    schema = _brute_sensitivity(s.matrix(), list(_separated_patterns(T, 3, b)))
    assert s.sensitivity(part) == pytest.approx(schema, rel=1e-12)
    assert schema == pytest.approx(math.sqrt(3) * s.column_norms().max(), rel=1e-12)


@pytest.mark.parametrize("groups", [1, 2])
def test_overlapping_columns_are_exact_when_non_negative_and_bounded_otherwise(groups):
    T, part = 8, CyclicParticipation(groups)
    rng = np.random.default_rng(groups)
    positive = _random_banded(rng, T, 4, nonnegative=True)
    assert positive.sensitivity_is_exact(part)
    assert positive.sensitivity(part) == pytest.approx(
        _brute_sensitivity(positive.matrix(), part.patterns(T)), rel=1e-12
    )
    mixed = BandedStrategy.toeplitz(T, [1.0, 0.6, -0.5, 0.4])
    assert not mixed.sensitivity_is_exact(part)
    brute = _brute_sensitivity(mixed.matrix(), part.patterns(T))
    assert mixed.sensitivity(part) >= brute * (1 - 1e-12)  # an upper bound, never lower
    if groups == 1:  # and a strict one here: the signs of C^T C do not factor as s_i s_j
        assert mixed.sensitivity(part) > 1.1 * brute


def test_full_participation_sensitivity_of_the_square_root_is_its_row_sums_norm():
    s = BandedStrategy.square_root(40)
    assert s.sensitivity("full") == pytest.approx(np.linalg.norm(s.matrix() @ np.ones(40)))
    assert BandedStrategy.identity(40).sensitivity(FULL_PARTICIPATION) == pytest.approx(
        math.sqrt(40)
    )
    assert BandedStrategy.identity(40).sensitivity(CyclicParticipation(8)) == pytest.approx(
        math.sqrt(5)
    )


# ------------------------------------------------------------------------------- the optimiser
@pytest.mark.parametrize("T", [12, 50])
def test_full_participation_gains_less_than_the_lower_bound_allows(T):
    """No factorization beats independent noise by more than sqrt(3T/(2T+1)) in prefix-sum RMSE
    at the same ε when every client takes part in every round (module docstring)."""
    identity = BandedStrategy.identity(T)
    best = optimal_banded_strategy(T, 2, "full")

    def rmse(s):
        return s.prefix_rmse(s.sensitivity("full"))  # noise multiplier 1 for every strategy

    assert rmse(best) < rmse(identity)  # the optimiser finds a (small) gain...
    assert rmse(identity) / rmse(best) < math.sqrt(3 * T / (2 * T + 1))  # ...within the bound
    lower = math.sqrt(sum(t * t for t in range(1, T + 1)) / T)
    for s in (best, BandedStrategy.square_root(T), _random_banded(np.random.default_rng(T), T, 3)):
        assert rmse(s) >= lower


def test_cyclic_optimum_beats_independent_noise_and_the_banded_square_root():
    T, b = 50, 10
    part = CyclicParticipation(b)
    best = optimal_banded_strategy(T, b, part)
    assert best.bands == b and best.sensitivity_is_exact(part)
    np.testing.assert_allclose(best.column_norms(), 1.0, rtol=1e-9)

    def rmse(s):
        return s.prefix_rmse(s.sensitivity(part))

    bsr = BandedStrategy.square_root(T, b)
    assert rmse(best) < rmse(bsr) < rmse(BandedStrategy.identity(T))
    assert rmse(BandedStrategy.identity(T)) / rmse(best) > 2.0


def test_optimiser_is_deterministic_and_checks_its_parameters():
    a = optimal_banded_strategy(20, 4, CyclicParticipation(4), max_iter=50)
    assert a == optimal_banded_strategy(20, 4, CyclicParticipation(4), max_iter=50)
    assert optimal_banded_strategy(20, 1, "full") == BandedStrategy.identity(20)
    with pytest.raises(InvalidParameterError, match=r"'bands' parameter must be in \[1, 20\]"):
        optimal_banded_strategy(20, 21)
    with pytest.raises(InvalidParameterError, match="'participation'"):
        optimal_banded_strategy(20, 2, "cyclic")
    with pytest.raises(InvalidParameterError, match="'groups'"):
        CyclicParticipation(0)


# --------------------------------------------------------------------------------- the privacy
@pytest.mark.parametrize(("groups", "bands"), [(1, 3), (3, 3), (3, 2)])
def test_epsilon_equals_an_independent_computation(groups, bands):
    T, std, delta = 9, 6.0, 1e-5
    part = CyclicParticipation(groups)
    s = _random_banded(np.random.default_rng(groups + bands), T, bands, nonnegative=True)
    sens = _brute_sensitivity(s.matrix(), part.patterns(T))
    # the exact ε of one Gaussian, by the analytic formula, against the PLD accountant
    exact = _analytic_gaussian_epsilon(std / sens, delta)
    assert banded_epsilon(s, std, part, delta=delta, accountant="pld") == pytest.approx(
        exact, rel=2e-3
    )
    # dp-accounting's RDP accountant on the brute-force multiplier, against the repository's
    orders = [1 + x / 10 for x in range(1, 100)] + list(range(11, 128))
    rdp = dp_accounting.rdp.RdpAccountant(orders=orders)
    rdp.compose(dpe.GaussianDpEvent(std / sens))
    ours = banded_epsilon(s, std, part, delta=delta)
    assert exact < ours
    assert ours == pytest.approx(rdp.get_epsilon(delta), rel=0.02)


def test_independent_noise_under_cyclic_participation_is_the_composition_of_its_rounds():
    """C = I with b groups: one Gaussian of multiplier σ/√k is k rounds of multiplier σ each."""
    T, b, std, delta = 40, 8, 3.0, 1e-5
    k = 5
    composed = dpe.SelfComposedDpEvent(dpe.GaussianDpEvent(std), k)
    pld = dp_accounting.pld.PLDAccountant()
    pld.compose(composed)
    got = banded_epsilon(
        BandedStrategy.identity(T), std, CyclicParticipation(b), delta=delta, accountant="pld"
    )
    assert got == pytest.approx(pld.get_epsilon(delta), rel=1e-3)


def test_calibrated_noise_meets_the_target_and_scales_with_the_bound():
    s, part = BandedStrategy.square_root(30, 5), CyclicParticipation(5)
    std = banded_noise_std(s, part, target_epsilon=1.0, delta=1e-5)
    eps = banded_epsilon(s, std, part, delta=1e-5)
    assert 0.999 < eps <= 1.0
    assert banded_noise_std(s, part, target_epsilon=1.0, delta=1e-5, bound=0.1) == pytest.approx(
        0.1 * std
    )
    event = banded_event(s, std, part, bound=0.1)
    assert event.noise_multiplier == pytest.approx(std / (0.1 * s.sensitivity(part)))
    with pytest.raises(InvalidParameterError, match="'noise_std'"):
        banded_event(s, 0.0, part)


# ---------------------------------------------------------------------------- serialization
def test_strategy_round_trips_through_json_exactly():
    s = optimal_banded_strategy(15, 3, CyclicParticipation(3), max_iter=30)
    back = BandedStrategy.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s
    assert back.to_dict()["rounds"] == 15 and back.to_dict()["bands"] == 3


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rounds": 14}, "rounds=14"),
        ({"bands": 4}, "bands=4"),
        ({"format": "other"}, "format 'other'"),
        ({"version": 2}, "version 2"),
        ({"extra": 1}, "keys"),
        ({"coefficients": [[1.0, 0.5], [1.0, 0.5]]}, "0 where j > t"),
        ({"coefficients": [[1.0, 0.0], [-1.0, 0.5]]}, "positive diagonal"),
        ({"coefficients": [[1.0, 0.0], [1.0]]}, "rectangular"),
    ],
)
def test_from_dict_refuses_a_mismatched_dict(change, message):
    data = {**BandedStrategy.square_root(15, 3).to_dict(), **change}
    with pytest.raises(InvalidParameterError, match=message):
        BandedStrategy.from_dict(data)
    data = BandedStrategy.square_root(15, 3).to_dict()
    del data["bands"]
    with pytest.raises(InvalidParameterError, match="keys"):
        BandedStrategy.from_dict(data)
