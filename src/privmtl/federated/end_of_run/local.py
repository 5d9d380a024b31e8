r"""Training alone: every client fits its own model on its own data, nothing is shared.

The baseline that private collaboration has to beat. Unlike the engine's ``method="local"``
(which trains, round after round, only the clients sampled in that round, so that with
``q`` of ``m`` clients per round a client trains about ``T q / m`` times and a client never
sampled keeps its initial model), :func:`train_local` trains **every** client, from the same
initial model as the federated methods, with plain minibatch SGD on its own training split
(:math:`\frac{1}{|b|}\sum_{i\in b}\mathrm{CE}(h_w(x_i), y_i)`, no penalty), for every
``(epochs, lr)`` of a small grid, and keeps one setting per client:

* ``select="client"`` (default): each client keeps the setting with the most correct predictions
  on its own validation split; ties — e.g. a client without validation data, or none correct —
  go to the later setting of the grid, whose public order (:func:`client_better`) puts the most
  training last. Nothing leaves any client: every client's model depends on its own data only.
* ``select="pooled"``: one setting for all clients, the most correct predictions on the pooled
  validation data (ties: lower pooled loss). The choice reads every client's validation data, so
  each client's model depends on the others' data outside any release: a tuning step that the
  guarantee does not cover (opt-in; ``privmtl pmtl --local-select pooled`` reports it as not
  covered).

The default grid, :data:`LOCAL_EPOCHS` × :data:`LOCAL_LRS`, is small on purpose: validation splits
of federated clients are tiny (a median of one or two examples on LEAF-like data), and a
per-client choice among many settings mostly fits the noise of those few examples. For the same
reason the choice counts correct predictions and never compares losses: with a few validation
examples of classes a client has hardly seen, the lowest cross-entropy belongs to the least
trained, least confident model (on FEMNIST writers with 20 images, a per-client lowest-loss choice
kept 10-epoch models for most clients and scored 0.15, where 100 epochs for everybody score 0.37),
so ties go to the most trained candidate instead.

Minibatches are those of :func:`~privmtl.federated.end_of_run.finetune.finetune` (``start="global"`` from the
initial model, ``method="vanilla"``): ``epochs`` fresh permutations of the client's ``n_k``
training examples cut into ``ceil(n_k / batch_size)`` minibatches, drawn from
``numpy.random.default_rng([seed, 3, k])``; all clients are trained together with
``torch.func.vmap`` in groups of similar size, so a population of ``m = 10 000`` clients trains in
about the time of one pass of every grid point over its data.

Privacy: with ``select="client"`` a client's model reads its own data only (ε = 0 towards the
other clients); with ``select="pooled"`` the choice of one ``(epochs, lr)`` reads every client's
validation data.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from privmtl._device import one_thread_per_worker, resolve_device, to_device
from privmtl._validation import check_choice, check_int, check_real
from privmtl.data.federated import FederatedDataset
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import Params
from privmtl.federated.blocks import END_OF_RUN_BLOCK, client_blocks, concurrent_blocks
from privmtl.federated.config import TrainConfig, TrainResult, check_inputs
from privmtl.federated.end_of_run.finetune import (
    check_client_index,
)
from privmtl.federated.end_of_run.local_budget import ADAM_EPOCH_STEPS
from privmtl.federated.end_of_run.local_grid import _train_grid
from privmtl.federated.gradients import tape_free
from privmtl.federated.models import MultinomialLogReg
from privmtl.federated.ridge import RIDGE_ITERATIONS, ridge_logreg
from privmtl.federated.scoring import BlockScores, client_scores, evaluate
from privmtl.federated.spec import SPEC

__all__ = [
    "ADAM_EPOCHS",
    "ADAM_LRS",
    "LOCAL_EPOCHS",
    "LOCAL_LRS",
    "LOCAL_RIDGES",
    "LOCAL_SELECT",
    "LOCAL_SOLVERS",
    "LOCAL_SOLVER_CHOICES",
    "client_better",
    "select_per_client",
    "train_local",
]

LOCAL_EPOCHS = (10, 30, 100)
"""Default grid of local epochs of :func:`train_local`."""
LOCAL_LRS = (0.03, 0.1)
"""Default grid of SGD step sizes of :func:`train_local`."""
LOCAL_SELECT = ("client", "pooled")
BlockSink = Callable[[np.ndarray, Params, FederatedDataset | None], None]
"""What :func:`~privmtl.federated.end_of_run.finish.finish_pass` and :func:`train_local` hand
every block's final models to, the blocks in the clients' order: ``(positions, models, data)``,
``data`` the block's clients' data where the pass drew them in this process (the whole data set
for one block; None where a worker process drew them, or the pass drew no data), so that a sink
scoring the block need not draw it again."""
LOCAL_SOLVERS = ("sgd", "adam", "ridge")
"""How :func:`train_local` trains: the minibatch-SGD grid, the same grid with Adam's steps (a
network reaches in ``ADAM_EPOCHS`` what SGD needs ``LOCAL_EPOCHS`` for), or every client's
ridge-regularised logistic regression solved in batches (:mod:`~privmtl.federated.ridge`; logistic
regression only)."""
ADAM_EPOCHS = (15, 20)
"""Default grid of local epochs of :func:`train_local` with ``solver="adam"``."""
ADAM_LRS = (0.003,)
"""Default Adam step sizes of :func:`train_local` with ``solver="adam"``."""
LOCAL_SOLVER_CHOICES = ("auto", *LOCAL_SOLVERS)
"""The values a run takes for its local solver: ``"auto"`` is resolved once per run
(:func:`~privmtl.federated.end_of_run.finish.resolve_local_solver`)."""
LOCAL_RIDGES = (1.0,)
"""Default prior strengths ``c`` of ``solver="ridge"`` (:func:`~privmtl.federated.ridge.ridge_logreg`):
one, so that no choice is made on the clients' tiny validation splits."""


