"""The output paths, data sets and mutants of the mediation audit (:mod:`privmtl.audit.mediation`).

Each :class:`CheckSpec` names one output path: a ``privmtl pmtl`` or ``privmtl mpmtl`` command
line, or a library call (``runner(workspace, replaced)``). :func:`make_tables` and
:func:`make_tasks` build the data sets ``D`` and their neighbours; :data:`MUTANTS` inject known
leaks into the real code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch

from privmtl.data.federated_table import load_federated_table
from privmtl.federated.clusters import train_clusters
from privmtl.federated.config import TrainConfig
from privmtl.federated.end_of_run import finetune_selection, local
from privmtl.federated.models import MultinomialLogReg
from privmtl.federated.scoring import client_scores
from privmtl.federated.workshop import train_workshop
from privmtl.flower._core import run_options
from privmtl.flower.node_clients import NodeClients
from privmtl.flower.server_run import ServerRun
from privmtl.io import to_jsonable
from privmtl.linear import mpmtl
from privmtl.linear.methods import linear_method, method_names
from privmtl.privacy import release as rel

__all__ = [
    "MUTANTS",
    "NUM_CLIENTS",
    "REPLACED",
    "CheckSpec",
    "Workspace",
    "check_specs",
    "make_tables",
    "make_tasks",
    "task_frame",
]

NUM_CLIENTS = 6
REPLACED = 0
_FEATURES = 5
_CLASSES = 3


# ----------------------------------------------------------------------------------- data
def make_tables(seed: int = 0) -> tuple[Any, Any, Any]:
    """The federated table ``D``, its neighbour ``D'`` and ``D''`` (client 0's labels replaced).

    Every client has its own linear labelling rule and feature shift; client ``c0`` has ten
    times the rows of the others. In ``D'`` its labels are drawn at random and its features
    multiplied by −3: a client whose best training length and step size differ from the
    original's, with large gradients, weighing most in any pooled validation accuracy. ``D''``
    replaces client 0's labels only (other random labels, the original features). Every
    class occurs in every client's data in every table (the number of classes is read from the
    labels).
    """
    import pandas as pd

    rng = np.random.default_rng(seed)
    base = rng.normal(size=(_FEATURES, _CLASSES))
    frames, replaced, relabelled = [], None, None
    for k in range(NUM_CLIENTS):
        n = 300 if k == REPLACED else 30
        X = rng.normal(size=(n, _FEATURES)) + 0.5 * rng.normal()
        W = base + 0.7 * rng.normal(size=(_FEATURES, _CLASSES))
        y = np.argmax(X @ W, axis=1)
        y[:_CLASSES] = np.arange(_CLASSES)  # every class present
        frame = pd.DataFrame(X, columns=[f"x{j}" for j in range(_FEATURES)])
        frame.insert(0, "client", f"c{k}")
        frame["label"] = y
        frames.append(frame)
        if k == REPLACED:
            other = frame.copy()
            other[[f"x{j}" for j in range(_FEATURES)]] = -3.0 * X
            noise = rng.integers(0, _CLASSES, size=n)
            noise[:_CLASSES] = np.arange(_CLASSES)
            other["label"] = noise
            replaced = other
            relabelled = frame.copy()
            labels = np.random.default_rng([seed, 1]).integers(0, _CLASSES, size=n)
            labels[:_CLASSES] = np.arange(_CLASSES)
            relabelled["label"] = labels
    assert replaced is not None and relabelled is not None
    D = pd.concat(frames, ignore_index=True)
    D2 = pd.concat([replaced, *frames[1:]], ignore_index=True)
    D3 = pd.concat([relabelled, *frames[1:]], ignore_index=True)
    return D, D2, D3


def _federated(path: Path) -> Any:
    # The API paths read the table as given: D''s feature scale (x -3 on client c0) is what makes
    # a pooled choice flip; the command-line paths use the default per-client standardization.
    return load_federated_table(path, client_column="client", label_column="label", scaling="none")


def make_tasks(seed: int, replaced: bool) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Regression tasks for the MP-MTL family; task 0 replaced by a rank-one, large-target task.

    Rows are scaled to norm at most 1 (the MP-MTL protocol); in ``D'`` every row of task 0 is
    the same unit vector (its Lipschitz constant is the largest possible, 1) with targets 5.
    """
    rng = np.random.default_rng(seed)
    d, m = 8, NUM_CLIENTS
    U = rng.normal(size=(d, 2))
    Xs, ys = [], []
    for i in range(m):
        n = 25
        X = rng.normal(size=(n, d))
        X /= np.linalg.norm(X, axis=1, keepdims=True) * np.sqrt(2.0)
        w = U @ rng.normal(size=2)
        y = X @ w + 0.05 * rng.normal(size=n)
        if replaced and i == REPLACED:
            v = np.ones(d) / np.sqrt(d)
            X = np.tile(v, (n, 1))
            y = np.full(n, 5.0)
        Xs.append(X)
        ys.append(y)
    return Xs, ys


