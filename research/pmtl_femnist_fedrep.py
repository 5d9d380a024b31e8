"""FEMNIST-105 at ε = 1: ``--method fedrep`` (DP-FedRep) against the committed best PMTL and local.

``results/pmtl_femnist_fedrep.{jsonl,md}``. Every attempt is an exact ``privmtl pmtl`` argument
list (key ``argv`` of the log) run on the seeds given: the FEMNIST CNN, ε = 1, δ = 1/105
(``--paper-delta``, the PMTL paper's, as in ``pmtl_femnist_best.json``), 20 clients per round
with Poisson sampling, add/remove one client, RDP accountant, seeded noise (a reproducible
simulation). What is shared (``--shared-params``: the representation; the rest is each client's
head), the head's local epochs and the rounds vary. Every row uses the post-processing of the
committed comparison (one epoch of vanilla fine-tuning, each client choosing lr ∈ {0.01, 0.1} on
its own validation split), so that it reads against ``pmtl_femnist_best.md``'s numbers; rows
marked ``auto`` use the product default ``--finetune auto`` instead (each client's own choice
between its model, the fine-tuned billboard and its own local training). Nothing is selected on
pooled data: every row is covered by its guarantee. Resumable (one run at a time).

    python research/pmtl_femnist_fedrep.py --data-path ../shared/data/femnist-leaf --configs conv1-h2 --seeds 0
    python research/pmtl_femnist_fedrep.py --report > research/results/pmtl_femnist_fedrep.md
"""

from __future__ import annotations

import argparse
import math

from _common import (
    RESULTS,
    append_jsonl,
    drop_options,
    load_jsonl,
    markdown_table,
    mean_std,
    run_pmtl_seed,
    seeds_main,
    seeds_parser,
)

LOG = RESULTS / "pmtl_femnist_fedrep.jsonl"

COMMON = [
    "--data", "femnist-leaf", "--model", "cnn", "--method", "fedrep", "--epsilon", "1",
    "--paper-delta", "--lr", "0.1", "--clients-per-round", "20", "--batch-size", "10",
    "--sampling", "poisson", "--reproducible-noise", "--quiet",
]  # fmt: skip
FINETUNE = ["--finetune", "vanilla", "--finetune-lrs", "0.01,0.1", "--finetune-lams", "0.01,1.0"]

#: name -> (what it tries, the arguments after COMMON)
CONFIGS: dict[str, tuple[str, list[str]]] = {
    "conv1-h2": (
        "representation conv1 (832 params), head conv2+classifier, 2 head epochs, T=50, γ=0.3",
        ["--shared-params", "conv1", "--head-epochs", "2", "--rounds", "50", "--clip", "0.3",
         *FINETUNE],
    ),
    "conv-h2": (
        "representation conv1+conv2 (52 096 params, the default), head classifier, 2 head "
        "epochs, T=50, γ=0.3",
        ["--head-epochs", "2", "--rounds", "50", "--clip", "0.3", *FINETUNE],
    ),
    "conv1-h5-T10-all": (
        "representation conv1, head conv2+classifier, 5 head epochs, T=10 with every client in "
        "every round (q=m=105: σ per coordinate 0.020 instead of 0.048), γ=0.3",
        ["--shared-params", "conv1", "--head-epochs", "5", "--rounds", "10", "--clip", "0.3",
         "--clients-per-round", "105", *FINETUNE],
    ),
    "conv1-h5-T20": (
        "representation conv1, head conv2+classifier, 5 head epochs, T=20 (q=20, Poisson), γ=0.3",
        ["--shared-params", "conv1", "--head-epochs", "5", "--rounds", "20", "--clip", "0.3",
         *FINETUNE],
    ),
    "conv-h2-nonprivate": (
        "conv-h2 without noise (no --epsilon; not private): the ceiling of this representation",
        ["--head-epochs", "2", "--rounds", "50", "--clip", "0.3", *FINETUNE],
    ),
    "conv-h5-T20": (
        "representation conv1+conv2, head classifier, 5 head epochs, T=20 (q=20, Poisson), γ=0.3",
        ["--head-epochs", "5", "--rounds", "20", "--clip", "0.3", *FINETUNE],
    ),
    "conv-h2-delta1e-5": (
        "conv-h2 at the anchors' δ = 1e-5 (instead of 1/105)",
        ["--delta", "1e-5", "--head-epochs", "2", "--rounds", "50", "--clip", "0.3", *FINETUNE],
    ),
    "conv-h5-T10": (
        "representation conv1+conv2, head classifier, 5 head epochs, T=10 (q=20, Poisson), γ=0.3",
        ["--head-epochs", "5", "--rounds", "10", "--clip", "0.3", *FINETUNE],
    ),
    "conv-h5-T20-delta1e-5": (
        "conv-h5-T20 at the anchors' δ = 1e-5 (instead of 1/105)",
        ["--delta", "1e-5", "--head-epochs", "5", "--rounds", "20", "--clip", "0.3", *FINETUNE],
    ),
}  # fmt: skip
#: options of COMMON a row leaves out
DROP = {
    "conv-h2-nonprivate": ("--epsilon",),
    "conv-h2-delta1e-5": ("--paper-delta",),
    "conv-h5-T20-delta1e-5": ("--paper-delta",),
}


