"""The PMTL engine: batched == reference, clipping, noise, sampling, local objective, baselines."""

from __future__ import annotations

import itertools
import math
import warnings
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from engine_defaults import old_config
from scipy import stats

from privmtl.data.federated import FederatedDataset
from privmtl.exceptions import InvalidParameterError, PrivacyBudgetError
from privmtl.federated import FemnistCNN, MultinomialLogReg, train
from privmtl.federated.algorithms import draw_round_plan
from privmtl.federated.engine import aggregate_batched, local_train_batched, make_step_fn
from privmtl.federated.reference import aggregate_reference, local_train_reference
from privmtl.federated.scoring import evaluate
from privmtl.privacy.accounting import compute_epsilon
from privmtl.privacy.sampling import make_sampler

FAST = {"progress": False, "threads": 1, "noise_source": "seeded"}


def _max_diff(a: dict[str, torch.Tensor] | None, b: dict[str, torch.Tensor] | None) -> float:
    assert (a is None) == (b is None)
    if a is None or b is None:
        return 0.0
    return max(float((a[n] - b[n]).detach().abs().max()) for n in a)


class _NullLedger:
    """Stand-in ledger: the equivalence tests need no ε (accounting fixed-size sampling is slow)."""

    def epsilon_if(self, event: Any) -> float:
        return 0.0

    def record(self, event: Any, *, round: int | None = None) -> float:
        return 0.0

    def close(self) -> None:  # the run's closing line: nothing to write
        pass


def _run_both(ds: FederatedDataset, model: torch.nn.Module, **cfg: Any) -> tuple[Any, Any]:
    batched = train(ds, model, old_config(batched=True, **FAST, **cfg), ledger=_NullLedger())
    ref = train(ds, model, old_config(batched=False, **FAST, **cfg), ledger=_NullLedger())
    return batched, ref


PRIVATE = {"clip": 0.3, "noise_std": 0.01, "rounds": 5, "lr": 0.1, "lam": 0.5}


@pytest.mark.parametrize(
    ("sampling", "relation"), [("poisson", "add-remove"), ("fixed", "replace-one")]
)
@pytest.mark.parametrize("method", ["pmtl", "fedprox", "fedavg", "local"])
@pytest.mark.parametrize("vectorize", ["model", "vmap"])
def test_batched_equals_reference_logreg(
    tabular: FederatedDataset, sampling: str, relation: str, method: str, vectorize: str
) -> None:
    model = MultinomialLogReg(tabular.n_features, tabular.n_classes, zero_init=False)
    a, b = _run_both(
        tabular,
        model,
        method=method,
        sampling=sampling,
        relation=relation,
        clients_per_round=5,
        batch_size=8,
        vectorize=vectorize,
        **PRIVATE,
    )
    assert _max_diff(a.global_params, b.global_params) < 1e-4
    assert _max_diff(a.personalized_params, b.personalized_params) < 1e-4
    assert [h["sampled"] for h in a.history] == [h["sampled"] for h in b.history]
    np.testing.assert_allclose(
        [h["train_loss"] for h in a.history], [h["train_loss"] for h in b.history], rtol=1e-5
    )
    for ha, hb in zip(a.history, b.history, strict=True):
        np.testing.assert_allclose(ha["update_norms"], hb["update_norms"], rtol=1e-4)
    if method != "local":  # the run really moved and clipped
        assert _max_diff(a.global_params, dict(model.named_parameters())) > 1e-3
        assert any(h["clipped_fraction"] > 0 for h in a.history)


