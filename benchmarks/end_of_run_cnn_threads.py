"""Time the local-training grid of the end of run for 16 FEMNIST clients (CNN, 3 epochs, two step
sizes) with T torch threads: ``python benchmarks/end_of_run_cnn_threads.py T`` (needs
``../shared/data``). Pair T = 2 with T = 1 with ``farm-bench --vs`` (results:
``benchmarks/results/scale_progress.md``)."""

from __future__ import annotations

import sys
import time

import torch

from privmtl.data.registry import load_federated
from privmtl.experiments.pmtl import make_model
from privmtl.federated.local import train_local


def main() -> None:
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    ds = load_federated("femnist-leaf", seed=0).subset(list(range(16)))
    net = make_model("cnn", ds, 0)
    torch.set_num_threads(threads)
    t = time.perf_counter()
    train_local.__wrapped__(ds, net, epochs=(3,), lrs=(0.03, 0.1))  # without its one thread
    print(f"threads={threads} {time.perf_counter() - t:.1f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
