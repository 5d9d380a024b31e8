"""The time a run prints against its wall time: equal within 5 %, with the end of run's share.

Runs ``privmtl pmtl --data synthetic --num-clients 200 --rounds 10 --json`` as a subprocess, with
``--finetune none`` and with the default end of run (``finetune="auto"``), and the default with
6000 clients (a run of a minute or more), measures the process's wall time (spawn to exit) and
compares it with the ``seconds`` the run prints and its ``phases`` (the command line's ``startup``
phase, the process's start to the run, among them). Timed in the same process: Python's start-up
and the imports (up to the end of its imports), the command's own reading of the options and
printing, and the exit (from ``atexit`` on), which no process can count in what it prints.

Writes ``results/run_time.json`` (every run, the machine) and ``results/run_time.md``::

    python benchmarks/run_time.py [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from _common import RESULTS, machine_info, markdown_table

COMMAND = ["pmtl", "--data", "synthetic", "--rounds", "10", "--json"]
ARMS = {
    "200 clients, finetune none": ["--num-clients", "200", "--finetune", "none"],
    "200 clients, finetune auto (default)": ["--num-clients", "200"],
    "6000 clients, finetune auto (default)": ["--num-clients", "6000"],
}
"""The reference command (200 clients) with and without the end of run, and a run of a minute or
more, where start-up is a small part of the wall time."""
TOLERANCE = 0.05
"""The acceptance: printed seconds within 5 % of the process's wall time."""


#: The command's process: the imports of ``privmtl pmtl`` first, their end time on stderr, then
#: the command itself (importing first changes nothing: ``main`` imports the same modules).
_PROCESS = (
    "import sys, time; import privmtl.cli, privmtl.experiments.pmtl; "
    "print(f'IMPORTED {time.time()!r}', file=sys.stderr, flush=True); "
    "import atexit; atexit.register(lambda: print(f'EXITING {time.time()!r}', file=sys.stderr, "
    "flush=True)); from privmtl.cli import main; sys.exit(main())"
)


def run_arm(name: str, extra: list[str]) -> dict[str, Any]:
    """One run of the command: the process's wall time (spawn to exit), its start-up (spawn to
    the end of its imports) and what it printed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    argv = [sys.executable, "-c", _PROCESS, *COMMAND, *extra]
    spawned = time.time()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    wall = time.time() - spawned
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed: {proc.stderr[-2000:]}")
    marks = {
        ln.split()[0]: float(ln.split()[1])
        for ln in proc.stderr.splitlines()
        if ln.startswith(("IMPORTED ", "EXITING "))
    }
    start_up = marks["IMPORTED"] - spawned
    out = json.loads(proc.stdout)
    phases = out["phases"]
    run_seconds = out["seconds"] - phases.get("startup", 0.0)  # run_pmtl's own, call to result
    return {
        "arm": name,
        "command": "privmtl " + " ".join([*COMMAND, *extra]),
        "wall_seconds": wall,
        "printed_seconds": out["seconds"],
        "ratio": out["seconds"] / wall,
        "start_up_seconds": start_up,
        "startup_phase_seconds": phases.get("startup"),
        "rest_seconds": wall - out["seconds"],
        "command_seconds": marks["EXITING"] - marks["IMPORTED"] - run_seconds,
        "exit_seconds": spawned + wall - marks["EXITING"],
        "phases": phases,
        "end_of_run_share": phases["end_of_run"] / out["seconds"],
        "seconds_per_round": out["seconds_per_round"],
        "test_accuracy": out["test_accuracy"],
        "load_average": os.getloadavg()[0],
    }


def write(rows: list[dict[str, Any]]) -> None:
    RESULTS.mkdir(exist_ok=True)
    payload = {"runs": rows, "machine": machine_info(), "time": time.time()}
    (RESULTS / "run_time.json").write_text(json.dumps(payload, indent=2) + "\n")
    header = [
        "run", "wall s (process)", "start-up s", "printed seconds", "printed start-up",
        "command s", "exit s", "printed / wall", "data", "setup", "rounds", "end of run", "scoring",
        "other", "end of run share", "load",
    ]  # fmt: skip
    table = [
        [
            r["arm"],
            f"{r['wall_seconds']:.1f}",
            f"{r['start_up_seconds']:.1f}",
            f"{r['printed_seconds']:.1f}",
            f"{r['startup_phase_seconds']:.1f}",
            f"{r['command_seconds']:.2f}",
            f"{r['exit_seconds']:.1f}",
            f"{r['ratio']:.3f}",
            *(
                f"{r['phases'][k]:.2f}"
                for k in ("data", "setup", "rounds", "end_of_run", "scoring", "other")
            ),
            f"{r['end_of_run_share']:.0%}",
            f"{r['load_average']:.1f}",
        ]
        for r in rows
    ]
    within = [r["arm"] for r in rows if abs(r["ratio"] - 1) <= TOLERANCE]
    starts = [r["start_up_seconds"] for r in rows]
    exits = [r["exit_seconds"] for r in rows]
    commands = [r["command_seconds"] for r in rows]
    outside = [r["wall_seconds"] - r["printed_seconds"] for r in rows]
    text = [
        "# The time a run prints against its wall time",
        "",
        "Command: `privmtl " + " ".join(COMMAND) + "` with the options of each row, a subprocess "
        "timed from its spawn to its exit (`wall s`). `start-up s` is the process's start and "
        "imports (spawn to the end of `import privmtl.cli, privmtl.experiments.pmtl`, which "
        "`privmtl pmtl` imports anyway); `printed seconds` the JSON's `seconds` (the process's "
        "wall time up to the result: the `startup` phase, `printed start-up`, then `run_pmtl` "
        "from call to result) and the phases its `phases` (seconds); `command s` "
        "the command's own time outside the run (reading the options, printing the JSON) and "
        "`exit s` the process's exit (from `atexit` to the end).",
        "",
        markdown_table(header, table),
        "",
        f"The process's start-up took {min(starts):.1f}–{max(starts):.1f} s, its exit "
        f"{min(exits):.1f}–{max(exits):.1f} s and the command outside the run "
        f"{min(commands):.2f}–{max(commands):.2f} s. The printed time counts the start-up (its "
        "`startup` phase, read from the system's record of the process's start, includes the "
        "interpreter's own start before the imports); the difference between the printed and "
        "the wall time is the process's exit, which no process can count in what it prints, and "
        "the printing of the JSON. Printed within "
        f"{TOLERANCE:.0%} of the process's wall time: "
        + (", ".join(within) if within else "none")
        + f". What the printed time misses is at most {max(outside):.1f} s, so a run of "
        f"{max(outside) / TOLERANCE:.0f} s or more prints its process's wall time within "
        f"{TOLERANCE:.0%}.",
        "",
        f"Machine: {machine_info()['cpus']} CPUs shared with other jobs (load average in the "
        "table), one BLAS thread. Produced by `python benchmarks/run_time.py`.",
        "",
    ]
    (RESULTS / "run_time.md").write_text("\n".join(text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    rows = []
    for rep in range(args.repeats):
        for name, extra in ARMS.items():
            row = run_arm(name, extra)
            row["rep"] = rep
            rows.append(row)
            print(
                f"{name}: wall {row['wall_seconds']:.1f}s, printed {row['printed_seconds']:.1f}s, "
                f"start-up {row['start_up_seconds']:.1f}s",
                file=sys.stderr,
            )
    write(rows)


if __name__ == "__main__":
    main()
