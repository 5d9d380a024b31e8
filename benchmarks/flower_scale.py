"""PMTL at scale on both transports, in one invocation: ``privmtl pmtl`` beside ``privmtl flower
local --num-supernodes 4`` with the same flags.

For each population size ``m`` (``--m 10000 100000 ...``) it runs both commands (synthetic
logreg, the CLI defaults unless ``--flags`` adds some, ``--rounds`` rounds, seed 0, ``--json``)
one after the other, their order alternating between sizes, and records for each run:

- ``wall``: the command's wall seconds, start to exit;
- ``seconds`` (the JSON's; the command's own wall time) and its ratio to ``wall``;
- ``per_round``: the rounds phase of the JSON's ``phases`` divided by the rounds run, and the
  engine's own ``seconds_per_round`` (sampling to release);
- ``peak_rss_gb``: the summed resident memory of the command's whole process tree (the
  SuperLink, every SuperNode and its ClientApp, the ServerApp), sampled every second from
  ``/proc`` (Linux), its maximum;
- ``peak_pss_gb``: the same for the summed proportional set size (``/proc/PID/smaps_rollup``'s
  ``Pss``): a page shared by n processes (torch's libraries, mapped by each of them) counts
  1/n in each, so the tree's PSS is the memory it takes, its RSS an upper bound;
- ``processes``: each process's peak resident memory (MB) by its role (``launcher``,
  ``superlink``, ``superexec``, ``serverapp``, ``flwr-run``, ``supernode``, ``clientapp``,
  ``worker``), the processes of a role listed; ``processes_at_peak``: their resident memory
  when the tree's sum peaked (the launcher of ``flower local`` peaks while it checks the
  options, before it replaces itself with a process without torch);
- ``cpu_seconds``: user + system seconds of the tree (from the same samples: the last value seen
  for each process);
- test accuracy and ε.

Appends to ``results/flower_scale.jsonl`` and rewrites ``results/flower_scale.md`` from every
line of it. The machine's load average at the start of each run is recorded: the deployment is
many processes, and on a shared machine its wall time is an upper bound.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import RESULTS, append_jsonl, load_jsonl, machine_info, markdown_table

JSONL = RESULTS / "flower_scale.jsonl"
MD = RESULTS / "flower_scale.md"
NODES = 4
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(") ", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(pid))
    return kids


def _tree(root: int) -> list[int]:
    kids, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def _pss(pid: int) -> int:
    """The proportional set size of one process in bytes (0 where unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _role(pid: int, root: int) -> str:
    """What a process of the tree is, from its command line."""
    if pid == root:
        return "launcher"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "gone"
    text = " ".join(argv)
    for word, role in (
        ("privmtl.flower.node clientapp", "clientapp"),
        ("privmtl.flower.node supernode", "supernode"),
        ("flower-supernode", "supernode"),
        ("flower-superlink", "superlink"),
        ("flwr-serverapp", "serverapp"),
        ("flwr-clientapp", "clientapp"),
        ("flower-superexec", "superexec"),
        ("flwr run", "flwr-run"),
    ):
        if word in text:
            return role
    return "worker"


def _sample(pid: int) -> tuple[int, float] | None:
    """(resident bytes, cpu seconds) of one process, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except OSError:
        return None
    return int(fields[21]) * _PAGE, (int(fields[11]) + int(fields[12])) / _TICK


class TreeMonitor:
    """Samples a process tree every ``every`` seconds: the peaks of its summed resident memory
    and proportional set size, each process's peak resident memory and role, and its last CPU
    seconds."""

    def __init__(self, root: int, every: float = 1.0) -> None:
        self.root, self.every = root, every
        self.peak = 0
        self.peak_pss = 0
        self.cpu: dict[int, float] = {}
        self.rss: dict[int, int] = {}
        self.at_peak: dict[int, int] = {}
        self.role: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            total = pss = 0
            now: dict[int, int] = {}
            for pid in _tree(self.root):
                got = _sample(pid)
                if got is not None:
                    total += got[0]
                    pss += _pss(pid)
                    self.cpu[pid] = got[1]
                    self.rss[pid] = max(self.rss.get(pid, 0), got[0])
                    now[pid] = got[0]
                    if pid not in self.role:
                        self.role[pid] = _role(pid, self.root)
            if total > self.peak:
                self.at_peak = now
            self.peak = max(self.peak, total)
            self.peak_pss = max(self.peak_pss, pss)
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def processes(self, at_peak: bool = False) -> dict[str, list[float]]:
        """Each role's processes' peak resident memory in MB (largest first); ``at_peak``: their
        resident memory when the tree's sum peaked instead."""
        out: dict[str, list[float]] = {}
        for pid, rss in (self.at_peak if at_peak else self.rss).items():
            out.setdefault(self.role.get(pid, "worker"), []).append(round(rss / 2**20, 1))
        return {role: sorted(v, reverse=True) for role, v in sorted(out.items())}


def run_one(engine: str, m: int, rounds: int, flags: list[str], work: Path) -> dict[str, Any]:
    args = ["--data", "synthetic", "--model", "logreg", "--num-clients", str(m)]
    args += ["--rounds", str(rounds), "--seed", "0", "--json", *flags]
    if engine == "flower":
        cmd = ["flower", "local", "--num-supernodes", str(NODES), "--work-dir", str(work), *args]
    else:
        cmd = ["pmtl", *args]
    exe = [sys.executable, "-c", "import sys; from privmtl.cli import main; sys.exit(main())"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [*exe, *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    monitor = TreeMonitor(proc.pid)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    monitor.stop()
    row: dict[str, Any] = {
        "engine": engine,
        "m": m,
        "rounds": rounds,
        "command": "privmtl " + shlex.join(cmd),
        "exit_code": proc.returncode,
        "wall": wall,
        "peak_rss_gb": monitor.peak / 2**30,
        "peak_pss_gb": monitor.peak_pss / 2**30,
        "processes": monitor.processes(),
        "processes_at_peak": monitor.processes(at_peak=True),
        "cpu_seconds": sum(monitor.cpu.values()),
        "load_average_1min": load,
    }
    if proc.returncode != 0:
        row["error"] = err.strip().splitlines()[-1:] if err.strip() else []
        return row
    res = json.loads(out)
    phases = res.get("phases") or {}
    run = int(res.get("rounds_run") or rounds)
    row.update(
        seconds=res.get("seconds"),
        seconds_over_wall=(res.get("seconds") or 0.0) / wall,
        per_round=(phases["rounds"] / run) if "rounds" in phases else None,
        engine_seconds_per_round=res.get("seconds_per_round"),
        phases=phases,
        test_accuracy=res.get("test_accuracy"),
        epsilon=res.get("epsilon"),
        delta=res.get("delta"),
        clients_per_round=res.get("clients_per_round"),
        finetune=(res.get("config") or {}).get("finetune"),
    )
    return row


def _f(v: Any, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def _flags(row: dict[str, Any]) -> str:
    """The flags a run added to the defaults (after ``--json``)."""
    return row.get("command", " --json").split(" --json", 1)[1].strip()


def _noise(row: dict[str, Any]) -> str:
    """``seeded`` where the run's noise came from the seed (``--reproducible-noise``), else
    ``secure`` (each run draws its own)."""
    return "seeded" if "--reproducible-noise" in row.get("command", "") else "secure"


def parity_lines(rows: list[dict[str, Any]], tol: float = 1e-6) -> list[str]:
    """One line per seeded pair (the two engines' adjacent rows of one size, rounds and flags):
    whether their ε and test accuracy agree within ``tol``."""
    out, used = [], -1
    for i, (a, b) in enumerate(itertools.pairwise(rows)):
        if i <= used or {a["engine"], b["engine"]} != {"flower", "pmtl"} or _noise(a) != "seeded":
            continue
        if (a["m"], a["rounds"], _flags(a)) != (b["m"], b["rounds"], _flags(b)):
            continue
        used = i + 1  # a row belongs to one pair (its invocation's)
        if a.get("exit_code") or b.get("exit_code"):
            continue
        de = abs(a["epsilon"] - b["epsilon"])
        da = abs(a["test_accuracy"] - b["test_accuracy"])
        same = de <= tol and da <= tol
        out.append(
            f"- m = {a['m']}, {a['rounds']} rounds, `{_flags(a)}` ({b.get('finished', '')[:19]}): "
            f"**{'agree' if same else 'DIFFER'}** to {tol:g}: |Δε| = {de:.3g}, "
            f"|Δ test accuracy| = {da:.3g} (ε {a['epsilon']:.12g} / {b['epsilon']:.12g}, "
            f"test accuracy {a['test_accuracy']:.12g} / {b['test_accuracy']:.12g})"
        )
    return out


def report() -> None:
    rows = load_jsonl(JSONL)
    table = [
        [
            r.get("finished", "")[:19], r["m"], r["rounds"], _flags(r), _noise(r), r["engine"],
            r["exit_code"],
            _f(r.get("wall"), ".1f"), _f(r.get("seconds"), ".1f"),
            _f(r.get("seconds_over_wall"), ".3f"), _f(r.get("per_round"), ".2f"),
            _f(r.get("engine_seconds_per_round"), ".2f"), _f(r.get("peak_rss_gb"), ".2f"),
            _f(r.get("peak_pss_gb"), ".2f"),
            _f(r.get("cpu_seconds"), ".0f"), _f(r.get("test_accuracy"), ".4f"),
            _f(r.get("epsilon"), ".4g"), _f(r.get("load_average_1min"), ".1f"),
        ]
        for r in rows
    ]  # fmt: skip
    head = [
        "finished (UTC)", "m", "rounds", "flags", "noise", "engine", "exit", "wall s", "JSON seconds",
        "seconds / wall", "per round s (rounds phase)", "engine s/round", "peak RSS GB (tree)",
        "peak PSS GB (tree)",
        "CPU s (tree)", "test accuracy", "ε", "load (1 min)",
    ]  # fmt: skip
    text = f"""# PMTL at scale: `privmtl pmtl` beside `privmtl flower local --num-supernodes {NODES}`

Produced by `python benchmarks/flower_scale.py --m M ... --rounds R` (both engines in one
invocation, same flags: synthetic logreg, `--num-clients M --rounds R --seed 0`, the CLI defaults
otherwise, plus the row's *flags*). *wall*: the
command, start to exit. *JSON seconds*: the `seconds` the command prints (its own wall time).
*per round*: the JSON's `rounds` phase / rounds run; *engine s/round*: the engine's own
`seconds_per_round` (sampling to release). *peak RSS*: the summed resident memory of the whole
process tree (SuperLink, SuperNodes and their ClientApps, ServerApp), sampled every second;
*peak PSS*: the same for the proportional set size, where a page shared by several processes
(torch's and Flower's libraries, mapped by each) counts once in all. *CPU s*: user + system seconds of the tree. Test accuracy and ε differ between the engines by
their secure noise (each run draws its own) unless the row's *noise* is `seeded`
(`--reproducible-noise`): then the two transports must give the same numbers.

{markdown_table(head, table)}

Seeded pairs, ε and test accuracy compared (flower's row first or second as run):

{chr(10).join(parity_lines(rows)) or "(none)"}

Machine: {rows[-1]["machine"]["cpus"] if rows else "?"} CPUs, shared with other jobs (the 1-minute
load average at each run's start is in the table): walls are upper bounds; read the pairs.
"""
    MD.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, nargs="+", default=[10_000])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--flags", default="", help="more flags for both commands, quoted")
    parser.add_argument("--report-only", action="store_true")
    ns = parser.parse_args()
    if not ns.report_only:
        flags = shlex.split(ns.flags)
        for i, m in enumerate(ns.m):
            order = ("pmtl", "flower") if i % 2 == 0 else ("flower", "pmtl")
            for engine in order:
                with tempfile.TemporaryDirectory(prefix="privmtl-flower-scale-") as tmp:
                    row = run_one(engine, m, ns.rounds, flags, Path(tmp) / "w")
                row["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                row["machine"] = machine_info()
                append_jsonl(JSONL, row)
                print(json.dumps({k: row.get(k) for k in ("engine", "m", "exit_code", "wall",
                      "per_round", "peak_rss_gb", "test_accuracy", "epsilon")}), flush=True)  # fmt: skip
    report()


if __name__ == "__main__":
    main()
