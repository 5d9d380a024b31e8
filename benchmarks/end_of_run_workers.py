"""Time one ``finetune="auto"`` end of run of 2 048 synthetic clients (two blocks) with
``finish_clients(workers=W)``: ``python benchmarks/end_of_run_workers.py W``. Pair two values of W
with ``farm-bench --vs`` (results: ``benchmarks/results/scale_progress.md``)."""

from __future__ import annotations

import sys
import time

from privmtl.data.streamed import SyntheticFederation
from privmtl.experiments.pmtl import make_model
from privmtl.federated.finish import auto_plan, finish_clients

M = 2048


def main() -> None:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    ds = SyntheticFederation(n_clients=M, random_state=0)
    net = make_model("logreg", ds, 0)
    init = {n: p.detach() for n, p in net.named_parameters()}
    trained = {n: p.unsqueeze(0).repeat(M, *[1] * p.ndim) for n, p in init.items()}
    plan = auto_plan("pmtl", None, 0.001, 0.5, sum(p.numel() for p in init.values()), 200)
    t = time.perf_counter()
    finish_clients(
        "auto", ds, net, trained, init, batch_size=10, seed=0, lr=0.1, lam=0.0, plan=plan,
        workers=workers,
    )  # fmt: skip
    print(f"workers={workers} {time.perf_counter() - t:.1f}s")


if __name__ == "__main__":
    main()
