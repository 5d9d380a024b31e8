"""The data sets of both families by name: what each is, which options it takes, how it loads.

:data:`REGISTRY` is the one list of the data sets a run can name with ``--data`` (``data=``):
the federated (PMTL) family's, which load into a :class:`~privmtl.data.federated.FederatedDataset`,
and the multi-task linear (MP-MTL) family's, which load into a (train, test) pair of
:class:`~privmtl.data.multitask.MultiTaskDataset`. Each :class:`DataSetInfo` says what the data
set is, the loader options it takes, the ones it needs, its default location and, for MP-MTL, its
split protocol (default scaling and training fraction). The runners
(:func:`~privmtl.experiments.pmtl.run_pmtl`, :func:`~privmtl.experiments.mpmtl.run_mpmtl`), the
sweeps, the CLI's ``--data`` choices and help, and the Flower backend all read it from here.

:func:`load_federated` and :func:`load_mpmtl_data` load a data set of either family by name; the
MP-MTL protocol (:func:`data_protocol`, :func:`target_offsets`) scales and splits a multi-task
data set every task on its own: no statistic is pooled over tasks or clients.

Importing this module does not import PyTorch: the federated loaders import it when called.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from numpy.typing import NDArray

from privmtl._validation import CLIENT_BYTES, check_choice, check_int, check_memory, check_real
from privmtl.data.multitask import INTERCEPT, MultiTaskDataset
from privmtl.data.readers import default_femnist_dir, default_school_path, load_school, read_table
from privmtl.data.synthetic import make_groupsparse_tasks, make_lowrank_tasks
from privmtl.exceptions import DataFormatError, InvalidParameterError

if TYPE_CHECKING:
    from privmtl.data.federated import FederatedDataset

__all__ = [
    "FAMILIES",
    "MPMTL_SCALINGS",
    "PREPROCESSING",
    "REGISTRY",
    "SCHOOL_TRAIN_FRACTION",
    "TABLE_TRAIN_FRACTION",
    "DataSetInfo",
    "absolute_data_path",
    "data_protocol",
    "dataset_info",
    "dataset_names",
    "datasets_help",
    "default_femnist_dir",
    "load_federated",
    "load_mpmtl_data",
    "target_offsets",
]

FAMILIES = ("pmtl", "mpmtl")
"""The two families: federated (PMTL, PyTorch) and multi-task linear (MP-MTL, NumPy)."""

MPMTL_SCALINGS = ("auto", "per-task", "unit-norm", "none")
"""Feature scaling of an MP-MTL data set: ``auto`` is the data set's own default
(:attr:`DataSetInfo.scaling`), ``per-task`` standardizes each task with its own training split,
``unit-norm`` scales every row to unit length, ``none`` keeps the features as they are."""

SCHOOL_TRAIN_FRACTION = 0.3
"""School's training fraction when none is given: the MP-MTL paper's 30% of each school's rows."""

TABLE_TRAIN_FRACTION = 0.7
"""A user's MP-MTL table's training fraction when none is given: the usual 70/30 split."""

PREPROCESSING = {
    "unit-norm": "every feature row scaled to unit l2 norm",
    "per-task": "each task's features standardized with the mean and standard deviation of its "
    "own training split (columns constant there kept as they are), and a constant column "
    f"{INTERCEPT!r} appended when no feature is constant; a regression task's targets centred by "
    "its own training mean (its unpenalized intercept, added back to its predictions)",
    "none": "features as in the data",
}
"""What each resolved MP-MTL scaling does, as results and saved models describe it."""


