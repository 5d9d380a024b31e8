"""method="fedrep": DP-FedRep's accounting, the head that never leaves a client, and an oracle."""

from __future__ import annotations

import math
from typing import Any

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from engine_defaults import old_config
from torch import nn

from privmtl.data.federated import FederatedDataset
from privmtl.exceptions import InvalidParameterError
from privmtl.federated import MultinomialLogReg
from privmtl.federated.fedrep import PartStep, head_names, representation_names
from privmtl.federated.protocol import Trainer


class MLP(nn.Module):
    """A two-layer network: ``body`` (the representation) and ``head``."""

    def __init__(self, n_features: int, n_classes: int, width: int = 4, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.body = nn.Linear(n_features, width)
        self.head = nn.Linear(width, n_classes)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(x)))  # type: ignore[no-any-return]


BASE: dict[str, Any] = {
    "method": "fedrep",
    "rounds": 4,
    "clients_per_round": 4,
    "clip": 0.5,
    "noise_std": 0.2,
    "lr": 0.1,
    "head_epochs": 2,
    "progress": False,
    "threads": 1,
    "noise_source": "seeded",
    "sampling": "poisson",
    "relation": "add-remove",
    "delta": 1e-5,
}
REP = ["body.weight", "body.bias"]


def _mlp(ds: FederatedDataset) -> MLP:
    return MLP(ds.n_features, ds.n_classes)


# ------------------------------------------------------------------- the split
def test_default_representation_is_every_layer_but_the_last() -> None:
    names = ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "classifier.weight"]
    assert representation_names(names) == (
        "conv1.weight",
        "conv1.bias",
        "conv2.weight",
        "conv2.bias",
    )
    assert head_names(names, representation_names(names)) == ("classifier.weight",)
    nested = ["f.0.weight", "f.0.bias", "f.2.weight", "f.2.bias"]
    assert representation_names(nested) == ("f.0.weight", "f.0.bias")
    with pytest.raises(InvalidParameterError, match="shared_params"):
        representation_names(["linear.weight", "linear.bias"])


def test_fedrep_needs_a_head(tabular: FederatedDataset) -> None:
    with pytest.raises(InvalidParameterError, match="shared_params"):
        Trainer(tabular, MultinomialLogReg(tabular.n_features, tabular.n_classes),
                old_config(**BASE))  # fmt: skip
    with pytest.raises(InvalidParameterError, match="head"):
        Trainer(tabular, _mlp(tabular), old_config(**BASE, shared_params=("body", "head")))
    with pytest.raises(InvalidParameterError, match="head_epochs"):
        old_config(**{**BASE, "head_epochs": 0})


def test_part_step_moves_only_its_parameters() -> None:
    state = {"a": torch.ones(2, 3), "b": torch.ones(2, 1)}
    PartStep(lr=0.5, trainable=frozenset({"a"})).apply_(
        state, {"a": torch.full((2, 3), 2.0), "b": torch.full((2, 1), 2.0)}
    )
    assert torch.equal(state["a"], torch.zeros(2, 3))
    assert torch.equal(state["b"], torch.ones(2, 1))


# ------------------------------------------------------------------- (a) accounting
#: the RDP orders of privmtl's accountant (integers: fractional orders below 2 may not converge)
ORDERS = [float(a) for a in range(2, 65)] + [80.0, 96.0, 128.0, 192.0, 256.0, 512.0, 1024.0]


def _independent_epsilon(q: float, z: float, rounds: int, delta: float) -> float:
    """ε of T Poisson-subsampled Gaussian releases from dp-accounting itself."""
    acc = dpa.rdp.RdpAccountant(orders=ORDERS)
    event = dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z))
    acc.compose(dpa.SelfComposedDpEvent(event, rounds))
    return float(acc.get_epsilon(delta))


def test_reported_epsilon_is_the_accountants_for_the_same_q_z_t(tabular: FederatedDataset) -> None:
    res = Trainer(tabular, _mlp(tabular), old_config(**BASE)).run()
    m = tabular.n_clients
    z = BASE["noise_std"] * BASE["clients_per_round"] / BASE["clip"]  # z = sigma q / clip
    expected = _independent_epsilon(BASE["clients_per_round"] / m, z, BASE["rounds"], 1e-5)
    assert math.isfinite(res.epsilon) and res.epsilon > 0
    assert res.epsilon == pytest.approx(expected, rel=1e-6)
    assert res.guarantee.epsilon == res.epsilon and res.guarantee.sampling == "poisson"
    assert res.ledger is not None and len(res.ledger.records) == BASE["rounds"]


def test_run_pmtl_fedrep_calibrates_to_the_target(tabular: FederatedDataset, tmp_path: Any) -> None:
    from privmtl.experiments.pmtl import run_pmtl

    src = tmp_path / "mlp_factory.py"
    src.write_text(
        "import torch\n"
        "from torch import nn\n"
        "def build(n_features, n_classes):\n"
        "    return nn.Sequential(nn.Linear(n_features, 4), nn.Tanh(), nn.Linear(4, n_classes))\n"
    )
    out = run_pmtl(
        data="synthetic", model=f"{src}:build", dataset=tabular, method="fedrep", epsilon=1.0,
        rounds=3, clients_per_round=4, noise_source="seeded", show_progress=False, threads=1,
        finetune="none", head_epochs=1,
    )  # fmt: skip
    assert out["representation"] == ["0.weight", "0.bias"]
    assert out["head"] == ["2.weight", "2.bias"] and out["head_epochs"] == 1
    assert out["released_dim"] == 8 * 4 + 4
    assert out["config"]["method"] == "fedrep" and out["config"]["head_epochs"] == 1
    assert out["covered"] is True and out["noise_source"] == "seeded"
    m = tabular.n_clients
    expected = _independent_epsilon(4 / m, out["noise_multiplier"], 3, out["delta"])
    assert out["epsilon"] == pytest.approx(expected, rel=1e-6)
    assert expected <= 1.0 + 1e-6


