"""The clients' end-of-run vote on Flower: planned and released by the ServerApp, counted by the
nodes.

As in process (:func:`privmtl.experiments.pmtl.run_pmtl`): where
:func:`~privmtl.federated.finish.resolve_finetune_select` holds a vote, its event is reserved
when the run's noise is calibrated (:func:`vote_plan`), every voting client shares its vote
among the candidates it scores best on its own validation split, the shares are summed and
released with noise through the same path (:class:`~privmtl.privacy.selection.ClientVote`,
the write-ahead ledger record ``FINETUNE_VOTE_ID`` with its replay identity), and every client
then finishes with the winner. Here each node sums its own clients' shares
(:func:`node_vote_shares`), the ServerApp sums the nodes' sums and releases them
(:func:`elect`), and the nodes finish their clients with the announced winner.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from privmtl.exceptions import PrivacyBudgetError
from privmtl.federated.finish import (
    FINETUNE_VOTE_ID,
    FINETUNE_VOTE_SHARE,
    FINETUNE_VOTE_STREAM,
    FINETUNE_VOTERS,
    FINETUNE_VOTERS_STREAM,
    resolve_finetune_select,
    vote_voters,
)
from privmtl.federated.methods import method_class
from privmtl.federated.models import MultinomialLogReg
from privmtl.federated.options import RunOptions
from privmtl.federated.spec import pmtl_delta
from privmtl.privacy.noise import make_noise_source
from privmtl.privacy.selection import plan_vote

if TYPE_CHECKING:
    from privmtl.federated.spec import RunSpec
    from privmtl.privacy.ledger import PrivacyLedger
    from privmtl.privacy.selection import VotePlan

__all__ = ["elect", "node_vote_shares", "node_voters", "vote_plan", "voter_rng"]


def vote_plan(spec: RunSpec, m: int, model: str) -> VotePlan | None:
    """The vote ``run_pmtl`` plans for the same run at its default selection (``"auto"``), or
    None where no vote is held. ``model`` is the run's model name: the built-in ``"logreg"``
    is the multinomial logistic regression whose candidates are solved exactly."""
    declared = method_class(spec.method)
    samples = declared.communicates and not declared.every_client
    # the model class is all resolve_finetune_select asks of the model
    probe = MultinomialLogReg.__new__(MultinomialLogReg) if model == "logreg" else object()
    select = resolve_finetune_select(
        RunOptions().finetune_select, probe,  # type: ignore[arg-type]
        finetune=spec.finetune, samples=samples, noise_mechanism=spec.noise_mechanism,
        epsilon=spec.epsilon,
    )  # fmt: skip
    if select != "vote" or not samples or spec.epsilon is None:
        return None
    plan = plan_vote(
        min(m, FINETUNE_VOTERS), epsilon=spec.epsilon, delta=pmtl_delta(spec.delta, m)[0],
        share=FINETUNE_VOTE_SHARE, accountant=spec.accountant, relation=spec.relation,
    )  # fmt: skip
    return plan if plan.held else None


def voter_rng(noise_source: str, seed: int) -> np.random.Generator | None:
    """The voters' coins as ``run_pmtl`` draws them: the seeded stream of a seeded run, else
    None (OS entropy)."""
    if noise_source != "seeded":
        return None
    return np.random.default_rng([int(seed), FINETUNE_VOTERS_STREAM])


def node_voters(m: int, clients: np.ndarray, noise_source: str, seed: int) -> np.ndarray:
    """The positions among a node's ``clients`` (population indices) of those that vote: the
    population's :func:`~privmtl.federated.finish.vote_voters` (each client's coin its own)."""
    voters = vote_voters(m, voter_rng(noise_source, seed))
    return np.flatnonzero(np.isin(clients, voters))


def node_vote_shares(finish_clients_call: Any) -> np.ndarray:
    """The summed vote shares of a node's clients: ``finish_clients_call(vote)`` runs
    :func:`~privmtl.federated.finish.finish_clients` with ``select="vote"`` and this ``vote``,
    which takes the clients' shares and stops there (no model is trained before the winner is
    known)."""
    got: list[np.ndarray] = []

    class _Counted(Exception):
        pass

    def vote(shares: np.ndarray, names: tuple[str, ...]) -> int:
        got.append(np.asarray(shares, dtype=np.float64).sum(axis=0))
        raise _Counted

    try:
        finish_clients_call(vote)
    except _Counted:
        return got[0]
    raise AssertionError("finish_clients did not hold the vote")


def _as_rows(total: np.ndarray) -> np.ndarray:
    """Summed shares as rows of at most one vote each (what the release takes): ``k`` equal
    rows whose sum is ``total`` (a node's clients' sums carry no more than their votes)."""
    k = max(1, math.ceil(float(total.sum()) - 1e-9))
    return np.tile(total / k, (k, 1))


def elect(
    plan: VotePlan,
    shares: np.ndarray,
    names: tuple[str, ...],
    *,
    ledger: PrivacyLedger | None,
    noise_source: str,
    seed: int,
    delta: float,
    accountant: str,
) -> tuple[int | None, dict[str, Any], float | None]:
    """Release the vote of the summed ``shares`` over ``names`` as ``run_pmtl`` does:
    ``(winner index or None where the budget leaves no room for it, the record reported as
    ``finetune_auto["vote"]``, the ledger's ε after it or None)``."""
    replay = noise_source == "seeded"
    replayed = replay and ledger is not None and ledger.has_release(FINETUNE_VOTE_ID)
    if ledger is not None and not replayed:
        try:  # a run stopped on its budget may have no room left for the vote
            ledger.check(plan.vote(1).event())
        except PrivacyBudgetError as exc:
            plan = dataclasses.replace(plan, held=False, reason=f"no vote: {exc}")
    record: dict[str, Any] = {"id": FINETUNE_VOTE_ID, "held": plan.held, "reason": plan.reason}
    if not plan.held:
        return None, record, None
    ballot = plan.vote(len(names))
    noise = make_noise_source(noise_source, seed, stream=(FINETUNE_VOTE_STREAM,))
    res = ballot.select(
        _as_rows(np.asarray(shares, dtype=np.float64)),
        noise if ballot.private else None, ledger=ledger, release_id=FINETUNE_VOTE_ID,
        replay_ok=replay, delta=float(delta), accountant=accountant,
    )  # fmt: skip
    own = ballot.epsilon(float(delta), accountant=accountant)
    record.update(
        candidates=list(names), winner=names[res.winner],
        noisy_counts=list(res.noisy_counts), noise_std=ballot.noise_std,
        share=plan.share, epsilon=own if math.isfinite(own) else None,
        noise_source=res.details["noise_source"],
    )  # fmt: skip
    return int(res.winner), record, (res.epsilon if ledger is not None else None)
