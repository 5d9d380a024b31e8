"""A node loading its clients answers while it loads; the ServerApp waits for it as long as it works,
and names a stuck node and its stage in one line. Also: the device and the data fingerprint a node
describes."""

from __future__ import annotations

import threading
import time

import pytest

from privmtl.checkpoint import CheckpointError
from privmtl.exceptions import InvalidParameterError
from privmtl.flower._core import run_options
from privmtl.flower.discovery import NodeLoader, data_fingerprint, discover
from privmtl.flower.node_clients import data_sha256_of, load_node
from privmtl.flower.server_run import ServerRun

flwr = pytest.importorskip("flwr", reason="Flower is not installed (pip install 'privmtl[flower]')")

OPTS = {"data": "synthetic", "num-clients": 9, "model": "logreg", "rounds": 2, "seed": 1}


def _context(pid, parts=3, **run):
    from flwr.app import Context, RecordDict

    nc = {"partition-id": pid, "num-partitions": parts}
    return Context(
        run_id=1, node_id=pid + 1, node_config=nc, state=RecordDict(),
        run_config=run_options({**OPTS, **run}),
    )  # fmt: skip


def _ask_apps(contexts, wait):
    """The ServerApp's ``ask`` over the ClientApp's own query handler, in this process."""
    from privmtl.flower.apps import describe_node

    def ask(pending):
        return {nid: describe_node(contexts[nid], wait).config_records["node"] for nid in pending}

    return ask


@pytest.fixture
def fresh_nodes(monkeypatch):
    from privmtl.flower import apps

    monkeypatch.setattr(apps, "_NODES", {})
    return apps


def test_a_slow_node_answers_while_it_loads_and_the_derived_wait_holds(fresh_nodes, monkeypatch):
    """The node takes far longer to load than a query may take to answer: before, the query
    waited for the load and the run failed; now the node answers that it is loading."""
    stages = []

    def slow(*args, report=None, **kw):
        report("drawing its 3 clients' data")
        stages.append("slow")
        time.sleep(1.0)  # the injected delay: longer than the query's wait below
        return load_node(*args, report=report, **kw)

    monkeypatch.setattr(fresh_nodes, "load_node", slow)
    contexts = {10 + p: _context(p) for p in range(3)}
    answers = []
    ask = _ask_apps(contexts, wait=0.05)

    def recording(pending):
        got = ask(pending)
        answers.extend(str(r["loading"]) for r in got.values() if "loading" in r)
        return got

    opts = run_options(OPTS)
    from privmtl.flower.discovery import discovery_timeout

    infos = discover(recording, sorted(contexts), discovery_timeout(opts), answer_timeout=0.5)
    assert sorted(int(i["partition"]) for i in infos.values()) == [0, 1, 2]
    assert any("drawing its 3 clients" in a for a in answers)  # what it was doing
    assert len(stages) == 3  # each node loaded once


def test_a_stuck_node_fails_the_run_in_one_line_naming_it_and_its_stage():
    release = threading.Event()

    def stuck(report):
        report("drawing its 3334 clients' data")
        release.wait(30)
        return "never"

    loaders = {7: NodeLoader(lambda report: "ok"), 8: NodeLoader(stuck)}

    def ask(pending):
        out = {}
        for nid in pending:
            node = loaders[nid].result(0.05)
            out[nid] = (
                {"describe": '{"partition": 0}'}
                if node is not None
                else {"loading": __import__("json").dumps(loaders[nid].progress(1))}
            )
        return out

    try:
        with pytest.raises(RuntimeError) as err:
            discover(ask, [7, 8], 0.3, answer_timeout=5, derived=False)
    finally:
        release.set()
    line = str(err.value)
    assert "\n" not in line
    assert "partition-id=1" in line and "node 8" in line
    assert "drawing its 3334 clients' data" in line and "discovery-timeout" in line


def test_a_node_that_stops_answering_is_named_with_what_it_was_doing():
    calls = []

    def ask(pending):
        calls.append(pending)
        if len(calls) == 1:
            return {5: {"loading": '{"partition": 2, "stage": "caching its data", "seconds": 1}'}}
        return {}  # its ClientApp died

    with pytest.raises(RuntimeError) as err:
        discover(ask, [5], 100.0, answer_timeout=3)
    line = str(err.value)
    assert "\n" not in line and "partition-id=2" in line and "caching its data" in line
    assert "did not answer" in line


