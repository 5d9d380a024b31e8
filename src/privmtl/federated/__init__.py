"""Federated training on PyTorch: PMTL (private mean-regularized MTL) and its baselines.

``train(dataset, model, config)`` runs Algorithm 1 of Hu, Wu & Smith (``method="pmtl"``) or the
baselines ``"fedavg"``, ``"fedprox"`` and ``"local"`` with all sampled clients trained together
(``torch.func``); see :mod:`privmtl.federated.engine`. Every method is an object
(:mod:`privmtl.federated.methods`); bring your own by subclassing
:class:`~privmtl.federated.methods.base.Method`.
"""

from privmtl.federated.baselines import config_for_epsilon, train_joint_dp, train_pp_sgd
from privmtl.federated.clusters import ClusteredTrainResult, train_clusters
from privmtl.federated.config import TrainConfig, TrainResult
from privmtl.federated.end_of_run.finetune import FINETUNE_METHODS, finetune
from privmtl.federated.end_of_run.finetune_selection import finetune_select
from privmtl.federated.engine import train
from privmtl.federated.methods import ENGINE_METHODS as METHODS
from privmtl.federated.methods import Method, get_method
from privmtl.federated.models import FemnistCNN, MultinomialLogReg, count_parameters
from privmtl.federated.store import ClientStore
from privmtl.federated.workshop import train_workshop

__all__ = [
    "FINETUNE_METHODS",
    "METHODS",
    "ClientStore",
    "ClusteredTrainResult",
    "FemnistCNN",
    "Method",
    "MultinomialLogReg",
    "TrainConfig",
    "TrainResult",
    "config_for_epsilon",
    "count_parameters",
    "finetune",
    "finetune_select",
    "get_method",
    "train",
    "train_clusters",
    "train_joint_dp",
    "train_pp_sgd",
    "train_workshop",
]
