"""The steps of one PMTL run as types (:class:`DataRequest`, :class:`FinishRequest`,
:class:`Durability` → :class:`LoadedRun` → :class:`TrainedRun` → :class:`FinishedRun`) and its
first step, loading the data, the model and the method (:func:`~privmtl.experiments.pmtl.run_pmtl`
runs them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from privmtl._device import DEFAULT_DEVICE, resolve_device
from privmtl._timing import PMTL_PHASES, PhaseTimer
from privmtl._validation import check_choice
from privmtl.data.federated import FederatedDataset
from privmtl.data.registry import (
    absolute_data_path,
    load_federated,
)
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import Params
from privmtl.federated.config import TrainResult, resolve
from privmtl.federated.end_of_run.finetune import FINETUNE_METHODS
from privmtl.federated.end_of_run.finetune_selection import SELECT_MODES
from privmtl.federated.end_of_run.finish import (
    FINETUNE_SELECT_CHOICES,
    resolve_finetune_select,
)
from privmtl.federated.end_of_run.plan import FINETUNE_VOTE_SHARE, FINETUNE_VOTERS
from privmtl.federated.end_of_run.trained_run import (
    epochs_grid,
)
from privmtl.federated.methods import Method, get_method, method_class
from privmtl.federated.models import make_model
from privmtl.federated.spec import (
    EXECUTION,
    RunSpec,
    pmtl_delta,
)
from privmtl.federated.user_model import is_factory_spec, load_factory
from privmtl.privacy.selection import VotePlan, plan_vote

if TYPE_CHECKING:
    from privmtl.federated.user_model import UserFactory

__all__ = [
    "FINETUNE_STARTS",
    "DataRequest",
    "Durability",
    "FinishRequest",
    "FinishedRun",
    "LoadedRun",
    "TrainedRun",
]

FINETUNE_STARTS = ("auto", "billboard")
"""Where fine-tuning starts: the personalized models when the method has them, else the released
global model (auto), or the released global model (billboard)."""


def _absolute_data_path(data: str, data_path: str | Path | None) -> str | None:
    """The data's absolute path, so that saved models can be evaluated from anywhere."""
    return absolute_data_path("pmtl", data, data_path)


# ------------------------------------------------------------------ the steps of one run


@dataclass(frozen=True)
class DataRequest:
    """The data and model a run asks for: a registered PMTL data set with
    :func:`~privmtl.data.registry.load_federated`'s options (``table``: a table's
    ``client_column``, ``label_column`` and ``feature_columns``) and the model's name or factory."""

    data: str
    data_path: str | Path | None
    model: str
    table: dict[str, Any]
    num_clients: int | None
    scaling: str

    def record(self) -> dict[str, Any]:
        """The data section of ``model.json`` (the saver adds the seed): enough to load the same
        data again from anywhere."""
        table = self.data == "table"
        return {
            "data": self.data,
            "data_path": _absolute_data_path(self.data, self.data_path),
            **(self.table if table else {}),
            **({"scaling": self.scaling} if table else {}),
            "num_clients": self.num_clients,
        }


@dataclass(frozen=True)
class FinishRequest:
    """How the run ends after training, checked by :func:`_finish_request`: fine-tuning's epochs
    (a grid only from the billboard), its grids of step sizes and penalty weights (None: the
    run's), where it starts, how the grid is chosen, and the extra variants scored beside it."""

    epochs: tuple[int, ...]
    lrs: tuple[float, ...] | None
    lams: tuple[float, ...] | None
    start: str
    select: str
    extra: tuple[str, ...]


@dataclass(frozen=True)
class Durability:
    """What keeps a run across interruptions, passed to the method's ``fit``: the checkpoint
    folder and cadence, whether the run continues an earlier one, and the ε budget it stops at."""

    checkpoint_dir: str | Path | None
    checkpoint_every: int
    resume: bool
    budget_epsilon: float | None

    def run_options(self) -> dict[str, Any]:
        """The backend's run keywords (a spent budget stops the run)."""
        return {
            "checkpoint_dir": self.checkpoint_dir,
            "checkpoint_every": self.checkpoint_every,
            "resume": self.resume,
            "budget_epsilon": self.budget_epsilon,
            "on_budget": "stop",
        }