@pytest.mark.parametrize(
    ("sampling", "relation"), [("poisson", "add-remove"), ("fixed", "replace-one")]
)
def test_batched_equals_reference_small_cnn_float32(
    images: FederatedDataset, tiny_cnn: Any, sampling: str, relation: str
) -> None:
    # 1 local epoch with batch 5 and sizes 3..23: clients run 1..5 steps (masking of finished
    # clients and of the partial last batch)
    model = tiny_cnn()
    a, b = _run_both(
        images,
        model,
        method="pmtl",
        sampling=sampling,
        relation=relation,
        clients_per_round=3,
        batch_size=5,
        **PRIVATE,
    )
    assert _max_diff(a.personalized_params, b.personalized_params) < 1e-4
    assert _max_diff(a.global_params, b.global_params) < 1e-4
    init = {n: p.detach().unsqueeze(0) for n, p in model.named_parameters()}
    assert _max_diff(a.personalized_params, init) > 1e-3


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    ("sampling", "relation"), [("poisson", "add-remove"), ("fixed", "replace-one")]
)
def test_batched_equals_reference_femnist_cnn_float32(
    images: FederatedDataset, seed: int, sampling: str, relation: str
) -> None:
    """The FEMNIST CNN's grouped-convolution path (default) against the loop, in float32."""
    model = FemnistCNN(n_classes=5)
    a, b = _run_both(
        images,
        model,
        method="pmtl",
        sampling=sampling,
        relation=relation,
        seed=seed,
        clients_per_round=3,
        batch_size=5,
        vectorize="model",
        **PRIVATE,
    )
    assert _max_diff(a.personalized_params, b.personalized_params) < 1e-4
    assert _max_diff(a.global_params, b.global_params) < 1e-4
    init = {n: p.detach().unsqueeze(0) for n, p in model.named_parameters()}
    assert _max_diff(a.personalized_params, init) > 1e-3


def test_client_chunks_do_not_change_results(images: FederatedDataset) -> None:
    model = FemnistCNN(n_classes=5)
    kw = {"method": "pmtl", "clients_per_round": 4, "batch_size": 5, **PRIVATE, **FAST}
    runs = [
        train(images, model, old_config(client_chunk=c, **kw), ledger=_NullLedger())
        for c in (None, 3, 1)
    ]
    for other in runs[1:]:
        assert _max_diff(runs[0].personalized_params, other.personalized_params) < 1e-6
        assert _max_diff(runs[0].global_params, other.global_params) < 1e-6


def test_parallel_chunks_give_identical_updates(images: FederatedDataset) -> None:
    """Chunks trained concurrently (one thread each) equal chunks trained one after another."""
    model = FemnistCNN(n_classes=5)
    # threads after FAST, which sets 1 (the test once ran no parallel chunks because of that)
    kw = {**PRIVATE, **FAST, "method": "pmtl", "clients_per_round": 5, "batch_size": 5,
          "client_chunk": 2, "threads": 2}  # fmt: skip
    seq = train(images, model, old_config(**kw), ledger=_NullLedger())
    par = train(images, model, old_config(parallel_chunks=True, **kw), ledger=_NullLedger())
    assert par.config.threads == 2 and par.config.parallel_chunks
    assert _max_diff(seq.personalized_params, par.personalized_params) < 1e-6
    assert _max_diff(seq.global_params, par.global_params) < 1e-6
    assert [h["train_loss"] for h in seq.history] == pytest.approx(
        [h["train_loss"] for h in par.history], rel=1e-5
    )
    # work-balanced groups are not in sampling order: per-client outputs must be put back
    for hs, hp in zip(seq.history, par.history, strict=True):
        assert hp["update_norms"] == pytest.approx(hs["update_norms"], rel=1e-5)


@pytest.mark.parametrize("vectorize", ["model", "vmap"])
@pytest.mark.parametrize(
    ("sampling", "relation"), [("poisson", "add-remove"), ("fixed", "replace-one")]
)
def test_batched_equals_reference_femnist_cnn_float64(
    images: FederatedDataset, vectorize: str, sampling: str, relation: str
) -> None:
    """The max-pool CNN in float64, both vectorisations: identical math up to 1e-9.

    Under vmap the convolutions run in NCHW while the loop runs the second one channels-last; in
    float32 the ~1e-7 rounding difference can flip a max-pool argmax between two near-equal
    activations, i.e. route the gradient to another pixel, and runs then drift apart by ~1e-2
    although both are exact SGD (see privmtl.federated.models). float64 removes the near-ties.
    """
    model = FemnistCNN(n_classes=5).double()
    a, b = _run_both(
        images,
        model,
        method="pmtl",
        sampling=sampling,
        relation=relation,
        clients_per_round=3,
        batch_size=5,
        vectorize=vectorize,
        **PRIVATE,
    )
    assert a.global_params["conv1.weight"].dtype == torch.float64
    assert _max_diff(a.personalized_params, b.personalized_params) < 1e-9
    assert _max_diff(a.global_params, b.global_params) < 1e-9
    init = {n: p.detach().unsqueeze(0) for n, p in model.named_parameters()}
    assert _max_diff(a.personalized_params, init) > 1e-3


