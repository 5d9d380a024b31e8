"""CPU cost per client of the streamed synthetic federation (one thread, process CPU time).

Usage: ``OMP_NUM_THREADS=1 python benchmarks/synthetic_draw_cost.py [m] [repeats]``. Prints, per
client of the population: building :class:`~privmtl.data.streamed.SyntheticFederation` (the
shared part and the size draw; each client has its own random stream), ``take(range(m), "test")`` (the scoring pass's draw)
``subset`` of a block of 1 024 clients (the
scoring pass's blocks, all three splits), scoring that block (random personalized and global
logistic regressions on its validation and test splits) and a round's draw of 200 clients at random positions (``take(..., "train")``), the fastest of
``repeats`` runs each, and a fingerprint of the data drawn (equal before and after a change that
keeps the clients bit-identical).
"""

from __future__ import annotations

import hashlib
import sys
import time

import numpy as np
import torch

from privmtl.data.streamed import SyntheticFederation
from privmtl.federated.models import MultinomialLogReg
from privmtl.federated.scoring import evaluate_dataset


def _best(fn, repeats):  # type: ignore[no-untyped-def]
    best, out = float("inf"), None
    for _ in range(repeats):
        c0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - c0)
    return best, out


def main() -> None:
    m = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    build, fed = _best(lambda: SyntheticFederation(n_clients=m, random_state=0), repeats)
    scoring, (x, y, _) = _best(lambda: fed.take(range(m), "test"), repeats)
    block = min(m, 1024)
    sub, piece = _best(lambda: fed.subset(range(block)), repeats)
    net = MultinomialLogReg(fed.n_features, fed.n_classes, zero_init=False)
    gen = torch.Generator().manual_seed(0)
    own = {n: torch.randn((block, *p.shape), generator=gen) for n, p in net.named_parameters()}
    glob = {n: p.detach() for n, p in net.named_parameters()}
    models = {"personalized": (own, True), "global": (glob, False)}
    torch.set_num_threads(1)
    score, scores = _best(lambda: evaluate_dataset(net, models, {}, piece), repeats)
    picks = np.sort(np.random.default_rng(1).choice(m, size=200, replace=False))
    rnd, (rx, ry, _) = _best(lambda: fed.take(picks, "train"), repeats)
    h = hashlib.sha256()
    for a in (x, y, rx, ry):
        h.update(a.numpy().tobytes())
    print(
        f"m={m}  build {build / m * 1e6:.1f} us/client  take(test, all) "
        f"{scoring / m * 1e6:.1f} us/client  subset (block of {block}) "
        f"{sub / block * 1e6:.1f} us/client  scoring it (val + test, own and global models) "
        f"{score / block * 1e6:.1f} us/client  round draw (200 train) {rnd * 1e3:.1f} ms  "
        f"content {fed.content_sha256()[:12]}  block {piece.content_sha256()[:12]}  drawn {h.hexdigest()[:12]}  "
        f"scores {scores['test']['personalized']['accuracy']:.6f}"
    )


if __name__ == "__main__":
    main()
