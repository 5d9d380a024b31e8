"""CPU of the batched ridge solve (:func:`~privmtl.federated.ridge.ridge_logreg`) on the synthetic
federation: the end of run's fine-tuned-billboard candidate (c = 30) of every client of
``m = 3 000`` clients (LEAF's size law: three quarters of them have fewer padded training rows
than the 61 parameters per class), one thread.

Pair two checkouts with ``farm-bench --vs`` (``PYTHONPATH`` of each ``src``)::

    OMP_NUM_THREADS=1 farm-bench -n 5 --vs "env PYTHONPATH=OLD/src python benchmarks/ridge_solve_cost.py" \
        -- env PYTHONPATH=NEW/src python benchmarks/ridge_solve_cost.py

Prints the solve's CPU seconds and a hash of the models (equal across checkouts only where the
arithmetic is the same).
"""

from __future__ import annotations

import hashlib
import time

import torch

from privmtl.data.federated import make_synthetic_federated
from privmtl.federated.ridge import ridge_logreg

M = 3000


def main() -> None:
    torch.set_num_threads(1)
    ds = make_synthetic_federated(n_clients=M, random_state=0)
    g = torch.Generator().manual_seed(0)
    start = {
        "linear.weight": 0.1 * torch.randn(10, 60, generator=g),
        "linear.bias": torch.zeros(10),
    }
    t = time.process_time()
    (models,) = ridge_logreg(start, ds, (30.0,))
    cpu = time.process_time() - t
    digest = hashlib.sha256(models["linear.weight"].numpy().tobytes()).hexdigest()[:12]
    print(
        f"ridge_logreg m={M}: {cpu:.2f} CPU s, {1e3 * cpu / M:.2f} ms per client, models {digest}"
    )


if __name__ == "__main__":
    main()