OPTIONS = RESULTS / "pmtl_femnist_options.jsonl"
#: the committed comparison (``pmtl_femnist_best.json``): its rows in ``pmtl_femnist_options.jsonl``
LOCAL, BEST_PMTL = "local", "ditto-conv1-lam0.3-T50E2-clip0.3"


def _committed(config: str) -> dict[int, dict]:
    """Test and validation accuracy per seed of a committed configuration."""
    return {r["seed"]: r for r in load_jsonl(OPTIONS) if r.get("config") == config}


def _argv(extra: list[str], drop: tuple[str, ...] = ()) -> list[str]:
    """COMMON then ``extra``; an option given in ``extra`` replaces COMMON's, those in ``drop``
    are left out."""
    given = {a for a in extra if a.startswith("--")} | set(drop)
    return [*drop_options(COMMON, given), *extra]


def run(args: argparse.Namespace) -> None:
    done = {(r["name"], r["seed"]) for r in load_jsonl(LOG)}
    for name in args.configs.split(","):
        what, extra = CONFIGS[name]
        argv = _argv(extra, DROP.get(name, ()))
        for seed in [int(s) for s in args.seeds.split(",")]:
            if (name, seed) in done:
                continue
            out, seconds = run_pmtl_seed(argv, seed, args.data_path, f"fedrep {name} seed {seed}")
            row = {
                "name": name,
                "what": what,
                "seed": seed,
                "argv": argv,
                "wall_seconds": seconds,
                **{
                    k: v for k, v in out.items() if k not in ("epsilon_per_round", "clip_per_round")
                },
            }
            append_jsonl(LOG, row)
            print(f"{name} seed {seed}: {out['test_accuracy']:.4f} ({seconds:.0f} s)", flush=True)


def _fmt(values: list[float]) -> str:
    mean, std, n = mean_std(values)
    if n == 0 or math.isnan(mean):
        return "–"
    return f"{mean:.3f} ± {std:.3f} (n={n})" if n > 1 else f"{mean:.3f} (n=1)"


