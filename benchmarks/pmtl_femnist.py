"""PMTL on FEMNIST-105 (LEAF writers with train and test data): accuracy and privacy benchmarks.

Resumable: each finished run is appended to ``results/pmtl_femnist<tag>.jsonl`` and skipped when the
script is run again; ``--report`` rebuilds ``results/pmtl_femnist<tag>.md`` and the PNG plots.

Suites (``--suite``):

``acceptance``
    The acceptance checks: CNN, 20 clients per round, 100 rounds, ε = 2, PMTL vs private FedAvg
    (seeds 0, 1); non-private PMTL with 300 rounds.
``tradeoff``
    PMTL, private FedAvg, FedProx and local training (+ mean-regularized fine-tuning of PMTL) at
    ε ∈ {0.5, 1, 2, 4, ∞}; (γ, T) selected per ε on validation accuracy, test accuracy reported.
``nonprivate``
    Non-private PMTL settings (rounds, clients per round, λ, local epochs) towards the paper's 0.83.

Example::

    python benchmarks/pmtl_femnist.py --suite acceptance --data-path ../shared/data/femnist-leaf
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

from _common import RESULTS, append_jsonl, load_jsonl, machine_info, markdown_table, mean_std

from privmtl.experiments.pmtl import load_federated, run_pmtl

# one torch thread per run: two benchmarks share the 2 cores
# delta="paper": the committed results ran at the PMTL paper's delta = 1/m (the earlier default)
COMMON = {"data": "femnist-leaf", "model": "cnn", "lr": 0.1, "batch_size": 10, "threads": 1,
          "delta": "paper"}  # fmt: skip


def suite_acceptance() -> list[dict[str, Any]]:
    runs = []
    for seed, method in itertools.product((0, 1), ("pmtl", "fedavg")):
        runs.append({"method": method, "epsilon": 2.0, "rounds": 100, "clients_per_round": 20,
                     "clip": 0.5, "lam": 0.1, "seed": seed, "group": "eps2-100r"})  # fmt: skip
    # Algorithm 1 as printed (client message w_k^new - w_k^old) overshoots the mean of the models by
    # m/q under partial participation; the authors' code sends w_k^new - w~ ("offset").
    for seed in (0, 1):
        runs.append({"method": "pmtl", "epsilon": 2.0, "rounds": 100, "clients_per_round": 20,
                     "clip": 0.5, "lam": 0.1, "seed": seed, "server_update": "offset",
                     "group": "eps2-100r-offset"})  # fmt: skip
    # Where does the accuracy at eps = 2 come from? Local training alone, and PMTL leaning less on
    # the (very noisy) billboard.
    runs.append({"method": "local", "epsilon": None, "rounds": 100, "clients_per_round": 20,
                 "clip": 0.5, "lam": 0.1, "seed": 0, "group": "eps2-100r-diagnosis"})  # fmt: skip
    for seed in (0, 1):
        runs.append({"method": "pmtl", "epsilon": 2.0, "rounds": 100, "clients_per_round": 20,
                     "clip": 0.5, "lam": 0.01, "seed": seed, "server_update": "offset",
                     "group": "eps2-100r-lam0.01"})  # fmt: skip
    return runs


#: ε values of the trade-off (None = non-private), in the order they are run.
TRADEOFF_EPS: tuple[float | None, ...] = (None, 2.0, 0.5, 1.0, 4.0)
#: PMTL's λ is selected per ε on the validation accuracy of the selection seed (the first seed);
#: the other seeds reuse the selected value.
TRADEOFF_LAMS = (0.001, 0.01, 0.1, 1.0)


def _selected_lam(rows: list[dict[str, Any]], seed: int, eps: float | None) -> float | None:
    cands = [
        r for r in rows
        if r.get("group") == "tradeoff" and r["method"] == "pmtl" and r["seed"] == seed
        and r["target_epsilon"] == eps
    ]  # fmt: skip
    if len(cands) < len(TRADEOFF_LAMS):
        return None
    return float(max(cands, key=lambda r: r["val_accuracy"])["lam"])


def suite_tradeoff(seeds: list[int], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs of the trade-off suite that can be planned now (selection runs of the first seed first).

    Every run: CNN, 100 rounds, 20 clients per round (Poisson, rate 20/105), γ = 0.5, δ = 1/m, RDP.
    PMTL uses the authors' client message (``offset``; ``delta`` diverges, see the acceptance
    suite) with λ ∈ TRADEOFF_LAMS selected per ε on validation accuracy of the first seed; FedProx
    uses μ = 0.01. PMTL runs are also scored after each fine-tuning variant, FedAvg after vanilla
    fine-tuning (post-processing of the same run).
    """
    runs = []
    base = {"rounds": 100, "clients_per_round": 20, "clip": 0.5, "group": "tradeoff"}
    for i, seed in enumerate(seeds):
        if i == 0:
            runs.append({**base, "method": "local", "epsilon": None, "lam": 0.1, "seed": seed})
        for eps in TRADEOFF_EPS:
            lams: tuple[float, ...]
            if i == 0:
                lams = TRADEOFF_LAMS
            else:
                sel = _selected_lam(rows, seeds[0], eps)
                lams = () if sel is None else (sel,)
            for lam in lams:
                runs.append({**base, "method": "pmtl", "epsilon": eps, "lam": lam, "seed": seed,
                             "server_update": "offset",
                             "extra_finetunes": ["vanilla", "mr", "skl", "ewc"]})  # fmt: skip
            runs.append({**base, "method": "fedavg", "epsilon": eps, "lam": 0.1, "seed": seed,
                         "extra_finetunes": ["vanilla", "mr"]})  # fmt: skip
            runs.append({**base, "method": "fedprox", "epsilon": eps, "lam": 0.01, "seed": seed})
        if i > 0:
            runs.append({**base, "method": "local", "epsilon": None, "lam": 0.1, "seed": seed})
    return runs


