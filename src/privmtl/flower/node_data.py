"""A SuperNode's data: what it keeps of the population, and its fingerprint.

A synthetic node keeps a lazy partition of the population (:func:`node_partition`: its clients are
drawn when a round or the end of run needs them, and nothing is cached); a node over other data
keeps its clients in memory, cached once as contiguous tensors that a fresh ClientApp maps
(:func:`node_dataset`). :func:`data_sha256_of` fingerprints either without drawing a lazy one.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np
import torch

from privmtl.data.federated import FederatedDataset
from privmtl.data.federated_dataset import concat_key
from privmtl.data.registry import load_federated
from privmtl.data.streamed import SyntheticFederation
from privmtl.io import arrays_sha256

__all__ = [
    "STREAMED_DATA",
    "data_sha256_of",
    "is_lazy",
    "node_dataset",
    "node_partition",
    "population",
    "table_options",
]


#: The data sets whose population a node builds without drawing or reading its examples, and
#: keeps as a lazy partition of its own clients (:func:`node_partition`): no data cache file,
#: the rounds draw their sampled clients only. Every other data set is read once and cached as
#: contiguous tensors in the node's storage (:func:`node_dataset`); a data set joins this list
#: once its population gives such a ``partition``.
STREAMED_DATA = ("synthetic",)


def node_partition(dataset: FederatedDataset, clients: np.ndarray) -> FederatedDataset | None:
    """The lazy view of ``dataset``'s ``clients`` (positions) that a node keeps, drawing nothing,
    or None for a data set held in memory (its node keeps ``dataset.subset(clients)``)."""
    if isinstance(dataset, SyntheticFederation):
        return dataset.partition(clients)
    return None


def is_lazy(local: FederatedDataset) -> bool:
    """Whether ``local`` draws its clients when they are asked for (:func:`node_partition`):
    it is then never stacked or split whole, only taken or subset a block at a time."""
    return isinstance(local, SyntheticFederation)


def data_sha256_of(local: FederatedDataset) -> str:
    """The fingerprint of a node's data: SHA-256 of its clients' ids and of each split's stacked
    features, labels and offsets (a few arrays, whatever the number of clients); for a lazy
    partition (:func:`node_partition`) the fingerprint of what determines its examples (the
    law, its clients' streams and sizes: :meth:`SyntheticFederation.content_sha256`), drawing
    nothing."""
    if isinstance(local, SyntheticFederation):
        return local.content_sha256()

    parts: list[Any] = [np.frombuffer("\n".join(local.client_ids).encode(), dtype=np.uint8)]
    for split in ("train", "val", "test"):
        x, y, offsets = local.concat(split)
        parts += [x.detach().cpu(), y.detach().cpu(), np.asarray(offsets)]
    return arrays_sha256(parts)


def table_options(opts: dict[str, Any]) -> dict[str, Any]:
    """The keywords of :func:`~privmtl.data.registry.load_federated` that a table's run
    configuration gives (none for another data set)."""
    if str(opts["data"]) != "table":
        return {}
    features = [c.strip() for c in str(opts.get("feature-columns", "")).split(",") if c.strip()]
    return {
        "client_column": str(opts["client-column"]),
        "label_column": str(opts["label-column"]),
        "feature_columns": tuple(features) or None,
        "scaling": str(opts.get("scaling", "")) or None,
    }


@functools.lru_cache(maxsize=2)
def population(
    data: str, data_path: str, seed: int, num_clients: int | None, table: str = "{}"
) -> FederatedDataset:
    """The whole population, loaded once per process (a simulation's actor serves many nodes);
    ``table``: a table's options as JSON (:func:`table_options`)."""
    kw = json.loads(table)
    if kw.get("feature_columns") is not None:
        kw["feature_columns"] = list(kw["feature_columns"])
    return load_federated(
        data, data_path=data_path or None, seed=seed, num_clients=num_clients, **kw
    )


def node_dataset(d: dict[str, Any]) -> FederatedDataset:
    """A node's clients from its cached :meth:`NodeClients.data_state` (``d``: tensors mapped
    from the cache file): each client's tensors are views of the contiguous ones, and the
    dataset's stacked train data is those tensors themselves (nothing is copied)."""
    kw: dict[str, list[torch.Tensor]] = {}
    for s in ("train", "val", "test"):
        sizes = np.diff(d[f"{s}_offsets"].numpy()).tolist()
        kw[f"{s}_x"] = list(torch.split(d[f"{s}_x"], sizes))
        kw[f"{s}_y"] = list(torch.split(d[f"{s}_y"], sizes))
    local = FederatedDataset._unchecked(  # checked when the node cached it
        list(d["client_ids"]), kw, int(d["n_classes"]), tuple(d["feature_shape"]),
        str(d["name"]), str(d.get("scaling", "none")),
    )  # fmt: skip
    xs, ys = local.split("train")
    key = concat_key(xs, ys)
    offsets = d["train_offsets"].numpy().astype(np.int64)
    local._concat_cache["train"] = (key, (d["train_x"], d["train_y"], offsets))
    return local
