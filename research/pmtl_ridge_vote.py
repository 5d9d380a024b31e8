"""PMTL's end of run with the ridge solver: per-client choice, the recorded vote, and variants.

Issues 31 and 32: is ``--local-solver ridge --finetune-select vote`` the end of run that should be
the default? Per (method, m, seed): one private run at the population study's settings (the CLI
defaults with ``--clients-per-round min(200, m)``; synthetic data, ε = 1, seeded noise: a
reproducible research simulation that protects nobody) with ``finetune="none"``, its trained
models saved; then, from these, each client's own data and public parameters only, every
candidate the ridge end of run could offer, each solved exactly
(:func:`~privmtl.federated.ridge.ridge_logreg`, as ``train_local(solver="ridge")`` calls it):

* ``trained``: the run's model of the client;
* ``local c{c}``: local training, prior strength ``c`` around the initial model
  (:data:`LOCAL_CS`; the built candidate is :data:`~privmtl.federated.local.LOCAL_RIDGES`);
* ``bb c{c}``: the billboard fine-tuned, prior strength ``c`` around it (:data:`BILLBOARD_CS`;
  the built candidate is :data:`~privmtl.federated.finish.AUTO_FINETUNE_RIDGES`).

Every candidate is scored per client on its validation and test splits; rules compared on the
pooled test accuracy (:func:`rules`): every client on one candidate; the per-client rule of
``--finetune auto`` (public order of :func:`~privmtl.federated.finish.auto_plan`, ties to the
later) over several candidate triples; the EXACT split vote (a client's vote shared among its
tied best, :func:`~privmtl.privacy.selection.client_vote_shares`) and the built NOISY vote
(:func:`~privmtl.privacy.selection.plan_vote` at
:data:`~privmtl.federated.finish.FINETUNE_VOTE_SHARE` of ε, ``draws`` Gaussian draws from a fixed
generator; where the plan holds no vote, the per-client rule, as built) over public candidate
lists; and hybrids: a client with at least ``k`` validation examples keeps its own choice, the
others take the vote's winner (or the billboard). A client's model then reads its own data, the
public releases and the recorded vote only.

``--built``: one run as built, ``local_solver="ridge"`` and ``finetune_select="vote"``.

Run from the repository root (one process, one torch thread):
``OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python research/pmtl_ridge_vote.py --m 1000 --seed 0``
Appends one row per run to ``research/results/pmtl_ridge_vote.jsonl``; ``report`` prints the
tables of ``research/pmtl_ridge_vote.md`` from these rows.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch
from _common import RESULTS, append_jsonl, load_jsonl, markdown_table, mean_std, trained_once
from pmtl_finetune_vote import _pick

from privmtl.experiments.pmtl import run_pmtl
from privmtl.federated.algorithms import client_scores
from privmtl.federated.finish import FINETUNE_VOTE_SHARE, FINETUNE_VOTERS, auto_plan, stack_trained
from privmtl.federated.ridge import ridge_logreg
from privmtl.federated.spec import resolve_delta
from privmtl.privacy.selection import client_vote_shares, plan_vote

OUT = RESULTS / "pmtl_ridge_vote.jsonl"
ROUNDS = 200
"""Rounds of every run: the population study's ``--rounds 200`` (``run_pmtl``'s own default is 100;
the first rows here, marked ``"rounds": 100``, ran at that default by mistake and are kept apart)."""
SCORES = RESULTS / "pmtl_ridge_vote_scores"
"""Every oracle run's per-client scores (``{method}_m{m}_s{seed}.npz``), for :func:`rules`."""
LOCAL_CS = (0.3, 1.0, 3.0)
"""Prior strengths of the local candidates measured (around the initial model)."""
BILLBOARD_CS = (3.0, 10.0, 30.0, 100.0, 300.0)
"""Prior strengths of the fine-tuned billboard candidates measured (around the billboard)."""
HYBRID_KS = (1, 2, 3, 5, 10)
"""Hybrids: a client with at least this many validation examples keeps its own choice."""


