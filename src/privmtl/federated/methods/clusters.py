"""Fixed clusters: one private billboard per cluster of clients, each trained with the
configured method (:func:`~privmtl.federated.clusters.train_clusters`; parallel composition)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from privmtl.federated.methods.base import Method

if TYPE_CHECKING:
    pass

__all__ = ["Clusters"]


class Clusters(Method):
    """A whole-run method: ``config.method`` on every cluster of ``clusters`` separately."""

    name: ClassVar[str] = "clusters"
    in_runs: ClassVar[bool] = False
    in_engine: ClassVar[bool] = False
