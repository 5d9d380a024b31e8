"""Paired speed of the PMTL engine in two source trees (e.g. this commit and the previous one).

Runs ``benchmarks/pmtl_speed.py`` of tree A, then of tree B, then A, B, ... (each process times
``--repeats 1`` round of one path after a warm-up round, from its own ``src/`` on ``PYTHONPATH``),
and reports each tree's median seconds per round and the median of the per-pair ratios B/A, for
wall-clock and for CPU seconds (all threads of the process) — pairs run back to back, so the drift
of a shared machine cancels; CPU seconds also resist other processes competing for the cores.

Example (issue "One round at a time": the new engine within 5% of the old at 20 clients)::

    git clone -q . /tmp/old && git -C /tmp/old checkout -q 673708d
    python research/pmtl_speed_vs_commit.py --a /tmp/old --b . --pairs 7 \\
        --data ../shared/data/femnist-leaf --json research/results/pmtl_speed_vs_commit.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def _round_seconds(tree: Path, args: argparse.Namespace) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        env = {**os.environ, "PYTHONPATH": str(tree / "src")}
        cmd = [
            sys.executable, str(tree / "benchmarks" / "pmtl_speed.py"), "--data", args.data,
            "--clients", str(args.clients), "--threads", str(args.threads), "--repeats", "1",
            "--paths", args.path, "--json", str(out),
        ]  # fmt: skip
        if args.cache_dir:
            cmd += ["--cache-dir", args.cache_dir]
        subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
        (row,) = json.loads(out.read_text())["results"]
    r = row[args.path]
    return float(r["seconds_per_round"]), float(r["cpu_seconds_per_round"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--a", type=Path, required=True, help="source tree A (reference)")
    ap.add_argument("--b", type=Path, required=True, help="source tree B (candidate)")
    ap.add_argument("--data", required=True)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--path", default="parallel", choices=["batched", "parallel", "reference"])
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    a_s, b_s, a_c, b_c = [], [], [], []
    for i in range(args.pairs):
        for tree, wall, cpu in ((args.a, a_s, a_c), (args.b, b_s, b_c)):
            w, c = _round_seconds(tree.resolve(), args)
            wall.append(w)
            cpu.append(c)
        print(
            f"pair {i}: wall A {a_s[-1]:.3f} s  B {b_s[-1]:.3f} s  B/A {b_s[-1] / a_s[-1]:.3f}; "
            f"cpu A {a_c[-1]:.3f} s  B {b_c[-1]:.3f} s  B/A {b_c[-1] / a_c[-1]:.3f}"
        )
    ratios = [b / a for a, b in zip(a_s, b_s, strict=True)]
    cpu_ratios = [b / a for a, b in zip(a_c, b_c, strict=True)]
    summary = {
        "clients_per_round": args.clients,
        "threads": args.threads,
        "path": args.path,
        "pairs": args.pairs,
        "a": str(args.a),
        "b": str(args.b),
        "a_seconds": a_s,
        "b_seconds": b_s,
        "a_median": statistics.median(a_s),
        "b_median": statistics.median(b_s),
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "a_cpu_seconds": a_c,
        "b_cpu_seconds": b_c,
        "cpu_ratio_median": statistics.median(cpu_ratios),
        "cpu_ratio_min": min(cpu_ratios),
        "cpu_ratio_max": max(cpu_ratios),
        "load_average": os.getloadavg(),
    }
    print(
        f"A median {summary['a_median']:.3f} s/round, B median {summary['b_median']:.3f} s/round, "
        f"paired B/A median {summary['ratio_median']:.3f} [{min(ratios):.3f}, {max(ratios):.3f}]; "
        f"CPU seconds paired B/A median {summary['cpu_ratio_median']:.3f} "
        f"[{min(cpu_ratios):.3f}, {max(cpu_ratios):.3f}]"
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
