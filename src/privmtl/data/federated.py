"""Federated (one client = one task) classification data: LEAF reader and synthetic generator.

A :class:`FederatedDataset` holds, for each of ``m`` clients, train / validation / test tensors
(features ``float32`` of shape ``(n, d)``, labels ``int64`` of shape ``(n,)``). Images are stored
flattened row by row (``d = 784`` for FEMNIST) and :attr:`FederatedDataset.feature_shape` says how
to reshape them (``(1, 28, 28)``); models reshape themselves.

Two sources:

* :func:`load_leaf` reads LEAF's JSON shards (``path/train/*.json[.gz]`` and
  ``path/test/*.json[.gz]``), keeps the writers present in both splits, carves a seeded per-client
  validation split out of each writer's training data, and caches the parsed arrays outside the
  repository as memory-mapped ``.npy`` files (parsing FEMNIST's JSON takes seconds, opening the
  cache reads no example: a writer's rows are read when asked for).
* :func:`make_synthetic_federated` draws a heterogeneous federated problem in the spirit of LEAF's
  ``synthetic(alpha, beta)`` (Li et al., FedProx): per-client softmax models scattered around a
  shared one, per-client feature shifts and unequal client sizes, so that both federation (shared
  part) and personalization (client part) help.
"""

from privmtl.data.federated_dataset import FederatedDataset
from privmtl.data.leaf import default_cache_dir, load_leaf
from privmtl.data.synthetic_federated import (
    FEATURE_COVS,
    LEAF_SIZE_BOUNDS,
    LEAF_SIZE_LOGNORMAL,
    SYNTHETIC_STREAM,
    SyntheticLaw,
    make_synthetic_federated,
    synthetic_client_ids,
    synthetic_client_sizes,
    synthetic_law,
)

__all__ = [
    "FEATURE_COVS",
    "LEAF_SIZE_BOUNDS",
    "LEAF_SIZE_LOGNORMAL",
    "SYNTHETIC_STREAM",
    "FederatedDataset",
    "SyntheticLaw",
    "default_cache_dir",
    "load_leaf",
    "make_synthetic_federated",
    "synthetic_client_ids",
    "synthetic_client_sizes",
    "synthetic_law",
]
