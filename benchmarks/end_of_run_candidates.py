"""CPU time per client of one end-of-run candidate computed for every client (the vote's winner).

``finish_clients(select="vote")`` on a synthetic federation of M clients with a fixed winner and
the voters cut to 10 (so the time is the winner's pass: drawing each client's data, training the
candidate, scoring it), one torch thread. The models are a random billboard (the cost does not
depend on its values)::

    OMP_NUM_THREADS=1 python benchmarks/end_of_run_candidates.py 3000 3 2 1

prints, for each candidate index given (``vote_candidates``: 0 trained, 1 local, 2-5 the billboard
grid points), its CPU milliseconds per client.
"""

from __future__ import annotations

import sys
import time

import torch

import privmtl.federated.finish as finish
from privmtl.data.streamed import SyntheticFederation
from privmtl.experiments.pmtl import make_model
from privmtl.federated.finish import auto_plan, finish_clients, vote_candidates


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    m = int(argv[0])
    finish.FINETUNE_VOTERS = 10  # the winner's pass, not the vote's
    ds = SyntheticFederation(n_clients=m, random_state=1)
    net = make_model("logreg", ds, 0)
    gen = torch.Generator().manual_seed(0)
    board = {
        n: p.detach() + 0.1 * torch.randn(p.shape, generator=gen) for n, p in net.named_parameters()
    }
    trained = {n: p.unsqueeze(0).repeat(m, *[1] * p.ndim) for n, p in board.items()}
    dim = sum(p.numel() for p in board.values())
    plan = auto_plan("pmtl", None, 0.001, 0.5, dim, 200)
    names = vote_candidates(plan)
    for pick in argv[1:]:
        j = int(pick)
        t = time.process_time()
        finish_clients(
            "auto", ds, net, trained, board, batch_size=10, seed=0, lr=0.1, lam=0.1, plan=plan,
            select="vote", vote=lambda s, n, j=j: j, score={},
        )  # fmt: skip
        print(f"{names[j]}: {(time.process_time() - t) / m * 1e3:.2f} ms CPU per client")


if __name__ == "__main__":
    main(sys.argv[1:])
