"""Time one ``finetune="auto"`` end of run of M synthetic clients (blocks of 1 024) with
``finish_clients(workers=W)``: ``python benchmarks/end_of_run_workers.py W [SOLVER [M [HOW]]]``
(``SOLVER``: ``local_solver``, default ``sgd``; ``M`` default 2 048; ``HOW``: ``auto``, the
blocks' default, or ``threads``, threads whatever the number of blocks). Pair two values of W
or HOW with ``farm-bench --vs`` (results: ``benchmarks/results/scale_progress.md``)."""

from __future__ import annotations

import sys
import time

from privmtl.data.streamed import SyntheticFederation
from privmtl.experiments.pmtl import make_model
from privmtl.federated import blocks
from privmtl.federated.finish import auto_plan, finish_clients

M = 2048


def main() -> None:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    solver = sys.argv[2] if len(sys.argv) > 2 else "sgd"
    m = int(sys.argv[3]) if len(sys.argv) > 3 else M
    how = sys.argv[4] if len(sys.argv) > 4 else "auto"
    if how == "threads":
        blocks.PROCESS_MIN_BLOCKS = sys.maxsize
    ds = SyntheticFederation(n_clients=m, random_state=0)
    net = make_model("logreg", ds, 0)
    init = {n: p.detach() for n, p in net.named_parameters()}
    trained = {n: p.unsqueeze(0).repeat(m, *[1] * p.ndim) for n, p in init.items()}
    plan = auto_plan("pmtl", None, 0.001, 0.5, sum(p.numel() for p in init.values()), 200)
    t = time.perf_counter()
    finish_clients(
        "auto", ds, net, trained, init, batch_size=10, seed=0, lr=0.1, lam=0.0, plan=plan,
        workers=workers, local_solver=solver,
    )  # fmt: skip
    print(f"workers={workers} solver={solver} m={m} how={how} {time.perf_counter() - t:.1f}s")


if __name__ == "__main__":
    main()
