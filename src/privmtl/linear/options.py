"""The typed parts of an MP-MTL run beside its :class:`~privmtl.linear.spec.MPMTLSpec`, and their
defaults, defined once.

A run of the MP-MTL family is three typed parts, each a frozen dataclass whose field defaults are
the product's:

* :class:`~privmtl.linear.spec.MPMTLSpec`: the method and privacy settings (what the result
  reports);
* :class:`MPMTLExecution`: how the run executes, not what it computes (checkpointing, resuming,
  where the models are saved);
* :class:`MPMTLOptions`: the data a run fits, the estimator's extra parameters and the per-task
  rows it writes.

:data:`MPMTL_PARAMETERS` maps every keyword ``run_mpmtl`` accepts to the part it belongs to;
:func:`split_mpmtl_settings` checks the names (an unknown one is an
:class:`~privmtl.exceptions.InvalidParameterError` listing the valid ones) and splits them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privmtl.data.multitask import MultiTaskDataset
from privmtl.exceptions import InvalidParameterError
from privmtl.linear.spec import MPMTLSpec

__all__ = ["MPMTL_PARAMETERS", "MPMTLExecution", "MPMTLOptions", "split_mpmtl_settings"]


@dataclass(frozen=True)
class MPMTLExecution:
    """Where an MP-MTL run checkpoints (``checkpoint_dir``, ``resume``) and saves its models
    (``save_models``); documented in :func:`~privmtl.experiments.mpmtl.run_mpmtl`."""

    checkpoint_dir: str | Path | None = None
    resume: bool = False
    save_models: str | Path | None = None


@dataclass(frozen=True)
class MPMTLOptions:
    """The data of one ``run_mpmtl`` call (a registered data set, or a given ``split``), the
    estimator's ``extra_params`` and the ``per_client`` rows file; documented in
    :func:`~privmtl.experiments.mpmtl.run_mpmtl`. ``data`` has no default: a run names it."""

    data: str | None = None
    data_path: str | Path | None = None
    split: tuple[MultiTaskDataset, MultiTaskDataset] | None = None
    train_fraction: float | None = None
    task_column: str = "task"
    target_column: str = "y"
    normalize: str = "auto"
    feature_columns: list[str] | tuple[str, ...] | None = None
    extra_params: dict[str, Any] | None = None
    per_client: str | Path | None = None


MPMTL_PARAMETERS: dict[str, type] = {
    **{f.name: MPMTLSpec for f in dataclasses.fields(MPMTLSpec)},
    **{f.name: MPMTLExecution for f in dataclasses.fields(MPMTLExecution)},
    **{f.name: MPMTLOptions for f in dataclasses.fields(MPMTLOptions)},
}
"""Every keyword of ``run_mpmtl``, mapped to the part that defines it (and its default)."""

if len(MPMTL_PARAMETERS) != sum(
    len(dataclasses.fields(c)) for c in (MPMTLSpec, MPMTLExecution, MPMTLOptions)
):
    raise AssertionError("the three parts of an MP-MTL run must not share a name")


def split_mpmtl_settings(
    spec: MPMTLSpec | None, settings: dict[str, Any]
) -> tuple[dict[str, Any], MPMTLExecution, MPMTLOptions]:
    """``settings`` (``run_mpmtl``'s keywords) split into the spec's settings (on top of
    ``spec``'s, when given), the :class:`MPMTLExecution` and the :class:`MPMTLOptions`.

    An unknown name is refused naming it and listing the valid ones; so is a run without
    ``data``. The spec's settings are returned by name (``method`` may be a user's method class
    or ``PATH.py:NAME``, which an :class:`MPMTLSpec` cannot hold; ``tune`` may be a bool),
    checked when the run builds its spec."""
    unknown = sorted(set(settings) - set(MPMTL_PARAMETERS))
    if unknown:
        raise InvalidParameterError(
            f"Invalid parameter {unknown[0]!r} for run_mpmtl. Valid parameters are: "
            f"{sorted(MPMTL_PARAMETERS)!r}."
        )
    if spec is not None and not isinstance(spec, MPMTLSpec):
        raise InvalidParameterError(
            f"The 'spec' parameter of run_mpmtl must be an MPMTLSpec or None; got {spec!r}."
        )
    base = {} if spec is None else {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}

    def part(cls: type) -> dict[str, Any]:
        return {k: v for k, v in settings.items() if MPMTL_PARAMETERS[k] is cls}

    options = MPMTLOptions(**part(MPMTLOptions))
    if options.data is None:
        raise InvalidParameterError(
            "The 'data' parameter of run_mpmtl must name a data set of the 'mpmtl' family; "
            "got None."
        )
    return {**base, **part(MPMTLSpec)}, MPMTLExecution(**part(MPMTLExecution)), options
