"""Local fine-tuning: objectives against hand gradients, batched == reference, data isolation."""

from __future__ import annotations

import pytest
import torch
from engine_defaults import old_config

from privmtl.data.federated import FederatedDataset, make_synthetic_federated
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.config import TrainResult
from privmtl.federated.end_of_run.finetune import (
    FINETUNE_METHODS,
    empirical_fisher,
    finetune,
    finetune_objective,
)
from privmtl.federated.models import MultinomialLogReg

D, C = 4, 3


@pytest.fixture(scope="module")
def data() -> FederatedDataset:
    return make_synthetic_federated(
        n_clients=6, n_features=D, n_classes=C, samples_per_client=(8, 24), random_state=1
    )


def _fake_result(ds: FederatedDataset, seed: int = 0) -> TrainResult:
    """A TrainResult with random personalized/global models (fine-tuning ignores their origin)."""
    g = torch.Generator().manual_seed(seed)
    m = ds.n_clients
    glob = {
        "linear.weight": torch.randn(C, D, generator=g),
        "linear.bias": torch.randn(C, generator=g),
    }
    pers = {
        n: p.unsqueeze(0) + 0.5 * torch.randn((m, *p.shape), generator=g) for n, p in glob.items()
    }
    cfg = old_config(lr=0.2, batch_size=4, lam=0.7, seed=3, progress=False)
    return TrainResult(
        config=cfg,
        client_ids=list(ds.client_ids),
        personalized_params=pers,
        global_params=glob,
        history=[],
        accuracies={},
        primary="personalized",
        epsilon=1.0,
        delta=0.1,
    )


# ----------------------------------------------------------------------------- hand gradients
def _tiny(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b = 5
    x = torch.randn(b, D, generator=g, dtype=torch.float64)
    y = torch.randint(0, C, (b,), generator=g)
    w = {
        "linear.weight": torch.randn(C, D, generator=g, dtype=torch.float64),
        "linear.bias": torch.randn(C, generator=g, dtype=torch.float64),
    }
    a = {n: torch.randn(p.shape, generator=g, dtype=torch.float64) for n, p in w.items()}
    fisher = {n: torch.rand(p.shape, generator=g, dtype=torch.float64) for n, p in w.items()}
    return x, y, w, a, fisher


def _autograd(method, x, y, w, a, lam, fisher=None):
    model = MultinomialLogReg(D, C)
    leaves = {n: p.clone().requires_grad_(True) for n, p in w.items()}
    val = finetune_objective(model, leaves, a, x, y, method=method, lam=lam, fisher=fisher)
    gs = torch.autograd.grad(val, list(leaves.values()))
    return dict(zip(leaves, gs, strict=True))


def _ce_hand(x, y, w):
    """Gradient of the mean CE of logits x Wᵀ + b: G = (softmax − onehot)/B, dW = Gᵀx, db = ΣG."""
    z = x @ w["linear.weight"].T + w["linear.bias"]
    p = torch.softmax(z, 1)
    gz = (p - torch.nn.functional.one_hot(y, C).double()) / x.shape[0]
    return gz


def _to_params(gz, x):
    return {"linear.weight": gz.T @ x, "linear.bias": gz.sum(0)}


def _close(a, b):
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=1e-10, atol=1e-12)


def test_vanilla_gradient_is_cross_entropy_gradient() -> None:
    x, y, w, a, _ = _tiny()
    _close(_autograd("vanilla", x, y, w, a, lam=3.0), _to_params(_ce_hand(x, y, w), x))


def test_mr_adds_lam_times_distance_to_global() -> None:
    x, y, w, a, _ = _tiny(1)
    lam = 0.8
    hand = _to_params(_ce_hand(x, y, w), x)
    hand = {n: hand[n] + lam * (w[n] - a[n]) for n in hand}
    _close(_autograd("mr", x, y, w, a, lam=lam), hand)


def test_ewc_adds_fisher_weighted_distance() -> None:
    x, y, w, a, fisher = _tiny(2)
    lam = 1.7
    hand = _to_params(_ce_hand(x, y, w), x)
    hand = {n: hand[n] + lam * fisher[n] * (w[n] - a[n]) for n in hand}
    _close(_autograd("ewc", x, y, w, a, lam=lam, fisher=fisher), hand)


