"""The MP-MTL sweep's private points: the target ε is what is charged, swamped candidates never
run, ``eigen_floor`` passes through, and the plot reads at the target ε."""

from __future__ import annotations

import json
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event as dpe

from privmtl.cli import main
from privmtl.exceptions import InvalidParameterError
from privmtl.linear.methods import linear_method
from privmtl.privacy.covariance import plan_covariance_releases, signal_to_noise_bound
from privmtl.privacy.selection import plan_candidates

#: privmtl's RDP orders (integer orders, as its accountant uses), for an independent composition
ORDERS = [float(a) for a in range(2, 65)] + [80.0, 96.0, 128.0, 192.0, 256.0, 512.0, 1024.0]

#: A candidate the sweep used to choose: K = 100, ten releases of the projected output.
SWAMPED = {"clip": [100.0], "lam": [1.0], "iterations": [10]}


def _rdp_epsilon(multipliers: list[float], delta: float) -> float:
    acc = dp_accounting.rdp.RdpAccountant(orders=ORDERS)
    for z in multipliers:
        acc.compose(dpe.GaussianDpEvent(z))
    return float(acc.get_epsilon(delta))


@pytest.mark.parametrize("k", [2, 3, 5])
@pytest.mark.parametrize("epsilon", [1.0, 10.0])
@pytest.mark.parametrize("share", [0.1, 0.5])
def test_candidates_and_vote_compose_to_the_target(k, epsilon, share):
    b = plan_candidates(k, 150, epsilon=epsilon, delta=1e-5, share=share)
    assert b.vote.held and b.n_candidates == k
    z_vote = b.vote.noise_std  # add/remove: the vote's sensitivity is 1
    charged = _rdp_epsilon([b.candidate_multiplier] * k + [z_vote], 1e-5)
    assert charged == pytest.approx(epsilon, rel=1e-6)
    assert charged <= epsilon * (1 + 1e-9)
    assert b.candidate_epsilon < epsilon


def test_per_client_choice_shares_the_whole_target():
    b = plan_candidates(3, 150, epsilon=1.0, delta=1e-5, share=0.5, vote=False)
    assert not b.vote.held and b.n_candidates == 3
    assert _rdp_epsilon([b.candidate_multiplier] * 3, 1e-5) == pytest.approx(1.0, rel=1e-6)


def test_a_vote_without_signal_leaves_one_candidate_the_whole_target():
    b = plan_candidates(3, 20, epsilon=0.1, delta=1e-5, share=0.5)  # σ_vote >> m / 4
    assert not b.vote.held and b.n_candidates == 1
    assert b.candidate_epsilon == 0.1 and "could not carry signal" in b.vote.reason


def test_signal_to_noise_bound_is_public_and_does_not_depend_on_the_clip():
    ratios = []
    for clip in (1.0, 100.0):
        s = plan_covariance_releases(epsilon=1.0, delta=1e-5, iterations=10, clip=clip, dim=31)
        r = signal_to_noise_bound(s, 150)
        assert r == pytest.approx(150 * clip**2 / (2 * s.per_release[-1] * math.sqrt(31)))
        ratios.append(r)
    assert ratios[0] == pytest.approx(ratios[1])
    none = plan_covariance_releases(epsilon=None, delta=1e-5, iterations=1, clip=1.0, dim=3)
    assert signal_to_noise_bound(none, 5) == math.inf


def test_a_swamped_candidate_is_never_a_candidate():
    from privmtl.experiments.mpmtl_sweep import MIN_SIGNAL_TO_NOISE, _plan_point
    from privmtl.linear.selection import expand_grid

    grid = expand_grid([{"clip": [1.0], "eigen_fix": ["denoise", "shift"]}, SWAMPED])
    plan = _plan_point("lowrank", 1.0, grid, n_tasks=150, dim=31, vote_share=0.5)
    assert [d["point"]["iterations"] for d in plan["dropped"]] == [10]
    assert all(d["signal_to_noise"] < MIN_SIGNAL_TO_NOISE for d in plan["dropped"])
    assert all(p.get("iterations") != 10 for p in plan["points"]) and len(plan["points"]) == 2
    assert min(plan["signal_to_noise"]) >= MIN_SIGNAL_TO_NOISE
    # the survivors got the budget the dropped one left: they compose to the target with the vote
    z = plan_candidates(2, 150, epsilon=1.0, delta=plan["delta"], share=0.5)
    assert plan["budget"]["candidate_epsilon"] == pytest.approx(z.candidate_epsilon)