def test_a_refusal_still_fails_with_its_line():
    def ask(pending):
        return {nid: {"error": f"node {nid} refuses"} for nid in pending}

    with pytest.raises(InvalidParameterError, match=r"node 1 refuses \(2 of 2"):
        discover(ask, [1, 2], 10.0, answer_timeout=3)


def test_the_device_reaches_the_node_and_a_missing_one_is_refused_in_one_line(fresh_nodes):
    from privmtl.flower.apps import describe_node

    good = describe_node(_context(0, device="cpu"))
    import json

    info = json.loads(str(good.config_records["node"]["describe"]))
    assert info["device"] == "cpu"
    assert fresh_nodes._node(_context(0, device="cpu")).device.type == "cpu"
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is present: the device is available")
    bad = describe_node(_context(1, device="cuda"))
    line = str(bad.config_records["node"]["error"])
    assert "\n" not in line and "SuperNode partition 1" in line
    assert "'device'" in line and "CUDA is not available" in line


def test_flower_local_refuses_a_bad_device_name_before_any_process(capsys):
    from privmtl.cli import main

    rc = main(["flower", "local", "--data", "synthetic", "--device", "gpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "'device'" in err[0]


def test_each_node_hashes_its_own_data_and_its_cache_keeps_the_hash(tmp_path):
    opts = run_options(OPTS)
    first = [load_node(opts, p, 3, str(tmp_path / f"n{p}")) for p in range(3)]
    again = [load_node(opts, p, 3, str(tmp_path / f"n{p}")) for p in range(3)]  # mapped caches
    other = load_node(run_options({**OPTS, "seed": 2}), 0, 3, None)
    hashes = [n.data_sha256 for n in first]
    assert len(set(hashes)) == 3 and [n.data_sha256 for n in again] == hashes
    assert other.data_sha256 != hashes[0]
    assert first[0].data_sha256 == data_sha256_of(first[0].local)
    infos = {i: n.describe() for i, n in enumerate(first)}
    swapped = {0: infos[1], 1: infos[0], 2: infos[2]}  # node ids do not matter, partitions do
    assert data_fingerprint(infos) == data_fingerprint(swapped)
    changed = {**infos, 0: {**infos[0], "data_sha256": other.data_sha256}}
    assert data_fingerprint(changed) != data_fingerprint(infos)


def test_a_resume_whose_nodes_hold_other_data_is_refused_in_one_line(tmp_path):
    opts = run_options({**OPTS, "noise-std": 0.05, "noise-source": "seeded", "rounds": 3})
    node = load_node(opts, 0, 1, None)
    run = ServerRun(opts, node.init, node.m, server_dir=tmp_path, data_sha256="a" * 64)
    assert run.fingerprint_config()["data_sha256"] == "a" * 64
    run.save()
    del run
    resume = {**opts, "resume": True}
    with pytest.raises(CheckpointError) as err:
        ServerRun(resume, node.init, node.m, server_dir=tmp_path, data_sha256="b" * 64)
    assert "\n" not in str(err.value) and "data_sha256" in str(err.value)
    ok = ServerRun(resume, node.init, node.m, server_dir=tmp_path, data_sha256="a" * 64)
    assert ok.data_sha256 == "a" * 64


def test_the_end_of_run_wait_grows_with_the_largest_nodes_clients():
    from privmtl.flower._core import FINISH_TIMEOUT, finish_timeout

    opts = run_options({})
    assert finish_timeout(opts) == finish_timeout(opts, 100) == FINISH_TIMEOUT
    assert finish_timeout(opts, 250_000) > 10 * FINISH_TIMEOUT  # a node of a million's quarter
    assert finish_timeout(run_options({"finish-timeout": 30}), 250_000) == 30


def test_flower_local_hands_its_device_to_the_apps(tmp_path, monkeypatch, capsys):
    import privmtl.flower.launcher as launcher
    from privmtl.cli import main

    seen: list[dict] = []
    monkeypatch.setattr(
        launcher, "run_local", lambda *, run_config, **kw: seen.append(run_config) or {}
    )
    for device in ("cpu", "cuda:1"):  # a node resolves it on its own machine
        argv = ["flower", "local", "--data", "synthetic", "--device", device, "--json",
                "--work-dir", str(tmp_path / device.replace(":", "-"))]  # fmt: skip
        assert main(argv) == 0, capsys.readouterr().err
        assert seen.pop()["device"] == device
    assert run_options({})["device"] == "auto"  # privmtl pmtl's default
