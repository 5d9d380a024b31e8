"""A SuperNode whose ClientApp process lives as long as the node (``python -m privmtl.flower.node``).

Flower's default (``--isolation subprocess``) starts one ``flwr-clientapp`` process per message,
which imports torch, Flower and privmtl before it runs the client step. With ``--isolation
process`` the SuperNode leaves the ClientApps to an executor started beside it; this module is
that executor for privmtl: one process per SuperNode that takes the node's tasks one after the
other from the SuperNode's Runtime API and runs each in-process (the task protocol of Flower's own
``flwr-clientapp``: pull the message and the context, run the app, push the reply and the
context). Imports, the loaded app and the node's clients (:func:`privmtl.flower.apps._node`)
stay in memory between messages.

``supernode``
    ``flower-supernode --isolation process`` with the same arguments, and the node's executor
    (:func:`run_clientapp`) as a daemon thread of the same process: one process per SuperNode
    (one interpreter, one copy of torch, Flower and privmtl), which ends with the node. Flower's
    signal handlers stay in the main thread (the SuperNode's); the executor takes its tasks
    from the SuperNode's Runtime API over loopback HTTP as a separate process would. The SuperNode's
    fixed idle waits (it asks the SuperLink for a message every 3 s, and for its ClientApp's reply
    every 0.5 s) are shortened to :data:`POLL_SECONDS`, the idle one backing off to
    :data:`IDLE_POLL_SECONDS` while no message comes (:class:`~privmtl.flower._waits.Backoff`).
``clientapp``
    The same executor as a process of its own (e.g. beside a SuperNode started otherwise): asks
    the Runtime API for a task (every :data:`POLL_SECONDS` after a task, backing off to
    :data:`IDLE_POLL_SECONDS` while idle) and exits with its SuperNode (``--parent-pid``).

The ServerApp's side of the same waits is :func:`send_and_receive`.

``supernode`` and ``clientapp`` use Flower's internal runtime modules, all reached through
:mod:`privmtl.flower._flwr_compat` (checked by :func:`supported`); the launcher falls back to
Flower's subprocess isolation without them. Across
machines, start each SuperNode as ``python -m privmtl.flower.node supernode`` followed by
``flower-supernode``'s own arguments (TLS and authentication included).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import Any

from privmtl.flower import _flwr_compat
from privmtl.flower._waits import (
    IDLE_POLL_SECONDS,
    POLL_SECONDS,
    Backoff,
    send_and_receive,
    shorten_object_waits,
)

__all__ = ["POLL_SECONDS", "send_and_receive", "shorten_object_waits", "supported"]


def supported() -> bool:
    """Whether the installed Flower has what this module uses (Runtime API task protocol, in the
    version range of :mod:`privmtl.flower._flwr_compat`)."""
    return _flwr_compat.runtime() is not None


def _flag(argv: list[str], name: str, default: str | None = None) -> str | None:
    """The value of ``name VALUE`` in ``argv`` (the last one), else ``default``."""
    value = default
    for i, a in enumerate(argv[:-1]):
        if a == name:
            value = argv[i + 1]
    return value


def _runtime_address(argv: list[str]) -> str:
    """The SuperNode's Runtime API address (flower-supernode's defaults 127.0.0.1:9094)."""
    return f"{_flag(argv, '--host', '127.0.0.1')}:{_flag(argv, '--port', '9094')}"


def _runtime_tls(argv: list[str]) -> list[str]:
    """How the executor connects to the Runtime API: TLS only when the SuperNode serves it."""
    if "--ssl-certfile" not in argv:
        return ["--insecure"]
    ca = _flag(argv, "--ssl-ca-certfile")
    return [] if ca is None else ["--root-certificates", ca]


def run_supernode(argv: list[str], poll: float = POLL_SECONDS) -> None:
    """``flower-supernode --isolation process ARGV`` with this module's executor as a thread of
    the same process (:func:`executor_thread`).

    Without the Flower internals this needs (:func:`supported`), ``flower-supernode ARGV``.
    """
    if not supported():
        os.execvp("flower-supernode", ["flower-supernode", *argv])
    fl = _flwr_compat.runtime()
    _flwr_compat.shorten_supernode_polling(poll, max(poll, IDLE_POLL_SECONDS))
    shorten_object_waits(poll)
    executor_thread(argv, poll).start()
    sys.argv = ["flower-supernode", *argv, "--isolation", "process"]
    fl.flower_supernode()


def executor_thread(argv: list[str], poll: float = POLL_SECONDS) -> threading.Thread:
    """The ClientApp executor (:func:`run_clientapp`) of the SuperNode started with ``argv``, as
    a daemon thread of the SuperNode's process (not started): it needs no parent-process
    monitor (it ends with the process) and installs no signal handler (those stay the main
    thread's). It asks for tasks until the process exits; the Runtime API it asks is served by
    the SuperNode's own thread, and a task asked before that server is up is retried."""
    tls = _runtime_tls(argv)
    insecure = tls == ["--insecure"]
    kwargs: dict[str, Any] = {
        "insecure": insecure,
        "root_certificates": None if insecure or not tls else tls[1],
        "poll": poll,
    }
    return threading.Thread(
        target=_run_or_end_node,
        args=(_runtime_address(argv),),
        kwargs=kwargs,
        name="privmtl-clientapp",
        daemon=True,
    )


def _run_or_end_node(address: str, **kwargs: Any) -> None:
    """:func:`run_clientapp` in the SuperNode's process; should the executor itself fail (not a
    task: a task's error is the ServerApp's reply), the node ends (SIGTERM to its own process,
    Flower's handler), as a separate executor process's exit would leave it without one."""
    import signal
    import traceback

    try:
        run_clientapp(address, **kwargs)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGTERM)


