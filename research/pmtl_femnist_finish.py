"""FEMNIST-105 at ε = 1: what each client should keep at the end of the best PMTL run (``results/pmtl_femnist_finish.md``).

Per seed, one private training run of the committed best configuration
(``pmtl_femnist_best.json``'s ``pmtl`` list before its fine-tuning) is cached: every client's
trained personalized model and the released billboard (its first convolution). Then every
end-of-run candidate below is computed from these, each client's own data and public parameters
only (post-processing: the run's guarantee is unchanged), and scored:

``trained``
    the personalized model as trained;
``ft_e{E}_lr{L}``
    that model fine-tuned for E epochs at step L (vanilla);
``bb_e{E}_lr{L}``
    local training for E epochs at step L from the initial model with the released conv1
    (what ``--finetune-start billboard`` does);
``loc_e{E}_lr{L}``
    local training from the initial model alone (local-all's grid: the strongest local baseline);
``oracle_e{E}_lr{L}``
    **not private**: the same run without noise, then local training from its conv1 (how much a
    perfect shared first layer could give; a ceiling, not a method).

and every client's choice among several candidates on its own validation split (most correct
predictions, ties to the later candidate: :func:`privmtl.federated.local.select_per_client`).
The candidates' arrays are cached (``--cache``, outside the repository; about 50 MB each); a
re-run computes only the missing ones. ``--report`` scores the cache and writes the table.

    python research/pmtl_femnist_finish.py --data-path ../shared/data/femnist-leaf --seeds 0,1
    python research/pmtl_femnist_finish.py --data-path ../shared/data/femnist-leaf --report
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import RESULTS, append_jsonl, load_jsonl, markdown_table, mean_std

LOG = RESULTS / "pmtl_femnist_finish.jsonl"
FT = [(1, 0.01), (1, 0.1), (3, 0.01), (3, 0.1)]
BB = [(10, 0.03), (10, 0.1), (30, 0.03), (30, 0.1)]
LOC = [(e, lr) for e in (10, 30, 100) for lr in (0.03, 0.1)]
ORACLE = [(30, 0.1), (100, 0.03)]
#: per-client choices reported: name -> candidates in their public order (ties to the later)
CHOICES = {
    "local-all (local grid, own validation)": [f"loc_e{e}_lr{lr}" for e, lr in LOC],
    "fine-tuning grid": [f"ft_e{e}_lr{lr}" for e, lr in FT],
    "local from billboard grid": [f"bb_e{e}_lr{lr}" for e, lr in BB],
    "trained or local from billboard": ["trained", "bb_e30_lr0.1"],
    "fine-tuned or local from billboard": ["ft_e3_lr0.01", "bb_e30_lr0.1"],
    "fine-tuned, from billboard or local": ["ft_e3_lr0.01", "bb_e30_lr0.1", "loc_e100_lr0.03"],
}


def _best_run_kwargs(seed: int, data_path: str, private: bool) -> dict[str, Any]:
    """The committed best configuration's settings (checked against its argument list)."""
    argv = json.loads((RESULTS / "pmtl_femnist_best.json").read_text())["pmtl"]
    assert "--shared-params" in argv and argv[argv.index("--shared-params") + 1] == "conv1"
    return dict(
        data="femnist-leaf", model="cnn", method="pmtl", epsilon=1.0 if private else None,
        delta="paper", server_update="ditto", lr=0.1, rounds=50, clip=0.3, lam=0.3,
        clients_per_round=20, batch_size=10, sampling="poisson", finetune="none",
        noise_source="seeded", show_progress=False, shared_params=["conv1"], local_epochs=2,
        personal_init="model", seed=seed, threads=1, data_path=data_path,
    )  # fmt: skip


def _train(seed: int, data_path: str, private: bool) -> tuple[Any, Any, Any]:
    """One run of the best configuration; its dataset, initial model and training result."""
    import privmtl.federated.engine as engine
    from privmtl.experiments.pmtl import run_pmtl

    caught: dict[str, Any] = {}
    train = engine.train

    def keep(ds: Any, net: Any, config: Any, **kw: Any) -> Any:
        caught.update(ds=ds, net=copy.deepcopy(net), result=train(ds, net, config, **kw))
        return caught["result"]

    engine.train = keep
    try:
        run_pmtl(**_best_run_kwargs(seed, data_path, private))
    finally:
        engine.train = train
    return caught["ds"], caught["net"], caught["result"]


def _from_billboard(net: Any, billboard: dict[str, torch.Tensor]) -> Any:
    begin = copy.deepcopy(net)
    shared = {k: v for k, v in billboard.items() if k.startswith("conv1")}
    begin.load_state_dict({**begin.state_dict(), **shared})
    return begin


