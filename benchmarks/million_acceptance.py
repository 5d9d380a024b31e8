"""The population-scale command at several population sizes: wall, CPU, summed peak memory of the
process tree, phases and accuracy, each size run in turn in one invocation.

    python benchmarks/million_acceptance.py [--sizes 10000 100000 1000000] [--rounds 200]
        [--src OTHER_CHECKOUT/src --label base] [--out million_acceptance] [-- EXTRA PMTL FLAGS]

Runs ``privmtl pmtl --data synthetic --num-clients M --model logreg --clients-per-round 200
--rounds R --epsilon 1 --seed 0 --json --quiet`` (the CLI defaults otherwise: secure noise, the
default end of run with the clients' vote, the default workers) once for every M, with
``PYTHONPATH`` set to ``--src`` when given (to pair two checkouts in one invocation). The peak is the
largest sum of the resident memory of the run and every process it started, sampled every 0.2 s from
``/proc``; CPU is user + system of the run and its reaped children. Appends one JSON line per run to
``benchmarks/results/OUT.jsonl`` and rewrites ``OUT.md`` from every line recorded there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from _common import RESULTS, append_jsonl, load_jsonl, machine_info, markdown_table

PAGE = os.sysconf("SC_PAGE_SIZE")


def _tree_rss(root: int) -> int:
    """Summed resident bytes of ``root`` and its descendants (``/proc``)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(fields[21]) * PAGE
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


def run(m: int, rounds: int, src: str | None, extra: list[str]) -> dict:
    argv = [
        "pmtl", "--data", "synthetic", "--num-clients", str(m), "--model", "logreg",
        "--clients-per-round", "200", "--rounds", str(rounds), "--epsilon", "1", "--seed", "0",
        "--json", "--quiet", *extra,
    ]  # fmt: skip
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    cmd = [sys.executable, "-c", "import sys; from privmtl.cli import main; sys.exit(main())"]
    t0 = time.perf_counter()
    proc = subprocess.Popen([*cmd, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            done.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out_chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()), daemon=True)
    reader.start()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    done.set()
    reader.join()
    sampler.join()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"m={m} exited {code}: {err.decode()[-2000:]}")
    result = json.loads(out_chunks[0])
    return {
        "m": m,
        "rounds": rounds,
        "src": src or "this checkout",
        "extra": extra,
        "exit": code,
        "wall": wall,
        "cpu": usage.ru_utime + usage.ru_stime,
        "peak_gb": peak[0] / 1e9,
        "seconds": result.get("seconds"),
        "phases": result.get("phases"),
        "test_accuracy": result.get("test_accuracy"),
        "mean_client_accuracy": result.get("mean_client_accuracy"),
        "epsilon": result.get("epsilon"),
        "scored_clients": result.get("scored_clients", result.get("num_clients")),
        "machine": machine_info(),
        "load": os.getloadavg()[0],
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def table(path: Path) -> str:
    rows = []
    for r in load_jsonl(path):
        ph = r.get("phases") or {}
        rows.append([
            r.get("label", ""), f"{r['m']:,}", r["rounds"], f"{r['wall']:.0f}", f"{r['cpu']:.0f}",
            f"{r['peak_gb']:.2f}", f"{r['seconds']:.0f}",
            " · ".join(f"{k} {v:.0f}" for k, v in ph.items()),
            f"{r['test_accuracy']:.4f}", f"{r['mean_client_accuracy']:.4f}", f"{r['load']:.1f}",
        ])  # fmt: skip
    header = [
        "label", "m", "rounds", "wall s", "CPU s", "peak GB (tree)", "printed s", "phases (s)",
        "test acc.", "mean client acc.", "load at end",
    ]  # fmt: skip
    return markdown_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--src", default=None)
    parser.add_argument("--label", default="")
    parser.add_argument("--out", default="million_acceptance")
    parser.add_argument("extra", nargs="*")
    args = parser.parse_args()
    path = RESULTS / f"{args.out}.jsonl"
    for m in args.sizes:
        row = {"label": args.label, **run(m, args.rounds, args.src, args.extra)}
        append_jsonl(path, row)
        print(json.dumps({k: row[k] for k in ("m", "wall", "cpu", "peak_gb", "test_accuracy")}))
    md = RESULTS / f"{args.out}.md"
    md.write_text(
        "# The population-scale command at several sizes\n\n"
        "Written by `benchmarks/million_acceptance.py` from "
        f"`{path.name}`; one run a row, in the order run.\n\n" + table(path) + "\n"
    )


if __name__ == "__main__":
    main()