def suite_nonprivate() -> list[dict[str, Any]]:
    runs = []
    for rounds, q, lam in [(300, 20, 0.1), (300, 20, 0.01), (300, 50, 0.1), (500, 20, 0.1)]:
        runs.append({"method": "pmtl", "epsilon": None, "rounds": rounds, "clients_per_round": q,
                     "clip": 1e6, "lam": lam, "seed": 0, "group": "nonprivate"})  # fmt: skip
    return runs


def key(run: dict[str, Any]) -> str:
    return json.dumps({k: run.get(k) for k in sorted(run) if k != "group"}, sort_keys=True)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--suite", choices=["acceptance", "tradeoff", "nonprivate"], required=True)
    p.add_argument("--data-path", default=None)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--finetune", default="none")
    p.add_argument("--report", action="store_true")
    p.add_argument(
        "--reverse",
        action="store_true",
        help="take runs from the end of the plan: a second process on the other core then meets "
        "the first in the middle instead of repeating its runs",
    )
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)  # also for fine-tuning and evaluation outside the engine
    log = RESULTS / f"pmtl_femnist_{args.suite}.jsonl"
    if not args.report:
        seeds = [int(s) for s in args.seeds.split(",")]
        plan = {"acceptance": suite_acceptance, "nonprivate": suite_nonprivate}.get(args.suite)
        datasets: dict[int, Any] = {}
        while True:  # re-plan after every run: later seeds need the first seed's selection
            rows = load_jsonl(log)
            done = {r["run_key"] for r in rows}
            runs = plan() if plan else suite_tradeoff(seeds, rows)
            todo = [r for r in runs if key(r) not in done]
            if not todo:
                break
            run = todo[-1] if args.reverse else todo[0]
            k = key(run)
            seed = run["seed"]
            if seed not in datasets:
                datasets[seed] = load_federated("femnist-leaf", data_path=args.data_path, seed=seed)
            t0 = time.perf_counter()
            kw = {k2: v for k2, v in run.items() if k2 != "group"}
            out = run_pmtl(**COMMON, **kw, dataset=datasets[seed], show_progress=True,
                           finetune=args.finetune)  # fmt: skip
            out["run_key"], out["group"] = k, run["group"]
            out["target_epsilon"] = run["epsilon"]
            append_jsonl(log, out)
            print(f"{run} -> test acc {out['test_accuracy']:.4f} ({time.perf_counter() - t0:.0f}s)",
                  file=sys.stderr, flush=True)  # fmt: skip
    report(args.suite, log)


EPS_COLS: tuple[float | None, ...] = (0.5, 1.0, 2.0, 4.0, None)