def _scores(m: int, seed: int, method: str, eps: float | None, q: int) -> dict[str, Any]:
    """One ``finetune="none"`` run and every client's scores of every candidate."""
    once = trained_once(m, seed, eps, q, method=method, rounds=ROUNDS)
    out, glob, pers, t_run = once["out"], once["glob"], once["pers"], once["seconds"]
    ds, net, buffers = once["ds"], once["net"], once["buffers"]
    cfg = out["config"]
    plan = auto_plan(
        method, None, float(out.get("noise_std") or 0.0), float(cfg["clip"]),
        int(out["released_dim"]), int(cfg["rounds"]),
    )  # fmt: skip
    init = {n: p.detach().clone() for n, p in net.named_parameters()}
    bb = {n: glob[n].detach().clone() for n in init}
    names = ["trained"] + [f"local c{c:g}" for c in LOCAL_CS] + [f"bb c{c:g}" for c in BILLBOARD_CS]
    t1 = time.time()
    models = [stack_trained(pers, glob, m)]
    models += ridge_logreg(init, ds, LOCAL_CS)
    models += ridge_logreg(bb, ds, BILLBOARD_CS)
    t_solve = time.time() - t1
    val_x, val_y = ds.split("val")
    test_x, test_y = ds.split("test")
    vc, vl, tc = [], [], []
    for p in models:
        c, loss = client_scores(net, p, buffers, val_x, val_y)
        vc.append(c)
        vl.append(loss)
        tc.append(client_scores(net, p, buffers, test_x, test_y)[0])
    return {
        "out": out, "plan_names": list(plan.names), "names": names,
        "accountant": str(cfg.get("accountant", "rdp")),
        "relation": str(cfg.get("relation", "add-remove")),
        "val_c": np.stack(vc, 1), "val_l": np.stack(vl, 1), "test_c": np.stack(tc, 1),
        "n_val": np.array([len(y) for y in val_y]), "n_test": np.array([len(y) for y in test_y]),
        "seconds_run": round(t_run, 1), "seconds_solve": round(t_solve, 1),
    }  # fmt: skip


def rules(s: dict[str, Any], m: int, seed: int, eps: float | None, draws: int) -> dict[str, Any]:
    """The rules of the module docstring on the scores ``s`` of :func:`_scores`."""
    names, plan_names = s["names"], s["plan_names"]
    val_c, val_l, test_c, n_val = s["val_c"], s["val_l"], s["test_c"], s["n_val"]
    n_test = float(s["n_test"].sum())
    rows = np.arange(m)
    acc_single = test_c.sum(0) / n_test
    ix = {n: j for j, n in enumerate(names)}
    res: dict[str, float] = {
        f"every client {n}": float(a) for n, a in zip(names, acc_single, strict=True)
    }

    def acc(choice: np.ndarray) -> float:
        return float(test_c[rows, choice].sum() / n_test)

    def triple(local: str, billboard: str) -> list[int]:
        role = {"trained": "trained", "local": local, "billboard-finetune": billboard}
        return [ix[role[n]] for n in plan_names]

    # the per-client rule (as built with ridge: local c1, bb c30), and other prior strengths
    client_picks: dict[str, np.ndarray] = {}
    for lc in ("local c1", "local c0.3", "local c3"):
        for bc in ("bb c30", "bb c10", "bb c100", "bb c300"):
            if lc != "local c1" and bc != "bb c30":
                continue
            label = f"client ({lc}, {bc})"
            client_picks[label] = _pick(val_c, val_l, triple(lc, bc))
            res[label] = acc(client_picks[label])
    built_client = client_picks["client (local c1, bb c30)"]
    counts_client = {names[j]: int((built_client == j).sum()) for j in sorted(set(built_client))}

    delta = float(resolve_delta(None, m)[0])
    vplan = plan_vote(
        min(m, FINETUNE_VOTERS), epsilon=eps, delta=delta, share=FINETUNE_VOTE_SHARE,
        accountant=s["accountant"], relation=s["relation"],
    )  # fmt: skip
    has_val = n_val > 0
    rng = np.random.default_rng([seed, 2031])
    lists = {
        "(trained, local c1, bb c30)": triple("local c1", "bb c30"),
        "(trained, local c1, bb c10)": triple("local c1", "bb c10"),
        "(trained, local c1, bb c10/30/100)": [ix["trained"], ix["local c1"]]
        + [ix[f"bb c{c}"] for c in (10, 30, 100)],
        "all nine": list(range(len(names))),
        "(bb c10/30/100)": [ix[f"bb c{c}"] for c in (10, 30, 100)],
    }
    votes: dict[str, Any] = {}
    small = {k: n_val < k for k in HYBRID_KS}
    for label, cols in lists.items():
        sub = np.where(has_val[:, None] & np.isfinite(val_l[:, cols]), val_c[:, cols], np.nan)
        counts = client_vote_shares(sub).sum(0)
        w = cols[int(np.argmax(counts))]
        res[f"exact vote {label}"] = float(acc_single[w])
        v: dict[str, Any] = {
            "exact_counts": dict(
                zip([names[c] for c in cols], counts.round(1).tolist(), strict=True)
            ),
            "exact_winner": names[w],
        }
        if vplan.held:
            noisy = counts[None, :] + rng.normal(0.0, vplan.noise_std, (draws, len(cols)))
            wins = np.array(cols)[np.argmax(noisy, 1)]
            res[f"noisy vote {label}"] = float(acc_single[wins].mean())
            v["noisy_wins"] = {names[c]: int((wins == c).sum()) for c in sorted(set(wins.tolist()))}
            v["noisy_sd_accuracy"] = round(float(acc_single[wins].std()), 5)
        else:  # as built: no vote, the per-client rule
            wins = None
            res[f"noisy vote {label}"] = res["client (local c1, bb c30)"]
            v["noisy"] = "not held: " + vplan.reason
        # hybrids: a client with >= k validation examples keeps its own choice (built triple)
        for k, sm in small.items():
            own = test_c[rows[~sm], built_client[~sm]].sum()
            res[f"hybrid k={k} exact {label}"] = float((test_c[sm, w].sum() + own) / n_test)
            if wins is not None:
                per = test_c[sm].sum(0)  # the small clients' correct test predictions per candidate
                res[f"hybrid k={k} noisy {label}"] = float(((per[wins]).mean() + own) / n_test)
        votes[label] = v
    preferred = triple("local c1", "bb c30")[-1]  # the plan's tie-preferred candidate
    res["every client the plan's preferred"] = float(acc_single[preferred])
    for k, sm in small.items():
        res[f"preferred unless >= {k} val"] = acc(np.where(sm, preferred, built_client))
        for bc in ("bb c30", "bb c100"):
            choice = np.where(sm, ix[bc], built_client)
            res[f"billboard unless >= {k} val ({bc})"] = acc(choice)
    return {
        "vote_held": vplan.held, "vote_noise_std": vplan.noise_std, "delta": delta,
        "clients_with_val": int(has_val.sum()), "median_val": float(np.median(n_val)),
        "clients_small": {str(k): int(sm.sum()) for k, sm in small.items()},
        "clients_per_candidate_client_rule": counts_client,
        "pooled_val_accuracy": dict(
            zip(names, (val_c.sum(0) / n_val.sum()).round(4).tolist(), strict=True)
        ),
        "accuracy": {k: round(v, 5) for k, v in res.items()}, "votes": votes, "draws": draws,
    }  # fmt: skip


