"""The plan of a run's end: the ``finetune="auto"`` candidates and their grids, the end-of-run
vote's constants and voters, and the resolution of the end-of-run options from public
parameters only (the method, the releases' noise and size, the clip). Nothing here reads a
client's data; :mod:`~privmtl.federated.end_of_run.finish` carries the plan out."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from privmtl._validation import check_choice, check_int
from privmtl.federated.algorithms import Params
from privmtl.federated.blocks import END_OF_RUN_BLOCK
from privmtl.federated.end_of_run.local import LOCAL_SOLVER_CHOICES, BlockSink
from privmtl.federated.models import MultinomialLogReg
from privmtl.privacy.release import billboard_carries_signal, billboard_noise_and_bound

__all__ = [
    "AUTO_CANDIDATES",
    "AUTO_CLEAR_SIGNAL",
    "AUTO_FINETUNE_EPOCHS",
    "AUTO_FINETUNE_LRS",
    "AUTO_FINETUNE_RIDGES",
    "AUTO_METHODS",
    "AUTO_NOTE",
    "AUTO_ORDERS",
    "AUTO_PARTIAL",
    "FINETUNE_NOTE",
    "FINETUNE_SELECTS",
    "FINETUNE_SELECT_CHOICES",
    "FINETUNE_VOTERS",
    "FINETUNE_VOTERS_STREAM",
    "FINETUNE_VOTE_ID",
    "FINETUNE_VOTE_NOTE",
    "FINETUNE_VOTE_SHARE",
    "FINETUNE_VOTE_STREAM",
    "AutoPlan",
    "BlockSink",
    "FinishOptions",
    "auto_info",
    "auto_plan",
    "resolve_finetune_select",
    "resolve_local_solver",
    "vote_candidates",
    "vote_voters",
]

AUTO_FINETUNE_EPOCHS = (10, 3)
"""``finetune="auto"``: epochs of fine-tuning the released billboard (with :data:`AUTO_FINETUNE_LRS`).

Every client, sampled or never sampled, chooses on its *own* validation split (most correct
predictions, :func:`~privmtl.federated.end_of_run.local.client_better`, ties going to the later candidate of
a public order; a client without validation data keeps the last) among its trained model (its
personalized model, or the billboard for methods without one), its own local training from the
initial model (:func:`~privmtl.federated.end_of_run.local.train_local`'s default grid, whose ties go to the
most training: what ``method="local-all"`` gives), and — only where the billboard carries signal:
the whole model is shared (``fedrep``: its representation, with the initial head) and the public
rule of :func:`~privmtl.privacy.release.billboard_carries_signal` holds for the ``T`` releases — the
billboard fine-tuned on its own data for each of these numbers of epochs and each step size of
:data:`AUTO_FINETUNE_LRS` (vanilla; ties go to the least fine-tuning, the closest to the billboard).
The order is public (:data:`AUTO_ORDERS`): the trained model first; then local training and the
fine-tuned billboard, the one preferred on ties last — the fine-tuned billboard where the noise of
the ``T`` releases is at most :data:`AUTO_CLEAR_SIGNAL` of the most their signal can add up to
(σ√(kT) ≤ 0.5·Tγ), else local training. Post-processing of the releases: the guarantee is
unchanged."""
AUTO_FINETUNE_LRS = (0.1, 0.01)
"""``finetune="auto"``: step sizes of fine-tuning the billboard (:data:`AUTO_FINETUNE_EPOCHS`)."""
AUTO_FINETUNE_RIDGES = (30.0,)
"""``finetune="auto"`` with ``local_solver="ridge"``: the prior strengths ``c`` around the billboard
of its fine-tuned candidate (:func:`~privmtl.federated.ridge.ridge_logreg`; the local candidate
uses :data:`~privmtl.federated.end_of_run.local.LOCAL_RIDGES` around the initial model)."""
AUTO_CANDIDATES = ("trained", "local", "billboard-finetune")
"""``finetune="auto"``: the candidates of every client's choice."""
AUTO_ORDERS = {
    "clear signal": ("trained", "local", "billboard-finetune"),
    "weak signal": ("trained", "billboard-finetune", "local"),
}
"""``finetune="auto"``: the public tie-break orders of :data:`AUTO_CANDIDATES` (ties go to the
later): with a clear signal in the billboard (:data:`AUTO_CLEAR_SIGNAL`) its fine-tuned copy is
preferred, with a weak one local training."""
AUTO_CLEAR_SIGNAL = 0.5
"""``finetune="auto"``: the billboard's signal is clear when the noise of its ``T`` releases,
σ√(kT), is at most this share of the most their clipped means can add up to, Tγ."""
AUTO_METHODS = ("pmtl", "fedavg", "fedprox", "fedrep")
"""Methods whose billboard is a model worth fine-tuning (``finetune="auto"``)."""
AUTO_PARTIAL = ("fedrep",)
"""Methods whose billboard is a part of the model by design (fedrep: the representation); its
fine-tuned candidate starts from the billboard with the initial head."""