@dataclass(frozen=True)
class DataSetInfo:
    """One named data set of one family.

    Attributes
    ----------
    name : str
        What ``--data`` / ``data=`` calls it.
    family : {"pmtl", "mpmtl"}
        The family whose runs read it (:data:`FAMILIES`).
    description : str
        One line for ``--help`` and the documentation.
    load : callable or str
        The loader: called with ``seed`` and the options in :attr:`options` (as keywords). A
        PMTL loader returns a :class:`~privmtl.data.federated.FederatedDataset`; an MP-MTL loader
        also takes the resolved ``scaling`` and ``train_fraction`` and returns (train, test). A
        ``"module:function"`` string names a loader whose module is imported when the data set
        is loaded (:meth:`loader`): the PMTL loaders, which build torch-backed federations.
    options : tuple of str
        The loader options this data set takes (beyond ``seed``).
    required : tuple of str
        The options it cannot do without.
    default_path : callable or None
        Where it is read from when no ``data_path`` is given; None: generated, or a path is
        required.
    flower : bool
        PMTL: Flower's transports can serve it (every node loads it from the same description).
    scaling : str or None
        MP-MTL: what ``scaling="auto"`` means for it (None: generated with its own split, never
        scaled).
    train_fraction : float or None
        MP-MTL: the training fraction when none is given (None: generated with its own split).
    """

    name: str
    family: str
    description: str
    load: Callable[..., Any] | str
    options: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    default_path: Callable[[], Path] | None = None
    flower: bool = False
    scaling: str | None = None
    train_fraction: float | None = None

    def loader(self) -> Callable[..., Any]:
        """The loader :attr:`load` is or names (its module imported now)."""
        if callable(self.load):
            return self.load
        module, _, name = self.load.partition(":")
        return cast(Callable[..., Any], getattr(importlib.import_module(module), name))

    @property
    def split(self) -> bool:
        """MP-MTL: True when the data set is split and scaled by :func:`data_protocol` (a file),
        False when its generator draws train and test itself."""
        return self.train_fraction is not None


# --------------------------------------------------------------------------- MP-MTL loaders


def _split_and_scale(
    full: MultiTaskDataset, *, seed: int, scaling: str, train_fraction: float
) -> tuple[MultiTaskDataset, MultiTaskDataset]:
    """Every task's rows split by the seed, then scaled with its own training split only."""
    if scaling == "unit-norm":
        full = full.normalize_rows()
    train, test = full.train_test_split(train_fraction, random_state=seed)
    if scaling == "per-task":
        train, test = train.standardize(), test.standardize(train)
        if not train.has_constant_feature():
            train, test = train.with_intercept(), test.with_intercept()
    return train, test


def _load_school(
    *, seed: int, scaling: str, train_fraction: float, data_path: str | Path | None = None
) -> tuple[MultiTaskDataset, MultiTaskDataset]:
    full = load_school(data_path)
    return _split_and_scale(full, seed=seed, scaling=scaling, train_fraction=train_fraction)


def _load_mpmtl_table(
    *,
    seed: int,
    scaling: str,
    train_fraction: float,
    data_path: str | Path,
    task_column: str = "task",
    target_column: str = "y",
    feature_columns: Sequence[str] | None = None,
) -> tuple[MultiTaskDataset, MultiTaskDataset]:
    full = read_table(
        data_path,
        task_column=task_column,
        target_column=target_column,
        feature_columns=feature_columns,
    )
    if full.task_type == "regression":
        values = np.unique(np.concatenate(full.y))
        if 3 <= values.size <= 10 and np.all(values == np.round(values)):
            raise DataFormatError(
                f"{data_path}: target column {target_column!r} looks like a "
                f"{values.size}-class label (values {values.tolist()}); MP-MTL methods model "
                "regression or binary classification only."
            )
    return _split_and_scale(full, seed=seed, scaling=scaling, train_fraction=train_fraction)


def _load_lowrank(**kw: Any) -> tuple[MultiTaskDataset, MultiTaskDataset]:
    return make_lowrank_tasks(random_state=kw["seed"])


def _load_groupsparse(**kw: Any) -> tuple[MultiTaskDataset, MultiTaskDataset]:
    return make_groupsparse_tasks(random_state=kw["seed"])


# ---------------------------------------------------------------------------------- registry

_TABLE_PATH = "CSV/Parquet file"

