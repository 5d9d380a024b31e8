"""Population study: where private collaboration pays off as the number of clients grows.

The synthetic federation of ``privmtl pmtl --data synthetic --num-clients M``
(:func:`privmtl.data.federated.make_synthetic_federated` with ``n_clients = M``, every other
generator parameter at its documented default: d = 60 features, C = 10 classes, LEAF's law of
examples per client, client models W_0 + τ A_k with τ = 0.5, feature shift 0.5, isotropic features
with client means spread 0.5), multinomial logistic regression, Poisson client sampling of
``q = min(M, 200)`` clients per round, T = 200 rounds, every other option at the CLI default.
Privacy: client-level (ε, δ) joint DP of the billboard sequence at the default
δ = min(1e-5, 1/(100 M)), add/remove-one-client relation, Poisson subsampling, RDP accountant; σ
calibrated to ε; noise from the seeded source (``--reproducible-noise``: a research simulation,
not a deployment). Every client is scored on its own test split (pooled accuracy over all test
examples), including clients that were sampled rarely or never.

Rows carry the CLI defaults they were measured at (``defaults``). At today's defaults
(``"covered"``: Ditto's client message, ``--finetune auto`` and ``--method local-all`` choosing
per client on the client's own validation split, no curator diagnostics) every row is covered by
its guarantee (``covered``) and records its selection (``selection``: which, how many clients
kept each candidate, its ε cost: 0, the per-client choices being post-processing of the
releases). One training run gives two numbers: the trained models
(``pre_finetune_test_accuracy``: PMTL's personalized models, FedAvg's global model) and the CLI's
answer (``test_accuracy``). The rows' norm column is public: the noise norm σ√k of one release
(the signal norm is a curator diagnostic, not covered). Rows of the earlier defaults are kept as
history, not covered: ``"ditto+auto"`` (the same message, but one fine-tuning setting and the
keep-or-not choice on the *pooled* validation accuracy, local-all likewise, δ = 1/M, curator
diagnostics) and, without the field, ``"offset+none"`` (the offset message, no fine-tuning, with
explicit pooled fine-tuning from the billboard over ``--method local-all``'s grid,
:data:`FINETUNE`). Each run is the command in the ``command`` field of its JSONL row, e.g.::

    privmtl pmtl --data synthetic --num-clients 10000 --model logreg --method pmtl \
        --clients-per-round 200 --rounds 200 --reproducible-noise --quiet --epsilon 1 \
        --seed 0 --json

Modes::

    python benchmarks/pmtl_population.py study --ms 100 1000 10000 --seeds 0
    python benchmarks/pmtl_population.py grid        # feature laws and tau at m = 1000
    python benchmarks/pmtl_population.py report      # markdown tables + PNG from the JSONL
    python benchmarks/pmtl_population.py speed --m 10000 --clients-per-round 100 --rounds 5

``speed`` times rounds of the engine at ``m`` clients with persistent personalized models (seconds
per round, wall and CPU) and reports the peak resident memory of the process. Rows of the
generator's earlier feature law (LEAF's covariance, client means spread 1) carry
``feature_law = "leaf"`` (absent in the oldest rows) and are reported in their own table.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import shlex
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, append_jsonl, load_jsonl, machine_info, mean_std

EPSILONS: tuple[float | None, ...] = (0.5, 1.0, 2.0, 4.0, None)
METHODS = ("pmtl", "fedavg", "local")
JSONL = RESULTS / "pmtl_population.jsonl"
FEATURE_LAW = "isotropic-0.5"  # the generator's default feature law (covariance, mean spread)
FINETUNE = [
    "--finetune", "vanilla", "--finetune-start", "billboard",
    "--finetune-epochs", "1,3,10,30,100", "--finetune-lrs", "0.01,0.03,0.1",
    "--finetune-select", "pooled",
]  # fmt: skip
"""Every client fine-tunes from the billboard with local-all's grid and selection (the
explicit fine-tuning of the rows measured at the earlier defaults)."""
DEFAULTS = "covered+vote"
"""The CLI defaults of new rows: ``--server-update ditto``, ``--finetune auto`` with
``--finetune-select auto`` and ``--local-solver auto`` (the clients' recorded vote over exact
ridge candidates where a vote can be held, 5 % of ε composed into the reported ε; else every
client's own choice among the SGD grids), ``--method local-all`` choosing (epochs, lr) per
client, the default δ = min(1e-5, 1/(100 m)), no curator diagnostics: every output is covered by
the guarantee."""
COVERED = "covered"
"""The previous covered defaults: ``--finetune auto`` chosen by every client on its own
validation split among the SGD grids, everything else as :data:`DEFAULTS`. A row of these
defaults is also a row of :data:`DEFAULTS` where today's defaults hold no vote (local training,
non-private runs, a vote too noisy to hold): the same computation (:func:`current`)."""
POOLED = "ditto+auto"
"""The earlier defaults with pooled selection (``--finetune auto`` chose one setting and whether
to keep the fine-tuned models on the pooled validation accuracy; ``local-all`` chose one setting
for all clients the same way), δ = 1/m and curator diagnostics: not covered."""
EARLIER = "offset+none"
"""The earlier CLI defaults (``--server-update offset``, no fine-tuning)."""


def defaults_of(row: dict[str, Any]) -> str:
    """The CLI defaults a row was measured at (rows without the field: the earlier ones)."""
    return str(row.get("defaults", EARLIER))


def vote_held(m: int, eps: float | None, delta: float) -> bool:
    """Whether today's defaults hold the end-of-run vote in a private run (target ``eps``) of
    ``m`` clients at ``delta`` (the public plan of ``run_pmtl``)."""
    from privmtl.federated.finish import FINETUNE_VOTE_SHARE, FINETUNE_VOTERS
    from privmtl.privacy.selection import plan_vote

    if eps is None:
        return False
    plan = plan_vote(min(m, FINETUNE_VOTERS), epsilon=eps, delta=delta, share=FINETUNE_VOTE_SHARE)
    return plan.held


def current(row: dict[str, Any]) -> bool:
    """Whether a row is a run at today's defaults: measured at :data:`DEFAULTS`, or at
    :data:`COVERED` where today's defaults hold no vote (the same computation)."""
    if defaults_of(row) == DEFAULTS:
        return True
    if defaults_of(row) != COVERED:
        return False
    return row["method"] == "local" or not vote_held(
        row["m"], row["target_epsilon"], float(row["delta"])
    )


