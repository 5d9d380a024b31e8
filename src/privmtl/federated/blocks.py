"""Blocks of clients: the end of a run works on a bounded number of clients at a time.

A client's end-of-run outcome (local training, fine-tuning, its own choice on its own validation
split) depends on its own data, its own trained model and public values only, never on which
other clients are computed beside it. The end of the run therefore takes the population in
blocks of at most :data:`END_OF_RUN_BLOCK` clients, so that its candidates, minibatch plans and
padded batches cost memory for one block, whatever the population.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from privmtl._validation import check_int

__all__ = ["END_OF_RUN_BLOCK", "client_blocks"]

END_OF_RUN_BLOCK = 1024
"""Most clients whose end of run is computed at once (vectorised within the block)."""


def client_blocks(m: int, block: int = END_OF_RUN_BLOCK) -> Iterator[np.ndarray]:
    """The positions 0 to m - 1 in consecutive blocks of at most ``block`` clients."""
    block = check_int("block", block, low=1)
    for start in range(0, m, block):
        yield np.arange(start, min(start + block, m), dtype=np.int64)
