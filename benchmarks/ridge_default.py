"""Which local solver should the end of a logistic-regression run use: the SGD grid or ridge?

The population study of :mod:`pmtl_population` (synthetic federation, multinomial logistic
regression, ``q = min(m, 200)`` clients per round, T = 200 rounds, ε = 1 at the default δ,
``--reproducible-noise``) run twice per cell, paired by seed: with ``--local-solver sgd`` (the
minibatch-SGD grids of ``--finetune auto``'s candidates and of ``--method local-all``) and with
``--local-solver ridge`` (every client's prior-regularised cross-entropy solved in batches,
:mod:`privmtl.federated.ridge`). Methods: ``pmtl`` and ``fedavg`` (both ``--finetune auto``, the
default end of run) and ``local-all`` (training alone). Every run is the command in the
``command`` field of its row, e.g.::

    privmtl pmtl --data synthetic --num-clients 1000 --model logreg --method pmtl \
        --clients-per-round 200 --rounds 200 --reproducible-noise --quiet --epsilon 1 \
        --local-solver ridge --seed 0 --json

Rows record the test accuracy (pooled over every test example), the mean client accuracy, the
phase seconds of the run (``phases``: wall seconds by phase) and the CPU seconds of the measuring
process (one torch thread; the 2-core machine is shared, so wall seconds partly measure the
neighbours). A ``--local-solver sgd`` row of a cell already in ``pmtl_population.jsonl`` (the same
command: the solver was the default there) is copied from it with ``source`` naming that file
(it has no phase seconds); ``run --rerun-sgd`` measures such a cell again (its row then says
whether the numbers are the copied ones: ``same_as_copied``) and the report uses the re-run.

Modes::

    python benchmarks/ridge_default.py run --ms 100 1000 --seeds 0 1 2
    python benchmarks/ridge_default.py run --ms 10000 --seeds 0
    python benchmarks/ridge_default.py report     # ridge_default.md from ridge_default.jsonl
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from _common import RESULTS, append_jsonl, load_jsonl, mean_std
from pmtl_population import COVERED, FEATURE_LAW, _row, _run, argv_for, defaults_of, feature_law

JSONL = RESULTS / "ridge_default.jsonl"
REPORT = RESULTS / "ridge_default.md"
POPULATION = RESULTS / "pmtl_population.jsonl"
EPSILON = 1.0
ROUNDS = 200
CLIENTS_PER_ROUND = 200
METHODS = ("pmtl", "fedavg", "local")
SOLVERS = ("sgd", "ridge")
POOLED_M10000 = 0.755
"""PMTL at m = 10 000, ε = 1, under the earlier pooled defaults (``pmtl_population.md``): the
acceptance line asks the covered defaults to come within a point of it."""
NOISE = 0.005
"""Mean paired differences (in accuracy) within this are read as noise: half a point, the
tolerance of the acceptance line (PMTL against the better of local and FedAvg)."""


def _argv(method: str, m: int, solver: str | None) -> list[str]:
    """The ``privmtl pmtl`` arguments of one cell (without --seed and --json); ``solver=None``:
    no ``--local-solver`` (the population study's rows, measured when every client's own choice
    with sgd was the default). A federated cell pins ``--finetune-select client``: the solvers
    are compared under every client's own choice (today's default holds a vote where it can)."""
    argv = argv_for(method, m, None if method == "local" else EPSILON, ROUNDS, CLIENTS_PER_ROUND)
    if solver is None:
        return argv
    pin = [] if method == "local" else ["--finetune-select", "client"]
    return [*argv, "--local-solver", solver, *pin]


def _command(argv: list[str], seed: int) -> str:
    return "privmtl pmtl " + " ".join(argv) + f" --seed {seed} --json"


def _population_row(method: str, m: int, seed: int) -> dict[str, Any] | None:
    """The population study's row of a cell at the covered defaults with the same command."""
    want = _command(_argv(method, m, None), seed)
    for r in load_jsonl(POPULATION):
        if (
            r.get("variant") is None
            and defaults_of(r) == COVERED
            and feature_law(r) == FEATURE_LAW
            and r.get("command") == want
        ):
            return r
    return None