def feature_law(row: dict[str, Any]) -> str:
    """The feature law a row was measured under (rows before the isotropic default: LEAF's)."""
    return str(row.get("feature_law", "leaf"))


def argv_for(
    method: str, m: int, eps: float | None, rounds: int, q: int, defaults: str = DEFAULTS
) -> list[str]:
    """The ``privmtl pmtl`` arguments of one run (without --seed and --json); ``EARLIER``
    spells out the earlier defaults and adds the explicit fine-tuning :data:`FINETUNE`."""
    if method == "local":  # every client trains alone, epochs and lr chosen on validation
        return [
            "--data", "synthetic", "--num-clients", str(m), "--model", "logreg",
            "--method", "local-all", "--quiet",
        ]  # fmt: skip
    argv = [
        "--data", "synthetic", "--num-clients", str(m), "--model", "logreg",
        "--method", method, "--clients-per-round", str(min(q, m)), "--rounds", str(rounds),
        "--reproducible-noise", "--quiet",
    ]  # fmt: skip
    if defaults == EARLIER:
        argv += ["--server-update", "offset", *FINETUNE]
    if eps is not None:  # the earlier rows ran at the PMTL paper's delta = 1/m
        paper = defaults not in (DEFAULTS, COVERED)
        argv += ["--epsilon", f"{eps:g}"] + (["--paper-delta"] if paper else [])
    return argv


def _kwargs(argv: list[str]) -> dict[str, Any]:
    """``run_pmtl`` keyword arguments equal to the CLI arguments ``argv`` (one torch thread)."""
    kw: dict[str, Any] = {"show_progress": False, "threads": 1}
    it = iter(argv)
    for flag in it:
        if flag == "--quiet":
            continue
        if flag == "--reproducible-noise":
            kw["noise_source"] = "seeded"
            continue
        if flag == "--paper-delta":
            kw["delta"] = "paper"
            continue
        value = next(it)
        key = flag[2:].replace("-", "_")
        if key in ("num_clients", "clients_per_round", "rounds"):
            kw[key] = int(value)
        elif key in ("epsilon", "lam", "server_lr", "delta"):
            kw[key] = float(value)
        elif key == "finetune_epochs":
            kw[key] = [int(v) for v in value.split(",")]
        elif key == "finetune_lrs":
            kw[key] = [float(v) for v in value.split(",")]
        else:
            kw[key] = value
    return kw


