"""PMTL ε sweep with per-ε model selection on validation accuracy, as in the PMTL paper (§5).

For every target ε and method, each (γ, T, λ) of the grid gets the σ that meets (ε, δ) exactly, and
one candidate is chosen per (seed, method, ε) with
:func:`~privmtl.experiments.sweep_selection.select_candidates`: by default a noisy **client
vote** (every client votes on its own validation split; the noisy histogram is a recorded
release), and the reported ε composes every candidate run's recorded releases with the vote — the
ε that covers training *and* selection. ``select="client"`` lets every
client keep its own best candidate; ``select="pooled"`` (the paper's protocol: best pooled validation
accuracy) is opt-in and its rows say ``"covered": false``. The chosen configuration's *test*
accuracy is reported. Non-private runs (ε = ∞) and purely local training (ε = 0; its candidates
release nothing, so it is always chosen per client) are drawn as reference lines.

Each candidate run keeps, in ``runs.jsonl``, the events of its own ledger and every client's
correct predictions on its validation and test splits (each client scored with its own model):
what the vote and the per-client choice read, and what a resumed sweep reuses.
"""

from __future__ import annotations

import itertools
import math
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from privmtl._device import DEFAULT_DEVICE, resolve_device
from privmtl._timing import added_phase
from privmtl._validation import check_choice
from privmtl.data.federated_table import DEFAULT_CLIENT_SCALING
from privmtl.data.registry import load_federated
from privmtl.experiments.pmtl import make_model, run_pmtl
from privmtl.experiments.runlog import RunLog
from privmtl.experiments.sweep import (
    DEFAULT_VOTE_SHARE,
    aggregate,
    apply_selection,
    plot_tradeoff,
    rows_to_csv,
    selection_footnote,
)
from privmtl.experiments.sweep_selection import (
    candidates_accounting,
    ledger_events,
    select_candidates,
)
from privmtl.federated.methods import method_class
from privmtl.federated.saved import load_models
from privmtl.federated.scoring import client_scores
from privmtl.federated.spec import SPEC, default_lam, resolve_clients_per_round
from privmtl.io import write_json_atomic
from privmtl.privacy.selection import SELECTION_METHODS

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
    clients_per_round: int | None = None,
    lam: float | Sequence[float] | None = None,
    lr: float = SPEC.lr,
    local_steps: int | None = None,
    finetune: str = SPEC.finetune,
    server_update: str = SPEC.server_update,
    progress: Callable[[Iterable[Any], int], Iterable[Any]] | None = None,
    noise_source: str = SPEC.noise_source,
    log: RunLog | None = None,
    select: str = "vote",
    vote_share: float = DEFAULT_VOTE_SHARE,
    client_column: str | None = None,
    label_column: str | None = None,
    feature_columns: Sequence[str] | None = None,
    scaling: str = DEFAULT_CLIENT_SCALING,
    device: str = DEFAULT_DEVICE,
) -> dict[str, Any]:
    """Run the sweep; returns ``{"rows": chosen rows, "candidates": all runs, "summary": ...}``.

    Per (seed, method, ε) one run among ``clips`` × ``rounds_grid`` (× ``lam`` when it is a list,
    for the methods that use λ: pmtl, fedprox) is chosen by ``select`` (module docstring;
    :func:`~privmtl.experiments.sweep_selection.select_candidates`): ``"vote"`` (default; the
    vote alone spends ``vote_share`` · ε), ``"client"`` or ``"pooled"`` (not covered). Every row states
    ``covered``, ``selection_method``, ``selection`` (its cost and the budget split) and, for a
    covered selection, ``epsilon`` = training of every candidate + selection
    (``training_epsilon``: the chosen run's own). With a ``log``
    (:class:`~privmtl.experiments.runlog.RunLog`), every finished run and every vote is
    appended to it, and those of the same configuration already logged are reused.

    ``data="table"`` reads a user's table with ``client_column``, ``label_column``,
    ``feature_columns`` and ``scaling`` (:func:`~privmtl.data.registry.load_federated`);
    ``clients_per_round`` (None: each seed's data's own
    :func:`~privmtl.federated.spec.resolve_clients_per_round`, ``min(20, m)``), ``lam`` (None:
    :func:`~privmtl.federated.spec.default_lam` of each method and ε), ``lr``, ``finetune``,
    ``server_update`` and ``noise_source`` default to the run
    spec's (:mod:`privmtl.federated.spec`), as ``run_pmtl``'s do. ``device`` is every run's
    (``run_pmtl``'s ``device``); it is not part of what makes a logged run reusable.
    """
    check_choice("select", select, SELECTION_METHODS)
    resolve_device(device)  # "cuda" without CUDA fails before any data is read
    table = _table_options(data, client_column, label_column, feature_columns, scaling)
    datasets = {s: load_federated(data, data_path=data_path, seed=s, **table) for s in seeds}
    # q of each seed's data (the spec's resolver, as run_pmtl's; an explicit q above m is an error)
    qs = {
        s: resolve_clients_per_round(clients_per_round, ds.n_clients, sampling=SPEC.sampling)
        for s, ds in datasets.items()
    }
    jobs = _sweep_jobs(seeds, methods, epsilons, clips, rounds_grid, lam)
    it: Iterable[Any] = jobs if progress is None else progress(jobs, len(jobs))
    candidates = []
    configs = []
    for seed, method, eps, clip, T, lam_ in it:
        cfg = {
            "sweep": "pmtl",
            "data": data,
            "data_path": None if data_path is None else str(data_path),
            **table,
            "model": model,
            "method": method,
            "epsilon": eps,
            "clip": clip,
            "rounds": T,
            "lam": lam_,
            "clients_per_round": qs[seed],
            "lr": lr,
            "local_steps": local_steps,
            "finetune": finetune,
            "server_update": server_update,
            "noise_source": noise_source,
            "seed": seed,
            # the run keeps its ledger's events and per-client scores (what selection reads)
            "selection_inputs": 1,
        }
        configs.append(cfg)
        done = None if log is None else log.get(cfg)
        if done is not None:
            candidates.append(done)
            continue
        row = _candidate_run(
            dataset=datasets[seed],
            data=data,
            model=model,
            method=method,
            epsilon=eps,
            clip=clip,
            rounds=T,
            clients_per_round=qs[seed],
            lam=lam_,
            lr=lr,
            server_update=server_update,
            local_steps=local_steps,
            finetune=finetune,
            seed=seed,
            noise_source=noise_source,
            device=device,
        )
        row["target_epsilon"] = eps
        candidates.append(row if log is None else log.add(cfg, row))
    rows = _select_rows(candidates, configs, select, noise_source, vote_share, log)
    return {
        "rows": rows,
        "candidates": [_public(c) for c in candidates],
        "summary": aggregate(rows),
        "select": select,
        "vote_share": vote_share if select == "vote" else None,
        "covered": all(r["covered"] for r in rows),
    }