@dataclass(frozen=True)
class LoadedRun:
    """Load's output: the checked settings and the ones resolved on the data, the data, the model,
    and the method bound to the calibrated engine configuration (the target ε already σ)."""

    spec: RunSpec
    resolved: RunSpec
    request: DataRequest
    dataset: FederatedDataset
    net: torch.nn.Module
    method: Method
    name: str
    method_source: dict[str, Any] | None
    factory: UserFactory | None
    notes: tuple[str, ...]
    seconds: float
    """The seconds of loading or generating the data (the run's ``data`` phase)."""
    vote: VotePlan | None = None
    """``finetune_select="vote"``: the end-of-run vote's public plan (its event is reserved in the
    calibration of the rounds when it is held)."""

    @property
    def m(self) -> int:
        """The number of clients."""
        return self.dataset.n_clients

    @property
    def q(self) -> int:
        """The clients per round, as resolved on the data."""
        return int(self.resolved.clients_per_round or self.m)

    @property
    def lam(self) -> float:
        """λ, as resolved on the data."""
        return float(self.resolved.lam or 0.0)


@dataclass(frozen=True)
class TrainedRun:
    """Train's output: the engine's result, the noise of the released mean and the clients per
    round as reported (0 and m when nothing is released), and how local training chose."""

    result: TrainResult
    sigma: float
    q: int
    local_select: str
    local_solver: str = "sgd"
    local_patience: int | None = None


@dataclass(frozen=True)
class FinishedRun:
    """Finish's output: the keys fine-tuning sets (``parts``; the trained run's accuracies are
    replaced by the fine-tuned ones), the extra variants' results, the clients' final models
    (None: the trained ones), the final-model keys, and what the guarantee adds: notes, reasons
    not covered, and whether every client's model now reads its own data (joint DP)."""

    parts: dict[str, Any]
    finetune_results: dict[str, dict[str, Any]] | None
    params: Params | None
    final_models: dict[str, Any]
    notes: tuple[str, ...]
    not_covered: tuple[str, ...]
    own_data: bool
    score_seconds: float = 0.0
    per_client: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
    kept: np.ndarray | None = None
    """``finetune="auto"``: the candidate every client kept (its name), in the clients' order."""
    dropped: bool = False
    """Whether the clients' final models were dropped once scored (``params`` is then None, and
    the per-client scores are in ``per_client``)."""


def _finish_request(
    finetune: str,
    *,
    epochs: int | Sequence[int],
    lrs: Sequence[float] | None,
    lams: Sequence[float] | None,
    start: str,
    select: str,
    extra: Sequence[str],
) -> FinishRequest:
    """Check the fine-tuning settings against ``finetune`` (the run spec's) before any data is
    read; the parameters are ``run_pmtl``'s ``finetune_*`` and ``extra_finetunes``."""
    check_choice("finetune_start", start, FINETUNE_STARTS)
    check_choice("finetune_select", select, (*SELECT_MODES, *FINETUNE_SELECT_CHOICES))
    if select == "auto" and finetune != "auto":
        select = "client"  # an explicit fine-tuning's own grid: every client chooses
    if select == "vote" and finetune != "auto":
        raise InvalidParameterError(
            "finetune_select='vote' elects one candidate of finetune='auto' for every client; "
            f"got finetune={finetune!r}."
        )
    if finetune == "auto":
        fixed = {
            "finetune_epochs": (epochs, 1),
            "finetune_lrs": (lrs, None),
            "finetune_lams": (lams, None),
            "finetune_start": (start, "auto"),
            "finetune_select": (select, select if select in FINETUNE_SELECT_CHOICES else "client"),
        }
        for name, (value, default) in fixed.items():
            if value != default:
                raise InvalidParameterError(
                    f"finetune='auto' chooses its own grid and start; the '{name}' parameter "
                    f"needs an explicit finetune method (e.g. 'vanilla'); got {name}={value!r}."
                )
    grid = epochs_grid(epochs)
    if start != "billboard" and (len(grid) > 1 or select == "pooled"):
        raise InvalidParameterError(
            "A grid of 'finetune_epochs' and finetune_select='pooled' need "
            f"finetune_start='billboard'; got finetune_start={start!r}, "
            f"finetune_epochs={epochs!r}, finetune_select={select!r}."
        )
    if start == "billboard" and (finetune not in ("none", "vanilla") or extra):
        raise InvalidParameterError(
            "finetune_start='billboard' supports finetune='vanilla' only (fine-tuning from the "
            f"billboard, no penalty); got finetune={finetune!r}, "
            f"extra_finetunes={list(extra)!r}."
        )
    for name in extra:
        check_choice("extra_finetunes", name, FINETUNE_METHODS)
    return FinishRequest(
        epochs=tuple(grid),
        lrs=None if lrs is None else tuple(lrs),
        lams=None if lams is None else tuple(lams),
        start=start,
        select=select,
        extra=tuple(extra),
    )