def run(args: argparse.Namespace) -> None:
    rows = load_jsonl(JSONL)
    done = {(r["method"], r["m"], r["seed"], r["solver"]) for r in rows}
    if args.rerun_sgd:  # cells whose sgd row is only a copy are measured again
        done -= {(r["method"], r["m"], r["seed"], r["solver"]) for r in rows if r.get("source")} - {
            (r["method"], r["m"], r["seed"], r["solver"]) for r in rows if not r.get("source")
        }
    for m in args.ms:
        for seed in args.seeds:
            for method in args.methods:
                for solver in args.solvers:
                    if (method, m, seed, solver) in done:
                        continue
                    argv = _argv(method, m, solver)
                    old = _population_row(method, m, seed) if solver == "sgd" else None
                    if old is not None and not args.rerun_sgd:
                        row = {
                            **{k: v for k, v in old.items() if k != "command"},
                            "solver": solver,
                            "phases": None,
                            "cpu_seconds": None,
                            "source": POPULATION.name,
                            "measured_as": old["command"],
                            "command": _command(argv, seed),
                        }
                    else:
                        t0, c0 = time.perf_counter(), time.process_time()
                        out = _run(argv, seed)
                        row = {
                            "method": method,
                            "m": m,
                            "target_epsilon": None if method == "local" else EPSILON,
                            "seed": seed,
                            "solver": solver,
                            **_row(out),
                            "phases": out.get("phases"),
                            "seconds": time.perf_counter() - t0,
                            "cpu_seconds": time.process_time() - c0,
                            "source": None,
                            "command": _command(argv, seed),
                        }
                        if old is not None:  # a re-run of a copied cell: the same numbers?
                            row["same_as_copied"] = all(
                                row[k] == old[k] for k in ("test_accuracy", "mean_client_accuracy")
                            )
                    append_jsonl(JSONL, row)
                    print(
                        f"{method:>6} m={m:>5} seed={seed} {solver:>5}: "
                        f"{row['test_accuracy']:.4f} / {row['mean_client_accuracy']:.4f} "
                        f"end_of_run={(row['phases'] or {}).get('end_of_run', float('nan')):.1f}s "
                        f"({row['source'] or 'run'})",
                        flush=True,
                    )


def _by(rows: list[dict[str, Any]]) -> dict[tuple[str, int, int, str], dict[str, Any]]:
    """The last row of each (method, m, seed, solver)."""
    return {(r["method"], r["m"], r["seed"], r["solver"]): r for r in rows}


def _fmt(mu: float, sd: float, n: int, signed: bool = False, digits: int = 4) -> str:
    if n == 0:
        return "—"
    text = f"{mu:+.{digits}f}" if signed else f"{mu:.{digits}f}"
    return text + (f" ± {sd:.{digits}f}" if n > 1 else "")


def _phase(row: dict[str, Any], name: str) -> float | None:
    phases = row.get("phases")
    return None if phases is None else phases.get(name)


def _pairs(
    by: dict[tuple[str, int, int, str], dict[str, Any]], method: str, m: int
) -> tuple[list[int], list[dict[str, Any]], list[dict[str, Any]]]:
    """The seeds with both solvers' rows of one cell, and those rows (sgd, ridge)."""
    seeds = sorted(
        s
        for (meth, mm, s, solver) in by
        if meth == method and mm == m and solver == "ridge" and (meth, mm, s, "sgd") in by
    )
    return (
        seeds,
        [by[(method, m, s, "sgd")] for s in seeds],
        [by[(method, m, s, "ridge")] for s in seeds],
    )


def _reruns(rows: list[dict[str, Any]]) -> str:
    """The re-run sgd cells and whether each reproduced its copied row."""
    cells = [
        f"{r['method']} m = {r['m']} seed {r['seed']}"
        + ("" if r["same_as_copied"] else " (DIFFERENT)")
        for r in rows
        if "same_as_copied" in r
    ]
    return ", ".join(cells) if cells else "none"