def _table_options(
    data: str,
    client_column: str | None,
    label_column: str | None,
    feature_columns: Sequence[str] | None,
    scaling: str,
) -> dict[str, Any]:
    """The options of a user's table (``data="table"``; none for a registered data set)."""
    table: dict[str, Any] = {}
    if data == "table":
        table = {
            "client_column": client_column,
            "label_column": label_column,
            "feature_columns": None if feature_columns is None else list(feature_columns),
            "scaling": scaling,
        }
    return table


def _sweep_jobs(
    seeds: Sequence[int],
    methods: Sequence[str],
    epsilons: Sequence[float],
    clips: Sequence[float],
    rounds_grid: Sequence[int],
    lam: float | Sequence[float] | None,
) -> list[tuple[int, str, float | None, float, int, float]]:
    """Every candidate run of the sweep, ``(seed, method, ε, clip, T, λ)``: each method at each
    ε (and non-private; only non-private for a method that releases nothing) over the grid."""
    lams: list[float | None] = (
        [None]
        if lam is None
        else [float(lam)]
        if isinstance(lam, int | float)
        else [float(v) for v in lam]
    )
    jobs: list[tuple[int, str, float | None, float, int, float]] = []
    for seed, method in itertools.product(seeds, methods):
        declared = method_class(method)
        eps_list: list[float | None] = [*epsilons, None] if declared.communicates else [None]
        method_lams = lams if declared.tunes_lam else lams[:1]
        for eps in eps_list:
            for clip, T, lam_ in itertools.product(clips, rounds_grid, method_lams):
                # None: the spec's λ of this method, private (an ε target) or not, as run_pmtl's
                lam_ = default_lam(method, private=eps is not None) if lam_ is None else lam_
                jobs.append((seed, method, eps, clip, T, lam_))
    return jobs


