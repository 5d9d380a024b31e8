"""Local fine-tuning after private training on FEMNIST-105: the PMTL paper's Table 1, tuned.

For every (seed, ε) it trains PMTL and private FedAvg exactly as in the trade-off suite of
``pmtl_femnist.py`` (CNN, 100 rounds, 20 clients per round with Poisson sampling, γ = 0.5, lr 0.1,
batch 10, δ = 1/m, RDP; PMTL with the ``offset`` message and the λ that suite selected on seed 0's
validation accuracy: 0.001 at ε ≤ 2, 1 at ε = ∞), then fine-tunes every client for one epoch with
each objective (vanilla, mean-regularization, symmetrized KL, EWC). The step size and penalty
weight of fine-tuning are chosen by every client on its own validation split from
``LRS`` × ``LAMS`` (:func:`privmtl.federated.finetune_select`, ``select="client"``), which keeps the
joint-DP guarantee of training (post-processing of the billboard and of the client's own data).
PMTL clients start from their personalized models, FedAvg clients from the released global model.

The trade-off suite fine-tunes with the training step (lr 0.1) and λ; there sKL and EWC can
collapse (e.g. sKL 0.24 at ε = ∞). This benchmark shows what the objectives give when their step
size is chosen.

Resumable: each (seed, ε, method) appends its rows to ``results/pmtl_femnist_finetune.jsonl``;
trained models are cached under ``$PRIVMTL_CACHE`` (default ``~/.cache/privmtl``)/benchmarks, never
in the repository. ``--report`` rebuilds ``results/pmtl_femnist_finetune.md``.

Example::

    python research/pmtl_femnist_finetune.py --data-path ../shared/data/femnist-leaf --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from _common import RESULTS, append_jsonl, load_jsonl, machine_info, markdown_table, mean_std

EPSILONS: tuple[float | None, ...] = (2.0, None, 0.5)
PMTL_LAM = {0.5: 0.001, 2.0: 0.001, None: 1.0}
LRS = (0.01, 0.1)
LAMS = (0.01, 1.0)
OBJECTIVES = ("vanilla", "mr", "skl", "ewc")
LOG = RESULTS / "pmtl_femnist_finetune.jsonl"


def _cache_dir() -> Path:
    root = Path(os.environ.get("PRIVMTL_CACHE", Path.home() / ".cache" / "privmtl"))
    path = root / "benchmarks" / "pmtl_femnist_finetune"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _key(seed: int, eps: float | None, method: str) -> str:
    return json.dumps({"seed": seed, "epsilon": eps, "method": method}, sort_keys=True)


def run_one(ds: Any, seed: int, eps: float | None, method: str) -> list[dict[str, Any]]:
    """Train (or load) one model, then one row per fine-tuning objective (and one without)."""
    import torch

    from privmtl.experiments.pmtl import make_model
    from privmtl.federated import TrainConfig, config_for_epsilon, finetune_select, train

    m = ds.n_clients
    lam = PMTL_LAM[eps] if method == "pmtl" else 0.1
    config = TrainConfig(
        method=method,
        rounds=100,
        clients_per_round=20,
        batch_size=10,
        lr=0.1,
        lam=lam,
        clip=0.5,
        sampling="poisson",
        seed=seed,
        delta=1.0 / m,
        server_update="offset",
        threads=1,
        progress=False,
    )
    if eps is not None:
        config = config_for_epsilon(config, m, eps)
    net = make_model("cnn", ds, seed)
    cache = _cache_dir() / f"seed{seed}_eps{eps}_{method}.pt"
    t0 = time.perf_counter()
    if cache.exists():
        result = torch.load(cache, weights_only=False)
    else:
        result = train(ds, net, config)
        torch.save(result, cache.with_suffix(".tmp"))
        cache.with_suffix(".tmp").replace(cache)
    train_seconds = time.perf_counter() - t0
    start = "global" if method == "fedavg" else "personalized"
    base = {
        "run_key": _key(seed, eps, method),
        "seed": seed,
        "target_epsilon": eps,
        "method": method,
        "train_lam": lam,
        "epsilon": float(result.epsilon) if eps is not None and method != "local" else None,
        "delta": float(result.delta) if eps is not None and method != "local" else None,
        "relation": config.relation,
        "sampling": config.sampling,
        "accountant": config.accountant,
        "noise_std": config.noise_std,
        "trained_test_accuracy": float(result.test_accuracy),
        "train_seconds": train_seconds,
    }
    rows = []
    for objective in OBJECTIVES:
        t1 = time.perf_counter()
        _, acc, sel = finetune_select(
            result,
            ds,
            net,
            method=objective,
            lrs=LRS,
            lams=LAMS,
            select="client",
            start=start,
            epochs=1,
            batch_size=10,
            seed=seed,
        )
        rows.append(
            {
                **base,
                "finetune": objective,
                "start": start,
                "test_accuracy": float(acc["test"]["accuracy"]),
                "mean_client_accuracy": float(acc["test"]["mean_client_accuracy"]),
                "grid": sel["grid"],
                "choice_counts": [sel["choice"].count(g) for g in range(len(sel["grid"]))],
                "grid_test_accuracy": sel["grid_test_accuracy"],
                "seconds": time.perf_counter() - t1,
            }
        )
        print(
            f"seed {seed} eps {eps} {method} + {objective}: {rows[-1]['test_accuracy']:.4f} "
            f"(grid {[round(a, 3) for a in sel['grid_test_accuracy']]})",
            file=sys.stderr,
            flush=True,
        )
    return rows


def report(rows: list[dict[str, Any]]) -> str:
    # two processes may finish the same run: one row per (run, objective)
    rows = list({(r["run_key"], r["finetune"]): r for r in rows}.values())
    seeds = sorted({r["seed"] for r in rows})
    header = ["fine-tuning"] + [
        f"{'ε=∞' if e is None else f'ε={e:g}'} {who}"
        for e in (0.5, 2.0, None)
        for who in ("MTL", "Global")
    ]
    has_local = any(r["method"] == "local" for r in rows)
    if has_local:
        header.append("Local (ε = 0)")

    def cell(eps: float | None, method: str, objective: str | None) -> str:
        if objective is None:
            vals = [
                r["trained_test_accuracy"]
                for r in rows
                if r["target_epsilon"] == eps
                and r["method"] == method
                and r["finetune"] == "vanilla"
            ]
        else:
            vals = [
                r["test_accuracy"]
                for r in rows
                if r["target_epsilon"] == eps
                and r["method"] == method
                and r["finetune"] == objective
            ]
        if not vals:
            return "–"
        mu, sd, n = mean_std(vals)
        return f"{mu:.3f} ± {sd:.3f} (n={n})"

    body = []
    for objective in (None, *OBJECTIVES):
        name = {None: "none", "mr": "mean-regularization", "skl": "symmetrized KL"}.get(
            objective, objective
        )
        body.append(
            [name]
            + [cell(e, m, objective) for e in (0.5, 2.0, None) for m in ("pmtl", "fedavg")]
            + ([cell(None, "local", objective)] if has_local else [])
        )
    priv = next((r for r in rows if r["target_epsilon"] == 2.0), None)
    privacy = (
        f"(ε = {priv['epsilon']:.3g}, δ = {priv['delta']:.3g}) joint DP (billboard) for MTL, DP of the "
        f"released model for Global; neighbours: {priv['relation']} one client; sampling: "
        f"{priv['sampling']} (rate 20/105); accountant: {priv['accountant']}"
        if priv
        else ""
    )
    lines = [
        "# Fine-tuning after private training on FEMNIST-105 (the PMTL paper's Table 1, tuned)",
        "",
        "Test accuracy pooled over the 1 685 test images of the 105 writers, mean ± std over seeds "
        f"{', '.join(map(str, seeds))}. MTL = PMTL (personalized models as the start), Global = "
        "private FedAvg (released model as the start). Training as in the trade-off suite (CNN, 100 "
        "rounds, 20 clients per round, γ = 0.5, lr 0.1, batch 10; PMTL λ = 0.001 at ε ≤ 2 and 1 "
        "at ε = ∞). Fine-tuning: one epoch on the client's own training data; every client chooses "
        f"lr ∈ {list(LRS)} and λ ∈ {list(LAMS)} on its own validation split (post-processing: the "
        "privacy guarantee is that of training). Row 'none': no fine-tuning.",
        "",
        markdown_table(header, body),
        "",
        f"Privacy at ε = 2: {privacy}.",
        "",
        "**Reading it.** (1) Chosen per client, the step size matters more than the objective: one "
        "epoch of vanilla fine-tuning lifts PMTL from 0.57 to 0.62–0.63 at ε ∈ {0.5, 2} and from "
        "0.59 to 0.69 at ε = ∞ (most clients pick lr = 0.01; the trade-off suite, which fine-tunes "
        "with the training step 0.1, gains about 0.01). (2) That gain is a final low-step-size "
        "epoch, not the billboard: local training with the same fine-tuning reaches the same "
        "level (column Local; its mr/sKL/EWC anchor is the untrained initial model, so only its "
        "vanilla row is meaningful). (3) With a noisy billboard the sKL and EWC objectives stay "
        "harmful even at the smallest step and λ of the grid: the released model's logits reach "
        "~10³ at ε = 2, so sKL's gradient (which grows with log p_w − log p_w̃) is huge, and the "
        "empirical Fisher at that model reaches ~10⁴, so EWC's λF pulls each client onto the "
        "noisy weights. Without noise they work (0.69–0.70). (4) The private global models "
        "cannot be rescued by one epoch of fine-tuning at ε ≤ 2 (≤ 0.07), unlike the paper's "
        "(205 clients and more rounds): MTL beats Global at ε ≤ 2 with vanilla and mean-"
        "regularized fine-tuning (0.62–0.63 vs ≤ 0.07), as the paper reports, and with sKL/EWC "
        "at ε = 2; at ε = 0.5 both are at chance with sKL/EWC. Non-privately Global wins (0.81 "
        "vs 0.69–0.70).",
        "",
        "Paper (Table 1, FEMNIST with 205 clients and more rounds, ε ∈ {0.1, 0.8, 2, ∞}): MTL "
        "beats Global with fine-tuning at small ε; e.g. at ε = 2 vanilla 0.677 vs 0.653, sKL "
        "0.662 vs 0.565; at ε = ∞ about 0.83 for both.",
        "",
        f"Machine: {machine_info()}.",
        "",
        "Reproduce: `python research/pmtl_femnist_finetune.py --data-path "
        "../shared/data/femnist-leaf --seeds 0,1,2`",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data-path", default=None)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--reverse", action="store_true", help="take runs from the end of the plan")
    p.add_argument("--report", action="store_true")
    args = p.parse_args()
    if not args.report:
        import torch

        from privmtl.experiments.pmtl import load_federated

        torch.set_num_threads(1)
        seeds = [int(s) for s in args.seeds.split(",")]
        plan = [(s, e, m) for s in seeds for e in EPSILONS for m in ("pmtl", "fedavg")]
        # local training with the same fine-tuning: what the fine-tuning gain owes to the billboard
        plan += [(s, None, "local") for s in seeds]
        datasets: dict[int, Any] = {}
        while True:
            done = {r["run_key"] for r in load_jsonl(LOG)}
            todo = [t for t in plan if _key(*t) not in done]
            if not todo:
                break
            seed, eps, method = todo[-1] if args.reverse else todo[0]
            if seed not in datasets:
                datasets[seed] = load_federated("femnist-leaf", data_path=args.data_path, seed=seed)
            for row in run_one(datasets[seed], seed, eps, method):
                append_jsonl(LOG, row)
    (RESULTS / "pmtl_femnist_finetune.md").write_text(report(load_jsonl(LOG)))


if __name__ == "__main__":
    main()
