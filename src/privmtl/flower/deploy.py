"""The deployment of a prepared run: start a SuperLink and N SuperNodes on loopback, submit the
PMTL app with ``flwr run``, wait for its result, clean up.

This module is what ``privmtl flower local``'s waiting process runs (:func:`run_request`): it
loads neither numpy, PyTorch, SciPy nor Flower while the SuperNodes compute. The run is checked
and prepared where those are loaded (:mod:`privmtl.flower.launcher`).

Every process is started in its own process group (each SuperNode runs its ClientApp process
as a child, see :mod:`privmtl.flower.node`) and the whole group is terminated, then killed after a bounded wait, on success, on
failure and on Ctrl-C. All traffic stays on ``127.0.0.1`` with insecure (plain HTTP) transport:
for a real deployment across machines use TLS and node authentication (docs/flower.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from privmtl import _timing
from privmtl.exceptions import DataFormatError, InvalidParameterError, PrivmtlError
from privmtl.flower import node
from privmtl.flower.run_info import SERVER_DIR, read_run_info
from privmtl.locking import hold_directory

__all__ = [
    "FlowerRunError",
    "app_run_config",
    "check_work_dir",
    "run_prepared",
    "run_request",
    "supernode_command",
    "toml_value",
    "with_launch",
    "write_app_dir",
]

LOOPBACK = "127.0.0.1"


class FlowerRunError(PrivmtlError):
    """The Flower deployment failed (a process died, a timeout, or the ServerApp raised)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _bin(name: str) -> str:
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise FlowerRunError(
            f"{name} not found: install the extra with pip install 'privmtl[flower]'"
        )
    return found


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))


def write_app_dir(directory: Path, config: dict[str, str]) -> Path:
    """Write the Flower app directory (a ``pyproject.toml`` naming privmtl's apps) with the
    run configuration ``config`` (:func:`~privmtl.flower.launcher.app_config`: TOML values)."""
    cfg = config
    lines = [
        "[build-system]",
        'requires = ["hatchling"]',
        'build-backend = "hatchling.build"',
        "",
        "[project]",
        'name = "privmtl-pmtl"',
        'version = "1.0.0"',
        'description = "PMTL (privmtl) on the Flower Deployment Engine"',
        'license = "MIT"',
        "dependencies = []",
        "",
        "[tool.flwr.app]",
        'publisher = "privmtl"',
        "",
        "[tool.flwr.app.components]",
        'serverapp = "privmtl.flower.apps:server_app"',
        'clientapp = "privmtl.flower.apps:client_app"',
        "",
        "[tool.flwr.app.config]",
        *[f"{k} = {v}" for k, v in cfg.items()],
        "",
    ]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pyproject.toml").write_text("\n".join(lines))
    return directory


class _Procs:
    """Processes started in their own process groups, torn down together."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir, self.env = log_dir, env
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "wb")
        proc = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,
        )
        log.close()
        self.procs.append((name, proc))
        return proc

    def check_alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None and name.startswith("superlink"):
                raise FlowerRunError(
                    f"{name} exited with code {proc.returncode}; see {self.log_dir / name}.log"
                )

    def ours(self) -> set[int]:
        """Live processes carrying this run's environment marker (its own ``FLWR_HOME``).

        Flower starts some helpers in their own sessions (SuperExec, ClientApp) and a process
        whose parent died is adopted elsewhere: the marker finds them wherever they are.
        """
        marker = f"FLWR_HOME={self.env['FLWR_HOME']}".encode() + b"\0"
        return {pid for pid in _with_environ(marker) if pid != os.getpid()}

    def stop_all(self, timeout: float = 10.0) -> None:
        """SIGTERM every process group, descendant and marked process; SIGKILL what is left."""
        procs = [proc for _, proc in self.procs]
        extra = {d for proc in procs for d in _descendants(proc.pid)} | self.ours()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for proc in procs:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
            for pid in extra:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            end = time.monotonic() + timeout
            while True:
                running = [proc for proc in procs if proc.poll() is None]
                extra = {pid for pid in extra | self.ours() if _running(pid)}
                if (not running and not extra) or time.monotonic() > end:
                    break
                time.sleep(0.1)
        self.procs.clear()


def _children_map() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return out
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def _with_environ(marker: bytes) -> set[int]:
    """Live processes (readable by us) whose environment contains ``marker`` (Linux ``/proc``)."""
    found: set[int] = set()
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in env + b"\0" and _running(int(entry.name)):
            found.add(int(entry.name))
    return found


def _descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (Linux ``/proc``; empty elsewhere)."""
    children = _children_map()
    found: set[int] = set()
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt so the processes are torn down on it too."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def check_work_dir(work_dir: str | Path, *, resume: bool) -> None:
    """Refuse, before any process starts, a work directory whose run did not finish (no resume)."""
    info = read_run_info(Path(work_dir) / SERVER_DIR / "run.json")  # malformed: one line
    if resume or info is None:
        return
    if not info["finished"]:
        raise InvalidParameterError(
            f"The work directory {work_dir} holds a run that did not finish (killed, failed or "
            "interrupted); continue it with --resume or choose another --work-dir."
        )


