"""`privmtl demo` is a labelled simulation and prints the same numbers run to run."""

from __future__ import annotations

import json

from privmtl.cli import main


def _stdout(capsys, out_dir, *extra):
    assert main(["demo", "--small", "--seeds", "2", "--out", str(out_dir), *extra]) == 0
    return capsys.readouterr().out


def test_demo_is_reproducible_and_labelled(capsys, tmp_path):
    first = _stdout(capsys, tmp_path / "a")
    second = _stdout(capsys, tmp_path / "b")
    same = [ln for ln in first.splitlines() if not ln.startswith("wrote ")]
    assert same == [ln for ln in second.splitlines() if not ln.startswith("wrote ")]
    assert "seeded" in first.splitlines()[0] and "simulation" in first.splitlines()[0]
    assert "(2 seeds)" in first and "noise seeded]" in first
    assert "test accuracy" in first and "SEEDED" in first  # the PMTL guarantee summary
    rows = json.loads((tmp_path / "a" / "mpmtl_sweep.json").read_text())["rows"]
    # the noised rows' noise is seeded; single-task learning (ε = 0) adds none
    noised = [r["method"] == "lowrank" for r in rows]
    assert {r["noise_source"] for r, n in zip(rows, noised, strict=True) if n} == {"seeded"}
    assert {r["noise_source"] for r, n in zip(rows, noised, strict=True) if not n} <= {"none"}
    assert sorted({r["seed"] for r in rows}) == [0, 1]
    pmtl = json.loads((tmp_path / "a" / "pmtl_demo.json").read_text())
    assert {r["noise_source"] for r in pmtl.values()} == {"seeded"}


def test_demo_json_is_one_object(capsys, tmp_path):
    out = json.loads(_stdout(capsys, tmp_path / "c", "--json"))
    assert out["noise_source"] == "seeded" and out["seeds"] == [0, 1]
    assert {r["method"] for r in out["mpmtl"]} == {"lowrank", "stl-l2"}
    assert set(out["pmtl"]) == {"pmtl", "fedavg"}
