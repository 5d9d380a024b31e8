"""Seconds per round of PMTL on Flower (Deployment Engine on loopback, Simulation Engine) vs in process.

Three experiments, every run logged as one JSONL record (resumable: a rerun skips what the log
holds) with its full JSON result, the machine's load average before and after, and its wall time:

``deployment``
    ``privmtl flower local --num-supernodes 3`` (a SuperLink and 3 SuperNodes on 127.0.0.1, each
    message of a round handled by a fresh ClientApp process at the commits it was measured)
    against the in-process engine (``run_pmtl``, what ``privmtl pmtl`` runs, with one torch thread
    like every SuperNode) on the same configuration, for synthetic logreg and FEMNIST CNN; for synthetic also ``--secagg``. The runs of
    one repetition are made back to back, in an order that alternates between repetitions, and the
    summary reports the paired ratio (Flower / in-process seconds per round of the same
    repetition): median, min and max, which cancels most of the drift of a shared machine.
``simulation``
    Flower's Simulation Engine (Ray; extra ``privmtl[flower-sim]``) with 500 virtual SuperNodes,
    one synthetic client each, 50 clients per round, against the in-process engine on the same
    500-client population. The SuperLink runs with ``--simulation``; the run is submitted with
    ``flwr run ... --federation-config "num-supernodes=500 ..."``.
``acceptance``
    Wall seconds of the acceptance command ``privmtl flower local --num-supernodes 3 --data synthetic
    --model logreg --rounds 3 --clients-per-round 6 --epsilon 2 --json`` (process start to exit).

``marginal`` (subcommand)
    The marginal wall seconds of a round, (wall of an 8-round run − wall of a 3-round run) / 5,
    whole process start to exit, of ``privmtl flower local --num-supernodes 3`` and of
    ``privmtl pmtl`` with the same flags (synthetic logreg, 6 clients per round, ε = 2, seed 0,
    reproducible noise), and of ``privmtl flower local`` run from another source tree
    (``--before-src``, e.g. the main branch's, to show a change's gain). The runs alternate
    (A B C, then C B A) and so do the run lengths; start-up, data loading, evaluation and teardown
    cancel in the difference. ``summarize`` reports it in its own section.

"Seconds per round" is the engine's own ``seconds_per_round`` (sampling to release, evaluation
and start-up excluded; on Flower it includes the messages, the ClientApp processes and the
nodes' training).

Example::

    python benchmarks/flower_speed.py run --femnist ../shared/data/femnist-leaf --pairs 3
    python benchmarks/flower_speed.py marginal --before-src ../main/src --pairs 3
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


def _timed(
    args: list[str], timeout: float, src: Path | None = None
) -> tuple[dict[str, Any] | None, float, str]:
    import shutil
    import tempfile

    # privmtl flower local keeps its work directory (default: under $XDG_STATE_HOME): the
    # benchmark's runs keep theirs in a temporary directory, removed after the run
    scratch = tempfile.mkdtemp(prefix="privmtl-flower-bench-")
    env = _env()
    env["XDG_STATE_HOME"] = scratch
    if src is not None:  # the privmtl source tree the command (and every process it starts) runs
        env["PYTHONPATH"] = str(src)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    finally:
        wall = time.perf_counter() - t0
        shutil.rmtree(scratch, ignore_errors=True)
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
    rec["commit"] = _commit()
    if out is None:
        rec["error"] = info[info.index("}") + 1 :]
    else:
        rec["seconds_per_round"] = out.get("seconds_per_round")
        rec["result"] = out
    return rec


SRC = Path(__file__).resolve().parents[1] / "src"
RAY_MEASURED = "2.55.1"  # Ray of the simulation runs in the log (when Ray is not installed now)
MARGINAL_FLAGS = (
    "--data synthetic --model logreg --clients-per-round 6 --epsilon 2 --seed 0 "
    "--reproducible-noise --json"
).split()
MARGINAL_ROUNDS = (3, 8)
MARGINAL_ARMS = ("flower", "pmtl", "flower-before")


def marginal_command(arm: str, rounds: int) -> list[str]:
    """The command of one arm of the ``marginal`` experiment."""
    engine = ["pmtl"] if arm == "pmtl" else ["flower", "local", "--num-supernodes", "3"]
    return [str(BIN / "privmtl"), *engine, *MARGINAL_FLAGS, "--rounds", str(rounds)]


def cmd_marginal(args: argparse.Namespace) -> None:
    """Run the ``marginal`` experiment (resumable: a rerun skips the runs the log holds)."""
    before = Path(args.before_src).resolve() if args.before_src else None
    arms = [a for a in MARGINAL_ARMS if a != "flower-before" or before is not None]
    done = {(r["arm"], r["rep"], r["rounds"]) for r in load_jsonl(LOG) if _is_marginal(r)}
    for rep in range(args.pairs):
        order = arms if rep % 2 == 0 else arms[::-1]
        lengths = MARGINAL_ROUNDS if rep % 2 == 0 else MARGINAL_ROUNDS[::-1]
        # an arm's two run lengths back to back, so that the machine's drift between them is
        # small ("arm-outer"); "lengths-outer" ran every arm's short run, then every long run
        plan = (
            [(arm, rounds) for arm in order for rounds in lengths]
            if args.order == "arm-outer"
            else [(arm, rounds) for rounds in lengths for arm in order]
        )
        for arm, rounds in plan:
            if (arm, rep, rounds) in done:
                continue
            src = before if arm == "flower-before" else SRC
            out, wall, info = _timed(marginal_command(arm, rounds), args.timeout, src)
            loads = json.loads(info[: info.index("}") + 1])
            rec: dict[str, Any] = {"experiment": "marginal", "config": "synthetic-logreg"}
            rec.update(arm=arm, rep=rep, rounds=rounds, wall_seconds=wall, **loads)
            rec.update(ok=out is not None, time=time.time(), src=str(src), order=args.order)
            rec["command"] = " ".join(["privmtl", *marginal_command(arm, rounds)[1:]])
            rec["commit"] = _commit(src.parent if src is not None else None)
            if out is None:
                rec["error"] = info[info.index("}") + 1 :]
            else:
                rec["seconds_per_round"] = out.get("seconds_per_round")
                rec["result"] = out
            append_jsonl(LOG, rec)
            print(f"marginal {arm} rep {rep} rounds {rounds}: wall {wall:.1f} s, load "
                  f"{rec['load_before']:.1f}, ok {rec['ok']}", flush=True)  # fmt: skip


def _is_marginal(rec: dict[str, Any]) -> bool:
    return rec.get("experiment") == "marginal"


def _order(rec: dict[str, Any]) -> str:
    return str(rec.get("order", "lengths-outer"))  # the first runs were logged without it


def marginal_summary(runs: list[dict[str, Any]], order: str = "arm-outer") -> dict[str, Any]:
    """Per arm: the marginal seconds per round of each repetition, and the paired comparisons
    (the runs made in ``order``)."""
    runs = [r for r in runs if _is_marginal(r) and _order(r) == order]
    walls: dict[tuple[str, int], dict[int, float]] = {}
    for r in runs:
        if r.get("ok"):
            walls.setdefault((r["arm"], r["rep"]), {})[r["rounds"]] = r["wall_seconds"]
    short, long_ = MARGINAL_ROUNDS
    per: dict[str, dict[int, float]] = {}
    for (arm, rep), w in walls.items():
        if short in w and long_ in w:
            per.setdefault(arm, {})[rep] = (w[long_] - w[short]) / (long_ - short)
    out: dict[str, Any] = {"arms": {}, "paired": {}}
    for arm, reps in per.items():
        rows = [r for r in runs if _is_marginal(r) and r.get("ok") and r["arm"] == arm]
        out["arms"][arm] = {
            "marginal_seconds_per_round": _stats(list(reps.values())),
            "by_rep": reps,
            "wall_short": _stats([r["wall_seconds"] for r in rows if r["rounds"] == short]),
            "wall_long": _stats([r["wall_seconds"] for r in rows if r["rounds"] == long_]),
            "engine_seconds_per_round": _stats(
                [r["seconds_per_round"] for r in rows if r["rounds"] == long_]
            ),
            "load_average": _stats([r["load_before"] for r in rows]),
            "commits": sorted({str(r.get("commit")) for r in rows}),
        }
    for a, b in (("flower", "pmtl"), ("flower-before", "flower"), ("flower-before", "pmtl")):
        common = sorted(set(per.get(a, {})) & set(per.get(b, {})))
        if common:
            out["paired"][f"{a} - {b}"] = _stats([per[a][k] - per[b][k] for k in common])
    return out


def _marginal_table(m: dict[str, Any]) -> str:
    short, long_ = MARGINAL_ROUNDS
    names = {
        "flower": "`privmtl flower local --num-supernodes 3` (long-lived ClientApps)",
        "pmtl": "`privmtl pmtl` (in process)",
        "flower-before": "`privmtl flower local --num-supernodes 3` before (a ClientApp process "
        "per message)",
    }
    rows = []
    for arm in MARGINAL_ARMS:
        a = m["arms"].get(arm)
        if a is None:
            continue
        rows.append([
            names[arm], a["marginal_seconds_per_round"]["n"],
            _fmt(a["marginal_seconds_per_round"]), _fmt(a["wall_short"], 1),
            _fmt(a["wall_long"], 1), _fmt(a["engine_seconds_per_round"]),
            _fmt(a["load_average"], 1), ", ".join(a["commits"]),
        ])  # fmt: skip
    header = [
        "engine",
        "pairs",
        f"marginal s/round = (wall {long_} rounds − wall {short}) / {long_ - short}: median "
        "[min, max]",
        f"wall s, {short} rounds",
        f"wall s, {long_} rounds",
        f"engine's own s/round ({long_} rounds)",
        "load average (1 min) at start",
        "commit",
    ]
    lines = [markdown_table(header, rows), ""]
    for key, st in m["paired"].items():
        lines.append(f"- Paired by repetition, marginal s/round of {key}: {_fmt(st)}")
    return "\n".join(lines)


def _marginal_report(runs: list[dict[str, Any]]) -> list[str]:
    adjacent, spread = marginal_summary(runs, "arm-outer"), marginal_summary(runs, "lengths-outer")
    if not adjacent["arms"] and not spread["arms"]:
        return []
    short, long_ = MARGINAL_ROUNDS

    def load_range(order: str) -> str:
        v = [
            r[k]
            for r in runs
            if _is_marginal(r) and _order(r) == order
            for k in ("load_before", "load_after")
        ]
        return f"{min(v):.1f} to {max(v):.1f}" if v else "–"

    cmd = " ".join(["privmtl flower local --num-supernodes 3", *MARGINAL_FLAGS, "--rounds R"])
    lines = [
        "## Marginal seconds per round",
        "",
        "Produced by `python benchmarks/flower_speed.py marginal --before-src <main>/src "
        f"--pairs N`. Command: `{cmd}` for R = {short} and R = {long_}, and `privmtl pmtl` with "
        "the same flags; wall time of the whole process, start to exit. The marginal time of a "
        f"round is (wall of R = {long_} − wall of R = {short}) / {long_ - short}: start-up, data, "
        "evaluation and teardown cancel. The arms of a repetition run back to back (A B C, then "
        "C B A), and so do an arm's two run lengths (their order alternating too); *before* is "
        "the same command run from the source tree before the change (every process it starts "
        "imports that tree). The engine's own s/round (sampling to release, from the 8-round "
        "runs' JSON) is beside it: it does not drift with start-up. *before* ran the main "
        "branch's tree as it was at the time of each run, and the main branch moved during the "
        "measurements (the commits in the table); its Flower transport (`flower-supernode`, a "
        "`flwr-clientapp` process per message, Flower's 3 s polls) is the same in all of them.",
        "",
    ]
    if adjacent["arms"]:
        lines += [
            f"1-minute load average during these runs: {load_range('arm-outer')} on 2 CPUs.",
            "",
            _marginal_table(adjacent),
            "",
        ]
        fl, pm = adjacent["arms"].get("flower"), adjacent["arms"].get("pmtl")
        before = adjacent["arms"].get("flower-before")
        if fl and pm and before:
            f_med = fl["marginal_seconds_per_round"]["median"]
            lines += [
                f"Reading: a round of `privmtl flower local` costs {f_med:.2f} s of wall time "
                f"(median; {pm['marginal_seconds_per_round']['median']:.2f} s in process), "
                f"against {before['marginal_seconds_per_round']['median']:.1f} s before the "
                "change. What is left is Flower's message path on loopback: the SuperLink's "
                "HTTP APIs and object store, each message and its objects pushed and pulled "
                "by the ServerApp, the SuperNode and its ClientApp process, each hop waiting at "
                "most one 0.05 s poll (`privmtl.flower.node`).",
                "",
            ]
    if spread["arms"]:
        lines += [
            "### First attempt: every arm's short run, then every long run",
            "",
            "The same runs in another order: an arm's two run lengths were several minutes "
            "apart (the slow *before* runs between them), and the machine's load drifted by more "
            "than the rounds cost, so some 8-round runs took less wall time than the 3-round "
            "runs (negative marginal times). Kept for the record; read the table above. "
            f"1-minute load average: {load_range('lengths-outer')}.",
            "",
            _marginal_table(spread),
            "",
        ]
    return lines


def _commit(repo: Path | None = None) -> str:
    here = repo if repo is not None else Path(__file__).resolve().parent
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True
    )
    return out.stdout.strip()


def _inprocess(spec: str) -> None:
    from privmtl.experiments.pmtl import run_pmtl

    kw = json.loads(spec)
    out = run_pmtl(**kw, threads=1, show_progress=False)
    print(json.dumps(out, default=float))


def _simulation(spec: str) -> None:
    """Run the PMTL app on Flower's Simulation Engine (one virtual SuperNode per client)."""
    import tempfile

    from privmtl.flower._core import SERVER_DIR
    from privmtl.flower.deploy import _bin, _free_port, _Procs
    from privmtl.flower.launcher import write_app

    cfg = json.loads(spec)
    n = int(cfg["num_clients"])
    work = Path(tempfile.mkdtemp(prefix="privmtl-flower-sim-"))
    home, logs = work / "flwr-home", work / "logs"
    out_dir = work / SERVER_DIR
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
        "work-dir": str(work),
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


