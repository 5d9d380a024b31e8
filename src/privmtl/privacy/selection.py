r"""Private shared choices: a noisy client vote, recorded in the ledger, and the cost of candidates.

A hyper-parameter chosen on every client's pooled validation data makes each client's outputs
depend on the others outside any release. This module gives the two recorded alternatives.

Client vote (:class:`ClientVote`)
    Every client (task) scores the ``K`` candidates on its **own** validation split and votes for
    its best one (or abstains). The curator releases the noisy vote histogram

    .. math:: \tilde c = c + N(0, \sigma^2 I_K), \qquad c_j = \#\{i : v_i = j\},

    and takes :math:`\arg\max_j \tilde c_j` (post-processing). Adding or removing one client moves
    one count by 1 (L2 sensitivity 1); replacing one client moves two counts by 1 (L2 sensitivity
    :math:`\sqrt 2`). privmtl's events are stated in the add/remove convention and the accountant
    doubles the sensitivity under ``replace-one``
    (:mod:`privmtl.privacy.accounting`); the histogram's replace-one sensitivity is only
    :math:`\sqrt 2 = 2\cdot\tfrac{\sqrt 2}{2}`, so the vote's event is the Gaussian event with
    multiplier :math:`z = \sigma/1` under ``add-remove`` and :math:`z = \sigma/(\sqrt 2/2)` under
    ``replace-one`` — exactly the Gaussian mechanism of the true sensitivity in both cases, which
    is why a vote is bound to the relation of the ledger it is recorded in. The event is recorded
    (on disk for a durable ledger) *before* the winner is returned: write-ahead, like every other
    release (:mod:`privmtl.privacy.release`). The noise comes from a
    :class:`~privmtl.privacy.noise.NoiseSource` (secure by default in every caller; seeded only
    for simulations).

Cost of choosing among candidate *training runs* (:func:`record_candidates`)
    When the candidates are themselves private training runs, the chosen run's outputs depend on
    every candidate: each client needs every candidate's model to vote (or to choose), and each
    candidate is its own sequence of releases seen by every client. The honest cost is therefore
    the composition of **all** candidates' recorded events and the vote, in one ledger.

    The random-repetition bounds of Liu & Talwar (2019, "Private selection from private
    candidates") and Papernot & Steinke (2022, "Hyperparameter tuning with Rényi differential
    privacy") cost only a small multiple of one run's ε independently of ``K``, but they rest on
    releasing *only* the selected candidate (and its private score): the other runs stay hidden
    inside the curator. In a federated (billboard/joint-DP) run, every candidate's billboard is
    broadcast to the clients that train on it, and in a sweep every candidate's row is printed,
    so that premise does not hold; privmtl composes instead. It costs about :math:`\sqrt K` times
    one run's ε under RDP/PLD composition (for K runs of equal ε), and never claims less than
    what was released.

The budget split between selection and training is the caller's to state: the vote's own ε
(:meth:`ClientVote.epsilon`), the composed ε of the candidates without the vote, and the ledger's
total (the ε that covers training *and* selection).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dp_accounting import dp_event as dpe

from privmtl._validation import check_choice, check_int, check_real
from privmtl.exceptions import InvalidParameterError
from privmtl.privacy.accounting import compute_epsilon, event_from_dict
from privmtl.privacy.calibration import calibrate_noise_multiplier
from privmtl.privacy.guarantee import DEFAULT_ACCOUNTANT, DEFAULT_RELATION, RELATIONS
from privmtl.privacy.noise import NoiseSource, SecureNoise

__all__ = [
    "ABSTAIN",
    "SELECTION_METHODS",
    "VOTE_MECHANISM",
    "VOTE_SIGNAL",
    "CandidateBudget",
    "ClientVote",
    "VotePlan",
    "VoteResult",
    "client_vote_shares",
    "client_votes",
    "plan_candidates",
    "plan_vote",
    "record_candidates",
    "vote_sensitivity",
]

#: A client without validation data (or without a finite score) casts no vote.
ABSTAIN = -1

#: Name of the vote in ledger entries.
VOTE_MECHANISM = "client-vote"

#: A vote is held only when its noise std is at most (number of voters) / VOTE_SIGNAL: a
#: unanimous count then stands that many σ above the noise (public: the number of clients and σ).
VOTE_SIGNAL = 4.0

#: How a shared choice can be made: a recorded noisy vote, a per-client choice (each client
#: keeps the candidate best on its own validation split), or the pooled validation score
#: (not covered by the guarantee: opt-in only).
SELECTION_METHODS = ("vote", "client", "pooled")


def vote_sensitivity(relation: str) -> float:
    """L2 sensitivity of a vote histogram: 1 (add/remove one client), √2 (replace one client)."""
    check_choice("relation", relation, RELATIONS)
    return 1.0 if relation == "add-remove" else math.sqrt(2.0)


def _event_sensitivity(relation: str) -> float:
    # the add/remove-convention sensitivity whose accounting under `relation` is the true one:
    # the accountant doubles it under replace-one (privmtl.privacy.accounting)
    return vote_sensitivity(relation) / (1.0 if relation == "add-remove" else 2.0)


def client_votes(scores: Any, *, higher_is_better: bool = True) -> np.ndarray:
    """Each client's vote from its own scores: ``argbest`` of its row, :data:`ABSTAIN` if none.

    Parameters
    ----------
    scores : array-like of shape (n_clients, n_candidates)
        ``scores[i, j]``: client ``i``'s validation score of candidate ``j`` on its own data
        (NaN when client ``i`` cannot score candidate ``j``, e.g. no validation examples).
    higher_is_better : bool, default True

    Returns
    -------
    ndarray of int, shape (n_clients,)
        The index of the best finite score per row (the first one on ties), or
        :data:`ABSTAIN` for a row without a finite score.
    """
    finite, filled = _oriented_scores(scores, higher_is_better)
    votes = np.argmax(filled, axis=1).astype(np.int64)
    votes[~finite.any(axis=1)] = ABSTAIN
    return votes


def _oriented_scores(scores: Any, higher_is_better: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(finite, filled)`` of a ``(n_clients, n_candidates)`` score array: where a score exists,
    and the scores oriented so that larger is better, ``-inf`` where none."""
    s = np.asarray(scores, dtype=float)
    if s.ndim != 2 or s.shape[1] == 0:
        raise InvalidParameterError(
            "The 'scores' parameter must be a 2-d array (n_clients, n_candidates) with at least "
            f"one candidate; got shape {s.shape}."
        )
    finite = np.isfinite(s)
    return finite, np.where(finite, s if higher_is_better else -s, -np.inf)