def test_skl_gradient_matches_hand_formula() -> None:
    # d/dz [KL(p_g‖p_w) + KL(p_w‖p_g)] = (p_w − p_g) + p_w ⊙ (r − <p_w, r>), r = log p_w − log p_g
    x, y, w, a, _ = _tiny(3)
    lam = 0.6
    zw = x @ w["linear.weight"].T + w["linear.bias"]
    zg = x @ a["linear.weight"].T + a["linear.bias"]
    pw, pg = torch.softmax(zw, 1), torch.softmax(zg, 1)
    r = torch.log(pw) - torch.log(pg)
    gkl = (pw - pg) + pw * (r - (pw * r).sum(1, keepdim=True))
    gz = _ce_hand(x, y, w) + lam * gkl / x.shape[0]
    _close(_autograd("skl", x, y, w, a, lam=lam), _to_params(gz, x))


def test_skl_is_zero_when_local_equals_global() -> None:
    x, y, w, _, _ = _tiny(4)
    model = MultinomialLogReg(D, C)
    v_skl = finetune_objective(model, w, w, x, y, method="skl", lam=5.0)
    v_van = finetune_objective(model, w, w, x, y, method="vanilla", lam=5.0)
    assert float(v_skl - v_van) == pytest.approx(0.0, abs=1e-14)
    _close(_autograd("skl", x, y, w, w, lam=5.0), _autograd("vanilla", x, y, w, w, lam=5.0))
    # and it is positive when they differ
    _, _, _, a, _ = _tiny(5)
    assert float(finetune_objective(model, w, a, x, y, method="skl", lam=1.0) - v_van) > 1e-3


