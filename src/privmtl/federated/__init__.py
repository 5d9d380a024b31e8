"""Federated training on PyTorch: PMTL (private mean-regularized MTL) and its baselines.

``train(dataset, model, config)`` runs Algorithm 1 of Hu, Wu & Smith (``method="pmtl"``) or the
baselines ``"fedavg"``, ``"fedprox"`` and ``"local"`` with all sampled clients trained together
(``torch.func``); see :mod:`privmtl.federated.engine`.
"""

from privmtl.federated.baselines import config_for_epsilon, train_joint_dp, train_pp_sgd
from privmtl.federated.clusters import ClusteredTrainResult, train_clusters
from privmtl.federated.config import METHODS, TrainConfig, TrainResult
from privmtl.federated.engine import train
from privmtl.federated.finetune import FINETUNE_METHODS, finetune
from privmtl.federated.finetune_selection import finetune_select
from privmtl.federated.models import FemnistCNN, MultinomialLogReg, count_parameters
from privmtl.federated.workshop import train_workshop

__all__ = [
    "FINETUNE_METHODS",
    "METHODS",
    "ClusteredTrainResult",
    "FemnistCNN",
    "MultinomialLogReg",
    "TrainConfig",
    "TrainResult",
    "config_for_epsilon",
    "count_parameters",
    "finetune",
    "finetune_select",
    "train",
    "train_clusters",
    "train_joint_dp",
    "train_pp_sgd",
    "train_workshop",
]
