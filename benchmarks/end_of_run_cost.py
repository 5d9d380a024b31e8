"""What the end of a run costs, and what cheaper ends of run give (``finetune="auto"``, local-all).

``pmtl``: one ``run_pmtl`` per seed (synthetic logistic regression by default); its rounds run
once and every end-of-run variant finishes the SAME trained run (the end of run is
post-processing of the releases), so the variants are paired exactly; the first variant's result
is the run's own. Each variant is a ``local_solver`` and, for ``ridge``, the prior strengths of
the local and of the fine-tuned-billboard candidates (set through the module constants for the
variant's duration). The noise is the default (OS entropy): a seed's repeat is another trained run.

``local``: :func:`~privmtl.federated.local.train_local` (what ``--method local-all`` runs) on the
synthetic federation: the SGD grid, with early stopping, and ridge solves. ``femnist``: the same
for the FEMNIST CNN on a random subset of writers (the whole 105 take about 20 minutes a grid at
one thread). CPU seconds are this process's (``time.process_time``): the machine is shared, and
wall seconds there measure the neighbours.

Run from the repository root with one thread (the committed numbers):

    OMP_NUM_THREADS=1 python benchmarks/end_of_run_cost.py pmtl --m 3000 --seeds 0 1 2 >> LOG
    OMP_NUM_THREADS=1 python benchmarks/end_of_run_cost.py local --m 1000 --seeds 0 1 2 >> LOG
    OMP_NUM_THREADS=1 python benchmarks/end_of_run_cost.py femnist --clients 10 >> LOG
    python benchmarks/end_of_run_cost.py report LOG

Each run prints one JSON line per measurement; ``report`` prints the Markdown tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

VARIANTS: dict[str, dict[str, Any]] = {
    "sgd": {"solver": "sgd"},
    "ridge l1 b10": {"solver": "ridge", "local": (1.0,), "billboard": (10.0,)},
    "ridge l1 b3": {"solver": "ridge", "local": (1.0,), "billboard": (3.0,)},
    "ridge l1 b30": {"solver": "ridge", "local": (1.0,), "billboard": (30.0,)},
    "ridge l1 b100": {"solver": "ridge", "local": (1.0,), "billboard": (100.0,)},
    "ridge l1 b30, 20 iterations": {
        "solver": "ridge",
        "local": (1.0,),
        "billboard": (30.0,),
        "iterations": 20,
    },
    "ridge l1 b(30,10,3)": {"solver": "ridge", "local": (1.0,), "billboard": (30.0, 10.0, 3.0)},
}


def _finish_variant(pmtl: Any, loaded: Any, trained: Any, request: Any, v: dict[str, Any]) -> Any:
    from privmtl.federated import finish, local, ridge

    saved = (
        finish.AUTO_FINETUNE_RIDGES,
        local.train_local.__kwdefaults__["ridges"],
        ridge.ridge_logreg.__kwdefaults__["iterations"],
    )
    try:
        if v["solver"] == "ridge":
            finish.AUTO_FINETUNE_RIDGES = v["billboard"]
            local.train_local.__kwdefaults__["ridges"] = v["local"]
            ridge.ridge_logreg.__kwdefaults__["iterations"] = v.get("iterations", saved[2])
        run = dataclasses.replace(trained, local_solver=v["solver"])
        return pmtl._ORIGINAL_FINISH(loaded, run, request)
    finally:
        finish.AUTO_FINETUNE_RIDGES = saved[0]
        local.train_local.__kwdefaults__["ridges"] = saved[1]
        ridge.ridge_logreg.__kwdefaults__["iterations"] = saved[2]


def run_pmtl_variants(args: argparse.Namespace) -> None:
    from privmtl.experiments import pmtl

    names = args.variants or list(VARIANTS)
    rows: list[dict[str, Any]] = []

    def finish_all(loaded: Any, trained: Any, request: Any) -> Any:
        first = None
        for name in names:
            t0 = time.perf_counter()
            c0 = time.process_time()
            fin = _finish_variant(pmtl, loaded, trained, request, VARIANTS[name])
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            parts = fin.parts
            rows.append(
                {
                    "variant": name,
                    "end_of_run_s": wall,
                    "end_of_run_cpu_s": cpu,
                    "test_accuracy": parts.get("test_accuracy"),
                    "mean_client_accuracy": parts.get("mean_client_accuracy"),
                    "clients_per_candidate": parts.get("finetune_auto", {}).get(
                        "clients_per_candidate"
                    ),
                }
            )
            first = first or fin
        return first

    pmtl._ORIGINAL_FINISH = pmtl._finish  # type: ignore[attr-defined]
    pmtl._finish = finish_all
    try:
        for seed in args.seeds:
            rows.clear()
            out = pmtl.run_pmtl(
                data=args.data, model="logreg", num_clients=args.m,
                clients_per_round=args.clients_per_round, rounds=args.rounds,
                epsilon=args.epsilon, seed=seed, threads=1, show_progress=False,
                method=args.method,
            )  # fmt: skip
            for row in rows:
                row.update(
                    {
                        "what": "pmtl", "data": args.data, "m": args.m, "seed": seed,
                        "method": args.method, "rounds_s": out["phases"]["rounds"],
                        "epsilon": out["epsilon"], "delta": out["delta"],
                    }
                )  # fmt: skip
                print(json.dumps(row), flush=True)
    finally:
        pmtl._finish = pmtl._ORIGINAL_FINISH


LOCAL_VARIANTS: dict[str, dict[str, Any]] = {
    "sgd": {},
    "sgd patience 5": {"patience": 5},
    "sgd patience 10": {"patience": 10},
    "sgd one client a call": {"client_chunk": 1},
    "sgd one client a call, patience 10": {"client_chunk": 1, "patience": 10},
    "ridge (1)": {"solver": "ridge", "ridges": (1.0,)},
    "ridge (0.3)": {"solver": "ridge", "ridges": (0.3,)},
    "ridge (3,1,0.3)": {"solver": "ridge", "ridges": (3.0, 1.0, 0.3)},
}


def _local_row(what: str, name: str, res: Any, cpu: float, m: int, **extra: Any) -> None:
    acc = res.accuracies["test"]["personalized"]
    print(json.dumps({
        "what": what, "variant": name, "m": m, "cpu_s": cpu, "ms_per_client": 1e3 * cpu / m,
        "test_accuracy": acc["accuracy"], "mean_client_accuracy": acc["mean_client_accuracy"],
        **extra,
    }), flush=True)  # fmt: skip


def run_local(args: argparse.Namespace) -> None:
    """``train_local`` (``--method local-all``) on synthetic logistic regression."""
    from privmtl.data.federated import make_synthetic_federated
    from privmtl.federated.local import train_local
    from privmtl.federated.models import MultinomialLogReg

    for seed in args.seeds:
        ds = make_synthetic_federated(n_clients=args.m, random_state=seed)
        x, _, _ = ds.concat("train")
        model = MultinomialLogReg(x.shape[1], ds.n_classes)
        for name in args.variants or [v for v in LOCAL_VARIANTS if "one client" not in v]:
            c0 = time.process_time()
            res = train_local(ds, model, seed=seed, **LOCAL_VARIANTS[name])
            _local_row("local", name, res, time.process_time() - c0, args.m, seed=seed)


def run_femnist(args: argparse.Namespace) -> None:
    """``train_local`` of the FEMNIST CNN on a random subset of writers (the SGD grid's cost per
    writer, and what early stopping on the writer's own validation split saves)."""
    from privmtl.data.registry import load_federated
    from privmtl.federated.local import train_local
    from privmtl.federated.models import make_model

    ds = load_federated("femnist-leaf", data_path=args.data_path, seed=0)
    rng = np.random.default_rng(args.subset_seed)
    pick = sorted(rng.choice(ds.n_clients, size=args.clients, replace=False).tolist())
    part = ds.subset(pick)
    n_train = int(part.sizes("train").sum())
    for name in args.variants or ["sgd", "sgd patience 5", "sgd patience 10"]:
        model = make_model("cnn", part, 0)
        c0 = time.process_time()
        res = train_local(part, model, **LOCAL_VARIANTS[name])
        cpu = time.process_time() - c0
        _local_row(
            "femnist-local", name, res, cpu, args.clients, of=ds.n_clients,
            train_examples=n_train, all_train_examples=int(ds.sizes("train").sum()),
            subset_seed=args.subset_seed,
        )  # fmt: skip


def report(args: argparse.Namespace) -> None:
    """Markdown tables from the JSON lines: each variant against ``sgd`` of the same seed (the
    same trained run for ``pmtl``), mean and standard deviation over the seeds."""
    rows = [json.loads(line) for line in Path(args.log).read_text().splitlines() if line.strip()]
    for what in ("pmtl", "local", "femnist-local"):
        mine = [r for r in rows if r["what"] == what]
        if not mine:
            continue
        cpu = "end_of_run_cpu_s" if what == "pmtl" else "cpu_s"
        key = "seed" if what != "femnist-local" else "subset_seed"
        base = {(r[key], r.get("rounds_s", 0)): r for r in mine if r["variant"] == "sgd"}
        print(f"\n### {what}\n")
        print(
            "| variant | pairs | CPU s (mean) | sgd CPU / variant CPU | test accuracy | "
            "Δ test acc. vs sgd | mean client acc. | Δ mean client acc. vs sgd |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for name in dict.fromkeys(r["variant"] for r in mine):
            pairs = [(r, base[(r[key], r.get("rounds_s", 0))]) for r in mine
                     if r["variant"] == name and (r[key], r.get("rounds_s", 0)) in base]  # fmt: skip
            if not pairs:
                continue
            speed = [b[cpu] / r[cpu] for r, b in pairs]
            acc = [r["test_accuracy"] for r, _ in pairs]
            mca = [r["mean_client_accuracy"] for r, _ in pairs]
            dacc = [r["test_accuracy"] - b["test_accuracy"] for r, b in pairs]
            dmca = [r["mean_client_accuracy"] - b["mean_client_accuracy"] for r, b in pairs]

            def ms(v: list[float], f: str = ".4f") -> str:
                sd = float(np.std(v, ddof=1)) if len(v) > 1 else 0.0
                return f"{np.mean(v):{f}} ± {sd:{f.lstrip('+')}}"

            print(f"| {name} | {len(pairs)} | {np.mean([r[cpu] for r, _ in pairs]):.1f} | "
                  f"{ms(speed, '.1f')} | {ms(acc)} | {ms(dacc, '+.4f')} | {ms(mca)} | "
                  f"{ms(dmca, '+.4f')} |")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pmtl")
    p.add_argument("--data", default="synthetic")
    p.add_argument("--m", type=int, default=3000)
    p.add_argument("--clients-per-round", type=int, default=200)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--method", default="pmtl")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--variants", nargs="*", choices=list(VARIANTS))
    p = sub.add_parser("local")
    p.add_argument("--m", type=int, default=1000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--variants", nargs="*", choices=list(LOCAL_VARIANTS))
    p = sub.add_parser("femnist")
    p.add_argument("--data-path", default="../shared/data/femnist-leaf")
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--subset-seed", type=int, default=0)
    p.add_argument("--variants", nargs="*", choices=list(LOCAL_VARIANTS))
    p = sub.add_parser("report")
    p.add_argument("log")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    commands = {"pmtl": run_pmtl_variants, "local": run_local, "femnist": run_femnist}
    {**commands, "report": report}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
