"""Workshop variant: closed-form σ, tight ε for the same σ, projection, sensitivity, fine-tuning."""

from __future__ import annotations

import dataclasses
import math

import dp_accounting
import pytest
import torch
from engine_defaults import old_config

from privmtl.data.federated import FederatedDataset, make_synthetic_federated
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.config import TrainConfig
from privmtl.federated.end_of_run.finetune import finetune
from privmtl.federated.models import MultinomialLogReg
from privmtl.federated.workshop import project_to_ball, train_workshop
from privmtl.privacy.accounting import compute_epsilon

D, C = 4, 3


@pytest.fixture(scope="module")
def data() -> FederatedDataset:
    return make_synthetic_federated(
        n_clients=8, n_features=D, n_classes=C, samples_per_client=(15, 30), random_state=2
    )


def _cfg(**kw) -> TrainConfig:
    base = dict(
        rounds=3, lr=0.3, lam=0.1, batch_size=8, seed=0, progress=False, noise_source="seeded"
    )
    base.update(kw)
    return old_config(**base)


def _with_train(ds: FederatedDataset, tx, ty) -> FederatedDataset:
    """A new dataset with other training data (fresh caches; other splits shared)."""
    return FederatedDataset(
        client_ids=ds.client_ids, train_x=tx, train_y=ty, val_x=ds.val_x, val_y=ds.val_y,
        test_x=ds.test_x, test_y=ds.test_y, n_classes=ds.n_classes,
    )  # fmt: skip


def test_sigma_is_the_closed_form_and_tight_epsilon_is_reported(data: FederatedDataset) -> None:
    m, T, B, eps = data.n_clients, 3, 0.5, 2.0
    delta = min(1e-5, 1.0 / (100 * m))  # the default delta (user_data_delta), below 1/m
    for relation in ("add-remove", "replace-one"):
        res = train_workshop(
            data, MultinomialLogReg(D, C), _cfg(rounds=T, relation=relation), bound=B,
            epsilon=eps, finetune_epochs=0,
        )  # fmt: skip
        sigma = 8 * B * math.sqrt(T * math.log(1 / delta)) / (eps * m)
        assert res.extra["noise_std"] == pytest.approx(sigma, rel=1e-12)
        assert res.extra["epsilon_closed_form"] == pytest.approx(eps, rel=1e-12)
        assert res.extra["noise_multiplier"] == pytest.approx(sigma * m / B)
        # the reported ε is the tight accountant's: T Gaussian releases of multiplier σm/B
        tight = compute_epsilon(
            dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma * m / B), T),
            delta=delta,
            relation=relation,
        )
        assert res.epsilon == pytest.approx(tight, rel=1e-9)
        assert [h["epsilon"] for h in res.history][-1] == res.epsilon
        # the closed form (replace-one) is valid but loose: the tight ε is below the target
        assert res.epsilon < eps
        if relation == "add-remove":
            eps_ar = res.epsilon
            assert res.extra["sensitivity"] == pytest.approx(B / m)
        else:
            assert res.extra["sensitivity"] == pytest.approx(2 * B / m)
            assert res.epsilon > eps_ar  # replace-one doubles the sensitivity


def test_projection_keeps_every_sent_model_in_the_ball(data: FederatedDataset) -> None:
    free = train_workshop(
        data, MultinomialLogReg(D, C), _cfg(rounds=3, lr=1.0), bound=1e6, noise_std=0.0,
        finetune_epochs=0,
    )  # fmt: skip
    unconstrained = max(h["max_model_norm"] for h in free.history)
    B = unconstrained / 4  # a radius the unconstrained run exceeds: the projection is active
    res = train_workshop(
        data, MultinomialLogReg(D, C), _cfg(rounds=3, lr=1.0), bound=B, noise_std=0.0,
        finetune_epochs=0,
    )  # fmt: skip
    assert all(h["max_model_norm"] <= B * (1 + 1e-6) for h in res.history)
    norms = torch.sqrt(sum(p.flatten(1).pow(2).sum(1) for p in res.personalized_params.values()))
    assert float(norms.max()) <= B * (1 + 1e-6)
    assert float(norms.max()) >= 0.99 * B  # and it binds


