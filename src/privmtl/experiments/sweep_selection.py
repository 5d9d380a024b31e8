"""Choosing one candidate run per sweep point, and the ε that choice costs.

A sweep (:mod:`privmtl.experiments.sweep`) that runs several candidate configurations per
(seed, method, ε) keeps one with :func:`select_candidates`, one of
:data:`~privmtl.privacy.SELECTION_METHODS` (the three rules and what each covers are described in
:mod:`privmtl.experiments.sweep`); :func:`ledger_events` reads what each candidate released and
:func:`candidates_accounting` the terms under which they compose. This module needs the privacy
package (PyTorch and the accountant): :mod:`privmtl.experiments.sweep`, which the CLI imports at
start-up, does not import it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from privmtl._validation import check_choice, check_real
from privmtl.exceptions import InvalidParameterError
from privmtl.experiments.runlog import run_key
from privmtl.experiments.sweep import DEFAULT_VOTE_SHARE
from privmtl.privacy import ClientVote, PrivacyLedger, client_votes, record_candidates
from privmtl.privacy.guarantee import DEFAULT_ACCOUNTANT
from privmtl.privacy.ledger import read_ledger
from privmtl.privacy.noise import SecureNoise, SeededNoise
from privmtl.privacy.selection import SELECTION_METHODS, VOTE_MECHANISM

__all__ = ["candidates_accounting", "ledger_events", "select_candidates"]

#: Seeded-noise stream of the votes (distinct from the runs' streams).
_VOTE_STREAM = 11


def ledger_events(path: str | Path) -> list[dict[str, Any]]:
    """The events a run recorded in its ledger file (serialized; none when there is no file).

    Consecutive identical events (the same release every round) are folded into one
    self-composed event, which composes to the same ε.
    """
    if not Path(path).is_file():
        return []
    _, entries = read_ledger(path)
    out: list[dict[str, Any]] = []
    prev: dict[str, Any] | None = None
    count = 0
    for entry in entries:
        if entry["event"] == prev:
            count += 1
            continue
        if prev is not None:
            out.append(_repeat(prev, count))
        prev, count = entry["event"], 1
    if prev is not None:
        out.append(_repeat(prev, count))
    return out


def _repeat(event: dict[str, Any], count: int) -> dict[str, Any]:
    return event if count == 1 else {"type": "self_composed", "count": count, "event": event}


def _vote_noise(noise_source: str, seed: int, key: str) -> Any:
    if noise_source == "secure":
        return SecureNoise()
    return SeededNoise(seed, stream=(_VOTE_STREAM, zlib.crc32(key.encode()) & 0x7FFFFFFF))


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def candidates_accounting(candidates: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``delta``, ``accountant`` and ``relation`` under which candidate runs are composed.

    Those of the private candidates (every candidate of a sweep point shares them). A point
    without a private candidate composes nothing finite, and any δ states that (1e-5 is used).
    """
    delta = next((c["delta"] for c in candidates if c.get("delta")), 1e-5)
    accountant = next(
        (c["accountant"] for c in candidates if c.get("accountant") in ("rdp", "pld")),
        DEFAULT_ACCOUNTANT,
    )
    return {
        "delta": float(delta),
        "accountant": str(accountant),
        "relation": str(candidates[0]["relation"]),
    }