def client_vote_shares(scores: Any, *, higher_is_better: bool = True) -> np.ndarray:
    """Each client's vote shared equally among its tied best candidates.

    A client whose best score is reached by several candidates (with two validation examples,
    most clients) gives each of them ``1 / (number tied)``; a row without a finite score abstains
    (all zeros). Every row is non-negative and sums to at most 1, so adding or removing one
    client moves the histogram by at most 1 in L2 (and L1): the sensitivity of
    :class:`ClientVote`'s whole votes (:func:`vote_sensitivity`), which
    :meth:`ClientVote.select` accepts in this form too.

    Parameters
    ----------
    scores : array-like of shape (n_clients, n_candidates)
        ``scores[i, j]``: client ``i``'s validation score of candidate ``j`` on its own data (NaN
        where it has none).
    higher_is_better : bool, default True

    Returns
    -------
    ndarray of float, shape (n_clients, n_candidates)
    """
    finite, filled = _oriented_scores(scores, higher_is_better)
    best = filled.max(axis=1, keepdims=True)
    tied = finite & (filled == best)
    n_tied = tied.sum(axis=1, keepdims=True)
    return np.where(tied, 1.0 / np.maximum(n_tied, 1), 0.0)


@dataclass(frozen=True)
class VoteResult:
    """What a vote released: the ``winner`` (index of the candidate) and the ``noisy_counts``.

    ``epsilon`` is the ledger's ε after the vote (the vote's own ε without a ledger), ``event``
    the recorded event; the exact counts never leave the curator.
    """

    winner: int
    noisy_counts: tuple[float, ...]
    epsilon: float
    event: dpe.DpEvent
    details: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "winner": self.winner,
            "noisy_counts": list(self.noisy_counts),
            "epsilon": self.epsilon if math.isfinite(self.epsilon) else None,
            **self.details,
        }