def secagg_round_seconds(dim: int, nodes: int = 3, repeats: int = 5) -> list[float]:
    """Seconds of one whole SecAgg+ round (server and ``nodes`` nodes, wire encoding included)
    run in one process: the protocol's own cost, without Flower's messaging."""
    import numpy as np

    from privmtl.flower.secagg import SecAggParams, SecAggServer

    params = SecAggParams(clip=0.5, dim=dim)
    ids = list(range(1, nodes + 1))
    vec = {n: np.random.default_rng(n).integers(0, params.quantization_range, dim) for n in ids}
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        SecAggServer(params).run(ids, _InProcessNodes(vec))
        out.append(time.perf_counter() - t0)
    return out


class _InProcessNodes:
    """SecAgg+ nodes answering in this process (payloads go through the wire encoding)."""

    def __init__(self, vectors: dict[int, Any]) -> None:
        self.vectors = vectors
        self.states: dict[int, dict[str, Any]] = {n: {} for n in vectors}

    def __call__(self, stage: str, payloads: dict[int, dict[str, Any]]) -> dict[int, Any]:
        from privmtl.flower.secagg import dumps, loads, node_stage

        replies = {}
        for nid, payload in payloads.items():
            vec = self.vectors[nid]
            reply, self.states[nid] = node_stage(
                loads(dumps(payload)), self.states[nid], nid, lambda v=vec: v
            )
            replies[nid] = loads(dumps(reply))
        return replies


