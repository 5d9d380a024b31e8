"""Round-plan helpers shared by the batched and reference paths."""

from __future__ import annotations

import numpy as np
import pytest

from privmtl.federated.algorithms import partition_plan


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