@dataclass(frozen=True)
class ClientVote:
    """Noisy-histogram argmax of client votes: a Gaussian mechanism (module docstring).

    Parameters
    ----------
    n_candidates : int >= 1
        K, the number of candidates voted on.
    noise_std : float >= 0
        σ, the standard deviation of the noise on every count. ``0`` releases the exact
        histogram: a non-private vote (ε = ∞), recorded as such.
    relation : {"add-remove", "replace-one"}
        The neighbouring relation of the ledger the vote is recorded in; it fixes the
        sensitivity (:func:`vote_sensitivity`).

    Examples
    --------
    >>> from privmtl.privacy import ClientVote, PrivacyLedger, SeededNoise
    >>> ledger = PrivacyLedger(delta=1e-5)
    >>> vote = ClientVote(n_candidates=3, noise_std=2.0)
    >>> res = vote.select([0, 2, 2, 2, 1, 2], SeededNoise(0), ledger=ledger)
    >>> ledger.records[-1]["mechanism"]
    'client-vote'
    """

    n_candidates: int
    noise_std: float
    relation: str = DEFAULT_RELATION

    def __post_init__(self) -> None:
        check_int("n_candidates", self.n_candidates, low=1)
        check_real("noise_std", self.noise_std, low=0.0)
        check_choice("relation", self.relation, RELATIONS)

    @classmethod
    def for_epsilon(
        cls,
        n_candidates: int,
        *,
        epsilon: float,
        delta: float,
        accountant: str = DEFAULT_ACCOUNTANT,
        relation: str = DEFAULT_RELATION,
    ) -> ClientVote:
        """The vote with the smallest σ whose own guarantee is (``epsilon``, ``delta``)."""
        check_real("epsilon", epsilon, low=0.0, closed="neither")
        z = calibrate_noise_multiplier(
            dpe.GaussianDpEvent,
            target_epsilon=epsilon,
            delta=delta,
            accountant=accountant,
            relation=relation,
        )
        return cls(n_candidates, z * _event_sensitivity(relation), relation)

    @classmethod
    def for_multiplier(
        cls, n_candidates: int, noise_multiplier: float, *, relation: str = DEFAULT_RELATION
    ) -> ClientVote:
        """The vote whose event is ``GaussianDpEvent(noise_multiplier)`` under ``relation``."""
        z = check_real("noise_multiplier", noise_multiplier, low=0.0, closed="neither")
        return cls(n_candidates, z * _event_sensitivity(relation), relation)

    @property
    def private(self) -> bool:
        """True when the counts get noise (σ > 0)."""
        return self.noise_std > 0

    @property
    def noise_multiplier(self) -> float | None:
        """The event's multiplier z (σ over the add/remove-convention sensitivity); None if σ = 0."""
        return self.noise_std / _event_sensitivity(self.relation) if self.private else None

    def event(self) -> dpe.DpEvent:
        """The vote's event: Gaussian(z), or non-private for σ = 0."""
        z = self.noise_multiplier
        return dpe.NonPrivateDpEvent() if z is None else dpe.GaussianDpEvent(z)

    def epsilon(self, delta: float, *, accountant: str = DEFAULT_ACCOUNTANT) -> float:
        """The vote's own ε at ``delta`` (``inf`` when σ = 0)."""
        return compute_epsilon(
            self.event(), delta=delta, accountant=accountant, relation=self.relation
        )

    def params(self) -> dict[str, Any]:
        """The vote's parameters as a ledger entry records them."""
        return {
            "n_candidates": self.n_candidates,
            "noise_std": self.noise_std,
            "noise_multiplier": self.noise_multiplier,
            "sensitivity": vote_sensitivity(self.relation),
            "relation": self.relation,
        }

    def counts(self, votes: Any) -> np.ndarray:
        """The exact vote histogram (stays with the curator); validates every vote.

        ``votes``: one candidate index (or :data:`ABSTAIN`) per client, or a 2-d array of every
        client's shares of its vote (:func:`client_vote_shares`: non-negative, each row summing
        to at most 1, which keeps the sensitivity of whole votes).
        """
        if isinstance(votes, np.ndarray) and votes.ndim == 2:
            return self._share_counts(votes)
        v = np.asarray(list(votes))
        if v.ndim != 1 or (v.size and not np.issubdtype(v.dtype, np.integer)):
            raise InvalidParameterError(
                "The 'votes' parameter must be a 1-d sequence of integers (candidate indices, or "
                f"{ABSTAIN} to abstain); got {v.dtype} of shape {v.shape}."
            )
        bad = (v < ABSTAIN) | (v >= self.n_candidates)
        if bad.any():
            raise InvalidParameterError(
                f"The 'votes' parameter must hold candidate indices in [0, {self.n_candidates}) "
                f"or {ABSTAIN} (abstain); got {int(v[bad][0])}."
            )
        return np.bincount(v[v != ABSTAIN], minlength=self.n_candidates).astype(float)

    def _share_counts(self, shares: np.ndarray) -> np.ndarray:
        w = np.asarray(shares, dtype=float)
        if w.shape[1] != self.n_candidates:
            raise InvalidParameterError(
                f"The 'votes' parameter as shares must have {self.n_candidates} columns (one per "
                f"candidate); got shape {w.shape}."
            )
        if not np.isfinite(w).all() or (w < 0).any():
            raise InvalidParameterError(
                "The 'votes' parameter as shares must be finite and non-negative; got a row "
                f"with {w[~(np.isfinite(w) & (w >= 0)).all(axis=1)][0].tolist()}."
            )
        total = w.sum(axis=1)
        if (total > 1.0 + 1e-9).any():
            raise InvalidParameterError(
                "The 'votes' parameter as shares must sum to at most 1 per client (one vote); "
                f"got a row summing to {float(total.max())!r}."
            )
        return w.sum(axis=0)

    def select(
        self,
        votes: Iterable[int],
        noise: NoiseSource | None = None,
        *,
        ledger: Any = None,
        release_id: str | None = None,
        replay_ok: bool = False,
        delta: float | None = None,
        accountant: str = DEFAULT_ACCOUNTANT,
    ) -> VoteResult:
        """Histogram → noise → ledger record → argmax: the winner and the noisy counts.

        ``votes`` holds one entry per client: a candidate index or :data:`ABSTAIN`, or every
        client's shares of its vote (a 2-d array, :meth:`counts`). ``noise``
        defaults to :class:`~privmtl.privacy.noise.SecureNoise` (OS entropy); pass a
        :class:`~privmtl.privacy.noise.SeededNoise` for a reproducible simulation only. With a
        ``ledger`` (:class:`~privmtl.privacy.PrivacyLedger`) the vote's event is recorded
        (``mechanism="client-vote"``; refused with :class:`~privmtl.exceptions.PrivacyBudgetError`
        when it would exceed the ledger's budget) before anything is returned, and ``epsilon`` is
        the ledger's total; the ledger's relation must be the vote's. Without a ledger,
        ``delta`` is needed and ``epsilon`` is the vote's own ε. ``release_id`` with
        ``replay_ok=True`` (seeded noise: the same counts, the same noise) returns the recorded
        release's ε when the ledger holds that id already, neither checking the budget nor
        charging it again (:meth:`~privmtl.privacy.ledger.PrivacyLedger.record`). Ties of the
        noisy counts (only with σ = 0) go to the lowest index.
        """
        counts = self.counts(votes)
        if ledger is None and delta is None:
            raise InvalidParameterError(
                "ClientVote.select needs a 'ledger' to record the vote in, or a 'delta' to state "
                "its own epsilon; got ledger=None, delta=None."
            )
        if ledger is not None and getattr(ledger, "relation", self.relation) != self.relation:
            raise InvalidParameterError(
                f"The vote's relation {self.relation!r} must be the ledger's "
                f"({ledger.relation!r}): the relation fixes the vote's sensitivity."
            )
        source = SecureNoise() if noise is None else noise
        event = self.event()
        replayed = (
            replay_ok and release_id is not None and ledger is not None
            and ledger.has_release(release_id)
        )  # fmt: skip
        if ledger is not None and hasattr(ledger, "check") and not replayed:
            ledger.check(event)  # refuse before any noise is drawn (a replay was charged)
        noisy = counts
        if self.private:
            noisy = counts + source.normal_numpy((self.n_candidates,), self.noise_std)
        if ledger is None:
            assert delta is not None
            eps = self.epsilon(delta, accountant=accountant)
        else:
            eps = float(
                ledger.record(
                    event,
                    mechanism=VOTE_MECHANISM,
                    params=self.params(),
                    release_id=release_id,
                    replay_ok=replay_ok,
                )
            )
        # the vote is on record (on disk for a durable ledger): it may now leave the curator
        winner = int(np.argmax(noisy))
        details = {
            "noise_std": self.noise_std,
            "noise_multiplier": self.noise_multiplier,
            "noise_source": source.kind if self.private else "none",
        }
        return VoteResult(winner, tuple(float(c) for c in noisy), eps, event, details)


