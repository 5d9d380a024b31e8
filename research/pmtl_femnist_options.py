"""FEMNIST-105 at ε = 1: every option of issue 11 alone and combined, against local training.

Each configuration is an exact ``privmtl pmtl`` argument list (without ``--seed``, ``--json``,
``--data-path`` and ``--threads``): the table is what anyone gets from the CLI. Every run uses
seeded noise (``--reproducible-noise``: a research simulation, reproducible bit for bit) and the
same per-client fine-tuning selection (one epoch of vanilla fine-tuning, each client choosing
lr ∈ {0.01, 0.1} on its own validation split). Settings are chosen on validation accuracy only
(after fine-tuning, mean over the seeds run); the test accuracy is reported, never used to choose.
Hyper-parameter tuning is not charged to the privacy budget (as in the PMTL paper and most of the
DP-FL literature): the ε of a row is that of one training run with the chosen settings.

For every run the log keeps the per-round curator-side diagnostics of the release: the norm of the
un-noised mean of clipped updates (signal) and of the noise drawn (σ·√(released dimension) in
expectation), so that the table can say why a technique does or does not help.

Resumable: every finished (configuration, seed) appends one row to
``results/pmtl_femnist_options.jsonl``; a re-run skips the finished ones. ``--report`` rebuilds
``results/pmtl_femnist_options.md`` from the log.

Example::

    python research/pmtl_femnist_options.py --data-path ../shared/data/femnist-leaf \\
        --configs local,base --seeds 0,1,2 --jobs 2
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from _common import (
    RESULTS,
    append_jsonl,
    load_jsonl,
    machine_info,
    markdown_table,
    mean_std,
    run_privmtl,
)

LOG = RESULTS / "pmtl_femnist_options.jsonl"

#: Shared by every configuration: FEMNIST-105, CNN, q = 20 with Poisson sampling, batch 10,
#: the per-client fine-tuning selection, seeded noise.
COMMON = [
    "--data", "femnist-leaf", "--model", "cnn", "--clients-per-round", "20",
    "--batch-size", "10", "--sampling", "poisson",
    "--finetune", "vanilla", "--finetune-lrs", "0.01,0.1", "--finetune-lams", "0.01,1.0",
    "--reproducible-noise", "--quiet",
]  # fmt: skip
PMTL = [
    "--method", "pmtl", "--epsilon", "1", "--paper-delta", "--server-update", "offset", "--lr", "0.1",
]  # fmt: skip


def _pmtl(rounds: int = 100, clip: float = 0.5, lam: float = 0.001, *extra: str) -> list[str]:
    return [
        *COMMON[:4],
        *PMTL,
        "--rounds",
        str(rounds),
        "--clip",
        f"{clip:g}",
        "--lam",
        f"{lam:g}",
        *COMMON[4:],
        *extra,
        # pinned: the CLI default is "auto" (billboard when one release's noise norm is at most
        # the clip); every row here ran with the initial model as the clients' start
        "--personal-init",
        "model",
    ]


CONV = "conv1,conv2"
MOM = ("--server-optimizer", "momentum", "--server-lr", "0.1", "--server-momentum", "0.9")
ADAM = ("--server-optimizer", "adam", "--server-lr", "0.001", "--server-momentum", "0.9")

#: name -> (technique, argv). The technique groups the rows of the table.
CONFIGS: dict[str, tuple[str, list[str]]] = {
    "local": (
        "local",
        [
            *COMMON[:4],
            "--method",
            "local",
            "--paper-delta",
            "--rounds",
            "100",
            "--lr",
            "0.1",
            *COMMON[4:],
        ],
    ),
    "base-lam0.001": ("baseline PMTL", _pmtl(lam=0.001)),
    "base-lam0.1": ("baseline PMTL", _pmtl(lam=0.1)),
    "base-lam1": ("baseline PMTL", _pmtl(lam=1.0)),
    "conv1-lam0.1": ("shared-params", _pmtl(100, 0.5, 0.1, "--shared-params", "conv1")),
    "conv1-lam1": ("shared-params", _pmtl(100, 0.5, 1.0, "--shared-params", "conv1")),
    "conv-lam0.1": ("shared-params", _pmtl(100, 0.5, 0.1, "--shared-params", CONV)),
    "conv-lam1": ("shared-params", _pmtl(100, 0.5, 1.0, "--shared-params", CONV)),
    "mom-lam0.1": ("server momentum", _pmtl(100, 0.5, 0.1, *MOM)),
    "mom-lam1": ("server momentum", _pmtl(100, 0.5, 1.0, *MOM)),
    "adam-lam0.1": ("server Adam", _pmtl(100, 0.5, 0.1, *ADAM)),
    "adam-lam1": ("server Adam", _pmtl(100, 0.5, 1.0, *ADAM)),
}

ADAPT = ("--adaptive-clip-quantile", "0.5", "--adaptive-clip-noise", "5")
CONFIGS.update(
    {
        "local-e2": ("local", [*CONFIGS["local"][1], "--local-epochs", "2"]),
        "sub1k-lam0.001": ("subspace", _pmtl(100, 0.5, 0.001, "--subspace-dim", "1000")),
        "conv1-lam10": ("shared-params", _pmtl(100, 0.5, 10.0, "--shared-params", "conv1")),
        "conv1-lam1-adam": (
            "combination",
            _pmtl(100, 0.5, 1.0, "--shared-params", "conv1", *ADAM),
        ),
        "conv1-lam1-sub100": (
            "combination",
            _pmtl(100, 0.5, 1.0, "--shared-params", "conv1", "--subspace-dim", "100"),
        ),
        "conv1-lam1-adapt": (
            "combination",
            _pmtl(100, 0.5, 1.0, "--shared-params", "conv1", *ADAPT),
        ),
        "conv1-lam1-T50E2": (
            "schedule search",
            _pmtl(50, 0.5, 1.0, "--shared-params", "conv1", "--local-epochs", "2"),
        ),
        # control: the same prox pull on conv1 towards a billboard that never moves (server step
        # 1e-9, no momentum): what the shared first layer gives without any billboard content
        "conv1-lam1-frozen": (
            "control",
            _pmtl(
                100,
                0.5,
                1.0,
                "--shared-params",
                "conv1",
                "--server-optimizer",
                "momentum",
                "--server-lr",
                "1e-9",
                "--server-momentum",
                "0",
            ),
        ),
        "adapt-lam0.001": ("adaptive clipping", _pmtl(100, 0.5, 0.001, *ADAPT)),
        "adapt-lam1": ("adaptive clipping", _pmtl(100, 0.5, 1.0, *ADAPT)),
    }
)

#: Ditto's message (``--server-update ditto``): the billboard is FedAvg's (a copy of it trained
#: without the pull), the personalized models are pulled towards it and never sent.
C1 = ("--shared-params", "conv1")


def _ditto(rounds: int, clip: float, lam: float, *extra: str) -> list[str]:
    """:func:`_pmtl` with Ditto's message instead of the offset."""
    argv = _pmtl(rounds, clip, lam, *extra)
    i = argv.index("--server-update")
    return [*argv[: i + 1], "ditto", *argv[i + 2 :]]


