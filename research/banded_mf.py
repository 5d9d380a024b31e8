"""Banded matrix-factorization noise against independent noise, at the same (ε, δ) (issue 32, item 3).

Question: can correlated noise (a factorization A = BC of the prefix-sum workload, released as
B(Cx + z)) make the prefix sums of a run's releases at least 2x more accurate (RMSE) than
independent noise at the same ε, with T >= 50 rounds, when every client takes part in every round;
and what does it buy when clients take part cyclically (b groups, each in every b-th round)?

For T in {50, 100, 200} and participation full (k = T participations, separation 1) or cyclic
with b in {5, 10, 25} groups (k = T/b, separation b) it computes, per unit contribution
(one scalar per round, |u_t| <= 1, add/remove):

* the noise multiplier z of ONE Gaussian release at (ε, δ) = (1, 1e-5), by the exact analytic
  Gaussian mechanism (Balle & Wang 2018), checked against dp-accounting's PLD accountant and
  against the repository's ``banded_epsilon``; every strategy gets noise z · sens(C), so every row
  has the same ε;
* for the strategies identity (independent noise), the Toeplitz square root of A (all T
  diagonals; Fichtenberger et al. 2023), the banded square root (b diagonals) and the optimised
  banded C (``privmtl.privacy.matrix_factorization.optimal_banded_strategy``): the sensitivity
  computed here from the dense C (max over the groups of sum |CᵀC| on the group's rounds, with a
  flag saying whether it is exact) and the prefix-sum RMSE z · sens · ‖AC⁻¹‖_F / √T, and the
  largest per-round error;
* the lower bound of any factorization: for every feasible contribution u and every round t,
  (Au)_t = B_t · Cu <= ‖B_t‖ sens(C), so sens² ‖B_t‖² >= m_t² with m_t the most rounds among the
  first t a client takes part in (t at full participation, ceil(t/b) cyclic): RMSE >= z
  (Σ m_t² / T)^(1/2).

For independent noise under cyclic participation it also calibrates the per-round σ of k
composed Gaussians with dp-accounting (PLD) and checks that it gives the same RMSE.

Run from the repository root (seconds):
``OMP_NUM_THREADS=1 .venv/bin/python research/banded_mf.py``
Writes ``research/results/banded_mf.jsonl`` and ``research/banded_mf.md``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import dp_accounting
import numpy as np
from _common import RESULTS, markdown_table
from dp_accounting import dp_event as dpe
from scipy import optimize, stats

from privmtl.privacy.matrix_factorization import (
    BandedStrategy,
    CyclicParticipation,
    banded_epsilon,
    optimal_banded_strategy,
)

EPSILON, DELTA = 1.0, 1e-5
ROUNDS = (50, 100, 200)
GROUPS = (5, 10, 25)
FULL_BANDS = (2, 8)
LOG = RESULTS / "banded_mf.jsonl"
WRITEUP = Path(__file__).resolve().parent / "banded_mf.md"
COMMAND = "OMP_NUM_THREADS=1 .venv/bin/python research/banded_mf.py"


def analytic_epsilon(z: float, delta: float) -> float:
    """The exact ε of one Gaussian of multiplier z (Balle & Wang 2018, Thm. 8)."""

    def gap(eps: float) -> float:
        return float(
            stats.norm.cdf(0.5 / z - eps * z)
            - math.exp(eps) * stats.norm.cdf(-0.5 / z - eps * z)
            - delta
        )

    return float(optimize.brentq(gap, 0.0, 200.0, xtol=1e-13))


def analytic_multiplier(epsilon: float, delta: float) -> float:
    return float(
        optimize.brentq(lambda z: analytic_epsilon(z, delta) - epsilon, 0.5, 100, xtol=1e-13)
    )


def pld_epsilon(event: dpe.DpEvent, delta: float) -> float:
    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(event)
    return float(acc.get_epsilon(delta))


def dense_sensitivity(C: np.ndarray, groups: int) -> tuple[float, bool]:
    """max over the groups π of (Σ_{i,j∈π} |CᵀC|_ij)^½, and whether it is attained (each group's
    block of CᵀC is diagonal or non-negative)."""
    T = C.shape[0]
    G = C.T @ C
    best, exact = 0.0, True
    for g in range(min(groups, T)):
        p = np.arange(g, T, groups)
        block = G[np.ix_(p, p)]
        best = max(best, float(np.abs(block).sum()))
        off = block - np.diag(np.diag(block))
        exact &= bool(np.all(off >= 0) or np.all(off == 0))
    return math.sqrt(best), exact


def measure(
    T: int, groups: int, name: str, strategy: BandedStrategy, z: float, seconds: float
) -> dict:
    C = strategy.matrix()
    B = np.tril(np.ones((T, T))) @ np.linalg.inv(C)
    sens, exact = dense_sensitivity(C, groups)
    row_sq = (B**2).sum(axis=1)
    part = CyclicParticipation(groups)
    return {
        **_head(T, groups, name, z),
        "bands": strategy.bands,
        "sensitivity": sens,
        "sensitivity_exact": exact,
        "library_sensitivity": strategy.sensitivity(part),
        "rmse": z * sens * math.sqrt(row_sq.sum() / T),
        "max_error": z * sens * math.sqrt(row_sq.max()),
        "epsilon_pld": pld_epsilon(dpe.GaussianDpEvent(z), DELTA),
        "epsilon_library_pld": banded_epsilon(
            strategy, z * sens, part, delta=DELTA, accountant="pld"
        ),
        "optimiser_seconds": seconds,
    }


def _head(T: int, groups: int, name: str, z: float) -> dict:
    """The keys every row starts with: the run, its participation and the noise multiplier."""
    part = CyclicParticipation(groups)
    return {
        "T": T,
        "participation": part.kind,
        "groups": groups,
        "k": part.participations(T),
        "strategy": name,
        "noise_multiplier": z,
    }


def lower_bound(T: int, groups: int, z: float) -> dict:
    m = -(-np.arange(1, T + 1) // groups)  # ceil(t / b): a client's most rounds among the first t
    return {
        **_head(T, groups, "lower bound", z),
        "rmse": z * math.sqrt(float((m.astype(float) ** 2).sum()) / T),
        "max_error": z * float(m.max()),
    }


def main() -> None:
    t0 = time.perf_counter()
    z = analytic_multiplier(EPSILON, DELTA)
    rows: list[dict] = []
    for T in ROUNDS:
        for groups in (1, *GROUPS):
            strategies: list[tuple[str, BandedStrategy, float]] = [
                ("identity", BandedStrategy.identity(T), 0.0),
                ("square root", BandedStrategy.square_root(T), 0.0),
            ]
            bands_list = FULL_BANDS if groups == 1 else (groups,)
            for bands in bands_list:
                if groups > 1:
                    strategies.append(
                        ("banded square root", BandedStrategy.square_root(T, bands), 0.0)
                    )
                s0 = time.perf_counter()
                best = optimal_banded_strategy(T, bands, CyclicParticipation(groups))
                strategies.append(("optimal banded", best, time.perf_counter() - s0))
            measured = [measure(T, groups, n, s, z, sec) for n, s, sec in strategies]
            bound = lower_bound(T, groups, z)
            ident = measured[0]
            for r in [*measured, bound]:
                r["rmse_ratio_identity_over"] = ident["rmse"] / r["rmse"]
                r["max_error_ratio_identity_over"] = ident["max_error"] / r["max_error"]
                assert r["rmse"] >= bound["rmse"] * (1 - 1e-9), r  # the bound holds
            if groups > 1:  # independent noise: k rounds of a per-round σ, composed by PLD
                k = ident["k"]
                sigma = optimize.brentq(
                    lambda s, k=k: (
                        pld_epsilon(dpe.SelfComposedDpEvent(dpe.GaussianDpEvent(s), k), DELTA)
                        - EPSILON
                    ),
                    0.9 * z * math.sqrt(k),
                    1.1 * z * math.sqrt(k),
                    xtol=1e-7,
                )
                ident["rmse_composed_rounds"] = sigma * math.sqrt((T + 1) / 2)
            rows.extend([*measured, bound])
    RESULTS.mkdir(parents=True, exist_ok=True)
    with LOG.open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    write_up(rows, z, time.perf_counter() - t0)


def _f(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}"


def write_up(rows: list[dict], z: float, seconds: float) -> None:
    full = [r for r in rows if r["groups"] == 1]
    cyc = [r for r in rows if r["groups"] > 1]
    header = ["T", "strategy", "bands", "sens", "exact", "RMSE", "identity / this", "max error"]

    def table(sel: list[dict], with_groups: bool) -> str:
        out = []
        for r in sel:
            cells = [r["T"]]
            if with_groups:
                cells += [r["groups"], r["k"]]
            cells += [
                r["strategy"],
                r.get("bands", "-"),
                _f(r["sensitivity"], 3) if "sensitivity" in r else "-",
                {True: "yes", False: "bound"}.get(r.get("sensitivity_exact"), "-"),
                _f(r["rmse"]),
                _f(r["rmse_ratio_identity_over"], 3),
                _f(r["max_error"]),
            ]
            out.append(cells)
        h = header[:1] + (["b", "k"] if with_groups else []) + header[1:]
        return markdown_table(h, out)

    best_full = {
        T: max(
            (r for r in full if r["T"] == T and r["strategy"] != "lower bound"),
            key=lambda r: r["rmse_ratio_identity_over"],
        )
        for T in ROUNDS
    }
    bound_full = {
        T: next(r for r in full if r["T"] == T and r["strategy"] == "lower bound") for T in ROUNDS
    }
    opt_cyc = [r for r in cyc if r["strategy"] == "optimal banded"]
    eps_checks = [r["epsilon_pld"] for r in rows if "epsilon_pld" in r]
    lib_eps = [r["epsilon_library_pld"] for r in rows if "epsilon_library_pld" in r]
    composed = [
        abs(r["rmse_composed_rounds"] / r["rmse"] - 1) for r in rows if "rmse_composed_rounds" in r
    ]
    sens_gap = max(
        abs(r["library_sensitivity"] / r["sensitivity"] - 1) for r in rows if "sensitivity" in r
    )
    lines = [
        "# Banded matrix-factorization noise at full and cyclic participation (issue 32, item 3)",
        "",
        "**Question.** The issue asks for a banded matrix-factorization (MF) release whose "
        "prefix-sum RMSE is at least 2x lower than independent noise's at the same ε with "
        "T >= 50 rounds, when every client takes part in every round. Is that possible, and what "
        "does MF buy when clients take part cyclically?",
        "",
        "**Answer.** Not at full participation: no factorization of the prefix-sum workload, "
        "banded or not, can be more than sqrt(3T/(2T+1)) < 1.23 times better than independent "
        "noise there (proof below), and the best banded strategy found is "
        + ", ".join(
            f"{_f(best_full[T]['rmse_ratio_identity_over'], 3)}x (T = {T}; bound "
            f"{_f(bound_full[T]['rmse_ratio_identity_over'], 3)}x)"
            for T in ROUNDS
        )
        + ". The Toeplitz square root of A, the classic single-participation strategy, is "
        "*worse* than independent noise at full participation. The 2x item is blocked. "
        "With cyclic participation (b groups, each in every b-th round, k = T/b participations, "
        "b rounds apart) the b-banded optimum beats independent noise by "
        + ", ".join(
            f"{_f(r['rmse_ratio_identity_over'], 2)}x (T = {r['T']}, b = {r['groups']})"
            for r in opt_cyc
        )
        + ": at least 2x from b = 10 on, for every T measured.",
        "",
        "## What was built",
        "",
        "`src/privmtl/privacy/matrix_factorization.py` (library only; `docs/privacy-model.md`, "
        "*Correlated noise*): banded strategies (`BandedStrategy`, `optimal_banded_strategy`), "
        "their sensitivity under full and cyclic participation, the online per-round noise "
        "(`BandedNoise`) and its ε (`banded_event`, `banded_epsilon`, `banded_noise_std`); "
        "tests in `tests/privacy/test_matrix_factorization.py`; the maintained table "
        "`benchmarks/banded_mf.py`. `privmtl pmtl` does not offer the release yet.",
        "",
        "## Why full participation cannot gain 2x",
        "",
        "Release B(Cx + z) with A = BC (A: T x T lower-triangular ones), z ~ N(0, z₀² sens(C)² I); "
        "every strategy then has the same noise multiplier z₀, hence the same ε (one Gaussian "
        "mechanism of sensitivity sens(C)). Independent noise is C = I. Under add/remove of one "
        "client contributing u_t (‖u_t‖ <= 1) in every round:",
        "",
        "1. sens(C) >= ‖C1‖ (u_t = e for all t).",
        "2. t = (A1)_t = B_t · (C1) <= ‖B_t‖ ‖C1‖ (Cauchy-Schwarz), so "
        "sens(C)² ‖B_t‖² >= t² for every round t.",
        "3. Summed: total squared error z₀² sens² ‖B‖_F² >= z₀² Σ t² = z₀² T(T+1)(2T+1)/6.",
        "4. C = I: sens = √T, B = A, error z₀² T · T(T+1)/2.",
        "",
        "Ratio of the RMSEs (identity over any C) <= sqrt(3T/(2T+1)) < sqrt(1.5) = 1.225. Step 2 "
        "also bounds the last round alone: sens² ‖B_T‖² >= T² = identity's error at t = T, so no "
        "factorization lowers the *largest* per-round error at all (column `max error`). The "
        "argument holds for every C (banded, Toeplitz or not, any number of bands) and for "
        "vector contributions. It is a bound, not attained (it would need every B_t parallel to "
        "C1): the optimiser's best is between it and identity. The same argument with m_t = "
        "ceil(t/b) (a client's most rounds among the first t) gives the lower bound of the "
        "cyclic tables.",
        "",
        f"## Full participation (k = T, separation 1), ε = {EPSILON:g}, δ = {DELTA:g}",
        "",
        "Noise multiplier of the one Gaussian release: "
        f"z = {z:.6f} (analytic Gaussian mechanism). RMSE of the released prefix sums against the "
        "noiseless ones, per unit contribution bound (|u_t| <= 1), averaged over the T rounds; "
        "`identity / this` > 1 means this strategy is better than independent noise; "
        "`exact`: `yes` when the sensitivity is attained, `bound` when it is the upper bound "
        "Σ|CᵀC| (the strategy's true RMSE is then at most the one shown).",
        "",
        table(full, with_groups=False),
        "",
        "## Cyclic participation (b groups, k = T/b participations, b rounds apart)",
        "",
        "Banded strategies with at most b bands: sens = sqrt(k) x max column norm (the columns "
        "of one client's rounds do not overlap; Choquette-Choo et al. 2023, '(Amplified) Banded "
        "Matrix Factorization', Thm. 2, which holds for any b-separated participation). The "
        "optimiser keeps unit columns, so sens = sqrt(k). The square root (all T bands) is "
        "accounted with its non-negative CᵀC on each group's rounds (exact).",
        "",
        table(cyc, with_groups=True),
        "",
        "## Checks",
        "",
        f"* ε of every row's release, by dp-accounting's PLD accountant at z: "
        f"{min(eps_checks):.5f} to {max(eps_checks):.5f} (analytic: {EPSILON:g}); by the "
        f"library's `banded_epsilon(accountant='pld')` with the dense sensitivity: "
        f"{min(lib_eps):.5f} to {max(lib_eps):.5f}.",
        f"* The library's `BandedStrategy.sensitivity` against the dense computation here: "
        f"largest relative gap {sens_gap:.1e}.",
        f"* Independent noise under cyclic participation, as k composed rounds of one per-round σ "
        f"calibrated by PLD: RMSE within {max(composed):.1e} (relative) of the single-Gaussian "
        "row.",
        "* Every row's RMSE is at or above its lower bound (asserted by the script).",
        "",
        f"Reproduce: `{COMMAND}` ({seconds:.0f} s, one thread, on a shared machine). "
        "Rows: `results/banded_mf.jsonl`. The maintained table: "
        "`../benchmarks/results/banded_mf.md`.",
        "",
    ]
    WRITEUP.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