def client_better(
    correct: np.ndarray, loss: np.ndarray, best_correct: np.ndarray, best_loss: np.ndarray
) -> np.ndarray:
    """Per client: does a candidate replace the best so far (earlier in the public order)?

    The per-client rule of privmtl: at least as many correct predictions on the client's own
    validation split — so ties, e.g. a client without validation data, go to the later candidate:
    the public order of the candidates is the tie-break, and callers put the preferred candidate
    last. A candidate whose validation loss is not finite (a diverged model) never replaces a
    finite one; ``loss`` and ``best_loss`` are used for nothing else.
    """
    finite, best_finite = np.isfinite(loss), np.isfinite(best_loss)
    return finite & ((correct >= best_correct) | ~best_finite)


def select_per_client(
    candidates: Iterable[Params],
    model: nn.Module,
    buffers: Params,
    val_x: list[torch.Tensor],
    val_y: list[torch.Tensor],
) -> tuple[Params, np.ndarray, np.ndarray]:
    """Each client's best of stacked candidate models on its own validation split.

    ``candidates`` yields stacked models ``(m, ...)`` in the public order of the tie-break
    (:func:`client_better`: most correct predictions, ties to the later candidate); they are
    consumed one at a time, so only the best so far and the current candidate are held. Client
    ``k``'s choice reads nothing but its own slice of each candidate and its own validation data.

    Returns
    -------
    chosen : dict of str to Tensor
        Each client's chosen model, stacked ``(m, ...)``.
    choice : ndarray of int
        Index of the chosen candidate per client.
    correct : ndarray of float
        Correct validation predictions of the chosen model per client.
    """
    chosen: Params = {}
    choice = np.zeros(len(val_y), dtype=np.int64)
    best_correct = np.full(len(val_y), -1.0)
    best_loss = np.full(len(val_y), np.nan)
    for g, params in enumerate(candidates):
        correct, loss = client_scores(model, params, buffers, val_x, val_y)
        better = client_better(correct, loss, best_correct, best_loss)
        if g == 0:
            chosen = {n: p.clone() for n, p in params.items()}
            better[:] = True
        else:
            mask = torch.from_numpy(better)
            for n, p in chosen.items():
                at = mask.to(p.device)
                p[at] = params[n][at.to(params[n].device)].to(p.dtype)
        choice[better] = g
        best_correct = np.where(better, correct, best_correct)
        best_loss = np.where(better, loss, best_loss)
    if not chosen:
        raise InvalidParameterError("select_per_client needs at least one candidate.")
    return chosen, choice, best_correct


