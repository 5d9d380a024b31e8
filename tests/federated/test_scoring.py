"""Scores of models on clients' data, kept block by block (federated.scoring)."""

from __future__ import annotations

import numpy as np
import torch

from privmtl.data.streamed import SyntheticFederation
from privmtl.federated.models import MultinomialLogReg
from privmtl.federated.scoring import BlockScores, evaluate


def test_block_scores_keep_counts_small_and_read_them_back_alike() -> None:
    # the scores kept block by block cost 32-bit integers a client, read back in their own type
    # (the same arrays, the same summary)
    ds = SyntheticFederation(n_clients=30, random_state=1).materialize()
    net = MultinomialLogReg(ds.n_features, ds.n_classes)
    torch.manual_seed(0)
    stacked = {n: torch.randn(30, *p.shape) for n, p in net.named_parameters()}
    book = BlockScores(net, {}, ("test",))
    for pos in (np.arange(0, 12), np.arange(12, 30)):
        part = ds.subset(pos.tolist())
        book.add("final", {n: p[torch.from_numpy(pos)] for n, p in stacked.items()}, True, part)
    assert all(
        c.dtype == np.int32 and n.dtype == np.int32 for c, n, _ in book._parts[("test", "final")]
    )
    correct, counts = book.per_client("test", "final")
    assert correct.dtype == np.float64 and counts.dtype == np.int64
    whole = evaluate(net, stacked, {}, *ds.split("test"), personalized=True)
    assert book.summary()["test"]["final"] == whole