CONFIGS.update(
    {
        "ditto-lam0.001": ("Ditto message", _ditto(100, 0.5, 0.001)),
        "ditto-conv1-lam1": ("Ditto message", _ditto(100, 0.5, 1.0, *C1)),
        **{
            f"ditto-conv1-lam{lam:g}-T50E2": (
                "Ditto message",
                _ditto(50, 0.5, lam, *C1, "--local-epochs", "2"),
            )
            for lam in (1.0, 0.3, 3.0)
        },
        "ditto-conv1-lam0.3-T50E2-clip0.3": (
            "Ditto message",
            _ditto(50, 0.3, 0.3, *C1, "--local-epochs", "2"),
        ),
        "ditto-conv1-lam1-T30E3": (
            "Ditto message",
            _ditto(30, 0.5, 1.0, *C1, "--local-epochs", "3"),
        ),
        "ditto-conv-lam1-T50E2": (
            "Ditto message",
            _ditto(50, 0.5, 1.0, "--shared-params", CONV, "--local-epochs", "2"),
        ),
    }
)


def _replace(argv: list[str], flag: str, n: int, new: list[str]) -> list[str]:
    """``argv`` with the ``n`` items from ``flag`` on replaced by ``new``, in place (unlike
    :func:`_common.drop_options`, which the logged argument lists must not be reordered by)."""
    i = argv.index(flag)
    return [*argv[:i], *new, *argv[i + n :]]


