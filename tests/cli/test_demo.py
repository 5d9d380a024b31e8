"""`privmtl demo` is a labelled simulation and prints the same numbers run to run.

The demo runs twice in this module (once printing for people, once with ``--json``), and both
runs are shared by the tests: two runs that agree show the demo is reproducible, and the human
summary must print the numbers of the JSON object.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from privmtl.cli import main


def _demo(out_dir: Path, *extra: str) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(["demo", "--small", "--seeds", "2", "--out", str(out_dir), *extra])
    assert code == 0
    return buffer.getvalue()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The human run (its output folder ``human``) and the ``--json`` run (folder ``json``)."""
    root = tmp_path_factory.mktemp("demo")
    return {
        "root": root,
        "human": _demo(root / "human"),
        "json": json.loads(_demo(root / "json", "--json")),
    }


def _untimed(value):
    """A written result without its timings (the only fields that differ run to run)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if "seconds" not in k and k != "phases"}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def test_demo_is_reproducible_and_labelled(demo):
    first = demo["human"]
    assert "seeded" in first.splitlines()[0] and "simulation" in first.splitlines()[0]
    assert "(2 seeds)" in first and "noise seeded]" in first
    assert "test accuracy" in first and "SEEDED" in first  # the PMTL guarantee summary
    # two runs, the same results: every written file agrees but for its timings
    for name in ("mpmtl_sweep.json", "pmtl_demo.json"):
        runs = [json.loads((demo["root"] / r / name).read_text()) for r in ("human", "json")]
        assert _untimed(runs[0]) == _untimed(runs[1]), name
    # and the human summary prints the numbers of the other run's JSON object
    for row in demo["json"]["mpmtl"]:
        assert f"{row['method']}  nMSE {row['mean']:.4f} ± {row['std']:.4f} (2 seeds)" in first
    for method, res in demo["json"]["pmtl"].items():
        assert f"{method}: test accuracy {res['test_accuracy']:.3f}" in first
        gain = res["test_accuracy"] - res["local_test_accuracy"]
        assert res["gain_over_local"] == pytest.approx(gain, abs=1e-12)
    # training alone is shown beside PMTL and FedAvg, with a plain verdict for each
    local = demo["json"]["pmtl"]["pmtl"]["local_test_accuracy"]
    line = next(ln for ln in first.splitlines() if "every client training alone" in ln)
    assert f"test accuracy {local:.3f}" in line and "pmtl: " in line and "fedavg: " in line
    rows = json.loads((demo["root"] / "human" / "mpmtl_sweep.json").read_text())["rows"]
    # the noised rows' noise is seeded; single-task learning (ε = 0) adds none
    noised = [r["method"] == "lowrank" for r in rows]
    assert {r["noise_source"] for r, n in zip(rows, noised, strict=True) if n} == {"seeded"}
    assert {r["noise_source"] for r, n in zip(rows, noised, strict=True) if not n} <= {"none"}
    assert sorted({r["seed"] for r in rows}) == [0, 1]
    pmtl = json.loads((demo["root"] / "human" / "pmtl_demo.json").read_text())
    assert {r["noise_source"] for r in pmtl.values()} == {"seeded"}


def test_demo_json_is_one_object(demo):
    out = demo["json"]
    assert out["noise_source"] == "seeded" and out["seeds"] == [0, 1]
    assert {r["method"] for r in out["mpmtl"]} == {"lowrank", "stl-l2"}
    assert set(out["pmtl"]) == {"pmtl", "fedavg"}
