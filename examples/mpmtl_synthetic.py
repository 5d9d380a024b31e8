"""An MP-MTL estimator on synthetic low-rank tasks: private fit, score and guarantee.

Run: ``python examples/mpmtl_synthetic.py`` (``PRIVMTL_EXAMPLE_SMALL=1`` for a quick version).
"""

from __future__ import annotations

import os

from privmtl.data.synthetic import make_lowrank_tasks
from privmtl.linear.mpmtl import MPMTLLowRank

SMALL = os.environ.get("PRIVMTL_EXAMPLE_SMALL") == "1"


def main() -> None:
    train, test = make_lowrank_tasks(n_tasks=40 if SMALL else 320, random_state=0)
    est = MPMTLLowRank(
        lam=0.1,
        epsilon=1.0,
        iterations=5 if SMALL else 30,
        # A simulation: noise drawn from random_state. Drop both lines for secure noise.
        noise_source="seeded",
        random_state=0,
    ).fit(train.X, train.y)
    print(f"test nMSE: {est.paper_score(test.X, test.y):.3f}")  # score(): R², higher is better
    print(est.privacy_)  # ε, δ, notion, neighbouring relation, sampling, accountant


if __name__ == "__main__":
    main()