def _grid(epochs: Sequence[int], lrs: Sequence[float]) -> list[tuple[int, float]]:
    if isinstance(epochs, str | bytes) or len(epochs) == 0:
        raise InvalidParameterError(
            f"The 'epochs' parameter must hold at least one number of epochs; got {epochs!r}."
        )
    if isinstance(lrs, str | bytes) or len(lrs) == 0:
        raise InvalidParameterError(
            f"The 'lrs' parameter must hold at least one step size; got {lrs!r}."
        )
    es = [check_int("epochs", e, low=1) for e in epochs]
    ls = [check_real("lrs", lr, low=0.0, closed="neither") for lr in lrs]
    return [(e, lr) for e in es for lr in ls]


def _ridges(ridges: Sequence[float]) -> list[float]:
    if isinstance(ridges, str | bytes) or len(ridges) == 0:
        raise InvalidParameterError(
            f"The 'ridges' parameter must hold at least one prior strength; got {ridges!r}."
        )
    return [check_real("ridges", c, low=0.0, closed="neither") for c in ridges]


def _choose(
    net: nn.Module,
    buffers: Params,
    part: FederatedDataset,
    models: Sequence[Params],
    n_grid: int,
    *,
    scores: bool,
    select: str,
    on: torch.device,
    fixed: int | None = None,
) -> tuple[Params, np.ndarray, np.ndarray, np.ndarray, _ValScores]:
    """One block's choice among its grid's ``models``: every client's model (its own best on its
    own validation split, the pooled best with ``select="pooled"``, or the grid point ``fixed``:
    a pooled choice made over every block), the grid index each client took, the grid's correct
    validation and test counts in the block (test: NaN without ``scores``) and every client's
    correct validation predictions and loss at every grid point."""
    val_x, val_y = part.split("val")
    test_x, test_y = part.split("test")
    k = part.n_clients
    vc, tc = np.zeros(n_grid), np.zeros(n_grid)
    best_correct, best_loss = np.full(k, -1.0), np.full(k, np.inf)
    part_choice = np.zeros(k, dtype=np.int64)
    mine: Params = {}
    val: _ValScores = ([], [])
    for g, params in enumerate(models):
        if scores or len(models) > 1:
            correct, loss = client_scores(net, params, buffers, val_x, val_y)
        else:  # one candidate: nothing to choose
            correct, loss = np.full(k, np.nan), np.zeros(k)
        val[0].append(correct)
        val[1].append(loss)
        vc[g] = correct.sum()
        if scores:
            tc[g] = client_scores(net, params, buffers, test_x, test_y)[0].sum()
        else:
            tc[g] = np.nan
        if fixed is not None:
            better = np.full(k, g == fixed)
        elif select == "pooled":
            better = np.full(
                k,
                g == 0 or (-correct.sum(), loss.sum()) < (-best_correct.sum(), best_loss.sum()),
            )
        else:
            better = client_better(correct, loss, best_correct, best_loss)
        if g == 0:
            mine = {n: p.clone() for n, p in params.items()}
            better[:] = True
        else:
            mask = torch.from_numpy(better).to(on)
            for n, p in mine.items():
                p[mask] = params[n][mask]
        part_choice[better] = g
        best_correct = np.where(better, correct, best_correct)
        best_loss = np.where(better, loss, best_loss)
    return mine, part_choice, vc, tc, val