def test_batched_equals_reference_fixed_local_steps(images: FederatedDataset) -> None:
    a, b = _run_both(
        images,
        FemnistCNN(n_classes=5).double(),
        method="pmtl",
        sampling="poisson",
        clients_per_round=3,
        local_steps=4,
        batch_size=6,
        **PRIVATE,
    )
    assert _max_diff(a.personalized_params, b.personalized_params) < 1e-9
    assert _max_diff(a.global_params, b.global_params) < 1e-9


def test_batched_equals_reference_offset_update(images: FederatedDataset) -> None:
    a, b = _run_both(
        images,
        FemnistCNN(n_classes=5),
        method="pmtl",
        server_update="offset",
        clients_per_round=3,
        batch_size=5,
        **PRIVATE,
    )
    assert _max_diff(a.personalized_params, b.personalized_params) < 1e-4
    assert _max_diff(a.global_params, b.global_params) < 1e-4


def test_round_plan_steps_and_batches(images: FederatedDataset) -> None:
    _, _, off = images.concat("train")
    sizes = images.sizes("train")  # 3, 8, 12, 17, 20, 23
    epochs = draw_round_plan([0, 3, 5], off, 0, old_config(batch_size=5, local_epochs=2))
    for j, k in enumerate([0, 3, 5]):
        n = int(sizes[k])
        steps = epochs[j]
        assert len(steps) == 2 * math.ceil(n / 5)  # e * ceil(n_k / B)
        per_epoch = len(steps) // 2
        for e in range(2):  # each epoch is a permutation of the client's rows
            rows = np.concatenate(steps[e * per_epoch : (e + 1) * per_epoch])
            assert sorted(rows.tolist()) == list(range(off[k], off[k] + n))
    fixed = draw_round_plan([0, 5], off, 0, old_config(batch_size=5, local_steps=3))
    assert [len(p) for p in fixed] == [3, 3]
    assert [len(b) for b in fixed[0]] == [3, 3, 3]  # min(B, n_k) rows, no repeats within a step
    assert all(len(set(b.tolist())) == len(b) for p in fixed for b in p)
    # a client's draws do not depend on the other sampled clients
    alone = draw_round_plan([5], off, 0, old_config(batch_size=5, local_steps=3))
    assert all(np.array_equal(x, y) for x, y in zip(alone[0], fixed[1], strict=True))


def _deltas(norms: list[float], dim: int = 7) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for nrm in norms:
        a, b = torch.randn(dim, generator=gen), torch.randn(3, 2, generator=gen)
        scale = nrm / math.sqrt(float(a.square().sum() + b.square().sum()))
        out.append({"a": a * scale, "b": b * scale})
    return out


@pytest.mark.parametrize("path", ["batched", "reference"])
def test_clipping_to_exactly_gamma(path: str) -> None:
    gamma = 1.0
    norms = [0.25, 0.9, 3.0, 40.0]
    deltas = _deltas(norms)
    template = {n: torch.zeros_like(t) for n, t in deltas[0].items()}
    for k, d in enumerate(deltas):  # one client at a time, q = 1: the mean is the clipped update
        if path == "batched":
            mean, got, clipped = aggregate_batched(
                {n: t.unsqueeze(0) for n, t in d.items()}, template, gamma, 1
            )
        else:
            mean, got, clipped = aggregate_reference([d], template, gamma, 1)
        out_norm = math.sqrt(sum(float(t.square().sum()) for t in mean.values()))
        assert got[0] == pytest.approx(norms[k], rel=1e-5)
        if norms[k] > gamma:
            assert bool(clipped[0])
            assert out_norm == pytest.approx(gamma, rel=1e-6)  # scaled to exactly γ
            for n in d:  # same direction
                torch.testing.assert_close(mean[n], d[n] * (gamma / norms[k]), rtol=1e-5, atol=0)
        else:
            assert not bool(clipped[0])
            for n in d:  # untouched
                assert torch.equal(mean[n], d[n])
    # the mean divides by the fixed q, not by the number of updates
    q = 10
    if path == "batched":
        stacked = {n: torch.stack([d[n] for d in deltas]) for n in template}
        mean, _, clipped = aggregate_batched(stacked, template, gamma, q)
    else:
        mean, _, clipped = aggregate_reference(deltas, template, gamma, q)
    expect = {
        n: sum(d[n] * min(1.0, gamma / s) for d, s in zip(deltas, norms, strict=True)) / q
        for n in template
    }
    for n in template:
        torch.testing.assert_close(mean[n], expect[n], rtol=1e-5, atol=1e-7)
    assert clipped.tolist() == [False, False, True, True]


