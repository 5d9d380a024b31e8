"""The engine on clients drawn when needed: a round reads its sampled clients' data only, the
scoring reads one block at a time, and the numbers are those of the data held in memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privmtl.data.federated import make_synthetic_federated
from privmtl.data.streamed import SyntheticFederation
from privmtl.federated import MultinomialLogReg, TrainConfig
from privmtl.federated.algorithms import draw_round_plan
from privmtl.federated.protocol import Trainer
from privmtl.federated.scoring import evaluate, evaluate_dataset


def test_round_plan_rows_into_the_sampled_clients_are_the_same_minibatches() -> None:
    ds = make_synthetic_federated(n_clients=60, random_state=0)
    _, _, offsets = ds.concat("train")
    sampled = np.array([41, 3, 17])
    cfg = TrainConfig(local_epochs=2, batch_size=4, seed=5)
    whole = draw_round_plan(sampled, offsets, 7, cfg)
    x_s, _, own = ds.take(sampled)
    part = draw_round_plan(sampled, offsets, 7, cfg, starts=own[:-1])
    x_all = ds.concat("train")[0]
    for steps_w, steps_p in zip(whole, part, strict=True):
        assert len(steps_w) == len(steps_p)
        for a, b in zip(steps_w, steps_p, strict=True):
            assert torch.equal(x_all[a], x_s[b])  # the same examples, other row numbers


@pytest.mark.parametrize("method", ["pmtl", "fedrep"])
def test_trainer_on_drawn_clients_equals_the_data_in_memory(method: str) -> None:
    kw = {"n_clients": 1100, "samples_per_client": (3, 12), "random_state": 2}
    lazy = SyntheticFederation(**kw)
    eager = make_synthetic_federated(**kw)
    cfg = TrainConfig(
        method=method, rounds=3, clients_per_round=40, noise_std=0.5, clip=1.0, seed=1,
        local_epochs=1, batch_size=8,
    )  # fmt: skip
    torch.manual_seed(0)
    model = (
        MultinomialLogReg(eager.n_features, eager.n_classes)
        if method == "pmtl"
        else torch.nn.Sequential(
            torch.nn.Linear(eager.n_features, 8), torch.nn.ReLU(), torch.nn.Linear(8, 10)
        )
    )
    a = Trainer(eager, model, cfg, noise_source="seeded").run()
    b = Trainer(lazy, model, cfg, noise_source="seeded").run()
    for n, p in a.global_params.items():
        assert torch.equal(p, b.global_params[n])
    assert a.test_accuracy == b.test_accuracy and a.val_accuracy == b.val_accuracy
    if method == "pmtl":  # nothing asked for every client's data at once
        assert lazy._whole is None


def test_evaluate_in_blocks_equals_evaluate_at_once() -> None:
    ds = make_synthetic_federated(n_clients=50, random_state=1)
    m, gen = ds.n_clients, torch.Generator().manual_seed(0)
    model = MultinomialLogReg(ds.n_features, ds.n_classes)
    personal = {n: torch.randn((m, *p.shape), generator=gen) for n, p in model.named_parameters()}
    glob = {n: torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()}
    for params, personalized in ((personal, True), (glob, False)):
        for split in ("val", "test"):
            whole = evaluate(model, params, {}, *ds.split(split), personalized=personalized)
            blocks = evaluate_dataset(
                model, {"x": (params, personalized)}, {}, ds, (split,), block=7
            )[split]["x"]
            for key in ("accuracy", "mean_client_accuracy", "n"):
                assert blocks[key] == whole[key]
            assert blocks["loss"] == pytest.approx(whole["loss"], rel=1e-6)
