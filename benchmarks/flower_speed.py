"""Seconds per round of PMTL on Flower (Deployment Engine on loopback, Simulation Engine) vs in process.

Three experiments, every run logged as one JSONL record (resumable: a rerun skips what the log
holds) with its full JSON result, the machine's load average before and after, and its wall time:

``deployment``
    ``privmtl flower local --num-supernodes 3`` (a SuperLink and 3 SuperNodes on 127.0.0.1, each
    message of a round handled by a fresh ClientApp process) against the in-process engine
    (``run_pmtl``, what ``privmtl pmtl`` runs, with one torch thread like every SuperNode) on the same
    configuration, for synthetic logreg and FEMNIST CNN; for synthetic also ``--secagg``. The runs of
    one repetition are made back to back, in an order that alternates between repetitions, and the
    summary reports the paired ratio (Flower / in-process seconds per round of the same
    repetition): median, min and max, which cancels most of the drift of a shared machine.
``simulation``
    Flower's Simulation Engine (Ray; extra ``privmtl[flower-sim]``) with 500 virtual SuperNodes,
    one synthetic client each, 50 clients per round, against the in-process engine on the same
    500-client population. The SuperLink runs with ``--simulation``; the run is submitted with
    ``flwr run ... --federation-config "num-supernodes=500 ..."``.
``acceptance``
    Wall seconds of the issue's command ``privmtl flower local --num-supernodes 3 --data synthetic
    --model logreg --rounds 3 --clients-per-round 6 --epsilon 2 --json`` (process start to exit).

"Seconds per round" is the engine's own ``seconds_per_round`` (sampling to release, evaluation
and start-up excluded; on Flower it includes the messages, the ClientApp processes and the
nodes' training).

Example::

    python benchmarks/flower_speed.py run --femnist ../shared/data/femnist-leaf --pairs 3
    python benchmarks/flower_speed.py summarize    # flower_speed.md and flower_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, append_jsonl, load_jsonl, machine_info, markdown_table

LOG = RESULTS / "flower_speed.jsonl"
BIN = Path(sys.executable).parent

COMMON: dict[str, Any] = {
    "epsilon": 2.0,
    "clip": 0.5,
    "lam": 0.1,
    "lr": 0.1,
    "batch_size": 10,
    "server_update": "delta",
}
CONFIGS: dict[str, dict[str, Any]] = {
    "synthetic-logreg": {
        "data": "synthetic",
        "model": "logreg",
        "rounds": 3,
        "clients_per_round": 6,
    },
    "femnist-cnn": {"data": "femnist-leaf", "model": "cnn", "rounds": 3, "clients_per_round": 10},
    "synthetic-500": {
        "data": "synthetic",
        "model": "logreg",
        "rounds": 3,
        "clients_per_round": 50,
        "num_clients": 500,
    },
}
ACCEPTANCE = (
    "flower local --num-supernodes 3 --data synthetic --model logreg --rounds 3 "
    "--clients-per-round 6 --epsilon 2 --json"
).split()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # flower-superexec, flwr
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def _flower_args(cfg: dict[str, Any], seed: int) -> list[str]:
    args = ["--data", cfg["data"], "--model", cfg["model"]]
    if cfg.get("data_path"):
        args += ["--data-path", str(cfg["data_path"])]
    if cfg.get("num_clients"):
        args += ["--num-clients", str(cfg["num_clients"])]
    for key in ("rounds", "clients_per_round", "epsilon", "clip", "lam", "lr", "batch_size"):
        args += [f"--{key.replace('_', '-')}", str(cfg[key])]
    return [*args, "--server-update", cfg["server_update"], "--seed", str(seed), "--json"]


def _timed(args: list[str], timeout: float) -> tuple[dict[str, Any] | None, float, str]:
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=_env(), timeout=timeout)
    wall = time.perf_counter() - t0
    out = None
    if proc.returncode == 0:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    err = "" if proc.returncode == 0 else proc.stderr.strip()[-2000:]
    return out, wall, json.dumps({"load_before": load0, "load_after": os.getloadavg()[0]}) + err


def run_arm(arm: str, cfg: dict[str, Any], seed: int, timeout: float) -> dict[str, Any]:
    """One run of one arm; returns the log record."""
    if arm == "in-process":
        kw = {k: v for k, v in cfg.items() if k != "name"}
        args = [sys.executable, __file__, "_inprocess", json.dumps({**kw, "seed": seed})]
    elif arm in ("flower", "flower-secagg"):
        args = [str(BIN / "privmtl"), "flower", "local", "--num-supernodes", "3"]
        args += _flower_args(cfg, seed) + (["--secagg"] if arm == "flower-secagg" else [])
    elif arm == "flower-simulation":
        args = [sys.executable, __file__, "_simulation", json.dumps({**cfg, "seed": seed})]
    elif arm == "acceptance":
        args = [str(BIN / "privmtl"), *ACCEPTANCE]
    else:
        raise ValueError(arm)
    out, wall, info = _timed(args, timeout)
    loads = json.loads(info[: info.index("}") + 1])
    rec = {"arm": arm, "seed": seed, "wall_seconds": wall, **loads, "ok": out is not None}
    if out is None:
        rec["error"] = info[info.index("}") + 1 :]
    else:
        rec["seconds_per_round"] = out.get("seconds_per_round")
        rec["result"] = out
    return rec


def _inprocess(spec: str) -> None:
    from privmtl.experiments.pmtl import run_pmtl

    kw = json.loads(spec)
    out = run_pmtl(**kw, threads=1, show_progress=False)
    print(json.dumps(out, default=float))


def _simulation(spec: str) -> None:
    """Run the PMTL app on Flower's Simulation Engine (one virtual SuperNode per client)."""
    import tempfile

    from privmtl.flower.launcher import _bin, _free_port, _Procs, write_app

    cfg = json.loads(spec)
    n = int(cfg["num_clients"])
    work = Path(tempfile.mkdtemp(prefix="privmtl-flower-sim-"))
    home, logs, out_dir = work / "flwr-home", work / "logs", work / "out"
    home.mkdir()
    logs.mkdir()
    env = _env()
    env["FLWR_HOME"] = str(home)
    port = _free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "sim"\n\n[superlink.sim]\naddress = "127.0.0.1:{port}"\n'
        "insecure = true\n"
    )
    run_config = {
        "data": cfg["data"],
        "model": cfg["model"],
        "num-clients": n,
        "num-supernodes": n,
        "rounds": cfg["rounds"],
        "clients-per-round": cfg["clients_per_round"],
        "epsilon": cfg["epsilon"],
        "clip": cfg["clip"],
        "lam": cfg["lam"],
        "lr": cfg["lr"],
        "batch-size": cfg["batch_size"],
        "server-update": cfg["server_update"],
        "seed": cfg["seed"],
        "out-dir": str(out_dir),
        "round-timeout": 1800.0,
    }
    app = write_app(work / "app", run_config)
    procs = _Procs(logs, env)
    superlink = [_bin("flower-superlink"), "--insecure", "--simulation", "--host", "127.0.0.1"]
    superlink += ["--port", str(port), "--disable-runtime-dependency-installation"]
    fed = f"num-supernodes={n} client-resources-num-cpus=1 init-args-num-cpus=2"
    try:
        procs.start("superlink", superlink)
        deadline = time.monotonic() + 60
        while _closed(port) and time.monotonic() < deadline:
            time.sleep(0.3)
        run = procs.start(
            "flwr-run",
            [_bin("flwr"), "run", str(app), "sim", "--stream", "--federation-config", fed],
        )
        deadline = time.monotonic() + 3600
        while time.monotonic() < deadline:
            if (out_dir / "result.json").exists():
                res = json.loads((out_dir / "result.json").read_text())
                res["engine"] = "flower-simulation"
                res["simulation"] = {"num_supernodes": n, "federation_config": fed}
                print(json.dumps(res))
                return
            if (out_dir / "error.txt").exists():
                raise SystemExit((out_dir / "error.txt").read_text())
            if run.poll() is not None and run.returncode != 0:
                raise SystemExit((logs / "flwr-run.log").read_text()[-2000:])
            time.sleep(0.5)
        raise SystemExit("the simulation did not finish in an hour")
    finally:
        procs.stop_all()