class _NobodySampler:
    """Stand-in sampler: nobody participates (the server still releases noise)."""

    def __init__(self, m: int) -> None:
        self.inner = make_sampler("poisson", m, 1)

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        return np.zeros(0, dtype=np.int64)

    def event(self, z: float) -> Any:
        return self.inner.event(z)


@pytest.mark.parametrize("who", ["nobody", "clipped-to-zero"])
def test_noise_calibration(tabular: FederatedDataset, who: str) -> None:
    """With zero updates, w~^T − w~^0 = sum of T draws of N(0, σ² I): chi-square band on σ."""
    sigma, rounds = 0.1, 30
    model = MultinomialLogReg(tabular.n_features, tabular.n_classes)  # 36 parameters
    cfg = old_config(
        method="fedavg",
        rounds=rounds,
        clients_per_round=4,
        noise_std=sigma,
        local_steps=1,
        clip=1e-12 if who != "nobody" else 1.0,
        **FAST,
    )
    sampler = _NobodySampler(tabular.n_clients) if who == "nobody" else None
    res = train(tabular, model, cfg, sampler=sampler)
    if who == "nobody":
        assert all(h["n_sampled"] == 0 for h in res.history)
    else:
        assert all(h["clipped_fraction"] == 1.0 for h in res.history if h["n_sampled"])
    released = torch.cat(
        [(res.global_params[n] - p.detach()).flatten() for n, p in model.named_parameters()]
    ).double()
    n = released.numel()
    stat = float(released.square().sum()) / (rounds * sigma**2)  # ~ chi2(n) if std is σ
    lo, hi = stats.chi2.ppf([0.0005, 0.9995], n)
    assert lo < stat < hi
    # ... and not with a noise std off by 25%
    assert not (lo < stat / 1.25**2 < hi and lo < stat * 1.25**2 < hi)
    # the ledger saw one event per round with z = σ q / γ
    assert len(res.ledger.records) == rounds
    assert res.history[0]["noise_multiplier"] == pytest.approx(sigma * 4 / cfg.clip)


def test_noise_std_over_many_coordinates(images: FederatedDataset) -> None:
    """One round, CNN (115k coordinates), nobody sampled: sample std within a tight band."""
    sigma = 0.05
    model = FemnistCNN(n_classes=5)
    res = train(
        images,
        model,
        old_config(method="pmtl", rounds=1, clients_per_round=2, noise_std=sigma, clip=1.0, **FAST),
        sampler=_NobodySampler(images.n_clients),
    )
    z = torch.cat(
        [(res.global_params[n] - p.detach()).flatten() for n, p in model.named_parameters()]
    ).double()
    n = z.numel()
    lo, hi = stats.chi2.ppf([0.0005, 0.9995], n)
    assert lo < float(z.square().sum()) / sigma**2 < hi
    assert abs(float(z.mean())) < 4 * sigma / math.sqrt(n)