def task_frame(Xs: Sequence[np.ndarray], ys: Sequence[np.ndarray]) -> Any:
    import pandas as pd

    frames = []
    for i, (X, y) in enumerate(zip(Xs, ys, strict=True)):
        frame = pd.DataFrame(X, columns=[f"x{j}" for j in range(X.shape[1])])
        frame.insert(0, "task", f"c{i}")
        frame["y"] = y
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


@dataclass(frozen=True)
class CheckSpec:
    """One audited output path: its check name, how to run it, and who fixes it if broken.

    ``kind`` is ``"cli"`` (``args`` of ``privmtl pmtl`` after the data options) or ``"api"``
    (``runner(work, replaced)`` returns ``(client ids, stacked per-client tensors, per-client
    numbers, whole tensors)``). ``mediated_by`` names the default choice that makes the path mediated
    (empty: mediated by construction). ``json_diagnostics`` also compares the
    un-noised diagnostics keys. ``neighbour`` is ``"data"`` (``D'``) or ``"labels"`` (``D''``,
    :func:`make_tables`); ``files_only`` restricts the comparison to these saved files;
    ``command`` is ``"pmtl"`` (the classification table) or ``"mpmtl"`` (the regression tasks of
    :func:`make_tasks` as a table).
    """

    name: str
    kind: str
    args: tuple[str, ...] = ()
    runner: Callable[[Any, bool], Any] | None = None
    mediated_by: str = ""
    json_diagnostics: bool = False
    neighbour: str = "data"
    files_only: tuple[str, ...] = ()
    command: str = "pmtl"


class Workspace:
    """Temporary files of one audit: the two tables and the run directories."""

    def __init__(self, root: Path, seed: int) -> None:
        self.root = root
        self.seed = seed
        D, D2, D3 = make_tables(seed)
        self.table_a, self.table_b = root / "D.csv", root / "D_prime.csv"
        self.table_labels = root / "D_labels.csv"
        D.to_csv(self.table_a, index=False)
        D2.to_csv(self.table_b, index=False)
        D3.to_csv(self.table_labels, index=False)
        self.tasks_a, self.tasks_b = root / "tasks.csv", root / "tasks_prime.csv"
        for path, replaced in ((self.tasks_a, False), (self.tasks_b, True)):
            task_frame(*make_tasks(seed, replaced)).to_csv(path, index=False)
        self._data: dict[bool, Any] = {}

    def table(self, replaced: bool, neighbour: str = "data", command: str = "pmtl") -> Path:
        if command == "mpmtl":
            return self.tasks_b if replaced else self.tasks_a
        if not replaced:
            return self.table_a
        return self.table_labels if neighbour == "labels" else self.table_b

    def dataset(self, replaced: bool) -> Any:
        if replaced not in self._data:
            self._data[replaced] = _federated(self.table(replaced))
        return self._data[replaced]