def _selected(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One run per (seed, method, ε): the best validation accuracy (only PMTL has a choice)."""
    best: dict[tuple[int, str, Any], dict[str, Any]] = {}
    for r in rows:
        k = (r["seed"], r["method"], r["target_epsilon"])
        if k not in best or r["val_accuracy"] > best[k]["val_accuracy"]:
            best[k] = r
    return list(best.values())


def _variants(r: dict[str, Any]) -> dict[str, float]:
    """Test accuracy of a run and of its fine-tuned variants, by display name."""
    out = {r["method"]: r["test_accuracy"]}
    for name, ft in (r.get("finetune_results") or {}).items():
        out[f"{r['method']} + {name} fine-tuning"] = ft["test_accuracy"]
    return out


def tradeoff_report(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown lines (table of test accuracy vs ε) and the two PNGs of the trade-off suite."""
    from privmtl.experiments.pmtl_sweep import plot_rounds
    from privmtl.experiments.sweep import plot_tradeoff

    sel = _selected(rows)
    cells: dict[tuple[str, Any], list[float]] = {}
    names: list[str] = []
    for r in sorted(sel, key=lambda r: ("pmtl", "fedavg", "fedprox", "local").index(r["method"])):
        eps_list = list(EPS_COLS) if r["method"] == "local" else [r["target_epsilon"]]
        for name, acc in _variants(r).items():
            if name not in names:
                names.append(name)
            for e in eps_list:  # local training has no budget: the same value in every column
                cells.setdefault((name, e), []).append(acc)
    table = []
    for name in names:
        row = [name]
        for e in EPS_COLS:
            mu, sd, n = mean_std(cells.get((name, e), []))
            row.append("" if n == 0 else f"{mu:.3f} ± {sd:.3f} (n={n})")
        table.append(row)
    lam_sel = {
        e: sorted({r["lam"] for r in sel if r["method"] == "pmtl" and r["target_epsilon"] == e})
        for e in EPS_COLS
    }
    z = {
        e: next((r["noise_multiplier"] for r in sel if r["target_epsilon"] == e
                 and r["method"] == "pmtl"), None)
        for e in EPS_COLS if e is not None
    }  # fmt: skip
    seeds = sorted({r["seed"] for r in rows})
    lines = [
        "Test accuracy pooled over all 1 685 test images of the 105 writers (mean ± std over seeds "
        f"{', '.join(map(str, seeds))}; n = number of seeds finished). CNN, 100 rounds, 20 clients per "
        "round (Poisson sampling, rate 20/105), γ = 0.5, lr 0.1, batch 10, 1 local epoch; PMTL with "
        "the authors' client message (`offset`) and λ selected per ε on seed 0's validation accuracy "
        "from {0.001, 0.01, 0.1, 1}; FedProx μ = 0.01; fine-tuning: 1 local epoch from the released model "
        "(post-processing, no privacy cost); local: no communication (ε = 0 towards the others, "
        "repeated in every column).",
        "",
        markdown_table(
            ["method", *[("ε=∞" if e is None else f"ε={e:g}") for e in EPS_COLS]], table
        ),
        "",
        "Selected λ (PMTL): "
        + ", ".join(
            f"{'∞' if e is None else f'{e:g}'}: {lam_sel[e]}" for e in EPS_COLS if lam_sel[e]
        )
        + ".",
        "Noise multiplier z = σq/γ per ε: "
        + ", ".join(f"{e:g}: {v:.2f}" for e, v in z.items() if v is not None)
        + ".",
        "",
        "**Reading it.** With 105 clients and 20 per round, client-level DP at ε ≤ 4 leaves no "
        "usable signal in a shared 115 646-parameter CNN: private FedAvg and FedProx stay at chance "
        "(the Gaussian noise on the mean update has norm σ√d ≈ 22 at ε = 2 against updates clipped "
        "to 0.5). PMTL keeps every client's model, so validation selects a tiny λ and it stays at "
        "the level of local training (0.565–0.574 over three seeds vs local 0.570 ± 0.012: "
        "indistinguishable), far above the private global models — the paper's qualitative claim "
        "— but it gains nothing measurable from the billboard at these ε. Non-privately the "
        "global models win after 100 rounds (0.80 vs PMTL's 0.59; with 500 rounds and λ = 1 PMTL's "
        "personalized models reach 0.78, see `pmtl_femnist_nonprivate.md`). Fine-tuning against a "
        "noisy billboard can destroy a model: the sKL and EWC penalties pull towards the noisy "
        "model's predictions / weights (e.g. EWC 0.09 at ε = 2); vanilla and mean-regularized "
        "fine-tuning are harmless (vanilla fine-tuning adds about 0.01). Every cell is the mean "
        "of seeds 0, 1 and 2; λ was selected on seed 0 only.",
        "",
        "![accuracy vs epsilon](pmtl_femnist_tradeoff.png)",
        "![loss and epsilon per round](pmtl_femnist_rounds.png)",
    ]
    summary = []
    plotted = ("pmtl", "pmtl + vanilla fine-tuning", "fedavg", "fedavg + vanilla fine-tuning",
               "fedprox")  # fmt: skip
    for name in names:
        for e in EPS_COLS:
            vals = cells.get((name, e), [])
            if not vals or name not in plotted or (e is None and "fine-tuning" in name):
                continue
            mu, sd, n = mean_std(vals)
            label = name  # the plot marks the ε-free (non-private) rows itself
            summary.append({"method": label, "target_epsilon": e, "epsilon": e, "mean": mu,
                            "std": sd, "n": n})  # fmt: skip
    loc = cells.get(("local", None), [])
    if loc:
        mu, sd, n = mean_std(loc)
        summary.append({"method": "local", "target_epsilon": None, "epsilon": 0.0,
                        "mean": mu, "std": sd, "n": n})  # fmt: skip
    plot_tradeoff(
        summary,
        RESULTS / "pmtl_femnist_tradeoff.png",
        metric_label="test accuracy",
        title="PMTL vs global models on FEMNIST-105 (CNN, 100 rounds, 20 clients/round)",
        lower_is_better=False,
        subtitle="δ = 1/105, add/remove one client, Poisson sampling, RDP; mean ± std over seeds",
    )
    plot_rounds(
        [r for r in sel if r["seed"] == seeds[0] and r["target_epsilon"] in (2.0, None)
         and r["method"] in ("pmtl", "fedavg")],
        RESULTS / "pmtl_femnist_rounds.png",
    )  # fmt: skip
    return lines


def report(suite: str, log: Path) -> None:
    rows = load_jsonl(log)
    if not rows:
        raise SystemExit(f"no results in {log}")
    lines = [f"# PMTL on FEMNIST-105: suite '{suite}'", ""]
    if suite == "tradeoff":
        lines += tradeoff_report([r for r in rows if r.get("group") == "tradeoff"])
    else:
        table = []
        for r in rows:
            table.append([
                r["group"], r["method"], r["seed"], r["rounds"], r["clients_per_round"], r["clip"],
                r["lam"], "∞" if r["epsilon"] is None else f"{r['epsilon']:.3g}",
                f"{r['noise_std']:.4g}", f"{r['test_accuracy']:.4f}", f"{r['mean_client_accuracy']:.4f}",
                f"{r['seconds_per_round']:.2f}",
            ])  # fmt: skip
        lines += [markdown_table(
            ["group", "method", "seed", "T", "q", "γ", "λ", "ε", "σ", "test acc", "mean client acc", "s/round"],
            table,
        )]  # fmt: skip
        groups: dict[tuple[str, str], list[float]] = {}
        for r in rows:
            groups.setdefault((r["group"], r["method"]), []).append(r["test_accuracy"])
        lines += ["", "Means over seeds:", ""]
        lines += [f"- {g} / {m}: {mean_std(v)[0]:.4f} (n={len(v)})" for (g, m), v in groups.items()]
    g = next(
        (r for r in rows if r["method"] != "local" and r.get("target_epsilon") is not None), None
    )
    if g is not None:
        lines += ["", f"Privacy of private rows: {g['summary']} (δ = 1/m)."]
    lines += ["", f"Machine: {machine_info()}.", "",
              f"Reproduce: `python benchmarks/pmtl_femnist.py --suite {suite} --data-path ../shared/data/femnist-leaf`"]  # fmt: skip
    (RESULTS / f"pmtl_femnist_{suite}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