def record_candidates(
    ledger: Any,
    candidate_events: Sequence[Sequence[dpe.DpEvent | dict[str, Any]]],
    *,
    prefix: str = "candidate",
) -> float:
    """Record every event of every candidate run in ``ledger``; returns the ledger's ε after them.

    ``candidate_events[j]`` lists the events candidate ``j`` recorded (dp-accounting events or
    their :func:`~privmtl.privacy.accounting.event_to_dict` form, e.g. read from the run's own
    ledger file). This is the cost of choosing among candidate runs that every client saw
    (module docstring); record the vote after them.
    """
    if not candidate_events:
        raise InvalidParameterError("The 'candidate_events' parameter must list >= 1 candidate.")
    for j, events in enumerate(candidate_events):
        for t, e in enumerate(events):
            event = event_from_dict(e) if isinstance(e, dict) else e
            ledger.record(event, mechanism=f"{prefix}-run", release_id=f"{prefix}:{j}:{t}")
    return float(ledger.epsilon())


@dataclass(frozen=True)
class VotePlan:
    """Whether a run holds a vote and with what noise: decided before the run from public
    parameters only (:func:`plan_vote`).

    ``held``: a vote is held; ``noise_std`` σ of its counts (0: a non-private run's exact vote);
    ``share`` its share of the target ε (0 when nothing is spent on it); ``reason`` in words.
    """

    held: bool
    noise_std: float = 0.0
    share: float = 0.0
    relation: str = DEFAULT_RELATION
    reason: str = ""

    def vote(self, n_candidates: int) -> ClientVote:
        """The vote's mechanism over ``n_candidates``."""
        return ClientVote(n_candidates, self.noise_std, self.relation)

    def event(self) -> dpe.DpEvent | None:
        """The event a private run's calibration reserves for the vote (None: nothing reserved)."""
        return self.vote(1).event() if self.held and self.noise_std > 0 else None


