"""PMTL ε sweep with per-ε model selection on validation accuracy, as in the PMTL paper (§5).

For every target ε and method, each (γ, T) of the grid gets the σ that meets (ε, δ) exactly; the
configuration with the best *validation* accuracy is kept and its *test* accuracy reported. Non-private
runs (ε = ∞) and purely local training (ε = 0) are drawn as reference lines.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from privmtl.experiments.pmtl import load_federated, run_pmtl
from privmtl.experiments.runlog import RunLog
from privmtl.experiments.sweep import aggregate, plot_tradeoff, rows_to_csv

__all__ = ["PMTL_SWEEP_FILES", "plot_rounds", "run_pmtl_sweep", "write_pmtl_sweep"]

#: The sweep's tables and plots, written into its output folder when every run has finished.
PMTL_SWEEP_FILES = ("pmtl_sweep.csv", "pmtl_sweep.json", "pmtl_tradeoff.png", "pmtl_rounds.png")


def run_pmtl_sweep(
    *,
    data: str,
    data_path: str | Path | None,
    model: str,
    methods: Sequence[str],
    epsilons: Sequence[float],
    seeds: Sequence[int],
    clips: Sequence[float],
    rounds_grid: Sequence[int],
    clients_per_round: int,
    lam: float | Sequence[float] = 0.1,
    lr: float = 0.1,
    local_steps: int | None = None,
    finetune: str = "none",
    server_update: str = "offset",
    progress: Callable[[Iterable[Any], int], Iterable[Any]] | None = None,
    noise_source: str = "secure",
    log: RunLog | None = None,
) -> dict[str, Any]:
    """Run the sweep; returns ``{"rows": best rows, "candidates": all runs, "summary": ...}``.

    Per (seed, method, ε) the run with the best validation accuracy over ``clips`` × ``rounds_grid``
    (× ``lam`` when it is a list, for the methods that use λ: pmtl, fedprox) is selected.
    With a ``log`` (:class:`~privmtl.experiments.runlog.RunLog`), every finished run is appended to
    it and runs of the same configuration already logged are reused, not run again.
    """
    datasets = {s: load_federated(data, data_path=data_path, seed=s) for s in seeds}
    lams = [float(lam)] if isinstance(lam, int | float) else [float(v) for v in lam]
    jobs: list[tuple[int, str, float | None, float, int, float]] = []
    for seed, method in itertools.product(seeds, methods):
        eps_list: list[float | None] = [None] if method == "local" else [*epsilons, None]
        method_lams = lams if method in ("pmtl", "fedprox") else lams[:1]
        for eps in eps_list:
            for clip, T, lam_ in itertools.product(clips, rounds_grid, method_lams):
                jobs.append((seed, method, eps, clip, T, lam_))
    it: Iterable[Any] = jobs if progress is None else progress(jobs, len(jobs))
    candidates = []
    for seed, method, eps, clip, T, lam_ in it:
        cfg = {
            "sweep": "pmtl",
            "data": data,
            "data_path": None if data_path is None else str(data_path),
            "model": model,
            "method": method,
            "epsilon": eps,
            "clip": clip,
            "rounds": T,
            "lam": lam_,
            "clients_per_round": clients_per_round,
            "lr": lr,
            "local_steps": local_steps,
            "finetune": finetune,
            "server_update": server_update,
            "noise_source": noise_source,
            "seed": seed,
        }
        done = None if log is None else log.get(cfg)
        if done is not None:
            candidates.append(done)
            continue
        row = run_pmtl(
            data=data,
            model=model,
            method=method,
            epsilon=eps,
            clip=clip,
            rounds=T,
            clients_per_round=clients_per_round,
            lam=lam_,
            lr=lr,
            server_update=server_update,
            local_steps=local_steps,
            finetune=finetune,
            seed=seed,
            show_progress=False,
            dataset=datasets[seed],
            noise_source=noise_source,
        )
        row["target_epsilon"] = eps
        candidates.append(row if log is None else log.add(cfg, row))
    best: dict[tuple[int, str, float | None], dict[str, Any]] = {}
    for row in candidates:
        key = (row["seed"], row["method"], row["target_epsilon"])
        val = _val(row)
        cur = best.get(key)
        if cur is None or (not math.isnan(val) and not val <= _val(cur)):
            best[key] = row
    rows = []
    for row in best.values():
        row = dict(row)
        row["metric"] = "test_accuracy"
        row["value"] = row["test_accuracy"]
        if row["target_epsilon"] is None and row["method"] != "local":
            row["method"] = f"{row['method']} (non-private)"
        rows.append(row)
    return {"rows": rows, "candidates": candidates, "summary": aggregate(rows)}


def _val(row: dict[str, Any]) -> float:
    v = row.get("val_accuracy")
    return math.nan if v is None else float(v)


def write_pmtl_sweep(result: dict[str, Any], out_dir: Path, *, title: str) -> list[Path]:
    """CSV + JSON + accuracy-vs-ε PNG + per-round loss/ε PNG into ``out_dir`` (already atomic)."""
    from privmtl.io import write_json_atomic

    files = [
        out_dir / "pmtl_sweep.csv",
        out_dir / "pmtl_sweep.json",
        out_dir / "pmtl_tradeoff.png",
        out_dir / "pmtl_rounds.png",
    ]
    files[0].write_text(rows_to_csv(result["rows"]))
    write_json_atomic(files[1], result)
    rows = result["rows"]
    g = next((r for r in rows if r["guarantee"]["private"]), rows[0])
    subtitle = (
        f"δ={g['delta']:.3g}, neighbours: {g['relation']} one client, sampling: {g['sampling']} "
        f"(q={g['clients_per_round']} of m={g['num_clients']}), accountant: {g['accountant']}, "
        f"noise: {g['noise_source']}; (γ, T, λ) selected per ε on validation accuracy"
    )
    plot_tradeoff(
        result["summary"],
        files[2],
        metric_label="test accuracy (pooled)",
        title=title,
        lower_is_better=False,
        subtitle=subtitle,
    )
    plot_rounds(rows, files[3])
    return files


def plot_rounds(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Training loss and ε after every round (PMTL paper Fig. 2) for the selected private runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=120)
    shown = [
        row
        for row in sorted(rows, key=lambda r: (r["method"], r.get("target_epsilon") or math.inf))
        if row["seed"] == rows[0]["seed"]
    ]
    # one colour per run: tab10 up to 10 runs, tab20 beyond (runs never share a colour up to 20)
    colors = plt.get_cmap("tab10" if len(shown) <= 10 else "tab20").colors  # type: ignore[attr-defined]
    for i, row in enumerate(shown):
        color = colors[i % len(colors)]
        label = (
            f"{row['method']} ε={row['target_epsilon']:g}"
            if row["target_epsilon"]
            else row["method"]
        )
        loss = np.array(
            [np.nan if v is None else v for v in row["train_loss_per_round"]], dtype=float
        )
        ax1.plot(np.arange(1, loss.size + 1), loss, label=label, lw=1, color=color)
        eps = [e for e in row["epsilon_per_round"] if e is not None]
        if eps and row["guarantee"]["private"]:
            ax2.plot(np.arange(1, len(eps) + 1), eps, label=label, lw=1, color=color)
    ax1.set_xlabel("round")
    ax1.set_ylabel("training loss (sampled clients)")
    ax1.set_yscale("log")
    ax2.set_xlabel("round")
    ax2.set_ylabel("ε spent (at the run's δ)")
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