def test_empirical_fisher_hand_and_reference(data: FederatedDataset) -> None:
    anchor = _fake_result(data).global_params
    model = MultinomialLogReg(D, C)
    fb = empirical_fisher(model, anchor, data, batched=True, chunk=7)
    fr = empirical_fisher(model, anchor, data, batched=False)
    for n in fb:
        torch.testing.assert_close(fb[n], fr[n], rtol=1e-5, atol=1e-7)
    # hand: per-example gradient (p − e_y) xᵀ, squared, averaged over the client's examples
    k = 2
    x, y = data.train_x[k].double(), data.train_y[k]
    w = {n: p.double() for n, p in anchor.items()}
    p = torch.softmax(x @ w["linear.weight"].T + w["linear.bias"], 1)
    gz = p - torch.nn.functional.one_hot(y, C).double()
    hand_w = (gz[:, :, None] * x[:, None, :]).pow(2).mean(0)
    torch.testing.assert_close(fb["linear.weight"][k].double(), hand_w, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(
        fb["linear.bias"][k].double(), gz.pow(2).mean(0), rtol=1e-4, atol=1e-6
    )


# ----------------------------------------------------------------------------- the driver
@pytest.mark.parametrize(
    ("method", "start"),
    [
        ("vanilla", "personalized"),
        ("mr", "personalized"),
        ("ewc", "personalized"),
        ("skl", "global"),
    ],
)
def test_batched_matches_reference(data: FederatedDataset, method: str, start: str) -> None:
    res = _fake_result(data)
    model = MultinomialLogReg(D, C)
    pb, ab = finetune(res, data, model, method=method, start=start, epochs=1)
    pr, ar = finetune(res, data, model, method=method, start=start, epochs=1, batched=False)
    for n in pb:
        torch.testing.assert_close(pb[n], pr[n], rtol=1e-4, atol=1e-5)
    start_p = res.personalized_params if start == "personalized" else res.global_params
    assert float((pb["linear.weight"] - start_p["linear.weight"]).abs().max()) > 1e-3  # trained
    assert ab["test"]["n"] == ar["test"]["n"] == data.n_samples("test")
    assert ab["test"]["accuracy"] == pytest.approx(ar["test"]["accuracy"])


def test_client_chunks_do_not_change_the_result(data: FederatedDataset) -> None:
    res = _fake_result(data)
    model = MultinomialLogReg(D, C)
    full, _ = finetune(res, data, model, method="ewc", epochs=1)
    chunked, _ = finetune(res, data, model, method="ewc", epochs=1, client_chunk=4)
    for n in full:
        torch.testing.assert_close(full[n], chunked[n], rtol=1e-5, atol=1e-6)


def _perturb_client(ds: FederatedDataset, j: int) -> FederatedDataset:
    g = torch.Generator().manual_seed(99)
    tx = [x.clone() for x in ds.train_x]
    ty = [y.clone() for y in ds.train_y]
    tx[j] = 10.0 * torch.randn(tx[j].shape, generator=g)
    ty[j] = (ty[j] + 1) % ds.n_classes
    return FederatedDataset(
        client_ids=ds.client_ids,
        train_x=tx,
        train_y=ty,
        val_x=ds.val_x,
        val_y=ds.val_y,
        test_x=ds.test_x,
        test_y=ds.test_y,
        n_classes=ds.n_classes,
    )


@pytest.mark.parametrize("method", FINETUNE_METHODS)
def test_never_reads_other_clients_data(data: FederatedDataset, method: str) -> None:
    """Perturbing client j's training data leaves every other client's fine-tuned model unchanged."""
    res = _fake_result(data)
    model = MultinomialLogReg(D, C)
    j = 0  # padding rows of the engine point at row 0: the strictest choice of j
    other = _perturb_client(data, j)
    for batched in (True, False) if method == "ewc" else (True,):
        a, _ = finetune(res, data, model, method=method, epochs=2, batched=batched)
        b, _ = finetune(res, other, model, method=method, epochs=2, batched=batched)
        for n in a:
            for k in range(data.n_clients):
                if k != j:
                    assert torch.equal(a[n][k], b[n][k]), (method, batched, n, k)
        assert not torch.equal(a["linear.weight"][j], b["linear.weight"][j])


def test_zero_epochs_returns_the_start_models(data: FederatedDataset) -> None:
    res = _fake_result(data)
    model = MultinomialLogReg(D, C)
    p, _ = finetune(res, data, model, epochs=0)
    for n in p:
        assert torch.equal(p[n], res.personalized_params[n])
    g, _ = finetune(res, data, model, epochs=0, start="global")
    for n in g:
        assert torch.equal(g[n], res.global_params[n].expand_as(g[n]))


def test_full_batch_vanilla_decreases_each_clients_training_loss(data: FederatedDataset) -> None:
    # Full-batch GD on the convex CE with a step below 2/L decreases each client's loss.
    res = _fake_result(data)
    model = MultinomialLogReg(D, C)
    before, _ = finetune(res, data, model, epochs=0, start="global")
    after, _ = finetune(res, data, model, epochs=3, start="global", batch_size=10_000, lr=0.05)

    def loss(params, k):
        z = data.train_x[k] @ params["linear.weight"][k].T + params["linear.bias"][k]
        return float(torch.nn.functional.cross_entropy(z, data.train_y[k]))

    for k in range(data.n_clients):
        assert loss(after, k) < loss(before, k)


def test_params_input_and_errors(data: FederatedDataset) -> None:
    res = _fake_result(data)
    model = MultinomialLogReg(D, C)
    a, _ = finetune(res, data, model, method="mr", epochs=1)
    b, _ = finetune(
        res.personalized_params,
        data,
        model,
        method="mr",
        epochs=1,
        lr=0.2,
        batch_size=4,
        lam=0.7,
        seed=3,
        global_params=res.global_params,
    )
    for n in a:
        assert torch.equal(a[n], b[n])  # defaults come from the result's config
    with pytest.raises(InvalidParameterError, match="global model"):
        finetune(res.personalized_params, data, model, method="mr")
    with pytest.raises(InvalidParameterError, match="personalized"):
        finetune(res.global_params, data, model, start="personalized")
    with pytest.raises(InvalidParameterError, match="method"):
        finetune(res, data, model, method="l2sp")
    with pytest.raises(InvalidParameterError, match="shapes"):
        finetune({"linear.weight": torch.zeros(2, 2), "linear.bias": torch.zeros(2)}, data, model)