def _select_rows(
    candidates: list[dict[str, Any]],
    configs: list[dict[str, Any]],
    select: str,
    noise_source: str,
    vote_share: float,
    log: RunLog | None,
) -> list[dict[str, Any]]:
    """One row per (seed, method, ε): the candidate its selection chose (or every client's own
    choice), with the selection's accounting; the log's counters keep counting runs only."""
    groups: dict[tuple[int, str, float | None], list[int]] = {}
    for i, row in enumerate(candidates):
        groups.setdefault((row["seed"], row["method"], row["target_epsilon"]), []).append(i)
    vote_logs = [0, 0]  # votes reused / logged: releases, not runs
    rows = []
    for (seed, _method, eps), idx in groups.items():
        group = [candidates[i] for i in idx]
        before = (0, 0) if log is None else (log.reused, log.computed)
        sel = select_candidates(
            select=select,
            scores=_client_val_accuracy(group),
            pooled=[c.get("val_accuracy") for c in group],
            events=[c["release_events"] for c in group],
            target_epsilon=eps,
            **candidates_accounting(group),
            noise_source=noise_source,
            seed=seed,
            vote_share=vote_share,
            log=log,
            log_key={"sweep": "pmtl-selection", "candidates": [configs[i] for i in idx]},
            what="(γ, T, λ)",
        )
        if log is not None:
            vote_logs[0] += log.reused - before[0]
            vote_logs[1] += log.computed - before[1]
        row = (
            group[sel["chosen"]]
            if sel["chosen"] is not None
            else _per_client_row(group, sel["choices"])
        )
        row = apply_selection(_public(row), sel)
        row["metric"] = "test_accuracy"
        row["value"] = row["test_accuracy"]
        if row["target_epsilon"] is None and row["method"] != "local":
            row["method"] = f"{row['method']} (non-private)"
        rows.append(row)
    if log is not None:  # the counters count runs
        log.reused -= vote_logs[0]
        log.computed -= vote_logs[1]
    return rows


def _public(row: dict[str, Any]) -> dict[str, Any]:
    """A run without the selection inputs kept in the run log (per-client scores, events).

    A candidate states ``covered`` under its own guarantee (its outputs precede any selection).
    """
    out = {k: v for k, v in row.items() if k not in ("client_scores", "release_events")}
    out.setdefault("covered", bool((row.get("guarantee") or {}).get("covered", True)))
    return out


def _client_val_accuracy(group: Sequence[dict[str, Any]]) -> np.ndarray:
    """(n_clients, K): every client's validation accuracy with its own model in every candidate."""
    cols = []
    for c in group:
        sc = c["client_scores"]
        n = np.asarray(sc["val_n"], dtype=float)
        correct = np.asarray(sc["val_correct"], dtype=float)
        with np.errstate(invalid="ignore", divide="ignore"):
            cols.append(np.where(n > 0, correct / np.where(n > 0, n, 1.0), np.nan))
    return np.stack(cols, axis=1)