def select_candidates(
    *,
    select: str,
    scores: Any,
    pooled: Sequence[float | None],
    events: Sequence[Sequence[dict[str, Any]]],
    target_epsilon: float | None,
    delta: float,
    accountant: str,
    relation: str,
    noise_source: str,
    seed: int,
    vote_share: float = DEFAULT_VOTE_SHARE,
    log: Any = None,
    log_key: dict[str, Any] | None = None,
    higher_is_better: bool = True,
    what: str = "the configuration",
) -> dict[str, Any]:
    """Choose among K candidate runs of one sweep point (module docstring) and state the cost.

    Parameters
    ----------
    select : {"vote", "client", "pooled"}
    scores : array of shape (n_clients, K)
        Client ``i``'s validation score of candidate ``j`` on its own validation split (NaN:
        none). Read by "vote" and "client".
    pooled : sequence of K floats
        The pooled validation score of every candidate (read by "pooled" only).
    events : K sequences of serialized events
        What each candidate recorded in its ledger (:func:`ledger_events`); an empty sequence
        for a run that released nothing (``[{"type": "non_private"}]`` for a non-private one).
    target_epsilon : float or None
        The sweep point's ε (None: a non-private or local point; its vote gets no noise).
    delta, accountant, relation
        Those of the candidate runs; the selection's ledger composes at the same δ.
    noise_source : {"secure", "seeded"}
        The vote's noise (seeded: from ``seed`` and ``log_key``, simulations only).
    vote_share : float in (0, 1]
        The vote alone is (``vote_share`` · ``target_epsilon``, δ)-DP.
    log, log_key
        A :class:`~privmtl.experiments.runlog.RunLog` and the point's identity: a vote is
        released once and logged; a resumed sweep reuses it instead of drawing new noise.
    higher_is_better : bool
    what : str
        What is chosen, for the rows' notes.

    Returns
    -------
    dict
        ``method`` (as performed: a vote over candidates that release nothing, e.g. local
        training, becomes the per-client choice, which keeps ε = 0), ``covered``, ``candidates``
        (K), ``chosen`` (index; None for the per-client choice), ``choices`` (per client, an
        int array, the curator's only: not for publication), ``epsilon`` (training of every
        candidate + vote, composed; None when infinite or not covered), ``candidates_epsilon``,
        ``vote`` (σ, its multiplier, its own ε, the share, the noisy counts) and ``note``.
        With one candidate nothing is chosen: ``method`` is ``"none"``.
    """

    check_choice("select", select, SELECTION_METHODS)
    check_real("vote_share", vote_share, low=0.0, high=1.0, closed="right")
    k = len(events)
    if k == 0 or len(pooled) != k:
        raise InvalidParameterError(
            f"select_candidates needs one entry of 'pooled' per candidate and >= 1 candidate; got "
            f"{len(pooled)} pooled scores for {k} candidates."
        )
    base = {"candidates": k, "delta": delta, "accountant": accountant, "relation": relation}
    if select == "pooled" and k > 1:
        return _pooled_choice(base, pooled, higher_is_better, what)
    s = np.asarray(scores, dtype=float)
    if s.ndim != 2 or s.shape[1] != k:
        raise InvalidParameterError(
            f"The 'scores' parameter must have shape (n_clients, {k}); got {s.shape}."
        )
    ledger = PrivacyLedger(delta=delta, accountant=accountant, relation=relation)
    releases = any(len(e) for e in events)
    eps_c = record_candidates(ledger, events) if releases else 0.0
    votes = client_votes(s, higher_is_better=higher_is_better)
    method = "none" if k == 1 else select if releases else "client"
    if method != "vote":
        return _own_choice(base, method, votes, k, releases, eps_c, delta, what)
    if target_epsilon is None:
        vote = ClientVote(k, 0.0, relation)
    else:
        vote = ClientVote.for_epsilon(
            k,
            epsilon=vote_share * target_epsilon,
            delta=delta,
            accountant=accountant,
            relation=relation,
        )
    key = {**(log_key or {}), "selection": "vote", "vote_share": vote_share}
    logged = None if log is None else log.get(key)
    if logged is not None:  # released before: compose it again, draw nothing new
        ledger.record(vote.event(), mechanism=VOTE_MECHANISM, params=vote.params())
        winner, noisy, vote_source = (
            logged["winner"],
            logged["noisy_counts"],
            logged["noise_source"],
        )
    else:
        noise = _vote_noise(noise_source, seed, run_key(key))
        res = vote.select(votes, noise, ledger=ledger, release_id="vote")
        winner, noisy, vote_source = res.winner, list(res.noisy_counts), res.details["noise_source"]
        if log is not None:
            log.add(key, {"winner": winner, "noisy_counts": noisy, "noise_source": vote_source})
    return _vote_choice(
        base, vote, ledger, eps_c, s.shape[0], winner, noisy, vote_source, what,
        share=vote_share if target_epsilon is not None else None,
    )  # fmt: skip