# ----------------------------------------------------------------------------------- API paths
def _model(ds: Any, seed: int) -> torch.nn.Module:
    return MultinomialLogReg(ds.n_features, ds.n_classes, random_state=seed)


def _per_client_numbers(model: torch.nn.Module, params: dict[str, Any], ds: Any) -> dict[str, Any]:
    """Per-client correct counts and losses of stacked models on validation and test."""
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    out: dict[str, Any] = {}
    for split in ("val", "test"):
        xs, ys = ds.split(split)
        correct, loss = client_scores(model, params, buffers, xs, ys)
        out[f"{split}_correct"] = [float(v) for v in correct]
        out[f"{split}_loss"] = [float(v) for v in loss]
    return out


def _train_result_outputs(result: Any, model: torch.nn.Module, ds: Any) -> Any:
    params = result.personalized_params
    if params is None:  # a global method: every client's output is the released model
        m = len(result.client_ids)
        params = {n: p.unsqueeze(0).expand(m, *p.shape) for n, p in result.global_params.items()}
    numbers = _per_client_numbers(model, params, ds)
    numbers["extra"] = to_jsonable(result.extra)
    return list(result.client_ids), params, numbers, dict(result.global_params)


def _config(**kw: Any) -> Any:
    base: dict[str, Any] = {
        "method": "pmtl",
        "rounds": 3,
        "clients_per_round": 5,
        "batch_size": 10,
        "lr": 0.1,
        "lam": 0.1,
        "clip": 0.5,
        "noise_std": 0.2,
        "seed": 0,
        "progress": False,
        "threads": 1,
        "noise_source": "seeded",
        "server_update": "offset",
        "personal_init": "model",
    }
    base.update(kw)
    return TrainConfig(**base)


def _run_local_client(ctx: Workspace, replaced: bool) -> Any:
    ds = ctx.dataset(replaced)
    model = _model(ds, ctx.seed)
    res = local.train_local(
        ds, model, epochs=(1, 3, 10, 30), lrs=(0.01, 0.1), select="client", seed=ctx.seed
    )
    return _train_result_outputs(res, model, ds)


def _run_clusters(ctx: Workspace, replaced: bool) -> Any:
    ds = ctx.dataset(replaced)
    model = _model(ds, ctx.seed)
    labels = [k % 2 for k in range(ds.n_clients)]
    res = train_clusters(ds, model, _config(clients_per_round=4), labels)
    ids, params, numbers, _ = _train_result_outputs(res, model, ds)
    return ids, params, numbers, {}  # one billboard per cluster: compared through the models


def _run_workshop(ctx: Workspace, replaced: bool) -> Any:
    ds = ctx.dataset(replaced)
    model = _model(ds, ctx.seed)
    res = train_workshop(ds, model, _config(), bound=2.0, noise_std=0.2)
    return _train_result_outputs(res, model, ds)


