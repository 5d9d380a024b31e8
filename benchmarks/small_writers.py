"""The end of run on small clients: FEMNIST writers cut down to about 20 training images each.

``python benchmarks/small_writers.py --data-path ../shared/data/femnist-leaf --seeds 0,1,2
[--runs local,local-sgd,pmtl]`` builds, for every seed ``S``, a LEAF-format folder of small
writers outside the repository (``$PRIVMTL_BENCH_CACHE`` or ``~/.cache/privmtl-bench``,
``small-writers-s{S}/``) and runs on it, one thread each, one after the other:

* ``local``: ``privmtl pmtl --data femnist-leaf --data-path F --model cnn --method local-all
  --seed S`` (the default local solver);
* ``local-sgd``: the same with ``--local-solver sgd`` (the SGD grid, the reference);
* ``pmtl``: ``privmtl pmtl --data femnist-leaf --data-path F --model cnn --seed S`` (PMTL at its
  defaults, ε = 1);

and appends a row per run to ``benchmarks/results/small_writers.jsonl`` (test accuracy, mean
client accuracy, the run's own ``seconds``, the CPU seconds of the process). Runs already
recorded (at any commit; ``--rerun``: at this commit) are skipped. ``--report`` prints the markdown table of the rows.

The small writers (seed ``S`` draws them): each of FEMNIST-105's writers (the writers with both
splits) is split into two disjoint pseudo-writers of :data:`PER_WRITER` training images each
(drawn without replacement by ``numpy.random.default_rng([S, 51, k])``), its test images dealt
alternately to the two; a pseudo-writer without a test image is dropped, and a writer with fewer
than ``2 * PER_WRITER`` training images gives one pseudo-writer (or none under ``PER_WRITER``).
The loader then keeps ``floor(0.1 * 22) = 2`` of each pseudo-writer's images for validation,
so every client trains on 20 images: the population of the FEMNIST CNN at a seventh of the
examples per client. ``S`` is both the subsample seed and the run's ``--seed``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, load_jsonl, markdown_table, mean_std

PER_WRITER = 22
"""Training images of a pseudo-writer before the loader's validation split (2 of them)."""
OUT = RESULTS / "small_writers.jsonl"
RUNS = {
    "local": ["--method", "local-all"],
    "local-sgd": ["--method", "local-all", "--local-solver", "sgd"],
    "pmtl": [],
}