def _per_client_row(group: Sequence[dict[str, Any]], choices: np.ndarray) -> dict[str, Any]:
    """The sweep row of a per-client choice: client ``i`` evaluated with candidate ``choices[i]``."""
    row = dict(group[0])
    rows = np.arange(len(choices))
    out: dict[str, Any] = {}
    for split in ("val", "test"):
        correct = np.stack([np.asarray(c["client_scores"][f"{split}_correct"]) for c in group], 1)
        n = np.asarray(group[0]["client_scores"][f"{split}_n"], dtype=float)
        mine = correct[rows, choices].astype(float)
        has = n > 0
        out[f"{split}_accuracy"] = float(mine.sum() / n.sum()) if n.sum() else math.nan
        out[f"{split}_mean_client"] = float(np.mean(mine[has] / n[has])) if has.any() else math.nan
    row.update(
        test_accuracy=out["test_accuracy"],
        val_accuracy=out["val_accuracy"],
        mean_client_accuracy=out["test_mean_client"],
        clip=None,
        rounds=None,
        lam=None,
        epsilon_per_round=[],
        global_test_accuracy=None,
    )
    return row


def _candidate_run(*, dataset: Any, noise_source: str, **kw: Any) -> dict[str, Any]:
    """One candidate run, plus what selection reads: its ledger's events and per-client scores.

    The run's ledger is read back from its (temporary) checkpoint directory, and every client's
    correct predictions on its validation and test splits are computed with its own model (its
    personalized model, or the released global model for the global methods) from the saved
    models; both directories are removed afterwards. Reading them is added to the run's
    ``scoring`` phase and ``seconds``.
    """
    with tempfile.TemporaryDirectory(prefix="privmtl-candidate-") as tmp:
        t = Path(tmp)
        row = run_pmtl(
            **kw,
            show_progress=False,
            dataset=dataset,
            noise_source=noise_source,
            checkpoint_dir=t / "run",
            checkpoint_every=int(kw["rounds"]),
            save_models=t / "models",
            baseline=False,  # the same for every candidate: not trained again for each
        )
        # what selection reads belongs to the run's time: its ``seconds`` stay its wall time
        with added_phase(row, "scoring"):
            events = ledger_events(t / "run" / "ledger.jsonl")
            row["client_scores"] = _client_scores(t / "models", dataset)
    row.pop("checkpoint_dir", None)
    row.pop("models_dir", None)
    if not events and row["guarantee"]["epsilon"] is None and kw["method"] != "local":
        events = [{"type": "non_private"}]  # releases without noise: ε = ∞
    row["release_events"] = events
    return row


def _client_scores(models_dir: Path, dataset: Any) -> dict[str, list[float]]:
    """Per client: correct predictions and examples on its validation and test splits."""
    import torch

    meta, glob, pers = load_models(models_dir)
    net = make_model(meta["model"]["name"], dataset, 0)
    buffers = {n: b.detach() for n, b in net.named_buffers()}
    m = dataset.n_clients
    if meta["primary"] == "personalized" and pers is not None:
        params = pers
    else:
        params = {n: p.unsqueeze(0).expand(m, *p.shape) for n, p in glob.items()}
    out: dict[str, list[float]] = {}
    for split in ("val", "test"):
        xs, ys = dataset.split(split)
        with torch.no_grad():
            correct, _ = client_scores(net, params, buffers, xs, ys)
        out[f"{split}_correct"] = [float(c) for c in correct]
        out[f"{split}_n"] = [float(y.shape[0]) for y in ys]
    return out