def test_poisson_counts_are_binomial(tabular: FederatedDataset) -> None:
    m, q, rounds = tabular.n_clients, 4, 400
    model = MultinomialLogReg(tabular.n_features, tabular.n_classes)
    res = train(
        tabular,
        model,
        old_config(
            method="fedavg",
            rounds=rounds,
            clients_per_round=q,
            sampling="poisson",
            local_steps=1,
            batch_size=4,
            **FAST,
        ),
    )
    counts = np.array([h["n_sampled"] for h in res.history])
    p = q / m
    mean_se = math.sqrt(m * p * (1 - p) / rounds)
    assert abs(counts.mean() - q) < 4 * mean_se
    # variance m p (1 − p): chi-square-ish band via the normal approximation of the sample variance
    var = m * p * (1 - p)
    kurt = (1 - 6 * p * (1 - p)) / (m * p * (1 - p))  # excess kurtosis of the binomial
    var_se = var * math.sqrt(2 / (rounds - 1) + kurt / rounds)
    assert abs(counts.var(ddof=1) - var) < 4 * var_se
    assert counts.min() == 0 or counts.max() > q  # really random sizes, not always q
    # every client shows up with frequency p
    picks = np.concatenate([np.asarray(h["sampled"], dtype=np.int64) for h in res.history])
    freq = np.bincount(picks, minlength=m) / rounds
    assert np.all(np.abs(freq - p) < 4 * math.sqrt(p * (1 - p) / rounds))
    fixed = train(
        tabular,
        model,
        old_config(
            method="fedavg",
            rounds=20,
            clients_per_round=q,
            sampling="fixed",
            relation="replace-one",
            local_steps=1,
            **FAST,
        ),
    )
    assert {h["n_sampled"] for h in fixed.history} == {q}


@pytest.mark.parametrize("path", ["batched", "reference"])
def test_local_gradient_includes_mean_regularizer(tabular: FederatedDataset, path: str) -> None:
    """One full-batch step equals w − η ∇[l_k(w) + λ/2 ‖w − w~‖²] computed by autograd."""
    model = MultinomialLogReg(tabular.n_features, tabular.n_classes, zero_init=False)
    lam, lr = 0.7, 0.3
    x_all, y_all, off = tabular.concat("train")
    k = 2
    n = int(off[k + 1] - off[k])
    plan = [[np.arange(off[k], off[k + 1])]]
    gen = torch.Generator().manual_seed(5)
    w0 = {
        nm: p.detach() + torch.randn(p.shape, generator=gen) for nm, p in model.named_parameters()
    }
    anchor = {nm: p.detach().clone() for nm, p in model.named_parameters()}
    if path == "batched":
        new, _ = local_train_batched(
            make_step_fn(model, {}),
            {nm: t.unsqueeze(0) for nm, t in w0.items()},
            anchor,
            lam,
            lr,
            x_all,
            y_all,
            plan,
            n,
        )
        new = {nm: t[0] for nm, t in new.items()}
    else:
        outs, _ = local_train_reference(model, {}, [w0], anchor, lam, lr, x_all, y_all, plan)
        new = outs[0]
    leaves = {nm: t.clone().requires_grad_(True) for nm, t in w0.items()}
    x, y = x_all[off[k] : off[k + 1]], y_all[off[k] : off[k + 1]]
    logits = torch.func.functional_call(model, leaves, (x,))
    f = F.cross_entropy(logits, y) + lam / 2 * sum(
        (leaves[nm] - anchor[nm]).square().sum() for nm in leaves
    )
    grads = torch.autograd.grad(f, list(leaves.values()))
    for (nm, t), g in zip(w0.items(), grads, strict=True):
        torch.testing.assert_close(new[nm], t - lr * g, rtol=1e-5, atol=1e-6)
    # and the regularizer really mattered
    g_data = torch.autograd.grad(
        F.cross_entropy(torch.func.functional_call(model, leaves, (x,)), y), list(leaves.values())
    )
    assert (
        max(
            float((t - lr * g - new[nm]).abs().max())
            for (nm, t), g in zip(w0.items(), g_data, strict=True)
        )
        > 1e-2
    )


