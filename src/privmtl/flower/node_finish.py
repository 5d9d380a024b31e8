"""A SuperNode's end of run in one pass: its clients finished and scored a block at a time.

:func:`finish_and_score` runs :func:`~privmtl.federated.finish.finish_pass` over the node's
clients with a sink (:data:`~privmtl.federated.finish.BlockSink`) that scores each block as it
is finished, on the block's data the pass drew: a node draws each block of its clients once
for its end of run and its scores, as ``privmtl pmtl`` does in process.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from privmtl.data.federated import FederatedDataset
from privmtl.federated.algorithms import Params
from privmtl.federated.finish import ClientFinish, FinishOptions, finish_pass
from privmtl.flower.node_data import is_lazy

if TYPE_CHECKING:
    from privmtl.flower.node_clients import NodeClients

__all__ = ["Stack", "finish_and_score"]


def finish_and_score(
    node: NodeClients, options: dict[str, Any], personal: Params, glob_model: Params
) -> tuple[ClientFinish, Params, dict[str, Any], float]:
    """The clients' end of run in one pass (:func:`~privmtl.federated.finish.finish_pass`,
    ``options``: the fields of its :class:`~privmtl.federated.finish.FinishOptions`), each
    block scored by the pass's sink while its data are at hand: a lazy partition's block is
    drawn once, for its finishing and its scores (the sink takes the block's data the pass
    drew; a block is drawn again only where a worker process drew it). Returns the pass's
    result, the final models stacked in the clients' order, the scores
    (:meth:`NodeClients._scores`' keys) and the seconds the sink scored."""
    data = node._end_data()
    got: dict[str, list[float]] = {}
    final = Stack(len(node.clients))
    seconds = [0.0]

    def sink(pos: np.ndarray, params: Params, piece: FederatedDataset | None) -> None:
        t0 = time.perf_counter()
        if piece is None:
            whole_data = len(pos) == data.n_clients and not is_lazy(data)
            piece = data if whole_data else data.subset(pos.tolist())
        whole = len(pos) == len(node.clients)
        node._score_block(pos, piece, personal, glob_model, params, got, whole)
        final.add(pos, params)
        seconds[0] += time.perf_counter() - t0

    done = finish_pass(
        FinishOptions(**options), data, node.model, personal, glob_model, on_block=sink
    )
    return done, final.params, node._score_result(got), seconds[0]


class Stack:
    """The final models of ``k`` clients, stacked ``(k, ...)`` in the clients' order as the
    blocks ``(positions, models)`` come (:meth:`add`): one stack, the blocks copied in and
    dropped (a block holding every client is kept as it is)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.params: Params = {}

    def add(self, pos: np.ndarray, params: Params) -> None:
        if not self.params and len(pos) == self.k:
            self.params = params
            return
        if not self.params:
            self.params = {n: p.new_empty((self.k, *p.shape[1:])) for n, p in params.items()}
        rows = torch.from_numpy(np.asarray(pos, dtype=np.int64))
        for n, p in params.items():
            self.params[n][rows] = p