# ------------------------------------------------------------------- (b) the head stays home
def _released(tabular: FederatedDataset, perturb: int | None) -> tuple[list[Any], Any]:
    """Every released vector of a fedrep run, one client's stored head perturbed (or not)."""
    tr = Trainer(tabular, _mlp(tabular), old_config(**BASE))
    if perturb is not None:
        sel = torch.tensor([perturb])
        stored = tr.clients.gather("personal", sel)
        for n in ("head.weight", "head.bias"):
            stored[n] += 5.0
        tr.clients.scatter("personal", sel, stored)
    out = []
    for rec in tr:
        out.append({n: p.clone() for n, p in rec.released.items()})
    return out, tr


def test_released_vectors_have_the_representations_dimension_only(
    tabular: FederatedDataset,
) -> None:
    released, tr = _released(tabular, None)
    assert sorted(tr.curator.billboard) == sorted(REP)
    sent: list[list[str]] = []

    def hook(t: int, sampled: np.ndarray, msgs: dict[str, torch.Tensor]) -> Any:
        sent.append(sorted(msgs))
        return msgs

    Trainer(tabular, _mlp(tabular), old_config(**BASE), message_hook=hook).run()
    assert sent == [sorted(REP)] * BASE["rounds"]  # what the clients send: the representation
    assert all(sorted(r) == sorted(REP) for r in released)
    dim = sum(p.numel() for p in _mlp(tabular).body.parameters())
    assert [h["released_dim"] for h in tr.history] == [dim] * BASE["rounds"]
    records = tr.ledger.records if tr.ledger is not None else []
    assert len(records) == BASE["rounds"]


def test_released_vectors_ignore_a_clients_head_after_its_own_head_training(
    tabular: FederatedDataset,
) -> None:
    """A client's stored head is retrained before it touches the representation: perturbing
    the head of a client never sampled, or of one that is, leaves every release unchanged except
    through the client's own (clipped) representation update."""
    base, tr0 = _released(tabular, None)
    sampled = sorted({k for h in tr0.history for k in h["sampled"]})
    never = [k for k in range(tabular.n_clients) if k not in sampled]
    assert never, "the test needs a client that is never sampled"
    perturbed, tr1 = _released(tabular, never[0])
    for a, b in zip(base, perturbed, strict=True):
        for n in REP:
            assert torch.equal(a[n], b[n])
    # ... and the perturbed head did stay on its client
    res = tr1.result()
    assert res.personalized_params is not None
    assert not torch.equal(
        res.personalized_params["head.bias"][never[0]],
        tr0.result().personalized_params["head.bias"][never[0]],  # type: ignore[index]
    )


def test_a_sampled_clients_head_reaches_the_release_only_through_its_update(
    tabular: FederatedDataset,
) -> None:
    """Perturbing a sampled client's head changes the releases by at most its clipped share:
    the message is the representation's change, never the head."""
    base, tr0 = _released(tabular, None)
    k = tr0.history[0]["sampled"][0]
    perturbed, _ = _released(tabular, k)
    first = base[0], perturbed[0]
    diff = math.sqrt(sum(float((first[0][n] - first[1][n]).pow(2).sum()) for n in REP))
    # two messages of norm <= clip differ by at most 2 clip; the mean divides by q
    assert diff <= 2 * BASE["clip"] / BASE["clients_per_round"] + 1e-6


# ------------------------------------------------------------------- (c) an oracle
def _shared_representation_data(seed: int = 0) -> FederatedDataset:
    """Clients whose labels depend on x only through a common 2-d projection B x, each with its
    own linear head on it (a truly shared representation), and few examples each."""
    rng = np.random.default_rng(seed)
    d, r, c, m = 20, 2, 3, 40
    b = rng.normal(size=(r, d))
    xs, ys = {}, {}
    heads = rng.normal(size=(m, c, r)) * 3.0
    for split, n in (("train", 12), ("val", 30), ("test", 60)):
        xs[split], ys[split] = [], []
        for k in range(m):
            x = rng.normal(size=(n, d)).astype(np.float32)
            y = (x @ b.T @ heads[k].T).argmax(1)
            xs[split].append(torch.from_numpy(x))
            ys[split].append(torch.from_numpy(y.astype(np.int64)))
    return FederatedDataset(
        client_ids=[f"c{k}" for k in range(m)],
        train_x=xs["train"], train_y=ys["train"], val_x=xs["val"], val_y=ys["val"],
        test_x=xs["test"], test_y=ys["test"], n_classes=c, feature_shape=(d,),
    )  # fmt: skip


@pytest.mark.slow
def test_nonprivate_fedrep_beats_local_training_on_a_shared_representation() -> None:
    ds = _shared_representation_data()
    net = MLP(ds.n_features, ds.n_classes, width=2)
    common = {"rounds": 100, "progress": False, "threads": 1, "noise_source": "seeded",
              "sampling": "all", "lr": 0.3, "clip": None, "noise_std": 0.0, "client_chunk": None}  # fmt: skip
    fedrep = Trainer(ds, net, old_config(method="fedrep", head_epochs=5, **common)).run()
    local = Trainer(ds, net, old_config(method="local", **common)).run()
    assert fedrep.test_accuracy > local.test_accuracy + 0.1, (
        fedrep.test_accuracy,
        local.test_accuracy,
    )
