"""Sampled clients per CPU-second of the rounds: this engine against a base commit, alternating.

``python benchmarks/round_speed.py [--base COMMIT[,COMMIT...]] [--pairs N] [--num-clients M]
[--rounds T]`` extracts each base commit's ``src`` (``git archive``, default ``c76507f``) into a
temporary folder and runs the same rounds with it and with this checkout's ``src``, A B A B ...
(A B C A B C ... with two bases), each run in its own process with one torch and one BLAS thread: the acceptance workload of ``privmtl pmtl --data
synthetic --model logreg --clients-per-round 200 --epsilon 1 --seed 0`` (PMTL, Ditto's message,
one local epoch), ``T`` rounds (default 30) on ``M`` synthetic clients (default 10 000), seeded
noise so that both engines must release the same billboard (its sha256 is printed and
compared). A run reports the process CPU seconds of its rounds (``time.process_time`` around the
loop), the parts spent taking the sampled clients' rows (``Trainer._round_data``: the data set's
draw), drawing the round plan (``draw_round_plan``) and in local training (the batched loop:
``local_sgd_batched`` and ``local_sgd_sets``, as the engine's trainer calls them), and the wall
seconds. Results: ``benchmarks/results/round_speed.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path

from _paired import ROOT, extract_src, run_worker


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
    import privmtl.federated.trainer as trainer_module

    trainer = Trainer(ds, model, cfg, score_at_end=False)
    parts = {"take": 0.0, "plan": 0.0, "train": 0.0}

    def timed(fn, part):  # type: ignore[no-untyped-def]
        def run(*args, **kwargs):  # type: ignore[no-untyped-def]
            c = time.process_time()
            out = fn(*args, **kwargs)
            parts[part] += time.process_time() - c
            return out

        return run

    trainer._round_data = timed(trainer._round_data, "take")  # type: ignore[method-assign]
    for name, part in [
        ("draw_round_plan", "plan"), ("local_sgd_batched", "train"), ("local_sgd_sets", "train")
    ]:  # fmt: skip
        if hasattr(trainer_module, name):
            setattr(trainer_module, name, timed(getattr(trainer_module, name), part))
    sampled = 0
    c0, w0 = time.process_time(), time.perf_counter()
    for rec in trainer:
        sampled += len(rec.sampled)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    digest = hashlib.sha256()
    for name in sorted(trainer.curator.billboard):
        digest.update(trainer.curator.billboard[name].detach().cpu().numpy().tobytes())
    print(json.dumps({
        "cpu": cpu, "take_cpu": parts["take"], "plan_cpu": parts["plan"],
        "train_cpu": parts["train"], "wall": wall, "sampled": sampled,
        "billboard": digest.hexdigest()[:16],
    }))  # fmt: skip


def _run(src: Path, m: int, rounds: int) -> dict[str, float]:
    return run_worker(__file__, src, ["--num-clients", str(m), "--rounds", str(rounds)])


def _per_client(r: dict[str, float]) -> str:
    us = {k: 1e6 * r[f"{k}_cpu"] / r["sampled"] for k in ("take", "plan", "train")}
    rest = 1e6 * r["cpu"] / r["sampled"] - sum(us.values())
    return " ".join(f"{k} {v:.0f}" for k, v in (*us.items(), ("rest", rest)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="c76507f", help="one commit or several, comma-separated")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--num-clients", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args.num_clients, args.rounds)
        return
    bases = [b for b in args.base.split(",") if b]
    with tempfile.TemporaryDirectory() as tmp:
        engines = {b: extract_src(b, Path(tmp) / b) for b in bases}
        engines["new"] = ROOT / "src"
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
        for i in range(args.pairs):
            for name, src in engines.items():
                r = _run(src, args.num_clients, args.rounds)
                runs[name].append(r)
                rate = r["sampled"] / r["cpu"]
                rest = r["sampled"] / (r["cpu"] - r["take_cpu"])
                print(
                    f"pair {i + 1} {name:7s}: rounds {r['cpu']:.2f} CPU-s ({r['take_cpu']:.2f} "
                    f"taking rows), {r['wall']:.2f} s wall, {rate:.0f} sampled clients per "
                    f"CPU-s ({rest:.0f} without taking rows), us per client: {_per_client(r)}, "
                    f"billboard {r['billboard']}",
                    flush=True,
                )
    med = {
        name: (
            statistics.median(r["sampled"] / r["cpu"] for r in rs),
            statistics.median(r["sampled"] / (r["cpu"] - r["take_cpu"]) for r in rs),
        )
        for name, rs in runs.items()
    }
    for b in bases:
        print(
            f"median sampled clients per CPU-s: {b} {med[b][0]:.0f}, new {med['new'][0]:.0f} "
            f"({med['new'][0] / med[b][0]:.2f}x); without taking rows: {b} {med[b][1]:.0f}, "
            f"new {med['new'][1]:.0f} ({med['new'][1] / med[b][1]:.2f}x)"
        )
    ratios = {
        b: statistics.median(n["cpu"] / o["cpu"] for n, o in zip(runs["new"], runs[b], strict=True))
        for b in bases
    }
    mine = {r["billboard"] for r in runs["new"]}
    print(
        "median paired CPU ratio (new / base): "
        + ", ".join(f"{b} {v:.3f}" for b, v in ratios.items())
        + "; new's billboard "
        + ("the same in every run" if len(mine) == 1 else "DIFFERS between runs")
        + ", "
        + ", ".join(
            f"{'identical to' if {r['billboard'] for r in runs[b]} == mine else 'differs from'} {b}'s"
            for b in bases
        )
    )


if __name__ == "__main__":
    main()