#: The strongest local baseline (every client trains alone over local-all's grid of epochs and step
#: sizes and chooses on its own validation split), and the best Ditto row ending with that same
#: local training started from the released first layer instead of one epoch of fine-tuning.
BEST_DITTO = CONFIGS["ditto-conv1-lam0.3-T50E2-clip0.3"][1]
LOCAL_GRID = ("--finetune-epochs", "10,30,100", "--finetune-lrs", "0.03,0.1")
CONFIGS.update(
    {
        "local-all": ("local", [*COMMON[:4], "--method", "local-all", "--quiet"]),
        "ditto-conv1-lam0.3-T50E2-clip0.3-local-from-billboard": (
            "billboard + local training",
            _replace(
                BEST_DITTO,
                "--finetune-lrs",
                4,  # --finetune-lrs L --finetune-lams M
                ["--finetune-start", "billboard", *LOCAL_GRID],
            ),
        ),
    }
)


#: The schedule search space (item 3 of issue 11): every option of ``privmtl pmtl`` that the
#: table studies, the schedule (T rounds, E local epochs per round, γ; σ follows from ε = 1 by
#: calibration) and λ. ``--search N`` draws N configurations from it with a seeded generator.
SPACE: dict[str, list[tuple[str, ...]]] = {
    "schedule": [
        ("--rounds", "100"),
        ("--rounds", "50", "--local-epochs", "2"),
        ("--rounds", "20", "--local-epochs", "5"),
    ],
    "clip": [("--clip", "0.5"), ("--clip", "2")],
    "lam": [("--lam", "0.01"), ("--lam", "0.1"), ("--lam", "1")],
    "shared": [(), ("--shared-params", "conv1"), ("--shared-params", CONV)],
    "server": [(), MOM],
    "clip_rule": [(), ADAPT],
    "init": [("--personal-init", "model"), ("--personal-init", "billboard")],
}


def search_configs(n: int, seed: int = 0) -> dict[str, tuple[str, list[str]]]:
    """``n`` distinct configurations drawn uniformly from :data:`SPACE` (names ``s<seed>-<i>``)."""
    rng = np.random.default_rng([seed, 11])
    out: dict[str, tuple[str, list[str]]] = {}
    seen: set[tuple[int, ...]] = set()
    while len(out) < n:
        pick = tuple(int(rng.integers(len(v))) for v in SPACE.values())
        if pick in seen:
            continue
        seen.add(pick)
        extra = [a for (k, v), i in zip(SPACE.items(), pick, strict=True) for a in v[i]]
        argv = [*COMMON[:4], *PMTL, *COMMON[4:], *extra]
        out[f"s{seed}-{len(out)}"] = ("schedule search", argv)
    return out


_LOCK = threading.Lock()

#: Row order of the table.
TECHNIQUES = [
    "local",
    "baseline PMTL",
    "shared-params",
    "server momentum",
    "server Adam",
    "adaptive clipping",
    "subspace",
    "Ditto message",
    "schedule search",
    "combination",
    "billboard + local training",
    "control",
]
FULL_DIM = 115_646  # parameters of the FEMNIST CNN