def _median(values: Any) -> float | None:
    vals = sorted(v for v in values or [] if v is not None)
    return vals[len(vals) // 2] if vals else None


def _norms(out: dict[str, Any]) -> dict[str, Any]:
    """Per-release norms: the curator's medians only with diagnostics (not covered); otherwise the
    public noise norm σ√k of one release (σ, k and γ are public), no signal norm."""
    diag = out.get("curator_diagnostics")
    if diag is not None:
        return {
            "median_signal_norm": _median(diag.get("signal_norm_per_round")),
            "median_noise_norm": _median(diag.get("noise_norm_per_round")),
        }
    from privmtl.privacy.release import billboard_noise_and_bound

    sigma, dim = out.get("noise_std"), out.get("released_dim")
    if not sigma or not dim:
        return {"noise_norm_per_release": None}
    noise, _ = billboard_noise_and_bound(float(sigma), out.get("clip"), int(dim), 1)
    return {"noise_norm_per_release": noise}


def _selection(out: dict[str, Any]) -> dict[str, Any]:
    """Which selection produced the row's models and what it cost in ε (per-client choices on
    each client's own validation split are post-processing of the releases: ε = 0)."""
    auto, local = out.get("finetune_auto") or {}, out.get("local_selection") or {}
    if out["method"] == "local-all":
        select = local.get("select")
        counts = dict(
            zip(
                map(str, map(tuple, local.get("grid", []))),
                local.get("clients_per_choice", []),
                strict=True,
            )
        )
    else:
        select = auto.get("select") or (out.get("finetune_selection") or {}).get("select")
        counts = auto.get("clients_per_candidate")
    if select == "vote":
        vote = auto.get("vote") or {}
        return {
            "select": select,
            "clients_per_choice": counts,
            "winner": vote.get("winner"),
            "epsilon_cost": vote.get("epsilon"),
            "note": "the clients' recorded noisy vote on their own validation splits: its "
            "epsilon is composed into the reported epsilon",
        }
    return {
        "select": select,
        "clients_per_choice": counts,
        "epsilon_cost": 0.0 if select == "client" else None,
        "note": "per-client choice on the client's own validation split: post-processing, "
        "no privacy cost"
        if select == "client"
        else "pooled validation selection: tuning, not charged (not covered)",
    }


def _row(out: dict[str, Any]) -> dict[str, Any]:
    """The fields every result row states (accuracy and the full privacy statement)."""
    return {
        "test_accuracy": out["test_accuracy"],
        "mean_client_accuracy": out["mean_client_accuracy"],
        "pre_finetune_test_accuracy": out.get("pre_finetune_test_accuracy"),
        "finetune_selection": out.get("finetune_selection"),
        "finetune_auto": out.get("finetune_auto"),
        "server_update": out.get("server_update"),
        **_norms(out),
        "covered": out["covered"],
        "not_covered": out["guarantee"].get("not_covered", []),
        "selection": _selection(out),
        "global_test_accuracy": out.get("global_test_accuracy"),
        "epsilon": out["epsilon"],
        "delta": out["delta"],
        "relation": out["relation"],
        "sampling": out["sampling"],
        "accountant": out["accountant"],
        "noise_source": out["noise_source"] if out["method"] != "local-all" else None,
        "noise_std": out["noise_std"],
        "lam": out["lam"],
        "personal_init": out["personal_init"],
        "local_selection": out.get("local_selection"),
        "summary": out["summary"],
    }


def _run(
    argv: list[str], seed: int, dataset: Any = None, diagnostics: bool = False
) -> dict[str, Any]:
    """Run ``privmtl pmtl argv --seed seed`` in process (same code path as the CLI);
    ``diagnostics`` adds the curator's un-noised norms (the row is then not covered)."""
    import torch

    from privmtl.experiments.pmtl import run_pmtl

    torch.set_num_threads(1)  # fine-tuning and scoring too: two runs share the 2 cores
    kw = _kwargs(argv)
    if dataset is not None:
        kw.pop("num_clients", None)
    out: dict[str, Any] = run_pmtl(**kw, seed=seed, dataset=dataset, diagnostics=diagnostics)
    return out


GRID_JSONL = RESULTS / "pmtl_population_grid.jsonl"
#: (feature_cov, feature_spread, tau) of the grid at m = 1000; the first is the default
GRID_SETTINGS: tuple[tuple[str, float, float], ...] = (
    ("isotropic", 0.5, 0.5),
    ("isotropic", 1.0, 0.5),
    ("leaf", 1.0, 0.5),
    ("isotropic", 0.5, 0.25),
    ("isotropic", 0.5, 1.0),
)
GRID_RUNS: tuple[tuple[str, float | None], ...] = (
    ("local", None),
    ("pmtl", 1.0),
    ("fedavg", 1.0),
)


def grid_dataset(m: int, cov: str, spread: float, tau: float, seed: int) -> Any:
    """The synthetic federation of one grid setting (other generator parameters at default)."""
    from privmtl.data.federated import make_synthetic_federated

    return make_synthetic_federated(
        n_clients=m, feature_cov=cov, feature_spread=spread, heterogeneity=tau, random_state=seed
    )


def _majority_class(ds: Any) -> float:
    """Fraction of examples in their client's most frequent class (all splits)."""
    import torch

    hits = total = 0
    for k in range(ds.n_clients):
        y = torch.cat([ds.train_y[k], ds.val_y[k], ds.test_y[k]])
        hits += int(torch.bincount(y).max())
        total += len(y)
    return hits / total


def _grid_key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r.get("feature_cov"), r.get("feature_spread"), r.get("tau"))


def grid(args: argparse.Namespace) -> None:
    done = {
        (*_grid_key(r), r["method"], r["target_epsilon"], r["seed"]) for r in load_jsonl(GRID_JSONL)
    }
    m, seed = args.m, 0
    for cov, spread, tau in GRID_SETTINGS:
        ds = None
        for method, eps in GRID_RUNS:
            if (cov, spread, tau, method, eps, seed) in done:
                continue
            if ds is None:
                ds = grid_dataset(m, cov, spread, tau, seed)
            argv = argv_for(method, m, eps, args.rounds, args.clients_per_round, EARLIER)
            t0 = time.perf_counter()
            out = _run(argv, seed, dataset=ds, diagnostics=True)  # earlier rows: not covered
            row = {
                "m": m,
                "feature_cov": cov,
                "feature_spread": spread,
                "tau": tau,
                "majority_class": _majority_class(ds),
                "method": method,
                "target_epsilon": eps,
                "seed": seed,
                **_row(out),
                "seconds": time.perf_counter() - t0,
                "data": f"make_synthetic_federated(n_clients={m}, feature_cov={cov!r}, "
                f"feature_spread={spread}, heterogeneity={tau}, random_state={seed})",
                "command": "privmtl pmtl " + " ".join(argv) + f" --seed {seed} --json "
                "(on the data above)",
            }
            append_jsonl(GRID_JSONL, row)
            print(
                f"{cov} spread={spread} tau={tau} {method} eps={eps}: "
                f"{row['test_accuracy']:.4f} ({row['seconds']:.0f}s)",
                flush=True,
            )


