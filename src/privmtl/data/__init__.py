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

__all__ = [
    "MultiTaskDataset",
    "dataset_from_frame",
    "default_school_path",
    "load_malsar_mat",
    "load_school",
    "lowrank_task_covariance",
    "make_anomaly_tasks",
    "make_groupsparse_tasks",
    "make_lowrank_tasks",
    "make_tasks_from_coef",
    "read_table",
]