def app_run_config(
    run_config: dict[str, Any], n: int, work: Path, save_models: str | Path | None
) -> dict[str, Any]:
    """The Flower app's run configuration: ``run_config`` and the launch's own keys."""
    cfg = dict(run_config)
    cfg["num-supernodes"] = int(n)
    cfg["work-dir"] = str(work)
    cfg["save-models"] = save_models is not None
    return cfg


def run_request(
    request: dict[str, Any], progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """:func:`run_local` of a :func:`launch_request`: the same deployment and result, from a
    process that imported neither PyTorch nor Flower (the run's configuration was checked and
    its app's computed where the request was)."""
    started = _timing.clock()
    work = Path(request["work_dir"])
    save_models = request.get("save_models")
    run_config = dict(request["run_config"])
    with hold_directory(work, name="work_dir"), hold_directory(save_models, name="save_models"):
        check_work_dir(work, resume=bool(run_config.get("resume", False)))
        out = run_prepared(
            work, int(request["num_supernodes"]), run_config, None, float(request["timeout"]),
            progress, None, None, save_models,
            prepared={"app": request["app"], "supernode": request["supernode"]},
        )  # fmt: skip
    return with_launch(out, _timing.clock() - started)


def with_launch(out: dict[str, Any], wall: float) -> dict[str, Any]:
    """The ServerApp's result with the launcher's ``wall`` seconds: ``seconds`` becomes the
    run's wall time and the time the ServerApp did not measure (starting the SuperLink, the
    SuperNodes and the run, collecting the result) is added to the ``setup`` phase."""
    phases = out.get("phases")
    if phases is None:
        return out
    phases["setup"] = float(phases.get("setup", 0.0)) + max(0.0, wall - float(out["seconds"]))
    out["seconds"] = max(float(wall), float(out["seconds"]))
    return out


def run_prepared(
    work: Path,
    num_supernodes: int,
    run_config: dict[str, Any],
    state_dir: str | Path | None,
    timeout: float,
    progress: Callable[[str], None] | None,
    on_started: Callable[[list[int]], None] | None,
    node_configs: Sequence[dict[str, Any]] | None,
    save_models: str | Path | None,
    prepared: dict[str, Any],
) -> dict[str, Any]:
    states = Path(state_dir).absolute() if state_dir is not None else work / "nodes"
    out_dir = work / SERVER_DIR
    out_dir.mkdir(exist_ok=True)
    for stale in ("result.json", "error.txt"):
        (out_dir / stale).unlink(missing_ok=True)
    home = work / "flwr-home"
    home.mkdir(exist_ok=True)
    logs = work / "logs" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["FLWR_HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    # the SuperLink and SuperNodes start flower-superexec by name: from the same installation
    bindir = str(Path(_bin("flower-superlink")).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")])
    # the SuperLink's SuperExec starts the ServerApp: ask for it more often than every second
    env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.2")
    port = _free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
        f'address = "{LOOPBACK}:{port}"\ninsecure = true\n'
    )
    app = write_app_dir(work / "app", prepared["app"])
    supernode = list(prepared["supernode"])
    procs = _Procs(logs, env)
    try:
        with _sigterm_as_interrupt():
            out = _run(
                procs,
                app,
                port,
                num_supernodes,
                states,
                out_dir,
                logs,
                timeout,
                progress,
                on_started,
                list(node_configs or []),
                supernode,
            )
    finally:
        procs.stop_all()
    out["work_dir"] = str(work)
    if save_models is not None:
        from privmtl.flower.saved import collect_models

        nodes = [states / f"node-{i}" for i in range(int(num_supernodes))]
        out["models_dir"] = str(
            collect_models(
                save_models, work_dir=work, result=out, run_config=run_config, node_dirs=nodes
            )
        )
    return out


def _run(
    procs: _Procs,
    app: Path,
    port: int,
    n: int,
    states: Path,
    out_dir: Path,
    logs: Path,
    timeout: float,
    progress: Callable[[str], None] | None,
    on_started: Callable[[list[int]], None] | None,
    node_configs: list[dict[str, Any]],
    supernode: list[str],
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    procs.start(
        "superlink",
        [
            _bin("flower-superlink"),
            "--insecure",
            "--host",
            LOOPBACK,
            "--port",
            str(port),
            "--disable-runtime-dependency-installation",
        ],
    )
    _wait_port(port, procs, deadline)
    pids = []
    for i in range(n):
        node_dir = states / f"node-{i}"
        node_dir.mkdir(parents=True, exist_ok=True)
        node_cfg = f'partition-id={i} num-partitions={n} state-dir="{node_dir}"'
        extra = node_configs[i] if i < len(node_configs) else {}
        node_cfg += "".join(f" {k}={toml_value(v)}" for k, v in extra.items())
        args = ["--insecure", "--superlink", f"{LOOPBACK}:{port}", "--port", str(_free_port())]
        p = procs.start(f"supernode-{i}", [*supernode, *args, "--node-config", node_cfg])
        pids.append(p.pid)
    if on_started is not None:
        on_started(pids)
    run = procs.start("flwr-run", [_bin("flwr"), "run", str(app), "local", "--stream"])
    run_log = logs / "flwr-run.log"
    seen = 0
    result_file, error_file = out_dir / "result.json", out_dir / "error.txt"

    def report() -> None:
        nonlocal seen
        if progress is not None:
            lines = _tail(run_log, 10_000).splitlines()
            for line in lines[seen:]:
                if "privmtl-flower" in line:
                    progress(line[line.index("privmtl-flower") :])
            seen = len(lines)

    while True:
        report()
        if result_file.exists():
            # the ServerApp's last lines reach flwr run's log stream a moment after the result
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.wait(timeout=min(3.0, max(0.0, deadline - time.monotonic())))
            report()
            return dict(json.loads(result_file.read_text()))
        if error_file.exists():
            why = " ".join(error_file.read_text().split())
            hint = ""
            try:  # a run that started (and checkpointed) can be continued
                info = read_run_info(out_dir / "run.json")
                started = info is not None and not info["finished"]
            except DataFormatError:
                started = False
            if started:
                hint = f"; continue it with --resume --work-dir {out_dir.parent}"
            raise FlowerRunError(f"the ServerApp failed: {why}{hint}")
        procs.check_alive()
        if run.poll() is not None and run.returncode != 0:
            raise FlowerRunError(f"flwr run exited with code {run.returncode}:\n{_tail(run_log)}")
        if time.monotonic() > deadline:
            raise FlowerRunError(f"the run did not finish in {timeout:.0f} s:\n{_tail(run_log)}")
        time.sleep(0.3)


def supernode_command() -> list[str]:
    """The SuperNode command: with a long-lived ClientApp process when Flower allows it.

    :mod:`privmtl.flower.node` runs ``flower-supernode --isolation process`` with one ClientApp
    process per node, kept between messages; without the Flower internals it needs, Flower's
    own ``flower-supernode`` (a new ClientApp process per message).
    """
    if node.supported():
        return [sys.executable, "-m", "privmtl.flower.node", "supernode"]
    return [_bin("flower-supernode")]


def _wait_port(port: int, procs: _Procs, deadline: float) -> None:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex((LOOPBACK, port)) == 0:
                return
        procs.check_alive()
        if time.monotonic() > deadline:
            raise FlowerRunError(f"the SuperLink did not listen on {LOOPBACK}:{port}")
        time.sleep(0.2)
