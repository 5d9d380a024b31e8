"""``privmtl demo``: the README's main job — both method families on built-in data, no files needed."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import click

from privmtl.cli._common import (
    atomic_output_dir,
    echo_json,
    privacy_label,
    progress,
    row_for,
    spread,
    write_json_atomic,
)
from privmtl.experiments.mpmtl_sweep import run_mpmtl_sweep
from privmtl.experiments.pmtl import run_pmtl
from privmtl.experiments.sweep import selection_footnote
from privmtl.gain import gain_verdict
from privmtl.io import check_writable_dir
from privmtl.linear.methods import DEFAULT_SWEEP_METHODS, linear_method

__all__ = ["demo"]

DEMO_EPSILONS = (0.1, 0.3, 1.0, 3.0, 10.0)
"""The ε grid of the demo's MP-MTL sweep."""

_DEMO_PMTL_KEYS = (
    "test_accuracy", "summary", "guarantee", "epsilon", "local_test_accuracy", "gain_over_local",
    "gain_interval",
)  # fmt: skip
"""The keys of each PMTL run in the demo's JSON object."""

_SIMULATION = (
    "a simulation on synthetic data: the privacy noise is seeded from --seed (reproducible run "
    "to run; anyone who knows the seed can subtract it: noise_source 'seeded', as with "
    "--reproducible-noise)"
)


@click.command()
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("privmtl-results/demo"),
    show_default=True,
    help="Folder for the tables and plots.",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="First seed (data, noise, sampling)."
)
@click.option(
    "--seeds",
    "n_seeds",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="MP-MTL: runs per point (seeds --seed, --seed+1, ...), averaged, ± std shown.",
)
@click.option(
    "--tune",
    "tune_mode",
    type=click.Choice(["each", "once"]),
    default="each",
    show_default=True,
    help="Kept for compatibility: the sweep chooses its hyper-parameters by a recorded task vote "
    "(covered) at every ε.",
)
@click.option("--small", is_flag=True, hidden=True, help="A seconds-long version (tests).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def demo(
    out_dir: Path, seed: int, n_seeds: int, tune_mode: str, small: bool, as_json: bool
) -> None:
    """MP-MTL ε sweep on synthetic low-rank tasks, then a short private PMTL run.

    \b
    1. MP-MTL (low-rank, Gaussian covariance mechanism) vs single-task learning and non-private
       trace-norm MTL, ε ∈ {0.1, 0.3, 1, 3, 10}, averaged over --seeds runs: table (CSV/JSON)
       and trade-off plot (PNG).
    2. PMTL vs private FedAvg on a heterogeneous synthetic federation (logistic regression, ε = 2).

    Both parts are simulations: the privacy noise is seeded from --seed, so two runs print the
    same numbers (timings go to stderr), and every output says noise_source 'seeded'. δ is the
    library's default for each data set.
    """
    check_writable_dir(out_dir, name="out")
    say = (lambda text: None) if as_json else click.echo
    t0 = time.perf_counter()
    seeds = [seed + i for i in range(n_seeds)]
    say(f"privmtl demo: {_SIMULATION}")
    say(
        "[1/2] MP-MTL privacy–accuracy sweep on synthetic low-rank tasks (m=320, d=30), "
        f"{len(seeds)} seed(s) per point"
    )
    with atomic_output_dir(out_dir) as tmp:
        res = run_mpmtl_sweep(
            data="synthetic-lowrank",
            data_path=None,
            # the sweep's default methods; small: the private one and every task alone
            methods=[
                m
                for m in DEFAULT_SWEEP_METHODS
                if not small or linear_method(m).private or linear_method(m).isolated
            ],
            epsilons=[1.0] if small else list(DEMO_EPSILONS),
            seeds=seeds,
            noise="gaussian",
            tune_mode="none" if small else tune_mode,
            iterations=3 if small else None,
            n_splits=3,
            out_dir=tmp,
            n_jobs=min(2, os.cpu_count() or 1),  # forked workers: before the PMTL part runs torch
            noise_source="seeded",
            progress=lambda jobs, n: progress(jobs, desc="mpmtl sweep", enabled=True, total=n),
        )
        rows = json.loads((tmp / "mpmtl_sweep.json").read_text())["rows"]
        for row in res["summary"]:
            guarantee = privacy_label(row_for(rows, row))
            sel = ""
            if row["target_epsilon"] is not None and row.get("covered"):
                sel = f"  (target ε={row['target_epsilon']:g}; ε incl. selection)"
            say(f"    {row['method']:>10}  nMSE {row['mean']:.4f}{spread(row)}  [{guarantee}]{sel}")
        say(
            "    neighbours: one task added or removed; sampling: all tasks every iteration; "
            f"{selection_footnote(rows)}"
        )
        t1 = time.perf_counter()
        click.echo(f"privmtl demo: MP-MTL part {t1 - t0:.0f}s", err=True)
        m, rounds, q = (10, 3, 5) if small else (50, 40, 10)
        say(f"[2/2] PMTL vs private FedAvg, synthetic federation ({m} clients, logreg, ε=2)")
        runs = {}
        for method in ("pmtl", "fedavg"):
            runs[method] = run_pmtl(
                data="synthetic",
                model="logreg",
                method=method,
                epsilon=2.0,
                rounds=rounds,
                clients_per_round=q,
                num_clients=m,
                clip=0.5,
                seed=seed,
                show_progress=not as_json,
                # the authors' client message: Algorithm 1's w_new - w_old overshoots when only
                # q of m clients take part (same guarantee either way)
                server_update="offset",
                noise_source="seeded",
            )
            r = runs[method]
            low, high = r["gain_interval"]
            say(
                f"    {method:>7}: test accuracy {r['test_accuracy']:.3f} — {r['summary']}; "
                f"gain over training alone {100 * r['gain_over_local']:+.1f} points "
                f"[{100 * low:+.1f}, {100 * high:+.1f}]"
            )
            click.echo(f"privmtl demo: {method} {r['seconds']:.1f}s", err=True)
        alone = runs["pmtl"]
        say(
            f"    {'local':>7}: test accuracy {alone['local_test_accuracy']:.3f} — every client "
            "training alone (no sharing, no privacy cost); "
            + "; ".join(
                f"{method}: {gain_verdict(*r['gain_interval'])}" for method, r in runs.items()
            )
        )
        write_json_atomic(tmp / "pmtl_demo.json", runs)
    files = ["mpmtl_sweep.csv", "mpmtl_sweep.json", "mpmtl_tradeoff.png", "pmtl_demo.json"]
    if as_json:
        payload: dict[str, Any] = {
            "noise_source": "seeded",
            "seeds": seeds,
            "mpmtl": [
                {**row, "guarantee": row_for(rows, row).get("guarantee")} for row in res["summary"]
            ],
            "pmtl": {k: {key: r[key] for key in _DEMO_PMTL_KEYS} for k, r in runs.items()},
            "files": [str(out_dir / f) for f in files],
        }
        echo_json(payload)
    else:
        click.echo(f"wrote {out_dir}/ ({', '.join(files)})")
    click.echo(f"privmtl demo: total {time.perf_counter() - t0:.0f}s", err=True)