def cmd_run(args: argparse.Namespace) -> None:
    done = {(r["experiment"], r["config"], r["arm"], r["rep"]) for r in load_jsonl(LOG)}
    if "crypto" in args.experiments:
        # d = 210: synthetic logreg; d = 115646: the FEMNIST CNN
        for dim in (210, 115646):
            key = ("crypto", f"d={dim}", "secagg+ round in process", 0)
            if key in done:
                continue
            load0 = os.getloadavg()[0]
            secs = secagg_round_seconds(dim)
            rec = dict(zip(("experiment", "config", "arm", "rep"), key, strict=True))
            rec.update(seconds=secs, load_before=load0, load_after=os.getloadavg()[0])
            rec.update(ok=True, wall_seconds=min(secs), time=time.time(), dim=dim)
            rec["commit"] = _commit()
            append_jsonl(LOG, rec)
            print(f"SecAgg+ round, d={dim}: {min(secs):.3f} s (min of {len(secs)})", flush=True)
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
    recs = [
        r for r in load_jsonl(LOG) if r.get("ok") and r["experiment"] not in ("crypto", "marginal")
    ]
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
            plain = {r["rep"]: r for r in group if r["arm"] == "flower"}
            if arm == "flower-secagg" and plain:
                row["paired_ratio_vs_flower"] = _stats(
                    [
                        r["seconds_per_round"] / plain[r["rep"]]["seconds_per_round"]
                        for r in runs
                        if r["rep"] in plain
                    ]
                )
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
    table = markdown_table(header, rows)
    print(table)
    (RESULTS / "flower_speed.md").write_text(_report(summary, table, runs))


