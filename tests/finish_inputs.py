"""A small end-of-run setup shared by the finish tests (importable from tests/)."""

from __future__ import annotations

import torch

from privmtl.data.federated import make_synthetic_federated
from privmtl.experiments.pmtl import make_model


def finish_inputs(m=9):
    """``(data, model, trained models, billboard)``: m synthetic clients, logistic regression,
    trained models scattered around the initial one and their mean as the billboard."""
    ds = make_synthetic_federated(n_clients=m, random_state=1)
    net = make_model("logreg", ds, 0)
    gen = torch.Generator().manual_seed(0)
    init = dict(net.named_parameters())
    trained = {
        n: p.detach().unsqueeze(0).repeat(m, *[1] * p.ndim) + 0.1 * torch.randn(m, *p.shape, generator=gen)
        for n, p in init.items()
    }  # fmt: skip
    board = {n: p.mean(0) for n, p in trained.items()}
    return ds, net, trained, board
