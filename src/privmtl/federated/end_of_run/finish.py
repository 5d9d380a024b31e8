r"""Each client's end of a run: the per-client post-processing of the recorded releases.

After the last round every client holds its trained model (its personalized model, or the
billboard for methods without one) and the released billboard. :func:`finish_clients` computes
what each client keeps, from these, its own data and public parameters of the releases only:

``finetune="none"``
    the trained model;
``finetune="vanilla" | "mr" | "skl" | "ewc"``
    the trained model fine-tuned on the client's own data
    (:func:`~privmtl.federated.end_of_run.finetune.finetune`, one epoch at the training step size);
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
from privmtl.federated.algorithms import Params
from privmtl.federated.blocks import (
    END_OF_RUN_BLOCK,
    blocks_fork,
    client_blocks,
    concurrent_blocks,
    end_of_run_block,
)
from privmtl.federated.client_models import ClientModels, filled_rows
from privmtl.federated.end_of_run import finetune_selection
from privmtl.federated.end_of_run import local as end_of_run_local
from privmtl.federated.end_of_run.final_models import (
    FINAL_MODEL_WORDS,
    describe_final_models,
    final_model_counts,
    final_models_keys,
    stack_trained,
)
from privmtl.federated.end_of_run.finetune import FINETUNE_METHODS as _FINETUNE_RULES
from privmtl.federated.end_of_run.finetune import check_client_index
from privmtl.federated.end_of_run.finetune import finetune as finetune_models
from privmtl.federated.end_of_run.local import LOCAL_SOLVERS, select_per_client
from privmtl.federated.end_of_run.plan import (
    AUTO_CANDIDATES,
    AUTO_CLEAR_SIGNAL,
    AUTO_FINETUNE_EPOCHS,
    AUTO_FINETUNE_LRS,
    AUTO_FINETUNE_RIDGES,
    AUTO_METHODS,
    AUTO_NOTE,
    AUTO_ORDERS,
    AUTO_PARTIAL,
    FINETUNE_NOTE,
    FINETUNE_SELECT_CHOICES,
    FINETUNE_SELECTS,
    FINETUNE_VOTE_ID,
    FINETUNE_VOTE_NOTE,
    FINETUNE_VOTE_SHARE,
    FINETUNE_VOTE_STREAM,
    FINETUNE_VOTERS,
    FINETUNE_VOTERS_STREAM,
    AutoPlan,
    BlockSink,
    FinishOptions,
    auto_info,
    auto_plan,
    resolve_finetune_select,
    resolve_local_solver,
    vote_candidates,
    vote_voters,
)
from privmtl.federated.scoring import BlockScores, block_rows, client_scores
from privmtl.privacy.selection import client_vote_shares

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
    "BlockSink",
    "ClientFinish",
    "FinishOptions",
    "auto_info",
    "auto_plan",
    "describe_final_models",
    "final_model_counts",
    "final_models_keys",
    "finish_clients",
    "finish_pass",
    "resolve_finetune_select",
    "resolve_local_solver",
    "stack_trained",
    "vote_candidates",
    "vote_voters",
]


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

    ``params`` are stacked ``(k, ...)`` in the order of the clients (:func:`finish_clients`;
    empty from :func:`finish_pass`, whose blocks went to its sink); ``choice`` is the index in
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
    """Every client's final model (module docstring), for the clients of ``dataset``, stacked in
    :attr:`ClientFinish.params`: :func:`finish_pass`, its blocks' models assembled.

    The keywords are the fields of :class:`FinishOptions` (documented there). Every client's
    model is held at once: a population too large for that is finished by :func:`finish_pass`,
    whose blocks go to the caller's sink (``privmtl pmtl`` writes them to disk when it saves
    them, and else drops them once scored).

    Parameters
    ----------
    finetune, dataset, model, trained, billboard
        As :func:`finish_pass` (``finetune``: :attr:`FinishOptions.finetune`).
    batch_size, seed, lr, lam, start, epochs, plan, client_index, block, progress, device, \
