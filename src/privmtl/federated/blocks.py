"""Blocks of clients: the end of a run works on a bounded number of clients at a time.

A client's end-of-run outcome (local training, fine-tuning, its own choice on its own validation
split) depends on its own data, its own trained model and public values only, never on which
other clients are computed beside it. The end of the run therefore takes the population in
blocks of at most :data:`END_OF_RUN_BLOCK` clients, so that its candidates, minibatch plans and
padded batches cost memory for one block, whatever the population.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np
import torch

from privmtl._validation import check_int

__all__ = ["END_OF_RUN_BLOCK", "client_blocks", "concurrent_blocks"]

T = TypeVar("T")
R = TypeVar("R")

END_OF_RUN_BLOCK = 1024
"""Most clients whose end of run is computed at once (vectorised within the block)."""


def client_blocks(m: int, block: int = END_OF_RUN_BLOCK) -> Iterator[np.ndarray]:
    """The positions 0 to m - 1 in consecutive blocks of at most ``block`` clients."""
    block = check_int("block", block, low=1)
    for start in range(0, m, block):
        yield np.arange(start, min(start + block, m), dtype=np.int64)


@contextmanager
def concurrent_blocks(
    workers: int, n_blocks: int
) -> Iterator[Callable[[Callable[[T], R], Iterable[T]], Iterator[R]]]:
    """A ``map`` over blocks that yields the results in the blocks' order, computing up to
    ``workers`` blocks at once in threads with one torch thread each (the blocks are independent:
    a client's outcome does not depend on which block computes it or when). One worker, or one
    block, maps in the calling thread."""
    workers = check_int("workers", workers, low=1)
    if workers == 1 or n_blocks <= 1:
        yield map
        return
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(
        max_workers=min(workers, n_blocks), initializer=torch.set_num_threads, initargs=(1,)
    )
    try:
        yield lambda fn, items: _ordered(pool, fn, items, workers)
    finally:
        pool.shutdown(cancel_futures=True)


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