FINETUNE_SELECTS = ("client", "vote")
"""``finetune="auto"``: how the final model is chosen: by every client on its own validation
split, or one candidate (:func:`vote_candidates`) for all by the clients' recorded noisy vote."""
FINETUNE_SELECT_CHOICES = ("auto", *FINETUNE_SELECTS)
"""The values a run takes for the end of run's selection (``finetune_select``): ``"auto"`` is
resolved once per run by :func:`resolve_finetune_select` (and the local solver with it, by
:func:`resolve_local_solver`)."""
FINETUNE_VOTE_SHARE = 0.05
"""``finetune_select="vote"``: the vote's share of the run's target ε (the vote alone is
(share·ε, δ)-DP; the rounds are calibrated so that rounds and vote compose to the target)."""
FINETUNE_VOTE_ID = "finetune-vote:0"
"""The ledger id of the end-of-run vote."""
FINETUNE_VOTE_STREAM = 5
"""The seeded-noise stream of the end-of-run vote (``noise_source="seeded"``: a simulation)."""
FINETUNE_VOTERS = 10_000
"""``finetune_select="vote"``: the expected number of voters. In a larger population of ``m``
clients each client votes independently with probability ``FINETUNE_VOTERS / m`` (Poisson
subsampling of the voters, :func:`vote_voters`) and the others compute the winner only; the vote's
plan is made for this many voters."""
FINETUNE_VOTERS_STREAM = 6
"""The seeded stream (with the run's seed) of the voters' coins under ``noise_source="seeded"``
(a simulation); secure runs draw them from OS entropy."""
FINETUNE_VOTE_NOTE = (
    "finetune=auto, select=vote: every client took the candidate elected by the clients' noisy "
    f"vote on their own validation splits (ledger id {FINETUNE_VOTE_ID}; its epsilon is composed "
    "into the reported epsilon)"
)
"""The note a result's guarantee carries after a held end-of-run vote."""

AUTO_NOTE = (
    "finetune=auto: every client chose its model on its own validation split "
    "(post-processing of the releases: no privacy cost)"
)
"""The note a result's guarantee carries after ``finetune="auto"``."""
FINETUNE_NOTE = "local fine-tuning is post-processing of the billboard: no privacy cost"
"""The ``finetune_note`` of a result after an explicit fine-tuning method."""

_AUTO_RULE = (
    "every client keeps, among its candidates, the one with the most correct "
    "predictions on its own validation split (ties, e.g. no validation data: the later in "
    "'order'); the billboard candidate exists where the whole model (fedrep: the "
    "representation, with the initial head) is shared and the noise "
    "of the T releases, sigma*sqrt(k*T), is at most T*clip, and it is preferred on ties "
    "(last) where that noise is at most half of T*clip (public parameters)"
)


@dataclass(frozen=True)
class AutoPlan:
    """The candidates of ``finetune="auto"``, decided from public parameters of the releases."""

    names: tuple[str, ...]
    signal: bool
    clear: bool
    noise_norm: float
    signal_bound: float | None
    clip: float | None


