"""Blocks of clients computed at once: in the caller, in threads, or in forked processes."""

from __future__ import annotations

import os

import numpy as np
import pytest

from privmtl.exceptions import InvalidParameterError
from privmtl.federated import blocks
from privmtl.federated.blocks import client_blocks, concurrent_blocks

needs_fork = pytest.mark.skipif(
    not blocks.FORKED_WORKERS, reason="blocks run in forked processes on Linux only"
)


def _square_and_where(pos: np.ndarray) -> tuple[np.ndarray, int]:
    return pos**2, os.getpid()


def test_client_blocks_cover_every_position_once_in_order():
    parts = list(client_blocks(10, 4))
    assert [p.tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    with pytest.raises(InvalidParameterError, match="'block'"):
        list(client_blocks(10, 0))


def test_a_large_population_takes_larger_blocks_and_keeps_its_process_blocks():
    """The end of run's block grows with the public population size, never below the blocks that
    keep the forked workers busy."""
    from privmtl.federated.blocks import END_OF_RUN_BLOCK, LARGE_END_OF_RUN_BLOCK, end_of_run_block

    assert end_of_run_block(10_000) == END_OF_RUN_BLOCK
    assert end_of_run_block(1_000_000) == LARGE_END_OF_RUN_BLOCK > END_OF_RUN_BLOCK
    for m in (0, 1, 10_000, 16_383, 16_384, 300_000):
        block = end_of_run_block(m)
        assert block == END_OF_RUN_BLOCK or -(-m // block) >= blocks.PROCESS_MIN_BLOCKS
    with pytest.raises(InvalidParameterError, match="'m'"):
        end_of_run_block(-1)


@pytest.mark.parametrize("workers", [1, 2])
def test_few_blocks_map_in_this_process(workers):
    parts = list(client_blocks(10, 4))  # 3 blocks: under PROCESS_MIN_BLOCKS
    with concurrent_blocks(workers, len(parts)) as run:
        out = list(run(_square_and_where, parts))
    assert [o[0].tolist() for o in out] == [(p**2).tolist() for p in parts]
    assert {o[1] for o in out} == {os.getpid()}


@needs_fork
def test_many_blocks_run_in_forked_processes_and_come_back_in_order():
    parts = list(client_blocks(100, 3))  # 34 blocks
    assert len(parts) >= blocks.PROCESS_MIN_BLOCKS
    seen = []
    with concurrent_blocks(2, len(parts)) as run:
        for pos, (sq, pid) in zip(parts, run(_square_and_where, parts), strict=True):
            assert np.array_equal(sq, pos**2)  # in the blocks' order
            seen.append(pid)
    assert os.getpid() not in seen and 1 <= len(set(seen)) <= 2
    assert not blocks._JOBS  # the function is let go with its pool


@needs_fork
def test_the_free_heap_goes_back_before_the_workers_fork(monkeypatch):
    """The parent hands its free heap pages back before forking, so that the workers do not
    share (and count) pages it freed but kept; the release itself changes no result."""
    calls = []
    release = blocks.release_free_heap
    monkeypatch.setattr(blocks, "release_free_heap", lambda: calls.append(1) or release())
    parts = list(client_blocks(100, 3))
    with concurrent_blocks(2, len(parts)) as run:
        got = [sq for sq, _ in run(_square_and_where, parts)]
    assert calls == [1]
    assert all(np.array_equal(sq, pos**2) for sq, pos in zip(got, parts, strict=True))


def _fails_on_block_five(pos: np.ndarray) -> int:
    if 15 in pos:
        raise InvalidParameterError("block five")
    return int(pos.sum())


@needs_fork
def test_an_error_in_a_process_block_is_raised_in_the_caller():
    parts = list(client_blocks(60, 3))
    with pytest.raises(InvalidParameterError, match="block five"):
        with concurrent_blocks(2, len(parts)) as run:
            list(run(_fails_on_block_five, parts))
    assert not blocks._JOBS


_ORPHAN_SCRIPT = """
import os, sys, time
from privmtl.federated.blocks import concurrent_blocks

def slow(i):
    print(os.getpid(), flush=True)
    time.sleep(60)
    return i

with concurrent_blocks(2, 10) as run:
    list(run(slow, range(10)))
"""


@needs_fork
def test_block_workers_end_when_their_parent_is_killed():
    """A run killed outright (SIGKILL: no clean-up runs) leaves no worker holding its memory."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_SCRIPT], stdout=subprocess.PIPE, text=True
    )
    try:
        workers = {int(proc.stdout.readline()) for _ in range(2)}  # both busy with a block
        assert len(workers) == 2 and proc.pid not in workers
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        alive = set(workers)
        while alive and time.monotonic() < deadline:
            alive = {w for w in alive if _running(w)}
            time.sleep(0.1)
        assert not alive, f"workers {sorted(alive)} outlived their parent"
    finally:
        proc.kill()
        proc.stdout.close()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