def plan_vote(
    n_voters: int,
    *,
    epsilon: float | None,
    delta: float,
    share: float,
    accountant: str = DEFAULT_ACCOUNTANT,
    relation: str = DEFAULT_RELATION,
) -> VotePlan:
    """The public plan of a vote among ``n_voters`` clients in a run of target ``epsilon``.

    The vote alone is (``share`` · ε, δ)-DP (:meth:`ClientVote.for_epsilon`; its σ does not
    depend on the number of candidates); it is held only where its noise std is at most
    ``n_voters /`` :data:`VOTE_SIGNAL` (otherwise no vote and nothing is spent). The caller
    calibrates its releases with :meth:`VotePlan.event` composed in, so that releases and vote
    compose to the target. ``epsilon=None``: a non-private run, the exact vote (σ = 0).
    """
    n = check_int("n_voters", n_voters, low=1)
    check_real("share", share, low=0.0, high=1.0, closed="neither")
    check_choice("relation", relation, RELATIONS)
    if epsilon is None:
        return VotePlan(True, 0.0, 0.0, relation, "non-private run: the clients' exact vote")
    vote = ClientVote.for_epsilon(
        1, epsilon=share * epsilon, delta=delta, accountant=accountant, relation=relation
    )
    if vote.noise_std > n / VOTE_SIGNAL:
        return VotePlan(
            False,
            relation=relation,
            reason=(
                f"a vote with {share:g} of epsilon would have noise std {vote.noise_std:.4g} > m / "
                f"{VOTE_SIGNAL:g} = {n / VOTE_SIGNAL:.4g}: it could not carry signal, no vote"
            ),
        )
    return VotePlan(
        True, vote.noise_std, share, relation, f"vote of the {n} clients with {share:g} of epsilon"
    )


