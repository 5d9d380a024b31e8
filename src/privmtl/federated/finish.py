r"""Each client's end of a run: the per-client post-processing of the recorded releases.

After the last round every client holds its trained model (its personalized model, or the
billboard for methods without one) and the released billboard. :func:`finish_clients` computes
what each client keeps, from these, its own data and public parameters of the releases only:

``finetune="none"``
    the trained model;
``finetune="vanilla" | "mr" | "skl" | "ewc"``
    the trained model fine-tuned on the client's own data
    (:func:`~privmtl.federated.finetune.finetune`, one epoch at the training step size);
``finetune="auto"``
    the client's own choice on its own validation split (:func:`auto_plan`,
    :data:`AUTO_FINETUNE_EPOCHS`) among its trained model, its own local training from the initial
    model and, where the billboard carries signal, the billboard fine-tuned on its data;
``finetune="auto", select="vote"``
    one candidate for every client, elected by a recorded noisy vote (:func:`vote_candidates`):
    every client shares its vote among the candidates that validate best on its own split
    (:func:`~privmtl.privacy.selection.client_vote_shares`), the caller's ``vote`` releases the
    noisy histogram (write-ahead in the run's ledger) and every client then takes the winner.
    The one choice made from other clients' data, through a recorded release.

It takes any subset of the population (``client_index``: the clients' indices in the whole), and
a client's outcome depends on nothing but its own data, its own trained model, the billboard and
the public parameters: computed for the whole population at once (``privmtl pmtl``,
:func:`~privmtl.experiments.pmtl.run_pmtl`) or by each Flower node for its own clients, every
client ends with the same model (``select="vote"``: given the vote's winner). Post-processing of
the releases (and, with ``select="vote"``, of the recorded vote).
"""

from __future__ import annotations

import copy
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from privmtl._device import one_thread_per_worker
from privmtl._progress import Progress
from privmtl._validation import check_choice, check_int
from privmtl.data.federated import FederatedDataset
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import BlockScores, Params, block_rows
from privmtl.federated.blocks import END_OF_RUN_BLOCK, client_blocks, concurrent_blocks
from privmtl.federated.finetune import FINETUNE_METHODS as _FINETUNE_RULES
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
    "FINAL_MODEL_WORDS",
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
    "ClientFinish",
    "auto_info",
    "auto_plan",
    "describe_final_models",
    "final_model_counts",
    "final_models_keys",
    "finish_clients",
    "resolve_finetune_select",
    "resolve_local_solver",
    "stack_trained",
    "vote_candidates",
    "vote_voters",
]

