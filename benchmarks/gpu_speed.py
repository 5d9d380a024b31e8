"""Speed and memory of the in-process engine on every device this machine has (CPU, and CUDA).

For each device (``cpu`` always, ``cuda`` where ``torch.cuda.is_available()``), model and
population size m it runs private PMTL on the built-in synthetic federation (ε = 2, seeded noise,
Poisson sampling of ``q`` clients per round on average, ``finetune="none"``) through :class:`privmtl.federated.trainer.Trainer`
with ``TrainConfig(device=...)`` and reports

* the rounds' clients per second (clients trained, clipped and released per wall second of the
  rounds),
* the end of run's clients per second (every client's models scored on validation and test:
  ``Trainer.result()``; ``finetune="none"``, so no local fine-tuning),
* the peak memory: the process's maximum resident set (``resource.getrusage``) on the CPU, and
  ``torch.cuda.max_memory_allocated`` on CUDA.

Each setting runs in its own subprocess, so the peak memory is that setting's. The noise of every
release is drawn on the CPU whatever the device (as in every run). Where this machine has no
CUDA, only CPU rows are written; run the same command on a machine with a GPU for the CUDA rows
next to the CPU ones.

Output: ``benchmarks/results/gpu_speed.json`` and ``.md`` (or ``--out PREFIX``).

Example (the committed result)::

    python benchmarks/gpu_speed.py --ms 1000 10000 --clients-per-round 200 --rounds 20

A fuller GPU run::

    python benchmarks/gpu_speed.py --ms 1000 10000 100000 --clients-per-round 200 --rounds 20 \\
        --models logreg mlp

(``mlp`` is the generic ``vmap`` path; on a CPU it is several times slower than ``logreg``.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, machine_info, markdown_table

#: Width of the hidden layer of ``--models mlp``.
MLP_HIDDEN = 64


def _peak_memory_mb(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    import resource

    # Linux reports kilobytes, macOS bytes
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (2**20 if sys.platform == "darwin" else 2**10)


def measure(device: str, model: str, m: int, q: int, rounds: int, threads: int) -> dict[str, Any]:
    """One setting in this process: build, run the rounds, then the end of run."""
    import torch

    from privmtl.data.registry import load_federated
    from privmtl.federated.config import TrainConfig
    from privmtl.federated.models import make_model
    from privmtl.federated.trainer import Trainer

    torch.set_num_threads(threads)
    ds = load_federated("synthetic", num_clients=m, seed=0)
    if model == "mlp":  # a small hidden layer: the engine's generic vmap path, not logreg's
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Linear(ds.n_features, MLP_HIDDEN),
            torch.nn.ReLU(),
            torch.nn.Linear(MLP_HIDDEN, ds.n_classes),
        )
    else:
        net = make_model(model, ds, 0)
    config = TrainConfig(
        method="pmtl",
        rounds=rounds,
        clients_per_round=q,
        epsilon=2.0,
        clip=0.5,
        noise_source="seeded",
        progress=False,
        threads=threads,
        device=device,
    )
    trainer = Trainer(ds, net, config)
    sync = torch.cuda.synchronize if trainer.device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in trainer:
        pass
    sync()
    t_rounds = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = trainer.result()
    sync()
    t_end = time.perf_counter() - t0
    trained = sum(int(rec["n_sampled"]) for rec in trainer.history)
    return {
        "device": str(trainer.device),
        "model": model,
        "m": m,
        "clients_per_round": q,
        "rounds": rounds,
        "threads": threads,
        "rounds_seconds": t_rounds,
        "rounds_clients_per_second": trained / t_rounds,
        "end_seconds": t_end,
        "end_clients_per_second": m / t_end,
        "peak_memory_mb": _peak_memory_mb(str(trainer.device)),
        "memory_kind": "cuda max_memory_allocated"
        if trainer.device.type == "cuda"
        else "process max RSS",
        "epsilon": float(result.epsilon),
        "test_accuracy": float(result.test_accuracy),
    }


def _gpu_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def _devices() -> list[str]:
    import torch

    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def _one(args: argparse.Namespace, device: str, model: str, m: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--one", device, model, str(m),
           "--clients-per-round", str(args.clients_per_round), "--rounds", str(args.rounds),
           "--threads", str(args.threads)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{device} {model} m={m} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(rows: list[dict[str, Any]], command: str, machine: dict[str, Any]) -> str:
    header = ["device", "model", "m", "q", "rounds", "rounds: clients/s", "end of run: clients/s",
              "peak memory (MiB)", "memory measured as"]  # fmt: skip
    table = [
        [r["device"], r["model"], r["m"], r["clients_per_round"], r["rounds"],
         f"{r['rounds_clients_per_second']:.0f}", f"{r['end_clients_per_second']:.0f}",
         f"{r['peak_memory_mb']:.0f}", r["memory_kind"]]
        for r in rows
    ]  # fmt: skip
    has_cuda = any(r["device"].startswith("cuda") for r in rows)
    note = (
        "CPU and CUDA rows were measured on the same machine."
        if has_cuda
        else "This machine has no CUDA: only the CPU rows are here. The same command on a machine "
        "with a GPU adds the CUDA rows beside the CPU ones."
    )
    return "\n".join([
        "# In-process engine speed by device",
        "",
        "Private PMTL on the synthetic federation (ε = 2, δ = min(1e-5, 1/(100 m)), add-remove, "
        "Poisson sampling (q expected clients per round), RDP accountant, seeded noise drawn on the CPU), `finetune=\"none\"`. "
        "Rounds: clients trained and released per wall second of the rounds. End of run: clients "
        "scored (validation and test) per wall second of `Trainer.result()`. Peak memory: the "
        "process's maximum resident set on the CPU, `torch.cuda.max_memory_allocated` on CUDA "
        "(each setting runs in its own process).",
        "",
        note,
        "",
        f"Machine: {machine['cpus']} CPUs, torch {machine['torch']}, "
        f"{rows[0]['threads'] if rows else 1} torch thread(s) on the CPU; "
        f"GPU: {machine.get('gpu') or 'none'}.",
        "",
        markdown_table(header, table),
        "",
        f"Reproduce: `{command}`",
        "",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ms", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--clients-per-round", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument(
        "--models",
        nargs="+",
        default=["logreg"],
        help="logreg, or mlp (one hidden layer of MLP_HIDDEN units); the data are tabular",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads on the CPU")
    ap.add_argument("--devices", nargs="+", default=None, help="default: cpu, and cuda if present")
    ap.add_argument("--out", default=str(RESULTS / "gpu_speed"), help="output path prefix")
    ap.add_argument("--one", nargs=3, metavar=("DEVICE", "MODEL", "M"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        device, model, m = args.one
        row = measure(device, model, int(m), args.clients_per_round, args.rounds, args.threads)
        print(json.dumps(row))
        return 0
    rows = []
    for device in args.devices or _devices():
        for model in args.models:
            for m in args.ms:
                row = _one(args, device, model, m)
                print(json.dumps(row), flush=True)
                rows.append(row)
    shown = argv if argv is not None else sys.argv[1:]
    command = " ".join(["python benchmarks/gpu_speed.py", *shown])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = {**machine_info(), "gpu": _gpu_name()}
    doc = {"machine": machine, "command": command, "rows": rows}
    out.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    out.with_suffix(".md").write_text(report(rows, command, machine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