def report() -> str:
    rows = load_jsonl(LOG)
    local = {s: r["test_accuracy"] for s, r in _committed(LOCAL).items()}
    body = []
    for label, config in (("committed local", LOCAL), ("committed best PMTL", BEST_PMTL)):
        rs = [r for _, r in sorted(_committed(config).items())]
        deltas = [100 * (r["test_accuracy"] - local[r["seed"]]) for r in rs]
        body.append([
            label, f"`{config}` (pmtl_femnist_options.jsonl)", str(rs[0].get("released_dim") or "–"),
            _fmt([r["val_accuracy"] for r in rs]), _fmt([r["test_accuracy"] for r in rs]),
            " / ".join(f"{r['test_accuracy']:.3f}" for r in rs),
            _fmt([r["pre_finetune_test_accuracy"] for r in rs]),
            f"{sum(deltas) / len(deltas):+.1f} (n={len(deltas)})", "–", "–", "–", "yes",
        ])  # fmt: skip
    for name, (what, _) in CONFIGS.items():
        rs = sorted((r for r in rows if r["name"] == name), key=lambda r: r["seed"])
        if not rs:
            continue
        deltas = [100 * (r["test_accuracy"] - local[r["seed"]]) for r in rs if r["seed"] in local]
        g = rs[0]["guarantee"]
        body.append([
            f"`{name}`", what, str(rs[0]["released_dim"]),
            _fmt([r["val_accuracy"] for r in rs]),
            _fmt([r["test_accuracy"] for r in rs]),
            " / ".join(f"{r['test_accuracy']:.3f}" for r in rs),
            _fmt([r["pre_finetune_test_accuracy"] for r in rs]),
            f"{sum(deltas) / len(deltas):+.1f} (n={len(deltas)})" if deltas else "–",
            f"{rs[0]['noise_std']:.4g}",
            _noise_vs_clip(rs[0]),
            _guarantee(g),
            "yes" if all(r.get("covered") for r in rs) else "no",
        ])  # fmt: skip
    head = ["config", "what", "released dim", "val acc", "test acc (after fine-tuning)",
            "per seed", "before fine-tuning", "Δ test vs local (points, same seeds)", "σ",
            "noise σ√(dT) vs Tγ", "guarantee", "covered"]  # fmt: skip
    return "\n".join([TITLE, "", INTRO, "", markdown_table(head, body), "", READING, ""])


def _guarantee(g: dict) -> str:
    if not isinstance(g.get("epsilon"), int | float) or not math.isfinite(g["epsilon"]):
        return "not private (ε = ∞)"
    return f"ε={g['epsilon']:.3g}, δ={g['delta']:.3g}"


def _noise_vs_clip(row: dict) -> str:
    """The public signal rule of ``--finetune auto``: noise norm of the T releases against the
    most their clipped means can add up to (σ, d, T, γ are public)."""
    sigma, d, t, clip = row["noise_std"], row["released_dim"], row["rounds_run"], row["clip"]
    return f"{sigma * math.sqrt(d * t):.3g} vs {t * clip:.3g}"


