"""Run a method object: the layer above the backends and the whole runs.

A method (:mod:`privmtl.federated.methods`) is the lowest layer of the engine: its declarations,
its server half and its client half, importing no backend. The in-process backend
(:class:`~privmtl.federated.trainer.Trainer`) runs those halves round by round. The whole-run
methods have loops of their own, which live here, above the backends they drive: joint-dp and
pp-sgd (their own server around the backend, :mod:`privmtl.federated.baselines`), local-all (every
client alone, :func:`~privmtl.federated.end_of_run.local.train_local`) and clusters (one billboard
per cluster, :func:`~privmtl.federated.clusters.train_clusters`). The loop is chosen by the
method's class (a subclass runs its parent's loop); a user's method may bring its own as a
``fit(dataset, model, **run)`` method.
"""

from __future__ import annotations

import functools
from typing import Any

from privmtl.data.federated import FederatedDataset
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.baselines import train_joint_dp, train_pp_sgd
from privmtl.federated.clusters import train_clusters
from privmtl.federated.config import TrainResult
from privmtl.federated.end_of_run import local as end_of_run_local
from privmtl.federated.methods import PPSGD, Clusters, JointDP, LocalAll, Method
from privmtl.federated.trainer import Trainer

__all__ = ["fit", "runs_rounds"]


def fit(method: Method, dataset: FederatedDataset, model: Any, **run: Any) -> TrainResult:
    """Run ``method`` on ``dataset`` from ``model``'s parameters and return its result.

    A method the engine runs round by round is handed to the in-process backend
    (:class:`~privmtl.federated.trainer.Trainer`) with ``run`` (checkpointing, budget, ...); like
    :func:`~privmtl.federated.engine.train` it raises on an exceeded budget unless
    ``on_budget="stop"``. A whole-run method runs its own loop with ``run``'s options.
    """
    own = getattr(method, "fit", None)
    if callable(own):  # a user's method with a loop of its own
        result: TrainResult = own(dataset, model, **run)
        return result
    return _whole_run(method, dataset, model, **run)


def runs_rounds(method: Method) -> bool:
    """Whether the in-process backend runs ``method`` as it is, round by round (no loop of its
    own)."""
    own = getattr(method, "fit", None)
    return not callable(own) and _whole_run.dispatch(type(method)) is _whole_run.dispatch(Method)


@functools.singledispatch
def _whole_run(method: Method, dataset: FederatedDataset, model: Any, **run: Any) -> TrainResult:
    run.setdefault("on_budget", "raise")
    return Trainer(dataset, model, method.settings(), method=method, **run).run()


@_whole_run.register
def _joint_dp(method: JointDP, dataset: FederatedDataset, model: Any, **run: Any) -> TrainResult:
    return train_joint_dp(dataset, model, method.settings(), **run)


@_whole_run.register
def _pp_sgd(method: PPSGD, dataset: FederatedDataset, model: Any, **run: Any) -> TrainResult:
    return train_pp_sgd(dataset, method.settings(), **run)


@_whole_run.register
def _local_all(method: LocalAll, dataset: FederatedDataset, model: Any, **run: Any) -> TrainResult:
    """:func:`~privmtl.federated.end_of_run.local.train_local` (``run``'s ``local_select``,
    ``local_solver`` and ``local_patience``; no rounds, no checkpoint)."""
    cfg = method.config
    # through its module: the mediation audit's mutants replace it there
    return end_of_run_local.train_local(
        dataset,
        model,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        select=run.get("local_select", "client"),
        solver=run.get("local_solver", "sgd"),
        patience=run.get("local_patience"),
        device=cfg.device,
        workers=cfg.threads,
    )


@_whole_run.register
def _clusters(method: Clusters, dataset: FederatedDataset, model: Any, **run: Any) -> TrainResult:
    """:func:`~privmtl.federated.clusters.train_clusters` with ``run``'s ``clusters`` (one label
    per client, or lists of client indices), ``target_epsilon`` and ``clients_per_cluster``."""
    if "clusters" not in run:
        raise InvalidParameterError(
            "The 'clusters' parameter is required by the clusters method; got none."
        )
    return train_clusters(
        dataset,
        model,
        method.config,
        run["clusters"],
        target_epsilon=run.get("target_epsilon"),
        clients_per_cluster=run.get("clients_per_cluster"),
    )
