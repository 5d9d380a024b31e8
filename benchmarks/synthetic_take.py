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
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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


def _extract(commit: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "src"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def _run(src: Path, repeats: int) -> dict[str, float]:
    env = {
        **os.environ,
        "PYTHONPATH": str(src),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    cmd = [sys.executable, __file__, "--worker", "--repeats", str(repeats)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


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
        engines = {"base": _extract(args.base, Path(tmp)), "new": ROOT / "src"}
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