#: The reading of the results (written after the runs; kept with the generator).
READING = """## Reading it

**Against the strongest local training.** `local` trains each client for about 19 epochs (100
rounds at rate 20/105, then one epoch of fine-tuning) and stops too early: `local-all` (every
client trains alone for 10, 30 or 100 epochs at step 0.03 or 0.1 and keeps what validates best on
its own validation split) scores 0.660 ± 0.002 on seeds 0-2 against `local`'s 0.621 ± 0.015, and
is the chosen local row; the Δ column is against it. The chosen private row,
`ditto-conv1-lam0.3-T50E2-clip0.3-local-from-billboard`, is the Ditto conv1 run below ended by
that same local training started from the released conv1 (`--finetune-start billboard`): 0.673 ±
0.002, **+1.3 points** over `local-all` (per seed +0.8, +1.4, +1.7). The +4.2 read below was
against `local`; against `local-all` its row is +0.3. Why the lead stops near 1-2 points
(a noise-free conv1 is worth about 2.4 at seed 0, and more than conv1 cannot be shared at
m = 105, ε = 1): `pmtl_femnist_best.md` and `pmtl_femnist_finish.md`. The rest of this section
was written against `local`.

**The +5-point target is not reached.** The best private configuration found (chosen on seed-0
validation accuracy among the rows above) shares only the first convolution (`--shared-params
conv1`, 832 of 115 646 parameters) with Ditto's client message (`--server-update ditto`: each
client also trains a copy of the billboard without the pull and sends that copy's change, so the
billboard follows private FedAvg's conv1), λ = 0.3, γ = 0.3, 50 rounds of 2 local epochs. It beats
local training with the same fine-tuning selection by **+4.2 points** on seeds 0, 1, 2 (0.663 ±
0.007 vs 0.621 ± 0.015; per seed +6.5, +2.7, +3.3); before fine-tuning 0.637 vs 0.570. The
runner-up on validation, the same with γ = 0.5, scores +4.4 on the three seeds (0.665 ± 0.005; per
seed +6.2, +3.3, +3.7): the two differ by less than the seeds do, and the selection only ever read
validation accuracy. The same schedule with the authors' `offset` message (λ = 1, γ = 0.5) gave
+3.5 (0.656 ± 0.004): with `offset` a returning client sends its whole personalized conv1 minus the
billboard, so the billboard averages stale personalized layers; with Ditto it averages fresh local
steps. The selection is close: at γ = 0.5, λ = 1 and λ = 3 validate within one image of λ = 0.3
(0.691, 0.692 vs 0.692 on seed 0; λ = 1 on seeds 1 and 2, run outside this log, 0.661 and 0.664
test: +4.4 as well). A smaller clip does not change the per-round ratio (γ = 0.3: signal 0.18
against noise 1.37, 1:8; γ = 0.5: 0.25 against 2.28, 1:9): most messages are clipped either way
(median norm 0.45–0.8 in the first rounds at γ = 0.5). Ditto on the whole model (`ditto-lam0.001`)
changes nothing (0.614 vs 0.617): at 1:256 (signal 0.15 against noise 37 per round with Ditto's
messages) the billboard is unusable whatever the message; its first run diverged (the copy of a
pure-noise CNN billboard overflowed to NaN on some clients and the NaN reached the billboard),
which is why the release now counts a message of non-finite norm as zero (its contribution stays
within the clip). Sharing conv1 is the only way found to a usable billboard, and the reason is the
noise norm:

* **Why the full billboard carries nothing.** At ε = 1, T = 100, q = 20 the calibrated z is 4.35,
  σ = zγ/q = 0.109 and the noise drawn each round has norm σ√d = 37 against a mean of clipped
  updates of norm ≤ γ = 0.5 (measured 0.50): 1:74 per round. With the offset message each release
  moves the billboard back towards the personalized models by at most γ, so the noise is never
  removed: after T rounds the billboard holds noise of norm about σ√(dT) ≈ 370. Validation then
  picks λ = 0.001 (the billboard is almost unused: +1.3 points at seed 0) and every λ ≥ 0.1 pulls
  the models onto noise (0.06 or less), also when only the convolutions (d = 52 096, 1:58) are
  shared.
* **Server optimizers cannot fix that.** Momentum and Adam read only the released values; they
  average the noise over rounds but with unit gain on the signal the ratio stays (momentum λ = 1:
  0.04; Adam, whose normalised steps bound how far the noise moves the billboard, 0.14). They were
  not measured at λ = 0.001, where the billboard is unused and they cannot matter.
* **Partial sharing is what works**: with conv1 only, the noise norm per round is σ√832 = 3.1
  (1:7). The **control** row pulls conv1 towards a billboard that never moves (the initial conv1):
  0.595, *below* local (0.604, seed 0), while the shared conv1 gives 0.652: the gain comes from
  what the clients learn together, not from anchoring the first layer.
* **Random subspaces keep the ratio, as predicted**: in k = 100 of conv1's 832 coordinates the
  projected signal is 0.344 of the full clipped mean (√(k/d) = 0.347: no concentration) and the
  noise falls by the same factor (1.08 vs 3.13), so the ratio is unchanged (1:7.7 vs 1:7.2) and
  the accuracy is not better (0.637 vs 0.652, seed 0); on the whole model, k = 1 000 keeps 0.0936
  of the signal (√(k/d) = 0.0930) at the same 1:74 (0.609 vs 0.617 at λ = 0.001).
* **Server Adam on the shared conv1 hurts** (0.601 vs 0.652, seed 0): its normalised steps move
  every coordinate of the billboard by about η_s whatever the (mostly noise) release says.
* **Adaptive clipping diverges here.** With q = 20 the count needs large noise (σ_b = 5, i.e.
  0.25 on the unclipped fraction) to keep the mean's multiplier close (z = 4.83 instead of 4.35 at
  ε = 1). Worse, with the offset message the update norms include the billboard's own noise,
  whose scale follows the clip: the median update norm is far above the clip, the clip grows, σ
  grows with it, and so on — from 0.5 to 1.7 after 10 rounds, 37 after 40 and 18 000 after 100;
  the models end at chance (0.006), even at λ = 0.001. The quantile rule suits regimes where the
  noise is small against the updates (documented with the option).
* **More sharing than λ = 1 hurts**: conv1 with λ = 10 (lr·λ = 1: conv1 becomes the billboard
  after every step) collapses to 0.034, as the billboard's conv1 is a random walk of noise
  (3.1 per round, about 31 after 100 rounds).
* **Why +5 is out of reach at this scale.** Per round the signal-to-noise ratio of the mean is at
  most q/(z√d) (every update clipped and aligned); averaging T rounds multiplies it by about √T,
  while z grows about like √T, so the total is about m/(c√d) for the population size m: only a
  much larger population (the paper uses 205 writers; see the synthetic population study) or a
  much smaller shared part can carry information at ε = 1.

**Matrix-factorization noise (DP-FTRL / banded MF, Choquette-Choo et al. 2023): checked, not
built.** A maintained implementation is on the package index: jax-privacy 2.0.0
(`jax_privacy.matrix_factorization`: banded and buffered-Toeplitz strategies, their optimisation
and sensitivity; `jax_privacy.experimental.accounting.amplified_bandmf_event`) on dp-accounting
0.6 (installed here; it has `MixtureOfGaussiansDpEvent`). It is not cheap for us: it is JAX code
(jax, jaxlib, optax, chex beside torch) and amplified banded MF needs b-min-separated
participation (clients split into b groups, one group per round), a different sampler whose event
the ledger would have to record (the sampling performed must be the sampling accounted); with
m = 105 and q = 20 at most b = 5 bands. Its gain is a constant factor on the noise of the running
sum of releases, which cannot close a 1:74 ratio. Decision: not implemented.

**Schedule search** (`--search N`, item 3): a seeded random search over T × local epochs, γ, λ,
shared part, server optimizer, adaptive clipping and personal init is implemented; with one run
taking 2–23 minutes on this shared machine (load 5–17 on 2 cores) only a hand-picked schedule
around the winner was run (row "schedule search": T = 50 with 2 local epochs, which won). Tuning
is not charged. Rows with n=1 are seed 0 only (the screening); only the chosen configurations
(and conv1-lam1, conv1-lam1-T50E2) ran 3 seeds. The Ditto rows screen the message on the winning
schedule (λ ∈ {0.3, 1, 3}, T × E ∈ {100 × 1, 50 × 2, 30 × 3}, γ ∈ {0.3, 0.5}) and on conv1+conv2
(1:67, −14.5). Not run for lack of CPU: λ = 0.1 with shared convolutions or server
optimizers, server optimizers at λ = 0.001 (where the billboard is unused). Every run used one
torch thread (`--threads 1`), two runs at a time."""


