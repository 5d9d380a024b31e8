"""Small-data FEMNIST: every writer keeps 20 training images (``results/pmtl_small_clients.md``).

The population of issue 24's item 3: the 105 FEMNIST writers of ``../shared/data/femnist-leaf``,
each writer's training split subsampled to ``--per-writer`` images (default 20; writers with fewer
keep all) without replacement, writer ``k``'s draw from its own stream seeded by ``(--population-seed,
crc32(writer id))``; the test split is kept whole. The subsampled copy is written in LEAF's format
to a folder outside the repository (``--out``, default ``$PRIVMTL_CACHE_DIR/femnist-small-<n>``) and
every run is the plain CLI on it, so anyone can rerun a row:

    python research/pmtl_small_clients.py --data-path ../shared/data/femnist-leaf --seeds 0,1,2
    privmtl pmtl --data femnist-leaf --data-path ~/.cache/privmtl/femnist-small-20 --model cnn \\
        --epsilon 1 --json                # one row: PMTL at every other default
    python research/pmtl_small_clients.py --report

Each row records the version's defaults it ran at (``command``, the JSON's own fields), its
guarantee and whether every output is covered by it. Resumable: finished (label, seed) rows are
skipped.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    RESULTS,
    append_jsonl,
    load_jsonl,
    markdown_table,
    mean_std,
    run_pmtl_seed,
    seeds_main,
    seeds_parser,
)

LOG = RESULTS / "pmtl_small_clients.jsonl"
BASE = ["--data", "femnist-leaf", "--model", "cnn"]
#: label -> arguments after BASE (every other option at the CLI default of the running version)
RUNS: dict[str, list[str]] = {
    "local (every client alone), defaults": ["--method", "local-all"],
    "PMTL, ε = 1, defaults": ["--method", "pmtl", "--epsilon", "1"],
    "private FedAvg, ε = 1, defaults": ["--method", "fedavg", "--epsilon", "1"],
    "PMTL, ε = 1, defaults, δ = 1/m (the papers')": [
        "--method", "pmtl", "--epsilon", "1", "--paper-delta",
    ],
    "private FedAvg, ε = 1, defaults, δ = 1/m (the papers')": [
        "--method", "fedavg", "--epsilon", "1", "--paper-delta",
    ],
}  # fmt: skip


def _read_shards(folder: Path) -> dict[str, Any]:
    users: dict[str, Any] = {}
    for path in sorted(folder.glob("*.json*")):
        opener: Any = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as fh:
            shard = json.load(fh)
        for user in shard["users"]:
            users[user] = shard["user_data"][user]
    return users


def build_population(src: Path, dst: Path, *, per_writer: int, seed: int) -> Path:
    """Write the subsampled LEAF copy to ``dst`` (skipped when its manifest matches)."""
    manifest = {"source": str(src.resolve()), "per_writer": per_writer, "seed": seed}
    mf = dst / "population.json"
    if mf.exists() and json.loads(mf.read_text()) == manifest:
        return dst
    train = _read_shards(src / "train")
    test = _read_shards(src / "test")
    sub: dict[str, Any] = {}
    for user in sorted(train):
        x, y = train[user]["x"], train[user]["y"]
        rng = np.random.default_rng([seed, zlib.crc32(user.encode())])
        keep = np.sort(rng.choice(len(y), size=min(per_writer, len(y)), replace=False))
        sub[user] = {"x": [x[i] for i in keep], "y": [y[i] for i in keep]}
    for split, data in (("train", sub), ("test", {u: test[u] for u in sorted(test) if u in sub})):
        (dst / split).mkdir(parents=True, exist_ok=True)
        users = sorted(data)
        shard = {
            "users": users,
            "num_samples": [len(data[u]["y"]) for u in users],
            "user_data": data,
        }
        with gzip.open(dst / split / f"all_{split}.json.gz", "wt") as fh:
            json.dump(shard, fh)
    mf.write_text(json.dumps(manifest))
    return dst


def run(args: argparse.Namespace) -> None:
    cache = Path(os.environ.get("PRIVMTL_CACHE_DIR", Path.home() / ".cache" / "privmtl"))
    dst = Path(args.out) if args.out else cache / f"femnist-small-{args.per_writer}"
    build_population(
        Path(args.data_path), dst, per_writer=args.per_writer, seed=args.population_seed
    )
    done = {(r.get("tag", ""), r["label"], r["seed"]) for r in load_jsonl(LOG)}
    labels = [k for k in RUNS if not args.only or args.only in k]
    for seed in [int(s) for s in args.seeds.split(",")]:
        for label in labels:
            if (args.tag, label, seed) in done:
                continue
            argv = [*BASE, *RUNS[label]]
            out, seconds = run_pmtl_seed(argv, seed, dst, f"{label} seed {seed}")
            row = {
                "tag": args.tag,
                "label": label,
                "seed": seed,
                "per_writer": args.per_writer,
                "population_seed": args.population_seed,
                "wall_seconds": seconds,
                "command": "privmtl pmtl " + " ".join(argv) + f" --seed {seed} --json "
                "--data-path DIR",
                **{k: v for k, v in out.items() if k != "epsilon_per_round"},
            }
            append_jsonl(LOG, row)
            print(f"{label} seed {seed}: {out['test_accuracy']:.4f}", flush=True)


def _covered(rows: list[dict[str, Any]]) -> str:
    """Rows of versions before the outputs stated their coverage (top-level ``covered``) used
    pooled selections that no guarantee covered."""
    if any("covered" not in r for r in rows):
        return "no (pooled selection; not stated then)"
    return "yes" if all(r["covered"] for r in rows) else "NO"


def report() -> str:
    rows = load_jsonl(LOG)
    table = []
    tags = sorted({r.get("tag", "") for r in rows})
    for tag, label in ((t, k) for t in tags for k in RUNS):
        mine = [r for r in rows if r["label"] == label and r.get("tag", "") == tag]
        if not mine:
            continue
        mean, std, n = mean_std(r["test_accuracy"] for r in mine)
        g = mine[0]["guarantee"]
        eps = "0 (nothing shared)" if g.get("epsilon") == 0 else f"{g.get('epsilon'):.3g}"
        auto = [r.get("finetune_auto") or {} for r in mine]
        chosen = sorted({str(a.get("clients_per_candidate", a.get("chosen", "–"))) for a in auto})
        table.append(
            [
                tag,
                label,
                f"{mean:.3f} ± {std:.3f} (n={n})",
                " / ".join(
                    f"{r['test_accuracy']:.3f}" for r in sorted(mine, key=lambda r: r["seed"])
                ),
                eps,
                f"{g.get('delta'):.3g}" if g.get("delta") else "–",
                _covered(mine),
                "; ".join(chosen),
                f"{np.median([r['wall_seconds'] for r in mine]):.0f}",
            ]
        )
    header = [
        "defaults of", "run", "test accuracy (mean ± sd)", "per seed", "ε", "δ",
        "every output covered", "fine-tuning choice", "s (median)",
    ]  # fmt: skip
    return markdown_table(header, table)


def main() -> None:
    p = seeds_parser(__doc__.split("\n")[0], seeds="0")
    p.add_argument("--out", help="where to write the subsampled copy (outside the repository)")
    p.add_argument("--per-writer", type=int, default=20)
    p.add_argument("--population-seed", type=int, default=0)
    p.add_argument("--only", help="run only the labels containing this text")
    p.add_argument("--tag", default="", help="names the version whose defaults ran (rows keep it)")
    seeds_main(p, run, report)


if __name__ == "__main__":
    main()
