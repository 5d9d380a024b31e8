"""Small data sets and models for the federated engine tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from privmtl.data.federated import FederatedDataset, make_synthetic_federated


class TinyCNN(nn.Module):
    """A user-defined CNN without ``forward_batched``: exercises the generic vmap path.

    A smooth activation (softplus) and average pooling keep the network smooth, so float32
    rounding differences between the batched and per-client convolutions stay ~1e-7: with a ReLU
    (or max-pooling) a pre-activation within rounding of its kink takes a different branch in the
    two paths and the difference jumps to the size of a step (float64 runs of the same plans agree
    to 1e-16, so the paths compute the same thing).
    """

    def __init__(self, n_classes: int = 5) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.conv = nn.Conv2d(1, 4, kernel_size=3)
        self.fc = nn.Linear(4 * 13 * 13, n_classes)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.softplus(self.conv(x.reshape(-1, 1, 28, 28)))
        return self.fc(nn.functional.avg_pool2d(h, 2).flatten(1))


@pytest.fixture(scope="session")
def tiny_cnn() -> type[TinyCNN]:
    """The TinyCNN class (test modules cannot import conftest under --import-mode=importlib)."""
    return TinyCNN


@pytest.fixture(scope="session")
def tabular() -> FederatedDataset:
    """12 heterogeneous clients, 8 features, 4 classes, 15..60 examples each."""
    return make_synthetic_federated(
        n_clients=12, n_features=8, n_classes=4, samples_per_client=(15, 60), random_state=0
    )


@pytest.fixture(scope="session")
def images() -> FederatedDataset:
    """6 clients of random 28×28 'images' with unequal sizes (3..23 train examples), 5 classes."""
    rng = np.random.default_rng(1)
    sizes = [3, 8, 12, 17, 20, 23]
    xs = [rng.random((n, 784), dtype=np.float32) for n in sizes]
    ys = [rng.integers(0, 5, n) for n in sizes]
    tx = [rng.random((4, 784), dtype=np.float32) for _ in sizes]
    ty = [rng.integers(0, 5, 4) for _ in sizes]
    return FederatedDataset(
        client_ids=[f"w{k}" for k in range(len(sizes))],
        train_x=[torch.from_numpy(x) for x in xs],
        train_y=[torch.from_numpy(y) for y in ys],
        val_x=[torch.from_numpy(x) for x in tx],
        val_y=[torch.from_numpy(y) for y in ty],
        test_x=[torch.from_numpy(x) for x in tx],
        test_y=[torch.from_numpy(y) for y in ty],
        n_classes=5,
        feature_shape=(1, 28, 28),
    )