def test_local_never_communicates(tabular: FederatedDataset) -> None:
    model = MultinomialLogReg(tabular.n_features, tabular.n_classes, zero_init=False)
    cfg = old_config(method="local", rounds=6, clients_per_round=6, noise_std=0.5, **FAST)
    res = train(tabular, model, cfg)
    init = {n: p.detach() for n, p in model.named_parameters()}
    assert _max_diff(res.global_params, init) == 0.0
    assert res.epsilon == 0.0 and res.ledger is None and res.primary == "personalized"
    assert all(h["epsilon"] == 0.0 and h["update_norms"] == [] for h in res.history)
    assert "global" not in res.accuracies["test"]
    # another client's data cannot influence client k's model: change client 0's labels
    changed = tabular.subset(range(tabular.n_clients))
    changed.train_y[0] = (changed.train_y[0] + 1) % tabular.n_classes
    other = train(changed, model, cfg)
    assert res.personalized_params is not None and other.personalized_params is not None
    trained = {k for h in res.history for k in h["sampled"]}
    assert 0 in trained and len(trained) > 2
    for n, p in res.personalized_params.items():
        assert not torch.equal(p[0], other.personalized_params[n][0])
        assert torch.equal(p[1:], other.personalized_params[n][1:])
    # the noise level is irrelevant without communication
    quiet = train(tabular, model, old_config(**{**cfg.to_dict(), "noise_std": 0.0}))
    assert _max_diff(res.personalized_params, quiet.personalized_params) == 0.0


def test_fedavg_one_round_by_hand(tabular: FederatedDataset) -> None:
    """FedAvg, all clients, no noise, no clipping: w~¹ = w~⁰ + mean_k (SGD_k(w~⁰) − w~⁰)."""
    model = MultinomialLogReg(tabular.n_features, tabular.n_classes, zero_init=False)
    cfg = old_config(
        method="fedavg", rounds=1, sampling="all", clip=None, batch_size=16, lr=0.2, **FAST
    )
    res = train(tabular, model, cfg)
    assert res.personalized_params is None and res.primary == "global"
    assert math.isinf(res.epsilon) and res.history[0]["n_sampled"] == tabular.n_clients
    x_all, y_all, off = tabular.concat("train")
    m = tabular.n_clients
    plan = draw_round_plan(range(m), off, 0, cfg)
    w0 = {n: p.detach() for n, p in model.named_parameters()}
    outs, _ = local_train_reference(model, {}, [w0] * m, None, 0.0, cfg.lr, x_all, y_all, plan)
    for n, t in w0.items():
        expect = t + sum(o[n] - t for o in outs) / m
        torch.testing.assert_close(res.global_params[n], expect, rtol=1e-5, atol=1e-6)


def test_pmtl_keeps_personalized_models(tabular: FederatedDataset) -> None:
    model = MultinomialLogReg(tabular.n_features, tabular.n_classes)
    res = train(
        tabular,
        model,
        old_config(
            method="pmtl",
            rounds=3,
            clients_per_round=3,
            sampling="fixed",
            relation="replace-one",
            noise_std=0.01,
            clip=0.5,
            **FAST,
        ),
    )
    assert res.personalized_params is not None
    trained = {k for h in res.history for k in h["sampled"]}
    w = res.personalized_params["linear.weight"]
    for k in range(tabular.n_clients):  # untouched clients keep w_k^0 = 0
        assert (k in trained) == bool(w[k].abs().sum() > 0)
    assert set(res.accuracies["test"]) == {"personalized", "global"}
    assert res.client_model(model, 1).linear.weight.shape == (4, 8)


def test_privacy_recorded_every_round(tabular: FederatedDataset) -> None:
    m, q, sigma, gamma = tabular.n_clients, 4, 0.2, 0.5
    model = MultinomialLogReg(tabular.n_features, tabular.n_classes)
    res = train(
        tabular,
        model,
        old_config(
            rounds=4, clients_per_round=q, noise_std=sigma, clip=gamma, sampling="poisson", **FAST
        ),
    )
    z = sigma * q / gamma
    eps = [h["epsilon"] for h in res.history]
    assert all(b > a for a, b in itertools.pairwise(eps))
    delta = min(1e-5, 1 / (100 * m))  # the default: below 1/m (user_data_delta)
    assert res.delta == pytest.approx(delta) and res.epsilon == eps[-1]
    sampler = make_sampler("poisson", m, q)
    import dp_accounting

    composed = dp_accounting.SelfComposedDpEvent(sampler.event(z), 4)
    assert eps[-1] == pytest.approx(compute_epsilon(composed, delta=delta), rel=1e-6)
    assert res.to_dict()["epsilon"] == pytest.approx(eps[-1])