def _group(summary: dict[str, Any], experiment: str, config: str, arm: str) -> dict[str, Any]:
    for g in summary["groups"]:
        if (g["experiment"], g["config"], g["arm"]) == (experiment, config, arm):
            return dict(g)
    return {}


def _report(summary: dict[str, Any], table: str, runs: list[dict[str, Any]]) -> str:
    m = summary["machine"]
    marginal = _marginal_report(runs)
    runs = [r for r in runs if not _is_marginal(r)]
    ok = [r for r in runs if r.get("ok")]
    loads = [r["load_before"] for r in runs] + [r["load_after"] for r in runs]
    acc = [r["wall_seconds"] for r in ok if r["arm"] == "acceptance"]
    sim = [r["result"] for r in ok if r["arm"] == "flower-simulation"]
    try:
        import ray

        ray_version = ray.__version__
    except ImportError:  # the version the logged simulation runs used
        ray_version = RAY_MEASURED
    lines = [
        "# PMTL on Flower: seconds per round, Deployment and Simulation Engines vs in process",
        "",
        "Produced by `benchmarks/flower_speed.py` (`run`, then `summarize`); every run's full JSON "
        "result is in `flower_speed.jsonl` and, with this summary, in `flower_speed.json`.",
        "",
        "Setup: PMTL with the same configuration on every engine (ε = 2 calibrated, γ = 0.5, "
        "λ = 0.1, lr 0.1, batch 10, 1 local epoch, Poisson sampling, `delta` messages, secure "
        "noise). *In process* is `run_pmtl` (what `privmtl pmtl` runs) with one torch thread; "
        "*flower* is `privmtl flower local --num-supernodes 3` (a SuperLink and 3 SuperNodes on "
        "127.0.0.1, one torch thread per ClientApp); *flower-secagg* adds `--secagg` (SecAgg+ "
        "among the 3 nodes, default quantization); *flower-simulation* is Flower's Simulation "
        "Engine (Ray) with one virtual SuperNode per client. Seconds per round are the engines' "
        "own `seconds_per_round` (sampling to release; start-up and evaluation excluded). The "
        "runs of one repetition are back to back, their order alternating between repetitions; "
        "the paired ratio divides a Flower run's seconds per round by the in-process run of the "
        "same repetition.",
        "",
        f"Machine: {m['cpus']} CPUs ({m['processor']}), Python {m['python']}, torch "
        f"{m['torch']}; shared with other jobs during the measurements: 1-minute load average "
        f"{min(loads):.1f} to {max(loads):.1f} (per run in the table). Absolute seconds drift "
        "with the load; the paired ratios are what to read.",
        "",
        table,
        "",
        "## Reading",
        "",
    ]
    dep = _group(summary, "deployment", "synthetic-logreg", "flower")
    sec = _group(summary, "deployment", "synthetic-logreg", "flower-secagg")
    fem = _group(summary, "deployment", "femnist-cnn", "flower")
    if dep and fem:
        lines.append(
            "- **Deployment Engine on loopback**, as measured at the commits below, before the "
            "ClientApps were kept alive (see the marginal section for after). A round cost about "
            f"{dep['seconds_per_round']['median']:.0f} s for synthetic logreg and "
            f"{fem['seconds_per_round']['median']:.0f} s for the FEMNIST CNN, whatever the "
            "model: the time was Flower's per-message cost, not training. Every message a "
            "SuperNode received was handled by a fresh `flwr-clientapp` process (Flower's "
            "subprocess isolation: one task per message), which starts Python and imports "
            "torch, Flower and privmtl before the client step (the node's data comes from its "
            "cached shard), and an idle SuperNode polls the SuperLink every 3 s. The in-process "
            "engine "
            "trains the same clients in "
            f"{_group(summary, 'deployment', 'synthetic-logreg', 'in-process')['seconds_per_round']['median']:.2f}"
            " s (logreg) and "
            f"{_group(summary, 'deployment', 'femnist-cnn', 'in-process')['seconds_per_round']['median']:.2f}"
            " s (CNN) per round."
        )
    crypto = {r["dim"]: min(r["seconds"]) for r in ok if r["experiment"] == "crypto"}
    if sec and dep:
        own = ", ".join(f"{v:.3f} s for d = {d}" for d, v in sorted(crypto.items()))
        ratio = sec.get("paired_ratio_vs_flower", {})
        lines.append(
            "- **SecAgg+** takes four messages per node and round (setup, share keys, collect "
            "masked vectors, unmask) instead of one: "
            f"{sec['seconds_per_round']['median']:.0f} s per round, {_fmt(ratio, 1)} times "
            "the round without it (paired by repetition: median [min, max]). The protocol's "
            "own work (key "
            "agreement, Shamir shares, AES-CTR masks, for the server and 3 nodes in one "
            f"process, wire encoding included) is {own or 'not measured'} (min of 5)."
        )
    if sim:
        n = sim[0]["simulation"]["num_supernodes"]
        lines.append(
            f"- **Simulation Engine**, {n} virtual SuperNodes, 50 clients per round: "
            "`flwr[simulation]` installs here (Ray "
            f"{ray_version}, pinned by flwr 1.41's `simulation` extra; privmtl's separate extra "
            "`privmtl[flower-sim]`, not installed by CI). Ray actors stay alive across "
            "messages, so the per-message process start disappears and a round costs "
            f"{_group(summary, 'simulation', 'synthetic-500', 'flower-simulation')['seconds_per_round']['median']:.2f}"
            " s against "
            f"{_group(summary, 'simulation', 'synthetic-500', 'in-process')['seconds_per_round']['median']:.2f}"
            " s in process on the same 500-client population (2 Ray workers, one CPU each)."
        )
    if acc:
        acc_loads = [r["load_before"] for r in ok if r["arm"] == "acceptance"]
        under = sum(v < 180 for v in acc)
        lines.append(
            "- **The acceptance command** (`privmtl flower local --num-supernodes 3 "
            "--data synthetic --model logreg --rounds 3 --clients-per-round 6 --epsilon 2 "
            f"--json`, process start to exit): "
            f"{', '.join(f'{v:.0f}' for v in acc)} s at a load average of "
            f"{', '.join(f'{v:.0f}' for v in acc_loads)} on 2 cores; {under} of {len(acc)} "
            "runs under three minutes. The time is start-up (SuperLink, SuperNodes, data) "
            "plus three rounds of the per-message cost above, so it scales with the "
            "machine's load."
        )
    commits = sorted({str(r.get("commit", "?")) for r in ok})
    lines += ["", f"Measured at commit(s) {', '.join(commits)} of the privmtl repository."]
    if marginal:
        lines += ["", *marginal]
    failed = summary["failed_runs"]
    if failed:
        lines += ["", "Failed runs (kept in the log):", ""]
        lines += [f"- {f['experiment']} {f['config']} {f['arm']} rep {f['rep']}: "
                  f"{(f.get('error') or '').splitlines()[-1:] }" for f in failed]  # fmt: skip
    return "\n".join(lines) + "\n"


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
        default=["deployment", "simulation", "acceptance", "crypto"],
        choices=["deployment", "simulation", "acceptance", "crypto"],
    )
    marg = sub.add_parser("marginal")
    marg.add_argument("--before-src", help="privmtl source tree of the 'before' arm (its src/)")
    marg.add_argument("--pairs", type=int, default=3)
    marg.add_argument("--timeout", type=float, default=1800.0)
    marg.add_argument("--order", choices=["arm-outer", "lengths-outer"], default="arm-outer")
    sub.add_parser("summarize")
    args = ap.parse_args()
    {"run": cmd_run, "marginal": cmd_marginal, "summarize": cmd_summarize}[args.cmd](args)


if __name__ == "__main__":
    main()