def _runtime_client(address: str, tls: tuple[bool, str | None], interceptors: list[Any]) -> Any:
    fl = _flwr_compat.runtime()
    return fl.RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=tls[0],
        root_certificates=tls[1],
        interceptors=interceptors,
        retry_invoker=fl.make_simple_http_retry_invoker(),
    )


def run_clientapp(
    runtime_api_address: str,
    *,
    insecure: bool,
    root_certificates: str | None = None,
    parent_pid: int | None = None,
    poll: float = POLL_SECONDS,
) -> None:
    """Take the SuperNode's ClientApp tasks one after the other, each in this process.

    ``insecure``: plain HTTP to the Runtime API; else HTTPS verified with ``root_certificates``
    (a PEM file; default: the system's CAs).
    """
    fl = _flwr_compat.runtime()
    if fl is None:
        raise RuntimeError(
            f"the ClientApp executor needs Flower's runtime internals (flwr {_flwr_compat.FLWR_RANGE[0]}"
            f" <= version < {_flwr_compat.FLWR_RANGE[1]}); installed: {_flwr_compat.flwr_version()}"
        )
    import privmtl.flower.apps  # noqa: F401 - imported once, before the first message

    shorten_object_waits(poll)
    tls = (insecure, None if insecure else root_certificates)
    if parent_pid is not None:
        fl.start_parent_process_monitor(parent_pid)
    executor = _runtime_client(
        runtime_api_address, tls, [fl.RuntimeVersionHttpInterceptor(component_name="SuperExec")]
    )
    request = fl.AcquireTaskRequest(supported_task_types=[fl.TaskType.CLIENT_APP])
    installed: set[str] = set()
    idle = Backoff(poll, max(poll, IDLE_POLL_SECONDS))
    try:
        while True:
            res = executor.AcquireTask(request)
            if res.HasField("task") and res.token:
                _run_task(runtime_api_address, tls, res.token, installed)
                idle.reset()
            else:
                idle.wait()
    except KeyboardInterrupt:  # the SuperNode exited, or SIGINT
        pass
    finally:
        executor.close()


def _run_task(address: str, tls: tuple[bool, str | None], token: str, installed: set[str]) -> None:
    """One ClientApp task (one message), as ``flwr-clientapp --token`` runs it, in this process."""
    from flwr.app import Error, Message

    fl = _flwr_compat.runtime()
    ErrorCode, SubStatus = fl.ErrorCode, fl.SubStatus

    client = _runtime_client(
        address,
        tls,
        [
            fl.RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
            fl.RuntimeTokenHttpInterceptor(token),
        ],
    )

    def beat() -> bool:  # unlike Flower's, a refused heartbeat does not SIGINT this process
        try:
            client.SendTaskHeartbeat(fl.SendTaskHeartbeatRequest())
        except Exception:  # the sender retries
            return False
        return True

    heartbeat = fl.HeartbeatSender(beat)
    heartbeat.start()
    message = context = reply = None
    status, details = SubStatus.FAILED, "ClientApp task failed"
    try:
        message, context, run, fab = fl.pull_task_input(client)
        if fab.hash_str not in installed:
            fl.install_from_fab(fab.content, skip_prompt=True)
            installed.add(fab.hash_str)
        load = fl.get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
        app = load(run.fab_id, run.fab_version, fab.hash_str)
        reply = app(message=message, context=context)
        status, details = SubStatus.COMPLETED, ""
    except Exception as ex:  # reported to the ServerApp as an error reply, as Flower does
        if isinstance(ex, fl.LoadClientAppError):
            code, details = ErrorCode.LOAD_CLIENT_APP_EXCEPTION, "The ClientApp did not load"
        else:
            code, details = ErrorCode.CLIENT_APP_RAISED_EXCEPTION, f"{type(ex)}:<'{ex}'>"
        print(f"privmtl-flower ClientApp raised {type(ex).__name__}: {ex}", flush=True)
        if message is not None:
            reply = Message(Error(code=code, reason=details), reply_to=message)
    finally:
        try:
            if reply is not None and context is not None:
                fl.push_message(client, reply, context)
        finally:
            heartbeat.stop()
            fl.push_task_output(client=client, context=context, sub_status=status, details=details)
            client.close()


def main(argv: list[str] | None = None) -> None:
    """``supernode ARGS...`` or ``clientapp --runtime-api-address A [--insecure] ...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["supernode"]:
        run_supernode(args[1:])
        return
    parser = argparse.ArgumentParser(prog="python -m privmtl.flower.node clientapp")
    parser.add_argument("--runtime-api-address", required=True)
    parser.add_argument("--insecure", action="store_true")
    parser.add_argument("--root-certificates", default=None)
    parser.add_argument("--parent-pid", type=int, default=None)
    parser.add_argument("--poll", type=float, default=POLL_SECONDS)
    if args[:1] != ["clientapp"]:
        parser.error("the first argument must be 'supernode' or 'clientapp'")
    ns = parser.parse_args(args[1:])
    run_clientapp(
        ns.runtime_api_address,
        insecure=ns.insecure,
        root_certificates=ns.root_certificates,
        parent_pid=ns.parent_pid,
        poll=ns.poll,
    )


if __name__ == "__main__":
    main()
