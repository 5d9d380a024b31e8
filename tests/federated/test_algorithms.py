"""Round-plan helpers shared by the batched and reference paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import (
    PLAN_HASH_BITS,
    RoundPlan,
    client_generators,
    draw_round_plan,
    pack_plan,
    pad_plan,
    partition_plan,
)
from privmtl.federated.client import ProxStep, local_sgd_batched, local_sgd_sets
from privmtl.federated.config import TrainConfig
from privmtl.federated.gradients import make_step_fn
from privmtl.federated.models import MultinomialLogReg


def _plan(steps: list[int]) -> list[list[np.ndarray]]:
    return [[np.arange(10)] * s for s in steps]


@pytest.mark.parametrize("seed", range(5))
def test_partition_covers_every_client_once_and_balances_work(seed: int) -> None:
    rng = np.random.default_rng(seed)
    steps = rng.integers(1, 40, size=20).tolist()
    groups = partition_plan(_plan(steps), 2, 8)
    # 2 workers x ceil(20 / 16) = 4 groups, every client exactly once, each group sorted
    assert len(groups) == 4
    assert sorted(np.concatenate(groups).tolist()) == list(range(20))
    assert all(np.all(np.diff(g) > 0) for g in groups)
    loads = [sum(steps[j] for j in g) for g in groups]
    # greedy LPT: the busiest group exceeds the idlest by at most one client's work
    assert max(loads) - min(loads) <= max(steps)


def test_partition_equal_split_of_equal_clients() -> None:
    groups = partition_plan(_plan([5] * 20), 2, None)
    assert [len(g) for g in groups] == [10, 10]


def test_partition_fewer_clients_than_groups() -> None:
    groups = partition_plan(_plan([3, 1]), 4, 1)
    assert sorted(np.concatenate(groups).tolist()) == [0, 1]
    assert len(groups) == 2
    assert partition_plan([], 2, 8) == []


@pytest.mark.parametrize("seed", [0, 12345, 2**32 - 1, 2**40, 2**70])
def test_client_generators_are_default_rng_of_each_client(seed: int) -> None:
    """The round plan's generators draw what ``default_rng([seed, stream, t, k])`` draws: the
    vectorised seeding for 32-bit words, numpy's own beyond."""
    clients = np.array([0, 5, 9999, 2**31 + 3])
    for k, rng in zip(clients, client_generators(seed, 1, 17, clients), strict=True):
        want = np.random.default_rng([seed, 1, 17, int(k)])
        assert np.array_equal(rng.permutation(50), want.permutation(50))
        assert np.array_equal(rng.random(3), want.random(3))


def _random_plan(seed: int, batch: int) -> list[list[np.ndarray]]:
    g = np.random.default_rng(seed)
    plan = []
    for _ in range(int(g.integers(1, 12))):
        steps = int(g.integers(0, 6))
        plan.append([g.integers(0, 90, int(g.integers(1, batch + 1))) for _ in range(steps)])
    return plan


@pytest.mark.parametrize("seed", range(6))
def test_pack_plan_holds_every_minibatch_once_with_active_clients_first(seed: int) -> None:
    plan = _random_plan(seed, 4)
    packed = pack_plan(plan, 4)
    rows, weights, active = (t.numpy() for t in pad_plan(plan, 4))
    steps = np.array([len(p) for p in plan])
    assert np.array_equal(packed.steps, steps)
    assert np.array_equal(packed.order, np.argsort(-steps, kind="stable"))
    for s in range(packed.n_steps):
        a, b = packed.bounds[s], packed.bounds[s + 1]
        clients = packed.order[: b - a]
        assert active[s, clients].all() and active[s].sum() == b - a
        assert np.array_equal(packed.rows[a:b], rows[s, clients])
        assert np.array_equal(packed.weights[a:b], weights[s, clients])
    assert packed.bounds[-1] == len(packed.rows) == steps.sum()


def test_pack_plan_refuses_minibatches_over_the_batch_size() -> None:
    with pytest.raises(InvalidParameterError, match="batch_size"):
        pack_plan([[np.arange(5)]], 4)


