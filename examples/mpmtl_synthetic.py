"""An MP-MTL estimator on synthetic low-rank tasks: private fit, score, guarantee and baseline.

Run: ``python examples/mpmtl_synthetic.py`` (``PRIVMTL_EXAMPLE_SMALL=1`` for a quick version on 40
tasks instead of the paper's 320, where the private estimator has less to share).
"""

from __future__ import annotations

import os

from privmtl.data.synthetic import make_lowrank_tasks
from privmtl.linear.mpmtl import MPMTLLowRank
from privmtl.linear.stl import STLRidge

SMALL = os.environ.get("PRIVMTL_EXAMPLE_SMALL") == "1"


def main() -> None:
    train, test = make_lowrank_tasks(n_tasks=40 if SMALL else 320, random_state=0)
    est = MPMTLLowRank(
        epsilon=1.0,  # the estimator's defaults otherwise (δ = 1e-5)
        # A simulation: noise drawn from random_state. Drop both lines for secure noise.
        noise_source="seeded",
        random_state=0,
    ).fit(train.X, train.y)
    stl = STLRidge(lam="cv").fit(train.X, train.y)  # each task alone, its own penalty: no sharing
    private, alone = est.paper_score(test.X, test.y), stl.paper_score(test.X, test.y)
    print(f"test nMSE: {private:.3f} (each task alone: {alone:.3f}; lower is better)")
    print(est.privacy_)  # ε, δ, notion, neighbouring relation, sampling, accountant


if __name__ == "__main__":
    main()
