"""CPU per client of the end of run's batched ridge solves: this checkout against a base commit.

``python benchmarks/ridge_speed.py [--base COMMIT] [--src PATH] [--pairs N] [--clients M]
[--write]`` runs :func:`~privmtl.federated.ridge.ridge_logreg` the way the default end of run of
``privmtl pmtl --data synthetic --model logreg`` calls it on one block of a large population: one
call per prior strength (``LOCAL_RIDGES`` around the initial model, ``AUTO_FINETUNE_RIDGES``
around a second model standing for the billboard; the solve's cost does not depend on the
start) on ``M`` clients (default 2 048) of the synthetic federation
(60 features, 10 classes, LEAF's lognormal client sizes). Each run is its own process with one
torch and one BLAS thread, this checkout and the base (``git archive`` of ``--base``, default
``897619b``, or the ``src`` folder ``--src``) alternating, A B A B. A run reports the process CPU
seconds of each call (``time.process_time``; the best of ``--repeats`` after one warm-up call)
and a hash of the models (equal only where the arithmetic is the same). ``--write`` writes
``benchmarks/results/ridge_speed.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path

from _paired import ROOT, extract_src, run_worker

RESULT = ROOT / "benchmarks" / "results" / "ridge_speed.md"


def _worker(m: int, repeats: int) -> None:
    """One run in this process (``PYTHONPATH`` says which checkout); prints one JSON line."""
    import torch

    from privmtl.data.federated import make_synthetic_federated
    from privmtl.federated.end_of_run.local import LOCAL_RIDGES
    from privmtl.federated.end_of_run.plan import AUTO_FINETUNE_RIDGES
    from privmtl.federated.models import MultinomialLogReg
    from privmtl.federated.ridge import ridge_logreg

    torch.set_num_threads(1)
    ds = make_synthetic_federated(n_clients=m, random_state=0)
    torch.manual_seed(0)
    init = {n: p.detach() for n, p in MultinomialLogReg(60, 10).named_parameters()}
    g = torch.Generator().manual_seed(1)
    billboard = {n: p + 0.3 * torch.randn(p.shape, generator=g) for n, p in init.items()}
    ridge_logreg(init, ds.subset(list(range(64))), LOCAL_RIDGES)  # warm-up
    out: dict[str, object] = {"clients": m}
    digest = hashlib.sha256()
    for name, start, ridges in (
        ("local", init, LOCAL_RIDGES),
        ("finetune", billboard, AUTO_FINETUNE_RIDGES),
    ):
        best = float("inf")
        for _ in range(repeats):
            t = time.process_time()
            models = ridge_logreg(start, ds, ridges)
            best = min(best, time.process_time() - t)
        out[f"{name}_cpu"] = best
        out[f"{name}_ridges"] = list(ridges)
        for model in models:
            for key in sorted(model):
                digest.update(model[key].numpy().tobytes())
    out["models"] = digest.hexdigest()[:12]
    print(json.dumps(out))


def _run(src: Path, m: int, repeats: int) -> dict[str, object]:
    return run_worker(__file__, src, ["--clients", str(m), "--repeats", str(repeats)])


def _us(r: dict[str, object], name: str) -> float:
    return 1e6 * float(r[f"{name}_cpu"]) / float(r["clients"])  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="897619b", help="the commit to pair with")
    ap.add_argument("--src", type=Path, help="a checkout's src folder to pair with instead")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--clients", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--write", action="store_true", help="write benchmarks/results/ridge_speed.md")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args.clients, args.repeats)
        return
    with tempfile.TemporaryDirectory() as tmp:
        base_name = str(args.src) if args.src else args.base
        base = args.src.resolve() if args.src else extract_src(args.base, Path(tmp) / "base")
        engines = {"base": base, "new": ROOT / "src"}
        runs: dict[str, list[dict[str, object]]] = {name: [] for name in engines}
        lines = []
        for i in range(args.pairs):
            for name, src in engines.items():
                r = _run(src, args.clients, args.repeats)
                runs[name].append(r)
                line = (
                    f"pair {i + 1} {name:4s}: local c={r['local_ridges']} "
                    f"{_us(r, 'local'):.0f} us/client, fine-tune c={r['finetune_ridges']} "
                    f"{_us(r, 'finetune'):.0f} us/client, models {r['models']}"
                )
                print(line, flush=True)
                lines.append(line)
    mean = {
        name: {k: statistics.mean(_us(r, k) for r in rs) for k in ("local", "finetune")}
        for name, rs in runs.items()
    }
    summary = [
        f"{name}: local {v['local']:.0f}, fine-tune {v['finetune']:.0f}, both "
        f"{v['local'] + v['finetune']:.0f} CPU us per client"
        for name, v in mean.items()
    ]
    both = {name: v["local"] + v["finetune"] for name, v in mean.items()}
    summary.append(f"base / new: {both['base'] / both['new']:.2f}x less CPU per client")
    print("\n".join(summary))
    if args.write:
        RESULT.write_text(
            "# CPU per client of the end of run's ridge solves\n\n"
            f"`python benchmarks/ridge_speed.py --pairs {args.pairs} --clients {args.clients}"
            f" --write`: base `{base_name}` against this checkout, alternating, one thread each "
            "(module docstring of `benchmarks/ridge_speed.py`).\n\n```\n"
            + "\n".join([*lines, "", *summary])
            + "\n```\n"
        )


if __name__ == "__main__":
    main()