def test_a_clients_training_does_not_depend_on_the_others_or_their_order() -> None:
    """Clients of different numbers of steps trained together, alone and in reverse order end
    bit for bit equal (the packed loop computes on leading slices of the stacked state)."""
    g = torch.Generator().manual_seed(0)
    d, c, n = 6, 3, 90
    x, y = torch.randn(n, d, generator=g), torch.randint(0, c, (n,), generator=g)
    plan = _random_plan(3, 5)
    k = len(plan)
    starts = {"linear.weight": torch.randn(k, c, d, generator=g), "linear.bias": torch.zeros(k, c)}
    anchor = {"linear.weight": torch.randn(c, d, generator=g), "linear.bias": torch.ones(c)}
    rule = ProxStep(lr=0.1, anchor=anchor, weight=0.5)
    step = make_step_fn(MultinomialLogReg(d, c), {})
    together, losses = local_sgd_batched(step, starts, rule, x, y, plan, 5)
    back = list(range(k))[::-1]
    rev = {nm: p[back] for nm, p in starts.items()}
    reversed_, rev_losses = local_sgd_batched(step, rev, rule, x, y, plan[::-1], 5)
    assert np.array_equal(rev_losses[::-1], losses, equal_nan=True)
    for j in range(k):
        one = {nm: p[j : j + 1] for nm, p in starts.items()}
        alone, loss = local_sgd_batched(step, one, rule, x, y, [plan[j]], 5)
        for nm in starts:
            assert torch.equal(alone[nm][0], together[nm][j])
            assert torch.equal(reversed_[nm][k - 1 - j], together[nm][j])
        assert np.isnan(loss[0]) == np.isnan(losses[j])
        assert np.isnan(loss[0]) or loss[0] == losses[j]


def _documented_epoch(seed: int, stream: int, t: int, k: int, e: int, n: int) -> np.ndarray:
    """Epoch ``e``'s permutation of client ``k``'s ``n`` rows as draw_round_plan documents it,
    with bare numpy and Python integers."""
    w0, w1 = (
        int(w)
        for w in np.random.SeedSequence([seed, stream, t, k]).generate_state(4, np.uint64)[:2]
    )
    mask = (1 << 64) - 1

    def fmix(x: int) -> int:
        x ^= x >> 33
        x = (x * 0xFF51AFD7ED558CCD) & mask
        x ^= x >> 33
        x = (x * 0xC4CEB9FE1A85EC53) & mask
        return x ^ (x >> 33)

    keys = [fmix(fmix((w0 + ((e << 32) + i) * 0x9E3779B97F4A7C15) & mask) ^ w1) for i in range(n)]
    return np.array(sorted(range(n), key=lambda i: (keys[i] >> (64 - PLAN_HASH_BITS), i)))