score, workers, local_solver, local_patience, select, vote, voter_rng, voters, winner
        The fields of :class:`FinishOptions`.
    """
    options = FinishOptions(
        finetune, batch_size, seed, lr, lam, start, epochs, plan, client_index, block, progress,
        device, score, workers, local_solver, local_patience, select, vote, voter_rng, voters,
        winner,
    )  # fmt: skip
    if finetune == "none" and score is None:
        return ClientFinish({n: p.clone() for n, p in trained.items()})
    blocks: list[tuple[np.ndarray, Params]] = []
    fin = finish_pass(
        options, dataset, model, trained, billboard,
        on_block=lambda pos, params, _: blocks.append((pos, params)),
    )  # fmt: skip
    if len(blocks) == 1:
        fin.params = blocks[0][1]
        return fin
    m = dataset.n_clients
    first = blocks[0][1]
    fin.params = {n: p.new_empty((m, *p.shape[1:])) for n, p in first.items()}
    for pos, params in blocks:
        rows = torch.from_numpy(pos)
        for n, p in params.items():
            fin.params[n][rows] = p
    return fin


def finish_pass(
    options: FinishOptions,
    dataset: FederatedDataset,
    model: nn.Module,
    trained: Params,
    billboard: Params,
    *,
    on_block: BlockSink | None = None,
) -> ClientFinish:
    """Every client's end of run (module docstring) in one pass over the clients of ``dataset``.

    The clients are finished in blocks of at most ``options.block``
    (:mod:`~privmtl.federated.blocks`): a block's data are drawn once, its clients finished,
    scored (``options.score``) and handed to ``on_block`` (in the clients' order), then dropped.
    No step holds every client's model: :attr:`ClientFinish.params` is empty, and the result's
    choices and scores are accumulated block by block (``O(k)`` numbers). A client's final model
    does not depend on the block it is computed in.

    Parameters
    ----------
    options : FinishOptions
        How the clients end the run.
    dataset : FederatedDataset
        The clients' own data (all of the population, or a part of it).
    model : nn.Module
        Architecture and initial parameters (the start of ``"auto"``'s local training).
    trained : dict of str to Tensor
        The clients' trained models, stacked ``(k, ...)`` or a
        :class:`~privmtl.federated.client_models.ClientModels` (read a block at a time); for a
        method without personalized models: the billboard, stacked.
    billboard : dict of str to Tensor
        The released global model (the whole model: with partial sharing its personal layers
        are the initial ones).
    on_block : callable, optional
        Called with every block's positions and final models (:data:`BlockSink`).
    """
    o = options
    check_choice("finetune", o.finetune, ("none", "auto", *_FINETUNE_RULES))
    check_choice("local_solver", o.local_solver, LOCAL_SOLVERS)
    block = check_int("block", o.block, low=1)
    sink: BlockSink | None = on_block
    if isinstance(trained, ClientModels) and dataset.n_clients <= block:  # one block: its rows
        trained = trained.rows(np.arange(dataset.n_clients))
    if o.finetune == "none" and o.score is None:
        for pos in client_blocks(dataset.n_clients, block):
            if sink is not None:
                sink(pos, {n: p.clone() for n, p in block_rows(trained, pos).items()}, None)
        return ClientFinish({})
    names, voters, bar = _vote_and_progress(
        o.finetune, o.select, o.plan, o.vote, o.local_solver, dataset.n_clients, o.voter_rng,
        o.progress, voters=o.voters, known=o.winner is not None,
    )  # fmt: skip
    kw: dict[str, Any] = {
        "batch_size": o.batch_size, "seed": o.seed, "lr": o.lr, "lam": o.lam, "start": o.start,
        "epochs": o.epochs, "plan": o.plan, "bar": bar, "device": o.device,
        "local_solver": o.local_solver, "local_patience": o.local_patience, "grid": o.grid,
    }  # fmt: skip
    book = None
    if o.score is not None:
        buffers = {n: b.detach() for n, b in model.named_buffers()}
        book = _Book(BlockScores(model, buffers, ("val", "test")), dict(o.score))
    winner = o.winner if o.select == "vote" else None
    n_workers = check_int("workers", o.workers, low=1) if o.device == "cpu" else 1
    try:
        with one_thread_per_worker():
            if o.select == "vote" and winner is not None:  # elected elsewhere: finish with it
                kw["only"] = winner
            elif o.select == "vote":
                assert o.vote is not None
                shares = _vote_shares(
                    dataset, model, trained, billboard, o.client_index, block, names, kw, voters,
                    n_workers,
                )  # fmt: skip
                winner = names[int(o.vote(shares, names))]  # recorded by the caller: then models
                kw["only"] = winner
                del shares  # (m, candidates): not carried into the workers of the pass
            t0 = time.perf_counter()
            fin = _finish_all(
                o.finetune, dataset, model, trained, billboard, o.client_index, block, kw, book,
                n_workers, sink,
            )  # fmt: skip
            blocks_wall = time.perf_counter() - t0
    finally:
        bar.close()
    fin.winner = winner
    fin.voters = len(voters) if o.select == "vote" else None
    if book is not None:
        book.fill(fin, blocks_wall)
    fin.local = None
    return fin


def _vote_and_progress(
    finetune: str,
    select: str,
    plan: AutoPlan | None,
    vote: Callable[[np.ndarray, tuple[str, ...]], int] | None,
    local_solver: str,
    m: int,
    voter_rng: np.random.Generator | None,
    progress: bool,
    *,
    voters: np.ndarray | None = None,
    known: bool = False,
) -> tuple[tuple[str, ...], np.ndarray, Progress]:
    """:func:`finish_clients`' selection checked, and what it runs: the vote's candidates (none
    without a vote), the clients who vote (every client without one) and the progress bar of
    the end of run (one step per client and trained candidate: the local trainings are its
    long part)."""
    check_choice("select", select, FINETUNE_SELECTS)
    if finetune == "auto" and plan is None:
        raise InvalidParameterError("finish_clients(finetune='auto') needs its 'plan' (auto_plan).")
    if select == "vote" and (finetune != "auto" or (vote is None and not known)):
        raise InvalidParameterError(
            "finish_clients(select='vote') needs finetune='auto' and its 'vote'; got "
            f"finetune={finetune!r}, vote={vote!r}."
        )
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
    return names, voters, bar


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
        memo: dict[str, Any] = {}  # the shared models first: a fill equal to one reuses it
        others = {}
        for name, (params, personal) in sorted(self.others.items(), key=lambda kv: kv[1][1]):
            # a method's stored models: the sampled clients' rows, the others' shared fill
            own = filled_rows(params, pos) if personal and pos is not None else params
            others[name] = self.scores.score(name, own, personal, piece, model, memo)
        for name in self.others:
            out += others[name]
        return out, time.perf_counter() - t0

    def keep(self, scored: _Scored, block_seconds: float | None = None) -> None:
        """Keep one block's scores, after the blocks before it (``block_seconds``: the whole
        block's time, its scoring included; default the scoring's)."""
        self.scores.keep(scored[0])
        self.seconds += scored[1]
        self.block_seconds += scored[1] if block_seconds is None else block_seconds

    def fill(self, fin: ClientFinish, blocks_wall: float) -> None:
        """``fin``'s scores, the scoring's share of ``blocks_wall`` and every client's test
        predictions of its final (and local) model."""
        fin.scores, fin.score_seconds = self.scores.summary(), self.wall_seconds(blocks_wall)
        fin.per_client = {
            name: self.scores.per_client("test", name)
            for name in ("final", "local")
            if name in fin.scores["test"]
        }


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
    book: _Book | None,
    workers: int,
    sink: BlockSink | None,
) -> ClientFinish:
    """:func:`finish_pass`'s blocks (each scored into ``book``, then handed to ``sink``),
    ``workers`` at a time; the clients' choices, not their models. Without a sink a block's
    models are dropped where they were computed (a worker process sends back its scores and
    choices only)."""
    m = dataset.n_clients
    if m <= block:  # one block: a network's grids use the workers inside it
        fin = _finish_block(
            finetune,
            dataset,
            model,
            trained,
            billboard,
            client_index,
            **kw,
            workers=workers,
            block=block,
        )
        if book is not None:
            book.keep(book.score(fin.params, dataset, np.arange(m), local=fin.local))
        if sink is not None:
            sink(np.arange(m, dtype=np.int64), fin.params, dataset)
        fin.params, fin.local = {}, None
        return fin
    index = check_client_index(client_index, m)  # one block at a time, population indices
    own_model = _model_per_thread(model)
    blocks = list(client_blocks(m, block))
    # a block's data go to the sink where they were drawn here, never pickled back from a worker
    hand_data = sink is not None and not blocks_fork(workers, len(blocks))

    def one(
        pos: np.ndarray,
    ) -> tuple[ClientFinish, _Scored | None, float, _Tally, FederatedDataset | None]:
        t0 = time.perf_counter()
        net = own_model()
        part = dataset.subset(pos.tolist())
        tally = _Tally()
        piece = _finish_block(
            finetune, part, net, block_rows(trained, pos), billboard, index[pos].tolist(),
            **{**kw, "bar": tally}, block=block,
        )  # fmt: skip
        scored = None if book is None else book.score(piece.params, part, pos, net, piece.local)
        piece.local = None  # scored: not carried back
        if sink is None:
            piece.params = {}  # nor the models nobody takes
        return piece, scored, time.perf_counter() - t0, tally, part if hand_data else None

    choices: list[np.ndarray] = []
    piece = ClientFinish({})
    with concurrent_blocks(workers, len(blocks)) as run:
        for pos, (piece, scored, seconds, tally, part) in zip(
            blocks, run(one, blocks), strict=True
        ):
            kw["bar"].update(tally.n, **tally.postfix)
            if book is not None and scored is not None:
                book.keep(scored, seconds)  # in the blocks' order, whatever finished first
            if sink is not None:
                sink(pos, piece.params, part)  # then dropped: no stack of every client's model
            if piece.choice is not None:
                choices.append(piece.choice)
    choice = np.concatenate(choices) if choices else None
    return ClientFinish({}, choice, piece.plan, piece.grids)


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
    block: int = END_OF_RUN_BLOCK,
    grid: tuple[Sequence[float], Sequence[float]] | None = None,
) -> ClientFinish:
    """:func:`finish_clients` of the clients of ``dataset`` at once (one block); ``only``: every
    client takes this candidate of :func:`vote_candidates` (the vote's winner); ``workers``: the
    threads of a network's grids (:func:`~privmtl.federated.end_of_run.local.train_local`);
    ``block``: the most clients its candidates train at once (the pass's block); ``grid``: an
    explicit method's ``(lrs, lams)``, each client's own choice among them."""
    if finetune == "none":
        return ClientFinish({n: p.clone() for n, p in trained.items()})
    if finetune != "auto" and grid is not None:
        # through its module: the mediation audit's mutants replace it there; on the CPU
        params, _, sel = finetune_selection.finetune_select(
            trained, dataset, model, method=finetune, lrs=grid[0], lams=grid[1], scores=False,
            start=start, epochs=epochs, batch_size=batch_size, seed=seed,
            global_params=billboard, client_index=client_index,
        )  # fmt: skip
        return ClientFinish(params, np.asarray(sel["choice"], dtype=np.int64))
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
        local_solver, local_patience, grids, workers, block,
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
    block: int = END_OF_RUN_BLOCK

    def __call__(self, name: str) -> Params:
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
            "block": self.block,
            "scores": False,  # the candidates' models only: the choice scores them
            "on_clients": lambda k: self.bar.update(k, candidate=name),
        }
        if name == "local":
            # through its module: the mediation audit's mutants replace it there
            alone = end_of_run_local.train_local(self.dataset, self.model, **kw)
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
        tuned = end_of_run_local.train_local(self.dataset, begin, **{**grid, **point}, **kw)
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
    # the voters are a bounded sample: their blocks sized by their number, not the population's
    block = min(block, end_of_run_block(len(voters)))
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