def _run_flower_node(ctx: Workspace, replaced: bool) -> Any:
    """Two Flower nodes' client steps (NodeClients) under the server's curator, in process."""
    ds = ctx.dataset(replaced)
    model = _model(ds, ctx.seed)
    opts = run_options(
        {
            "rounds": 3,
            "clients-per-round": 5,
            "noise-std": 0.2,
            "seed": ctx.seed,
            "noise-source": "seeded",
            "server-update": "ditto",
        }
    )
    nodes = [NodeClients(ds, model, partition_id=p, num_partitions=2) for p in range(2)]
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    server = ServerRun(opts, init, ds.n_clients)
    for t in range(server.config.rounds):
        sampled = server.curator.sample_round()
        messages: dict[int, dict[str, torch.Tensor]] = {}
        losses: dict[int, float] = {}
        for node in nodes:
            mine = [int(k) for k in sampled if int(k) in node.pos]
            msgs, loss = node.train(mine, server.curator.billboard, t, server.config, f"r{t}")
            for j, k in enumerate(mine):
                messages[k] = {n: v[j] for n, v in msgs.items()}
                losses[k] = loss[j]
        server.release(sampled, messages, losses, 0.0)
    ids: list[str] = [ds.client_ids[k] for k in range(ds.n_clients)]
    params = {
        n: torch.stack([node.model_of(k)[n] for node in nodes for k in node.clients.tolist()])
        for n in init
    }
    order = [int(k) for node in nodes for k in node.clients.tolist()]
    params = {n: p[np.argsort(order)] for n, p in params.items()}
    numbers: dict[str, Any] = {}
    for node in nodes:  # with each node's end of the run (finetune="auto" by default)
        scores = node.evaluate(server.curator.billboard, server.finish_settings())
        for key, values in scores.items():
            if not isinstance(values, list):  # public grids, not per client
                continue
            numbers.setdefault(key, {}).update(
                {ds.client_ids[int(k)]: v for k, v in zip(node.clients, values, strict=True)}
            )
    return ids, params, numbers, dict(server.curator.billboard)


def _mpmtl_runner(name: str, *, step_size: float | None) -> Callable[[Workspace, bool], Any]:
    def run(ctx: Workspace, replaced: bool) -> Any:
        method = linear_method(name)
        Xs, ys = make_tasks(ctx.seed, replaced)
        # the paper's iteration (zero start, projected output), where the step size acts; the
        # default one-release refit of a method with an output rule takes no gradient step
        paper = {} if not method.output_rule else {
            "init": "zeros", "refit_lam": None, "eigen_fix": "shift",
        }  # fmt: skip
        est = method.make(
            epsilon=2.0,
            delta=1e-5,
            iterations=5,
            lam=0.1,
            **paper,
            step_size=step_size,
            random_state=ctx.seed,
            noise_source="seeded",
        ).fit(Xs, ys)
        ids = [f"c{i}" for i in range(len(Xs))]
        coef = torch.from_numpy(np.ascontiguousarray(np.asarray(est.coef_).T))
        numbers = {
            "train_mse": [
                float(np.mean((X @ est.coef_[:, i] - y) ** 2))
                for i, (X, y) in enumerate(zip(Xs, ys, strict=True))
            ]
        }
        return ids, {"coef": coef}, numbers, {}

    return run


# ----------------------------------------------------------------------------------- the paths
#: The default choices that make a path mediated; a check marked with one fails without it.
FIX_FINETUNE_AUTO = "--finetune auto: per-client or private selection"
FIX_LOCAL_ALL = "local-all: every client selects on its own validation split"
FIX_DIAGNOSTICS = "curator diagnostics: off the default JSON"
FIX_MPMTL_STEP = "MP-MTL step size: per task or from public quantities"
FIX_LINEAR_TUNING = "STL/MTL tuning: per task or by a private selection"


def check_specs() -> list[CheckSpec]:
    """Every audited output path, in the order of the report."""
    return [*_pmtl_cli_specs(), *_mpmtl_cli_specs(), *_api_specs()]


