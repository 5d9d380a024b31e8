"""ε sweeps: run methods over privacy levels and seeds, tabulate, and plot the privacy–accuracy trade-off.

Selection. A sweep that picks one configuration among candidate runs per (seed, method, ε) makes
that choice with :func:`~privmtl.experiments.sweep_selection.select_candidates` (a module of its
own: this one, which the CLI imports at start-up, loads neither PyTorch nor the accountant), one
of :data:`~privmtl.privacy.SELECTION_METHODS`:

``"vote"`` (the default, covered)
    Every client votes for the candidate best on its own validation split; the curator releases
    the noisy histogram (:class:`~privmtl.privacy.ClientVote`, its σ calibrated so that the vote
    alone is (``vote_share`` · ε, δ)-DP) and keeps the argmax. The row's ``epsilon`` is the ledger
    composition of *every* candidate's recorded releases and the vote
    (:func:`~privmtl.privacy.record_candidates`): the ε that covers training and selection.
``"client"`` (covered)
    Every client keeps the candidate best on its own validation split (each client's outputs
    come from one candidate; no vote is released). ``epsilon`` is the composition of every
    candidate's releases (each client read all of them to choose).
``"pooled"`` (opt-in, NOT covered)
    The candidate with the best pooled validation score over all clients: a statistic of every
    client's data that is not a recorded release. Rows say ``"covered": false`` with the reason,
    and ``epsilon`` is the chosen run's training ε only.

Every row carries ``covered``, ``selection_method`` and ``selection`` (what was released and its
cost, the budget split between the vote and the training runs); the CSV has the same columns.

The plot follows the MP-MTL paper's Figs. 6 and 9 (and the PMTL paper's Fig. 3): the metric against ε
on a log axis for each private method (mean ± std over seeds), with the methods that do not depend on
ε (single-task learning, non-private MTL) drawn as horizontal reference lines.
"""

from __future__ import annotations

import csv
import io
import math
import textwrap
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_VOTE_SHARE",
    "aggregate",
    "apply_selection",
    "plot_tradeoff",
    "rows_to_csv",
    "run_sweep",
    "selection_footnote",
]

#: Default share of a sweep point's ε that the vote alone spends: the vote's σ is calibrated so
#: that the vote by itself is (DEFAULT_VOTE_SHARE · ε, δ)-DP.
DEFAULT_VOTE_SHARE = 0.5

#: Columns written to the sweep CSV (the JSON carries every key of every row); each row states its
#: own guarantee (relation, sampling, accountant, notion, validity, noise source).
CSV_COLUMNS = (
    "method",
    "epsilon",
    "target_epsilon",
    "delta",
    "relation",
    "sampling",
    "accountant",
    "notion",
    "valid",
    "noise_source",
    "covered",
    "selection_method",
    "training_epsilon",
    "seed",
    "metric",
    "value",
    "seconds",
)


#: (run_one, common kwargs) of the sweep being run in parallel; inherited by forked workers.
_WORKER: tuple[Callable[..., dict[str, Any]], dict[str, Any]] | None = None


def _one_blas_thread() -> None:
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)


def _run_job(job: tuple[str, float | None, int]) -> tuple[dict[str, Any], list[Any]]:
    assert _WORKER is not None
    run_one, common = _WORKER
    method, eps, seed = job
    with warnings.catch_warnings(record=True) as caught:  # re-emitted in the parent process
        warnings.simplefilter("always", RuntimeWarning)
        row = run_one(method=method, epsilon=eps, seed=seed, **common)
    return row, [(w.message, w.category, w.filename, w.lineno) for w in caught]


def run_sweep(
    run_one: Callable[..., dict[str, Any]],
    *,
    methods: Sequence[str],
    epsilons: Sequence[float | None],
    seeds: Sequence[int],
    private_methods: Iterable[str],
    metric: str,
    progress: Callable[[Iterable[Any], int], Iterable[Any]] | None = None,
    n_jobs: int = 1,
    **common: Any,
) -> list[dict[str, Any]]:
    """Call ``run_one(method=, epsilon=, seed=, **common)`` over the grid and collect result rows.

    Methods not in ``private_methods`` are run once per seed (ε-independent reference lines).
    ``n_jobs > 1`` runs the jobs in that many forked worker processes (one BLAS thread each; POSIX
    only, otherwise sequential). Every job seeds itself from its own (method, ε, seed), so the rows
    are identical to a sequential run and come back in the same order; ``run_one`` must then not
    rely on state shared between jobs.
    """
    global _WORKER
    private = set(private_methods)
    jobs: list[tuple[str, float | None, int]] = []
    for seed in seeds:
        for method in methods:
            if method in private:
                jobs.extend((method, eps, seed) for eps in epsilons)
            else:
                jobs.append((method, None, seed))
    results: list[dict[str, Any]] = []
    ctx = None
    if n_jobs > 1 and len(jobs) > 1:
        import multiprocessing

        try:
            ctx = multiprocessing.get_context("fork")
        except ValueError:  # no fork on this platform: run sequentially
            ctx = None
    if ctx is None:
        it: Iterable[Any] = jobs if progress is None else progress(jobs, len(jobs))
        results = [run_one(method=m, epsilon=e, seed=s, **common) for m, e, s in it]
    else:
        from concurrent.futures import ProcessPoolExecutor, as_completed

        _WORKER = (run_one, common)
        try:
            with ProcessPoolExecutor(
                max_workers=min(n_jobs, len(jobs)), mp_context=ctx, initializer=_one_blas_thread
            ) as pool:
                futures = {pool.submit(_run_job, job): i for i, job in enumerate(jobs)}
                done: Iterable[Any] = as_completed(futures)
                if progress is not None:
                    done = progress(done, len(jobs))
                by_index: dict[int, dict[str, Any]] = {}
                for fut in done:
                    by_index[futures[fut]], caught = fut.result()
                    for message, category, filename, lineno in caught:
                        warnings.warn_explicit(message, category, filename, lineno)
            results = [by_index[i] for i in range(len(jobs))]
        finally:
            _WORKER = None
    rows = []
    for row in results:
        row["metric"] = metric
        row["value"] = row.get(metric)
        rows.append(row)
    return rows


