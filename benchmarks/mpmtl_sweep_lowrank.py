"""``privmtl mpmtl-sweep`` at its defaults on a multi-task regression table with low-rank structure.

The table (:func:`write_table`, code only: no data file is committed) is what a user would hand to
``privmtl mpmtl-sweep --data table``: a ``task`` column, feature columns ``x0`` .. ``x{d-1}`` and
a target ``y``, one row per sample. Its rows come from
:func:`privmtl.data.synthetic.make_lowrank_tasks` (``W = coef_scale · Z Aᵀ``, rank 5): 150 tasks,
d = 30 features, 40 rows per task (the table loader keeps 70 % for training: 28 rows, fewer
than d, the regime where sharing across tasks pays), drawn from ``--table-seed`` (0).

Every run is the sweep at the CLI's defaults (``select="vote"``, the default grid, the default
vote share, secure noise unless ``--seeded``), ε ∈ {0.1, 1, 10} (``--epsilons``), seeds 0-2, with
STL (``stl-l2``) and the non-private trace-norm MTL (``mtl-trace``) beside it, as

    privmtl mpmtl-sweep --data table --data-path <table.csv> --seeds 0,1,2 --epsilons 0.1,1,10

Each invocation writes the sweep's own files under ``--out`` (default a folder under
``$PRIVMTL_CACHE_DIR``, outside the repository) and appends its summary rows, tagged ``--tag``
(e.g. ``main`` for the code before the change, ``after`` for it), to
``results/mpmtl_sweep_lowrank.jsonl``; ``--report`` writes ``results/mpmtl_sweep_lowrank.md``
and copies the last run's plot to ``results/mpmtl_sweep_lowrank.png``::

    python benchmarks/mpmtl_sweep_lowrank.py --tag after --seeded --epsilons 0.1,0.3,1,3,10
    python benchmarks/mpmtl_sweep_lowrank.py --tag two-candidates --seeded \
        --epsilons 0.1,0.3,1,3,10 --lowrank-grid '[{"clip": [1.0], "eigen_fix": ["denoise", "shift"]}]'
    python benchmarks/mpmtl_sweep_lowrank.py --tag after-secure --epsilons 0.1,0.3,1,3,10
    python benchmarks/mpmtl_sweep_lowrank.py --tag refit-power --seeded --epsilons 0.1,0.3,1,3,10
    python benchmarks/mpmtl_sweep_lowrank.py --report

The ``main`` rows are the same command run with the code before the change (``git archive`` of
the parent commit, ``PYTHONPATH`` pointing at its ``src``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
from _common import RESULTS, append_jsonl, load_jsonl, machine_info, markdown_table

from privmtl.data.synthetic import make_lowrank_tasks

LOG = RESULTS / "mpmtl_sweep_lowrank.jsonl"
REPORT = RESULTS / "mpmtl_sweep_lowrank.md"
PLOT = RESULTS / "mpmtl_sweep_lowrank.png"
N_TASKS = 150
N_FEATURES = 30
ROWS_PER_TASK = 40
RANK = 5


def write_table(path: Path, seed: int = 0) -> Path:
    """Write the low-rank regression table (module docstring) to ``path`` as CSV."""
    train, test = make_lowrank_tasks(
        n_tasks=N_TASKS,
        n_samples=ROWS_PER_TASK // 4,
        test_factor=3,
        n_features=N_FEATURES,
        rank=RANK,
        random_state=seed,
    )
    lines = ["task," + ",".join(f"x{j}" for j in range(N_FEATURES)) + ",y"]
    for i in range(N_TASKS):
        X = np.vstack([train.X[i], test.X[i]])
        y = np.concatenate([train.y[i], test.y[i]])
        for row, target in zip(X, y, strict=True):
            lines.append(f"t{i}," + ",".join(f"{v:.6g}" for v in row) + f",{target:.6g}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _cache() -> Path:
    return Path(os.environ.get("PRIVMTL_CACHE_DIR", Path.home() / ".cache" / "privmtl"))


def run(args: argparse.Namespace) -> None:
    from privmtl.experiments.mpmtl_sweep import DEFAULT_SWEEP_METHODS, run_mpmtl_sweep

    if args.lowrank_grid:  # an attempt with another grid (the report names it by its tag)
        from privmtl.linear.methods import linear_method

        linear_method("lowrank").vote_grid = json.loads(args.lowrank_grid)
    table = write_table(_cache() / f"lowrank-table-{args.table_seed}.csv", args.table_seed)
    out = Path(args.out or _cache() / f"mpmtl-sweep-lowrank-{args.tag}")
    res = run_mpmtl_sweep(
        data="table",
        data_path=table,
        methods=list(DEFAULT_SWEEP_METHODS),
        epsilons=[float(e) for e in args.epsilons.split(",")],
        seeds=[int(s) for s in args.seeds.split(",")],
        noise="gaussian",
        tune_mode="each",
        out_dir=out,
        noise_source="seeded" if args.seeded else "secure",
    )
    rows = json.loads((out / "mpmtl_sweep.json").read_text())["rows"]
    for r in rows:
        append_jsonl(LOG, {"tag": args.tag, "table_seed": args.table_seed, **_brief(r)})
    shutil.copy(out / "mpmtl_tradeoff.png", RESULTS / f"mpmtl_sweep_lowrank_{args.tag}.png")
    print(json.dumps(res["summary"], indent=1))


def _brief(r: dict[str, Any]) -> dict[str, Any]:
    sel = r.get("selection") or {}
    params = r.get("params") or {}
    g = r.get("guarantee") or {}
    details = g.get("details") or {}
    keys = ("method", "seed", "epsilon", "target_epsilon", "delta", "relation", "sampling",
            "accountant", "noise_source", "covered", "selection_method", "training_epsilon",
            "metric", "value")  # fmt: skip
    out = {k: r.get(k) for k in keys}
    out["chosen"] = {k: params.get(k) for k in ("clip", "iterations", "lam", "refit_lam",
                                                 "eigen_fix") if k in params}  # fmt: skip
    # the chosen run's release: ℓ2 sensitivity and the noise std of its last covariance release
    z = details.get("noise_multipliers") or []
    sens = details.get("sensitivity")
    out["release"] = None if not z or sens is None else {
        "sensitivity": sens, "releases": len(z), "last_noise_std": z[-1] * sens,
    }  # fmt: skip
    out["selection"] = {k: sel.get(k) for k in ("candidates", "chosen", "vote",
                                                 "candidates_epsilon", "plan") if k in sel}  # fmt: skip
    out["eigen_floor"] = {k: (r.get("eigen_floor") or {}).get(k)
                          for k in ("mode", "floor", "cut", "reason")} if r.get("eigen_floor") else None  # fmt: skip
    out["guarantee_notes"] = g.get("notes")
    out["machine"] = machine_info()
    return out


TAGS = {
    "main": "before (main): four candidates (K = 30/100/300 refit, K = 100 T = 10 projection), "
    "each at the full target",
    "two-candidates": "attempt: K = 1 refit with eigen_fix denoise | shift, target split "
    "between them and the vote",
    "after": "after (default): the estimator's public defaults alone, whole target",
    "after-secure": "after, the same with the CLI's default secure noise",
    "refit-power": "after, with the low-rank refit's power rule (refit_power auto, "
    "merged after the rows above were run), seeded noise",
}


def _fmt(x: Any, spec: str = ".3g") -> str:
    return "—" if x is None else format(x, spec)


def report() -> None:
    rows = load_jsonl(LOG)
    groups: dict[tuple[str, str, Any], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["tag"], r["method"], r["target_epsilon"]), []).append(r)
    some = next(r for r in rows if r["method"] == "lowrank")
    lines = [
        "# `privmtl mpmtl-sweep` at its defaults on a low-rank regression table",
        "",
        "Generated by `benchmarks/mpmtl_sweep_lowrank.py` (its docstring has the table and the "
        "commands). Table: 150 tasks, d = 30 features (+ intercept: d = 31 after loading), 40 "
        "rows per task from `make_lowrank_tasks` (rank 5, table seed 0); the table loader's "
        "defaults (each task standardized on its own training rows, 70 % training: 28 rows per "
        "task). Seeds 0-2, the sweep's defaults (`--select vote`, vote share 0.5, validation "
        "fraction 0.2), with seeded noise except in the `after-secure` section.",
        "",
        f"Every ε below: δ = {some['delta']:g}, neighbours: {some['relation']} one task "
        f"(the whole task, data and model sequence: MP-MTL), sampling: {some['sampling']} tasks "
        f"every release, accountant: {some['accountant']}; the noise source is stated per "
        "section (seeded: a reproducible simulation that protects nobody; secure: OS entropy, "
        "the CLI's default). *target ε* is the sweep point; *charged ε* is what the row "
        "reports: every candidate's releases and the vote, composed. STL (`stl-l2`) is "
        "ε = 0 (nothing leaves a task); `mtl-trace` is non-private.",
        "",
    ]
    for tag, what in TAGS.items():
        sources = sorted({r["noise_source"] for r in rows
                          if r["tag"] == tag and r["method"] == "lowrank"})  # fmt: skip
        lines += [f"## {tag}: {what}", "", f"Noise source of the private rows: {', '.join(sources)}.",
                  ""]  # fmt: skip
        header = ["method", "target ε", "charged ε", "nMSE (mean ± std, n)", "chosen",
                  "sensitivity · last σ", "plan"]  # fmt: skip
        body = []
        keys = sorted((k for k in groups if k[0] == tag),
                      key=lambda k: (k[1], -1 if k[2] is None else k[2]))  # fmt: skip
        for key in keys:
            rs = groups[key]
            vals = np.array([r["value"] for r in rs], dtype=float)
            charged = sorted({round(r["epsilon"], 4) for r in rs if r["epsilon"] is not None})
            chosen = sorted({json.dumps(r["chosen"], sort_keys=True) for r in rs})
            rel = sorted({f"{_fmt(r['release']['sensitivity'])} · "
                          f"{_fmt(r['release']['last_noise_std'])} ({r['release']['releases']})"
                          for r in rs if r.get("release")})  # fmt: skip
            plans = []
            for r in rs:
                p = (r.get("selection") or {}).get("plan")
                if p:
                    plans.append(
                        f"{len(p['candidates'])} run at ε {p['candidate_epsilon']:.3g}, "
                        f"S/N {min(p['signal_to_noise']):.3g}, {len(p['dropped'])} dropped"
                        + (", vote" if p["vote_held"] else "")
                    )
            body.append([
                key[1], _fmt(key[2], "g"),
                ", ".join(f"{c:g}" for c in charged) or "—",
                f"{vals.mean():.4f} ± {vals.std(ddof=1) if len(vals) > 1 else 0:.4f} ({len(vals)})",
                "; ".join(chosen), "; ".join(rel) or "—", "; ".join(sorted(set(plans))) or "—",
            ])  # fmt: skip
        lines += [markdown_table(header, body), ""]
    lines += [FINDINGS, "", "![after](mpmtl_sweep_lowrank.png)", "",
              "Before: ![main](mpmtl_sweep_lowrank_main.png)", ""]  # fmt: skip
    REPORT.write_text("\n".join(lines) + "\n")
    after = RESULTS / "mpmtl_sweep_lowrank_after.png"
    if after.exists():
        shutil.move(after, PLOT)
    print(REPORT.read_text())


FINDINGS = """## Findings

