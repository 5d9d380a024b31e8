"""Training alone (``train_local``): every client, its own data only, tuned on validation."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from privmtl.data.federated import FederatedDataset, make_synthetic_federated
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.end_of_run.finetune import finetune_plan
from privmtl.federated.end_of_run.local import (
    ADAM_EPOCHS,
    ADAM_LRS,
    client_better,
    select_per_client,
    train_local,
)
from privmtl.federated.end_of_run.local_budget import ADAM_EPOCH_STEPS
from privmtl.federated.end_of_run.local_grid import _train_grid
from privmtl.federated.models import FemnistCNN, MultinomialLogReg
from privmtl.federated.scoring import client_scores

D, C, SEED, B = 5, 3, 4, 4


@pytest.fixture(scope="module")
def ds() -> FederatedDataset:
    return make_synthetic_federated(
        n_clients=9, n_features=D, n_classes=C, samples_per_client=(8, 40), random_state=5
    )


def _alone(ds: FederatedDataset, k: int, epochs: int, lr: float) -> dict[str, torch.Tensor]:
    """Client k trained by itself: a plain loop, nothing but its own rows and the documented
    minibatch law (fresh permutation per epoch from default_rng([seed, 3, k]), batches of B)."""
    x, y = ds.train_x[k].double(), ds.train_y[k]
    w = torch.zeros(C, D, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(C, dtype=torch.float64, requires_grad=True)
    rng = np.random.default_rng([SEED, 3, k])
    for _ in range(epochs):
        perm = rng.permutation(len(y))
        for i in range(0, len(y), B):
            idx = torch.from_numpy(perm[i : i + B])
            loss = F.cross_entropy(x[idx] @ w.T + b, y[idx])
            gw, gb = torch.autograd.grad(loss, (w, b))
            with torch.no_grad():
                w -= lr * gw
                b -= lr * gb
    return {"linear.weight": w.detach(), "linear.bias": b.detach()}


def _val_correct(ds: FederatedDataset, k: int, p: dict[str, torch.Tensor]) -> int:
    x, y = ds.val_x[k].double(), ds.val_y[k]
    pred = (x @ p["linear.weight"].T.double() + p["linear.bias"].double()).argmax(1)
    return int((pred == y).sum())


def _val_loss(ds: FederatedDataset, k: int, p: dict[str, torch.Tensor]) -> float:
    x, y = ds.val_x[k].double(), ds.val_y[k]
    logits = x @ p["linear.weight"].T.double() + p["linear.bias"].double()
    return float(F.cross_entropy(logits, y, reduction="sum"))


def test_each_client_gets_the_model_it_would_train_by_itself(ds: FederatedDataset) -> None:
    grid = {"epochs": (1, 3), "lrs": (0.05, 0.3)}
    res = train_local(ds, MultinomialLogReg(D, C), **grid, batch_size=B, seed=SEED)  # default
    sel = res.extra["local_selection"]
    assert sel["select"] == "client"
    assert sel["grid"] == [[1, 0.05], [1, 0.3], [3, 0.05], [3, 0.3]]
    assert res.epsilon == 0.0 and res.guarantee.epsilon == 0.0
    pers = res.personalized_params
    assert pers is not None
    for k in range(ds.n_clients):
        oracle = [_alone(ds, k, e, lr) for e, lr in sel["grid"]]
        g = sel["choice"][k]
        for n in oracle[g]:
            torch.testing.assert_close(pers[n][k].double(), oracle[g][n], rtol=1e-4, atol=1e-5)
        # the client's own validation split chose it: the most correct predictions of the grid,
        # the latest grid point (the most training) among ties
        correct = [_val_correct(ds, k, o) for o in oracle]
        assert correct[g] == max(correct)
        assert all(c < correct[g] for c in correct[g + 1 :])
        # every client was trained (zero init: an untrained client would still be all zeros)
        assert pers["linear.weight"][k].abs().sum() > 0


def test_pooled_selection_is_one_setting_with_the_best_pooled_validation(
    ds: FederatedDataset,
) -> None:
    res = train_local(ds, MultinomialLogReg(D, C), epochs=(1, 3), lrs=(0.05, 0.3), batch_size=B,
                      seed=SEED, select="pooled")  # fmt: skip
    sel = res.extra["local_selection"]
    assert len(set(sel["choice"])) == 1
    g = sel["choice"][0]
    pooled = [
        sum(_val_correct(ds, k, _alone(ds, k, e, lr)) for k in range(ds.n_clients))
        for e, lr in sel["grid"]
    ]
    assert pooled[g] == max(pooled)
    n_val = sum(len(y) for y in ds.val_y)
    np.testing.assert_allclose(sel["grid_val_accuracy"], np.array(pooled) / n_val, atol=1e-12)
    assert res.val_accuracy == pytest.approx(max(pooled) / n_val)


class _Plain(nn.Module):
    """The same linear model under other parameter names: the generic vmap(grad) path."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, C)
        nn.init.zeros_(self.lin.weight)
        nn.init.zeros_(self.lin.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def test_closed_form_logreg_gradient_matches_autograd_and_reference(ds: FederatedDataset) -> None:
    kw = {"epochs": (2,), "lrs": (0.2,), "batch_size": B, "seed": SEED, "client_chunk": 4}
    fast = train_local(ds, MultinomialLogReg(D, C), **kw).personalized_params
    generic = train_local(ds, _Plain(), **kw).personalized_params
    ref = train_local(ds, MultinomialLogReg(D, C), **kw, batched=False).personalized_params
    assert fast is not None and generic is not None and ref is not None
    torch.testing.assert_close(fast["linear.weight"], generic["lin.weight"])
    torch.testing.assert_close(fast["linear.bias"], generic["lin.bias"])
    torch.testing.assert_close(fast["linear.weight"], ref["linear.weight"])


def test_a_networks_grid_through_forward_batched_equals_the_reference_loop(
    images: FederatedDataset,
) -> None:
    """The CNN's grid takes the rounds' step (``forward_batched``, one grouped convolution); its
    models are the per-client reference loop's (``batched=False``: one client, plain autograd)."""
    kw = {"epochs": (1, 3), "lrs": (0.05, 0.2), "batch_size": 4, "seed": SEED, "client_chunk": 4}
    net = FemnistCNN(n_classes=5, random_state=0)
    fast = train_local(images, net, **kw)
    ref = train_local(images, net, **kw, batched=False)
    assert fast.personalized_params is not None and ref.personalized_params is not None
    for name, p in ref.personalized_params.items():
        torch.testing.assert_close(fast.personalized_params[name], p, rtol=1e-4, atol=1e-5)
    assert fast.extra["local_selection"]["choice"] == ref.extra["local_selection"]["choice"]


def test_a_networks_blocks_in_threads_give_the_models_of_one_block(
    images: FederatedDataset,
) -> None:
    """``workers=2`` trains a network's clients in two blocks at once; every client's model is
    the one it gets in one block (up to the rounding of its vectorised call), and so its choice."""
    kw = {"epochs": (1, 2), "lrs": (0.05, 0.2), "batch_size": 4, "seed": SEED}
    net = FemnistCNN(n_classes=5, random_state=0)
    seen: list[int] = []
    two = train_local(images, net, **kw, workers=2, on_clients=seen.append)
    one = train_local(images, net, **kw)
    assert one.personalized_params is not None and two.personalized_params is not None
    for name, p in one.personalized_params.items():
        torch.testing.assert_close(two.personalized_params[name], p, rtol=1e-4, atol=1e-5)
    assert two.extra["local_selection"]["choice"] == one.extra["local_selection"]["choice"]
    assert sum(seen) == images.n_clients and len(seen) >= 2  # progress from both blocks


def test_adam_grid_is_torch_adam_on_each_clients_own_minibatches(images: FederatedDataset) -> None:
    """Oracle: one client at a time, ``torch.optim.Adam`` on the mean cross-entropy of the
    minibatches of ``finetune_plan`` (the SGD grid's), from the initial model, for the client's
    own epochs of the step budget (at least ``ADAM_EPOCH_STEPS`` steps per epoch of the grid)."""
    epochs, lr = 3, 0.01
    net = FemnistCNN(n_classes=5, random_state=0)
    res = train_local(
        images, net, epochs=(epochs,), lrs=(lr,), batch_size=4, seed=SEED, solver="adam"
    )
    assert res.personalized_params is not None
    assert res.extra["local_selection"]["solver"] == "adam"
    x_all, y_all, _ = images.concat("train")
    per_epoch = -(-images.sizes("train") // 4)
    own_epochs = np.maximum(epochs, -(-epochs * ADAM_EPOCH_STEPS // per_epoch))
    assert (own_epochs > epochs).any()  # the budget stretches the fixture's clients
    for k in range(images.n_clients):
        steps = finetune_plan(images, epochs=int(own_epochs[k]), batch_size=4, seed=SEED)[k]
        own = copy.deepcopy(net)
        opt = torch.optim.Adam(own.parameters(), lr=lr)
        for rows in steps:
            opt.zero_grad()
            F.cross_entropy(own(x_all[rows]), y_all[rows]).backward()
            opt.step()
        for name, p in own.named_parameters():  # Adam's m / sqrt(v) magnifies the last digits
            # of a near-zero gradient: 1e-3 is a tenth of one step (lr), far below a wrong update
            torch.testing.assert_close(
                res.personalized_params[name][k], p.detach(), rtol=1e-3, atol=1e-3
            )


def test_adam_defaults_to_its_own_grid(images: FederatedDataset) -> None:
    res = train_local(images, FemnistCNN(n_classes=5, random_state=0), solver="adam", block=3)
    grid = res.extra["local_selection"]["grid"]
    assert grid == [[e, lr] for e in ADAM_EPOCHS for lr in ADAM_LRS]


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        ({"epochs": ()}, "epochs"),
        ({"epochs": (0,)}, "epochs"),
        ({"lrs": (0.0,)}, "lrs"),
        ({"lrs": []}, "lrs"),
        ({"select": "best"}, "select"),
        ({"batch_size": 0}, "batch_size"),
        ({"client_chunk": 0}, "client_chunk"),
        ({"patience": 0}, "patience"),
        ({"patience": 2, "batched": False}, "patience"),
        ({"patience": 2, "solver": "ridge"}, "patience"),
    ],
)
def test_bad_input_names_the_parameter(ds: FederatedDataset, kw: dict, name: str) -> None:
    with pytest.raises(InvalidParameterError, match=name):
        train_local(ds, MultinomialLogReg(D, C), **kw)


@pytest.mark.parametrize("patience", [None, 1, 2])
def test_a_clients_model_does_not_depend_on_another_clients_labels(
    ds: FederatedDataset, patience: int | None
) -> None:
    """select="client" (the default): replacing client 0's labels leaves every other client's
    model bit-identical (also stopping early: client 0 then stops at other epochs)."""
    other = copy.deepcopy(ds)
    other.train_y[0] = (other.train_y[0] + 1) % C
    other.val_y[0] = (other.val_y[0] + 1) % C
    kw = {"epochs": (1, 10), "lrs": (0.001, 0.05), "batch_size": B, "seed": SEED}
    kw["patience"] = patience
    a = train_local(ds, MultinomialLogReg(D, C), **kw).personalized_params
    b = train_local(other, MultinomialLogReg(D, C), **kw).personalized_params
    assert a is not None and b is not None
    for n in a:
        assert torch.equal(a[n][1:], b[n][1:])
        assert not torch.equal(a[n][0], b[n][0])


def test_client_better_counts_correct_ties_go_later_and_never_nan() -> None:
    best_c = np.array([1.0, 1.0, 1.0, 0.0, 2.0, -1.0])
    best_l = np.array([0.3, 0.3, np.nan, 9.0, 0.1, np.nan])
    correct = np.array([2.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    loss = np.array([5.0, 9.0, 1.0, np.nan, 0.0, 3.0])
    # more correct wins whatever the loss; a tie goes to the later candidate; a finite candidate
    # replaces a diverged best; a diverged candidate never wins
    assert client_better(correct, loss, best_c, best_l).tolist() == [
        True, True, True, False, False, True,
    ]  # fmt: skip


def test_select_per_client_keeps_each_clients_most_correct_later_on_ties() -> None:
    # clients with enough validation examples that their choices differ (the module's data give
    # most clients 0 to 2, and every client may then keep one setting), one with none
    ds = make_synthetic_federated(
        n_clients=9, n_features=D, n_classes=C, samples_per_client=(3, 60), val_fraction=0.3,
        random_state=13,
    )  # fmt: skip
    assert any(not y.numel() for y in ds.val_y)
    net = MultinomialLogReg(D, C)
    buffers: dict[str, torch.Tensor] = {}
    cands = [
        train_local(ds, net, epochs=(e,), lrs=(lr,), batch_size=B, seed=SEED).personalized_params
        for e, lr in [(1, 0.05), (3, 0.3), (2, 0.1)]
    ]
    chosen, choice, correct = select_per_client(iter(cands), net, buffers, ds.val_x, ds.val_y)
    assert len(set(choice.tolist())) > 1  # the clients' choices differ: the rule is exercised
    for k in range(ds.n_clients):
        counts = [_val_correct(ds, k, {n: p[k] for n, p in c.items()}) for c in cands]
        assert counts[choice[k]] == max(counts) == correct[k]
        assert all(c < counts[choice[k]] for c in counts[choice[k] + 1 :])  # ties: the later
        for n in chosen:
            assert torch.equal(chosen[n][k], cands[choice[k]][n][k])
        if not ds.val_y[k].numel():  # no validation data: the last candidate (public order)
            assert choice[k] == len(cands) - 1


@pytest.mark.parametrize("block", [1, 4])
def test_blocks_of_clients_give_every_client_the_model_of_the_whole(block: int) -> None:
    """Trained a block at a time (its grid held for one block), every client ends with the model,
    the choice and the pooled grid accuracies of the population trained at once."""
    # clients with enough validation examples that their choices differ (the module's data give
    # most clients 0 to 2, and every client then keeps the last setting)
    ds = make_synthetic_federated(
        n_clients=9, n_features=D, n_classes=C, samples_per_client=(20, 60), val_fraction=0.3,
        random_state=6,
    )  # fmt: skip
    model = MultinomialLogReg(D, C, random_state=0)
    kw = {"epochs": (1, 10), "lrs": (0.001, 0.05), "batch_size": B, "seed": SEED}
    whole = train_local(ds, model, **kw)
    parts = train_local(ds, model, block=block, **kw)
    assert whole.personalized_params is not None and parts.personalized_params is not None
    for n, p in whole.personalized_params.items():
        assert torch.allclose(parts.personalized_params[n], p, atol=1e-6, rtol=0), n
    sel, got = whole.extra["local_selection"], parts.extra["local_selection"]
    assert got["choice"] == sel["choice"] and len(set(sel["choice"])) > 1
    assert got["grid_val_accuracy"] == sel["grid_val_accuracy"]
    assert got["grid_test_accuracy"] == sel["grid_test_accuracy"]
    for split in ("val", "test"):
        got_acc, want = parts.accuracies[split], whole.accuracies[split]
        assert got_acc["personalized"] == pytest.approx(want["personalized"], rel=1e-5)
    with pytest.raises(InvalidParameterError, match="'block'"):
        train_local(ds, model, block=0, **kw)


@pytest.mark.parametrize("select", ["client", "pooled"])
def test_blocks_handed_to_a_sink_are_the_models_of_the_whole(select: str) -> None:
    """With ``on_block`` the blocks' chosen models go to the sink, never stacked, and they, the
    choice, the grid's accuracies and the scores are those of the population trained at once
    (``select="pooled"``: two passes, every client's validation scores, then the models)."""
    ds = make_synthetic_federated(
        n_clients=12, n_features=D, n_classes=C, samples_per_client=(20, 60), val_fraction=0.3,
        random_state=6,
    )  # fmt: skip
    model = MultinomialLogReg(D, C, random_state=0)
    kw = {"epochs": (1, 10), "lrs": (0.001, 0.05), "batch_size": B, "seed": SEED}
    whole = train_local(ds, model, select=select, **kw)
    seen: list[tuple[np.ndarray, dict[str, torch.Tensor]]] = []
    parts = train_local(
        ds, model, select=select, block=4, on_block=lambda pos, p, _: seen.append((pos, p)), **kw
    )  # fmt: skip
    assert parts.personalized_params is None and whole.personalized_params is not None
    assert [pos.tolist() for pos, _ in seen] == [list(range(k, k + 4)) for k in (0, 4, 8)]
    for n, p in whole.personalized_params.items():
        assert torch.equal(torch.cat([block[n] for _, block in seen]), p), n
    sel, got = whole.extra["local_selection"], parts.extra["local_selection"]
    for key in ("choice", "grid_val_accuracy", "grid_test_accuracy"):
        assert got[key] == sel[key], key
    assert len(set(sel["choice"])) == (1 if select == "pooled" else 2)
    for split, scores in whole.accuracies.items():  # losses: float32, summed by blocks
        for name, want in scores.items():
            got_scores = parts.accuracies[split][name]
            assert {k: v for k, v in got_scores.items() if k != "loss"} == {
                k: v for k, v in want.items() if k != "loss"
            }, (split, name)
            assert got_scores["loss"] == pytest.approx(want["loss"], rel=1e-6)  # float32 sums


def test_patience_longer_than_the_run_changes_nothing(ds: FederatedDataset) -> None:
    model = MultinomialLogReg(D, C, random_state=0)
    kw = {"epochs": (1, 5), "lrs": (0.01, 0.1), "batch_size": B, "seed": SEED}
    a = train_local(ds, model, **kw).personalized_params
    b = train_local(ds, model, patience=5, **kw).personalized_params
    assert a is not None and b is not None
    for n in a:
        assert torch.equal(a[n], b[n])


@pytest.mark.parametrize("patience", [1, 3])
def test_early_stopping_keeps_the_model_where_the_documented_rule_stops(
    ds: FederatedDataset, patience: int
) -> None:
    """Replayed from a run without stopping, snapshot after every epoch: a run stops after the
    epoch that makes ``patience`` epochs without a new best count of correct validation
    predictions (a client without validation data never stops); the grid point of ``e`` epochs
    is the model after ``min(e, stop)`` epochs."""
    model = MultinomialLogReg(D, C, random_state=0)
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    lr, top = 0.3, 12
    every = _train_grid(model, {}, init, ds, [(e, lr) for e in range(1, top + 1)], B, SEED, 4, True)
    vx, vy = ds.split("val")
    correct = np.stack([client_scores(model, g, {}, vx, vy)[0] for g in every])
    wanted = (2, 6, top)
    got = _train_grid(
        model, {}, init, ds, [(e, lr) for e in wanted], B, SEED, 4, True, patience=patience
    )
    stops = []
    for k in range(ds.n_clients):
        best, since, stop = -1.0, 0, top
        for e in range(top if len(vy[k]) else 0):
            best, since = (correct[e, k], 0) if correct[e, k] > best else (best, since + 1)
            if since >= patience:
                stop = e + 1
                break
        stops.append(stop)
        for g, e in enumerate(wanted):
            for n in init:
                torch.testing.assert_close(got[g][n][k], every[min(e, stop) - 1][n][k])
    assert min(stops) < top  # some run did stop early
