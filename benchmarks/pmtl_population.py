"""Population study: where private collaboration pays off as the number of clients grows.

The synthetic federation of ``privmtl pmtl --data synthetic --num-clients M``
(:func:`privmtl.data.federated.make_synthetic_federated` with ``n_clients = M``, every other
generator parameter at its documented default: d = 20 features, C = 10 classes, 20-200 examples per
client, model spread τ = 1 around a shared model, feature shift 0.5), multinomial logistic
regression, Poisson client sampling of ``q = min(M, 200)`` clients per round, T = 200 rounds, the
CLI's other defaults (γ = 0.5, η = 0.1, λ = 0.1, B = 10, one local epoch) except the client message,
which is ``--server-update offset`` (the authors' code; the CLI's default ``delta`` overshoots with
partial participation). Privacy: client-level (ε, δ = 1/M)-DP of the billboard sequence,
add/remove-one-client relation, Poisson subsampling, RDP accountant; σ calibrated to ε; noise
from the seeded source (``--reproducible-noise``: a research simulation, not a deployment).
Every client is scored on its own test split (pooled accuracy over all test examples), including
clients that were sampled rarely or never.

Each run is the command printed in the ``command`` field of its JSONL row, e.g.::

    privmtl pmtl --data synthetic --num-clients 10000 --model logreg --method pmtl --epsilon 1 \\
        --clients-per-round 200 --rounds 200 --server-update offset --reproducible-noise \\
        --seed 0 --json

Modes::

    python benchmarks/pmtl_population.py study --ms 100 1000 10000 --seeds 0
    python benchmarks/pmtl_population.py report      # markdown table + PNG from the JSONL
    python benchmarks/pmtl_population.py speed --m 10000 --clients-per-round 100 --rounds 5

``speed`` times rounds of the engine at ``m`` clients with persistent personalized models (seconds
per round, wall and CPU) and reports the peak resident memory of the process.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, append_jsonl, load_jsonl, machine_info, mean_std

EPSILONS: tuple[float | None, ...] = (0.5, 1.0, 2.0, 4.0, None)
METHODS = ("pmtl", "fedavg", "local")
JSONL = RESULTS / "pmtl_population.jsonl"


def argv_for(method: str, m: int, eps: float | None, rounds: int, q: int) -> list[str]:
    """The ``privmtl pmtl`` arguments of one run (without --seed and --json)."""
    if method == "local":  # every client trains alone, epochs and lr chosen on validation
        return [
            "--data", "synthetic", "--num-clients", str(m), "--model", "logreg",
            "--method", "local-all", "--quiet",
        ]  # fmt: skip
    argv = [
        "--data", "synthetic", "--num-clients", str(m), "--model", "logreg",
        "--method", method, "--clients-per-round", str(min(q, m)), "--rounds", str(rounds),
        "--reproducible-noise", "--quiet",
    ]  # fmt: skip
    if method == "pmtl":  # the runs committed start clients from the billboard (explicit: the
        argv += ["--personal-init", "billboard"]  # CLI default is "auto" now)
    if eps is not None:
        argv += ["--epsilon", f"{eps:g}"]
    return argv


def _kwargs(argv: list[str]) -> dict[str, Any]:
    """``run_pmtl`` keyword arguments equal to the CLI arguments ``argv`` (one torch thread)."""
    kw: dict[str, Any] = {"show_progress": False, "threads": 1}
    it = iter(argv)
    for flag in it:
        if flag == "--quiet":
            continue
        if flag == "--reproducible-noise":
            kw["noise_source"] = "seeded"
            continue
        value = next(it)
        key = flag[2:].replace("-", "_")
        if key in ("num_clients", "clients_per_round", "rounds"):
            kw[key] = int(value)
        elif key in ("epsilon", "lam"):
            kw[key] = float(value)
        else:
            kw[key] = value
    return kw


def _row(out: dict[str, Any]) -> dict[str, Any]:
    """The fields every result row states (accuracy and the full privacy statement)."""
    return {
        "test_accuracy": out["test_accuracy"],
        "mean_client_accuracy": out["mean_client_accuracy"],
        "global_test_accuracy": out.get("global_test_accuracy"),
        "epsilon": out["epsilon"],
        "delta": out["delta"],
        "relation": out["relation"],
        "sampling": out["sampling"],
        "accountant": out["accountant"],
        "noise_source": out["noise_source"] if out["method"] != "local-all" else None,
        "noise_std": out["noise_std"],
        "lam": out["lam"],
        "personal_init": out["personal_init"],
        "local_selection": out.get("local_selection"),
        "summary": out["summary"],
    }


def _run(argv: list[str], seed: int, dataset: Any = None) -> dict[str, Any]:
    """Run ``privmtl pmtl argv --seed seed`` in process (same code path as the CLI)."""
    from privmtl.experiments.pmtl import run_pmtl

    kw = _kwargs(argv)
    if dataset is not None:
        kw.pop("num_clients", None)
    out: dict[str, Any] = run_pmtl(**kw, seed=seed, dataset=dataset)
    return out


GRID_JSONL = RESULTS / "pmtl_population_grid.jsonl"
GRID_TAUS = (0.25, 0.5, 1.0)
GRID_SIZES = ("leaf", "loguniform-20-200")
GRID_NOISES = (0.0, 0.1)
GRID_RUNS: tuple[tuple[str, float | None], ...] = (
    ("local", None),
    ("pmtl", 1.0),
    ("pmtl", None),
    ("fedavg", 1.0),
)


def grid_dataset(m: int, tau: float, sizes: str, noise: float, seed: int) -> Any:
    """The synthetic federation of one grid setting (other generator parameters at default)."""
    from privmtl.data.federated import make_synthetic_federated

    spc = None if sizes == "leaf" else (20, 200)
    return make_synthetic_federated(
        n_clients=m,
        heterogeneity=tau,
        samples_per_client=spc,
        label_noise=noise,
        random_state=seed,
    )


def grid(args: argparse.Namespace) -> None:
    done = {
        (r["tau"], r["sizes"], r["label_noise"], r["method"], r["target_epsilon"], r["seed"])
        for r in load_jsonl(GRID_JSONL)
    }
    m, seed = args.m, 0
    for noise in args.noises:
        for sizes in args.sizes:
            for tau in args.taus:
                ds = None
                for method, eps in GRID_RUNS:
                    if args.runs and f"{method}:{eps}" not in args.runs:
                        continue
                    if (tau, sizes, noise, method, eps, seed) in done:
                        continue
                    if ds is None:
                        ds = grid_dataset(m, tau, sizes, noise, seed)
                    argv = argv_for(method, m, eps, args.rounds, args.clients_per_round)
                    t0 = time.perf_counter()
                    out = _run(argv, seed, dataset=ds)
                    row = {
                        "m": m,
                        "tau": tau,
                        "sizes": sizes,
                        "label_noise": noise,
                        "method": method,
                        "target_epsilon": eps,
                        "seed": seed,
                        **_row(out),
                        "seconds": time.perf_counter() - t0,
                        "data": f"make_synthetic_federated(n_clients={m}, heterogeneity={tau}, "
                        f"samples_per_client={None if sizes == 'leaf' else (20, 200)}, "
                        f"label_noise={noise}, random_state={seed})",
                        "command": "privmtl pmtl " + " ".join(argv) + f" --seed {seed} --json",
                    }
                    append_jsonl(GRID_JSONL, row)
                    print(
                        f"tau={tau} sizes={sizes} noise={noise} {method} eps={eps}: "
                        f"{row['test_accuracy']:.4f} / {row['mean_client_accuracy']:.4f} "
                        f"({row['seconds']:.0f}s)",
                        flush=True,
                    )


def study(args: argparse.Namespace) -> None:
    variant = None if args.lam is None else f"lam={args.lam:g}"
    done = {
        (r["method"], r["m"], r["target_epsilon"], r["seed"])
        for r in load_jsonl(JSONL)
        if r.get("variant") == variant
    }
    for m in args.ms:
        for seed in args.seeds:
            for method in args.methods:
                for eps in EPSILONS if method != "local" else (None,):
                    wanted = [None if math.isinf(e) else e for e in args.epsilons]
                    if args.epsilons and method != "local" and eps not in wanted:
                        continue
                    key = (method, m, eps, seed)
                    if key in done:
                        continue
                    argv = argv_for(method, m, eps, args.rounds, args.clients_per_round)
                    if args.lam is not None:
                        argv += ["--lam", f"{args.lam:g}"]
                    t0 = time.perf_counter()
                    out = _run(argv, seed)
                    row = {
                        "variant": variant,
                        "method": method,
                        "m": m,
                        "target_epsilon": eps,
                        "seed": seed,
                        **_row(out),
                        "seconds": time.perf_counter() - t0,
                        "command": "privmtl pmtl " + " ".join(argv) + f" --seed {seed} --json",
                    }
                    append_jsonl(JSONL, row)
                    print(
                        f"{method:>7} m={m:>6} eps={eps} seed={seed}: "
                        f"{row['test_accuracy']:.4f} ({row['seconds']:.0f}s)",
                        flush=True,
                    )


def _cell(rows: list[dict[str, Any]], key: str) -> tuple[str, float]:
    mu, sd, n = mean_std(r[key] for r in rows)
    if n == 0:
        return "—", math.nan
    return f"{mu:.3f}" + (f" ± {sd:.3f}" if n > 1 else "") + (f" (n={n})" if n > 1 else ""), mu


DEFAULT_SETTING = (0.5, "leaf", 0.0)  # the generator's defaults: tau, client-size law, label noise


def study_rows() -> list[dict[str, Any]]:
    """The study's rows: its own JSONL plus the grid's runs at the generator's defaults.

    A grid run at the default setting is the same computation as the study's run (the same
    data, ``make_synthetic_federated(n_clients=m, random_state=seed)``, and the same arguments),
    so it is not repeated.
    """
    rows = [r for r in load_jsonl(JSONL) if r.get("variant") is None]
    have = {(r["method"], r["m"], r["target_epsilon"], r["seed"]) for r in rows}
    for r in load_jsonl(GRID_JSONL):
        key = (r["method"], r["m"], r["target_epsilon"], r["seed"])
        if (r["tau"], r["sizes"], r["label_noise"]) == DEFAULT_SETTING and key not in have:
            rows.append({**r, "from_grid": True})
    return rows


def report(args: argparse.Namespace) -> None:
    rows = study_rows()
    ms = sorted({r["m"] for r in rows})
    out = ["## Study (pooled test accuracy / mean of the clients' test accuracies)", ""]
    out += [
        "| method | ε | " + " | ".join(f"m = {m}" for m in ms) + " |",
        "|---|---|" + "---|" * len(ms),
    ]
    table: dict[tuple[str, float | None, int], float] = {}
    for method in METHODS:
        for eps in EPSILONS if method != "local" else (None,):
            cells = []
            for m in ms:
                sel = [
                    r
                    for r in rows
                    if r["method"] == method and r["m"] == m and r["target_epsilon"] == eps
                ]
                pooled, mu = _cell(sel, "test_accuracy")
                client, _ = _cell(sel, "mean_client_accuracy")
                table[(method, eps, m)] = mu
                cells.append(pooled if pooled == "—" else f"{pooled} / {client}")
            e = (
                "∞ (non-private)"
                if eps is None and method != "local"
                else ("0 (nothing shared)" if eps is None else f"{eps:g}")
            )
            lines_method = "local (every client alone)" if method == "local" else method
            out.append(f"| {lines_method} | {e} | " + " | ".join(cells) + " |")
    variants = [r for r in load_jsonl(JSONL) if r.get("variant") is not None]
    for v in sorted({r["variant"] for r in variants}):
        cells = []
        for m in ms:
            sel = [r for r in variants if r["variant"] == v and r["m"] == m]
            pooled, _ = _cell(sel, "test_accuracy")
            client, _ = _cell(sel, "mean_client_accuracy")
            cells.append(pooled if pooled == "—" else f"{pooled} / {client}")
        out.append(
            f"| pmtl, {v.replace('lam', 'λ')} | ∞ (non-private) | " + " | ".join(cells) + " |"
        )
    out += ["", "Privacy statement of every row (from its JSON):", ""]
    seen = set()
    for r in rows:
        if r["summary"] not in seen:
            seen.add(r["summary"])
            out.append(f"* m = {r['m']}, {r['method']}: {r['summary']}")
    grid_rows = load_jsonl(GRID_JSONL)
    if grid_rows:
        out += ["", "## Grid at m = 1000 (seed 0; pooled / mean-client test accuracy)", ""]
        out += [
            "| τ | sizes | label noise | local | PMTL ε=1 | PMTL non-private | FedAvg ε=1 |"
            " PMTL ε=1 − local |",
            "|---|---|---|---|---|---|---|---|",
        ]
        settings = sorted({(r["tau"], r["sizes"], r["label_noise"]) for r in grid_rows})
        for tau, sizes, noise in settings:
            cells, vals = [], {}
            for method, eps in GRID_RUNS:
                sel = [
                    r
                    for r in grid_rows
                    if (r["tau"], r["sizes"], r["label_noise"]) == (tau, sizes, noise)
                    and r["method"] == method
                    and r["target_epsilon"] == eps
                ]
                pooled, mu = _cell(sel, "test_accuracy")
                client, _ = _cell(sel, "mean_client_accuracy")
                vals[(method, eps)] = mu
                cells.append(pooled if pooled == "—" else f"{pooled} / {client}")
            gap = vals[("pmtl", 1.0)] - vals[("local", None)]
            gap_s = "—" if math.isnan(gap) else f"{gap:+.3f}"
            out.append(f"| {tau:g} | {sizes} | {noise:g} | " + " | ".join(cells) + f" | {gap_s} |")
    print("\n".join(out))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for method, eps, style, label in (
        ("pmtl", 1.0, "o-", "PMTL ε=1"),
        ("fedavg", 1.0, "s-", "FedAvg ε=1"),
        ("local", None, "^-", "local (every client alone)"),
        ("pmtl", None, "o:", "PMTL non-private (default λ = 1)"),
    ):
        ys = [table.get((method, eps, m), math.nan) for m in ms]
        ax.plot(ms, ys, style, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("number of clients m")
    ax.set_ylabel("test accuracy (all clients, pooled)")
    ax.set_title("Synthetic federation, logreg, q=min(m,200), T=200", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "pmtl_population.png", dpi=120)


def speed(args: argparse.Namespace) -> None:
    import torch

    from privmtl.experiments.pmtl import load_federated, make_model
    from privmtl.federated.config import TrainConfig
    from privmtl.federated.protocol import Trainer

    t0 = time.perf_counter()
    ds = load_federated("synthetic", seed=0, num_clients=args.m)
    gen_s = time.perf_counter() - t0
    net = make_model("logreg", ds, 0)
    cfg = TrainConfig(
        method=args.method,
        rounds=args.rounds,
        clients_per_round=args.clients_per_round,
        clip=0.5,
        noise_std=0.01,
        noise_source="seeded",
        progress=False,
    )
    tr = Trainer(ds, net, cfg)
    recs = [r.record for r in tr]
    t1 = time.perf_counter()
    res = tr.result()
    eval_s = time.perf_counter() - t1
    walls = sorted(r["seconds"] for r in recs[1:])
    cpus = sorted(r["cpu_seconds"] for r in recs[1:])
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {
        "m": args.m,
        "method": args.method,
        "clients_per_round": args.clients_per_round,
        "rounds_timed": len(walls),
        "median_seconds_per_round": walls[len(walls) // 2],
        "median_cpu_seconds_per_round": cpus[len(cpus) // 2],
        "data_generation_seconds": gen_s,
        "evaluation_seconds_all_clients": eval_s,
        "train_examples": int(ds.n_samples("train")),
        "personalized_parameters": int(
            sum(p.numel() for p in (res.personalized_params or {}).values())
        ),
        "peak_rss_mb": peak_mb,
        "test_accuracy": res.accuracies["test"][res.primary]["accuracy"],
        "machine": machine_info(),
        "torch_threads": torch.get_num_threads(),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("study")
    s.add_argument("--ms", type=int, nargs="+", default=[100, 1000, 10000])
    s.add_argument("--seeds", type=int, nargs="+", default=[0])
    s.add_argument("--methods", nargs="+", default=list(METHODS))
    s.add_argument("--epsilons", type=float, nargs="*", default=[], help="subset; inf: non-private")
    s.add_argument("--rounds", type=int, default=200)
    s.add_argument("--clients-per-round", type=int, default=200)
    s.add_argument("--lam", type=float, help="a variant with this λ (rows tagged variant)")
    g = sub.add_parser("grid")
    g.add_argument("--m", type=int, default=1000)
    g.add_argument("--taus", type=float, nargs="+", default=list(GRID_TAUS))
    g.add_argument("--sizes", nargs="+", default=list(GRID_SIZES), choices=GRID_SIZES)
    g.add_argument("--noises", type=float, nargs="+", default=[0.0])
    g.add_argument("--runs", nargs="*", default=[], help="subset, e.g. local:None pmtl:1.0")
    g.add_argument("--rounds", type=int, default=200)
    g.add_argument("--clients-per-round", type=int, default=200)
    sub.add_parser("report")
    p = sub.add_parser("speed")
    p.add_argument("--m", type=int, default=10000)
    p.add_argument("--method", default="pmtl")
    p.add_argument("--clients-per-round", type=int, default=100)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--json")
    args = ap.parse_args()
    {"study": study, "grid": grid, "report": report, "speed": speed}[args.mode](args)


if __name__ == "__main__":
    main()