def test_swamped_candidates_are_not_run_and_the_point_is_charged_its_target(tmp_path):
    from privmtl.experiments import mpmtl_sweep

    grid = [{"clip": [1.0], "eigen_fix": ["denoise", "shift"]}, SWAMPED]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(linear_method("lowrank"), "vote_grid", grid)
        mpmtl_sweep.run_mpmtl_sweep(  # m = 320, d = 30: at ε = 0.5 the K = 100, T = 10 point
            # would have a signal-to-noise bound of 0.59 (the two others 2.3)
            data="synthetic-lowrank", data_path=None, methods=["lowrank"], epsilons=[0.5],
            seeds=[0], noise="gaussian", tune_mode="each", out_dir=tmp_path,
            noise_source="seeded",
        )  # fmt: skip
    logged = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines()]
    points = [json.loads(e["key"])["select_inputs"]["point"] for e in logged
              if e["row"].get("method") == "lowrank"]  # fmt: skip
    assert len(points) == 2 and all(p["clip"] == 1.0 and "iterations" not in p for p in points)
    row = json.loads((tmp_path / "mpmtl_sweep.json").read_text())["rows"][0]
    assert row["selection"]["plan"]["dropped"][0]["point"]["clip"] == 100.0
    assert row["epsilon"] == pytest.approx(0.5, rel=1e-6) and row["epsilon"] <= 0.5 + 1e-9
    assert row["target_epsilon"] == 0.5 and row["selection_method"] == "vote"


def test_default_grid_runs_the_public_defaults_alone_with_the_whole_target(tmp_path):
    from privmtl.experiments.mpmtl import run_mpmtl
    from privmtl.experiments.mpmtl_sweep import run_mpmtl_sweep

    run_mpmtl_sweep(
        data="synthetic-lowrank", data_path=None, methods=["lowrank"], epsilons=[1.0],
        seeds=[0], noise="gaussian", tune_mode="each", out_dir=tmp_path, noise_source="seeded",
    )  # fmt: skip
    row = json.loads((tmp_path / "mpmtl_sweep.json").read_text())["rows"][0]
    assert row["selection_method"] == "none" and row["covered"]
    assert row["epsilon"] == pytest.approx(1.0, rel=1e-9) and row["target_epsilon"] == 1.0
    # the single `privmtl mpmtl` run at its defaults: the same model, the same number
    single = run_mpmtl(data="synthetic-lowrank", method="lowrank", epsilon=1.0, seed=0,
                       noise_source="seeded")  # fmt: skip
    assert row["nmse"] == pytest.approx(single["nmse"], rel=1e-12)


def test_eigen_floor_passes_through_to_every_run(tmp_path):
    from privmtl.experiments.mpmtl_sweep import run_mpmtl_sweep

    run_mpmtl_sweep(
        data="synthetic-lowrank", data_path=None, methods=["lowrank"], epsilons=[10.0],
        seeds=[0], noise="gaussian", tune_mode="each", out_dir=tmp_path, noise_source="seeded",
        eigen_floor=2.0,
    )  # fmt: skip
    row = json.loads((tmp_path / "mpmtl_sweep.json").read_text())["rows"][0]
    assert row["eigen_floor"]["mode"] == "fixed" and row["eigen_floor"]["floor"] == 2.0


@pytest.mark.parametrize("bad", [-1.0, math.nan, "median"])
def test_eigen_floor_is_checked_before_anything_runs(tmp_path, bad):
    from privmtl.experiments.mpmtl_sweep import run_mpmtl_sweep

    with pytest.raises(InvalidParameterError, match="eigen_floor"):
        run_mpmtl_sweep(
            data="synthetic-lowrank", data_path=None, methods=["lowrank"], epsilons=[1.0],
            seeds=[0], noise="gaussian", tune_mode="each", out_dir=tmp_path / "o",
            eigen_floor=bad,
        )  # fmt: skip
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("bad", ["-1", "nan", "median"])
def test_cli_refuses_a_bad_eigen_floor_in_one_line(tmp_path, capsys, bad):
    out = tmp_path / "o"
    code = main(["mpmtl-sweep", "--data", "synthetic-lowrank", "--methods", "lowrank",
                 "--epsilons", "1", "--eigen-floor", bad, "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "eigen" in err and "Traceback" not in err
    assert not out.exists()


def test_plot_reads_at_the_target_and_labels_the_charged_epsilon(tmp_path, monkeypatch):
    from privmtl.experiments import sweep

    seen = {}
    real = sweep.plot_tradeoff

    def spy(summary, path, **kw):
        seen.update(kw, summary=summary)
        return real(summary, path, **kw)

    import privmtl.experiments.mpmtl_sweep as ms

    monkeypatch.setattr(ms, "plot_tradeoff", spy)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(linear_method("lowrank"), "vote_grid",
                   [{"clip": [1.0], "eigen_fix": ["denoise", "shift"]}])  # fmt: skip
        ms.run_mpmtl_sweep(
            data="synthetic-lowrank", data_path=None, methods=["lowrank"], epsilons=[1.0],
            seeds=[0], noise="gaussian", tune_mode="each", out_dir=tmp_path,
            noise_source="seeded",
        )  # fmt: skip
    assert seen["x_key"] == "target_epsilon" and seen["label_key"] == "epsilon"
    point = seen["summary"][0]
    assert point["target_epsilon"] == 1.0 and np.isclose(point["epsilon"], 1.0, rtol=1e-6)
    assert (tmp_path / "mpmtl_tradeoff.png").stat().st_size > 0
    csv_text = (tmp_path / "mpmtl_sweep.csv").read_text().splitlines()
    header = csv_text[0].split(",")
    cells = dict(zip(header, csv_text[1].split(","), strict=False))
    assert float(cells["target_epsilon"]) == 1.0 and float(cells["epsilon"]) == pytest.approx(1.0)
