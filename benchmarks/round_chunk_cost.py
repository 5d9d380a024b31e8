"""Time the rounds of a logistic regression with ``client_chunk`` C: ``python
benchmarks/round_chunk_cost.py C [M [ROUNDS]]`` (``C``: ``auto``, the default, or a number of
clients; ``M`` default 10 000 synthetic clients, 200 a round, ``ROUNDS`` default 30; seeded noise,
no end of run). Prints the seconds a round and a fingerprint of the released billboard, equal for
every ``C``. Pair two values of C with ``farm-bench --vs`` (results:
``benchmarks/results/scale_progress.md``)."""

from __future__ import annotations

import hashlib
import sys

from privmtl.data.streamed import SyntheticFederation
from privmtl.experiments.pmtl import make_model
from privmtl.federated.config import TrainConfig
from privmtl.federated.engine import train


def main() -> None:
    chunk: int | str = sys.argv[1] if len(sys.argv) > 1 else "auto"
    chunk = chunk if chunk == "auto" else int(chunk)
    m = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    ds = SyntheticFederation(n_clients=m, random_state=0)
    model = make_model("logreg", ds, 0)
    cfg = TrainConfig(
        method="pmtl", rounds=rounds, clients_per_round=200, noise_std=0.01, clip=0.5,
        noise_source="seeded", seed=0, progress=False, client_chunk=chunk,
    )  # fmt: skip
    res = train(ds, model, cfg)
    digest = hashlib.sha256()
    for name in sorted(res.global_params):
        digest.update(res.global_params[name].numpy().tobytes())
    per_round = res.seconds_per_round
    print(f"client_chunk={chunk} m={m} rounds={rounds} {per_round:.3f} s a round "
          f"billboard sha256 {digest.hexdigest()[:16]}")  # fmt: skip


if __name__ == "__main__":
    main()