def _pooled_choice(
    base: dict[str, Any], pooled: Sequence[float | None], higher_is_better: bool, what: str
) -> dict[str, Any]:
    """``select="pooled"``: the candidate with the best pooled validation score (not covered)."""
    vals = np.array([np.nan if v is None else float(v) for v in pooled])
    signed = vals if higher_is_better else -vals
    best = 0 if np.all(np.isnan(signed)) else int(np.nanargmax(signed))
    return {
        **base,
        "method": "pooled",
        "covered": False,
        "chosen": best,
        "epsilon": None,
        "candidates_epsilon": None,
        "vote": None,
        "note": f"{what} chosen on the pooled validation score of every client: NOT covered",
        "reason": (
            f"{what} was chosen on the pooled validation score of every client (--select "
            "pooled): a statistic of every client's data that is not a recorded release"
        ),
    }


def _own_choice(
    base: dict[str, Any],
    method: str,
    votes: np.ndarray,
    k: int,
    releases: bool,
    eps_c: float,
    delta: float,
    what: str,
) -> dict[str, Any]:
    """Every client's own choice on its own validation split (``method`` "client"), or the one
    candidate (``"none"``): ε composes the candidates' runs it read."""
    choices = np.where(votes < 0, 0, votes)  # no validation data: the first (public) point
    chosen: int | None = 0 if k == 1 else None
    if k == 1:
        note = f"one candidate: {what} was not chosen"
    elif releases:
        note = (
            f"{what} chosen by every client on its own validation split (no release); ε "
            f"composes all {k} candidate runs each client read: {eps_c:.4g}"
        )
    else:
        note = (
            f"{what} chosen by every client on its own validation split among its own {k} "
            "candidate runs; nothing is released (ε = 0 towards the others)"
        )
    base["delta"] = delta if releases else None
    return {
        **base,
        "method": method,
        "covered": True,
        "chosen": chosen,
        "choices": choices,
        "epsilon": _finite_or_none(eps_c),
        "candidates_epsilon": _finite_or_none(eps_c),
        "vote": None,
        "note": note,
    }


def _vote_choice(
    base: dict[str, Any],
    vote: Any,
    ledger: Any,
    eps_c: float,
    n_clients: int,
    winner: int,
    noisy: Sequence[float],
    vote_source: str,
    what: str,
    *,
    share: float | None,
) -> dict[str, Any]:
    """The noisy client vote's result: its winner for every client, ε of the candidates and the
    vote composed by ``ledger``, the vote's own ε, noise and counts."""
    k, delta, accountant = base["candidates"], base["delta"], base["accountant"]
    total = ledger.epsilon()
    vote_eps = vote.epsilon(delta, accountant=accountant)
    return {
        **base,
        "method": "vote",
        "covered": True,
        "chosen": int(winner),
        "choices": np.full(n_clients, int(winner)),
        "epsilon": _finite_or_none(total),
        "candidates_epsilon": _finite_or_none(eps_c),
        "vote": {
            "noise_std": vote.noise_std,
            "noise_multiplier": vote.noise_multiplier,
            "epsilon": _finite_or_none(vote_eps),
            "share": share,
            "noisy_counts": [float(c) for c in noisy],
            "noise_source": vote_source,
        },
        "note": (
            f"{what} chosen by a noisy client vote over {k} candidate runs (vote σ="
            f"{vote.noise_std:.4g}, ε_vote={vote_eps:.3g} alone); ε covers training of all {k} "
            f"candidates and the vote, composed: {total:.4g}"
        ),
    }