def write_pmtl_sweep(result: dict[str, Any], out_dir: Path, *, title: str) -> list[Path]:
    """CSV + JSON + accuracy-vs-ε PNG + per-round loss/ε PNG into ``out_dir`` (already atomic)."""
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
    covered = all(r.get("covered") is True for r in rows)
    subtitle = (
        f"δ={g['delta']:.3g}, neighbours: {g['relation']} one client, sampling: {g['sampling']} "
        f"(q={g['clients_per_round']} of m={g['num_clients']}), accountant: {g['accountant']}, "
        f"noise: {g['noise_source']}; (γ, T, λ) per ε; {selection_footnote(rows)}"
    )
    plot_tradeoff(
        result["summary"],
        files[2],
        metric_label="test accuracy (pooled)",
        title=title,
        lower_is_better=False,
        subtitle=subtitle,
        x_key="epsilon" if covered else "target_epsilon",
        x_label=(
            "ε of training + selection (smaller is more private)"
            if covered
            else "ε of the chosen run's training only (selection NOT covered)"
        ),
    )
    plot_rounds(rows, files[3])
    return files


def _train_loss(row: dict[str, Any]) -> list[Any] | None:
    """The per-round training loss when the run published it (a curator diagnostic)."""
    diag = row.get("curator_diagnostics") or {}
    loss = diag.get("train_loss_per_round", row.get("train_loss_per_round"))
    return None if not loss else list(loss)


def plot_rounds(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """ε after every round (PMTL paper Fig. 2) for the chosen private runs, and their training loss
    where the runs published it.

    The training loss is a curator diagnostic computed from un-noised client losses: it is not
    covered by the guarantee, and its panel says so. Without it (the default JSON of
    ``run_pmtl``) the figure has the ε panel only, and a line saying why. Runs with the same σ, q
    and T have the same ε curve: each method has its own line style and markers, so that no curve
    hides another.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [
        row
        for row in sorted(rows, key=lambda r: (r["method"], r.get("target_epsilon") or math.inf))
        if row["seed"] == rows[0]["seed"]
    ]
    with_loss = any(_train_loss(row) is not None for row in shown)
    if with_loss:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=120)
    else:
        fig, ax2 = plt.subplots(1, 1, figsize=(6.4, 3.8), dpi=120)
    methods = list(dict.fromkeys(row["method"] for row in shown))
    styles = ("-", "--", ":", "-.")
    markers = ("o", "s", "^", "D", "v", "x")
    # one colour per run: tab10 up to 10 runs, tab20 beyond (runs never share a colour up to 20)
    colors = plt.get_cmap("tab10" if len(shown) <= 10 else "tab20").colors  # type: ignore[attr-defined]
    for i, row in enumerate(shown):
        color = colors[i % len(colors)]
        j = methods.index(row["method"])
        style = {"color": color, "linestyle": styles[j % len(styles)]}
        label = (
            f"{row['method']} ε={row['target_epsilon']:g}"
            if row["target_epsilon"]
            else row["method"]
        )
        loss_values = _train_loss(row)
        if with_loss and loss_values is not None:
            loss = np.array([np.nan if v is None else v for v in loss_values], dtype=float)
            ax1.plot(np.arange(1, loss.size + 1), loss, label=label, lw=1, **style)
        eps = [e for e in row.get("epsilon_per_round") or [] if e is not None]
        if eps and row["guarantee"]["private"]:
            every = max(1, len(eps) // 6)  # markers staggered by method: equal curves stay apart
            ax2.plot(
                np.arange(1, len(eps) + 1), eps, label=label, lw=1.2, marker=markers[j % 6],
                markersize=4, markevery=(j % every, every), **style,
            )  # fmt: skip
    axes = [ax2]
    if with_loss:
        axes.insert(0, ax1)
        ax1.set_xlabel("round")
        ax1.set_ylabel("training loss (sampled clients)")
        ax1.set_yscale("log")
        ax1.set_title("curator diagnostic: NOT covered by the guarantee", fontsize=8)
    else:
        fig.text(
            0.5, 0.01, "training loss not published (a curator diagnostic; pmtl --diagnostics)",
            ha="center", va="bottom", fontsize=7,
        )  # fmt: skip
    ax2.set_xlabel("round")
    ax2.set_ylabel("ε of the chosen run's training (at its δ)")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    fig.tight_layout(rect=(0, 0.0 if with_loss else 0.04, 1, 1))
    fig.savefig(path)
    plt.close(fig)