def compute(seed: int, data_path: str, cache: Path) -> None:
    """Every missing candidate of ``seed`` into ``cache/seed{seed}``."""
    from privmtl.experiments.pmtl import load_federated, make_model
    from privmtl.federated.finetune import finetune
    from privmtl.federated.local import _train_grid

    d = cache / f"seed{seed}"
    d.mkdir(parents=True, exist_ok=True)
    if not (d / "trained.pt").exists():
        _, _, res = _train(seed, data_path, private=True)
        torch.save(res.global_params, d / "billboard.pt")
        torch.save(res.personalized_params, d / "trained.pt")
    ds = load_federated("femnist-leaf", data_path=data_path, seed=seed)
    net = make_model("cnn", ds, seed)
    buffers = {n: b.detach() for n, b in net.named_buffers()}
    trained, billboard = torch.load(d / "trained.pt"), torch.load(d / "billboard.pt")
    for e, lr in FT:
        if not (d / f"ft_e{e}_lr{lr}.pt").exists():
            p, _ = finetune(
                trained, ds, net, method="vanilla", start="personalized", epochs=e, lr=lr,
                batch_size=10, seed=seed, global_params=billboard,
            )  # fmt: skip
            torch.save(p, d / f"ft_e{e}_lr{lr}.pt")

    def grid(prefix: str, start: Any, points: list[tuple[int, float]]) -> None:
        todo = [g for g in points if not (d / f"{prefix}_e{g[0]}_lr{g[1]}.pt").exists()]
        if todo:
            init = {n: p.detach() for n, p in start.named_parameters()}
            models = _train_grid(start, buffers, init, ds, todo, 10, seed, 64, True)
            for (e, lr), p in zip(todo, models, strict=True):
                torch.save(p, d / f"{prefix}_e{e}_lr{lr}.pt")

    grid("bb", _from_billboard(net, billboard), BB)
    grid("loc", net, LOC)
    if not (d / "billboard_nonprivate.pt").exists():
        _, _, res = _train(seed, data_path, private=False)
        torch.save(res.global_params, d / "billboard_nonprivate.pt")
    grid("oracle", _from_billboard(net, torch.load(d / "billboard_nonprivate.pt")), ORACLE)


def score(seed: int, data_path: str, cache: Path) -> list[dict[str, Any]]:
    """Validation and test accuracy of every cached candidate and of every choice in CHOICES."""
    from privmtl.experiments.pmtl import load_federated, make_model
    from privmtl.federated.algorithms import evaluate
    from privmtl.federated.local import select_per_client

    d = cache / f"seed{seed}"
    ds = load_federated("femnist-leaf", data_path=data_path, seed=seed)
    net = make_model("cnn", ds, seed)
    buffers = {n: b.detach() for n, b in net.named_buffers()}
    vx, vy = ds.split("val")
    tx, ty = ds.split("test")

    def acc(p: dict[str, torch.Tensor]) -> tuple[float, float]:
        return tuple(  # type: ignore[return-value]
            float(evaluate(net, p, buffers, x, y, personalized=True)["accuracy"])
            for x, y in ((vx, vy), (tx, ty))
        )

    rows = []
    names = sorted(p.stem for p in d.glob("*.pt") if not p.stem.startswith("billboard"))
    for name in names:
        val, test = acc(torch.load(d / f"{name}.pt"))
        rows.append({"seed": seed, "candidate": name, "val": val, "test": test})
    for what, cands in CHOICES.items():
        if not all(c in names for c in cands):
            continue
        chosen, choice, _ = select_per_client(
            (torch.load(d / f"{c}.pt") for c in cands), net, buffers, vx, vy
        )
        val, test = acc(chosen)
        counts = np.bincount(choice, minlength=len(cands)).tolist()
        rows.append({"seed": seed, "choice": what, "candidates": cands, "clients": counts,
                     "val": val, "test": test})  # fmt: skip
    return rows


def report(rows: list[dict[str, Any]]) -> str:
    seeds = sorted({r["seed"] for r in rows})

    def line(key: str, name: str) -> list[str]:
        mine = sorted((r for r in rows if r.get(key) == name), key=lambda r: r["seed"])
        mu, sd, n = mean_std(r["test"] for r in mine)
        val, _, _ = mean_std(r["val"] for r in mine)
        per = " / ".join(f"{r['test']:.3f}" for r in mine)
        return [f"{val:.3f}", f"{mu:.3f} ± {sd:.3f} (n={n})", per]

    cand = sorted({r["candidate"] for r in rows if "candidate" in r})
    body = [[c, *line("candidate", c)] for c in cand]
    chosen = [
        [w, ", ".join(CHOICES[w]), *line("choice", w)]
        for w in CHOICES
        if any(r.get("choice") == w for r in rows)
    ]
    return "\n".join(
        [
            "# FEMNIST-105 at ε = 1: each client's end of the best PMTL run",
            "",
            "Produced by `research/pmtl_femnist_finish.py` (the module docstring names every "
            f"candidate); seeds {', '.join(map(str, seeds))}. One private run of "
            "`pmtl_femnist_best.json`'s configuration per seed (ε = 1, δ = 1/105, JDP, "
            "add/remove one client, Poisson sampling 20/105, RDP accountant, seeded noise: a "
            "simulation), then every candidate from the same run: post-processing by each client "
            "of its own data and the released conv1, no privacy cost, except the `oracle_` rows, "
            "which are **not private** (the same run without noise: a ceiling). `loc_` rows "
            "share nothing. Pooled accuracy over the 1 685 test images of the 105 writers.",
            "",
            "## Every candidate for every client",
            "",
            markdown_table(["candidate", "validation", "test", "test per seed"], body),
            "",
            "## Each client's choice on its own validation split (ties to the later candidate)",
            "",
            markdown_table(
                ["choice", "candidates (public order)", "validation", "test", "test per seed"],
                chosen,
            ),
            "",
            "Validation accuracy of a choice is optimistic (it is what chose).",
            "",
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-path", required=True)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "privmtl-femnist-finish"))
    p.add_argument("--report", action="store_true", help="score the cache and write the table")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    cache = Path(args.cache)
    if not args.report:
        for seed in seeds:
            compute(seed, args.data_path, cache)
    rows = [r for r in load_jsonl(LOG) if r["seed"] not in seeds]
    LOG.unlink(missing_ok=True)
    for seed in seeds:
        rows += score(seed, args.data_path, cache)
    for r in rows:
        append_jsonl(LOG, r)
    text = report(rows)
    (RESULTS / "pmtl_femnist_finish.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
