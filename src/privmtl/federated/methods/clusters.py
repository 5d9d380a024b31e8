"""Fixed clusters: one private billboard per cluster of clients, each trained with the
configured method (:func:`~privmtl.federated.clusters.train_clusters`; parallel composition)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from privmtl.exceptions import InvalidParameterError
from privmtl.federated.methods.base import Method

if TYPE_CHECKING:
    from privmtl.data.federated import FederatedDataset
    from privmtl.federated.config import TrainResult

__all__ = ["Clusters"]


class Clusters(Method):
    """A whole-run method: ``config.method`` on every cluster of ``clusters`` separately."""

    name: ClassVar[str] = "clusters"
    in_runs: ClassVar[bool] = False
    in_engine: ClassVar[bool] = False

    def fit(self, dataset: FederatedDataset, model: Any, **run: Any) -> TrainResult:
        """:func:`~privmtl.federated.clusters.train_clusters` with ``run``'s ``clusters`` (one
        label per client, or lists of client indices), ``target_epsilon`` and
        ``clients_per_cluster``."""
        from privmtl.federated.clusters import train_clusters

        if "clusters" not in run:
            raise InvalidParameterError(
                "The 'clusters' parameter is required by the clusters method; got none."
            )
        return train_clusters(
            dataset,
            model,
            self.config,
            run["clusters"],
            target_epsilon=run.get("target_epsilon"),
            clients_per_cluster=run.get("clients_per_cluster"),
        )
