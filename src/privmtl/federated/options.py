"""The typed parts of a PMTL-family run and their defaults, defined once.

A run of the PMTL family is three typed parts, each a frozen dataclass whose field defaults are
the product's (the one definition every entry point reads: ``run_pmtl``'s keywords, the options of
``privmtl pmtl``, ``privmtl pmtl-sweep`` and ``privmtl flower local``, and Flower's run
configuration):

* :class:`~privmtl.federated.spec.RunSpec`: the algorithm and privacy settings (what the result
  reports under ``config``);
* :class:`~privmtl.federated.spec.Execution`: how the run executes, not what it computes
  (threads, device, progress, checkpointing, where models are saved);
* :class:`RunOptions`: the data and model a run trains on, its end of run and its report.

:data:`PMTL_PARAMETERS` maps every keyword ``run_pmtl`` accepts to the part it belongs to;
:func:`split_settings` checks the names (an unknown one is an
:class:`~privmtl.exceptions.InvalidParameterError` listing the valid ones, as scikit-learn's
``set_params``) and splits them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privmtl.data.federated import FederatedDataset
from privmtl.data.federated_table import DEFAULT_CLIENT_SCALING
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.end_of_run.finish import FINETUNE_SELECT_CHOICES
from privmtl.federated.end_of_run.local import LOCAL_SELECT, LOCAL_SOLVER_CHOICES
from privmtl.federated.models import DEFAULT_MODEL
from privmtl.federated.spec import EXECUTION, Execution, RunSpec

__all__ = ["OPTIONS", "PMTL_PARAMETERS", "RunOptions", "split_settings"]


@dataclass(frozen=True)
class RunOptions:
    """The data, model, end of run and report of one ``run_pmtl`` call (its parameters that are
    neither run-spec settings nor execution options; documented in
    :func:`~privmtl.experiments.pmtl.run_pmtl`)."""

    data: str = "synthetic"
    data_path: str | Path | None = None
    client_column: str | None = None
    label_column: str | None = None
    feature_columns: Sequence[str] | None = None
    num_clients: int | None = None
    scaling: str = DEFAULT_CLIENT_SCALING
    dataset: FederatedDataset | None = None
    model: str = DEFAULT_MODEL
    finetune_epochs: int | Sequence[int] = 1
    extra_finetunes: tuple[str, ...] | list[str] = ()
    finetune_lrs: Sequence[float] | None = None
    finetune_lams: Sequence[float] | None = None
    finetune_start: str = "auto"
    finetune_select: str = FINETUNE_SELECT_CHOICES[0]
    local_select: str = LOCAL_SELECT[0]
    local_solver: str = LOCAL_SOLVER_CHOICES[0]
    local_patience: int | None = None
    budget_epsilon: float | None = None
    diagnostics: bool = False
    baseline: bool = True
    per_client: str | Path | None = None


OPTIONS = RunOptions()
"""Every run option at its default."""

PMTL_PARAMETERS: dict[str, type] = {
    **{f.name: RunSpec for f in dataclasses.fields(RunSpec)},
    **{f.name: Execution for f in dataclasses.fields(Execution)},
    **{f.name: RunOptions for f in dataclasses.fields(RunOptions)},
}
"""Every keyword of ``run_pmtl``, mapped to the part that defines it (and its default)."""


def split_settings(
    spec: RunSpec | None, settings: dict[str, Any]
) -> tuple[dict[str, Any], Execution, RunOptions]:
    """``settings`` (``run_pmtl``'s keywords) split into the run spec's settings (on top of
    ``spec``'s, when given), the :class:`Execution` and the :class:`RunOptions`.

    An unknown name is refused naming it and listing the valid ones. The spec's settings are
    returned by name (``method`` may be a user's method object, which a :class:`RunSpec` cannot
    hold), checked when the run builds its spec."""
    unknown = sorted(set(settings) - set(PMTL_PARAMETERS))
    if unknown:
        raise InvalidParameterError(
            f"Invalid parameter {unknown[0]!r} for run_pmtl. Valid parameters are: "
            f"{sorted(PMTL_PARAMETERS)!r}."
        )
    if spec is not None and not isinstance(spec, RunSpec):
        raise InvalidParameterError(
            f"The 'spec' parameter of run_pmtl must be a RunSpec or None; got {spec!r}."
        )
    base = {} if spec is None else {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}

    def part(cls: type) -> dict[str, Any]:
        return {k: v for k, v in settings.items() if PMTL_PARAMETERS[k] is cls}

    return {**base, **part(RunSpec)}, Execution(**part(Execution)), RunOptions(**part(RunOptions))


if len(PMTL_PARAMETERS) != sum(len(dataclasses.fields(c)) for c in (RunSpec, EXECUTION, OPTIONS)):
    raise AssertionError("the three parts of a run must not share a name")