def verdict(deltas: list[float]) -> str:
    """A cell's reading: ridge loses when its mean paired test-accuracy difference is below
    ``-NOISE``, wins when above ``+NOISE``, else the two are within noise."""
    mu = mean_std(deltas)[0]
    return "ridge loses" if mu < -NOISE else "ridge wins" if mu > NOISE else "within noise"


def report_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown of ``ridge_default.md`` (paired tables, the decision and the acceptance line)."""
    by = _by(rows)
    ms = sorted({r["m"] for r in rows})
    out = [
        "# `--local-solver ridge` against the SGD grid at the population study's defaults",
        "",
        "Script: `benchmarks/ridge_default.py` (commands and set-up in its docstring; every row in",
        "`ridge_default.jsonl`; this page: `python benchmarks/ridge_default.py report`). ε = 1 at",
        "the default δ, seeded noise, the synthetic federation, logistic regression, 200 rounds",
        "of min(m, 200) clients; `local` is `--method local-all`. Pairs: the same seed (same",
        "data, same trained models and billboard); only the end-of-run solver differs. Test",
        "accuracy is pooled over every test example (`test_accuracy`, the number the population",
        "study reports); mean client accuracy averages the clients' own accuracies.",
        "",
        "## Paired by seed",
        "",
        "| method | m | seeds | sgd test acc. | ridge test acc. | Δ test, mean ± sd | "
        "Δ per seed (points) | Δ mean client acc. | end of run, sgd / ridge (wall s) "
        "| run CPU s, sgd / ridge | reading |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    losing: list[str] = []
    winning: list[str] = []
    for method in METHODS:
        for m in ms:
            seeds, sgd, rid = _pairs(by, method, m)
            if not seeds:
                continue
            d = [b["test_accuracy"] - a["test_accuracy"] for a, b in zip(sgd, rid, strict=True)]
            dc = [
                b["mean_client_accuracy"] - a["mean_client_accuracy"]
                for a, b in zip(sgd, rid, strict=True)
            ]
            phase = "end_of_run" if method != "local" else "rounds"
            ends = [
                _fmt(
                    *mean_std(x for x in (_phase(r, phase) for r in rs) if x is not None), digits=1
                )
                for rs in (sgd, rid)
            ]
            cpus = [
                _fmt(*mean_std(r["cpu_seconds"] for r in rs if r.get("cpu_seconds")), digits=1)
                for rs in (sgd, rid)
            ]
            reading = verdict(d)
            cell = f"{method} at m = {m} ({mean_std(d)[0] * 100:+.2f} points, n = {len(d)})"
            if reading == "ridge loses":
                losing.append(cell)
            elif reading == "ridge wins":
                winning.append(cell)
            out.append(
                f"| {method} | {m} | {','.join(map(str, seeds))} "
                f"| {_fmt(*mean_std(r['test_accuracy'] for r in sgd))} "
                f"| {_fmt(*mean_std(r['test_accuracy'] for r in rid))} "
                f"| {_fmt(*mean_std(d), signed=True)} "
                f"| {', '.join(f'{x * 100:+.1f}' for x in d)} "
                f"| {_fmt(*mean_std(dc), signed=True)} | {ends[0]} / {ends[1]} "
                f"| {cpus[0]} / {cpus[1]} | {reading} |"
            )
    out += [
        "",
        "Δ: ridge − sgd, paired by seed; ± is the standard deviation over the seeds. End of",
        "run: the run's `end_of_run` phase in wall seconds (`--method local-all` has no end of",
        "run: its training alone is its `rounds` phase); run CPU s: the whole run's CPU seconds",
        "(one thread). The machine was shared, so wall seconds include the neighbours' load.",
        "The sgd rows are the population study's (same command), which record no phases; the",
        "cells re-run here (`--rerun-sgd`, rows with `same_as_copied`) give the timings, over",
        "their seeds only (no ±: one seed), each marked DIFFERENT where it did not reproduce",
        f"the copied numbers bit for bit: {_reruns(rows)}. `—`: no sgd timing.",
        f"Reading: a mean Δ below −{NOISE * 100:g} points is a loss of ridge (`NOISE`), above",
        f"+{NOISE * 100:g} a win, else within noise.",
        "",
        "Clients per candidate of `--finetune auto` (mean over the seeds, sgd → ridge; ridge's",
        "fine-tuned billboard is one prior strength, the SGD grid four (epochs, lr) settings):",
        "",
        "| method | m | trained | local | billboard-finetune |",
        "|---|---|---|---|---|",
    ]
    for method in ("pmtl", "fedavg"):
        for m in ms:
            seeds, sgd, rid = _pairs(by, method, m)
            if not seeds:
                continue
            cells = []
            for name in ("trained", "local", "billboard-finetune"):
                means = [
                    mean_std(
                        (r.get("finetune_auto") or {}).get("clients_per_candidate", {}).get(name, 0)
                        for r in rs
                    )[0]
                    for rs in (sgd, rid)
                ]
                cells.append(f"{means[0]:.0f} → {means[1]:.0f}")
            out.append(f"| {method} | {m} | " + " | ".join(cells) + " |")
    out += [
        "",
        "## Decision",
        "",
    ]
    if winning:
        out += ["Ridge wins (test accuracy) in: " + "; ".join(winning) + ".", ""]
    if losing:
        out += [
            "Ridge loses beyond noise in: " + "; ".join(losing) + ". Under every client's own "
            "choice the solver stays `sgd`: ridge is not at least as accurate at every m. The "
            "default `--local-solver auto` uses ridge only for the candidates of a held vote "
            "(`research/pmtl_ridge_vote.md`).",
        ]
    else:
        out += ["Ridge is at least as accurate as sgd within noise in every measured cell."]
    out += [
        "",
        "## Acceptance line: each solver, every other option at its default, ε = 1",
        "",
        "| solver | m | seeds | PMTL | local | FedAvg | PMTL − max(local, FedAvg) | target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for solver in SOLVERS:
        for m in ms:
            seeds = sorted(
                s
                for s in {k[2] for k in by if k[1] == m}
                if all((meth, m, s, solver) in by for meth in METHODS)
            )
            if not seeds:
                continue
            acc = {
                meth: mean_std(by[(meth, m, s, solver)]["test_accuracy"] for s in seeds)
                for meth in METHODS
            }
            gap = acc["pmtl"][0] - max(acc["local"][0], acc["fedavg"][0])
            target = "holds" if gap >= -NOISE else "fails"
            if m == 10000:
                target += (
                    f"; PMTL {acc['pmtl'][0] - POOLED_M10000:+.3f} against the old pooled "
                    f"{POOLED_M10000} (target ≥ −0.010: "
                    f"{'holds' if acc['pmtl'][0] >= POOLED_M10000 - 0.010 else 'fails'})"
                )
            out.append(
                f"| {solver} | {m} | {','.join(map(str, seeds))} | {_fmt(*acc['pmtl'], digits=3)} "
                f"| {_fmt(*acc['local'], digits=3)} | {_fmt(*acc['fedavg'], digits=3)} "
                f"| {gap * 100:+.1f} points | ≥ −0.5 points: {target} |"
            )
    return out


def report(_: argparse.Namespace) -> None:
    REPORT.write_text("\n".join(report_lines(load_jsonl(JSONL))) + "\n")
    print(f"wrote {Path(REPORT).name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run")
    r.add_argument("--ms", type=int, nargs="+", default=[100, 1000, 10000])
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    r.add_argument("--solvers", nargs="+", default=list(SOLVERS), choices=SOLVERS)
    r.add_argument("--rerun-sgd", action="store_true", help="measure sgd cells again")
    r.set_defaults(func=run)
    sub.add_parser("report").set_defaults(func=report)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
