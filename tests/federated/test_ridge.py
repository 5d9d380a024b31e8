"""The batched ridge solver of local training (``train_local(solver="ridge")``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from privmtl.data.federated import FederatedDataset, make_synthetic_federated
from privmtl.exceptions import InvalidParameterError
from privmtl.federated import ridge as ridge_module
from privmtl.federated.end_of_run.local import train_local
from privmtl.federated.models import MultinomialLogReg
from privmtl.federated.ridge import (
    RIDGE_BUCKET_ROWS,
    RIDGE_GAP,
    bucket_clients,
    padded_rows,
    ridge_logreg,
)

D, C = 5, 3
WIDE = 24  # features of the dual-solved clients (their padded rows are at most 24 < 25)


@pytest.fixture(scope="module")
def ds() -> FederatedDataset:
    return make_synthetic_federated(
        n_clients=9, n_features=D, n_classes=C, samples_per_client=(3, 60), random_state=2
    )


@pytest.fixture(scope="module")
def wide() -> FederatedDataset:
    """Clients with fewer training rows than features: solved in the dual."""
    return make_synthetic_federated(
        n_clients=7, n_features=WIDE, n_classes=C, samples_per_client=(3, 30), random_state=3
    )


@pytest.fixture(scope="module")
def sixty() -> FederatedDataset:
    """The synthetic federation's width (60 features: 61 with the bias, padded to 64)."""
    return make_synthetic_federated(
        n_clients=8, n_features=60, n_classes=C, samples_per_client=(3, 200), random_state=4
    )


def _start(
    dtype: torch.dtype = torch.float64, seed: int = 0, d: int = D
) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "linear.weight": torch.randn(C, d, generator=g, dtype=dtype),
        "linear.bias": torch.randn(C, generator=g, dtype=dtype),
    }


def _objective(ds: FederatedDataset, k: int, p: dict[str, torch.Tensor], start, c: float):
    x, y = ds.train_x[k].double(), ds.train_y[k]
    n = len(y)
    ce = F.cross_entropy(x @ p["linear.weight"].T + p["linear.bias"], y)
    sq = sum(((p[name] - start[name].double()) ** 2).sum() for name in start)
    return ce + 0.5 * c / n * sq


def _minimum(ds: FederatedDataset, k: int, start, c: float) -> float:
    """Client k's minimum by plain L-BFGS on its own rows (float64, to a tight tolerance)."""
    p = {n: v.double().clone().requires_grad_(True) for n, v in start.items()}
    opt = torch.optim.LBFGS(
        list(p.values()), max_iter=500, tolerance_grad=1e-12, tolerance_change=1e-14,
        line_search_fn="strong_wolfe",
    )  # fmt: skip

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = _objective(ds, k, p, start, c)
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float(_objective(ds, k, p, start, c))


@pytest.mark.parametrize(("data", "d"), [("ds", D), ("wide", WIDE)])
def test_each_client_reaches_its_own_minimum(request, data: str, d: int) -> None:
    """Primal (``ds``: more rows than features) and dual (``wide``: every client fewer)."""
    ds = request.getfixturevalue(data)
    dual = padded_rows(ds.sizes("train")) < d + 1
    assert bool(dual.all()) if data == "wide" else not bool(dual.any())
    start = _start(d=d)
    ridges = (0.5, 5.0)
    models = ridge_logreg(start, ds, ridges, iterations=600, gap=0.0)
    for g, c in enumerate(ridges):
        for k in range(ds.n_clients):
            mine = {n: p[k] for n, p in models[g].items()}
            got = float(_objective(ds, k, mine, start, c))
            assert got == pytest.approx(_minimum(ds, k, start, c), abs=1e-8)


@pytest.mark.parametrize("c", [1.0, 30.0])
def test_default_iterations_are_close_to_the_minimum(sixty: FederatedDataset, c: float) -> None:
    start = _start(torch.float32, d=60)
    (models,) = ridge_logreg(start, sixty, (c,))
    gaps = []
    for k in range(sixty.n_clients):
        mine = {n: p[k].double() for n, p in models.items()}
        gaps.append(float(_objective(sixty, k, mine, start, c)) - _minimum(sixty, k, start, c))
    assert max(gaps) < RIDGE_GAP
    assert min(gaps) > -1e-5  # nothing below the minimum: the objective is the documented one