def _key(name: str, seed: int) -> str:
    return json.dumps({"config": name, "seed": seed}, sort_keys=True)


def run_one(name: str, seed: int, data_path: str | None) -> dict[str, Any]:
    """One ``privmtl pmtl`` run in a subprocess with one torch thread; its logged row."""
    technique, argv = CONFIGS[name]
    # --diagnostics: the rows report the curator's signal and noise norms (not covered)
    args = ["pmtl", *argv, "--seed", str(seed), "--json", "--threads", "1", "--diagnostics"]
    if data_path is not None:
        args += ["--data-path", data_path]
    out, seconds = run_privmtl(args, f"{name} seed {seed}")
    diag = out.get("curator_diagnostics") or out  # rows logged before curator_diagnostics
    sig = [v for v in diag.get("signal_norm_per_round", []) if v is not None]
    full = diag.get("full_signal_norm_per_round")
    ratio = None
    if full:
        ratio = float(np.mean([a / b for a, b in zip(sig, full, strict=True) if b]))
    noi = [v for v in diag.get("noise_norm_per_round", []) if v is not None]
    row = {
        "run_key": _key(name, seed),
        "config": name,
        "technique": technique,
        "seed": seed,
        "argv": argv,
        "wall_seconds": seconds,
        "signal_norm_mean": float(np.mean(sig)) if sig else None,
        "noise_norm_mean": float(np.mean(noi)) if noi else None,
        "subspace_ratio": ratio,
        **{k: v for k, v in out.items() if k not in ("epsilon_per_round", "guarantee", "config")},
        "run_config": out.get("config"),  # the resolved spec; "config" names the row
        **diag,
    }
    return row