def test_project_to_ball() -> None:
    p = {"a": torch.tensor([[3.0, 0.0], [0.3, 0.4]]), "b": torch.tensor([[4.0], [0.0]])}
    out = project_to_ball(p, 1.0, stacked=True)
    torch.testing.assert_close(out["a"], torch.tensor([[0.6, 0.0], [0.3, 0.4]]))
    torch.testing.assert_close(out["b"], torch.tensor([[0.8], [0.0]]))
    single = project_to_ball({"a": p["a"][0], "b": p["b"][0]}, 2.5, stacked=False)
    torch.testing.assert_close(single["a"], torch.tensor([1.5, 0.0]))


def test_release_sensitivity_replace_one_is_at_most_2B_over_m(data: FederatedDataset) -> None:
    B, m, j = 0.2, data.n_clients, 3
    cfg = _cfg(rounds=1, lr=1.0)
    tx = list(data.train_x)
    tx[j] = -5.0 * tx[j]
    ty = list(data.train_y)
    ty[j] = (ty[j] + 1) % C
    other = _with_train(data, tx, ty)
    a = train_workshop(data, MultinomialLogReg(D, C), cfg, bound=B, noise_std=0.0,
                       finetune_epochs=0)  # fmt: skip
    b = train_workshop(other, MultinomialLogReg(D, C), cfg, bound=B, noise_std=0.0,
                       finetune_epochs=0)  # fmt: skip
    diff = math.sqrt(sum(float((a.global_params[n] - b.global_params[n]).pow(2).sum())
                         for n in a.global_params))  # fmt: skip
    assert 0 < diff <= 2 * B / m + 1e-7
    # the other tasks' sent models are identical in round 0 (they have not seen a release yet)
    for n in a.personalized_params:
        keep = torch.arange(m) != j
        assert torch.equal(a.personalized_params[n][keep], b.personalized_params[n][keep])


def test_batched_matches_reference_and_finetuning_is_mr_against_the_release(
    data: FederatedDataset,
) -> None:
    cfg = _cfg(rounds=2)
    a = train_workshop(data, MultinomialLogReg(D, C), cfg, bound=0.8, noise_std=0.02,
                       finetune_epochs=1)  # fmt: skip
    b = train_workshop(data, MultinomialLogReg(D, C), dataclasses.replace(cfg, batched=False),
                       bound=0.8, noise_std=0.02, finetune_epochs=1)  # fmt: skip
    for n in a.personalized_params:
        torch.testing.assert_close(
            a.personalized_params[n], b.personalized_params[n], rtol=1e-4, atol=1e-5
        )
        torch.testing.assert_close(a.global_params[n], b.global_params[n], rtol=1e-4, atol=1e-5)
    # the final step is MR fine-tuning of w_k^T against the released w~^T
    raw = train_workshop(data, MultinomialLogReg(D, C), cfg, bound=0.8, noise_std=0.02,
                         finetune_epochs=0)  # fmt: skip
    tuned, acc = finetune(
        raw.personalized_params, data, MultinomialLogReg(D, C), method="mr",
        global_params=raw.global_params, epochs=1, lr=cfg.lr, batch_size=cfg.batch_size,
        lam=cfg.lam, seed=cfg.seed,
    )  # fmt: skip
    for n in tuned:
        torch.testing.assert_close(tuned[n], a.personalized_params[n])
    assert acc["test"] == a.accuracies["test"]["personalized"]


def test_parameter_errors(data: FederatedDataset) -> None:
    with pytest.raises(InvalidParameterError, match="at most one"):
        train_workshop(data, MultinomialLogReg(D, C), _cfg(), bound=1.0, epsilon=1.0,
                       noise_std=0.1)  # fmt: skip
    with pytest.raises(InvalidParameterError, match="bound"):
        train_workshop(data, MultinomialLogReg(D, C), _cfg(), bound=0.0)
