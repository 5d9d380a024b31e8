"""Linear multi-task learning: MP-MTL estimators, their private and non-private baselines.

Private (model-protected, MP-MTL of Liang et al.): :class:`MPMTLLowRank` (Alg. 2),
:class:`MPMTLGroupSparse` (Alg. 3), :class:`MPMTLLowRankSparse` (Alg. 4), with instance-level
protection (Alg. 5) as ``privacy=MPMTLPrivacy(instance_epsilon=...)``; their rarely changed
settings are grouped in :class:`MPMTLPrivacy`, :class:`MPMTLRefit` and :class:`MPMTLExecution`.
IP-MTL baselines made MP-MTL by group privacy: :class:`DPMTRL`, :class:`DPAGGR`. Non-private
baselines: :class:`STLRidge`, :class:`STLLasso`, :class:`TraceNormMTL`, :class:`L21MTL`,
:class:`MTRL`, :class:`ModelAveraging`. Tuning: :func:`select_hyperparameters` with
:data:`DEFAULT_GRIDS`; scikit-learn's ``GridSearchCV`` on stacked rows: :class:`StackedTasks`.
"""

from privmtl.linear.dp_baselines import DPAGGR, DPMTRL
from privmtl.linear.mpmtl import MPMTLGroupSparse, MPMTLLowRank, MPMTLLowRankSparse
from privmtl.linear.mtrl import MTRL
from privmtl.linear.options import MPMTLExecution, MPMTLPrivacy, MPMTLRefit
from privmtl.linear.regularized import L21MTL, STLLasso, TraceNormMTL
from privmtl.linear.selection import (
    DEFAULT_GRIDS,
    METHODS,
    TUNING_NOT_CHARGED,
    make_estimator,
    select_hyperparameters,
)
from privmtl.linear.stacked import StackedTasks, stack_tasks
from privmtl.linear.stl import ModelAveraging, STLRidge

__all__ = [
    "DEFAULT_GRIDS",
    "DPAGGR",
    "DPMTRL",
    "L21MTL",
    "METHODS",
    "MTRL",
    "TUNING_NOT_CHARGED",
    "MPMTLExecution",
    "MPMTLGroupSparse",
    "MPMTLLowRank",
    "MPMTLLowRankSparse",
    "MPMTLPrivacy",
    "MPMTLRefit",
    "ModelAveraging",
    "STLLasso",
    "STLRidge",
    "StackedTasks",
    "TraceNormMTL",
    "make_estimator",
    "select_hyperparameters",
    "stack_tasks",
]