@pytest.mark.parametrize("seed", [0, 7, 2**32 + 5])
def test_round_plan_epochs_are_the_documented_keyed_permutations(seed: int) -> None:
    # every epoch of every client: its keyed hash's order, cut into minibatches in turn; the
    # packed arrays are pack_plan's of the lists read from the plan
    g = np.random.default_rng(seed % 97)
    sizes = g.integers(0, 40, 30)
    sizes[3] = 700  # rows beyond a byte
    off = np.concatenate([[0], np.cumsum(sizes)])
    sampled = np.array([3, 29, 0, 11, 12, 5])
    cfg = TrainConfig(local_epochs=2, batch_size=4, seed=seed)
    plan = draw_round_plan(sampled, off, 9, cfg, stream=3)
    assert isinstance(plan, RoundPlan) and len(plan) == len(sampled)
    for j, k in enumerate(sampled.tolist()):
        n, per = int(sizes[k]), -(-int(sizes[k]) // 4)
        assert len(plan[j]) == 2 * per
        for e in range(2):
            want = _documented_epoch(seed, 3, 9, k, e, n) + off[k]
            got = plan[j][e * per : (e + 1) * per]
            assert [len(b) for b in got] == [min(4, n - 4 * u) for u in range(per)]
            assert np.array_equal(np.concatenate(got) if got else [], want)
    packed = pack_plan(plan.lists(), 4)
    for name in ("order", "steps", "bounds", "rows", "weights"):
        assert np.array_equal(getattr(plan, name), getattr(packed, name))
    assert pack_plan(plan, 4) is plan
    with pytest.raises(InvalidParameterError, match="batch_size"):
        pack_plan(plan, 5)


def test_a_clients_plan_depends_on_its_own_size_and_the_seeds_alone() -> None:
    # the same client in another round's company (other clients, sizes, order, more rows than
    # the one-word sort holds) and at another place of the stacked rows: the same minibatches
    cfg = TrainConfig(local_epochs=3, batch_size=5, seed=4)
    sizes = np.array([12, 3, 40, 0, 9, 70_000])
    off = np.concatenate([[0], np.cumsum(sizes)])
    mine = draw_round_plan([4], off, 2, cfg)[0]
    for company in ([0, 4, 1], [4, 2, 3], [5, 4]):
        plan = draw_round_plan(company, off, 2, cfg)
        j = company.index(4)
        assert all(np.array_equal(a, b) for a, b in zip(plan[j], mine, strict=True))
        starts = np.arange(len(company)) * 1000
        moved = draw_round_plan(company, off, 2, cfg, starts=starts)[j]
        assert all(
            np.array_equal(a - off[4], b - starts[j]) for a, b in zip(mine, moved, strict=True)
        )
    assert draw_round_plan([4], off, 3, cfg)[0][0].tolist() != mine[0].tolist()


def _two_sets(
    seed: int, d: int, c: int, k: int, dtype: torch.dtype, ball: float | None = None
) -> list[tuple[dict[str, torch.Tensor], ProxStep]]:
    """Ditto's two sets of the same ``k`` clients: pulled to an anchor, and not pulled."""
    g = torch.Generator().manual_seed(seed)
    anchor = {
        "linear.weight": torch.randn(c, d, generator=g, dtype=dtype),
        "linear.bias": torch.ones(c, dtype=dtype),
    }
    rules = (ProxStep(lr=0.1, anchor=anchor, weight=0.5, ball=ball), ProxStep(lr=0.1, ball=ball))
    return [
        (
            {
                "linear.weight": torch.randn(k, c, d, generator=g, dtype=dtype),
                "linear.bias": torch.randn(k, c, generator=g, dtype=dtype),
            },
            rule,
        )
        for rule in rules
    ]


@pytest.mark.parametrize("seed", range(4))
def test_sets_as_one_model_are_each_set_trained_alone_within_rounding(seed: int) -> None:
    """Two sets of logistic states of the same clients on one plan, held as one model (one
    product a step for both): each set's models and losses are those of its own training up to
    rounding. In float64 a step's terms are rounded to ~1e-16 of their size; over the plan's
    few steps of lr 0.1 (contracting) the two computations stay within 1e-12 of each other."""
    g = torch.Generator().manual_seed(seed)
    d, c, n = 6, 3, 90
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randint(0, c, (n,), generator=g)
    plan = _random_plan(seed, 5)
    sets = _two_sets(seed, d, c, len(plan), torch.float64)
    step = make_step_fn(MultinomialLogReg(d, c), {})
    together = local_sgd_sets(step, sets, x, y, plan, 5)
    for (starts, rule), (news, losses) in zip(sets, together, strict=True):
        alone, alone_losses = local_sgd_batched(step, starts, rule, x, y, plan, 5)
        for nm in starts:
            assert news[nm].shape == alone[nm].shape and news[nm].is_contiguous()
            assert torch.allclose(news[nm], alone[nm], rtol=0, atol=1e-12), nm
        assert np.allclose(losses, alone_losses, rtol=0, atol=1e-12, equal_nan=True)
        assert not any(torch.equal(news[nm], starts[nm]) for nm in starts)  # they trained


def test_sets_as_one_model_do_not_depend_on_the_other_clients() -> None:
    """A client's models out of the joint loop are the same bits alone, beside others and in
    reverse order (each client's products are its own)."""
    g = torch.Generator().manual_seed(5)
    d, c, n = 6, 3, 90
    x, y = torch.randn(n, d, generator=g), torch.randint(0, c, (n,), generator=g)
    plan = _random_plan(3, 5)
    k = len(plan)
    sets = _two_sets(3, d, c, k, torch.float32)
    step = make_step_fn(MultinomialLogReg(d, c), {})
    together = local_sgd_sets(step, sets, x, y, plan, 5)
    for j in range(k):
        one = [({nm: p[j : j + 1] for nm, p in s.items()}, r) for s, r in sets]
        alone = local_sgd_sets(step, one, x, y, [plan[j]], 5)
        rev = [({nm: p.flip(0) for nm, p in s.items()}, r) for s, r in sets]
        back = local_sgd_sets(step, rev, x, y, plan[::-1], 5)
        for i in range(2):
            for nm in sets[i][0]:
                assert torch.equal(alone[i][0][nm][0], together[i][0][nm][j])
                assert torch.equal(back[i][0][nm][k - 1 - j], together[i][0][nm][j])


def test_sets_whose_rules_project_train_one_after_the_other() -> None:
    """Rules the joint model does not cover (a ball) train each set alone: the same bits."""
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(90, 6, generator=g), torch.randint(0, 3, (90,), generator=g)
    plan = _random_plan(2, 5)
    sets = _two_sets(2, 6, 3, len(plan), torch.float32, ball=1.0)
    step = make_step_fn(MultinomialLogReg(6, 3), {})
    together = local_sgd_sets(step, sets, x, y, plan, 5)
    for (starts, rule), (news, losses) in zip(sets, together, strict=True):
        alone, alone_losses = local_sgd_batched(step, starts, rule, x, y, plan, 5)
        assert all(torch.equal(news[nm], alone[nm]) for nm in starts)
        assert np.array_equal(losses, alone_losses, equal_nan=True)


def test_round_plan_sorts_alike_when_rows_outgrow_one_word(monkeypatch: pytest.MonkeyPatch) -> None:
    # the fallback (lexsort of segment, hash, row) orders as the one-word sort does
    cfg = TrainConfig(local_epochs=2, batch_size=3, seed=1)
    off = np.concatenate([[0], np.cumsum(np.arange(1, 60))])
    fast = draw_round_plan(range(40), off, 0, cfg)
    monkeypatch.setattr("privmtl.federated.algorithms._SORT_BITS", 0)
    slow = draw_round_plan(range(40), off, 0, cfg)
    assert np.array_equal(fast.rows, slow.rows) and np.array_equal(fast.weights, slow.weights)
