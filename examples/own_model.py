"""Your own PyTorch model, trained with PMTL under client-level differential privacy.

Run: ``python examples/own_model.py`` (``PRIVMTL_EXAMPLE_SMALL=1`` for a few seconds' version).
"""

from __future__ import annotations

import os

import torch

from privmtl.data.federated import make_synthetic_federated
from privmtl.federated import TrainConfig, config_for_epsilon, train

SMALL = os.environ.get("PRIVMTL_EXAMPLE_SMALL") == "1"


def main() -> None:
    data = make_synthetic_federated(n_clients=20 if SMALL else 50, random_state=0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(data.n_features, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, data.n_classes),
    )
    config = TrainConfig(
        method="pmtl",
        rounds=5 if SMALL else 100,
        clients_per_round=10,
        lam=0.01,
        # A simulation: noise drawn from the seed. Drop this line for secure noise.
        noise_source="seeded",
        seed=0,
    )
    config = config_for_epsilon(config, data.n_clients, target_epsilon=2.0)
    result = train(data, model, config)
    acc = result.accuracies["test"][result.primary]["accuracy"]
    cfg = result.config
    print(f"test accuracy ({result.primary} models): {acc:.3f}")
    print(
        f"privacy: (ε={result.epsilon:.3g}, δ={result.delta:.3g}) billboard privacy (joint DP), "
        f"neighbours: {cfg.relation} one client, sampling: {cfg.sampling}, "
        f"accountant: {cfg.accountant}, noise: {result.noise_source}"
    )


if __name__ == "__main__":
    main()
