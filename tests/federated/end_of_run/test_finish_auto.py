"""The end of run's default: ``finetune_select="auto"`` and ``local_solver="auto"`` hold the
recorded vote over exact ridge candidates where a vote can be planned, and leave every client its
own choice among the SGD grids elsewhere."""

from __future__ import annotations

import pytest
from torch import nn

from privmtl.exceptions import InvalidParameterError
from privmtl.experiments.pmtl import run_pmtl
from privmtl.federated.end_of_run.finish import resolve_finetune_select, resolve_local_solver
from privmtl.federated.models import MultinomialLogReg

KW = {"noise_source": "seeded", "seed": 0, "show_progress": False, "threads": 1}
VOTES = {"finetune": "auto", "samples": True, "noise_mechanism": "independent", "epsilon": 1.0}


LOGREG = MultinomialLogReg(4, 3)


def test_auto_votes_only_where_a_vote_can_be_planned():
    assert resolve_finetune_select("auto", LOGREG, **VOTES) == "vote"
    mlp = nn.Sequential(nn.Linear(4, 3))  # no exact candidates: every client's own choice
    assert resolve_finetune_select("auto", mlp, **VOTES) == "client"
    for change in (
        {"finetune": "none"},
        {"finetune": "vanilla"},
        {"samples": False},  # local-all: nothing released
        {"noise_mechanism": "banded"},  # one event for the whole run: no reserve
        {"epsilon": None},  # non-private, or noise_std alone: no target to take a share of
    ):
        assert resolve_finetune_select("auto", LOGREG, **{**VOTES, **change}) == "client", change
    for given in ("client", "vote", "pooled"):  # an explicit choice is kept as given
        assert resolve_finetune_select(given, LOGREG, **{**VOTES, "epsilon": None}) == given


def test_auto_solver_is_ridge_for_a_held_vote_sgd_for_logreg_adam_for_a_network():
    logreg, mlp = MultinomialLogReg(4, 3), nn.Sequential(nn.Linear(4, 3))
    assert resolve_local_solver("auto", logreg, vote_held=True) == "ridge"
    assert resolve_local_solver("auto", logreg, vote_held=False) == "sgd"
    assert resolve_local_solver("auto", mlp, vote_held=True) == "adam"
    assert resolve_local_solver("auto", mlp, vote_held=False) == "adam"
    assert resolve_local_solver("auto", mlp, vote_held=False, patience=3) == "sgd"  # stops SGD
    assert resolve_local_solver("sgd", mlp, vote_held=False) == "sgd"
    assert resolve_local_solver("ridge", logreg, vote_held=False) == "ridge"
    assert resolve_local_solver("sgd", logreg, vote_held=True) == "sgd"


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: resolve_finetune_select("best", LOGREG, **VOTES), "'finetune_select' parameter"),
        (
            lambda: resolve_local_solver("lbfgs", MultinomialLogReg(2, 2), vote_held=True),
            "'local_solver' parameter",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_parameter(call, name):
    with pytest.raises(InvalidParameterError, match=name):
        call()


def _same(a, b):
    keys = ("test_accuracy", "mean_client_accuracy", "epsilon", "noise_std", "finetune_auto")
    return all(a[k] == b[k] for k in keys)


def test_the_default_is_the_vote_over_ridge_candidates_where_it_is_held():
    run = {"num_clients": 300, "epsilon": 1.0, "rounds": 2, **KW}
    default = run_pmtl(**run)
    auto = default["finetune_auto"]
    assert auto["select"] == "vote" and auto["vote"]["held"] and auto["solver"] == "ridge"
    assert auto["vote"]["candidates"][:2] == ["trained", "local"]  # 2 rounds: no signal yet
    assert all(name.endswith(" c30") for name in auto["vote"]["candidates"][2:])
    assert _same(default, run_pmtl(**run, finetune_select="vote", local_solver="ridge"))


def test_the_default_is_every_clients_own_sgd_choice_where_no_vote_is_held():
    run = {"num_clients": 50, "epsilon": 1.0, "rounds": 2, **KW}  # a vote too noisy to hold
    default = run_pmtl(**run)
    assert default["finetune_auto"]["select"] == "client" and "vote" not in default["finetune_auto"]
    assert default["finetune_auto"]["solver"] == "sgd"
    assert _same(default, run_pmtl(**run, finetune_select="client", local_solver="sgd"))


def test_local_patience_asks_for_sgd_runs():
    out = run_pmtl(num_clients=300, epsilon=1.0, rounds=1, local_patience=2, **KW)
    assert out["finetune_auto"]["select"] == "vote" and out["finetune_auto"]["solver"] == "sgd"
