"""Your own federated method, run with privmtl's release, accounting and ledger.

``OwnMethod`` is an APFL-style mixture (Deng et al. 2020, "Adaptive personalized federated
learning"), none of privmtl's methods: every sampled client trains a copy of the billboard (its
message is that copy's change, FedAvg's) and, on the same minibatches, its own model; it keeps
the mixture ``alpha * own + (1 - alpha) * copy``. The message depends on the billboard and the
client's own data only, and the curator clips, averages, noises and records it as for any
method, so the guarantee is the one the ledger reports.

Run: ``privmtl pmtl --method examples/own_method.py:OwnMethod --data synthetic --epsilon 1``,
or ``python examples/own_method.py`` (``PRIVMTL_EXAMPLE_SMALL=1`` for a few seconds' version).
On Flower: ``privmtl flower local --method examples/own_method.py:OwnMethod --data synthetic
--model logreg --epsilon 1`` (every machine needs this file; each checks its SHA-256).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import ClassVar

from privmtl.experiments.pmtl import run_pmtl
from privmtl.federated.methods import ClientStep, Method, TrainFn

SMALL = os.environ.get("PRIVMTL_EXAMPLE_SMALL") == "1"


class OwnMethod(Method):
    """Own model and a billboard copy trained side by side; the client keeps their mixture."""

    name: ClassVar[str] = "own-mixture"
    start: ClassVar[str] = "own"  # the client starts from its own (mixed) model
    message: ClassVar[str] = "offset"  # the trained copy minus the billboard
    # its hooks only train, keep and send the clients' models: Flower's nodes run it too
    backends: ClassVar[tuple[str, ...]] = ("in-process", "flower")
    alpha: float = 0.5  # weight of the client's own model in the mixture it keeps

    def client_update(
        self,
        billboard: dict,
        shared: Sequence[str],
        starts: dict,
        anchor: dict | None,
        train: TrainFn,
    ) -> ClientStep:
        own, losses = train(starts, self.rule(None))
        copies = {
            n: billboard[n].unsqueeze(0).expand_as(p).clone() if n in billboard else p.clone()
            for n, p in starts.items()
        }
        glob, _ = train(copies, self.rule(None))
        kept = {n: self.alpha * own[n] + (1 - self.alpha) * glob[n] for n in own}
        return ClientStep(kept, self.messages(billboard, shared, starts, glob), losses)


def main() -> None:
    out = run_pmtl(
        method=OwnMethod,
        data="synthetic",
        num_clients=20 if SMALL else 50,
        rounds=5 if SMALL else 50,
        epsilon=1.0,
        finetune="none",
        show_progress=False,
    )
    print(
        f"{out['method']}: test accuracy {out['test_accuracy']:.3f} at "
        f"epsilon {out['epsilon']:.3g} (delta {out['delta']:.2g}, from the ledger)"
    )


if __name__ == "__main__":
    main()