AUTO_FINETUNE_EPOCHS = (10, 3)
"""``finetune="auto"``: epochs of fine-tuning the released billboard (with :data:`AUTO_FINETUNE_LRS`).

Every client, sampled or never sampled, chooses on its *own* validation split (most correct
predictions, :func:`~privmtl.federated.local.client_better`, ties going to the later candidate of
a public order; a client without validation data keeps the last) among its trained model (its
personalized model, or the billboard for methods without one), its own local training from the
initial model (:func:`~privmtl.federated.local.train_local`'s default grid, whose ties go to the
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
uses :data:`~privmtl.federated.local.LOCAL_RIDGES` around the initial model)."""
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
    from privmtl.federated.models import MultinomialLogReg

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
    :data:`~privmtl.federated.local.ADAM_EPOCHS`, trains a network from its initial model in a
    tenth of the SGD grid's epochs, with the same accuracy on FEMNIST's writers:
    ``benchmarks/results/end_of_run_cnn.md``), unless ``patience`` is given (early stopping
    stops the SGD grid). Any other value is returned as given."""
    from privmtl.federated.local import LOCAL_SOLVER_CHOICES
    from privmtl.federated.models import MultinomialLogReg

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


def _point(name: str) -> dict[str, Any]:
    """The grid of one :func:`vote_candidates` name of the fine-tuned billboard (``{}``: its whole
    grid, :func:`finish_clients`' per-client candidate)."""
    parts = name.split()[1:]
    if not parts:
        return {}
    if parts[0].startswith("c"):
        return {"ridges": (float(parts[0][1:]),)}
    return {"epochs": (int(parts[0][1:]),), "lrs": (float(parts[1][2:]),)}


@dataclass
class ClientFinish:
    """What :func:`finish_clients` gives: every client's final model and how it was chosen.

    ``params`` are stacked ``(k, ...)`` in the order of the clients; ``choice`` is the index in
    ``plan.names`` of every client's choice (``finetune="auto"``; else None); ``grids`` the
    public grids of the candidates (``local_grid``, ``billboard_grid``); ``scores``, when asked
    for, ``{split: {name: evaluate(...)}}`` of the final models (``"final"``) and the other models
    given, and ``score_seconds`` the wall time spent scoring (blocks computed at once: the
    scoring's share of their wall time); ``winner`` the candidate every client
    took and ``voters`` how many clients voted (``select="vote"``, :func:`vote_candidates`,
    :func:`vote_voters`). ``per_client``, when scores were asked for: every client's correct test
    predictions and test examples of its final model (``"final"``) and, where every client
    computed it (``select="client"``), of its ``"local"`` candidate (scored, then dropped).
    """

    params: Params
    choice: np.ndarray | None = None
    plan: AutoPlan | None = None
    grids: dict[str, list[list[float]]] = field(default_factory=dict)
    scores: dict[str, dict[str, dict[str, float]]] | None = None
    score_seconds: float = 0.0
    winner: str | None = None
    voters: int | None = None
    local: Params | None = None
    per_client: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


def finish_clients(
    finetune: str,
    dataset: FederatedDataset,
    model: nn.Module,
    trained: Params,
    billboard: Params,
    *,
    batch_size: int,
    seed: int,
    lr: float,
    lam: float,
    start: str = "personalized",
    epochs: int = 1,
    plan: AutoPlan | None = None,
    client_index: Sequence[int] | None = None,
    block: int = END_OF_RUN_BLOCK,
    progress: bool = False,
    device: str = "cpu",
    score: Mapping[str, tuple[Params, bool]] | None = None,
    workers: int = 1,
    local_solver: str = "sgd",
    local_patience: int | None = None,
    select: str = "client",
    vote: Callable[[np.ndarray, tuple[str, ...]], int] | None = None,
    voter_rng: np.random.Generator | None = None,
    voters: np.ndarray | None = None,
    winner: str | None = None,
) -> ClientFinish:
    """Every client's final model (module docstring), for the clients of ``dataset``.

    The clients are finished in blocks of at most ``block`` (:mod:`~privmtl.federated.blocks`):
    the candidates and minibatch plans of one block are held at a time, and a client's final
    model does not depend on the block it is computed in.

    Parameters
    ----------
    finetune : {"none", "auto", "vanilla", "mr", "skl", "ewc"}
    dataset : FederatedDataset
        The clients' own data (all of the population, or a part of it).
    model : nn.Module
        Architecture and initial parameters (the start of ``"auto"``'s local training).
    trained : dict of str to Tensor
        The clients' trained models, stacked ``(k, ...)`` (for a method without personalized
        models: the billboard, stacked).
    billboard : dict of str to Tensor
        The released global model (the whole model: with partial sharing its personal layers
        are the initial ones).
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
        positions in ``dataset``).
    block : int, default :data:`~privmtl.federated.blocks.END_OF_RUN_BLOCK`
        The most clients finished at once.
    progress : bool, default False
        ``"auto"`` only: report the local trainings of its candidates, client by client (a
        :class:`~privmtl._progress.Progress`: a bar on a terminal, plain lines elsewhere).
    device : str, default "cpu"
        Where the clients fine-tune and are scored (``"auto"``'s grids:
        :func:`~privmtl.federated.local.train_local`; the explicit methods:
        :func:`~privmtl.federated.finetune.finetune`); the final models are CPU tensors. On the
        CPU the clients are finished with one torch thread
        (:func:`~privmtl._device.one_thread_per_worker`).
    score : dict of str to (params, personalized), optional
        Also score, on the validation and test splits, the final models (``"final"``) and these
        models (stacked ``(m, ...)`` when personalized), block by block while each block's data
        are at hand (:class:`~privmtl.federated.algorithms.BlockScores`): the scores are
        :func:`~privmtl.federated.algorithms.evaluate`'s, in :attr:`ClientFinish.scores`.
    workers : int, default 1
        Blocks computed at once on the CPU (threads, one torch thread each:
        :func:`~privmtl.federated.blocks.concurrent_blocks`); the results do not depend on it.
    local_solver : {"sgd", "ridge"}, default "sgd"
        ``"auto"`` only: how its local training and billboard fine-tuning are solved
        (:func:`~privmtl.federated.local.train_local`'s ``solver``): the SGD grids
        (:data:`~privmtl.federated.local.LOCAL_EPOCHS`, :data:`AUTO_FINETUNE_EPOCHS`), or, for
        logistic regression, the batched ridge solves around the initial model
        (:data:`~privmtl.federated.local.LOCAL_RIDGES`) and around the billboard
        (:data:`AUTO_FINETUNE_RIDGES`).
    local_patience : int, optional
        ``"auto"`` with ``local_solver="sgd"`` only: every SGD run of the local and billboard
        candidates stops once its count of correct predictions on the client's own validation
        split has not improved for this many epochs (:func:`~privmtl.federated.local.train_local`'s
        ``patience``; None: all epochs).
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
        ``select="vote"``: the positions of the clients of ``dataset`` that vote, instead of
        :func:`vote_voters` over them (a part of a population whose voters were drawn over the
        whole population: a Flower node's clients).
    winner : str, optional
        ``select="vote"``: the vote's winner, known already (elected over several parts of the
        population: a Flower node's clients finish with the winner the server announced); the
        shares are then not computed and ``vote`` not called.
    """
    from privmtl.federated.local import LOCAL_SOLVERS

    check_choice("finetune", finetune, ("none", "auto", *_FINETUNE_RULES))
    check_choice("local_solver", local_solver, LOCAL_SOLVERS)
    block = check_int("block", block, low=1)
    if finetune == "none" and score is None:
        return ClientFinish({n: p.clone() for n, p in trained.items()})
    check_choice("select", select, FINETUNE_SELECTS)
    if finetune == "auto" and plan is None:
        raise InvalidParameterError("finish_clients(finetune='auto') needs its 'plan' (auto_plan).")
    if select == "vote" and (finetune != "auto" or (vote is None and winner is None)):
        raise InvalidParameterError(
            "finish_clients(select='vote') needs finetune='auto' and its 'vote'; got "
            f"finetune={finetune!r}, vote={vote!r}."
        )
    m = dataset.n_clients
    # one step per client and trained candidate: the local trainings are the end's long part
    trains = [n for n in plan.names if n != "trained"] if plan is not None else []
    names: tuple[str, ...] = ()
    if select == "vote":
        assert plan is not None
        names = vote_candidates(plan, local_solver)
        trains = [n for n in names if n != "trained"] + ["winner"]
    if select != "vote":
        voters = np.arange(m)
    elif voters is None:
        voters = vote_voters(m, voter_rng)
    bar = Progress(
        total=(len(trains) - (select == "vote")) * len(voters) + (select == "vote") * m,
        desc="end of run",
        enabled=progress and finetune == "auto",
        unit="client",
    )
    kw: dict[str, Any] = {
        "batch_size": batch_size, "seed": seed, "lr": lr, "lam": lam, "start": start,
        "epochs": epochs, "plan": plan, "bar": bar, "device": device,
        "local_solver": local_solver, "local_patience": local_patience,
    }  # fmt: skip
    book = None
    if score is not None:
        buffers = {n: b.detach() for n, b in model.named_buffers()}
        book = _Book(BlockScores(model, buffers, ("val", "test")), dict(score))
    winner = winner if select == "vote" else None
    n_workers = check_int("workers", workers, low=1) if device == "cpu" else 1
    try:
        with one_thread_per_worker():
            if select == "vote" and winner is not None:
                kw["only"] = winner
            elif select == "vote":
                assert vote is not None
                shares = _vote_shares(
                    dataset, model, trained, billboard, client_index, block, names, kw, voters,
                    n_workers,
                )  # fmt: skip
                winner = names[int(vote(shares, names))]  # recorded by the caller: then the models
                kw["only"] = winner
            t0 = time.perf_counter()
            fin = _finish_all(
                finetune, dataset, model, trained, billboard, client_index, block, kw, book,
                n_workers,
            )  # fmt: skip
            blocks_wall = time.perf_counter() - t0
    finally:
        bar.close()
    fin.winner = winner
    fin.voters = len(voters) if select == "vote" else None
    if book is not None:
        fin.scores, fin.score_seconds = book.scores.summary(), book.wall_seconds(blocks_wall)
        fin.per_client = {
            name: book.scores.per_client("test", name)
            for name in ("final", "local")
            if name in fin.scores["test"]
        }
    fin.local = None
    return fin


@dataclass
class _Book:
    """The scores :func:`finish_clients` keeps block by block, and the time they took: the
    blocks' scoring ``seconds`` and whole ``block_seconds``, each summed over the blocks (over
    the threads that computed them)."""

    scores: BlockScores
    others: dict[str, tuple[Params, bool]]
    seconds: float = 0.0
    block_seconds: float = 0.0

    def wall_seconds(self, wall: float) -> float:
        """The scoring's share of ``wall``, the wall time of the blocks: with blocks computed
        at once in several threads the summed seconds exceed the wall time they took, so the
        scoring gets its fraction of the blocks' summed time."""
        if self.block_seconds <= 0.0:
            return self.seconds
        return self.seconds * min(1.0, wall / self.block_seconds)

    def score(
        self,
        final: Params,
        piece: FederatedDataset,
        pos: np.ndarray | None,
        model: nn.Module | None = None,
        local: Params | None = None,
    ) -> _Scored:
        """The scores of one block's final and other models (``pos``: the block's positions,
        None for the whole population; ``model``: the thread's copy of the architecture;
        ``local``: the block's local candidates, where computed), and the seconds they took."""
        t0 = time.perf_counter()
        out = self.scores.score("final", final, True, piece, model)
        if local is not None:
            out += self.scores.score("local", local, True, piece, model)
        for name, (params, personal) in self.others.items():
            own = block_rows(params, pos) if personal and pos is not None else params
            out += self.scores.score(name, own, personal, piece, model)
        return out, time.perf_counter() - t0

    def keep(self, scored: _Scored, block_seconds: float | None = None) -> None:
        """Keep one block's scores, after the blocks before it (``block_seconds``: the whole
        block's time, its scoring included; default the scoring's)."""
        self.scores.keep(scored[0])
        self.seconds += scored[1]
        self.block_seconds += scored[1] if block_seconds is None else block_seconds


_Scored = tuple[list[tuple[str, str, tuple[np.ndarray, np.ndarray, float]]], float]


def _finish_all(
    finetune: str,
    dataset: FederatedDataset,
    model: nn.Module,
    trained: Params,
    billboard: Params,
    client_index: Sequence[int] | None,
    block: int,
    kw: dict[str, Any],
    book: _Book | None = None,
    workers: int = 1,
) -> ClientFinish:
    """:func:`finish_clients`'s blocks (each scored into ``book``), ``workers`` at a time."""
    from privmtl.federated.finetune import check_client_index

    m = dataset.n_clients
    if m <= block:  # one block: a network's grids use the workers inside it
        fin = _finish_block(
            finetune, dataset, model, trained, billboard, client_index, **kw, workers=workers
        )
        if book is not None:
            book.keep(book.score(fin.params, dataset, None, local=fin.local))
        fin.local = None
        return fin
    index = check_client_index(client_index, m)  # one block at a time, population indices
    own_model = _model_per_thread(model)

    def one(pos: np.ndarray) -> tuple[ClientFinish, _Scored | None, float, _Tally]:
        t0 = time.perf_counter()
        net = own_model()
        part = dataset.subset(pos.tolist())
        tally = _Tally()
        piece = _finish_block(
            finetune, part, net, block_rows(trained, pos), billboard, index[pos].tolist(),
            **{**kw, "bar": tally},
        )  # fmt: skip
        scored = None if book is None else book.score(piece.params, part, pos, net, piece.local)
        piece.local = None  # scored: not carried back
        return piece, scored, time.perf_counter() - t0, tally

    blocks = list(client_blocks(m, block))
    params: Params = {}
    choices: list[np.ndarray] = []
    piece = ClientFinish({})
    with concurrent_blocks(workers, len(blocks)) as run:
        for pos, (piece, scored, seconds, tally) in zip(blocks, run(one, blocks), strict=True):
            kw["bar"].update(tally.n, **tally.postfix)
            if book is not None and scored is not None:
                book.keep(scored, seconds)  # in the blocks' order, whatever finished first
            if not params:
                params = {n: p.new_empty((m, *p.shape[1:])) for n, p in piece.params.items()}
            rows = torch.from_numpy(pos)
            for n, p in piece.params.items():
                params[n][rows] = p
            if piece.choice is not None:
                choices.append(piece.choice)
    choice = np.concatenate(choices) if choices else None
    return ClientFinish(params, choice, piece.plan, piece.grids)


def _finish_block(
    finetune: str,
    dataset: FederatedDataset,
    model: nn.Module,
    trained: Params,
    billboard: Params,
    client_index: Sequence[int] | None,
    *,
    batch_size: int,
    seed: int,
    lr: float,
    lam: float,
    start: str,
    epochs: int,
    plan: AutoPlan | None,
    bar: Progress | _Tally,
    device: str,
    local_solver: str,
    local_patience: int | None,
    only: str | None = None,
    workers: int = 1,
) -> ClientFinish:
    """:func:`finish_clients` of the clients of ``dataset`` at once (one block); ``only``: every
    client takes this candidate of :func:`vote_candidates` (the vote's winner); ``workers``: the
    threads of a network's grids (:func:`~privmtl.federated.local.train_local`)."""
    from privmtl.federated.finetune import finetune as finetune_models
    from privmtl.federated.local import select_per_client

    if finetune == "none":
        return ClientFinish({n: p.clone() for n, p in trained.items()})
    if finetune != "auto":
        params, _ = finetune_models(
            trained, dataset, model, method=finetune, start=start, epochs=epochs, lr=lr,
            batch_size=batch_size, lam=lam, seed=seed, global_params=billboard,
            client_index=client_index, device=device,
        )  # fmt: skip
        return ClientFinish(params)
    assert plan is not None
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    grids: dict[str, list[list[float]]] = {}
    cand = _Candidates(
        dataset, model, trained, billboard, client_index, batch_size, seed, bar, device,
        local_solver, local_patience, grids, workers,
    )  # fmt: skip
    if only is not None:  # the vote's winner, for every client
        kind = only.split()[0]
        choice = np.full(dataset.n_clients, plan.names.index(kind), dtype=np.int64)
        params = cand(only)
        return ClientFinish({n: p.clone() for n, p in params.items()}, choice, plan, grids)

    kept: dict[str, Params] = {}

    def candidates() -> Iterator[Params]:  # generated one at a time, in the public order
        for name in plan.names:
            params = cand(name)
            if name == "local":  # the client's training alone: its baseline, scored later
                kept[name] = params
            yield params

    val_x, val_y = dataset.split("val")
    chosen, choice, _ = select_per_client(candidates(), model, buffers, val_x, val_y)
    return ClientFinish(chosen, choice, plan, grids, local=kept.get("local"))


@dataclass
class _Candidates:
    """The candidates of ``finetune="auto"`` for the clients of one block, by name: ``"trained"``,
    ``"local"`` (the client's own choice on local-all's grid), ``"billboard-finetune"`` (the
    client's own choice on the billboard's grid) or one point of that grid
    (:func:`vote_candidates`)."""

    dataset: FederatedDataset
    model: nn.Module
    trained: Params
    billboard: Params
    client_index: Sequence[int] | None
    batch_size: int
    seed: int
    bar: Progress | _Tally
    device: str
    local_solver: str
    local_patience: int | None
    grids: dict[str, list[list[float]]]
    workers: int = 1

    def __call__(self, name: str) -> Params:
        from privmtl.federated.local import train_local

        if name == "trained":
            return self.trained
        kw: dict[str, Any] = {
            "batch_size": self.batch_size,
            "seed": self.seed,
            "select": "client",
            "client_index": self.client_index,
            "device": self.device,
            "solver": self.local_solver,
            "patience": self.local_patience,
            "workers": self.workers,
            "scores": False,  # the candidates' models only: the choice scores them
            "on_clients": lambda k: self.bar.update(k, candidate=name),
        }
        if name == "local":
            alone = train_local(self.dataset, self.model, **kw)
            self.grids["local_grid"] = alone.extra["local_selection"]["grid"]
            assert alone.personalized_params is not None
            return alone.personalized_params
        begin = copy.deepcopy(self.model)
        begin.load_state_dict({**begin.state_dict(), **self.billboard})
        grid: dict[str, Any] = {
            "epochs": AUTO_FINETUNE_EPOCHS, "lrs": AUTO_FINETUNE_LRS, "ridges": AUTO_FINETUNE_RIDGES,
        }  # fmt: skip
        point = _point(name)
        # fine-tuning a trained billboard takes SGD's small steps (Adam's grid trains from scratch)
        if kw["solver"] == "adam":
            kw["solver"] = "sgd"
        tuned = train_local(self.dataset, begin, **{**grid, **point}, **kw)
        self.grids["billboard_grid"] = (
            [list(g) for g in _grid_of(grid, kw["solver"])]  # the whole public grid
            if point
            else tuned.extra["local_selection"]["grid"]
        )
        assert tuned.personalized_params is not None
        return tuned.personalized_params


def _grid_of(grid: dict[str, Any], solver: str) -> list[tuple[float, ...]]:
    if solver == "ridge":
        return [(float(c),) for c in grid["ridges"]]
    return [(e, lr) for e in grid["epochs"] for lr in grid["lrs"]]


def _vote_shares(
    dataset: FederatedDataset,
    model: nn.Module,
    trained: Params,
    billboard: Params,
    client_index: Sequence[int] | None,
    block: int,
    names: tuple[str, ...],
    kw: dict[str, Any],
    voters: np.ndarray,
    workers: int = 1,
) -> np.ndarray:
    """Every client's shares of its vote among ``names`` (:func:`vote_candidates`), from its own
    validation split: correct predictions of each candidate, a client without validation data
    (or with a diverged candidate only) abstaining; a block of the ``voters`` (positions) at a
    time, ``workers`` blocks at once, every other client abstaining."""
    from privmtl.federated.algorithms import client_scores
    from privmtl.federated.finetune import check_client_index
    from privmtl.privacy.selection import client_vote_shares

    m = dataset.n_clients
    index = check_client_index(client_index, m)
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    own_model = _model_per_thread(model)

    def shares_of(pos: np.ndarray) -> tuple[np.ndarray, _Tally]:
        net = own_model()
        part = dataset if len(pos) == m else dataset.subset(pos.tolist())
        sub = trained if len(pos) == m else block_rows(trained, pos)
        tally = _Tally()
        cand = _Candidates(
            part, net, sub, billboard, index[pos].tolist(), kw["batch_size"], kw["seed"],
            tally, kw["device"], kw["local_solver"], kw["local_patience"], {},
        )  # fmt: skip
        val_x, val_y = part.split("val")
        has = np.array([len(y) > 0 for y in val_y])
        scores = np.empty((len(pos), len(names)))
        for j, name in enumerate(names):
            correct, loss = client_scores(net, cand(name), buffers, val_x, val_y)
            scores[:, j] = np.where(has & np.isfinite(loss), correct, np.nan)
        return client_vote_shares(scores), tally

    out = np.zeros((m, len(names)))
    blocks = [voters[at] for at in client_blocks(len(voters), block)]
    with concurrent_blocks(workers, len(blocks)) as run:
        for pos, (shares, tally) in zip(blocks, run(shares_of, blocks), strict=True):
            kw["bar"].update(tally.n, **tally.postfix)
            out[pos] = shares
    return out


class _Tally:
    """The progress steps of one block, handed to the run's bar by whoever consumes the block
    (the block may run in another process, whose copy of the bar is not the one shown)."""

    def __init__(self) -> None:
        self.n = 0
        self.postfix: dict[str, Any] = {}

    def update(self, n: int = 1, **postfix: Any) -> None:
        self.n += n
        self.postfix = postfix


def _model_per_thread(model: nn.Module) -> Callable[[], nn.Module]:
    """``model`` in the calling thread, a copy of it in every other thread (computing swaps a
    module's parameters: one module per thread)."""
    local = threading.local()

    def own() -> nn.Module:
        net = getattr(local, "net", None)
        if net is None:
            main = threading.current_thread() is threading.main_thread()
            local.net = net = model if main else copy.deepcopy(model)
        return net

    return own


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


def stack_trained(trained: Params | None, billboard: Params, m: int) -> Params:
    """The trained models of ``m`` clients: the personalized ones, or the billboard stacked."""
    if trained is not None:
        return trained
    return {n: p.unsqueeze(0).expand((m, *p.shape)) for n, p in billboard.items()}


FINAL_MODEL_WORDS = {
    "trained": "kept the trained {kind} model",
    "local": "trained locally from scratch",
    "billboard-finetune": "fine-tuned the released global model on their own data",
    "finetuned": "fine-tuned the trained {kind} model on their own data",
}
"""What a client did at the end of the run, in words, for each key of
:func:`final_model_counts` (``{kind}``: "personalized" or "global", the trained model's kind)."""


def final_model_counts(
    finetune: str,
    n_clients: int,
    *,
    auto_counts: dict[str, int] | None = None,
    from_billboard: bool = False,
) -> dict[str, int]:
    """How many clients ended the run with each kind of model (keys of :data:`FINAL_MODEL_WORDS`).

    ``finetune="none"``: every client keeps its trained model; ``"auto"``: the clients' own
    choices (``auto_counts``, :func:`auto_info`'s ``clients_per_candidate``); an explicit
    fine-tuning method: every client fine-tuned its trained model, or the released global model
    (``from_billboard``). A histogram of the clients' own choices: a summary of the population,
    no client's output.
    """
    if finetune == "none":
        return {"trained": int(n_clients)}
    if finetune == "auto":
        if auto_counts is None:
            raise InvalidParameterError("final_model_counts(finetune='auto') needs 'auto_counts'.")
        return {name: int(c) for name, c in auto_counts.items()}
    return {"billboard-finetune" if from_billboard else "finetuned": int(n_clients)}


def describe_final_models(counts: dict[str, int], *, personalized: bool) -> str:
    """:func:`final_model_counts` in words, e.g. "0 of 20 clients kept the trained personalized
    model, 20 trained locally from scratch" (``personalized``: the method trains personalized
    models; else the trained model is the global one)."""
    kind = "personalized" if personalized else "global"
    total = sum(counts.values())
    parts = []
    for i, (name, count) in enumerate(counts.items()):
        words = FINAL_MODEL_WORDS[name].format(kind=kind)
        parts.append(f"{count} of {total} clients {words}" if i == 0 else f"{count} {words}")
    return ", ".join(parts)


def final_models_keys(
    finetune: str,
    n_clients: int,
    *,
    auto: dict[str, Any] | None,
    from_billboard: bool,
    personalized: bool,
) -> dict[str, Any]:
    """The result keys saying which model every client ended the run with:
    ``clients_per_final_model`` (:func:`final_model_counts`) and ``end_of_run`` (the same in
    words, :func:`describe_final_models`). ``auto`` is the result's ``finetune_auto``."""
    counts = final_model_counts(
        finetune,
        n_clients,
        auto_counts=None if auto is None else auto["clients_per_candidate"],
        from_billboard=from_billboard,
    )
    return {
        "clients_per_final_model": counts,
        "end_of_run": describe_final_models(counts, personalized=personalized),
    }