def oracle(
    m: int, seed: int, method: str, eps: float | None, q: int, draws: int = 4000
) -> dict[str, Any]:
    t0 = time.time()
    s = _scores(m, seed, method, eps, q)
    out = s["out"]
    SCORES.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        SCORES / f"{method}_m{m}_s{seed}.npz",
        **{k: np.asarray(v) for k, v in s.items() if k != "out"},
    )
    return {
        "variant": "oracle ridge", "method": method, "m": m, "seed": seed, "eps": eps, "rounds": ROUNDS,
        "clients_per_round": q, "delta_run": out.get("delta"), "epsilon_reported": out.get("epsilon"),
        "noise_std": out.get("noise_std"), "relation": out["config"].get("relation"),
        "accountant": out["config"].get("accountant"), "plan": s["plan_names"],
        "trained_test_accuracy_run": out.get("test_accuracy"), "names": s["names"],
        **rules(s, m, seed, eps, draws),
        "seconds_run": s["seconds_run"], "seconds_solve": s["seconds_solve"],
        "seconds": round(time.time() - t0, 1),
    }  # fmt: skip


def built(m: int, seed: int, method: str, eps: float | None, q: int) -> dict[str, Any]:
    """One run as built: ``local_solver="ridge"``, ``finetune_select="vote"``."""
    t0 = time.time()
    out = run_pmtl(
        num_clients=m, epsilon=eps, noise_source="seeded", seed=seed, show_progress=False,
        threads=1, clients_per_round=q, finetune_select="vote", local_solver="ridge", method=method,
        rounds=ROUNDS,
    )  # fmt: skip
    auto = out["finetune_auto"]
    return {
        "variant": "built ridge vote", "method": method, "m": m, "seed": seed, "eps": eps, "rounds": ROUNDS,
        "clients_per_round": q, "delta": out["delta"], "epsilon": out["epsilon"],
        "noise_std": out["noise_std"], "test_accuracy": out["test_accuracy"],
        "select": auto.get("select"), "vote": auto.get("vote"),
        "clients_per_candidate": auto.get("clients_per_candidate"),
        "seconds": round(time.time() - t0, 1),
    }  # fmt: skip