def auto_plan(
    method: str,
    shared_params: Sequence[str] | None,
    noise_std: float,
    clip: float | None,
    released_dim: int,
    rounds: int,
) -> AutoPlan:
    """Which candidates every client compares, in which public order (:data:`AUTO_ORDERS`).

    ``rounds`` is the number of releases made (the rounds run), ``released_dim`` the coordinates
    of one release, ``noise_std`` σ of the released mean and ``clip`` γ: public parameters only.
    """
    noise, bound = billboard_noise_and_bound(noise_std, clip, released_dim, rounds)
    signal = (
        method in AUTO_METHODS
        and (shared_params is None or method in AUTO_PARTIAL)
        and billboard_carries_signal(noise_std, clip, released_dim, releases=rounds)
    )
    clear = signal and bound is not None and noise <= AUTO_CLEAR_SIGNAL * bound
    order = AUTO_ORDERS["clear signal" if clear else "weak signal"]
    names = tuple(n for n in order if n != "billboard-finetune" or signal)
    return AutoPlan(names, bool(signal), bool(clear), noise, bound, clip)


def vote_candidates(plan: AutoPlan, local_solver: str = "sgd") -> tuple[str, ...]:
    """The public candidate list of ``select="vote"``: ``plan``'s candidates in its order, the
    fine-tuned billboard expanded into one candidate per point of its grid
    (``"billboard-finetune e10 lr0.1"``; ``local_solver="ridge"``: ``"billboard-finetune c30"``)."""
    names: list[str] = []
    for name in plan.names:
        if name != "billboard-finetune":
            names.append(name)
        elif local_solver == "ridge":
            names += [f"{name} c{c:g}" for c in AUTO_FINETUNE_RIDGES]
        else:
            names += [
                f"{name} e{e} lr{lr:g}" for e in AUTO_FINETUNE_EPOCHS for lr in AUTO_FINETUNE_LRS
            ]
    return tuple(names)


def resolve_finetune_select(
    select: str,
    model: nn.Module,
    *,
    finetune: str,
    samples: bool,
    noise_mechanism: str,
    epsilon: float | None,
) -> str:
    """The selection a run's end of run makes: ``"auto"`` becomes ``"vote"`` where a recorded
    vote over exact candidates can be planned — ``finetune="auto"`` of a multinomial logistic
    regression (whose candidates :func:`resolve_local_solver` solves exactly), a method that
    releases a billboard from sampled clients (``samples``), independent noise in every round
    and a target ``epsilon`` for the vote to take its share of — and ``"client"`` otherwise
    (the vote's plan may still decline to hold it, :func:`~privmtl.privacy.selection.plan_vote`:
    then every client chooses). Any other value is returned as given. Public parameters only."""
    check_choice("finetune_select", select, (*FINETUNE_SELECT_CHOICES, "pooled"))
    if select != "auto":
        return select
    votes = (
        finetune == "auto"
        and isinstance(model, MultinomialLogReg)
        and samples
        and noise_mechanism == "independent"
        and epsilon is not None
    )
    return "vote" if votes else "client"


def resolve_local_solver(
    solver: str, model: nn.Module, *, vote_held: bool, patience: int | None = None
) -> str:
    """How the end of run's local trainings are solved: ``"auto"`` becomes ``"ridge"`` for a
    multinomial logistic regression whose end of run is a held vote — the vote elects one
    candidate for all, and the ridge solves give one candidate per kind (local training, the
    fine-tuned billboard) where the SGD grids give several whose supporters split — ``"sgd"``
    for another logistic regression (the grids every client chooses from on its own validation
    split), and ``"adam"`` for a network, i.e. any other model (Adam's grid,
    :data:`~privmtl.federated.end_of_run.local.ADAM_EPOCHS`, trains a network from its initial model in a
    tenth of the SGD grid's epochs, with the same accuracy on FEMNIST's writers:
    ``benchmarks/results/end_of_run_cnn.md``), unless ``patience`` is given (early stopping
    stops the SGD grid). Any other value is returned as given."""
    check_choice("local_solver", solver, LOCAL_SOLVER_CHOICES)
    if solver != "auto":
        return solver
    if isinstance(model, MultinomialLogReg):
        return "ridge" if vote_held else "sgd"
    return "sgd" if patience is not None else "adam"


