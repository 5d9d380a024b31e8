"""Sampled clients per CPU-second of the rounds: this engine against a base commit, alternating.

``python benchmarks/round_speed.py [--base COMMIT] [--pairs N] [--num-clients M] [--rounds T]``
extracts the base commit's ``src`` (``git archive``, default ``c76507f``) into a temporary folder
and runs the same rounds with it and with this checkout's ``src``, A B A B ..., each run in its
own process with one torch and one BLAS thread: the acceptance workload of ``privmtl pmtl --data
synthetic --model logreg --clients-per-round 200 --epsilon 1 --seed 0`` (PMTL, Ditto's message,
one local epoch), ``T`` rounds (default 30) on ``M`` synthetic clients (default 10 000), seeded
noise so that both engines must release the same billboard (its sha256 is printed and
compared). A run reports the process CPU seconds of its rounds (``time.process_time`` around the
loop), the part spent taking the sampled clients' rows (``Trainer._round_data``: the data set's
draw) and the wall seconds. Results: ``benchmarks/results/round_speed.md``.
"""

from __future__ import annotations

import argparse
import hashlib
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


def _worker(m: int, rounds: int) -> None:
    """One run in this process (``PYTHONPATH`` says which engine); prints one JSON line."""
    import torch

    from privmtl.data.streamed import SyntheticFederation
    from privmtl.experiments.pmtl import make_model
    from privmtl.federated.config import TrainConfig
    from privmtl.federated.trainer import Trainer

    torch.set_num_threads(1)
    ds = SyntheticFederation(n_clients=m, random_state=0)
    model = make_model("logreg", ds, 0)
    cfg = TrainConfig(
        method="pmtl", rounds=rounds, clients_per_round=200, epsilon=1.0, clip=0.5,
        noise_source="seeded", seed=0, progress=False, threads=1,
    )  # fmt: skip
    trainer = Trainer(ds, model, cfg, score_at_end=False)
    take = [0.0]
    inner = trainer._round_data

    def timed(clients):  # type: ignore[no-untyped-def]
        c = time.process_time()
        out = inner(clients)
        take[0] += time.process_time() - c
        return out

    trainer._round_data = timed  # type: ignore[method-assign]
    sampled = 0
    c0, w0 = time.process_time(), time.perf_counter()
    for rec in trainer:
        sampled += len(rec.sampled)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    digest = hashlib.sha256()
    for name in sorted(trainer.curator.billboard):
        digest.update(trainer.curator.billboard[name].detach().cpu().numpy().tobytes())
    print(json.dumps({
        "cpu": cpu, "take_cpu": take[0], "wall": wall, "sampled": sampled,
        "billboard": digest.hexdigest()[:16],
    }))  # fmt: skip


def _extract(commit: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "src"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def _run(src: Path, m: int, rounds: int) -> dict[str, float]:
    env = {
        **os.environ,
        "PYTHONPATH": str(src),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    cmd = [sys.executable, __file__, "--worker", "--num-clients", str(m), "--rounds", str(rounds)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="c76507f")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--num-clients", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args.num_clients, args.rounds)
        return
    with tempfile.TemporaryDirectory() as tmp:
        engines = {"base": _extract(args.base, Path(tmp)), "new": ROOT / "src"}
        runs: dict[str, list[dict[str, float]]] = {"base": [], "new": []}
        for i in range(args.pairs):
            for name, src in engines.items():
                r = _run(src, args.num_clients, args.rounds)
                runs[name].append(r)
                rate = r["sampled"] / r["cpu"]
                rest = r["sampled"] / (r["cpu"] - r["take_cpu"])
                print(
                    f"pair {i + 1} {name:4s}: rounds {r['cpu']:.2f} CPU-s ({r['take_cpu']:.2f} "
                    f"taking rows), {r['wall']:.2f} s wall, {rate:.0f} sampled clients per "
                    f"CPU-s ({rest:.0f} without taking rows), billboard {r['billboard']}",
                    flush=True,
                )
    same = {r["billboard"] for rs in runs.values() for r in rs}
    med = {
        name: (
            statistics.median(r["sampled"] / r["cpu"] for r in rs),
            statistics.median(r["sampled"] / (r["cpu"] - r["take_cpu"]) for r in rs),
        )
        for name, rs in runs.items()
    }
    print(
        f"median sampled clients per CPU-s: base {med['base'][0]:.0f}, new {med['new'][0]:.0f} "
        f"({med['new'][0] / med['base'][0]:.2f}x); without taking rows: base "
        f"{med['base'][1]:.0f}, new {med['new'][1]:.0f} ({med['new'][1] / med['base'][1]:.2f}x); "
        f"billboards {'identical' if len(same) == 1 else 'DIFFER'}"
    )


if __name__ == "__main__":
    main()