@pytest.mark.parametrize(("data", "d"), [("ds", D), ("wide", WIDE)])
@pytest.mark.parametrize("gap", [1e-2, 1e-4])
def test_a_client_stops_once_its_gap_is_certified(request, data: str, d: int, gap: float) -> None:
    """Iterations enough for every client to be certified (primal and dual): each one stops
    within ``gap`` of its own minimum (an L-BFGS oracle), and short of it where ``gap`` is
    loose: the solve did stop before its last iteration."""
    ds = request.getfixturevalue(data)
    start = _start(torch.float32, d=d)
    (models,) = ridge_logreg(start, ds, (2.0,), iterations=600, gap=gap)
    (full,) = ridge_logreg(start, ds, (2.0,), iterations=600, gap=0.0)
    gaps, fulls = [], []
    for k in range(ds.n_clients):
        mine = {n: p[k].double() for n, p in models.items()}
        best = _minimum(ds, k, start, 2.0)
        gaps.append(float(_objective(ds, k, mine, start, 2.0)) - best)
        fulls.append(
            float(_objective(ds, k, {n: p[k].double() for n, p in full.items()}, start, 2.0)) - best
        )
    assert max(gaps) <= gap
    assert max(gaps) > max(fulls)  # stopped early: farther from the minimum than 600 iterations


def _bytes(models: dict[str, torch.Tensor], k: int) -> list[bytes]:
    return [models[n][k].numpy().tobytes() for n in sorted(models)]


