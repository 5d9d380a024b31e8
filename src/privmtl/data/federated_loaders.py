"""The loaders of the PMTL family's registered data sets (:data:`~privmtl.data.registry.REGISTRY`
names each by ``"module:function"``): they build torch-backed federations, so this module is
imported when one of these data sets is loaded, not with the registry, which the CLI reads at
start-up without loading torch."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from privmtl.data.federated import load_leaf
from privmtl.data.federated_dataset import FederatedDataset
from privmtl.data.federated_table import DEFAULT_CLIENT_SCALING, load_federated_table
from privmtl.data.readers import FEMNIST_ENV_VAR, default_femnist_dir
from privmtl.data.streamed import SyntheticFederation
from privmtl.exceptions import DataFormatError

__all__ = ["load_leaf_data", "load_synthetic", "load_table"]


def load_leaf_data(*, seed: int, data_path: str | Path | None = None) -> FederatedDataset:
    path = Path(data_path) if data_path is not None else default_femnist_dir()
    if not path.is_dir():
        raise DataFormatError(
            f"LEAF FEMNIST directory not found: {path} (pass --data-path or set {FEMNIST_ENV_VAR})."
        )
    return load_leaf(path, random_state=seed)


def load_synthetic(*, seed: int, num_clients: int | None = None) -> FederatedDataset:
    # the clients are drawn when needed (the same data as make_synthetic_federated's)
    if num_clients is None:
        return SyntheticFederation(random_state=seed)
    return SyntheticFederation(n_clients=num_clients, random_state=seed)


def load_table(
    *,
    seed: int,
    data_path: str | Path,
    client_column: str,
    label_column: str,
    feature_columns: Sequence[str] | None = None,
    scaling: str | None = None,
) -> FederatedDataset:
    return load_federated_table(
        data_path,
        client_column=client_column,
        label_column=label_column,
        feature_columns=feature_columns,
        random_state=seed,
        scaling=DEFAULT_CLIENT_SCALING if scaling is None else scaling,
    )