def _pmtl_cli_specs() -> list[CheckSpec]:
    """The paths of ``privmtl pmtl``: every end of run, option and method."""
    return [
        CheckSpec("pmtl --finetune none", "cli", ("--finetune", "none")),
        CheckSpec("pmtl --finetune vanilla", "cli", ("--finetune", "vanilla")),
        *(
            CheckSpec(
                f"pmtl --finetune {mode} (per-client grid)",
                "cli",
                (
                    "--finetune",
                    mode,
                    "--finetune-lrs",
                    "0.03,0.1",
                    "--finetune-lams",
                    "0.01,1",
                    "--finetune-select",
                    "client",
                ),
            )
            for mode in ("mr", "skl", "ewc")
        ),
        CheckSpec(
            "pmtl --finetune vanilla --finetune-start billboard (client selection)",
            "cli",
            (
                "--finetune",
                "vanilla",
                "--finetune-start",
                "billboard",
                "--finetune-epochs",
                "1,3",
                "--finetune-lrs",
                "0.03,0.1",
                "--finetune-select",
                "client",
            ),
        ),
        CheckSpec(
            "pmtl default (--finetune auto, billboard with signal)",
            "cli",
            ("--noise-std", "0.02"),
            mediated_by=FIX_FINETUNE_AUTO,
        ),
        CheckSpec(
            # ε = 100: the vote's noise std (5 % of ε) is under m / 4 for the audit's 6 clients
            "pmtl --finetune auto --finetune-select vote (recorded vote)",
            "cli",
            ("--finetune-select", "vote", "--epsilon", "100"),
        ),
        CheckSpec(
            "pmtl JSON: no un-noised curator diagnostics (--finetune none)",
            "cli",
            ("--finetune", "none"),
            mediated_by=FIX_DIAGNOSTICS,
            json_diagnostics=True,
        ),
        *(
            CheckSpec(f"pmtl {' '.join(opts)}", "cli", (*opts, "--finetune", "none"))
            for opts in (
                ("--adaptive-clip-quantile", "0.5", "--adaptive-clip-noise", "2"),
                ("--subspace-dim", "8"),
                ("--server-optimizer", "adam", "--server-update", "offset"),
                (
                    "--personal-init",
                    "billboard",
                    "--sampling",
                    "fixed",
                    "--relation",
                    "replace-one",
                    "--rounds",
                    "4",  # seed 0 leaves c0 out of the first three fixed-size samples
                    "--noise-std",
                    "0.1",  # calibrating ε for sampling without replacement is slow
                ),
            )
        ),
        CheckSpec("pmtl --method fedavg", "cli", ("--method", "fedavg", "--finetune", "none")),
        CheckSpec(
            "pmtl --method fedprox",
            "cli",
            ("--method", "fedprox", "--lam", "0.01", "--finetune", "none"),
        ),
        CheckSpec("pmtl --method local", "cli", ("--method", "local", "--finetune", "none")),
        CheckSpec("pmtl --method joint-dp", "cli", ("--method", "joint-dp", "--finetune", "none")),
        CheckSpec("pmtl --method pp-sgd", "cli", ("--method", "pp-sgd", "--finetune", "none")),
        CheckSpec(
            "pmtl --method fedrep (finetune auto)",
            "cli",
            ("--method", "fedrep", "--shared-params", "linear.weight", "--head-epochs", "1"),
        ),
        CheckSpec(
            "pmtl --method local-all", "cli", ("--method", "local-all"), mediated_by=FIX_LOCAL_ALL
        ),
        CheckSpec(
            "local-all --save-models, c0's labels replaced: others' personalized.pt bit-identical",
            "cli",
            ("--method", "local-all"),
            mediated_by=FIX_LOCAL_ALL,
            neighbour="labels",
            files_only=("personalized.pt",),
        ),
    ]


def _mpmtl_cli_specs() -> list[CheckSpec]:
    """The paths of ``privmtl mpmtl``: its default step size and its tuning."""
    return [
        CheckSpec(
            "mpmtl --method lowrank --no-tune (default step size)",
            "cli",
            ("--method", "lowrank", "--no-tune", "--iterations", "5"),
            mediated_by=FIX_MPMTL_STEP,
            command="mpmtl",
        ),
        CheckSpec(
            "mpmtl --method lowrank (default: k-fold CV tuning)",
            "cli",
            ("--method", "lowrank"),
            mediated_by=FIX_LINEAR_TUNING,
            command="mpmtl",
        ),
    ]