def apply_selection(row: dict[str, Any], selection: dict[str, Any]) -> dict[str, Any]:
    """The chosen row restated under the selection's guarantee (``covered``, ``epsilon``, ...).

    A covered selection replaces ``epsilon`` (and the guarantee's) by the ε of training and
    selection; the run's own ε moves to ``training_epsilon``. A pooled selection keeps the
    run's ε and adds its reason to the guarantee's ``not_covered``.
    """
    out = dict(row)
    g = dict(out.get("guarantee") or {})
    out["training_epsilon"] = row.get("epsilon")
    public = {k: v for k, v in selection.items() if k not in ("choices", "reason")}
    out["selection"] = public
    out["selection_method"] = selection["method"]
    notes = list(g.get("notes") or [])
    not_covered = list(g.get("not_covered") or [])
    if selection["covered"]:
        out["epsilon"] = selection["epsilon"]
        g["epsilon"] = selection["epsilon"]
        notes.append(selection["note"])
    else:
        not_covered.append(selection["reason"])
    g["notes"], g["not_covered"] = notes, not_covered
    g["covered"] = not not_covered
    out["guarantee"] = g
    out["covered"] = g["covered"]
    if isinstance(out.get("summary"), str):
        out["summary"] += (
            f"; with {selection['method']} selection over {selection['candidates']} candidates"
            + (
                f": ε (training + selection) = {selection['epsilon']:.4g}"
                if selection["covered"] and selection["epsilon"] is not None
                else ""
            )
            + ("" if g["covered"] else " — NOT COVERED: " + "; ".join(not_covered))
        )
    return out


def _covered(row: dict[str, Any]) -> bool | None:
    """The row's ``covered`` (or its guarantee's); None when the row does not say."""
    value = row.get("covered", (row.get("guarantee") or {}).get("covered"))
    return None if value is None else bool(value)


def _all_covered(values: Sequence[bool | None]) -> bool | None:
    """False if any is False, None (unknown) if any is unknown, else True."""
    if any(v is False for v in values):
        return False
    return None if any(v is None for v in values) else True


def selection_footnote(rows: Sequence[dict[str, Any]]) -> str:
    """One line for a table or plot: which selection the rows used and whether they are covered."""
    methods = sorted({str(r.get("selection_method")) for r in rows if r.get("selection_method")})
    covered = _all_covered([_covered(r) for r in rows])
    text = "selection: " + (", ".join(methods) or "none")
    if covered is None:
        return text + "; coverage not stated by every row"
    if covered:
        return (
            text + "; every output covered, ε shown includes training of all candidates + selection"
        )
    return text + "; NOT covered: pooled selection reads every client's validation data"


