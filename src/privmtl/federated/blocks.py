"""Blocks of clients: the end of a run works on a bounded number of clients at a time.

A client's end-of-run outcome (local training, fine-tuning, its own choice on its own validation
split) depends on its own data, its own trained model and public values only, never on which
other clients are computed beside it. The end of the run therefore takes the population in
blocks of at most :data:`END_OF_RUN_BLOCK` clients, so that its candidates, minibatch plans and
padded batches cost memory for one block, whatever the population.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np
import torch

from privmtl._validation import check_int

__all__ = [
    "END_OF_RUN_BLOCK",
    "FORKED_WORKERS",
    "LARGE_END_OF_RUN_BLOCK",
    "PROCESS_MIN_BLOCKS",
    "blocks_fork",
    "client_blocks",
    "concurrent_blocks",
    "end_of_run_block",
    "release_free_heap",
]

T = TypeVar("T")
R = TypeVar("R")

END_OF_RUN_BLOCK = 1024
"""Most clients whose end of run is computed at once (vectorised within the block)."""

LARGE_END_OF_RUN_BLOCK = 4096
"""The block of a large population (:func:`end_of_run_block`): the ridge solves' buckets of one
padded length are then fuller (fewer slots solved for placeholders), for one block's memory."""


def client_blocks(m: int, block: int = END_OF_RUN_BLOCK) -> Iterator[np.ndarray]:
    """The positions 0 to m - 1 in consecutive blocks of at most ``block`` clients."""
    block = check_int("block", block, low=1)
    for start in range(0, m, block):
        yield np.arange(start, min(start + block, m), dtype=np.int64)


def end_of_run_block(m: int) -> int:
    """The block of a population of ``m`` clients: :data:`LARGE_END_OF_RUN_BLOCK` once it still
    makes :data:`PROCESS_MIN_BLOCKS` blocks, else :data:`END_OF_RUN_BLOCK`. A function of the
    public population size only; a client's outcome does not depend on its block."""
    m = check_int("m", m, low=0)
    return (
        LARGE_END_OF_RUN_BLOCK
        if m >= PROCESS_MIN_BLOCKS * LARGE_END_OF_RUN_BLOCK
        else END_OF_RUN_BLOCK
    )


#: The fewest blocks computed in worker processes rather than threads (where
#: :data:`FORKED_WORKERS`): below it, forking the run costs more than the threads' contention
#: for the interpreter.
PROCESS_MIN_BLOCKS = 8

#: Whether many blocks run in forked worker processes here: on Linux. Elsewhere they run in
#: threads (Windows has no fork, and macOS's system libraries are not safe to use in a child
#: forked from a process that runs threads).
FORKED_WORKERS = sys.platform.startswith("linux")

# the block functions of the process pools open now, by token: a forked worker inherits them
_JOBS: dict[int, Callable[[Any], Any]] = {}
_TOKENS = itertools.count()


def blocks_fork(workers: int, n_blocks: int, *, processes: bool = True) -> bool:
    """Whether :func:`concurrent_blocks` computes ``n_blocks`` blocks in forked worker
    processes (whose results come back pickled) rather than in the calling process."""
    return processes and workers > 1 and FORKED_WORKERS and n_blocks >= PROCESS_MIN_BLOCKS


@contextmanager
def concurrent_blocks(
    workers: int, n_blocks: int, *, processes: bool = True
) -> Iterator[Callable[[Callable[[T], R], Iterable[T]], Iterator[R]]]:
    """A ``map`` over blocks that yields the results in the blocks' order, computing up to
    ``workers`` blocks at once (the blocks are independent: a client's outcome does not depend on
    which block computes it, where or when).

    One worker, or one block, maps in the calling thread. From :data:`PROCESS_MIN_BLOCKS` blocks
    on, on Linux (:data:`FORKED_WORKERS`), the blocks run in ``workers`` forked processes with one
    torch and one BLAS thread each: the work of a block is many small operations, and threads
    of one interpreter wait for one another to run them (two threads finish a run's blocks about
    as fast as one). Otherwise they run in threads with one torch thread each. The function
    mapped must return a picklable value in the processes; it reads what the caller held when
    the map started (the fork's copy), and what it changes there is not seen by the caller.
    ``processes=False`` keeps every block in threads (blocks of large operations, which leave
    the interpreter free, and whose progress the caller reports from the threads).
    """
    workers = check_int("workers", workers, low=1)
    if workers == 1 or n_blocks <= 1:
        yield map
        return
    if blocks_fork(workers, n_blocks, processes=processes):
        yield lambda fn, items: _in_processes(fn, items, min(workers, n_blocks))
        return
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(
        max_workers=min(workers, n_blocks), initializer=torch.set_num_threads, initargs=(1,)
    )
    try:
        yield lambda fn, items: _ordered(pool, fn, items, workers)
    finally:
        pool.shutdown(cancel_futures=True)


def _in_processes(fn: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[R]:
    """``fn`` over ``items`` in ``workers`` forked processes, in order (:func:`_ordered`)."""
    from concurrent.futures import ProcessPoolExecutor

    token = next(_TOKENS)
    _JOBS[token] = fn  # before the pool forks its workers
    release_free_heap()
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("fork"),
        initializer=_worker_process,
        initargs=(os.getpid(),),
    )
    try:
        for out in _ordered(pool, functools.partial(_call, token), items, workers):
            yield pickle.loads(out)
    finally:
        pool.shutdown(cancel_futures=True)
        del _JOBS[token]


def release_free_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``; nothing where
    the C library has none). Called before forking: the workers share the parent's pages, so a
    page the parent freed but kept (the rounds' many short-lived arrays leave such pages) would
    count in the memory of every process."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _worker_process(parent: int) -> None:
    """A block process: one torch and one BLAS thread; an interrupt is the parent's to handle
    (it stops the pool), not a traceback from every worker; and it ends when its parent is gone
    (a run killed outright leaves no worker behind holding its memory)."""
    from threadpoolctl import threadpool_limits

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    threadpool_limits(limits=1, user_api="blas")
    threading.Thread(target=_end_with, args=(parent,), daemon=True).start()


def _end_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_ORPHAN_CHECK_SECONDS)
    os._exit(1)


_ORPHAN_CHECK_SECONDS = 0.5


def _call(token: int, item: Any) -> bytes:
    # the result pickled here (tensors by value), not shared through the pool's memory handles
    return pickle.dumps(_JOBS[token](item), protocol=pickle.HIGHEST_PROTOCOL)


def _ordered(pool: Any, fn: Callable[[T], R], items: Iterable[T], ahead: int) -> Iterator[R]:
    """``fn`` over ``items`` in order, at most ``ahead`` computed ahead of the one consumed (the
    results of blocks not yet consumed are held: a bounded number of them)."""
    pending: list[Any] = []
    for item in items:
        pending.append(pool.submit(fn, item))
        if len(pending) > ahead:
            yield pending.pop(0).result()
    while pending:
        yield pending.pop(0).result()