def _closed(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) != 0


def cmd_run(args: argparse.Namespace) -> None:
    done = {(r["experiment"], r["config"], r["arm"], r["rep"]) for r in load_jsonl(LOG)}
    plan: list[tuple[str, str, list[str]]] = []
    if "deployment" in args.experiments:
        plan.append(("deployment", "synthetic-logreg", ["in-process", "flower", "flower-secagg"]))
        if args.femnist:
            plan.append(("deployment", "femnist-cnn", ["in-process", "flower"]))
    if "simulation" in args.experiments:
        plan.append(("simulation", "synthetic-500", ["in-process", "flower-simulation"]))
    if "acceptance" in args.experiments:
        plan.append(("acceptance", "synthetic-logreg", ["acceptance"]))
    for rep in range(args.pairs):
        for experiment, name, arms in plan:
            order = arms if rep % 2 == 0 else arms[::-1]
            cfg = {**COMMON, **CONFIGS[name]}
            if cfg["data"] == "femnist-leaf":
                cfg["data_path"] = str(Path(args.femnist).resolve())
            for arm in order:
                if (experiment, name, arm, rep) in done:
                    continue
                rec = run_arm(arm, cfg, args.seed + rep, args.timeout)
                rec.update(experiment=experiment, config=name, rep=rep, time=time.time())
                append_jsonl(LOG, rec)
                sec = rec.get("seconds_per_round")
                print(f"{experiment} {name} {arm} rep {rep}: s/round {sec}, wall "
                      f"{rec['wall_seconds']:.1f}, load {rec['load_before']:.1f}, ok {rec['ok']}",
                      flush=True)  # fmt: skip


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def summarize() -> dict[str, Any]:
    recs = [r for r in load_jsonl(LOG) if r.get("ok")]
    failed = [r for r in load_jsonl(LOG) if not r.get("ok")]
    summary: dict[str, Any] = {"machine": machine_info(), "groups": [], "failed_runs": []}
    keys = sorted({(r["experiment"], r["config"]) for r in recs})
    for experiment, name in keys:
        group = [r for r in recs if (r["experiment"], r["config"]) == (experiment, name)]
        arms = sorted({r["arm"] for r in group}, key=lambda a: (a != "in-process", a))
        base = {r["rep"]: r for r in group if r["arm"] == "in-process"}
        for arm in arms:
            runs = [r for r in group if r["arm"] == arm]
            row: dict[str, Any] = {"experiment": experiment, "config": name, "arm": arm}
            row["wall_seconds"] = _stats([r["wall_seconds"] for r in runs])
            row["load_average"] = _stats([r["load_before"] for r in runs])
            sec = [r["seconds_per_round"] for r in runs if r.get("seconds_per_round") is not None]
            if sec:
                row["seconds_per_round"] = _stats(sec)
            ratios = [
                r["seconds_per_round"] / base[r["rep"]]["seconds_per_round"]
                for r in runs
                if arm != "in-process" and r["rep"] in base
            ]
            if ratios:
                row["paired_ratio_vs_in_process"] = _stats(ratios)
            first = runs[0]["result"]
            row["noise_std"] = first.get("noise_std")
            row["epsilon"] = first.get("epsilon")
            summary["groups"].append(row)
    for r in failed:
        summary["failed_runs"].append(
            {k: r.get(k) for k in ("experiment", "config", "arm", "rep", "error")}
        )
    return summary