REGISTRY: dict[str, dict[str, DataSetInfo]] = {
    "pmtl": {
        info.name: info
        for info in (
            DataSetInfo(
                "femnist-leaf",
                "pmtl",
                "FEMNIST writers in LEAF's layout (a folder with train/ and test/), as published",
                "privmtl.data.federated_loaders:load_leaf_data",
                options=("data_path",),
                default_path=default_femnist_dir,
                flower=True,
            ),
            DataSetInfo(
                "synthetic",
                "pmtl",
                "built-in federation of m clients (--num-clients, default 50), drawn from the seed",
                "privmtl.data.federated_loaders:load_synthetic",
                options=("num_clients",),
                flower=True,
            ),
            DataSetInfo(
                "table",
                "pmtl",
                f"a user's {_TABLE_PATH} with one row per example (client and label columns)",
                "privmtl.data.federated_loaders:load_table",
                options=(
                    "data_path",
                    "client_column",
                    "label_column",
                    "feature_columns",
                    "scaling",
                ),
                required=("data_path", "client_column", "label_column"),
                flower=True,
            ),
        )
    },
    "mpmtl": {
        info.name: info
        for info in (
            DataSetInfo(
                "school",
                "mpmtl",
                "the School exam-score tasks (the MP-MTL paper's protocol: unit-norm rows, 30% "
                "of each school's students train)",
                _load_school,
                options=("data_path",),
                default_path=default_school_path,
                scaling="unit-norm",
                train_fraction=SCHOOL_TRAIN_FRACTION,
            ),
            DataSetInfo(
                "synthetic-lowrank",
                "mpmtl",
                "built-in tasks with low-rank shared models, drawn from the seed",
                _load_lowrank,
            ),
            DataSetInfo(
                "synthetic-groupsparse",
                "mpmtl",
                "built-in tasks with group-sparse shared models, drawn from the seed",
                _load_groupsparse,
            ),
            DataSetInfo(
                "table",
                "mpmtl",
                f"a user's {_TABLE_PATH} with one row per sample (task and target columns; "
                "per-task scaling, 70% train)",
                _load_mpmtl_table,
                options=("data_path", "task_column", "target_column", "feature_columns"),
                required=("data_path",),
                scaling="per-task",
                train_fraction=TABLE_TRAIN_FRACTION,
            ),
        )
    },
}
"""Every data set by family, then by name (in the order ``--help`` lists them)."""


def dataset_names(family: str, *, flower: bool = False) -> tuple[str, ...]:
    """The names of ``family``'s data sets (``flower=True``: those Flower can serve)."""
    check_choice("family", family, FAMILIES)
    return tuple(n for n, i in REGISTRY[family].items() if i.flower or not flower)


def dataset_info(family: str, name: str) -> DataSetInfo:
    """The entry of ``name`` in ``family``; an unknown name is refused naming the ``data``
    parameter and the choices."""
    check_choice("family", family, FAMILIES)
    check_choice("data", name, REGISTRY[family])
    return REGISTRY[family][name]


def datasets_help(family: str, *, flower: bool = False) -> str:
    """``--data``'s help: every data set of ``family`` with its one-line description."""
    return (
        "; ".join(
            f"{n}: {REGISTRY[family][n].description}" for n in dataset_names(family, flower=flower)
        )
        + "."
    )


def absolute_data_path(family: str, data: str, data_path: str | Path | None) -> str | None:
    """The data's absolute path (given, else the data set's default location), so that saved
    models can be evaluated from anywhere; None for a generated data set."""
    if data_path is not None:
        return str(Path(data_path).resolve())
    info = REGISTRY[family].get(data)
    if info is None or info.default_path is None:
        return None
    return str(info.default_path().resolve())


def load_federated(
    data: str,
    *,
    data_path: str | Path | None = None,
    seed: int = 0,
    client_column: str | None = None,
    label_column: str | None = None,
    feature_columns: Sequence[str] | None = None,
    num_clients: int | None = None,
    scaling: str | None = None,
) -> FederatedDataset:
    """A PMTL data set by name: FEMNIST writers (or any LEAF classification set), the built-in
    synthetic federation, or a user's table.

    ``data="table"`` reads ``data_path`` (CSV/Parquet) with
    :func:`~privmtl.data.federated_table.load_federated_table`; ``client_column`` and
    ``label_column`` are then required, and ``scaling`` (``"per-client-clipped"``, the default:
    each client standardizes its features with its own training split's statistics and clips them
    to a few standard deviations; ``"per-client"``: without the clip; ``"none"``) applies. The
    papers' data sets are used as published (``scaling`` does not apply to them). ``num_clients``
    (synthetic only) is the population size ``m`` of
    :func:`~privmtl.data.federated.make_synthetic_federated` (default 50); every other generator
    parameter keeps its documented default.
    """
    info = dataset_info("pmtl", data)
    if num_clients is not None:
        num_clients = check_int("num_clients", num_clients, low=1)
        if "num_clients" not in info.options:
            raise InvalidParameterError(
                f"The 'num_clients' parameter applies to data='synthetic' only; got data={data!r}."
            )
        check_memory("num_clients", num_clients, CLIENT_BYTES, "clients")
    given: dict[str, Any] = {
        "data_path": data_path,
        "client_column": client_column,
        "label_column": label_column,
        "feature_columns": feature_columns,
        "num_clients": num_clients,
        "scaling": scaling,
    }
    for name in info.required:
        if given[name] is None:
            raise InvalidParameterError(f"data={data!r} needs the '{name}' parameter.")
    return info.loader()(seed=seed, **{k: given[k] for k in info.options})


