"""The pieces of the long-lived ClientApp SuperNode (privmtl.flower.node) that run without Flower's
processes: the reply loop, the shortened waits and the command-line parsing.

The whole path (SuperNode, executor, messages) is exercised by the slow deployment tests.
"""

from __future__ import annotations

import time
from types import ModuleType, SimpleNamespace

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'privmtl[flower]')")

from privmtl.flower import _flwr_compat, _waits, node


class _Grid:
    """A Grid whose replies to message i arrive at pull number ``arrive[i]`` (never if None)."""

    def __init__(self, arrive: list[int | None]) -> None:
        self.arrive = arrive
        self.pulls = 0
        self.pushed: list[str] = []

    def push_messages(self, messages):
        self.pushed = [f"m{i}" for i, _ in enumerate(messages)]
        return list(self.pushed)

    def pull_messages(self, ids):
        self.pulls += 1
        ids = set(ids)
        out = []
        for i, at in enumerate(self.arrive):
            if at == self.pulls and f"m{i}" in ids:
                meta = SimpleNamespace(reply_to_message_id=f"m{i}")
                out.append(SimpleNamespace(metadata=meta, index=i))
        return out


def test_send_and_receive_returns_every_reply_once_as_soon_as_all_arrived():
    grid = _Grid([1, 3, 2])
    out = node.send_and_receive(grid, ["a", "b", "c"], timeout=60)
    assert sorted(r.index for r in out) == [0, 1, 2]
    assert grid.pulls == 3  # stopped at the last reply, no extra pull