REPORT_RULES = (
    "every client trained", "every client local c1", "every client bb c3", "every client bb c10", "every client bb c30",
    "every client bb c100", "client (local c1, bb c30)", "client (local c1, bb c100)",
    "exact vote (trained, local c1, bb c30)", "noisy vote (trained, local c1, bb c30)",
    "exact vote (trained, local c1, bb c10)", "noisy vote (trained, local c1, bb c10)",
    "exact vote (trained, local c1, bb c10/30/100)", "noisy vote (trained, local c1, bb c10/30/100)",
    "noisy vote all nine", "every client the plan's preferred", "preferred unless >= 10 val",
    "hybrid k=10 noisy (trained, local c1, bb c30)",
)  # fmt: skip
"""The rules of :func:`report`'s table (every rule is in the rows)."""


def _latest(*variants: str) -> dict[tuple[str, int, int], dict[str, Any]]:
    """The last row of ``variants`` at :data:`ROUNDS` per (method, m, seed)."""
    out: dict[tuple[str, int, int], dict[str, Any]] = {}
    for r in load_jsonl(OUT):
        if r.get("variant") in variants and r.get("rounds") == ROUNDS:
            out[(r["method"], r["m"], r["seed"])] = r
    return out


def report(rules_shown: tuple[str, ...] = REPORT_RULES) -> None:
    """Mean ± sd over the seeds of the rules (oracle rows) and the built rows, as markdown."""
    oracle = _latest("oracle ridge", "oracle ridge (re-tallied)")
    cells = sorted({(k[0], k[1]) for k in oracle})
    header = ["rule"] + [f"{meth} m = {m} ({len([k for k in oracle if k[:2] == (meth, m)])})"
                         for meth, m in cells]  # fmt: skip
    rows = []
    for rule in rules_shown:
        row = [rule]
        for meth, m in cells:
            mu, sd, n = mean_std(
                r["accuracy"].get(rule) for k, r in oracle.items() if k[:2] == (meth, m)
            )
            row.append(f"{mu:.4f} ± {sd:.4f}" if n else "—")
        rows.append(row)
    print(markdown_table(header, rows))
    built_rows = _latest("built ridge vote")
    print()
    print(markdown_table(
        ["method", "m", "seed", "test acc.", "ε reported", "rounds σ", "vote winner", "noisy counts"],
        [[k[0], k[1], k[2], f"{r['test_accuracy']:.4f}", f"{r['epsilon']:.4f}",
          f"{r['noise_std']:.6f}", (r.get("vote") or {}).get("winner", "not held"),
          ", ".join(f"{c:.0f}" for c in (r.get("vote") or {}).get("noisy_counts", []))]
         for k, r in sorted(built_rows.items())],
    ))  # fmt: skip


BENCH = RESULTS.parent.parent / "benchmarks" / "results" / "ridge_default.jsonl"
"""The committed ``--local-solver`` rows of local-all, FedAvg and PMTL (same commands)."""


def _bench(method: str, solver: str, m: int) -> dict[int, float]:
    return {
        r["seed"]: r["test_accuracy"]
        for r in load_jsonl(BENCH)
        if (r["method"], r["solver"], r["m"]) == (method, solver, m)
    }


def accept(rule: str = "noisy vote (trained, local c1, bb c30)") -> None:
    """Targets (a) and (b): PMTL's ridge + vote (built rows; where none, the oracle's ``rule``;
    at m = 100 no vote is held: the committed ``--local-solver ridge`` row) against local-all
    (ridge) and FedAvg (today's default, sgd, and ridge per client), seeds 0–2."""
    built_rows = _latest("built ridge vote")
    oracle = _latest("oracle ridge")
    out = []
    for m in (100, 1000, 10_000):
        pm = {k[2]: r["test_accuracy"] for k, r in built_rows.items() if k[:2] == ("pmtl", m)}
        src = "built"
        if m == 100:
            pm, src = _bench("pmtl", "ridge", m), "ridge rows (no vote held)"
        elif len(pm) < 3:
            pm = {**{k[2]: r["accuracy"][rule] for k, r in oracle.items() if k[:2] == ("pmtl", m)},
                  **pm}  # fmt: skip
            src = "built + oracle"
        loc = _bench("local", "ridge", m)
        fs, fr = _bench("fedavg", "sgd", m), _bench("fedavg", "ridge", m)
        seeds = sorted(set(pm) & set(loc) & set(fs))
        p = np.array([pm[x] for x in seeds])
        best = np.array([max(loc[x], fs[x]) for x in seeds])
        best_r = np.array([max(loc[x], fr[x]) for x in seeds])
        out.append([
            m, ",".join(map(str, seeds)), src, f"{p.mean():.4f} ± {p.std(ddof=1):.4f}",
            f"{np.mean([loc[x] for x in seeds]):.4f}", f"{np.mean([fs[x] for x in seeds]):.4f}",
            f"{np.mean([fr[x] for x in seeds]):.4f}",
            f"{100 * (p - best).mean():+.2f}", f"{100 * (p - best_r).mean():+.2f}",
        ])  # fmt: skip
    print(markdown_table(
        ["m", "seeds", "PMTL source", "PMTL ridge + vote", "local (ridge)", "FedAvg (sgd, today)",
         "FedAvg (ridge, per client)", "Δ vs max(local, FedAvg sgd), points",
         "Δ vs max(local, FedAvg ridge), points"], out,
    ))  # fmt: skip