def test_unsupported_accounting_fails_before_training(tabular: FederatedDataset) -> None:
    model = MultinomialLogReg(tabular.n_features, tabular.n_classes)
    with pytest.raises(InvalidParameterError, match="replace-one"):
        train(
            tabular,
            model,
            old_config(sampling="fixed", relation="add-remove", noise_std=0.1, **FAST),
        )


def test_budget_stops_before_release(tabular: FederatedDataset) -> None:
    model = MultinomialLogReg(tabular.n_features, tabular.n_classes)
    with pytest.raises(PrivacyBudgetError):
        train(
            tabular,
            model,
            old_config(
                rounds=50, clients_per_round=6, noise_std=0.05, clip=1.0, budget=5.0, **FAST
            ),
        )


def test_same_seed_same_result(tabular: FederatedDataset) -> None:
    model = MultinomialLogReg(tabular.n_features, tabular.n_classes)
    cfg = old_config(rounds=3, clients_per_round=4, noise_std=0.05, clip=0.5, **FAST)
    a, b = train(tabular, model, cfg), train(tabular, model, cfg)
    c = train(tabular, model, old_config(**{**cfg.to_dict(), "seed": 1}))
    assert _max_diff(a.personalized_params, b.personalized_params) == 0.0
    assert _max_diff(a.global_params, c.global_params) > 0.0


def test_evaluate_pooled_and_mean_client_accuracy() -> None:
    model = MultinomialLogReg(2, 2)
    params = {
        "linear.weight": torch.tensor([[1.0, 0.0], [0.0, 1.0]]),
        "linear.bias": torch.zeros(2),
    }
    xs = [
        torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0]]),  # preds 0, 1, 0, 0
        torch.tensor([[0.0, 1.0]]),
        torch.zeros(0, 2),
    ]  # pred 1
    ys = [torch.tensor([0, 0, 0, 1]), torch.tensor([0]), torch.zeros(0, dtype=torch.int64)]
    out = evaluate(model, params, {}, xs, ys, personalized=False)
    assert out["accuracy"] == pytest.approx(2 / 5)  # pooled over all examples
    assert out["mean_client_accuracy"] == pytest.approx((2 / 4 + 0 / 1) / 2)  # clients with data
    assert out["n"] == 5
    stacked = {n: p.unsqueeze(0).repeat(3, *([1] * p.ndim)) for n, p in params.items()}
    stacked["linear.bias"][1] = torch.tensor([1.0, -5.0])  # client 1 now predicts 0: correct
    per = evaluate(model, stacked, {}, xs, ys, personalized=True)
    assert per["accuracy"] == pytest.approx(3 / 5)
    assert per["mean_client_accuracy"] == pytest.approx((2 / 4 + 1) / 2)


def test_config_validation(tabular: FederatedDataset) -> None:
    with pytest.raises(InvalidParameterError, match="local_steps"):
        old_config(local_steps=2, local_epochs=1)
    with pytest.raises(InvalidParameterError, match="method"):
        old_config(method="ditto")
    with pytest.raises(InvalidParameterError, match="lr"):
        old_config(lr=0.0)
    with pytest.raises(InvalidParameterError, match="clients_per_round"):
        train(tabular, MultinomialLogReg(8, 4), old_config(clients_per_round=99, **FAST))
    with pytest.raises(InvalidParameterError, match="dataset"):
        train("data", MultinomialLogReg(8, 4), old_config(**FAST))  # type: ignore[arg-type]


