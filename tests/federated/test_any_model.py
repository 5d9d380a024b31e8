"""Any torch.nn.Module in the default engine configuration (2 threads, parallel client groups)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engine_defaults import old_config
from torch import nn

from privmtl.data.federated import FederatedDataset, make_synthetic_federated
from privmtl.exceptions import InvalidParameterError
from privmtl.federated import FemnistCNN, MultinomialLogReg, TrainConfig, train

D, C = 6, 4


class _Tokens(nn.Module):
    """Embedding of the integer part of the first feature, then a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(8, 5)
        self.head = nn.Linear(5 + D, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tok = (x[..., 0].abs() * 3).long().clamp(0, 7)
        return self.head(torch.cat([self.emb(tok), x], dim=-1))


class _Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 3, kernel_size=3, padding=1)
        self.norm = nn.GroupNorm(1, 3)
        self.head = nn.Linear(3 * D, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm(self.conv(x.unsqueeze(-2))))
        return self.head(h.flatten(-2))


MODULES = {
    "mlp": lambda: nn.Sequential(nn.Linear(D, 16), nn.ReLU(), nn.Linear(16, C)),
    "layernorm": lambda: nn.Sequential(
        nn.Linear(D, 8), nn.LayerNorm(8), nn.Tanh(), nn.Linear(8, C)
    ),
    "conv+groupnorm": _Conv,
    "embedding": _Tokens,
    "logreg-vmap": lambda: MultinomialLogReg(D, C, zero_init=False, random_state=0),
}


@pytest.fixture(scope="module")
def data() -> FederatedDataset:
    # unequal client sizes, so the parallel groups of a round have unequal sizes and work
    return make_synthetic_federated(
        n_clients=14, n_features=D, n_classes=C, samples_per_client=(5, 40), random_state=1
    )


def _default(**kw) -> TrainConfig:
    # the defaults (threads=2, parallel groups, vectorize="auto") with seeded noise for the checks
    base = {"rounds": 3, "clients_per_round": 9, "noise_std": 0.01, "progress": False,
            "noise_source": "seeded"}  # fmt: skip
    return old_config(**{**base, **kw})


def _max_diff(a, b) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in a)


@pytest.mark.parametrize("name", list(MODULES))
@pytest.mark.parametrize("client_chunk", [2, 8])
def test_default_engine_matches_per_client_reference(data, name, client_chunk):
    torch.manual_seed(0)
    model = MODULES[name]().double()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = _default(client_chunk=client_chunk, vectorize="vmap")
    assert cfg.threads == 2 and cfg.parallel_chunks and cfg.batched
    a = train(data, model, cfg)
    b = train(data, model, cfg)
    ref = train(data, model, dataclasses.replace(cfg, batched=False))
    assert a.personalized_params is not None and ref.personalized_params is not None
    assert _max_diff(a.personalized_params, b.personalized_params) == 0.0  # bit-identical
    assert _max_diff(a.personalized_params, ref.personalized_params) < 1e-4
    assert _max_diff(a.global_params, ref.global_params) < 1e-4
    for n, p in model.named_parameters():  # the user's module is left as it was
        assert torch.equal(p, before[n])


def test_builtin_cnn_with_generic_vmap_in_parallel_groups(data):
    images = make_synthetic_federated(
        n_clients=6, n_features=784, n_classes=5, samples_per_client=(4, 12), random_state=0
    )
    images = dataclasses.replace(images, feature_shape=(1, 28, 28))
    cnn = FemnistCNN(n_classes=5, random_state=0).double()
    cfg = old_config(rounds=2, clients_per_round=5, progress=False, noise_source="seeded",
                      client_chunk=2)  # fmt: skip
    vm = train(images, cnn, dataclasses.replace(cfg, vectorize="vmap"))
    own = train(images, cnn, dataclasses.replace(cfg, vectorize="model"))
    assert _max_diff(vm.personalized_params, own.personalized_params) < 1e-8


def test_dropout_runs_in_parallel_groups_and_leaves_the_module_unchanged(data):
    model = nn.Sequential(nn.Linear(D, 16), nn.Dropout(0.2), nn.ReLU(), nn.Linear(16, C))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    res = train(data, model, _default())
    assert res.history[-1]["train_loss"] == res.history[-1]["train_loss"]  # not NaN
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


@pytest.mark.parametrize("track", [True, False])
def test_batchnorm_is_refused_with_a_clear_message(data, track):
    model = nn.Sequential(nn.Linear(D, 8), nn.BatchNorm1d(8, track_running_stats=track),
                          nn.Linear(8, C))  # fmt: skip
    with pytest.raises(InvalidParameterError, match=r"BatchNorm1d \(1\).*LayerNorm"):
        train(data, model, _default())