* **Before (main)** the sweep drowned: each of its four candidates ran at the full target, so a
  row was charged 2.2x its target (0.22, 0.66, 2.2, 6.9, 25 for 0.1 ... 10), and three of them
  used K = 30-300, far above the models' norms (ridge norms 7-10 here): ℓ2 sensitivity 900-1e4
  and noise std 500-3e5 on a covariance whose signal is about m·|w|² ~ 1e4. Every candidate
  was noise (the refits at K ≥ 30 cut every direction: single-task learning with a fixed ridge
  weight on 80 % of the rows), the vote chose among noise (K = 100, T = 10 at ε ≥ 1), and
  private low-rank sat at 0.36-0.39 at every ε, level with the sweep's own STL line (0.385,
  itself fitted on the 80 % fit parts).
* **Attempt: two candidates** (the estimator's defaults with eigen_fix denoise or shift), the
  target split between them and the vote so that a row is charged exactly its target. Both
  candidates are fitted on the 80 % fit parts (22 rows, fewer than d = 31) at about half the
  budget each, and the vote's half of ε buys a choice between two models that differ by less
  than the fit parts cost: nMSE 0.359 at ε = 1, 0.221 at ε = 3, 0.097 at ε = 10, worse than
  one run of the defaults at every ε. It did not pay; it is not the default.
* **After (default)**: the low-rank grid is the estimator's public defaults alone (K = 1, below
  the models' norms, one release, the local refit, its own recorded eigen-floor vote inside the
  run), run on the whole training split with the whole target: the sweep's row is the single
  `privmtl mpmtl` run at the defaults. Charged ε = target at every point. nMSE 0.195 at
  ε = 0.1 and 0.3 (the release is at or below the signal bound, S/N 0.40 and 1.09: the refit
  keeps no direction and equals STL, 0.195), **0.147 at ε = 1, 0.079 at ε = 3, 0.044 at
  ε = 10**, against STL 0.195 (the single covered STL run, every task's own leave-one-out on
  its whole training split) and the non-private trace-norm MTL 0.026 (chosen by the tasks'
  exact vote, then fitted on the whole training split). Private low-rank is below STL at every
  ε ≥ 1 and never above it. With secure noise (the CLI's default; one draw, not reproducible):
  0.195, 0.195, 0.136, 0.077, 0.043.
* No default candidate is ever below the signal bound where a vote is held; the rule
  (`MIN_SIGNAL_TO_NOISE`: m K² / (2σ√d) ≥ 1, public) drops the K = 100, T = 10 (main's choice)
  candidate before any run wherever its release would be noise at its share
  (`tests/experiments/test_mpmtl_sweep_budget.py`). It cannot see a K far above the models'
  norms (their norms are private): the default grid avoids such K instead."""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tag", default="after")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epsilons", default="0.1,1,10")
    p.add_argument("--table-seed", type=int, default=0)
    p.add_argument("--seeded", action="store_true", help="seeded noise (simulation only)")
    p.add_argument("--out", default=None)
    p.add_argument("--lowrank-grid", default=None, help="JSON: the low-rank vote grid to try")
    p.add_argument("--report", action="store_true")
    args = p.parse_args()
    if args.report:
        report()
        return
    run(args)


if __name__ == "__main__":
    sys.exit(main())