def test_models_shapes_and_batched_forward() -> None:
    from privmtl.federated.models import count_parameters

    assert count_parameters(FemnistCNN()) == 115_646  # conv 832 + conv 51 264 + fc 63 550
    assert count_parameters(FemnistCNN(variant="leaf")) == 6_603_710
    for model, d in [
        (FemnistCNN(), 784),
        (FemnistCNN(n_classes=3, variant="leaf"), 784),
        (MultinomialLogReg(6, 3, zero_init=False), 6),
    ]:
        gen = torch.Generator().manual_seed(0)
        k = 3
        stacked = {
            n: p.detach().unsqueeze(0) + 0.05 * torch.randn(k, *p.shape, generator=gen)
            for n, p in model.named_parameters()
        }
        x = torch.rand(k, 4, d, generator=gen)
        expect = torch.stack(
            [
                torch.func.functional_call(model, {n: p[j] for n, p in stacked.items()}, (x[j],))
                for j in range(k)
            ]
        )
        torch.testing.assert_close(model.forward_batched(stacked, x), expect, rtol=1e-4, atol=1e-5)
    assert torch.equal(
        FemnistCNN(random_state=3).conv1.weight, FemnistCNN(random_state=3).conv1.weight
    )
    assert not torch.equal(
        FemnistCNN(random_state=3).conv1.weight, FemnistCNN(random_state=4).conv1.weight
    )


@pytest.mark.slow
@pytest.mark.shared_data
def test_femnist_pmtl_learns(femnist_dir: Any, tmp_path: Any) -> None:
    from privmtl.data.federated import load_leaf

    ds = load_leaf(femnist_dir, cache_dir=tmp_path)
    # every writer every round (PMTL clients only learn when sampled): ~1 min on 2 cores
    res = train(
        ds,
        FemnistCNN(),
        old_config(method="pmtl", rounds=8, sampling="all", lam=0.1, clip=None, progress=False),
    )
    assert res.history[-1]["train_loss"] < res.history[0]["train_loss"] - 0.5
    assert res.test_accuracy > 0.2  # 62 classes: chance is ~0.05 (measured 0.31)


def test_server_update_delta_keeps_the_mean_with_full_participation(
    tabular: FederatedDataset,
) -> None:
    """Algorithm 1 with q = m and no clipping/noise: w~ stays the mean of the w_k."""
    model = MultinomialLogReg(tabular.n_features, tabular.n_classes, zero_init=False)
    res = train(
        tabular,
        model,
        old_config(
            method="pmtl",
            rounds=3,
            sampling="all",
            clip=None,
            lam=0.5,
            server_update="delta",
            **FAST,
        ),
    )
    assert res.personalized_params is not None
    for n, p in res.personalized_params.items():
        torch.testing.assert_close(res.global_params[n], p.mean(0), rtol=1e-5, atol=1e-6)


def test_server_update_offset_is_mean_of_sampled_models(tabular: FederatedDataset) -> None:
    """The authors' code: g_k = w_k^new − w~^t, so w~^{t+1} = mean of the q sampled w_k."""
    model = MultinomialLogReg(tabular.n_features, tabular.n_classes, zero_init=False)
    cfg = old_config(
        method="pmtl",
        rounds=3,
        clients_per_round=4,
        sampling="fixed",
        relation="replace-one",
        clip=None,
        lam=0.5,
        server_update="offset",
        **FAST,
    )
    res = train(tabular, model, cfg)
    assert res.personalized_params is not None
    last = res.history[-1]["sampled"]
    for n, p in res.personalized_params.items():
        torch.testing.assert_close(res.global_params[n], p[last].mean(0), rtol=1e-5, atol=1e-6)
    delta = train(tabular, model, old_config(**{**cfg.to_dict(), "server_update": "delta"}))
    assert _max_diff(delta.global_params, res.global_params) > 1e-3


def test_delta_message_under_partial_participation_warns(tabular: FederatedDataset) -> None:
    from privmtl.exceptions import PrivmtlWarning

    model = MultinomialLogReg(tabular.train_x[0].shape[1], tabular.n_classes)
    kw = {**FAST, "rounds": 1, "clients_per_round": 2}
    with pytest.warns(PrivmtlWarning, match="server_update='delta'.*m/q"):
        train(tabular, model, old_config(server_update="delta", **kw))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivmtlWarning)
        train(tabular, model, old_config(server_update="offset", **kw))
        train(tabular, model, old_config(sampling="all", **{**kw, "clients_per_round": None}))
        train(tabular, model, old_config(method="fedavg", **kw))