def study(args: argparse.Namespace) -> None:
    variant = args.extra.strip() or None
    done = {  # local-all changed too (per-client selection): every method re-runs
        (r["method"], r["m"], r["target_epsilon"], r["seed"])
        for r in load_jsonl(JSONL)
        if r.get("variant") == variant and feature_law(r) == FEATURE_LAW and current(r)
    }
    for m in args.ms:
        for seed in args.seeds:
            for method in args.methods:
                for eps in EPSILONS if method != "local" else (None,):
                    wanted = [None if math.isinf(e) else e for e in args.epsilons]
                    if args.epsilons and method != "local" and eps not in wanted:
                        continue
                    key = (method, m, eps, seed)
                    if key in done:
                        continue
                    argv = argv_for(method, m, eps, args.rounds, args.clients_per_round)
                    argv += shlex.split(args.extra)
                    t0 = time.perf_counter()
                    out = _run(argv, seed)
                    row = {
                        "feature_law": FEATURE_LAW,
                        "defaults": DEFAULTS,
                        "variant": variant,
                        "method": method,
                        "m": m,
                        "target_epsilon": eps,
                        "seed": seed,
                        **_row(out),
                        "seconds": time.perf_counter() - t0,
                        "command": "privmtl pmtl " + " ".join(argv) + f" --seed {seed} --json",
                    }
                    append_jsonl(JSONL, row)
                    print(
                        f"{method:>7} m={m:>6} eps={eps} seed={seed} {variant or ''}: "
                        f"{row['pre_finetune_test_accuracy'] or row['test_accuracy']:.4f} -> "
                        f"{row['test_accuracy']:.4f} ({row['seconds']:.0f}s)",
                        flush=True,
                    )


def _cell(rows: list[dict[str, Any]], key: str) -> tuple[str, float]:
    mu, sd, n = mean_std(r[key] for r in rows if r.get(key) is not None)
    if n == 0:
        return "—", math.nan
    return f"{mu:.3f}" + (f" ± {sd:.3f}" if n > 1 else "") + (f" (n={n})" if n > 1 else ""), mu


def _at(
    rows: list[dict[str, Any]],
    m: int,
    eps: float | None,
    method: str | None = None,
    variant: str | None = None,
) -> list[dict[str, Any]]:
    """The rows of one cell: population ``m``, target ``eps`` (and method, variant if given)."""
    return [
        r
        for r in rows
        if r["m"] == m
        and r["target_epsilon"] == eps
        and (method is None or r["method"] == method)
        and (variant is None or r.get("variant") == variant)
    ]


def _eps_label(method: str, eps: float | None) -> str:
    if eps is None:
        return "0 (nothing shared)" if method == "local" else "∞ (non-private)"
    return f"{eps:g}"


#: (label, method, row key) of the study's lines at today's defaults: each federated run gives its
#: trained models and the CLI's answer (fine-tuning auto) from the same training run
LINES = (
    ("PMTL (CLI defaults)", "pmtl", "test_accuracy"),
    ("PMTL, trained personalized models", "pmtl", "pre_finetune_test_accuracy"),
    ("private FedAvg (CLI defaults)", "fedavg", "test_accuracy"),
    ("private FedAvg, its global model", "fedavg", "pre_finetune_test_accuracy"),
    ("local (every client alone)", "local", "test_accuracy"),
)
#: the same for the rows measured at the earlier defaults (offset message, no fine-tuning), each
#: with explicit fine-tuning from the billboard over local-all's grid
EARLIER_LINES = (
    ("PMTL (earlier CLI defaults)", "pmtl", "pre_finetune_test_accuracy"),
    ("PMTL + fine-tuning from the billboard", "pmtl", "test_accuracy"),
    ("private FedAvg (its global model)", "fedavg", "pre_finetune_test_accuracy"),
    ("private FedAvg + fine-tuning", "fedavg", "test_accuracy"),
    ("local (every client alone)", "local", "test_accuracy"),
)


def _study_table(
    rows: list[dict[str, Any]], ms: list[int], lines: tuple[tuple[str, str, str], ...] = LINES
) -> tuple[list[str], dict[Any, float]]:
    out = [
        "| method | ε | " + " | ".join(f"m = {m}" for m in ms) + " |",
        "|---|---|" + "---|" * len(ms),
    ]
    table: dict[tuple[str, float | None, int], float] = {}
    for label, method, key in lines:
        for eps in EPSILONS if method != "local" else (None,):
            cells = []
            for m in ms:
                text, mu = _cell(_at(rows, m, eps, method), key)
                table[(label, eps, m)] = mu
                cells.append(text)
            if all(c == "—" for c in cells):
                continue
            out.append(f"| {label} | {_eps_label(method, eps)} | " + " | ".join(cells) + " |")
    return out, table