def cache_root() -> Path:
    root = os.environ.get("PRIVMTL_BENCH_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "privmtl-bench"


def build(data_path: str, seed: int) -> Path:
    """Write (once) the small-writer LEAF folder of ``seed``; return its path."""
    from privmtl.data.leaf import load_leaf

    folder = cache_root() / f"small-writers-s{seed}"
    if (folder / "test" / "all_data_0.json.gz").is_file():
        return folder
    full = load_leaf(data_path, val_fraction=0.0)
    splits: dict[str, dict[str, Any]] = {
        s: {"users": [], "num_samples": [], "user_data": {}} for s in ("train", "test")
    }
    for k, user in enumerate(full.client_ids):
        rng = np.random.default_rng([seed, 51, k])
        x, y = full.train_x[k].numpy().reshape(len(full.train_y[k]), -1), full.train_y[k].numpy()
        tx, ty = full.test_x[k].numpy().reshape(len(full.test_y[k]), -1), full.test_y[k].numpy()
        rows, test_rows = rng.permutation(len(y)), rng.permutation(len(ty))
        for part in range(min(2, len(y) // PER_WRITER)):
            mine = rows[part * PER_WRITER : (part + 1) * PER_WRITER]
            test_mine = test_rows[part::2]
            if len(test_mine) == 0:
                continue
            name = f"{user}-{'ab'[part]}"
            for split, xs, ys in (
                ("train", x[mine], y[mine]),
                ("test", tx[test_mine], ty[test_mine]),
            ):
                doc = splits[split]
                doc["users"].append(name)
                doc["num_samples"].append(len(ys))
                doc["user_data"][name] = {"x": xs.tolist(), "y": ys.tolist()}
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    for split, doc in splits.items():
        (tmp / split).mkdir(parents=True, exist_ok=True)
        with gzip.open(tmp / split / "all_data_0.json.gz", "wt", encoding="utf-8") as fh:
            json.dump(doc, fh)
    tmp.rename(folder)
    return folder


def commit() -> str:
    here = Path(__file__).resolve().parent
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True
    )
    return out.stdout.strip() or "unknown"


def run_one(folder: Path, seed: int, run: str) -> dict[str, Any]:
    argv = ["pmtl", "--data", "femnist-leaf", "--data-path", str(folder), "--model", "cnn",
            *RUNS[run], "--seed", str(seed), "--threads", "1", "--json", "--quiet"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", "import sys; from privmtl.cli import main; sys.exit(main())"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([*cmd, *argv], capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{run} at seed {seed} failed: {proc.stderr[-2000:]}")
    res = json.loads(proc.stdout)
    extra = res.get("extra", {})
    sel = extra.get("local_selection") or {}
    return {
        "run": run, "seed": seed, "command": "privmtl " + " ".join(argv[:-2]).replace(
            str(folder), f"small-writers-s{seed}"),
        "test_accuracy": res["test_accuracy"],
        "mean_client_accuracy": res.get("mean_client_accuracy"),
        "seconds": res.get("seconds"), "wall_seconds": wall,
        "cpu_seconds": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "phases": res.get("phases"), "solver": sel.get("solver") or res.get("local_solver"),
        "n_clients": res.get("n_clients"), "commit": commit(),
        "clients_per_candidate": (res.get("finetune_auto") or {}).get("clients_per_candidate"),
    }  # fmt: skip


def grid_steps(data_path: str, seed: int, threads: int) -> dict[str, int]:
    """Rows x steps of the local grid's vectorised calls (each call runs its longest client's
    steps for every row; blocks of ``ceil(m / threads)`` clients by position, chunks of 64 by
    size) for the SGD grid, Adam's grid without and with the step budget: the cost, machine
    load aside."""
    from privmtl.data.leaf import load_leaf
    from privmtl.federated.end_of_run.local import ADAM_EPOCHS, LOCAL_EPOCHS, LOCAL_LRS
    from privmtl.federated.end_of_run.local_budget import ADAM_EPOCH_STEPS, client_epochs

    b = -(-load_leaf(data_path, random_state=seed).sizes("train").astype(np.int64) // 10)
    block = -(-len(b) // threads)

    def cost(epochs: np.ndarray, n_lr: int) -> int:
        total = 0
        for lo in range(0, len(b), block):
            steps = np.sort(epochs[lo : lo + block] * b[lo : lo + block])
            total += sum(int(steps[c : c + 64].max()) * len(steps[c : c + 64]) * n_lr
                         for c in range(0, len(steps), 64))  # fmt: skip
        return total

    e_sgd, e_adam = max(LOCAL_EPOCHS), max(ADAM_EPOCHS)
    return {
        "sgd": cost(client_epochs(e_sgd, b, None), len(LOCAL_LRS)),
        "adam_epochs": cost(client_epochs(e_adam, b, None), 1),
        "adam_budget": cost(client_epochs(e_adam, b, ADAM_EPOCH_STEPS), 1),
    }


def femnist_affected(data_path: str, seed: int) -> dict[str, Any]:
    """FEMNIST-105's writers that the step budget changes (fewer than ``ADAM_EPOCH_STEPS``
    minibatches per epoch), their local-all models trained without and with it (Adam's default
    grid, each writer's own choice, the minibatches of the whole population's run): their
    correct test predictions, and the change of FEMNIST-105's pooled test accuracy. Every
    other writer trains exactly the epochs it trained before."""
    import torch

    from privmtl.data.leaf import load_leaf
    from privmtl.experiments.pmtl import make_model
    from privmtl.federated.end_of_run.local import ADAM_EPOCHS, ADAM_LRS, select_per_client
    from privmtl.federated.end_of_run.local_budget import ADAM_EPOCH_STEPS
    from privmtl.federated.end_of_run.local_grid import _train_grid
    from privmtl.federated.scoring import client_scores

    torch.set_num_threads(1)
    ds = load_leaf(data_path, random_state=seed)
    b = -(-ds.sizes("train") // 10)
    pos = np.flatnonzero(b < ADAM_EPOCH_STEPS).tolist()
    part = ds.subset(pos)
    net = make_model("cnn", ds, seed)
    init = {n: p.detach().clone() for n, p in net.named_parameters()}
    buffers = {n: x.detach() for n, x in net.named_buffers()}
    grid = [(e, lr) for e in ADAM_EPOCHS for lr in ADAM_LRS]
    correct = {}
    for name, r in (("before", None), ("after", ADAM_EPOCH_STEPS)):
        models = _train_grid(
            net, buffers, init, part, grid, 10, seed, 64, True, pos, None, None, True, r
        )
        chosen, _, _ = select_per_client(models, net, buffers, *part.split("val"))
        correct[name] = client_scores(net, chosen, buffers, *part.split("test"))[0].tolist()
    n_test = int(ds.sizes("test").sum())
    delta = (sum(correct["after"]) - sum(correct["before"])) / n_test
    return {
        "run": "femnist-105-affected", "seed": seed, "writers": pos,
        "train_n": ds.sizes("train")[pos].tolist(), "test_n": part.sizes("test").tolist(),
        "correct_before": correct["before"], "correct_after": correct["after"],
        "pooled_accuracy_change": delta, "commit": commit(),
    }  # fmt: skip


def report() -> str:
    """The markdown table of the recorded CLI runs: one row per run kind, the seeds side by side
    (the commits they ran at in the last column)."""
    rows = load_jsonl(OUT) if OUT.is_file() else []
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["run"] in RUNS:
            by.setdefault(r["run"], []).append(r)
    table = []
    for run in RUNS:
        rs = sorted(by.get(run, []), key=lambda r: r["seed"])
        if not rs:
            continue
        acc = {r["seed"]: r["test_accuracy"] for r in rs}
        m, sd, n = mean_std(acc.values())
        mc, _, _ = mean_std(r["mean_client_accuracy"] for r in rs)
        cpu, _, _ = mean_std(r["cpu_seconds"] for r in rs)
        table.append([
            f"`{run}`", *(f"{acc[s]:.4f}" if s in acc else "–" for s in (0, 1, 2)),
            f"{m:.4f} ± {sd:.4f} (n={n})", f"{mc:.4f}", f"{cpu:.0f}",
            ", ".join(sorted({r["commit"] for r in rs})),
        ])  # fmt: skip
    return markdown_table(
        ["run", "seed 0", "seed 1", "seed 2", "mean ± sd", "mean client acc.",
         "CPU s (mean)", "commit"], table)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-path")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--runs", default=",".join(RUNS))
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--steps", action="store_true", help="print the grids' vectorised row-steps")
    ap.add_argument(
        "--femnist-affected", action="store_true",
        help="FEMNIST-105's writers the step budget changes, without and with it",
    )  # fmt: skip
    ap.add_argument("--rerun", action="store_true", help="run again what another commit recorded")
    args = ap.parse_args()
    if args.report:
        print(report())
        return
    if not args.data_path:
        ap.error("--data-path is required to run")
    if args.femnist_affected:
        for seed in (int(s) for s in args.seeds.split(",")):
            row = femnist_affected(args.data_path, seed)
            with OUT.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(json.dumps(row))
        return
    if args.steps:
        for seed in (int(s) for s in args.seeds.split(",")):
            for name, path, threads in (
                ("femnist-105", args.data_path, 2),
                ("small-writers", str(build(args.data_path, seed)), 1),
            ):
                print(json.dumps({"data": name, "seed": seed, "threads": threads}
                                 | grid_steps(path, seed, threads)))  # fmt: skip
        return
    here = commit()
    rows = load_jsonl(OUT) if OUT.is_file() else []
    done = {(r["commit"] if args.rerun else here, r["run"], r["seed"]) for r in rows}
    for seed in (int(s) for s in args.seeds.split(",")):
        folder = build(args.data_path, seed)
        for run in args.runs.split(","):
            if run not in RUNS:
                ap.error(f"--runs takes {', '.join(RUNS)}; got {run!r}")
            if (here, run, seed) in done:
                continue
            row = run_one(folder, seed, run)
            with OUT.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(json.dumps({k: row[k] for k in ("run", "seed", "test_accuracy", "cpu_seconds")}))


if __name__ == "__main__":
    main()
