"""Multi-task datasets: containers, readers and synthetic generators."""

from privmtl.data.multitask import MultiTaskDataset
from privmtl.data.readers import (
    dataset_from_frame,
    default_school_path,
    load_malsar_mat,
    load_school,
    read_table,
)
from privmtl.data.synthetic import (
    lowrank_task_covariance,
    make_anomaly_tasks,
    make_groupsparse_tasks,
    make_lowrank_tasks,
    make_tasks_from_coef,
)

# Federated (PyTorch) names are loaded lazily so that `import privmtl.data` does not import torch.
_FEDERATED = ("FederatedDataset", "load_leaf", "make_synthetic_federated")


def __getattr__(name: str) -> object:
    if name in _FEDERATED:
        from privmtl.data import federated

        return getattr(federated, name)
    raise AttributeError(f"module 'privmtl.data' has no attribute {name!r}")


__all__ = [
    "FederatedDataset",
    "MultiTaskDataset",
    "dataset_from_frame",
    "default_school_path",
    "load_leaf",
    "load_malsar_mat",
    "load_school",
    "lowrank_task_covariance",
    "make_anomaly_tasks",
    "make_groupsparse_tasks",
    "make_lowrank_tasks",
    "make_synthetic_federated",
    "make_tasks_from_coef",
    "read_table",
]