def _unique(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run (two drivers may both have run a cell; seeded runs are identical)."""
    seen, out = set(), []
    for r in rows:
        key = (
            feature_law(r),
            defaults_of(r),
            r.get("variant"),
            r["method"],
            r["m"],
            r["target_epsilon"],
            r["seed"],
        )
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _variants_table(variants: list[dict[str, Any]], ms: list[int]) -> list[str]:
    out = ["| PMTL with | ε | " + " | ".join(f"m = {m}" for m in ms) + " |"]
    out += ["|---|---|" + "---|" * len(ms)]
    for v in sorted({r["variant"] for r in variants}):
        for eps in EPSILONS:
            cells = []
            for m in ms:
                sel = _at(variants, m, eps, variant=v)
                a, _ = _cell(sel, "pre_finetune_test_accuracy")
                b, _ = _cell(sel, "test_accuracy")
                cells.append("—" if a == "—" else f"{a} → {b}")
            if any(c != "—" for c in cells):
                out.append(f"| `{v}` | {_eps_label('pmtl', eps)} | " + " | ".join(cells) + " |")
    return out


def _mean(rows: list[dict[str, Any]], key: str = "test_accuracy") -> float:
    return mean_std(r[key] for r in rows if r.get(key) is not None)[0]


def _selection_label(rows: list[dict[str, Any]]) -> str:
    """The selection the rows of one line used and its ε cost (from the rows' ``selection``)."""
    sels = {(r.get("selection") or {}).get("select") for r in rows}
    if sels == {"client"}:
        return "per client, own validation (ε 0)"
    if sels == {"vote"}:
        return "recorded vote (5 % of ε, in the reported ε)"
    if sels == {"client", "vote"}:
        return "recorded vote where held, else per client"
    return "pooled validation (not charged, not covered)" if sels else "—"


def _covered_table(rows: list[dict[str, Any]], ms: list[int]) -> tuple[list[str], dict[Any, float]]:
    """The study table of the covered rows: one column per m (with its δ), one for the
    selection each line used and its ε cost, one for whether the rows are covered."""
    deltas = {}
    for m in ms:
        ds = sorted({r["delta"] for r in rows if r["m"] == m and r.get("delta")})
        deltas[m] = ", ".join(f"{d:g}" for d in ds) or "—"
    out = [
        "| method | ε | "
        + " | ".join(f"m = {m} (δ = {deltas[m]})" for m in ms)
        + " | selection (ε cost) | covered |",
        "|---|---|" + "---|" * (len(ms) + 2),
    ]
    table: dict[tuple[str, float | None, int], float] = {}
    for label, method, key in LINES:
        for eps in EPSILONS if method != "local" else (None,):
            cells, used = [], []
            for m in ms:
                sel = [r for r in _at(rows, m, eps, method) if r.get(key) is not None]
                text, mu = _cell(sel, key)
                table[(label, eps, m)] = mu
                cells.append(text)
                used += sel
            if all(c == "—" for c in cells):
                continue
            trained = key == "pre_finetune_test_accuracy"
            how = "none (the trained models)" if trained else _selection_label(used)
            cov = {r.get("covered") for r in used}
            out.append(
                f"| {label} | {_eps_label(method, eps)} | "
                + " | ".join(cells)
                + f" | {how} | {'yes' if cov == {True} else 'NO'} |"
            )
    return out, table


#: the variants of the covered study that change only δ (``--extra``), besides the default
DELTA_VARIANTS = {"--delta 1e-5": "1e-5", "--paper-delta": "1/m (the papers')"}


def _delta_table(allrows: list[dict[str, Any]], ms: list[int]) -> list[str]:
    """PMTL and private FedAvg at ε = 1 (CLI answers, covered defaults) at the default δ, at
    δ = 1e-5 (the literature's anchors) and at the papers' δ = 1/m; local shares nothing, so δ
    does not change it."""
    covered = [r for r in allrows if current(r)]
    out = [
        "| method | δ | " + " | ".join(f"m = {m}" for m in ms) + " | covered |",
        "|---|---|" + "---|" * (len(ms) + 1),
    ]
    for label, method in (
        ("PMTL (CLI defaults)", "pmtl"),
        ("private FedAvg (CLI defaults)", "fedavg"),
    ):
        for variant, name in ((None, "default min(1e-5, 1/(100 m))"), *DELTA_VARIANTS.items()):
            cells, used = [], []
            for m in ms:
                sel = [r for r in _at(covered, m, 1.0, method) if r.get("variant") == variant]
                if not sel and variant == "--delta 1e-5":  # the default is 1e-5 at this m
                    sel = [
                        r
                        for r in _at(covered, m, 1.0, method)
                        if r.get("variant") is None and r["delta"] == 1e-5
                    ]
                text, _ = _cell(sel, "test_accuracy")
                deltas = sorted({r["delta"] for r in sel})
                cells.append(text + (f" (δ = {deltas[0]:g})" if len(deltas) == 1 else ""))
                used += sel
            if all(c == "—" for c in cells):
                continue
            cov = {r.get("covered") for r in used}
            out.append(
                f"| {label} | {name} | "
                + " | ".join(cells)
                + f" | {'yes' if cov == {True} else 'NO'} |"
            )
    lo = [_cell(_at(covered, m, None, "local"), "test_accuracy")[0] for m in ms]
    out.append(
        "| local (every client alone) | any (shares nothing) | " + " | ".join(lo) + " | yes |"
    )
    return out


def _choices_table(rows: list[dict[str, Any]], ms: list[int]) -> list[str]:
    """How many clients kept each candidate (PMTL / FedAvg: fine-tuned billboard, own local
    training, trained model; seed 0)."""
    out = ["| method | ε | m | billboard fine-tuned | local training | trained model |"]
    out += ["|---|---|---|---|---|---|"]
    for method in ("pmtl", "fedavg"):
        for eps in EPSILONS:
            for m in ms:
                sel = [r for r in _at(rows, m, eps, method) if r["seed"] == 0]
                if not sel:
                    continue
                c = (sel[0].get("selection") or {}).get("clients_per_choice") or {}
                cells = [str(c.get(k, "—")) for k in ("billboard-finetune", "local", "trained")]
                out.append(
                    f"| {method} | {_eps_label(method, eps)} | {m} | " + " | ".join(cells) + " |"
                )
    return out


def report(args: argparse.Namespace) -> None:
    allrows = [r for r in _unique(load_jsonl(JSONL)) if feature_law(r) == FEATURE_LAW]
    base = [r for r in allrows if r.get("variant") is None]
    rows = [r for r in base if current(r)]
    previous = [r for r in base if defaults_of(r) == COVERED]
    old_local = [
        r for r in base if r["method"] == "local" and defaults_of(r) not in (DEFAULTS, COVERED)
    ]
    pooled = old_local + [r for r in base if r["method"] != "local" and defaults_of(r) == POOLED]
    earlier = old_local + [r for r in base if r["method"] != "local" and defaults_of(r) == EARLIER]
    ms = sorted({r["m"] for r in rows})
    out = [
        "## Study at the covered defaults (pooled test accuracy over every client's test examples)",
        "",
        "Every row: `covered: true`, no curator diagnostics, the default δ = min(1e-5, 1/(100 m)). "
        "Where a vote can be held (a private run whose vote's noise std is at most m/4) every "
        "client took the candidate the clients' recorded noisy vote elected (exact ridge "
        "candidates; 5 % of ε, composed into the reported ε); elsewhere every client chose its "
        "model on its own validation split (post-processing of the releases: ε = 0). The row's "
        "`selection` says which. Cells where today's defaults hold no vote are the runs "
        "measured at the previous defaults (the same computation); a `—` is a cell not re-run.",
        "",
    ]
    lines, table = _covered_table(rows, ms)
    out += lines
    out += ["", "Clients per candidate of `--finetune auto` (seed 0):", ""]
    out += _choices_table(rows, ms)
    out += ["", "Privacy statement of every row (from its JSON):", ""]
    seen = set()
    for r in rows:
        if r["summary"] not in seen:
            seen.add(r["summary"])
            out.append(f"* m = {r['m']}, {r['method']}: {r['summary']}")
    if ms:
        out += ["", "## Acceptance: synthetic, ε = 1, covered defaults", ""]
        out += [
            "| m | PMTL | local | private FedAvg | non-private PMTL | PMTL − max(local, FedAvg) |"
        ]
        out += ["|---|---|---|---|---|---|"]
        for m in ms:
            pm = table.get(("PMTL (CLI defaults)", 1.0, m), math.nan)
            lo = table.get(("local (every client alone)", None, m), math.nan)
            fa = table.get(("private FedAvg (CLI defaults)", 1.0, m), math.nan)
            npv = table.get(("PMTL (CLI defaults)", None, m), math.nan)
            best = max(lo, fa) if not (math.isnan(lo) or math.isnan(fa)) else math.nan
            out.append(
                f"| {m} | {pm:.3f} | {lo:.3f} | {fa:.3f} | {npv:.3f} | "
                f"{100 * (pm - best):+.1f} points |"
            )
        for m in ms:
            gaps = []
            for seed in sorted({r["seed"] for r in rows if r["m"] == m}):
                accs = [
                    [r["test_accuracy"] for r in _at(rows, m, e, meth) if r["seed"] == seed]
                    for meth, e in (("pmtl", 1.0), ("local", None), ("fedavg", 1.0))
                ]
                if all(accs):
                    gaps.append(f"{100 * (accs[0][0] - max(accs[1][0], accs[2][0])):+.1f}")
            if len(gaps) > 1:
                out.append(f"\nm = {m}, PMTL − max(local, FedAvg) per seed: " + ", ".join(gaps))
        m_top = max(ms)
        pm = table.get(("PMTL (CLI defaults)", 1.0, m_top), math.nan)
        npv = table.get(("PMTL (CLI defaults)", None, m_top), math.nan)
        lo = table.get(("local (every client alone)", None, m_top), math.nan)
        out += [
            "",
            f"At m = {m_top}: PMTL at ε = 1 − non-private PMTL = {100 * (pm - npv):+.1f} points; "
            f"PMTL at ε = 1 − local = {100 * (pm - lo):+.1f} points.",
        ]
        per_seed = []
        for seed in sorted({r["seed"] for r in rows if r["m"] == m_top}):
            p = [r for r in _at(rows, m_top, 1.0, "pmtl") if r["seed"] == seed]
            lr = [r for r in _at(rows, m_top, None, "local") if r["seed"] == seed]
            if p and lr:
                per_seed.append(
                    f"seed {seed}: {100 * (p[0]['test_accuracy'] - lr[0]['test_accuracy']):+.1f}"
                )
        if per_seed:
            out[-1] += " Per seed, PMTL − local: " + ", ".join(per_seed) + "."
        out += [
            "",
            "At m = 10⁵ and 10⁶ (seed 0, every client scored; at 10⁶ training alone estimated "
            "on a uniform sample of its clients): `pmtl_population_million.md`.",
        ]
        covered_table = table
        if any(r.get("variant") in DELTA_VARIANTS for r in allrows):
            out += [
                "",
                "## The covered study at ε = 1 at three δ: anchor-comparable reporting",
                "",
                "The same commands with `--delta 1e-5` (the δ of the published anchors) or "
                "`--paper-delta` (δ = 1/m, the PMTL paper's) added; every other option at the "
                "covered defaults, seeds as in the cells. A smaller δ asks for more noise at the "
                "same ε.",
                "",
            ]
            out += _delta_table(allrows, ms)
    else:
        covered_table = {}
    prev = [r for r in previous if r["method"] != "local" and r["target_epsilon"] is not None]
    if any(vote_held(r["m"], r["target_epsilon"], float(r["delta"])) for r in prev):
        out += [
            "",
            "## The previous covered defaults: every client's own choice (history)",
            "",
            "The same commands before `--finetune-select auto` and `--local-solver auto` became "
            "the defaults: every client chose, on its own validation split, among its trained "
            "model, its local training and the billboard fine-tuned at the points of the SGD "
            "grids (`--finetune-select client --local-solver sgd` gives it back). Covered, ε = 0 "
            "for the choice.",
            "",
        ]
        out += _covered_table(previous, ms)[0]
    pms = sorted({r["m"] for r in pooled})
    if pms:
        out += [
            "",
            "## Earlier defaults, pooled selection: NOT covered (history)",
            "",
            "Measured at the earlier CLI defaults (`ditto+auto`): `--finetune auto` chose one "
            "(epochs, lr) for all clients and whether to keep the fine-tuned models on the pooled "
            "validation accuracy, `local-all` one setting for all clients the same way; δ = 1/m "
            "(`--paper-delta`), curator diagnostics on. These outputs depend on every client's "
            "validation data outside any release: the printed ε does not cover them.",
            "",
        ]
        plines, table = _study_table(pooled, pms)
        out += plines
        pvariants = [r for r in allrows if r.get("variant") and defaults_of(r) == POOLED]
        if pvariants:
            out += ["", "Options beyond those defaults (trained models → CLI answer):", ""]
            out += _variants_table(pvariants, pms)
        m_top = max(pms)
        lo = table.get(("local (every client alone)", None, m_top), math.nan)
        out += ["", f"Acceptance numbers at m = {m_top} (earlier defaults, not covered):", ""]
        out += ["| PMTL | ε = 1 | non-private | local | ε=1 − non-private | ε=1 − local |"]
        out += ["|---|---|---|---|---|---|"]
        old = [r for r in earlier if r["m"] == m_top]
        dv = [r for r in allrows if r.get("variant") == "--server-update delta"]
        for name, a, b in (
            (
                "pooled defaults (Ditto message, fine-tuning auto, pooled)",
                table.get(("PMTL (CLI defaults)", 1.0, m_top), math.nan),
                table.get(("PMTL (CLI defaults)", None, m_top), math.nan),
            ),
            (
                "trained personalized models (no fine-tuning)",
                table.get(("PMTL, trained personalized models", 1.0, m_top), math.nan),
                table.get(("PMTL, trained personalized models", None, m_top), math.nan),
            ),
            (
                "earlier CLI defaults (offset message, no fine-tuning)",
                _mean(_at(old, m_top, 1.0, "pmtl"), "pre_finetune_test_accuracy"),
                _mean(_at(old, m_top, None, "pmtl"), "pre_finetune_test_accuracy"),
            ),
            (
                "`--server-update delta` + fine-tuning (local-all's grid, pooled)",
                _mean(_at(dv, m_top, 1.0)),
                _mean(_at(dv, m_top, None)),
            ),
        ):
            out.append(
                f"| {name} | {a:.3f} | {b:.3f} | {lo:.3f} | {100 * (a - b):+.1f} points | "
                f"{100 * (a - lo):+.1f} points |"
            )
    pooled_table = table if pms else {}
    table = covered_table
    if earlier:
        ems = sorted({r["m"] for r in earlier})
        out += [
            "",
            "## At the earlier CLI defaults (offset message, no fine-tuning): NOT covered (history)",
            "",
        ]
        out += [
            "Each run also fine-tuned every client from the billboard with `--method "
            "local-all`'s grid (`--finetune vanilla --finetune-start billboard --finetune-epochs "
            "1,3,10,30,100 --finetune-lrs 0.01,0.03,0.1 --finetune-select pooled`).",
            "",
        ]
        out += _study_table(earlier, ems, EARLIER_LINES)[0]
        old_variants = [r for r in allrows if r.get("variant") and defaults_of(r) == EARLIER]
        if old_variants:
            out += ["", "Options (at those defaults → after that fine-tuning):", ""]
            out += _variants_table(old_variants, ems)
    grid_rows = [r for r in load_jsonl(GRID_JSONL) if r.get("feature_cov") is not None]
    if grid_rows:
        out += [
            "",
            "## Grid at m = 1000 (seed 0; ε = 1; earlier CLI defaults → after fine-tuning from the "
            "billboard over local-all's grid, pooled selection: NOT covered)",
            "",
        ]
        out += [
            "| features | client-mean spread | τ | majority class | local | PMTL | FedAvg |"
            " PMTL+ft − local | FedAvg+ft − local |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for setting in GRID_SETTINGS:
            sel = {
                (r["method"], r["target_epsilon"]): r for r in grid_rows if _grid_key(r) == setting
            }
            if not sel:
                continue
            loc = sel.get(("local", None))
            cells = [f"{loc['test_accuracy']:.3f}" if loc else "—"]
            for method in ("pmtl", "fedavg"):
                r = sel.get((method, 1.0))
                cells.append(
                    f"{r['pre_finetune_test_accuracy']:.3f} → {r['test_accuracy']:.3f}"
                    if r
                    else "—"
                )
            gap = " | ".join(
                f"{100 * (sel[(meth, 1.0)]['test_accuracy'] - loc['test_accuracy']):+.1f}"
                if loc and (meth, 1.0) in sel
                else "—"
                for meth in ("pmtl", "fedavg")
            )
            maj = next(
                (r.get("majority_class") for r in sel.values() if r.get("majority_class")), None
            )
            out.append(
                f"| {setting[0]} | {setting[1]:g} | {setting[2]:g} | "
                f"{'—' if maj is None else f'{maj:.2f}'} | " + " | ".join(cells) + f" | {gap} |"
            )
    leaf = [r for r in allrows if feature_law(r) == "leaf" and r.get("variant") is None]
    leaf += [  # the earlier grid's runs at that generator's default setting
        r
        for r in load_jsonl(GRID_JSONL)
        if r.get("feature_cov") is None
        and (r.get("tau"), r.get("sizes"), r.get("label_noise")) == (0.5, "leaf", 0.0)
    ]
    if leaf:
        out += [
            "",
            "## Earlier feature law (LEAF's covariance, client means spread 1): study at earlier "
            "defaults, NOT covered",
            "",
            "Measured with the generator before its default feature law changed (PMTL runs with "
            "`--personal-init billboard`, no fine-tuning); pooled test accuracy.",
            "",
        ]
        lm = sorted({r["m"] for r in leaf})
        out += ["| method | ε | " + " | ".join(f"m = {m}" for m in lm) + " |"]
        out += ["|---|---|" + "---|" * len(lm)]
        for method in METHODS:
            for eps in EPSILONS if method != "local" else (None,):
                cells = []
                for m in lm:
                    cells.append(_cell(_at(leaf, m, eps, method), "test_accuracy")[0])
                out.append(f"| {method} | {_eps_label(method, eps)} | " + " | ".join(cells) + " |")
    print("\n".join(out))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.2, 4.0))
    for label, eps, style in (
        ("PMTL (CLI defaults)", 1.0, "o-"),
        ("PMTL (CLI defaults)", None, "o:"),
        ("PMTL, trained personalized models", 1.0, "o--"),
        ("private FedAvg (CLI defaults)", 1.0, "s-"),
        ("private FedAvg, its global model", 1.0, "s--"),
        ("local (every client alone)", None, "^-"),
    ):
        ys = [table.get((label, eps, m), math.nan) for m in ms]
        name = label if label.startswith("local") else f"{label}, ε={'∞' if eps is None else 1}"
        wide = {"lw": 5, "alpha": 0.45} if (label, eps) == ("PMTL (CLI defaults)", 1.0) else {}
        ax.plot(ms, ys, style, label=name, **wide)  # FedAvg's line runs inside PMTL's at m >= 1000
    ys = [pooled_table.get(("PMTL (CLI defaults)", 1.0, m), math.nan) for m in ms]
    ax.plot(ms, ys, "x--", color="gray", label="PMTL, earlier pooled defaults, ε=1 (NOT covered)")
    ax.set_xscale("log")
    ax.set_xlabel("number of clients m")
    ax.set_ylabel("test accuracy (all clients, pooled)")
    ax.set_title("Synthetic federation, logreg, q=min(m,200), T=200", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.text(
        0.01,
        0.01,
        "Coloured lines: covered by the reported guarantee (per-client selection, ε cost 0; "
        "δ = min(1e-5, 1/(100 m))). Gray: not covered.",
        fontsize=6,
    )
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(RESULTS / "pmtl_population.png", dpi=120)


def speed(args: argparse.Namespace) -> None:
    import torch

    from privmtl.experiments.pmtl import load_federated, make_model
    from privmtl.federated.config import TrainConfig
    from privmtl.federated.protocol import Trainer

    t0 = time.perf_counter()
    ds = load_federated("synthetic", seed=0, num_clients=args.m)
    gen_s = time.perf_counter() - t0
    net = make_model("logreg", ds, 0)
    cfg = TrainConfig(
        method=args.method,
        rounds=args.rounds,
        clients_per_round=args.clients_per_round,
        clip=0.5,
        noise_std=0.01,
        noise_source="seeded",
        progress=False,
        server_update=args.server_update,
        lam=0.1,
        personal_init="model",
    )
    tr = Trainer(ds, net, cfg)
    recs = [r.record for r in tr]
    t1 = time.perf_counter()
    res = tr.result()
    eval_s = time.perf_counter() - t1
    walls = sorted(r["seconds"] for r in recs[1:])
    cpus = sorted(r["cpu_seconds"] for r in recs[1:])
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {
        "m": args.m,
        "method": args.method,
        "server_update": args.server_update,
        "clients_per_round": args.clients_per_round,
        "rounds_timed": len(walls),
        "median_seconds_per_round": walls[len(walls) // 2],
        "median_cpu_seconds_per_round": cpus[len(cpus) // 2],
        "data_generation_seconds": gen_s,
        "evaluation_seconds_all_clients": eval_s,
        "train_examples": int(ds.n_samples("train")),
        "personalized_parameters": int(
            sum(p.numel() for p in (res.personalized_params or {}).values())
        ),
        "peak_rss_mb": peak_mb,
        "test_accuracy": res.accuracies["test"][res.primary]["accuracy"],
        "machine": machine_info(),
        "torch_threads": torch.get_num_threads(),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("study")
    s.add_argument("--ms", type=int, nargs="+", default=[100, 1000, 10000])
    s.add_argument("--seeds", type=int, nargs="+", default=[0])
    s.add_argument("--methods", nargs="+", default=list(METHODS))
    s.add_argument("--epsilons", type=float, nargs="*", default=[], help="subset; inf: non-private")
    s.add_argument("--rounds", type=int, default=200)
    s.add_argument("--clients-per-round", type=int, default=200)
    s.add_argument(
        "--extra", default="", help="more privmtl pmtl arguments, one string (rows: variant)"
    )
    g = sub.add_parser("grid")
    g.add_argument("--m", type=int, default=1000)
    g.add_argument("--rounds", type=int, default=200)
    g.add_argument("--clients-per-round", type=int, default=200)
    sub.add_parser("report")
    p = sub.add_parser("speed")
    p.add_argument("--m", type=int, default=10000)
    p.add_argument("--method", default="pmtl")
    p.add_argument("--clients-per-round", type=int, default=100)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--server-update", default="offset", choices=["offset", "delta", "ditto"])
    p.add_argument("--json")
    args = ap.parse_args()
    {"study": study, "grid": grid, "report": report, "speed": speed}[args.mode](args)


if __name__ == "__main__":
    main()