_ValScores = tuple[list[np.ndarray], list[np.ndarray]]
"""Every client's correct validation predictions and validation loss, one array per grid point."""


def _pooled_point(val: _ValScores) -> int:
    """``select="pooled"``'s grid point from every client's validation scores: the most correct
    predictions over all clients, ties to the lower summed loss, then to the earlier point (the
    rule :func:`_choose` applies to one block holding every client)."""
    best = 0
    for g in range(1, len(val[0])):
        if (-val[0][g].sum(), val[1][g].sum()) < (-val[0][best].sum(), val[1][best].sum()):
            best = g
    return best


@one_thread_per_worker()
def train_local(
    dataset: FederatedDataset,
    model: nn.Module,
    *,
    epochs: Sequence[int] | None = None,
    lrs: Sequence[float] | None = None,
    batch_size: int = SPEC.batch_size,
    select: str = "client",
    seed: int = SPEC.seed,
    client_chunk: int | None = 64,
    batched: bool = True,
    client_index: Sequence[int] | None = None,
    block: int = END_OF_RUN_BLOCK,
    workers: int = 1,
    on_clients: Callable[[int], None] | None = None,
    device: str | torch.device = "cpu",
    solver: str = "sgd",
    ridges: Sequence[float] = LOCAL_RIDGES,
    patience: int | None = None,
    scores: bool = True,
    on_block: BlockSink | None = None,
) -> TrainResult:
    r"""Train every client alone on its own data, over a grid of epochs and step sizes.

    Parameters
    ----------
    dataset : FederatedDataset
        Client ``k`` trains on its ``train`` split; ``val`` selects, ``test`` scores.
    model : nn.Module
        Architecture and every client's initial parameters (as for the federated methods); kept.
    epochs : sequence of int, optional
        Numbers of passes over the client's training data tried (each >= 1); default
        :data:`LOCAL_EPOCHS` (``solver="adam"``: :data:`ADAM_EPOCHS`).
    lrs : sequence of float, optional
        Step sizes tried (each > 0); default :data:`LOCAL_LRS` (``"adam"``: :data:`ADAM_LRS`).
    batch_size : int, default 10
        Minibatch size ``B`` (an epoch's last minibatch may be smaller).
    select : {"client", "pooled"}, default "client"
        One setting per client by its own validation split (the most correct predictions, ties
        to the most training), or one for all clients by the pooled validation accuracy (not
        covered by the guarantee; module docstring).
    seed : int, default 0
        Seed of the minibatch draws.
    client_chunk : int or None, default 64
        Clients trained together per vectorised call (None: all). Logistic regression's models
        (closed-form gradients) do not depend on it; a vectorised network's (``vmap``) may differ
        in the last floating-point digits with the size of the call and a client's place in it.
    batched : bool, default True
        ``False`` runs :func:`~privmtl.federated.end_of_run.finetune.finetune`'s per-client reference loop.
    client_index : sequence of int, optional
        The population index of every client of ``dataset``, which seeds its minibatches
        (:func:`~privmtl.federated.end_of_run.finetune.finetune_plan`; default: its position).
    block : int, default :data:`~privmtl.federated.blocks.END_OF_RUN_BLOCK`
        The most clients trained at once (their grid of models is held for one block at a
        time); the models do not depend on it. ``select="pooled"`` takes the whole population
        at once, or, with ``on_block``, two passes over the blocks: every client's validation
        scores at every grid point, then the models of the chosen point.
    workers : int, default 1
        Blocks trained at once, in threads with one torch thread each, for a network trained on
        the CPU by the SGD or Adam grid with ``select="client"`` (a network's steps are large operations
        that leave the interpreter free; the closed-form logistic step's are not, and it keeps
        one block after another). With ``workers`` > 1 the clients are split into at least
        ``workers`` blocks. A network's models may differ in the last floating-point digits with
        the block (``client_chunk``).
    on_clients : callable, optional
        Called with the number of clients whose grid is trained, after each chunk of them (a
        progress report; the models do not depend on it).
    device : {"cpu", "auto", "cuda", "cuda:N"} or torch.device, default "cpu"
        Where the batched path trains and scores (:func:`~privmtl._device.resolve_device`); the
        data and models are moved there a block at a time and the returned models are CPU
        tensors. The per-client reference loop (``batched=False``) runs on the CPU.
    solver : {"sgd", "adam", "ridge"}, default "sgd"
        ``"sgd"``: the grid of ``epochs`` x ``lrs`` of minibatch SGD. ``"adam"``: the same grid
        and minibatches with Adam's steps (:mod:`~privmtl.federated.end_of_run.local_grid`'s
        ``ADAM_BETAS`` and ``ADAM_EPS``, moments from zero for every run; always batched), which
        train a network from its initial model in a few epochs where SGD needs many:
        :data:`ADAM_EPOCHS` against :data:`LOCAL_EPOCHS`; a grid point of ``e`` epochs is at
        least ``e`` epochs and at least the steps of ``e`` epochs of a client with
        :data:`~privmtl.federated.end_of_run.local_budget.ADAM_EPOCH_STEPS` minibatches, so a
        small client trains more epochs (:mod:`~privmtl.federated.end_of_run.local_budget`).
        ``"ridge"`` (a :class:`~privmtl.federated.models.MultinomialLogReg` only): every client's
        cross-entropy with an L2 penalty towards ``model``'s parameters, worth ``c`` examples,
        for each ``c`` of ``ridges``, solved for a block's clients in batches
        (:func:`~privmtl.federated.ridge.ridge_logreg`; ``epochs``, ``lrs``, ``batch_size``,
        ``client_chunk`` and ``batched`` unused): several times faster, other models.
    ridges : sequence of float, default :data:`LOCAL_RIDGES`
        ``solver="ridge"``: the prior strengths ``c`` (each > 0) of the grid, in its public order
        (ties of the choice go to the later).
    patience : int, optional
        ``solver="sgd"``, batched: stop a client's run at a step size once the correct
        predictions of its model on the client's own validation split have not improved for
        this many epochs (each >= 1; a client without validation data runs to the end); its
        later grid points are the stopped model. None (default): every run trains all epochs.
    scores : bool, default True
        False: only the models and the choice (the end of run's candidates, the same): the
        grid's pooled test accuracies are NaN, a one-point grid's validation accuracy too (it
        chooses nothing), and ``accuracies`` is empty.
    on_block : callable, optional
        A :data:`BlockSink` (data None) taking every block's chosen models (CPU tensors) instead
        of a stack: ``personalized_params`` is None, ``accuracies`` and ``extra["per_client"]``
        (every client's correct test predictions and test examples) are scored block by block.

    Returns
    -------
    TrainResult
        ``method="local"`` configuration with ``sampling="all"``, personalized models stacked
        ``(m, ...)``, the initial model as ``global_params``, ε = δ = 0, and in ``extra``:
        ``local_selection`` with ``grid`` (the ``(epochs, lr)`` pairs; ``solver="ridge"``: the
        ``[c]`` of every prior strength), ``solver``, ``patience``, ``select``, ``choice``
        (grid index per client), ``grid_val_accuracy`` and ``grid_test_accuracy`` (pooled
        accuracy of every grid point used for all clients).
    """
    check_inputs(dataset, model)
    run = _check_local(
        dataset.n_clients, model, epochs=epochs, lrs=lrs, batch_size=batch_size, select=select,
        seed=seed, client_chunk=client_chunk, batched=batched, client_index=client_index,
        block=block, workers=workers, device=device, solver=solver, ridges=ridges,
        patience=patience, scores=scores, sink=on_block is not None,
    )  # fmt: skip
    return _train_local(dataset, model, run, on_clients, on_block)


