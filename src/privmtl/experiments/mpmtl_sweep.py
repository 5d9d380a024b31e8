"""MP-MTL ε sweep: every (method, ε, seed), a table, a trade-off plot; resumable (``runs.jsonl``).

This is what ``privmtl mpmtl-sweep`` and ``privmtl demo`` run. Hyper-parameters are tuned by k-fold
cross-validation on each training split (``tune_mode="each"``), once per (method, seed) at the
middle ε and reused (``"once"``), or not at all (``"none"``); tuning is not charged to ε, as in the
MP-MTL paper, and every row says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from privmtl.experiments.mpmtl import PRIVATE_METHODS, load_mpmtl_data, run_mpmtl
from privmtl.experiments.runlog import RunLog
from privmtl.experiments.sweep import aggregate, plot_tradeoff, rows_to_csv, run_sweep
from privmtl.io import atomic_output_dir, write_json_atomic

__all__ = ["MPMTL_SWEEP_FILES", "run_mpmtl_sweep"]

#: The sweep's tables and plot, written into its output folder when every run has finished.
MPMTL_SWEEP_FILES = ("mpmtl_sweep.csv", "mpmtl_sweep.json", "mpmtl_tradeoff.png")

_PRIVACY_KEYS = ("epsilon", "delta", "noise", "relation", "accountant", "random_state")


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
    n_splits: int = 5,
    final_step: str = "auto",
    n_jobs: int = 1,
    noise_source: str = "secure",
    progress: Callable[[Iterable[Any], int], Iterable[Any]] | None = None,
) -> dict[str, Any]:
    """Run the sweep and write ``mpmtl_sweep.csv``, ``mpmtl_sweep.json`` and ``mpmtl_tradeoff.png``.

    ``out_dir`` is checked writable before anything is computed. Each finished run is appended to
    ``out_dir/runs.jsonl``; a re-run reuses the logged runs of the same configuration (see
    :mod:`privmtl.experiments.runlog`) and reports ``runs_reused`` / ``runs_computed``.
    """
    log = RunLog(out_dir, outputs=MPMTL_SWEEP_FILES)
    splits = {s: load_mpmtl_data(data, data_path=data_path, seed=s) for s in seeds}
    classification = splits[seeds[0]][0].task_type == "classification"
    metric = "auc" if classification else "nmse"

    tuned_once: dict[tuple[str, int], dict[str, Any]] = {}
    reference_eps = sorted(epsilons)[len(epsilons) // 2]
    fixed = {
        "sweep": "mpmtl",
        "data": data,
        "data_path": None if data_path is None else str(data_path),
        "noise": noise,
        "tune_mode": tune_mode,
        "reference_epsilon": reference_eps if tune_mode == "once" else None,
        "iterations": iterations,
        "n_splits": n_splits,
        "final_step": final_step,
        "noise_source": noise_source,
    }

    def config(method: str, epsilon: float | None, seed: int) -> dict[str, Any]:
        return {**fixed, "method": method, "epsilon": epsilon, "seed": seed}

    def one(*, method: str, epsilon: float | None, seed: int) -> dict[str, Any]:
        common: dict[str, Any] = {
            "data": data,
            "method": method,
            "noise": noise,
            "seed": seed,
            "split": splits[seed],
            "final_step": final_step,
            "n_splits": n_splits,
            "noise_source": noise_source,
        }
        if tune_mode != "once" or epsilon is None:
            return run_mpmtl(
                **common, epsilon=epsilon, tune=tune_mode != "none", iterations=iterations
            )
        key = (method, seed)
        if key not in tuned_once:
            ref = log.get(config(method, reference_eps, seed))
            if ref is None:
                ref = run_mpmtl(**common, epsilon=reference_eps, tune=True, iterations=iterations)
            tuned_once[key] = {k: v for k, v in ref["params"].items() if k not in _PRIVACY_KEYS}
            if epsilon == reference_eps:
                return ref
        out = run_mpmtl(**common, epsilon=epsilon, tune=False, extra_params=tuned_once[key])
        out["tuned"] = True
        out["tuning_note"] = (
            f"hyper-parameters tuned once by k-fold CV at epsilon={reference_eps:g} and reused; "
            "tuning is not charged to the privacy budget (as in the MP-MTL paper)"
        )
        return out

    def logged(*, method: str, epsilon: float | None, seed: int) -> dict[str, Any]:
        cfg = config(method, epsilon, seed)
        row = log.get(cfg)
        return (
            row if row is not None else log.add(cfg, one(method=method, epsilon=epsilon, seed=seed))
        )

    jobs = [
        (m, e, s)
        for s in seeds
        for m in methods
        for e in (epsilons if m in PRIVATE_METHODS else [None])
    ]
    reused = sum(log.has(config(m, e, s)) for m, e, s in jobs)
    rows = run_sweep(
        logged,
        methods=methods,
        epsilons=epsilons,
        seeds=seeds,
        private_methods=PRIVATE_METHODS,
        metric=metric,
        progress=progress,
        # "once" shares the tuned parameters between jobs: sequential only
        n_jobs=1 if tune_mode == "once" else n_jobs,
    )
    summary = aggregate(rows)
    g = next((r for r in rows if r["method"] in PRIVATE_METHODS), rows[0])
    subtitle = (
        f"δ={g['delta']:.3g}, neighbours: {g['relation']} one task, sampling: all tasks, "
        f"accountant: {g['accountant']}, noise: {noise_source}; {len(seeds)} seed(s); "
        "tuning not charged to ε"
    )
    with atomic_output_dir(out_dir) as tmp:
        (tmp / "mpmtl_sweep.csv").write_text(rows_to_csv(rows))
        write_json_atomic(
            tmp / "mpmtl_sweep.json",
            {"rows": rows, "summary": summary, "noise_source": noise_source},
        )
        plot_tradeoff(
            summary,
            tmp / "mpmtl_tradeoff.png",
            metric_label="nMSE" if metric == "nmse" else "aAUC",
            title=f"MP-MTL privacy–accuracy trade-off on {data} ({noise} noise)",
            lower_is_better=metric == "nmse",
            subtitle=subtitle,
        )
    return {
        "summary": summary,
        "noise_source": noise_source,
        "runs_reused": reused,
        "runs_computed": len(jobs) - reused,
        "files": [str(out_dir / n) for n in MPMTL_SWEEP_FILES] + [str(log.path)],
    }