def _load(
    spec: RunSpec,
    method: str | type[Method] | Method,
    request: DataRequest,
    *,
    method_source: dict[str, Any] | None,
    dataset: FederatedDataset | None,
    batched: bool,
    progress: bool,
    threads: int,
    timer: PhaseTimer | None = None,
    device: str = DEFAULT_DEVICE,
    finetune_select: str = "client",
    eval_every: int = EXECUTION.eval_every,
) -> LoadedRun:
    """Load: the user's model factory (before any data is read), the data (``dataset``, or the
    registered data set loaded by the seed), the settings resolved on it, the model, and the
    method bound to the engine configuration with the target ε calibrated to σ once (with
    ``finetune_select="vote"``, the vote's event reserved: :func:`_vote_plan`). ``timer``
    (the run's) measures the ``data`` and ``setup`` phases."""
    timer = PhaseTimer(PMTL_PHASES) if timer is None else timer
    model = request.model
    with timer.phase("setup"):
        factory = load_factory(model) if is_factory_spec(model) else None
    with timer.phase("data"):
        ds = (
            dataset
            if dataset is not None
            else load_federated(
                request.data,
                data_path=request.data_path,
                seed=spec.seed,
                **request.table,
                num_clients=request.num_clients,
                scaling=request.scaling,
            )
        )
    with timer.phase("setup"):
        m = ds.n_clients
        net = make_model(model, ds, spec.seed, factory=factory)
        on = str(resolve_device(device))  # "auto" becomes the device the run computes on
        vote = None
        declared = method_class(method) if isinstance(method, str) else method
        samples = declared.communicates and not declared.every_client
        select = resolve_finetune_select(
            finetune_select, net, finetune=spec.finetune, samples=samples,
            noise_mechanism=spec.noise_mechanism, epsilon=spec.epsilon,
        )  # fmt: skip
        if select == "vote" and samples:
            vote = _vote_plan(spec, m)
            if finetune_select == "auto" and not vote.held:
                vote = None  # the default without a vote: every client's own choice, as asked
        # the one resolution of the run: q, λ, δ, and the target ε calibrated to the release's σ
        execution = {"batched": batched, "progress": progress, "threads": threads, "device": on}
        execution["eval_every"] = eval_every
        run = resolve(
            spec, m, method=method, reserve=None if vote is None else vote.event(),
            execution=execution,
        )  # fmt: skip
        resolved = run.spec
        assert resolved is not None  # resolved from a RunSpec
        runner = get_method(method, run.config).with_run(run)  # bound to the calibrated noise
    if runner.models is not None and model not in runner.models:
        raise InvalidParameterError(
            f"The 'method' parameter {spec.method!r} supports --model "
            f"{', '.join(runner.models)} only; got model={model!r}."
        )
    return LoadedRun(
        spec=spec,
        resolved=resolved,
        request=request,
        dataset=ds,
        net=net,
        method=runner,
        name=spec.method,
        method_source=method_source,
        factory=factory,
        notes=run.notes,
        seconds=timer.seconds("data"),
        vote=vote,
    )


def _vote_plan(spec: RunSpec, m: int) -> VotePlan:
    """The public plan of the end-of-run vote (:func:`~privmtl.privacy.selection.plan_vote`):
    :data:`~privmtl.federated.end_of_run.finish.FINETUNE_VOTE_SHARE` of the target ε, among the ``m``
    clients or, in a larger population, the expected
    :data:`~privmtl.federated.end_of_run.finish.FINETUNE_VOTERS` of them
    (:func:`~privmtl.federated.end_of_run.finish.vote_voters`); a private run needs a target ε (its share
    is of that target)."""
    if spec.epsilon is None and spec.noise_std:
        raise InvalidParameterError(
            "finetune_select='vote' takes its share of a target 'epsilon'; got noise_std="
            f"{spec.noise_std!r} without epsilon."
        )
    delta = pmtl_delta(spec.delta, m)[0]
    return plan_vote(
        min(m, FINETUNE_VOTERS), epsilon=spec.epsilon, delta=delta, share=FINETUNE_VOTE_SHARE,
        accountant=spec.accountant, relation=spec.relation,
    )  # fmt: skip