def rows_to_csv(rows: Sequence[dict[str, Any]]) -> str:
    """CSV text of the sweep rows (one line per run)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(CSV_COLUMNS), extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        g = row.get("guarantee") or {}  # the row's own guarantee fills what the row lacks
        cells = {k: row[k] if k in row else g.get(k) for k in CSV_COLUMNS}
        if g.get("private") is False:  # no noise, no ε: the row says so
            cells["notion"], cells["noise_source"] = "non-private", "none"
        elif g and g.get("epsilon") == 0:  # nothing leaves a task or client: nothing to noise
            cells["noise_source"] = "none"
        writer.writerow({k: ("" if v is None else v) for k, v in cells.items()})
    return buf.getvalue()


def aggregate(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and std of ``value`` per (method, target ε) over seeds.

    ``epsilon`` is the largest reported ε of the group (for covered selections: training and
    selection), ``covered`` whether every row of the group is covered.
    """
    groups: dict[tuple[str, float | None], list[float]] = defaultdict(list)
    eps_real: dict[tuple[str, float | None], list[float]] = defaultdict(list)
    covered: dict[tuple[str, float | None], list[bool | None]] = defaultdict(list)
    selected: dict[tuple[str, float | None], set[str]] = defaultdict(set)
    for row in rows:
        key = (row["method"], row.get("target_epsilon"))
        covered[key].append(_covered(row))
        if row.get("selection_method"):
            selected[key].add(str(row["selection_method"]))
        if row.get("value") is not None:
            groups[key].append(float(row["value"]))
        e = row.get("epsilon")
        eps_real[key].append(math.inf if e is None else float(e))
    out = []
    for (method, target), vals in sorted(
        groups.items(), key=lambda kv: (kv[0][0], math.inf if kv[0][1] is None else kv[0][1])
    ):
        arr = np.asarray(vals)
        out.append(
            {
                "method": method,
                "target_epsilon": target,
                "epsilon": max(eps_real[(method, target)]),
                "mean": float(arr.mean()),
                "std": float(arr.std(ddof=1)) if arr.size > 1 else 0.0,
                "n": int(arr.size),
                "covered": _all_covered(covered[(method, target)]),
                "selection_method": ",".join(sorted(selected[(method, target)])) or None,
            }
        )
    return out


def plot_tradeoff(
    summary: Sequence[dict[str, Any]],
    path: Path,
    *,
    metric_label: str,
    title: str,
    lower_is_better: bool = True,
    subtitle: str | None = None,
    x_key: str = "target_epsilon",
    x_label: str = "ε (privacy budget; smaller is more private)",
    label_key: str | None = None,
) -> None:
    """Write a PNG: metric vs ε (log x) per private method, ε-free methods as horizontal lines.

    ``x_key`` is the summary key on the x axis: ``"target_epsilon"`` (each run's target) or
    ``"epsilon"`` (the reported ε, e.g. training and selection composed). ``label_key``: a
    summary key whose value labels every point of the curves (e.g. ``"epsilon"``, the ε
    charged, when x is the target).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.6), dpi=120)
    curves: dict[str, list[dict[str, Any]]] = defaultdict(list)
    refs: list[dict[str, Any]] = []
    for row in summary:
        (refs if row["target_epsilon"] is None else curves[row["method"]]).append(row)
    markers = "osD^v<>p*h"
    # one colour per line: tab10 up to 10 lines, tab20 beyond (11 lines never share a colour)
    n_lines = len(curves) + len(refs)
    colors = plt.get_cmap("tab10" if n_lines <= 10 else "tab20").colors  # type: ignore[attr-defined]
    for i, (method, pts) in enumerate(sorted(curves.items())):
        pts = sorted(pts, key=lambda r: r["target_epsilon"])
        x = [p[x_key] for p in pts]
        y = np.array([p["mean"] for p in pts])
        e = np.array([p["std"] for p in pts])
        color = colors[i % len(colors)]
        ax.plot(x, y, marker=markers[i % len(markers)], label=method, color=color)
        ax.fill_between(x, y - e, y + e, alpha=0.15, color=color)
        for p, xi, yi in zip(pts, x, y, strict=True) if label_key else ():
            value = p.get(str(label_key))
            text = "∞" if value is None or not math.isfinite(value) else f"{value:.3g}"
            text = f"charged ε={text}"
            ax.annotate(text, (xi, yi), textcoords="offset points", xytext=(4, 6), fontsize=7,
                        color=color)  # fmt: skip
    styles = ["--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1))]
    for i, ref in enumerate(refs):
        ax.axhline(
            ref["mean"],
            linestyle=styles[i % len(styles)],
            color=colors[(len(curves) + i) % len(colors)],
            label=f"{ref['method']} (ε = 0)"
            if ref["epsilon"] == 0
            else ref["method"]
            if "non-private" in ref["method"]  # already named so (pmtl-sweep's references)
            else f"{ref['method']} (non-private)",
        )
    ax.set_xscale("log")
    means = [float(r["mean"]) for r in summary if r.get("mean") is not None]
    if lower_is_better and means and min(means) > 0 and max(means) / min(means) > 20:
        ax.set_yscale("log")  # e.g. nMSE from 0.01 (MTL) to 7 (DP-MTRL): keep both readable
    ax.set_xlabel(x_label)
    ax.set_ylabel(
        metric_label + (" (lower is better)" if lower_is_better else " (higher is better)")
    )
    ax.set_title("\n".join(textwrap.wrap(title, 90, break_on_hyphens=False)), fontsize=11)
    bottom = 0.0
    if subtitle:  # wrapped to the figure's width, with room kept for every line
        lines = textwrap.wrap(subtitle, 115, break_on_hyphens=False)
        fig.text(0.5, 0.01, "\n".join(lines), ha="center", va="bottom", fontsize=7, color="0.3")
        bottom = 0.02 + 0.03 * len(lines)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout(rect=(0, bottom, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