def _fmt(stats: dict[str, float] | None, digits: int = 2) -> str:
    if not stats:
        return "–"
    return f"{stats['median']:.{digits}f} [{stats['min']:.{digits}f}, {stats['max']:.{digits}f}]"


def cmd_summarize(args: argparse.Namespace) -> None:
    summary = summarize()
    runs = load_jsonl(LOG)
    (RESULTS / "flower_speed.json").write_text(
        json.dumps({**summary, "runs": runs}, indent=1, default=float) + "\n"
    )
    rows = [
        [
            g["experiment"],
            g["config"],
            g["arm"],
            g.get("seconds_per_round", {}).get("n", 0),
            _fmt(g.get("seconds_per_round")),
            _fmt(g.get("paired_ratio_vs_in_process")),
            _fmt(g["wall_seconds"], 1),
            _fmt(g["load_average"], 1),
        ]
        for g in summary["groups"]
    ]
    header = [
        "experiment",
        "config",
        "engine",
        "runs",
        "s/round: median [min, max]",
        "paired ratio vs in-process: median [min, max]",
        "wall s per run",
        "load average (1 min) at start",
    ]
    print(markdown_table(header, rows))


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] in ("_inprocess", "_simulation"):
        {"_inprocess": _inprocess, "_simulation": _simulation}[sys.argv[1]](sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run")
    run.add_argument("--femnist", help="LEAF FEMNIST directory (femnist-cnn runs)")
    run.add_argument("--pairs", type=int, default=3)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--timeout", type=float, default=3600.0)
    run.add_argument(
        "--experiments",
        nargs="+",
        default=["deployment", "simulation", "acceptance"],
        choices=["deployment", "simulation", "acceptance"],
    )
    sub.add_parser("summarize")
    args = ap.parse_args()
    {"run": cmd_run, "summarize": cmd_summarize}[args.cmd](args)


if __name__ == "__main__":
    main()
