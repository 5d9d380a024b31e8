"""The MP-MTL accuracy acceptance checks, computed from the trade-off benchmark's runs.

Reads ``results/mpmtl_school.jsonl`` and ``results/mpmtl_synthetic-lowrank.jsonl`` (written by
``mpmtl_tradeoff.py``: 5-fold CV tuning on each run's training split, Gaussian covariance
mechanism, δ = 1/(m log m), add/remove one task, RDP) and checks, on the means over seeds 0–4
(and, for information, over all seeds present):

* School: private low-rank has lower nMSE than STL-ℓ2 at ε = 10, and lower nMSE than DP-MTRL and
  DP-AGGR at each of ε = 0.1, 1, 10;
* synthetic low-rank: at ε = 10 its nMSE is within 25 % of non-private trace-norm MTL; at ε = 0.01 it
  is no more than 5 % worse than STL-ℓ2.

Writes ``results/mpmtl_acceptance.md`` and ``.json``; exits with status 1 if a check fails or a
needed run is missing. The ε = 0.01 runs come from::

    python benchmarks/mpmtl_tradeoff.py --data synthetic-lowrank --seeds 0-4 --epsilons 0.01 \
        --methods lowrank --tag _eps001
"""

from __future__ import annotations

import json
import sys
from typing import Any

from _common import RESULTS, load_jsonl, mean_std


def _mean(rows: list[dict[str, Any]], method: str, eps: float | None, seeds: list[int]) -> float:
    vals = [
        r["nmse"]
        for r in rows
        if r["method"] == method
        and r["target_epsilon"] == eps
        and r["seed"] in seeds
        and r.get("final_step_mode", "auto") == "auto"
    ]
    if len({r["seed"] for r in rows if r["method"] == method and r["target_epsilon"] == eps
            and r["seed"] in seeds}) < len(seeds):  # fmt: skip
        return float("nan")
    return mean_std(vals)[0]


def checks(seeds: list[int]) -> list[dict[str, Any]]:
    school = load_jsonl(RESULTS / "mpmtl_school.jsonl")
    syn = load_jsonl(RESULTS / "mpmtl_synthetic-lowrank.jsonl")
    syn += load_jsonl(RESULTS / "mpmtl_synthetic-lowrank_eps001.jsonl")  # the eps = 0.01 runs
    out = []

    def add(name: str, a: float, b: float, factor: float = 1.0, strict: bool = True) -> None:
        ok = (a < factor * b) if strict else (a <= factor * b)
        out.append({"check": name, "value": a, "reference": b, "factor": factor,
                    "pass": bool(ok) and a == a and b == b})  # fmt: skip

    add("school: lowrank@10 < stl-l2", _mean(school, "lowrank", 10.0, seeds),
        _mean(school, "stl-l2", None, seeds))  # fmt: skip
    for eps in (0.1, 1.0, 10.0):
        for base in ("dp-mtrl", "dp-aggr"):
            add(f"school: lowrank@{eps:g} < {base}@{eps:g}", _mean(school, "lowrank", eps, seeds),
                _mean(school, base, eps, seeds))  # fmt: skip
    add("synthetic: lowrank@10 <= 1.25 x mtl-trace", _mean(syn, "lowrank", 10.0, seeds),
        _mean(syn, "mtl-trace", None, seeds), 1.25, strict=False)  # fmt: skip
    add("synthetic: lowrank@0.01 <= 1.05 x stl-l2", _mean(syn, "lowrank", 0.01, seeds),
        _mean(syn, "stl-l2", None, seeds), 1.05, strict=False)  # fmt: skip
    return out


def main() -> None:
    main_seeds = [0, 1, 2, 3, 4]
    res = checks(main_seeds)
    all_seeds = sorted({r["seed"] for r in load_jsonl(RESULTS / "mpmtl_school.jsonl")})
    info = checks(all_seeds) if all_seeds != main_seeds else []
    lines = [
        "# MP-MTL acceptance checks",
        "",
        "nMSE means over seeds 0–4 of the runs in `mpmtl_school.jsonl` and "
        "`mpmtl_synthetic-lowrank.jsonl` (5-fold CV tuning on each training split, not charged to ε; "
        "Gaussian covariance mechanism, δ = 1/(m log m), add/remove one task, all tasks every "
        "iteration, RDP). `lowrank` is tuned over both output rules (the paper's projection and "
        "the local variational refit); the selected rule is in each run's `params`.",
        "",
        "| check | value | reference | result |",
        "|---|---:|---:|---|",
    ]
    for c in res:
        ref = (
            f"{c['factor']:g} × {c['reference']:.4f}"
            if c["factor"] != 1
            else f"{c['reference']:.4f}"
        )
        lines.append(
            f"| {c['check']} | {c['value']:.4f} | {ref} | {'PASS' if c['pass'] else 'FAIL'} |"
        )
    if info:
        lines += [
            "",
            f"For information, the same checks over seeds {all_seeds[0]}–{all_seeds[-1]}:",
            "",
        ]
        lines += [f"- {c['check']}: {c['value']:.4f} vs {c['reference']:.4f} → "
                  f"{'PASS' if c['pass'] else 'FAIL'}" if c["value"] == c["value"] else
                  f"- {c['check']}: not run on every seed" for c in info]  # fmt: skip
    lines += ["", "Reproduce: `python benchmarks/mpmtl_acceptance.py` after the trade-off runs."]
    (RESULTS / "mpmtl_acceptance.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "mpmtl_acceptance.json").write_text(
        json.dumps({"seeds_0_4": res, "all": info}, indent=1)
    )
    print("\n".join(lines))
    sys.exit(0 if all(c["pass"] for c in res) else 1)


if __name__ == "__main__":
    main()