def _fmt(mu: float, sd: float, n: int) -> str:
    if n == 0:
        return "–"
    return f"{mu:.3f}" if n == 1 else f"{mu:.3f} ± {sd:.3f} (n={n})"


def _flags(argv: list[str]) -> dict[str, str]:
    """The options of an argument list as {flag: value} ("" for a switch)."""
    out: dict[str, str] = {}
    for i, a in enumerate(argv):
        if a.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            out[a] = "" if nxt.startswith("--") or not nxt else nxt
    return out


#: The flags a row's setting is described by (the rest is COMMON to every row).
SETTING = {
    "--method": "", "--rounds": "T", "--local-epochs": "E", "--clip": "γ", "--lam": "λ",
    "--shared-params": "shared", "--server-optimizer": "server", "--server-lr": "η_s",
    "--subspace-dim": "k", "--adaptive-clip-quantile": "quantile",
    "--adaptive-clip-noise": "σ_b", "--personal-init": "init", "--server-update": "message",
}  # fmt: skip


def setting(argv: list[str]) -> str:
    f = _flags(argv)
    parts = []
    for flag, short in SETTING.items():
        if flag in f and not (flag == "--server-update" and f[flag] == "offset"):
            parts.append(f[flag] if not short else f"{short}={f[flag]}")
    return " ".join(parts)


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per configuration: mean val/test accuracy over its seeds and the norms."""
    rows = list({r["run_key"]: r for r in rows}.values())
    out = []
    for name in dict.fromkeys(r["config"] for r in rows):
        rs = sorted((r for r in rows if r["config"] == name), key=lambda r: r["seed"])
        ratio = [r["subspace_ratio"] for r in rs if r.get("subspace_ratio") is not None]
        out.append(
            {
                "config": name,
                "technique": rs[0]["technique"],
                "by_seed": {r["seed"]: r for r in rs},
                "val": mean_std(r["val_accuracy"] for r in rs),
                "val0": next((r["val_accuracy"] for r in rs if r["seed"] == 0), math.nan),
                "test": mean_std(r["test_accuracy"] for r in rs),
                "pre": mean_std(r.get("pre_finetune_test_accuracy") for r in rs),
                "signal": mean_std(
                    r["signal_norm_mean"] for r in rs if r["signal_norm_mean"] is not None
                ),
                "noise": mean_std(
                    r["noise_norm_mean"] for r in rs if r["noise_norm_mean"] is not None
                ),
                "subspace_ratio": float(np.mean(ratio)) if ratio else None,
                "dim": rs[0].get("released_dim"),
                "epsilon": rs[0].get("epsilon"),
                "argv": rs[0]["argv"],
                "local": rs[0].get("method") in ("local", "local-all"),
            }
        )
    return out


def _gain(s: dict[str, Any], local: dict[str, Any] | None) -> str:
    """Mean over the seeds both ran of (test accuracy − local's), in points."""
    if local is None:
        return "–"
    common = sorted(set(s["by_seed"]) & set(local["by_seed"]))
    if not common:
        return "–"
    d = [
        100 * (s["by_seed"][k]["test_accuracy"] - local["by_seed"][k]["test_accuracy"])
        for k in common
    ]
    return f"{np.mean(d):+.1f} (n={len(d)})"


def choose(summ: list[dict[str, Any]], local: bool) -> dict[str, Any] | None:
    """The configuration with the best seed-0 validation accuracy (PMTL or local; controls,
    which use nothing from the billboard, are not candidates)."""
    cands = [
        s
        for s in summ
        if s["local"] == local and s["technique"] != "control" and math.isfinite(s["val0"])
    ]
    return max(cands, key=lambda s: s["val0"]) if cands else None


def _shared_dim(argv: list[str]) -> int:
    """Parameters that go through the billboard (the d a subspace is drawn from)."""
    shared = _flags(argv).get("--shared-params")
    return {None: FULL_DIM, "conv1": 832, CONV: 52_096}.get(shared, FULL_DIM)


def report(rows: list[dict[str, Any]]) -> str:
    summ = summarize(rows)
    best_local = choose(summ, local=True)
    best = choose(summ, local=False)
    order = list(dict.fromkeys(TECHNIQUES + [s["technique"] for s in summ]))
    body = []
    for tech in order:
        for s in sorted((s for s in summ if s["technique"] == tech), key=lambda s: -s["val0"]):
            snr = "–"
            if s["signal"][2] and s["noise"][2]:
                snr = (
                    f"{s['signal'][0]:.3g} / {s['noise'][0]:.3g} "
                    f"(1:{s['noise'][0] / max(s['signal'][0], 1e-12):.0f})"
                )
            mark = " **(chosen)**" if s is best or s is best_local else ""
            body.append(
                [
                    tech,
                    f"`{s['config']}`{mark}",
                    setting(s["argv"]),
                    f"{s['val0']:.3f}",
                    _fmt(*s["test"]),
                    _gain(s, best_local),
                    _fmt(*s["pre"]),
                    snr,
                    s["dim"] if s["dim"] is not None else "–",
                ]
            )
    header = [
        "technique",
        "config",
        "setting",
        "val acc seed 0 (selection)",
        "test acc",
        "Δ test vs chosen local (points, same seeds)",
        "test acc before fine-tuning",
        "signal / noise norm per round (ratio)",
        "released dim",
    ]
    acc_rows = []
    for s in (best, best_local):
        if s is not None:
            acc_rows.append(
                [f"`{s['config']}` ({setting(s['argv'])})", _fmt(*s["val"]), _fmt(*s["test"])]
            )
    sub_rows = [
        [
            f"`{s['config']}`",
            s["dim"],
            f"{s['subspace_ratio']:.4f}",
            f"{math.sqrt(s['dim'] / _shared_dim(s['argv'])):.4f}",
        ]
        for s in summ
        if s["subspace_ratio"] is not None and s["dim"]
    ]
    lines = [
        "# FEMNIST-105 at ε = 1: the population options alone and combined vs local training",
        "",
        "`research/pmtl_femnist_options.py`. Every row is an exact `privmtl pmtl` argument list "
        "(in `pmtl_femnist_options.jsonl`, key `argv`); common to all: CNN, 20 clients per round "
        "with Poisson sampling, lr 0.1, batch 10, then the same per-client fine-tuning selection "
        "(one epoch of vanilla fine-tuning, each client choosing lr ∈ {0.01, 0.1} on its own "
        "validation split). Pooled accuracy over the 1 685 test images of the 105 writers "
        "(after fine-tuning unless said). **Selection uses validation accuracy only** (seed 0, "
        "after fine-tuning); test accuracy was never used to choose. Signal = norm of the "
        "un-noised mean of clipped updates, noise = norm of the noise drawn, both averaged over "
        "the rounds (curator-side diagnostics of the run history; the noise norm is σ·√(released "
        "dim)).",
        "",
        "Privacy of every PMTL row: (ε = 1, δ = 1/105) joint DP (billboard privacy), neighbours: "
        "add/remove one client, Poisson sampling (rate 20/105), RDP accountant, **seeded noise "
        "(`--reproducible-noise`: a reproducible simulation, protects nobody)**. σ is calibrated "
        "to ε = 1 for each row's T (and, with adaptive clipping, for the count released with the "
        "mean). **Hyper-parameter tuning is not charged** to the budget (as in the PMTL paper): "
        "the ε of a row is that of one run with its settings. Local training releases nothing "
        "(ε = 0 towards the other clients).",
        "",
        "## Every technique alone and combined",
        "",
        markdown_table(header, body),
        "",
        "## The acceptance comparison (3 seeds)",
        "",
        "The PMTL configuration and the local configuration with the best seed-0 validation "
        "accuracy, each on seeds 0, 1, 2 (`pmtl_femnist_best.json`):",
        "",
        markdown_table(["configuration", "val acc", "test acc"], acc_rows),
        "",
    ]
    if sub_rows:
        lines += [
            "## Random subspaces: how much signal a subspace keeps",
            "",
            "Mean over rounds of ‖P_t ḡ‖ / ‖ḡ‖ (projected over full clipped mean) against "
            "√(k/d), what a mean spread evenly over the d shared coordinates keeps. Equal "
            "values mean the per-round signal-to-noise ratio is that of the full release.",
            "",
            markdown_table(["config", "k", "measured ‖Pḡ‖/‖ḡ‖", "√(k/d)"], sub_rows),
            "",
        ]
    lines += [
        "![noise over signal per round](pmtl_femnist_options.png)",
        "",
        READING,
        "",
        f"Machine: {machine_info()}.",
        "",
    ]
    return "\n".join(lines)


def plot_noise_signal(rows: list[dict[str, Any]], path: Any) -> bool:
    """Noise norm over signal norm per round (seed 0) of every PMTL configuration."""
    rs = [r for r in rows if r["seed"] == 0 and r.get("method") not in ("local", "local-all")]
    if not rs:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in {r["config"]: r for r in rs}.values():
        sig = np.asarray([v or np.nan for v in r["signal_norm_per_round"]], dtype=float)
        noi = np.asarray([v or np.nan for v in r["noise_norm_per_round"]], dtype=float)
        ax.plot(np.arange(1, len(sig) + 1), noi / sig, lw=1, label=r["config"])
    ax.set_yscale("log")
    ax.axhline(1.0, color="k", lw=0.8, ls=":")
    ax.set_ylim(1.0, 1e3)  # rows whose signal vanishes (λ = 10) leave the plot
    ax.set_xlabel("round")
    ax.set_ylabel("noise norm / signal norm")
    ax.set_title("FEMNIST-105, ε = 1: noise vs signal of each release (seed 0)", fontsize=10)
    ax.legend(fontsize=6, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data-path", default=None)
    p.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help="comma-separated names; 'search' = the --search configurations, 'best' = the PMTL "
        "and local configurations with the best seed-0 validation accuracy so far",
    )
    p.add_argument("--seeds", default="0")
    p.add_argument("--jobs", type=int, default=1, help="concurrent runs (one thread each)")
    p.add_argument("--report", action="store_true")
    p.add_argument(
        "--search",
        type=int,
        default=0,
        help="also run N configurations drawn from SPACE (seeded by --search-seed)",
    )
    p.add_argument("--search-seed", type=int, default=0)
    p.add_argument(
        "--write-best",
        action="store_true",
        help="write results/pmtl_femnist_best.json from the chosen PMTL and local configurations",
    )
    args = p.parse_args()
    CONFIGS.update(search_configs(args.search, args.search_seed))
    for r in load_jsonl(LOG):  # configurations of earlier searches, for the report
        CONFIGS.setdefault(r["config"], (r["technique"], r["argv"]))
    if not args.report:
        names: list[str] = []
        for c in (c for c in args.configs.split(",") if c):
            if c == "search":  # every configuration of this --search
                names += [n for n in CONFIGS if n.startswith(f"s{args.search_seed}-")]
            elif c == "best":  # the PMTL and local configurations chosen so far
                summ = summarize(load_jsonl(LOG))
                names += [s["config"] for s in (choose(summ, False), choose(summ, True)) if s]
            else:
                names.append(c)
        unknown = [c for c in names if c not in CONFIGS]
        if unknown:
            p.error(f"unknown configs {unknown}; known: {list(CONFIGS)}")
        seeds = [int(s) for s in args.seeds.split(",")]
        done = {r["run_key"] for r in load_jsonl(LOG)}
        todo = [(n, s) for s in seeds for n in names if _key(n, s) not in done]

        def work(item: tuple[str, int]) -> None:
            try:
                row = run_one(*item, args.data_path)
            except RuntimeError as exc:
                print(exc, file=sys.stderr, flush=True)
                return
            with _LOCK:
                append_jsonl(LOG, row)
            print(
                f"{item[0]} seed {item[1]}: val {row['val_accuracy']:.4f} test "
                f"{row['test_accuracy']:.4f} ({row['wall_seconds']:.0f}s)",
                file=sys.stderr,
                flush=True,
            )

        with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
            list(pool.map(work, todo))
    rows = load_jsonl(LOG)
    plot_noise_signal(rows, RESULTS / "pmtl_femnist_options.png")
    (RESULTS / "pmtl_femnist_options.md").write_text(report(rows))
    if args.write_best:
        summ = summarize(rows)
        best, local = choose(summ, local=False), choose(summ, local=True)
        if best is None or local is None:
            p.error("--write-best needs PMTL and local runs in the log")
        doc = {"epsilon": 1, "pmtl": best["argv"], "local": local["argv"]}
        text = "{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in doc.items())
        (RESULTS / "pmtl_femnist_best.json").write_text(text + "\n}\n")


if __name__ == "__main__":
    main()