VARIANTS = {
    "ridge + vote (oracle, simulated noise)": "noisy vote (trained, local c1, bb c30)",
    "ridge + vote, billboard c = 10": "noisy vote (trained, local c1, bb c10)",
    "ridge + vote over bb c10/30/100": "noisy vote (trained, local c1, bb c10/30/100)",
    "ridge + vote; no vote held: the plan's preferred for all": "every client the plan's preferred",
}
"""Variants of :func:`variants` (label: the oracle rule; where no vote is held the noisy-vote
rules are the per-client rule, as built)."""


def variants() -> None:
    """Targets (a) and (b) for each of :data:`VARIANTS` from the oracle rows (the seeds each cell
    has), against the committed local-all and FedAvg rows of the same seeds."""
    oracle = _latest("oracle ridge", "oracle ridge (re-tallied)")
    out = []
    for label, rule in VARIANTS.items():
        for m in (100, 1000, 10_000):
            pm = {k[2]: r["accuracy"][rule] for k, r in oracle.items() if k[:2] == ("pmtl", m)}
            loc, fs = _bench("local", "ridge", m), _bench("fedavg", "sgd", m)
            fr = _bench("fedavg", "ridge", m)
            seeds = sorted(set(pm) & set(loc) & set(fs))
            if not seeds:
                continue
            p = np.array([pm[x] for x in seeds])
            d = np.array([pm[x] - max(loc[x], fs[x]) for x in seeds])
            dr = np.array([pm[x] - max(loc[x], fr[x]) for x in seeds])
            out.append([
                label, m, ",".join(map(str, seeds)), f"{p.mean():.4f}",
                f"{100 * d.mean():+.2f}", f"{100 * dr.mean():+.2f}",
            ])  # fmt: skip
    print(markdown_table(
        ["variant", "m", "seeds", "PMTL", "Δ vs max(local, FedAvg sgd), points",
         "Δ vs max(local, FedAvg ridge), points"], out,
    ))  # fmt: skip


def rerules(draws: int = 4000) -> None:
    """:func:`rules` again on every saved score file (:data:`SCORES`), one row each."""
    for path in sorted(SCORES.glob("*.npz")):
        z = np.load(path)
        s: dict[str, Any] = {k: z[k] for k in z.files}
        s["names"] = [str(n) for n in s["names"]]
        s["plan_names"] = [str(n) for n in s["plan_names"]]
        s["accountant"], s["relation"] = str(s["accountant"]), str(s["relation"])
        method, m, seed = path.stem.split("_")
        m_, seed_ = int(m[1:]), int(seed[1:])
        row = {
            "variant": "oracle ridge (re-tallied)", "method": method, "m": m_, "seed": seed_, "rounds": ROUNDS,
            "eps": 1.0, "scores": path.name, **rules(s, m_, seed_, 1.0, draws),
        }  # fmt: skip
        append_jsonl(OUT, row)
        print(path.name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--method", default="pmtl")
    ap.add_argument("--eps", type=float, default=1.0, help="ε; 0: non-private")
    ap.add_argument("--built", action="store_true", help="run ridge + vote as built")
    ap.add_argument("--report", action="store_true", help="print the tables")
    ap.add_argument("--rerules", action="store_true", help="the rules again on the saved scores")
    a = ap.parse_args()
    if a.rerules:
        rerules()
        return
    if a.report:
        report()
        print()
        accept()
        print()
        variants()
        return
    torch.set_num_threads(1)
    q = min(200, a.m)
    if a.built:
        row = built(a.m, a.seed, a.method, a.eps or None, q)
    else:
        row = oracle(a.m, a.seed, a.method, a.eps or None, q)
    append_jsonl(OUT, row)
    print({k: v for k, v in row.items() if k != "votes"})


if __name__ == "__main__":
    main()