def _api_specs() -> list[CheckSpec]:
    """The paths of the Python API: the federated trainers, Flower's node and MP-MTL."""
    return [
        CheckSpec("train_local(select='client')", "api", runner=_run_local_client),
        CheckSpec("train_clusters (two fixed clusters)", "api", runner=_run_clusters),
        CheckSpec("train_workshop", "api", runner=_run_workshop),
        CheckSpec(
            "Flower NodeClients client step and end of run (2 nodes, in process)",
            "api",
            runner=_run_flower_node,
        ),
        *(
            CheckSpec(
                f"MP-MTL {name} (public step size)",
                "api",
                runner=_mpmtl_runner(name, step_size=0.5),
            )
            for name in method_names(protocol=True)
        ),
        CheckSpec(
            "MP-MTL lowrank (default step size)",
            "api",
            runner=_mpmtl_runner("lowrank", step_size=None),
            mediated_by=FIX_MPMTL_STEP,
        ),
    ]


# ----------------------------------------------------------------------------------- mutants
@contextlib.contextmanager
def _mutant_pooled_selection() -> Iterator[None]:
    """Every per-client selection becomes one pooled choice (train_local, finetune_select)."""
    train_local, finetune_select = local.train_local, finetune_selection.finetune_select

    def pooled_local(*args: Any, **kw: Any) -> Any:
        kw["select"] = "pooled"
        return train_local(*args, **kw)

    def pooled_finetune(*args: Any, **kw: Any) -> Any:
        kw["select"] = "pooled"
        return finetune_select(*args, **kw)

    with (
        mock.patch.object(local, "train_local", pooled_local),
        mock.patch.object(finetune_selection, "finetune_select", pooled_finetune),
    ):
        yield


@contextlib.contextmanager
def _mutant_global_step() -> Iterator[None]:
    """MP-MTL's step size from the largest Lipschitz constant over all tasks' raw features."""
    fit_batch = mpmtl._MPMTLBase._fit_batch

    def global_step(self: Any, prepared: Any, p: dict[str, Any]) -> None:
        p = dict(p)
        p["step_size"] = 1.0 / (2.0 * float(prepared.lipschitz(p["mu"])))
        fit_batch(self, prepared, p)

    with mock.patch.object(mpmtl._MPMTLBase, "_fit_batch", global_step):
        yield


@contextlib.contextmanager
def _mutant_unnoised_diagnostic() -> Iterator[None]:
    """The clients receive an un-noised diagnostic: every release is rescaled by the signal norm
    of the clipped mean (block releases: by the curator's sum of message norms)."""
    release, blocks = rel.GaussianMeanRelease.release, rel.GaussianMeanRelease.release_blocks

    def leak(out: Any, diagnostic: float) -> Any:
        out.value = {n: v * (1.0 + diagnostic) for n, v in out.value.items()}
        return out

    def leaky(self: Any, *args: Any, **kw: Any) -> Any:
        out = release(self, *args, **kw)
        return leak(out, float(out.details.get("signal_norm", 0.0)))

    def leaky_blocks(self: Any, *args: Any, **kw: Any) -> Any:
        out = blocks(self, *args, **kw)
        return leak(out, float(np.sum(out.norms)))

    with (
        mock.patch.object(rel.GaussianMeanRelease, "release", leaky),
        mock.patch.object(rel.GaussianMeanRelease, "release_blocks", leaky_blocks),
    ):
        yield


#: name -> (what it re-introduces, context manager that injects it)
MUTANTS: dict[str, tuple[str, Callable[[], contextlib.AbstractContextManager[None]]]] = {
    "pooled-selection": (
        "per-client selections (train_local, finetune_select) replaced by one pooled choice",
        _mutant_pooled_selection,
    ),
    "global-step-size": (
        "MP-MTL step size 1/(2 max_i L_i) from every task's features",
        _mutant_global_step,
    ),
    "unnoised-diagnostic": (
        "the un-noised signal norm of the clipped mean reaches the clients (billboard rescaled)",
        _mutant_unnoised_diagnostic,
    ),
}