class _Clock:
    """A fake clock: ``sleep`` advances ``monotonic`` and records the waits."""

    def __init__(self) -> None:
        self.now, self.waits = 0.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def test_send_and_receive_gives_up_after_the_timeout_with_the_replies_so_far(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(_waits, "time", clock)
    grid = _Grid([1, None])
    out = node.send_and_receive(grid, ["a", "b"], timeout=1.0)
    assert [r.index for r in out] == [0]
    assert set(clock.waits) == {node.POLL_SECONDS}
    # asks until the deadline passed, then once more at most
    assert clock.now >= 1.0 and grid.pulls == len(clock.waits) + 1
    assert clock.now - node.POLL_SECONDS < 1.0 + 1e-9


def test_short_sleeps_caps_sleep_and_keeps_the_rest_of_time(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(_flwr_compat, "time", clock)
    shim = _flwr_compat._ShortSleeps(0.01)
    shim.sleep(3)
    shim.sleep(0.001)
    assert clock.waits == [0.01, 0.001]
    assert shim.monotonic() == clock.now


def test_supernode_polling_is_shortened_only_where_the_module_uses_time():
    mod = ModuleType("fake")
    mod.time = time  # type: ignore[attr-defined]
    _flwr_compat._shorten_module_sleeps(mod, 0.02)
    assert isinstance(mod.time, _flwr_compat._ShortSleeps) and mod.time.cap == 0.02  # type: ignore[attr-defined]
    other = ModuleType("other")  # no time module: left alone
    _flwr_compat._shorten_module_sleeps(other, 0.02)
    assert not hasattr(other, "time")


def test_object_pull_backoff_is_shortened(monkeypatch):
    from flwr.supercore.inflatable import inflatable_utils as iu

    for fn in (iu.pull_objects, iu.pull_and_inflate_object_from_tree):
        monkeypatch.setattr(fn, "__kwdefaults__", dict(fn.__kwdefaults__))
    node.shorten_object_waits(0.05, 0.5)
    for fn in (iu.pull_objects, iu.pull_and_inflate_object_from_tree):
        assert fn.__kwdefaults__["initial_backoff"] == 0.05
        assert fn.__kwdefaults__["backoff_cap"] == 0.5


def test_runtime_address_follows_the_supernode_flags():
    assert node._runtime_address(["--insecure"]) == "127.0.0.1:9094"
    argv = ["--superlink", "127.0.0.1:1", "--port", "4567", "--host", "0.0.0.0"]
    assert node._runtime_address(argv) == "0.0.0.0:4567"
    assert node._runtime_tls(argv) == ["--insecure"]  # the Runtime API serves plain HTTP
    tls = [*argv, "--ssl-certfile", "s.pem", "--ssl-keyfile", "s.key", "--ssl-ca-certfile", "ca"]
    assert node._runtime_tls(tls) == ["--root-certificates", "ca"]


def test_installed_flower_is_supported_and_the_launcher_uses_the_long_lived_node():
    from privmtl.flower.deploy import supernode_command

    assert node.supported()
    assert supernode_command()[-3:] == ["-m", "privmtl.flower.node", "supernode"]


def test_main_refuses_an_unknown_command():
    with pytest.raises(SystemExit) as info:
        node.main(["serve"])
    assert info.value.code == 2


def test_supernode_without_the_flower_internals_is_plain_flower_supernode(monkeypatch):
    calls = []

    def execvp(*args):
        calls.append(args)
        raise SystemExit(0)  # stands in for the process image execvp replaces

    monkeypatch.setattr(node, "supported", lambda: False)
    monkeypatch.setattr(node.os, "execvp", execvp)
    monkeypatch.setattr(node, "executor_thread", lambda *a, **k: pytest.fail("no executor"))
    with pytest.raises(SystemExit):
        node.run_supernode(["--insecure", "--port", "1"])
    assert calls == [("flower-supernode", ["flower-supernode", "--insecure", "--port", "1"])]


def test_idle_supernode_polls_back_off_and_a_message_makes_them_short_again(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(_flwr_compat, "time", clock)
    shim = _flwr_compat._ShortSleeps(0.05, 0.25)
    for _ in range(8):
        shim.sleep(3)  # Flower's idle poll: no message
    idle = list(clock.waits)
    assert idle[0] == 0.05 and idle == sorted(idle) and max(idle) == 0.25
    shim.sleep(0.5)  # waiting for the ClientApp's reply: a message came
    shim.sleep(3)
    assert clock.waits[-2:] == [0.05, 0.05]


def test_executor_backoff_grows_to_its_cap_and_resets(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(_waits, "time", clock)
    idle = _waits.Backoff(0.05, 0.25)
    waits = [idle.wait() for _ in range(8)]
    assert waits[0] == 0.05 and waits == sorted(waits) and waits[-1] == 0.25
    idle.reset()
    assert idle.wait() == 0.05


def test_supernode_runs_its_executor_as_a_thread_of_its_own_process(monkeypatch):
    import os
    import threading

    ran = []
    done = threading.Event()

    def run_clientapp(address, **kw):
        ran.append((address, kw, os.getpid(), threading.current_thread().daemon))
        done.set()

    def flower_supernode():  # Flower's SuperNode: in the main thread, with its signal handlers
        assert threading.current_thread() is threading.main_thread()
        assert done.wait(10)
        ran.append(list(node.sys.argv))

    fl = SimpleNamespace(flower_supernode=flower_supernode)
    monkeypatch.setattr(node, "supported", lambda: True)
    monkeypatch.setattr(_flwr_compat, "runtime", lambda: fl)
    monkeypatch.setattr(_flwr_compat, "shorten_supernode_polling", lambda *a: None)
    monkeypatch.setattr(node, "run_clientapp", run_clientapp)
    monkeypatch.setattr(node.os, "execvp", lambda *a: pytest.fail("no other process"))
    monkeypatch.setattr(node.sys, "argv", list(node.sys.argv))
    node.run_supernode(["--insecure", "--port", "9123"], poll=0.05)
    (address, kw, pid, daemon), argv = ran
    assert (address, pid, daemon) == ("127.0.0.1:9123", os.getpid(), True)
    assert kw == {"insecure": True, "root_certificates": None, "poll": 0.05}
    assert argv[-2:] == ["--isolation", "process"]


def test_executor_thread_over_tls_verifies_with_the_nodes_ca():
    argv = ["--ssl-certfile", "c.pem", "--ssl-ca-certfile", "ca.pem", "--host", "0.0.0.0"]
    thread = node.executor_thread(argv, poll=0.1)
    assert thread.daemon and not thread.is_alive()
    assert thread._args == ("0.0.0.0:9094",)  # type: ignore[attr-defined]
    assert thread._kwargs == {"insecure": False, "root_certificates": "ca.pem", "poll": 0.1}  # type: ignore[attr-defined]


def test_an_executor_that_fails_ends_its_node(monkeypatch, capsys):
    import os
    import signal

    def broken(address, **kw):
        raise RuntimeError("runtime API gone")

    killed = []
    monkeypatch.setattr(node, "run_clientapp", broken)
    monkeypatch.setattr(node.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    node._run_or_end_node("127.0.0.1:1", insecure=True)
    assert killed == [(os.getpid(), signal.SIGTERM)]
    assert "runtime API gone" in capsys.readouterr().err