@dataclass(frozen=True)
class _LocalRun:
    """The checked settings of one :func:`train_local` call."""

    solver: str
    select: str
    grid: list[tuple[int, float]]
    ridge_grid: list[float]
    batch_size: int
    seed: int
    client_chunk: int | None
    batched: bool
    patience: int | None
    scores: bool
    on: torch.device
    #: the population index of every client, and whether the caller gave it
    index: np.ndarray
    indexed: bool
    #: the most clients of a block, and the blocks trained at once (threads)
    block: int
    threads: int

    @property
    def n_grid(self) -> int:
        return len(self.ridge_grid) if self.solver == "ridge" else len(self.grid)


def _check_local(
    m: int,
    model: nn.Module,
    *,
    epochs: Sequence[int] | None,
    lrs: Sequence[float] | None,
    batch_size: int,
    select: str,
    seed: int,
    client_chunk: int | None,
    batched: bool,
    client_index: Sequence[int] | None,
    block: int,
    workers: int,
    device: str | torch.device,
    solver: str,
    ridges: Sequence[float],
    patience: int | None,
    scores: bool,
    sink: bool = False,
) -> _LocalRun:
    """:func:`train_local`'s parameters checked and its defaults resolved, for ``m`` clients."""
    check_choice("select", select, LOCAL_SELECT)
    batch_size = check_int("batch_size", batch_size, low=1)
    seed = check_int("seed", seed, low=0)
    if client_chunk is not None:
        client_chunk = check_int("client_chunk", client_chunk, low=1)
    check_choice("solver", solver, LOCAL_SOLVERS)
    if epochs is None:
        epochs = ADAM_EPOCHS if solver == "adam" else LOCAL_EPOCHS
    if lrs is None:
        lrs = ADAM_LRS if solver == "adam" else LOCAL_LRS
    if solver == "adam":
        batched = True
    if solver == "ridge":
        if not isinstance(model, MultinomialLogReg):
            raise InvalidParameterError(
                "The 'solver' parameter 'ridge' needs a MultinomialLogReg model; "
                f"got {type(model).__name__}."
            )
        batched = True
    ridge_grid = _ridges(ridges) if solver == "ridge" else []
    if patience is not None:
        patience = check_int("patience", patience, low=1)
        if solver != "sgd" or not batched:
            raise InvalidParameterError(
                "The 'patience' parameter stops the batched SGD grid (solver='sgd', "
                f"batched=True); got patience={patience} with solver={solver!r}, "
                f"batched={batched!r}."
            )
    grid = _grid(epochs, lrs)
    on = resolve_device(device) if batched else torch.device("cpu")
    index = check_client_index(client_index, m)
    # each client chooses on its own validation split: the population is trained a block at a
    # time; one pooled choice reads every client's validation data: one block, or two passes
    # over the blocks where they go to a sink (every client's counts, then the models)
    block = check_int("block", block, low=1) if select == "client" or sink else m
    workers = check_int("workers", workers, low=1)
    threads = (
        workers
        if select == "client" and solver in ("sgd", "adam") and batched and on.type == "cpu"
        and not tape_free(model)
        else 1
    )  # fmt: skip
    if threads > 1:  # every worker gets clients
        block = min(block, -(-m // threads))
    return _LocalRun(
        solver=solver, select=select, grid=grid, ridge_grid=ridge_grid, batch_size=batch_size,
        seed=seed, client_chunk=client_chunk, batched=batched, patience=patience, scores=scores,
        on=on, index=index, indexed=client_index is not None, block=block, threads=threads,
    )  # fmt: skip


class _BlockStep:
    """The step :func:`train_local` runs once per block of clients (in threads when
    ``run.threads`` > 1): the block's grid of models, each client's choice among them, and the
    grid's correct counts in the block."""

    def __init__(
        self,
        run: _LocalRun,
        dataset: FederatedDataset,
        model: nn.Module,
        on_clients: Callable[[int], None] | None,
    ) -> None:
        self.run, self.dataset, self.model = run, dataset, model
        self.init = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.buffers = {n: b.detach() for n, b in model.named_buffers()}
        self._on_clients = on_clients
        self._lock = threading.Lock()
        #: a pooled choice made over every block: the grid point every client takes
        self.fixed: int | None = None
        #: scores of every block's chosen and initial models (their blocks go to a sink)
        self.book: BlockScores | None = None

    def progress(self, k: int) -> None:
        """Report ``k`` more clients trained (under a lock: blocks may run in threads)."""
        if self._on_clients is not None:
            with self._lock:
                self._on_clients(k)

    def __call__(self, pos: np.ndarray) -> _Block:
        run, m = self.run, self.dataset.n_clients
        # scoring swaps a module's parameters while it runs: a module per thread
        net = self.model if run.threads == 1 else copy.deepcopy(self.model)
        part = self.dataset if len(pos) == m else self.dataset.subset(pos.tolist())
        ci = None if not run.indexed and len(pos) == m else run.index[pos].tolist()
        if run.solver == "ridge":
            models = ridge_logreg(self.init, part, run.ridge_grid)
            self.progress(len(pos))
        else:
            adam = run.solver == "adam"
            models = _train_grid(
                net, self.buffers, self.init, part, run.grid, run.batch_size, run.seed,
                run.client_chunk, run.batched, ci, self.progress, run.patience, adam,
                ADAM_EPOCH_STEPS if adam else None,
            )  # fmt: skip
        mine, choice, vc, tc, val = _choose(
            net, self.buffers, part, models, run.n_grid, scores=run.scores, select=run.select,
            on=run.on, fixed=self.fixed,
        )  # fmt: skip
        scored = None
        if self.book is not None:  # scored while the block's data are at hand
            scored = self.book.score("personalized", mine, True, part, net)
            scored += self.book.score("global", self.init, False, part, net)
        return mine, choice, vc, tc, val, scored


_Block = tuple[
    Params,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    _ValScores,
    list[tuple[str, str, tuple[np.ndarray, np.ndarray, float]]] | None,
]
"""One block of :class:`_BlockStep`: its chosen models, every client's choice, the grid's
correct validation and test counts, every client's validation scores, and the block's scores
(:attr:`_BlockStep.book`)."""


def _pass(
    step: _BlockStep,
    blocks: list[np.ndarray],
    m: int,
    sink: BlockSink | None,
    *,
    keep: bool,
) -> tuple[Params, np.ndarray, np.ndarray, np.ndarray, _ValScores]:
    """One pass of ``step`` over the ``blocks`` of ``m`` clients: the chosen models stacked
    (``keep``, without a ``sink``; else each block handed to ``sink`` or dropped), every client's
    choice, the grid's correct validation and test counts, and every client's validation scores
    at every grid point (``select="pooled"``'s first pass over several blocks; else empty)."""
    run = step.run
    chosen: Params = {}
    choice = np.zeros(m, dtype=np.int64)
    val_correct, test_correct = np.zeros(run.n_grid), np.zeros(run.n_grid)
    vals: list[_ValScores] = []
    with concurrent_blocks(run.threads, len(blocks), processes=False) as map_blocks:
        for pos, (mine, part_choice, vc, tc, val, scored) in zip(
            blocks, map_blocks(step, blocks), strict=True
        ):
            val_correct += vc
            test_correct += tc
            if step.book is not None and scored is not None:
                step.book.keep(scored)  # in the blocks' order
            if sink is not None:
                sink(pos, to_device(mine, "cpu"), None)  # then dropped: no stack of all
            elif keep and len(pos) == m:
                chosen = mine
            elif keep:
                if not chosen:
                    chosen = {n: p.new_empty((m, *p.shape[1:])) for n, p in mine.items()}
                for n, p in mine.items():
                    chosen[n][torch.from_numpy(pos).to(run.on)] = p
            elif not keep and len(blocks) > 1:  # the pooled choice's first pass
                vals.append(val)
            choice[pos] = part_choice
    every: _ValScores = (
        [np.concatenate([v[0][g] for v in vals]) for g in range(run.n_grid)] if vals else [],
        [np.concatenate([v[1][g] for v in vals]) for g in range(run.n_grid)] if vals else [],
    )
    return chosen, choice, val_correct, test_correct, every


def _train_local(
    dataset: FederatedDataset,
    model: nn.Module,
    run: _LocalRun,
    on_clients: Callable[[int], None] | None,
    sink: BlockSink | None = None,
) -> TrainResult:
    """:func:`train_local` on checked settings: every block trained and chosen (in two passes
    for a pooled choice over several blocks: every client's validation scores, then the models
    at the chosen point), the choices put together, and the result."""
    t0 = time.perf_counter()
    m = dataset.n_clients
    if run.on.type != "cpu":  # the caller's module stays where it is
        model = copy.deepcopy(model).to(run.on)
    step = _BlockStep(run, dataset, model, on_clients)
    init, buffers = step.init, step.buffers
    blocks = list(client_blocks(m, run.block))
    if run.select == "pooled" and len(blocks) > 1:  # every client's counts, then the models
        step.fixed = _pooled_point(_pass(step, blocks, m, None, keep=False)[4])
    if sink is not None and run.scores:
        step.book = BlockScores(model, buffers, ("val", "test"))
    chosen, choice, val_correct, test_correct, _ = _pass(step, blocks, m, sink, keep=True)
    n_val = max(int(dataset.sizes("val").sum()), 1)
    n_test = int(dataset.sizes("test").sum())
    grid_val = [float(c / n_val) for c in val_correct]
    grid_test = [float(c / n_test) if n_test else float("nan") for c in test_correct]
    accuracies: dict[str, dict[str, dict[str, float]]] = {}
    extra: dict[str, Any] = {}
    if step.book is not None:  # and every client's test predictions: its rows need no re-read
        accuracies = step.book.summary()
        extra["per_client"] = step.book.per_client("test", "personalized")
    for split in ("val", "test") if run.scores and step.book is None else ():
        xs, ys = dataset.split(split)
        accuracies[split] = {
            "personalized": evaluate(model, chosen, buffers, xs, ys, personalized=True),
            "global": evaluate(model, init, buffers, xs, ys, personalized=False),
        }
    grid, solver = run.grid, run.solver
    # the configuration reports a public step size: the pooled choice's, else the grid's first
    # (the ridge solver: its preconditioned step of 1, over its iterations)
    first = grid[int(choice[0])] if run.select == "pooled" else grid[0]
    if solver == "ridge":
        first = (RIDGE_ITERATIONS, 1.0)
    config = TrainConfig(
        method="local",
        rounds=first[0] if solver == "ridge" else max(e for e, _ in grid),
        clients_per_round=m,
        sampling="all",
        local_epochs=1,
        batch_size=run.batch_size,
        lr=first[1],
        lam=0.0,
        clip=None,
        personal_init="model",  # every client starts from the initial model
        seed=run.seed,
        progress=False,
        device=str(run.on),
    )
    selection: dict[str, Any] = {
        "grid": [[c] for c in run.ridge_grid] if solver == "ridge" else [[e, lr] for e, lr in grid],
        "solver": solver,
        "patience": run.patience,
        "select": run.select,
        "choice": choice.tolist(),
        "grid_val_accuracy": grid_val,
        "grid_test_accuracy": grid_test,
    }
    seconds = time.perf_counter() - t0
    return TrainResult(
        config=config,
        client_ids=list(dataset.client_ids),
        personalized_params=None if sink is not None else to_device(chosen, "cpu"),
        global_params=to_device(init, "cpu"),
        history=[],
        accuracies=accuracies,
        primary="personalized",
        epsilon=0.0,
        delta=0.0,
        seconds=seconds,
        seconds_per_round=seconds,
        extra={"local_selection": selection, **extra},
    )