@pytest.mark.parametrize("fixture", ["ds", "wide", "sixty"])
def test_a_client_model_is_the_same_bytes_alone_or_in_any_batch(fixture, request) -> None:
    """A client's solve runs in a batch of a fixed number of slots for its padded length
    (bucket_clients), its rows padded to an aligned width: solved alone, beside every client or
    beside any other clients, its model is bit for bit the same (float32)."""
    data: FederatedDataset = request.getfixturevalue(fixture)
    m = data.n_clients
    start = _start(torch.float32, d=data.n_features)
    together = ridge_logreg(start, data, (2.0, 0.5))
    rng = np.random.default_rng(0)
    for k in range(m):
        alone = ridge_logreg(start, data.subset([k]), (2.0, 0.5))
        others = rng.choice([j for j in range(m) if j != k], size=int(rng.integers(1, m)))
        mixed = sorted({k, *others.tolist()})
        beside = ridge_logreg(start, data.subset(mixed), (2.0, 0.5))
        for r in range(2):
            want = _bytes(alone[r], 0)
            assert _bytes(together[r], k) == want, (k, r)
            assert _bytes(beside[r], mixed.index(k)) == want, (k, r, mixed)
    # the bucket size is a public constant: another one changes the slots, not the models
    (small,) = ridge_logreg(start, data, (2.0,), bucket_rows=8)
    for n in together[0]:
        torch.testing.assert_close(small[n], together[0][n], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fixture", ["ds", "wide", "sixty"])
def test_a_strength_model_is_the_same_bytes_beside_other_strengths(fixture, request) -> None:
    """Every (client, prior strength) pair has a slot of its own in the batched products: the
    models of one strength do not depend on the other strengths of the call, bit for bit."""
    data: FederatedDataset = request.getfixturevalue(fixture)
    start = _start(torch.float32, d=data.n_features)
    both = ridge_logreg(start, data, (2.0, 0.5))
    for r, c in enumerate((2.0, 0.5)):
        (alone,) = ridge_logreg(start, data, (c,))
        for k in range(data.n_clients):
            assert _bytes(both[r], k) == _bytes(alone, k), (k, c)


def test_a_bucket_has_slots_set_by_public_constants() -> None:
    assert bucket_clients(8, 2) == RIDGE_BUCKET_ROWS // 16
    assert bucket_clients(8, 2, bucket_rows=64) == 4
    assert bucket_clients(10_000, 3) == 1  # at least one client


def test_the_dual_iterates_are_the_primal_iterates(wide: FederatedDataset) -> None:
    """Both forms of one bucket after a few iterations (float64): equal up to rounding."""
    x_all, y_all, offsets = wide.concat("train")
    n = np.diff(offsets)
    top = 24
    pos = np.arange(top)[None, :]
    rows = torch.from_numpy(np.where(pos < n[:, None], pos + offsets[:-1, None], len(y_all)))
    # the rows (x, 1), padded with a zero row
    xt = torch.cat([x_all.double(), torch.ones(len(x_all), 1, dtype=torch.float64)], 1)
    xt = torch.cat([xt, torch.zeros(1, WIDE + 1, dtype=torch.float64)])
    start = _start(d=WIDE)
    w0 = torch.cat([start["linear.weight"], start["linear.bias"].unsqueeze(1)], 1)
    args = (
        xt[rows], torch.cat([y_all, y_all[:1]])[rows], torch.from_numpy(n).double(), w0,
        torch.tensor([0.3, 30.0], dtype=torch.float64), 7,
    )  # fmt: skip
    torch.testing.assert_close(
        ridge_module._solve_bucket_dual(*args), ridge_module._solve_bucket(*args),
        rtol=0, atol=1e-10,
    )  # fmt: skip


def test_padded_rows_is_a_ladder_of_the_own_size() -> None:
    sizes = np.array([1, 8, 9, 64, 65, 80, 81, 1000])
    top = padded_rows(sizes)
    assert top.tolist() == [8, 8, 16, 64, 72, 88, 88, 1096]
    assert bool((top >= sizes).all()) and bool((top <= np.maximum(8, 1.125 * sizes + 8)).all())


def test_more_prior_strength_stays_nearer_the_start(ds: FederatedDataset) -> None:
    start = _start()
    weak, strong = ridge_logreg(start, ds, (0.1, 100.0), iterations=100)
    dist = [
        torch.linalg.vector_norm(p["linear.weight"] - start["linear.weight"], dim=(1, 2))
        for p in (weak, strong)
    ]
    assert bool((dist[1] < dist[0]).all())


def test_train_local_ridge_reports_its_grid_and_choice(ds: FederatedDataset) -> None:
    model = MultinomialLogReg(D, C)
    res = train_local(ds, model, solver="ridge", ridges=(3.0, 0.3))
    sel = res.extra["local_selection"]
    assert sel["solver"] == "ridge"
    assert sel["grid"] == [[3.0], [0.3]]
    assert set(sel["choice"]) <= {0, 1}
    models = ridge_logreg({n: p.detach() for n, p in model.named_parameters()}, ds, (3.0, 0.3))
    assert res.personalized_params is not None
    for k, g in enumerate(sel["choice"]):
        torch.testing.assert_close(
            res.personalized_params["linear.weight"][k], models[g]["linear.weight"][k]
        )
    assert res.accuracies["test"]["personalized"]["accuracy"] > 1.0 / C
    # the default is unchanged: the SGD grid
    assert (
        train_local(ds, model, epochs=(1,), lrs=(0.1,)).extra["local_selection"]["solver"] == "sgd"
    )


class _TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(D, 4)
        self.b = nn.Linear(4, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"solver": "newton"}, ("solver", "newton")),
        ({"solver": "ridge", "ridges": ()}, ("ridges", "()")),
        ({"solver": "ridge", "ridges": (1.0, -2.0)}, ("ridges", "-2")),
        ({"solver": "ridge", "ridges": (float("nan"),)}, ("ridges", "nan")),
    ],
)
def test_bad_solver_settings_name_the_parameter(ds, kw, says) -> None:
    with pytest.raises(InvalidParameterError) as err:
        train_local(ds, MultinomialLogReg(D, C), **kw)
    for word in says:
        assert word in str(err.value)


def test_a_negative_gap_names_the_parameter(ds: FederatedDataset) -> None:
    with pytest.raises(InvalidParameterError, match=r"'gap'.*-0\.1"):
        ridge_logreg(_start(torch.float32), ds, (1.0,), gap=-0.1)


def test_ridge_needs_logistic_regression(ds: FederatedDataset) -> None:
    with pytest.raises(InvalidParameterError, match=r"'solver'.*MultinomialLogReg.*_TwoLayer"):
        train_local(ds, _TwoLayer(), solver="ridge")


@pytest.mark.parametrize("kw", [{"solver": "ridge"}, {"epochs": (1, 3), "lrs": (0.1,)}])
def test_without_scores_the_models_and_choice_are_the_same(ds: FederatedDataset, kw) -> None:
    model = MultinomialLogReg(D, C)
    full = train_local(ds, model, **kw)
    lean = train_local(ds, model, scores=False, **kw)
    assert full.personalized_params is not None and lean.personalized_params is not None
    for n, p in full.personalized_params.items():
        assert torch.equal(lean.personalized_params[n], p)
    assert lean.extra["local_selection"]["choice"] == full.extra["local_selection"]["choice"]
    assert lean.accuracies == {}
    assert all(np.isnan(a) for a in lean.extra["local_selection"]["grid_test_accuracy"])