@dataclass(frozen=True)
class CandidateBudget:
    """How a target (ε, δ) is split between ``n_candidates`` Gaussian runs and their vote
    (:func:`plan_candidates`); public, fixed before any run.

    ``candidate_epsilon`` is every candidate's own ε (its runs are calibrated to it),
    ``candidate_multiplier`` the single Gaussian multiplier with that ε, ``vote`` the vote's
    plan and ``target_multiplier`` the single Gaussian multiplier of the whole target.
    """

    n_candidates: int
    candidate_epsilon: float
    candidate_multiplier: float
    vote: VotePlan
    target_multiplier: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "n_candidates": self.n_candidates,
            "candidate_epsilon": self.candidate_epsilon,
            "candidate_multiplier": self.candidate_multiplier,
            "target_multiplier": self.target_multiplier,
            "vote_held": self.vote.held,
            "vote_noise_std": self.vote.noise_std,
            "vote_share": self.vote.share,
            "vote_reason": self.vote.reason,
        }


def plan_candidates(
    n_candidates: int,
    n_voters: int,
    *,
    epsilon: float,
    delta: float,
    share: float,
    accountant: str = DEFAULT_ACCOUNTANT,
    relation: str = DEFAULT_RELATION,
    vote: bool = True,
) -> CandidateBudget:
    r"""Split a target (ε, δ) between ``n_candidates`` runs of Gaussian releases and their vote,
    so that all of them compose to exactly the target.

    Gaussian mechanisms compose into one Gaussian mechanism whose precision is the sum of theirs
    (:func:`~privmtl.privacy.covariance.reserve_share`; exact under RDP and PLD and either
    relation). With :math:`z_\star` the multiplier of one Gaussian mechanism meeting the target
    and :math:`z_v` the vote's (:func:`plan_vote`: the vote alone is (``share`` · ε, δ)-DP, held
    only where it can carry signal), every candidate gets the precision

    .. math:: z_c^{-2} = (z_\star^{-2} - z_v^{-2}) / K

    and is run at the ε of that single Gaussian (``candidate_epsilon``): a run calibrated to it
    releases at most that precision, whatever its number of releases, so candidates and vote
    compose to at most the target. Without a vote (``n_candidates == 1`` or the vote could not
    carry signal) nothing is reserved and one candidate gets the whole target. ``vote=False``
    (each client keeps its own best candidate, nothing released): the candidates share the whole
    target, :math:`z_c^{-2} = z_\star^{-2} / K`.

    Only public quantities enter: ε, δ, the number of candidates and voters, the share.
    """
    k = check_int("n_candidates", n_candidates, low=1)
    eps = check_real("epsilon", epsilon, low=0.0, closed="neither")
    z_target = calibrate_noise_multiplier(
        dpe.GaussianDpEvent, target_epsilon=eps, delta=delta, accountant=accountant,
        relation=relation,
    )  # fmt: skip
    if k > 1 and not vote:
        plan = VotePlan(False, relation=relation, reason="per-client choice: no vote")
        z_c = z_target * math.sqrt(k)
        eps_c = compute_epsilon(
            dpe.GaussianDpEvent(z_c), delta=delta, accountant=accountant, relation=relation
        )
        return CandidateBudget(k, float(eps_c), z_c, plan, z_target)
    plan = (
        plan_vote(n_voters, epsilon=eps, delta=delta, share=share, accountant=accountant,
                  relation=relation)
        if k > 1
        else VotePlan(False, relation=relation, reason="one candidate: nothing to vote on")
    )  # fmt: skip
    if not plan.held:
        return CandidateBudget(1, eps, z_target, plan, z_target)
    z_vote = plan.noise_std / _event_sensitivity(relation)
    rest = z_target**-2 - z_vote**-2
    if rest <= 0:
        raise InvalidParameterError(
            f"The 'share' parameter must leave the candidates a part of the budget; got "
            f"share={share!r} at epsilon={eps!r}."
        )
    z_c = math.sqrt(k / rest)
    eps_c = compute_epsilon(
        dpe.GaussianDpEvent(z_c), delta=delta, accountant=accountant, relation=relation
    )
    return CandidateBudget(k, float(eps_c), z_c, plan, z_target)
