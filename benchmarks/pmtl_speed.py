"""Speed of the PMTL engine on FEMNIST: batched (torch.func / grouped conv) vs per-client loop.

For each number of clients per round K it runs a few PMTL rounds (FEMNIST CNN, 1 local epoch,
batch 10, fixed-size sampling, clipping and noise on) with

* ``batched``   — all sampled clients trained together (``TrainConfig(batched=True)``;
                  ``vectorize`` chooses the model's grouped-convolution ``forward_batched`` or
                  generic ``vmap``),
* ``reference`` — the per-client Python loop (``batched=False``),

and, as the machine's ceiling, one model doing forward/backward/SGD over the same number of
examples in minibatches of K·B (what the batched path processes per step, without per-client
weights). Privacy accounting is left out of the timings (a stand-in ledger) and measured on its own:
one ``PrivacyLedger.record`` per round with the sampler's event.

Each timed round is the second round of a fresh 2-round run (the first warms up), and the paths are
interleaved (batched, reference, ceiling, batched, ...) because on a shared machine the load drifts.
Reported per (threads, K): median wall seconds per round, median CPU seconds per round (process
time over all threads: robust to other jobs when threads=1), training examples per second
(examples visited by local SGD in the round / wall seconds) and the speed-ups over the loop:
the ratio of the medians, and the median (with min and max) of the per-repetition ratios, which
pairs rounds run back to back and so cancels most of the drift of a shared machine.
Output: a markdown table on stdout and, with --json, a JSON file.

Example::

    python benchmarks/pmtl_speed.py --data ../shared/data/femnist-leaf --clients 20 100 \\
        --repeats 3 --threads 1 2 --json benchmarks/results/pmtl_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info

from privmtl.data.federated import load_leaf
from privmtl.federated import FemnistCNN, TrainConfig, train
from privmtl.privacy.ledger import PrivacyLedger
from privmtl.privacy.sampling import make_sampler


class _NoAccounting:
    """Ledger stand-in so that the timings measure training only."""

    def epsilon_if(self, event: Any) -> float:
        return 0.0

    def record(self, event: Any, *, round: int | None = None, **kw: Any) -> float:
        return 0.0


# benchmarks time the engine with seeded noise (the secure source is timed on its own); a source
# tree from before noise sources existed takes no such field
_SEEDED = {"noise_source": "seeded"} if "noise_source" in TrainConfig.__dataclass_fields__ else {}


def _load() -> tuple[float, float]:
    """(1-minute load average, % CPU stolen by the hypervisor over 0.5 s)."""
    load = os.getloadavg()[0]

    def stat() -> list[int]:
        with open("/proc/stat") as fh:
            return [int(v) for v in fh.readline().split()[1:]]

    try:
        a = stat()
        time.sleep(0.5)
        b = stat()
        d = [y - x for x, y in zip(a, b, strict=True)]
        steal = 100.0 * d[7] / max(sum(d), 1) if len(d) > 7 else float("nan")
    except OSError:
        steal = float("nan")
    return load, steal


def _config(
    k: int, batched: bool, threads: int, args: argparse.Namespace, parallel: bool = False
) -> TrainConfig:
    return TrainConfig(
        method="pmtl",
        rounds=2,  # round 0 warms up (step function, allocator); round 1 is timed
        clients_per_round=k,
        batch_size=args.batch_size,
        lr=0.1,
        lam=0.1,
        clip=0.5,
        noise_std=0.05,
        sampling="fixed",
        relation="replace-one",
        server_update="offset",
        personal_init="model",
        batched=batched,
        vectorize=args.vectorize,
        seed=args.seed,
        progress=False,
        threads=threads,
        parallel_chunks=parallel,
        client_chunk=args.client_chunk or None,
        **_SEEDED,
    )


def engine_round(
    ds: Any, k: int, batched: bool, threads: int, args: argparse.Namespace, parallel: bool = False
) -> dict:
    """Wall and CPU seconds of one PMTL round (the second of a fresh 2-round run)."""
    res = train(
        ds,
        FemnistCNN(variant=args.variant),
        _config(k, batched, threads, args, parallel),
        ledger=_NoAccounting(),
    )
    h = res.history[1]
    return {
        "seconds": h["seconds"],
        "cpu_seconds": h["cpu_seconds"],
        "examples": int(ds.sizes("train")[h["sampled"]].sum()),
    }


def ceiling_round(n_examples: float, k: int, threads: int, args: argparse.Namespace) -> dict:
    """One model: forward + backward + SGD step over n_examples in minibatches of k·B."""
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    model = FemnistCNN(variant=args.variant)
    bsz = k * args.batch_size
    x = torch.rand(bsz, 784, generator=gen)
    y = torch.randint(0, 62, (bsz,), generator=gen)
    steps = max(1, round(n_examples / bsz))
    params = list(model.parameters())

    def run() -> None:
        for _ in range(steps):
            loss = F.cross_entropy(model(x), y)
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                torch._foreach_add_(params, grads, alpha=-0.1)

    run()  # warm-up
    t0, c0 = time.perf_counter(), time.process_time()
    run()
    return {
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - c0,
        "examples": steps * bsz,
        "batch": bsz,
    }


def _paired_ratios(ref: list[float], other: list[float]) -> list[float]:
    """Loop time / path time of each repetition (the paths of one repetition run back to back,
    so the ratio cancels the load drift that the medians of each path keep)."""
    return [a / b for a, b in zip(ref, other, strict=False)]


def _summary(samples: list[dict]) -> dict:
    wall = [r["seconds"] for r in samples]
    cpu = [r["cpu_seconds"] for r in samples]
    ex = samples[0]["examples"]
    med = statistics.median(wall)
    out = {
        "seconds_per_round": med,
        "cpu_seconds_per_round": statistics.median(cpu),
        "seconds_all": wall,
        "cpu_seconds_all": cpu,
        "examples_per_round": ex,
        "examples_per_second": ex / med,
        "examples_per_cpu_second": ex / statistics.median(cpu),
    }
    if "batch" in samples[0]:
        out["batch"] = samples[0]["batch"]
    return out


def time_accounting(m: int, k: int, rounds: int) -> dict:
    ledger = PrivacyLedger(delta=1.0 / m, accountant="rdp", relation="replace-one")
    event = make_sampler("fixed", m, k).event(0.05 * k / 0.5)
    secs = []
    for t in range(max(rounds, 1)):
        t0 = time.perf_counter()
        ledger.record(event, round=t)
        secs.append(time.perf_counter() - t0)
    return {"seconds_per_round": statistics.median(secs), "epsilon": ledger.epsilon()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", required=True, help="LEAF FEMNIST folder (train/ and test/)")
    ap.add_argument("--clients", type=int, nargs="+", default=[20, 100])
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed rounds per path (each after a warm-up round), interleaved",
    )
    ap.add_argument("--batch-size", type=int, default=10)
    ap.add_argument("--threads", type=int, nargs="+", default=[2])
    ap.add_argument("--vectorize", choices=["auto", "vmap", "model"], default="auto")
    ap.add_argument("--variant", choices=["pmtl", "leaf"], default="pmtl")
    ap.add_argument(
        "--paths",
        nargs="+",
        choices=["batched", "parallel", "reference", "ceiling"],
        default=["batched", "parallel", "reference", "ceiling"],
    )
    ap.add_argument(
        "--client-chunk",
        type=int,
        default=8,
        help="TrainConfig.client_chunk of the batched paths (0: all sampled clients at once)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default=None, help="LEAF cache folder (default: user cache)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args()

    ds = load_leaf(args.data, cache_dir=args.cache_dir)
    load_before = _load()
    rows: list[dict[str, Any]] = []
    for threads in args.threads:
        for k in args.clients:
            if k > ds.n_clients:
                print(f"skip K={k}: only {ds.n_clients} clients", file=sys.stderr)
                continue
            samples: dict[str, list[dict]] = {p: [] for p in args.paths}
            for rep in range(args.repeats):  # interleave the paths: the machine load drifts
                for path in args.paths:
                    if path == "ceiling" or (path == "parallel" and threads == 1):
                        continue
                    r = engine_round(
                        ds, k, path != "reference", threads, args, parallel=path == "parallel"
                    )
                    samples[path].append(r)
                    print(
                        f"threads={threads} K={k} rep={rep} {path}: {r['seconds']:.2f} s "
                        f"(cpu {r['cpu_seconds']:.2f} s)",
                        file=sys.stderr,
                    )
                if "ceiling" in args.paths:
                    n = next(
                        (
                            samples[p][-1]["examples"]
                            for p in ("batched", "reference")
                            if samples.get(p)
                        ),
                        float(ds.sizes("train").mean() * k),
                    )
                    samples["ceiling"].append(ceiling_round(n, k, threads, args))
            out: dict[str, Any] = {"threads": threads, "clients_per_round": k}
            out.update({p: _summary(v) for p, v in samples.items() if v})
            out["accounting"] = time_accounting(ds.n_clients, k, 3)
            rows.append(out)
    load_after = _load()

    print(
        f"\nPMTL speed on FEMNIST ({ds.n_clients} clients, CNN '{args.variant}', 1 local epoch, "
        f"B={args.batch_size}, vectorize={args.vectorize}, median of {args.repeats} rounds); "
        f"load avg {load_before[0]:.2f} -> {load_after[0]:.2f}, "
        f"steal {load_before[1]:.0f}% -> {load_after[1]:.0f}%\n"
    )
    print(
        "| threads | clients/round | path | s/round (wall) | CPU s/round | train examples/s "
        "| speed-up vs loop (wall) | (CPU) | paired speed-up: median [min, max] |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for out in rows:
        ref = out.get("reference")
        for path in ("batched", "parallel", "reference", "ceiling"):
            if path not in out:
                continue
            r = out[path]
            sp = f"{ref['seconds_per_round'] / r['seconds_per_round']:.2f}×" if ref else "–"
            spc = (
                f"{ref['cpu_seconds_per_round'] / r['cpu_seconds_per_round']:.2f}×" if ref else "–"
            )
            paired = "–"
            if ref and path != "reference":
                ratios = _paired_ratios(ref["seconds_all"], r["seconds_all"])
                paired = f"{statistics.median(ratios):.2f}× [{min(ratios):.2f}, {max(ratios):.2f}]"
                r["paired_speedup"] = ratios
            label = {"parallel": "batched, chunks in parallel threads"}.get(path, path)
            if path == "ceiling":
                label = f"ceiling (1 model, batch {r['batch']})"
            print(
                f"| {out['threads']} | {out['clients_per_round']} | {label} | "
                f"{r['seconds_per_round']:.2f} | {r['cpu_seconds_per_round']:.2f} | "
                f"{r['examples_per_second']:.0f} | {sp} | {spc} | {paired} |"
            )
        acc = out["accounting"]["seconds_per_round"]
        print(
            f"| {out['threads']} | {out['clients_per_round']} | ledger.record (RDP, fixed-size) "
            f"| {acc:.3f} | – | – | – | – | – |"
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "benchmark": "pmtl_speed",
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": machine_info(),
            "load_before": {"loadavg_1min": load_before[0], "steal_percent": load_before[1]},
            "load_after": {"loadavg_1min": load_after[0], "steal_percent": load_after[1]},
            "results": rows,
        }
        args.json.write_text(json.dumps(payload, indent=2))
        print(f"\nwrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
