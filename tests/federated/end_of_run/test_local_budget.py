"""Adam's local grid as a budget of steps (``local_budget.client_epochs``)."""

from __future__ import annotations

import numpy as np
import pytest

from privmtl.exceptions import InvalidParameterError
from privmtl.federated.end_of_run.local_budget import ADAM_EPOCH_STEPS, client_epochs


def test_a_small_client_trains_more_epochs_than_a_large_one() -> None:
    # 20 and 200 training examples in minibatches of 10: 2 and 20 minibatches per epoch
    e = client_epochs(20, np.array([2, 20]), ADAM_EPOCH_STEPS)
    assert e[0] > e[1] == 20
    assert e[0] == -(-20 * ADAM_EPOCH_STEPS // 2)  # the steps of 20 epochs of R minibatches
    assert e[0] * 2 >= 20 * ADAM_EPOCH_STEPS


def test_the_rule_is_max_of_epochs_and_the_step_budget() -> None:
    b = np.array([0, 1, 2, 3, 4, 5, 6, 100])
    got = client_epochs(3, b, 4)
    assert got.tolist() == [3, 12, 6, 4, 3, 3, 3, 3]  # a client without data keeps e
    assert (got * np.maximum(b, 1) >= np.where(b > 0, 12, 0)).all()
    assert client_epochs(3, b, None).tolist() == [3] * len(b)


@pytest.mark.parametrize(
    ("kw", "name"), [({"epochs": 0}, "epochs"), ({"epoch_steps": 0}, "epoch_steps")]
)
def test_bad_input_names_the_parameter(kw: dict, name: str) -> None:
    args = {"epochs": 2, "per_epoch": np.array([1]), "epoch_steps": 3} | kw
    with pytest.raises(InvalidParameterError, match=name):
        client_epochs(**args)