TITLE = "# FEMNIST-105 at ε = 1: `--method fedrep` (DP-FedRep) vs the committed best PMTL and local"
INTRO = """`research/pmtl_femnist_fedrep.py`; every row's exact argument list is in
`pmtl_femnist_fedrep.jsonl` (key `argv`). Common: the FEMNIST CNN on the 105 writers, ε = 1,
δ = 1/105 (`--paper-delta`, as `pmtl_femnist_best.json`), 20 clients per round, lr 0.1, batch 10,
then the committed comparison's post-processing (one epoch of vanilla fine-tuning, each client
choosing lr ∈ {0.01, 0.1} on its own validation split). Pooled test accuracy over the 1 685 test
images. The committed rows are read from `pmtl_femnist_options.jsonl` (same seeds, same
post-processing).

Privacy of every fedrep row: (ε = 1, δ = 1/105) joint DP (billboard privacy: the released
representations), add/remove one client, Poisson sampling (rate 20/105), RDP accountant, seeded
noise (`--reproducible-noise`: a reproducible simulation, protects nobody); except: rows named
`-delta1e-5` at δ = 1e-5, `conv1-h5-T10-all` with every client in every round (sampling "all"),
and `conv-h2-nonprivate`, which adds no noise (not private, noise source "none"). Every row selects
nothing on pooled data (`covered`); choosing among the rows is a search no ε charges."""
READING = """## Reading it

**fedrep does not reach the +5-point target, and stays below the committed PMTL configuration
(+4.2).** Its best private row, chosen on seed-0 validation accuracy among the private rows (0.678;
seed-0 test accuracy was also seen when it was chosen, and ranks the rows the same way), shares
both convolutions (52 096 parameters, the default representation) with a linear head per client,
5 head epochs and 20 rounds (`conv-h5-T20`): **0.652 ± 0.005 against local's 0.621 ± 0.015, +3.2
points** (per seed +5.3, +2.0, +2.2). The same representation with 2 head epochs and 50 rounds
(`conv-h2`) is level with local (−0.1 points); without noise it scores 0.659 at seed 0; with 10
rounds (`conv-h5-T10`) 0.630 at seed 0 (+2.7). At the anchors' δ = 1e-5 the chosen row
(`conv-h5-T20-delta1e-5`) scores 0.640 ± 0.016: **+1.9 points** (per seed +2.5, +0.6, +2.7;
local training shares nothing, so its numbers do not depend on δ).

*Why not more, in numbers* (all public: σ, d, T, γ). With 20 of 105 clients per round, ε = 1 at
δ = 1/105 gives σ = 0.0475 per coordinate for 50 releases and 0.0325 for 20: over the 52 096
coordinates of the convolutions the noise of the T releases adds up to σ√(dT) = 77 (T = 50) or
33 (T = 20) against at most Tγ = 15 or 6 of signal. With every client in every round the issue's
arithmetic bounds the end signal-to-noise ratio by μ·m/√d whatever T is: ε = 1 at δ = 1/105 is
μ ≈ 0.53-GDP, μ·m ≈ 55, so even a fully aligned signal is below the noise for d > (μm)² ≈ 3 100
parameters: 0.24 for the convolutions, 1.9 for conv1 alone (832). The released convolutions are
mostly noise; what fedrep adds over local training is a linear head trained on shared (largely
random) convolutional features plus one epoch of fine-tuning, which helps on some seeds. At the
anchors' δ = 1e-5 σ is 1.8 times larger: with 50 rounds the representation collapses (`conv-h2`
at δ = 1e-5: 0.195 at seed 0), with 20 rounds and 5 head epochs it holds (0.629 at seed 0).

*Sharing conv1 only fails for another reason: optimisation.* With the representation conv1, the
head is conv2 + classifier (115 k parameters), trained from scratch by each client on a frozen
first layer that moves only by the small averaged steps and the noise. All three such rows
collapse to 4–5 % (`conv1-h2`, `conv1-h5-T20`, `conv1-h5-T10-all`, the last with every client in
every round and σ = 0.020). Without noise the same schedule is stuck too: after 3 rounds of 5
head epochs the clients' training loss is still 3.89 (ln 62 = 4.13). On one writer (146 images,
SGD lr 0.1, batch 10), training every layer from the initial model reaches loss 1.93 after 10
epochs; conv2 + classifier on the frozen initial conv1 only 3.72; the classifier alone on both
frozen convolutions 3.26: a deep head on a frozen, barely trained first layer does not leave the
plateau in the epochs FedRep gives it. PMTL's best configuration shares the same 832 parameters,
but every client trains its whole model, conv1 included, pulled towards the shared conv1: that
is where its +4.2 comes from.

No row is chosen on pooled data at run time; every private row is covered by its guarantee
(choosing among rows is a developers' search no ε charges). Not measured (CPU time): fedrep with
the product default `--finetune auto` on FEMNIST (each client's own choice against its local
training, whose grid costs about six training runs here)."""


def main() -> None:
    p = seeds_parser(__doc__.split("\n")[0])
    p.add_argument("--configs", default=",".join(CONFIGS))
    seeds_main(p, run, report)


if __name__ == "__main__":
    main()
