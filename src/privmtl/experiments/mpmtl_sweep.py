"""MP-MTL ε sweep: every (method, ε, seed), a table, a trade-off plot; resumable (``runs.jsonl``).

This is what ``privmtl mpmtl-sweep`` and ``privmtl demo`` run. How each row's hyper-parameters are
chosen (``select``; :func:`~privmtl.experiments.sweep_selection.select_candidates`):

``"vote"`` (default, covered)
    Every task's training split is cut into a fit part and a validation part (a fraction
    ``val_fraction`` of its own samples, drawn from a generator of the seed and the task's index
    only). One run per point of the method's small public grid (:data:`VOTE_GRIDS`, or the
    method's documented grid for the non-private and single-task baselines) is fitted on the fit
    parts; every task scores each candidate's column on its own validation part and votes; the
    noisy histogram picks the row's run. A private point is charged its target ε: the target is
    split, before any run, between the candidates and the vote so that they compose to it
    (:func:`~privmtl.privacy.selection.plan_candidates`; the vote alone is
    (``vote_share`` · ε, δ)-DP and each candidate runs at the ``candidate_epsilon`` its row's
    ``selection["plan"]`` states); a candidate whose covariance release at its share could not
    carry signal (:data:`MIN_SIGNAL_TO_NOISE`, public quantities only) is dropped before any run.
    Where no vote is held (one candidate, which is the default low-rank grid, or a vote whose
    noise would drown it) the grid's first point runs alone on the whole training split with the
    whole target. The non-private baselines (nothing to charge) fit the chosen configuration
    again on the whole training split. Single-task baselines (nothing shared) are the single
    covered run instead (``privmtl mpmtl --method stl-l2``): every task chooses its own weight
    by cross-validation on its own whole training split, at ε = 0.
``"client"`` (covered)
    Every task keeps, among the same candidates, the column best on its own validation part.
``"pooled"`` (opt-in, NOT covered)
    The paper's protocol: k-fold cross-validation over every task's training split
    (``tune_mode="each"``), once per (method, seed) at the middle ε and reused (``"once"``). Rows
    say ``"covered": false`` with the reason.

``tune_mode="none"`` runs the estimators' defaults with no selection at all (covered). Methods
whose runs keep no ledger of accountable events (the IP-MTL baselines made MP-MTL by group
privacy, the Wishart mechanism) cannot have their candidates composed: with ``"vote"`` and
``"client"`` they run their defaults, and the row says ``selection_method: "none"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from privmtl._validation import check_choice, check_real
from privmtl.exceptions import InvalidParameterError
from privmtl.experiments.mpmtl_sweep_runs import (
    MIN_SIGNAL_TO_NOISE,
    MPMTL_SWEEP_FILES,
    SweepRuns,
)
from privmtl.experiments.mpmtl_sweep_runs import _plan_point as _plan_point
from privmtl.experiments.mpmtl_sweep_runs import _validation_split as _validation_split
from privmtl.experiments.sweep import (
    DEFAULT_VOTE_SHARE,
    aggregate,
    plot_tradeoff,
    rows_to_csv,
    run_sweep,
    selection_footnote,
)
from privmtl.io import atomic_output_dir, write_json_atomic
from privmtl.linear.methods import (
    DEFAULT_SWEEP_METHODS,
    VOTE_GRIDS,
    linear_method,
)
from privmtl.linear.spec import SPEC
from privmtl.privacy.selection import SELECTION_METHODS

__all__ = [
    "DEFAULT_SELECT",
    "DEFAULT_SWEEP_EPSILONS",
    "DEFAULT_SWEEP_METHODS",
    "DEFAULT_SWEEP_TUNE",
    "MIN_SIGNAL_TO_NOISE",
    "MPMTL_SWEEP_FILES",
    "SWEEP_TUNE_MODES",
    "VOTE_GRIDS",
    "run_mpmtl_sweep",
]

#: The settings of a sweep beyond those of one run (whose defaults are
#: :class:`~privmtl.linear.spec.MPMTLSpec`'s): the methods compared (private ones swept over ε,
#: the others drawn as reference lines), the ε grid, how hyper-parameters are selected
#: (:data:`~privmtl.privacy.selection.SELECTION_METHODS`) and, with ``select="pooled"``, how often
#: the search runs (:data:`SWEEP_TUNE_MODES`).
DEFAULT_SWEEP_EPSILONS: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0, 10.0)
DEFAULT_SELECT = "vote"
SWEEP_TUNE_MODES = ("each", "once", "none")
DEFAULT_SWEEP_TUNE = "each"


def run_mpmtl_sweep(
    *,
    data: str,
    data_path: Path | None,
    methods: list[str],
    epsilons: list[float],
    seeds: list[int],
    noise: str,
    tune_mode: str,
    out_dir: Path,
    iterations: int | None = None,
    n_splits: int = SPEC.n_splits,
    final_step: str = SPEC.final_step,
    n_jobs: int = 1,
    noise_source: str = SPEC.noise_source,
    progress: Callable[[Iterable[Any], int], Iterable[Any]] | None = None,
    select: str = DEFAULT_SELECT,
    vote_share: float = DEFAULT_VOTE_SHARE,
    val_fraction: float = 0.2,
    task_column: str = "task",
    target_column: str = "y",
    feature_columns: list[str] | None = None,
    normalize: str = "auto",
    train_fraction: float | None = None,
    eigen_floor: float | str = SPEC.eigen_floor,
) -> dict[str, Any]:
    """Run the sweep and write ``mpmtl_sweep.csv``, ``mpmtl_sweep.json`` and ``mpmtl_tradeoff.png``.

    ``select`` and ``tune_mode`` choose how hyper-parameters are selected (module docstring);
    ``vote_share`` is the share of a point's ε the vote alone spends and ``val_fraction`` the
    share of each task's training samples held out for its own validation (``"vote"``,
    ``"client"``). Every row states ``covered``, ``selection_method`` and ``selection``.
    The data options are :func:`~privmtl.data.registry.load_mpmtl_data`'s.

    ``out_dir`` is checked writable before anything is computed. Each finished run (each
    candidate, each vote) is appended to ``out_dir/runs.jsonl``; a re-run reuses the logged ones
    of the same configuration (see :mod:`privmtl.experiments.runlog`) and reports
    ``runs_reused`` / ``runs_computed``.
    """
    check_choice("select", select, SELECTION_METHODS)
    check_choice("tune_mode", tune_mode, SWEEP_TUNE_MODES)
    check_real("val_fraction", val_fraction, low=0.0, high=1.0, closed="neither")
    if select == "vote":  # the candidates need a share of the budget besides the vote's
        check_real("vote_share", vote_share, low=0.0, high=1.0, closed="neither")
    eigen_floor = SPEC.replace(eigen_floor=eigen_floor).eigen_floor  # checked as the spec's
    if not isinstance(eigen_floor, str) and eigen_floor > 0 and final_step == "projection":
        raise InvalidParameterError(
            "The 'eigen_floor' parameter must be 'vote' or 0 with final_step='projection' (the "
            f"floor cuts the refit's eigenvalues); got {eigen_floor!r}."
        )
    runs = SweepRuns(
        data=data, data_path=data_path, methods=methods, epsilons=epsilons, seeds=seeds,
        noise=noise, tune_mode=tune_mode, out_dir=out_dir, iterations=iterations,
        n_splits=n_splits, final_step=final_step, noise_source=noise_source, select=select,
        vote_share=vote_share, val_fraction=val_fraction, task_column=task_column,
        target_column=target_column, feature_columns=feature_columns, normalize=normalize,
        train_fraction=train_fraction, eigen_floor=eigen_floor,
    )  # fmt: skip
    jobs = [
        (m, e, s)
        for s in seeds
        for m in methods
        for e in (epsilons if linear_method(m).private else [None])
    ]
    if runs.covered_mode:
        needed = [cfg for m, e, s in jobs for cfg in runs.runs_of(m, e, s)]
        reused = sum(runs.log.has(cfg) for cfg in needed)
        total = len(needed) + sum(not runs.runs_of(m, e, s) for m, e, s in jobs)
    else:
        reused = sum(runs.log.has(runs.config(m, e, s)) for m, e, s in jobs)
        total = len(jobs)
    rows = run_sweep(
        runs.covered_one if runs.covered_mode else runs.pooled_logged,
        methods=methods,
        epsilons=epsilons,
        seeds=seeds,
        private_methods=tuple(m for m in methods if linear_method(m).private),
        metric=runs.metric,
        progress=progress,
        # "once" shares the tuned parameters between jobs: sequential only
        n_jobs=1 if tune_mode == "once" and select == "pooled" else n_jobs,
    )
    summary = aggregate(rows)
    covered = all(r["covered"] for r in rows)
    g = next((r for r in rows if linear_method(r["method"]).private), rows[0])
    subtitle = (
        f"δ={g['delta']:.3g}, neighbours: {g['relation']} one task, sampling: all tasks, "
        f"accountant: {g['accountant']}, noise: {noise_source}; {len(seeds)} seed(s); "
        f"{selection_footnote(rows)}"
    )
    _write_outputs(
        out_dir, rows, summary, covered=covered, subtitle=subtitle, metric=runs.metric,
        title=f"MP-MTL privacy–accuracy trade-off on {data} ({noise} noise)",
        noise_source=noise_source, select=select, vote_share=vote_share,
    )  # fmt: skip
    return {
        "summary": summary,
        "noise_source": noise_source,
        "select": select,
        "covered": covered,
        "runs_reused": reused,
        "runs_computed": total - reused,
        "files": [str(out_dir / n) for n in MPMTL_SWEEP_FILES] + [str(runs.log.path)],
    }


def _write_outputs(
    out_dir: Path,
    rows: list[dict[str, Any]],
    summary: Any,
    *,
    covered: bool,
    subtitle: str,
    metric: str,
    title: str,
    noise_source: str,
    select: str,
    vote_share: float,
) -> None:
    """The sweep's table (CSV, JSON) and trade-off plot, written into ``out_dir`` at once."""
    with atomic_output_dir(out_dir) as tmp:
        (tmp / "mpmtl_sweep.csv").write_text(rows_to_csv(rows))
        write_json_atomic(
            tmp / "mpmtl_sweep.json",
            {
                "rows": rows,
                "summary": summary,
                "noise_source": noise_source,
                "select": select,
                "vote_share": vote_share if select == "vote" else None,
                "covered": covered,
            },
        )
        plot_tradeoff(
            summary,
            tmp / "mpmtl_tradeoff.png",
            metric_label="nMSE" if metric == "nmse" else "aAUC",
            title=title,
            lower_is_better=metric == "nmse",
            subtitle=subtitle,
            x_key="target_epsilon",
            label_key="epsilon" if covered else None,
            x_label=(
                "target ε (smaller is more private); labels: ε charged (training + selection)"
                if covered
                else "ε of the chosen run's training only (selection NOT covered)"
            ),
        )