def data_protocol(
    data: str,
    normalize: str = "auto",
    train_fraction: float | None = None,
    *,
    unit_norm: bool = False,
) -> tuple[str, float | None]:
    """The scaling and training fraction an MP-MTL run uses: ``auto`` / ``None`` resolved for
    ``data``.

    School keeps the paper's protocol (unit-norm rows, 30% training); a table gets per-task
    standardization and a 70/30 split, except with ``unit_norm=True`` (a method whose sensitivity
    bound needs rows of norm at most 1, :attr:`~privmtl.linear.methods.LinearMethod.unit_norm`:
    unit-norm rows); the synthetic generators have their own splits (``("none", None)``).
    """
    info = dataset_info("mpmtl", data)
    check_choice("normalize", normalize, MPMTL_SCALINGS)
    if not info.split:
        return "none", None
    if normalize == "auto":
        assert info.scaling is not None
        normalize = "unit-norm" if unit_norm else info.scaling
    if train_fraction is None:
        train_fraction = info.train_fraction
    frac = check_real("train_fraction", train_fraction, low=0.0, high=1.0, closed="neither")
    return normalize, frac


def load_mpmtl_data(
    data: str,
    *,
    data_path: str | Path | None = None,
    seed: int = 0,
    train_fraction: float | None = None,
    task_column: str = "task",
    target_column: str = "y",
    normalize: str = "auto",
    feature_columns: Sequence[str] | None = None,
    unit_norm: bool = False,
) -> tuple[MultiTaskDataset, MultiTaskDataset]:
    """(train, test) of an MP-MTL data set by name, preprocessed as :func:`data_protocol` says.

    School: the paper's protocol by default (30% of each school's rows train, every row scaled to
    unit length). A table (``task_column``, ``target_column``, optional ``feature_columns``): a
    70/30 split and each task's features standardized with its own training split's statistics
    by default, with a column of ones appended when no feature is constant (the models have no
    intercept, and centred features alone could not fit a target's mean). ``normalize``
    (``"per-task"``, ``"unit-norm"``, ``"none"``) and ``train_fraction`` override either. A
    table's target with 3 to 10 distinct integer values is refused: it looks like a multi-class
    label, which no MP-MTL method models. ``unit_norm`` lets :func:`data_protocol` resolve
    ``"auto"`` for the method that will be fitted (its
    :attr:`~privmtl.linear.methods.LinearMethod.unit_norm`).
    """
    scaling, frac = data_protocol(data, normalize, train_fraction, unit_norm=unit_norm)
    info = REGISTRY["mpmtl"][data]
    given: dict[str, Any] = {
        "data_path": data_path,
        "task_column": task_column,
        "target_column": target_column,
        "feature_columns": feature_columns,
    }
    for name in info.required:
        if given[name] is None:
            raise InvalidParameterError(
                f"The '{name}' parameter is required with data={data!r}; got None."
            )
    options = {k: given[k] for k in info.options}
    if not info.split:
        return info.loader()(seed=seed, **options)
    return info.loader()(seed=seed, scaling=scaling, train_fraction=frac, **options)


def target_offsets(train: MultiTaskDataset, scaling: str | None) -> NDArray[np.float64]:
    """Per-task intercepts of a fit: each task's mean training target, or zeros.

    A user's regression table standardized per task (``scaling="per-task"``, its default) has
    centred features, so fitting every model to targets centred by these means, and adding them
    back to the predictions, is the unpenalized per-task intercept scikit-learn fits: shifting a
    task's targets shifts its predictions and nothing else. Each task's mean comes from its own
    training rows and serves its own predictions only. Every other protocol (School's unit-norm
    rows, the synthetic tasks, classification) keeps the models without intercepts (zeros).
    """
    if scaling == "per-task" and train.task_type == "regression":
        return train.target_means()
    return np.zeros(train.n_tasks)
