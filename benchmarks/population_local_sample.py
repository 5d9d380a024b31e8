"""Training alone (``--method local-all``) in a population too large to train every client: the
pooled test accuracy of a uniform sample of its clients, with a bootstrap interval.

``privmtl pmtl --data synthetic --num-clients M --method local-all`` trains every client of the
population alone on the SGD grid (:data:`~privmtl.federated.local.LOCAL_EPOCHS` ×
:data:`~privmtl.federated.local.LOCAL_LRS`, each client choosing on its own validation split):
about 6.6 ms of CPU per client, 1.8 CPU-hours at M = 10⁶. A client's local model depends on its
own data and its own minibatch seed only, so the population's answer is estimated without bias
by training a uniform sample of its clients exactly as the full run would (the same clients of
the same seed, :class:`~privmtl.data.streamed.SyntheticFederation`; minibatches seeded by each
client's index in the population) and scoring each on its own test split. The interval is a
percentile bootstrap over the sampled clients of the pooled accuracy (correct predictions over
test examples, the CLI's ``test_accuracy``). ε = 0 towards the other clients.

::

    python benchmarks/population_local_sample.py --m 1000000 --clients 20000 --seed 0

appends one row to ``results/pmtl_population_million.jsonl``. ``--m 1000 --clients 1000
--dry-run`` is the whole population: its accuracy equals the committed local-all cell of the
population study at that seed (a check of the estimator's computation).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, append_jsonl, machine_info

from privmtl.data.streamed import SyntheticFederation
from privmtl.federated.local import train_local
from privmtl.federated.models import make_model
from privmtl.federated.scoring import client_scores

JSONL = RESULTS / "pmtl_population_million.jsonl"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, default=1_000_000, help="clients in the population")
    parser.add_argument("--clients", type=int, default=20_000, help="clients sampled and trained")
    parser.add_argument("--seed", type=int, default=0, help="the population's seed (--seed)")
    parser.add_argument("--sample-seed", type=int, default=12345, help="seed of the sample")
    parser.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--dry-run", action="store_true", help="print the row, append nothing")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    population = SyntheticFederation(n_clients=args.m, random_state=args.seed)
    rng = np.random.default_rng(args.sample_seed)
    size = min(args.clients, args.m)
    idx = np.sort(rng.choice(args.m, size=size, replace=False))
    sample = population.subset(idx.tolist())
    model = make_model("logreg", sample, args.seed)
    alone = train_local(sample, model, seed=args.seed, client_index=idx.tolist(), scores=False)
    assert alone.personalized_params is not None
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    xs, ys = sample.split("test")
    correct, _ = client_scores(model, alone.personalized_params, buffers, xs, ys)
    n_test = np.array([len(y) for y in ys], dtype=np.int64)
    accuracy = float(correct.sum() / n_test.sum())
    boot = np.random.default_rng(args.sample_seed + 1)
    draws = boot.integers(0, size, size=(args.bootstrap, size))
    pooled = correct[draws].sum(1) / n_test[draws].sum(1)
    lo, hi = np.percentile(pooled, [2.5, 97.5])
    has = n_test > 0
    row = {
        "method": "local",
        "m": args.m,
        "seed": args.seed,
        "estimate": "uniform client sample" if size < args.m else "every client",
        "clients_sampled": size,
        "sample_seed": args.sample_seed,
        "test_accuracy": accuracy,
        "test_accuracy_95": [float(lo), float(hi)],
        "mean_client_accuracy": float((correct[has] / n_test[has]).mean()),
        "test_examples": int(n_test.sum()),
        "local_selection": alone.extra.get("local_selection", {}).get("select"),
        "privacy": "epsilon = 0 towards the other clients (nothing leaves a client)",
        "seconds": time.perf_counter() - t0,
        "command": "python benchmarks/population_local_sample.py " + " ".join(sys.argv[1:]),
        "machine": machine_info(),
    }
    print(row)
    if not args.dry_run:
        append_jsonl(JSONL, row)


if __name__ == "__main__":
    main()
