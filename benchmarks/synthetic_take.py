"""CPU per client of taking a round's sampled clients from the synthetic federation, against a base.

``python benchmarks/synthetic_take.py [--base COMMIT] [--pairs N] [--repeats R]`` extracts the
base commit's ``src`` (``git archive``, default ``5a7a739``) into a temporary folder and times
``SyntheticFederation(n_clients=10_000, random_state=0).take(clients, split)`` with it and with
this checkout's ``src``, A B A B ..., each run in its own process with one BLAS thread: ``R``
(default 30) draws of 200 distinct random clients (the acceptance command's round), the same
clients for both engines, ``time.process_time`` around each take, the median over the draws
reported in µs of CPU per client. Splits: ``train`` (a round's take), ``val`` and ``test`` alone,
and ``subset`` (every split of the 200 clients, as the end of the run draws a block). Results:
``benchmarks/results/synthetic_stream.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from _paired import ROOT, extract_src, run_worker

SPLITS = ("train", "val", "test", "subset")


def _worker(repeats: int) -> None:
    """One run in this process (``PYTHONPATH`` says which engine); prints one JSON line."""
    import numpy as np

    from privmtl.data.streamed import SyntheticFederation

    fed = SyntheticFederation(n_clients=10_000, random_state=0)
    rng = np.random.default_rng(123)
    picks = [np.sort(rng.choice(10_000, 200, replace=False)) for _ in range(repeats)]
    out = {}
    for split in SPLITS:
        draw = (
            (lambda p: fed.subset(p.tolist()))
            if split == "subset"
            else (lambda p, s=split: fed.take(p, s))
        )
        draw(picks[0])  # warm
        times = []
        for p in picks:
            c = time.process_time()
            draw(p)
            times.append((time.process_time() - c) / len(p) * 1e6)
        out[split] = statistics.median(times)
    print(json.dumps(out))


def _run(src: Path, repeats: int) -> dict[str, float]:
    return run_worker(__file__, src, ["--repeats", str(repeats)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="5a7a739")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args.repeats)
        return
    runs: dict[str, list[dict[str, float]]] = {"base": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        engines = {"base": extract_src(args.base, Path(tmp)), "new": ROOT / "src"}
        for i in range(args.pairs):
            for name, src in engines.items():
                r = _run(src, args.repeats)
                runs[name].append(r)
                cells = ", ".join(f"{s} {r[s]:.1f}" for s in SPLITS)
                print(f"pair {i + 1} {name:4s}: µs of CPU per client: {cells}", flush=True)
    for s in SPLITS:
        base = statistics.median(r[s] for r in runs["base"])
        new = statistics.median(r[s] for r in runs["new"])
        print(f"median {s}: base {base:.1f}, new {new:.1f} µs per client ({new / base:.2f}x)")


if __name__ == "__main__":
    main()
