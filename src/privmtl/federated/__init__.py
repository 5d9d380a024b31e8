"""federated."""

from privmtl.federated.baselines import config_for_epsilon, train_joint_dp, train_pp_sgd
from privmtl.federated.clusters import ClusteredTrainResult, train_clusters
from privmtl.federated.finetune import FINETUNE_METHODS, finetune
from privmtl.federated.workshop import train_workshop

__all__ = [
    "FINETUNE_METHODS",
    "ClusteredTrainResult",
    "config_for_epsilon",
    "finetune",
    "train_clusters",
    "train_joint_dp",
    "train_pp_sgd",
    "train_workshop",
]
