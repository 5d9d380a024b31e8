"""Prefix-sum error of banded matrix-factorization noise against independent noise at equal ε.

For T in {50, 200} rounds and participation full (every client every round) or cyclic (b groups,
each in every b-th round, b in {5, 10, 25}), every strategy of
:mod:`privmtl.privacy.matrix_factorization` is calibrated to the same (ε, δ) = (1, 1e-5)
(add/remove, RDP, ``banded_noise_std``) and its RMSE over the rounds of the released prefix sums
against the noiseless ones is computed exactly (``prefix_rmse``) and measured on 400 simulated runs
of the online noise (``BandedNoise``, seeded numpy noise: simulation only). Strategies: identity
(independent noise), the banded square root, the optimised banded strategy, and the lower bound
that no factorization beats (module docstring of ``privmtl.privacy.matrix_factorization``).

Run from the repository root (seconds): ``OMP_NUM_THREADS=1 python benchmarks/banded_mf.py``.
Writes ``benchmarks/results/banded_mf.md``.
"""

from __future__ import annotations

import math
import time

import numpy as np
from _common import RESULTS, markdown_table

from privmtl.privacy.matrix_factorization import (
    BandedNoise,
    BandedStrategy,
    CyclicParticipation,
    banded_epsilon,
    banded_noise_std,
    optimal_banded_strategy,
)

EPSILON, DELTA = 1.0, 1e-5
ROUNDS = (50, 200)
GROUPS = (1, 5, 10, 25)
RUNS, SEED = 400, 0
OUT = RESULTS / "banded_mf.md"
COMMAND = "OMP_NUM_THREADS=1 python benchmarks/banded_mf.py"


def simulated_rmse(strategy: BandedStrategy, noise_std: float, seed: int) -> float:
    """RMSE of the prefix sums' noise over RUNS simulated runs of the online noise."""
    noise = BandedNoise(strategy, noise_std, np.random.default_rng(seed), (RUNS,))
    prefix = np.cumsum([noise.next() for _ in range(strategy.rounds)], axis=0)
    return float(np.sqrt(np.mean(prefix**2)))


def main() -> None:
    t0 = time.perf_counter()
    rows = []
    for T in ROUNDS:
        for b in GROUPS:
            part = CyclicParticipation(b)
            bands = 2 if b == 1 else b
            strategies = [
                ("identity", BandedStrategy.identity(T)),
                ("banded square root", BandedStrategy.square_root(T, bands)),
                ("optimal banded", optimal_banded_strategy(T, bands, part)),
            ]
            base = None
            for name, s in strategies:
                std = banded_noise_std(s, part, target_epsilon=EPSILON, delta=DELTA)
                rmse = s.prefix_rmse(std)
                base = base or rmse
                rows.append(
                    [
                        T,
                        part.kind,
                        b,
                        part.participations(T),
                        name,
                        s.bands,
                        f"{std:.2f}",
                        f"{banded_epsilon(s, std, part, delta=DELTA):.4f}",
                        f"{rmse:.2f}",
                        f"{simulated_rmse(s, std, SEED):.2f}",
                        f"{base / rmse:.2f}",
                    ]
                )
            # the lower bound: ‖B_t‖ sens(C) >= m_t = ceil(t / b), at the same noise multiplier
            z = banded_noise_std(
                BandedStrategy.identity(T), part, target_epsilon=EPSILON, delta=DELTA
            )
            z /= BandedStrategy.identity(T).sensitivity(part)
            m = -(-np.arange(1, T + 1) // b)
            bound = z * math.sqrt(float(np.sum(m.astype(float) ** 2)) / T)
            rows.append(
                [T, part.kind, b, part.participations(T), "lower bound (any C)", "-", "-", "-",
                 f"{bound:.2f}", "-", f"{base / bound:.2f}"]
            )  # fmt: skip
    seconds = time.perf_counter() - t0
    header = [
        "T", "participation", "b", "k", "strategy", "bands", "σ of z", "ε (RDP)",
        "prefix RMSE", f"simulated ({RUNS} runs)", "identity / this",
    ]  # fmt: skip
    text = "\n".join(
        [
            "# Banded matrix-factorization noise against independent noise",
            "",
            f"Every row is calibrated to ε = {EPSILON:g}, δ = {DELTA:g} (add/remove, RDP; "
            "`banded_noise_std`); the ε column is `banded_epsilon` at the calibrated σ. "
            "Contribution bound 1 per round (scalar rounds). `prefix RMSE`: exact RMSE over the "
            "T rounds of the released prefix sums against the noiseless ones; `simulated`: the "
            f"same measured on {RUNS} runs of `BandedNoise` (seeded numpy noise, seed {SEED}). "
            "`identity / this` > 1: better than independent noise. `b`: groups (b = 1 is full "
            "participation); `k`: rounds per client. Full participation uses 2 bands, cyclic b "
            "bands (sensitivity √k × max column norm).",
            "",
            markdown_table(header, rows),
            "",
            "At full participation no factorization gains more than sqrt(3T/(2T+1)) < 1.23x "
            "(the `lower bound` row; proof in `../../research/banded_mf.md`), and the optimised "
            "banded strategy gains about 1.06x. With cyclic participation the b-banded optimum "
            "gains about 2x or more from b = 10 groups on.",
            "",
            f"Reproduce: `{COMMAND}` ({seconds:.0f} s, one thread).",
            "",
        ]
    )
    OUT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