def vote_voters(m: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """The sorted positions of the clients that vote among ``m`` (``select="vote"``): all of them
    up to :data:`FINETUNE_VOTERS`; above, each client independently with probability
    ``FINETUNE_VOTERS / m``, a coin per client from ``rng`` (default: OS entropy).

    The coins depend on nothing but ``rng`` (not on any client's data), and a client's coin on
    no other client: adding or removing one client changes the voters by that client alone, so
    the vote's histogram moves by at most that client's vote whichever clients vote (no
    amplification by this subsampling is claimed). With secret coins (secure noise) nobody can
    tell who voted.
    """
    m = check_int("m", m, low=1)
    if m <= FINETUNE_VOTERS:
        return np.arange(m)
    rng = rng if rng is not None else np.random.default_rng(secrets.randbits(128))
    return np.flatnonzero(rng.random(m) < FINETUNE_VOTERS / m)


_VOTE_RULE = (
    "one candidate for every client: each client shares its vote equally among the candidates "
    "(the trained model, local training, the billboard fine-tuned at each grid point) with the "
    "most correct predictions on its own validation split (no validation data: it abstains); "
    "the vote histogram gets Gaussian noise, is recorded in the ledger, and its argmax wins"
)


def auto_info(
    plan: AutoPlan,
    counts: Sequence[int],
    grids: dict[str, Any],
    solver: str = "sgd",
    vote: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The public description of a ``finetune="auto"`` finish (``finetune_auto`` of a result):
    the rule, the order, how many clients chose each candidate, the grids, the ``solver`` of the
    local trainings (:func:`finish_clients`' ``local_solver``) and the signal test; ``vote``: the
    end-of-run vote's record (``select`` is ``"vote"`` when it was held)."""
    held = vote is not None and vote.get("held", False)
    return {
        "select": "vote" if held else "client",
        "rule": _VOTE_RULE if held else _AUTO_RULE,
        **({} if vote is None else {"vote": vote}),
        "order": list(plan.names),
        "clear_signal": plan.clear,
        "clients_per_candidate": {name: int(counts[i]) for i, name in enumerate(plan.names)},
        **grids,
        "solver": solver,
        "signal": plan.signal,
        "noise_norm": plan.noise_norm,
        "signal_bound": plan.signal_bound,
        "clip": plan.clip,
    }


@dataclass(frozen=True)
class FinishOptions:
    """How every client ends the run: the settings of :func:`~privmtl.federated.end_of_run.finish.finish_pass`, and the keywords of
    :func:`~privmtl.federated.end_of_run.finish.finish_clients` (each keyword is the field of its
    name).

    Attributes
    ----------
    finetune : {"none", "auto", "vanilla", "mr", "skl", "ewc"}
        The end of run (module docstring).
    batch_size, seed, lr, lam
        Minibatch size, seed, step size and penalty weight of fine-tuning (``"auto"``'s grids
        are :data:`AUTO_FINETUNE_EPOCHS` and :data:`AUTO_FINETUNE_LRS`).
    start : {"personalized", "global"}
        Where an explicit fine-tuning method starts: the trained models or the billboard.
    epochs : int, default 1
        Epochs of an explicit fine-tuning method.
    plan : AutoPlan
        ``"auto"`` only: its candidates (:func:`auto_plan`).
    client_index : sequence of int, optional
        The clients' indices in the whole population (they seed the minibatches; default: their
        positions in the dataset).
    block : int, default :data:`~privmtl.federated.blocks.END_OF_RUN_BLOCK`
        The most clients finished at once.
    progress : bool, default False
        ``"auto"`` only: report the local trainings of its candidates, client by client (a
        :class:`~privmtl._progress.Progress`: a bar on a terminal, plain lines elsewhere).
    device : str, default "cpu"
        Where the clients fine-tune and are scored (``"auto"``'s grids:
        :func:`~privmtl.federated.end_of_run.local.train_local`; the explicit methods:
        :func:`~privmtl.federated.end_of_run.finetune.finetune`); the final models are CPU
        tensors. On the CPU the clients are finished with one torch thread
        (:func:`~privmtl._device.one_thread_per_worker`).
    score : dict of str to (params, personalized), optional
        Also score, on the validation and test splits, the final models (``"final"``) and these
        models (stacked ``(m, ...)`` when personalized, or a
        :class:`~privmtl.federated.client_models.ClientModels` read by rows), block by block
        while each block's data are at hand (:class:`~privmtl.federated.scoring.BlockScores`):
        the scores are :func:`~privmtl.federated.scoring.evaluate`'s, in
        :attr:`~privmtl.federated.end_of_run.finish.ClientFinish.scores`.
    workers : int, default 1
        Blocks computed at once on the CPU (worker processes or threads, one torch thread each:
        :func:`~privmtl.federated.blocks.concurrent_blocks`); the results do not depend on it.
    local_solver : {"sgd", "ridge"}, default "sgd"
        ``"auto"`` only: how its local training and billboard fine-tuning are solved
        (:func:`~privmtl.federated.end_of_run.local.train_local`'s ``solver``): the SGD grids
        (:data:`~privmtl.federated.end_of_run.local.LOCAL_EPOCHS`,
        :data:`AUTO_FINETUNE_EPOCHS`), or, for logistic regression, the batched ridge solves
        around the initial model (:data:`~privmtl.federated.end_of_run.local.LOCAL_RIDGES`) and
        around the billboard (:data:`AUTO_FINETUNE_RIDGES`).
    local_patience : int, optional
        ``"auto"`` with ``local_solver="sgd"`` only: every SGD run of the local and billboard
        candidates stops once its count of correct predictions on the client's own validation
        split has not improved for this many epochs
        (:func:`~privmtl.federated.end_of_run.local.train_local`'s ``patience``; None: all
        epochs).
    select : {"client", "vote"}, default "client"
        ``"auto"`` only: every client's own choice, or one candidate for all by a vote. With
        ``"vote"`` every client first scores every candidate of :func:`vote_candidates` on its
        own validation split and shares its vote among the best
        (:func:`~privmtl.privacy.selection.client_vote_shares`); ``vote`` is then called once
        with the shares ``(k, K)`` of all clients and the candidates' names, and returns the
        winner's index (the caller releases the noisy histogram and records it before it returns:
        no final model exists before); every client then takes the winner. The clients must be
        the whole population; above :data:`FINETUNE_VOTERS` clients only the subsample
        :func:`vote_voters` votes (the others' shares are zero: they abstain) and the others
        compute the winner only.
    vote : callable, optional
        ``select="vote"``: the vote (above).
    voter_rng : numpy.random.Generator, optional
        ``select="vote"`` above :data:`FINETUNE_VOTERS` clients: the voters' coins
        (:func:`vote_voters`; default OS entropy).
    voters : array of int, optional
        ``select="vote"``: the positions of the clients of the dataset that vote, instead of
        :func:`vote_voters` over them (a part of a population whose voters were drawn over the
        whole population: a Flower node's clients).
    winner : str, optional
        ``select="vote"``: the vote's winner, known already (elected over several parts of the
        population: a Flower node's clients finish with the winner the server announced); the
        shares are then not computed and ``vote`` not called.
    grid : (lrs, lams), optional
        An explicit fine-tuning method only: instead of ``lr`` and ``lam``, every client keeps
        the point of this grid that validates best on its own split
        (:func:`~privmtl.federated.end_of_run.finetune_selection.finetune_select`, run on each
        block's clients); :attr:`~privmtl.federated.end_of_run.finish.ClientFinish.choice` is
        every client's index in
        :func:`~privmtl.federated.end_of_run.finetune_selection.selection_grid`.
    """

    finetune: str
    batch_size: int
    seed: int
    lr: float
    lam: float
    start: str = "personalized"
    epochs: int = 1
    plan: AutoPlan | None = None
    client_index: Sequence[int] | None = None
    block: int = END_OF_RUN_BLOCK
    progress: bool = False
    device: str = "cpu"
    score: Mapping[str, tuple[Params, bool]] | None = None
    workers: int = 1
    local_solver: str = "sgd"
    local_patience: int | None = None
    select: str = "client"
    vote: Callable[[np.ndarray, tuple[str, ...]], int] | None = None
    voter_rng: np.random.Generator | None = None
    voters: np.ndarray | None = None
    winner: str | None = None
    grid: tuple[Sequence[float], Sequence[float]] | None = None
