import json

import pytest

from privmtl.cli import main

MPMTL_KEYS = ("method", "epsilon", "delta", "relation", "accountant", "seconds")
PMTL_KEYS = (
    "method", "epsilon", "delta", "accountant", "sampling", "relation", "test_accuracy",
    "mean_client_accuracy", "rounds", "seconds", "seconds_per_round",
)  # fmt: skip


def _json(capsys, args):
    code = main(args)
    cap = capsys.readouterr()
    assert code == 0, cap.err
    return json.loads(cap.out)


def test_mpmtl_json_contract_on_synthetic(capsys):
    out = _json(
        capsys,
        ["mpmtl", "--data", "synthetic-lowrank", "--method", "lowrank", "--epsilon", "1",
         "--iterations", "3", "--no-tune", "--json"],
    )  # fmt: skip
    for key in (*MPMTL_KEYS, "nmse"):
        assert key in out
    assert out["epsilon"] == pytest.approx(1.0, rel=1e-6)
    assert out["delta"] == pytest.approx(min(1e-5, 1 / (100 * 320)))  # below 1/m by default
    assert out["relation"] == "add-remove" and out["accountant"] == "rdp"
    # non-private when --epsilon is absent
    out = _json(
        capsys,
        ["mpmtl", "--data", "synthetic-lowrank", "--method", "mtl-trace", "--no-tune", "--json"],
    )
    assert out["epsilon"] is None and out["guarantee"]["private"] is False


def test_wishart_reports_its_real_delta_on_school(capsys, school_path):
    """--noise wishart --epsilon 1 --iterations 5 reports δ ≥ 0.1."""
    out = _json(
        capsys,
        ["mpmtl", "--data", "school", "--data-path", str(school_path), "--method", "lowrank",
         "--noise", "wishart", "--epsilon", "1", "--iterations", "5", "--no-tune", "--json"],
    )  # fmt: skip
    assert out["delta"] >= 0.1
    assert out["guarantee"]["valid"] is False
    assert out["accountant"] == "kairouz-cb"


def test_mpmtl_table_with_nan_is_refused(capsys, tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("task,x1,x2,y\na,1,2,3\na,2,1,1\nb,1,nan,2\nb,0,1,1\n")
    code = main(["mpmtl", "--data", "table", "--data-path", str(path), "--method", "stl-l2"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("privmtl: error:") and len(err.strip().splitlines()) == 1


def test_pmtl_json_contract_and_sequential_path(capsys):
    args = ["pmtl", "--data", "synthetic", "--model", "logreg", "--method", "pmtl", "--epsilon", "2",
            "--rounds", "3", "--clients-per-round", "5", "--reproducible-noise", "--finetune",
            "none", "--json"]  # fmt: skip
    batched = _json(capsys, args)
    for key in PMTL_KEYS:
        assert key in batched
    assert batched["epsilon"] <= 2.0 and batched["sampling"] == "poisson"
    assert len(batched["epsilon_per_round"]) == 3
    sequential = _json(capsys, [*args, "--sequential"])
    assert sequential["test_accuracy"] == pytest.approx(batched["test_accuracy"], abs=1e-6)
    assert sequential["batched"] is False


def test_pmtl_local_reports_zero_epsilon(capsys):
    out = _json(
        capsys,
        ["pmtl", "--data", "synthetic", "--model", "logreg", "--method", "local", "--rounds", "2",
         "--finetune", "none", "--json"],
    )  # fmt: skip
    assert out["epsilon"] == 0.0


def test_mpmtl_sweep_writes_its_files_and_parallel_rows_equal_sequential(capsys, tmp_path):
    base = ["mpmtl-sweep", "--data", "synthetic-lowrank", "--methods", "lowrank,stl-l2",
            "--epsilons", "1,10", "--iterations", "3", "--tune", "none", "--reproducible-noise",
            "--json"]  # fmt: skip
    seq = _json(capsys, [*base, "--out", str(tmp_path / "a")])
    par = _json(capsys, [*base, "--out", str(tmp_path / "b"), "--jobs", "2"])
    for name in ("mpmtl_sweep.csv", "mpmtl_sweep.json", "mpmtl_tradeoff.png"):
        assert (tmp_path / "a" / name).stat().st_size > 0
    assert [(r["method"], r["target_epsilon"], r["mean"]) for r in seq["summary"]] == [
        (r["method"], r["target_epsilon"], r["mean"]) for r in par["summary"]
    ]
    rows = json.loads((tmp_path / "b" / "mpmtl_sweep.json").read_text())["rows"]
    assert [r["target_epsilon"] for r in rows] == [1.0, 10.0, None]  # job order kept
    assert seq["noise_source"] == "seeded"
    # private rows are seeded; the single-task row adds no noise (not "seeded")
    assert [r["noise_source"] for r in rows] == ["seeded", "seeded", "none"]
    assert main([*base, "--tune", "twice", "--out", str(tmp_path / "c")]) == 2
    assert not (tmp_path / "c").exists()


def test_pmtl_sweep_selects_on_validation_and_writes_plots(capsys, tmp_path):
    out = _json(
        capsys,
        ["pmtl-sweep", "--data", "synthetic", "--methods", "pmtl,fedavg", "--epsilons", "2",
         "--clips", "0.5", "--rounds-grid", "3", "--lams", "0.01,1", "--server-update", "offset",
         "--select", "pooled", "--finetune", "none", "--out", str(tmp_path / "s"), "--json"],
    )  # fmt: skip
    files = {p.rsplit("/", 1)[-1] for p in out["files"]}
    assert files == {
        "pmtl_sweep.csv",
        "pmtl_sweep.json",
        "pmtl_tradeoff.png",
        "pmtl_rounds.png",
        "runs.jsonl",
    }
    saved = json.loads((tmp_path / "s" / "pmtl_sweep.json").read_text())
    cands = saved["candidates"]
    # pmtl tried both lambdas at each eps, fedavg only one; the kept pmtl row has the best val acc
    assert sorted(
        c["lam"] for c in cands if c["method"] == "pmtl" and c["target_epsilon"] == 2.0
    ) == [0.01, 1.0]
    assert len([c for c in cands if c["method"] == "fedavg"]) == 2
    kept = next(r for r in saved["rows"] if r["method"] == "pmtl" and r["target_epsilon"] == 2.0)
    best = max(
        (c for c in cands if c["method"] == "pmtl" and c["target_epsilon"] == 2.0),
        key=lambda c: c["val_accuracy"],
    )
    assert kept["lam"] == best["lam"] and kept["server_update"] == "offset"
    assert kept["epsilon"] == pytest.approx(2.0, rel=0.03)
    # pooled selection is opt-in and its rows say they are not covered, with the reason
    assert out["covered"] is False and kept["covered"] is False
    assert kept["selection_method"] == "pooled" and "pooled" in kept["guarantee"]["not_covered"][0]


def test_pmtl_finetune_grid_is_chosen_per_client(capsys):
    out = _json(
        capsys,
        ["pmtl", "--data", "synthetic", "--model", "logreg", "--rounds", "3", "--finetune",
         "mr", "--finetune-lrs", "0.01,0.1", "--finetune-lams", "0.1,1", "--json"],
    )  # fmt: skip
    sel = out["finetune_selection"]
    assert sel["select"] == "client"
    assert sel["grid"] == [[0.01, 0.1], [0.01, 1.0], [0.1, 0.1], [0.1, 1.0]]
    assert sum(sel["choice_counts"]) == out["num_clients"]
    assert out["finetune"] == "mr" and 0.0 <= out["test_accuracy"] <= 1.0


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--finetune-lrs", "0,0.1"),
        ("--finetune-lams", "-1"),
        ("--finetune-lrs", "a"),
        ("--finetune-epochs", "0,3"),
        ("--finetune-epochs", "1.5"),
    ],
)
def test_pmtl_finetune_grid_bad_input(capsys, flag, value):
    code = main(["pmtl", "--data", "synthetic", "--model", "logreg", "--rounds", "1", flag, value])
    err = capsys.readouterr().err
    assert code == 2 and flag in err and len(err.strip().splitlines()) == 1


def test_pmtl_finetune_from_billboard_cli(capsys):
    base = ["pmtl", "--data", "synthetic", "--model", "logreg", "--rounds", "2", "--finetune"]
    out = _json(
        capsys,
        [*base, "vanilla", "--finetune-start", "billboard", "--finetune-epochs", "1,2",
         "--finetune-select", "pooled", "--json"],
    )  # fmt: skip
    assert out["finetune_start"] == "global"
    assert out["finetune_selection"]["grid"] == [[1, 0.1], [2, 0.1]]
    # a grid of epochs needs the billboard start: one line naming the parameter, exit 2
    code = main([*base, "vanilla", "--finetune-epochs", "1,2"])
    err = capsys.readouterr().err
    assert code == 2 and "finetune_epochs" in err and len(err.strip().splitlines()) == 1


def test_risky_setting_is_one_warning_line_and_json_stays_clean(capsys):
    argv = ["pmtl", "--data", "synthetic", "--model", "logreg", "--rounds", "1", "--finetune",
            "none", "--json"]  # fmt: skip
    code = main([*argv, "--server-update", "delta"])
    cap = capsys.readouterr()
    assert code == 0
    json.loads(cap.out)  # stdout is exactly the JSON object
    lines = [ln for ln in cap.err.splitlines() if ln.startswith("privmtl: warning:")]
    assert len(lines) == 1 and "server_update='offset'" in lines[0]
    assert "Traceback" not in cap.err and "UserWarning" not in cap.err


def test_pmtl_defaults_are_the_ditto_message_without_warning(capsys):
    code = main(["pmtl", "--data", "synthetic", "--model", "logreg", "--rounds", "1",
                 "--finetune", "none", "--json"])  # fmt: skip
    cap = capsys.readouterr()
    assert code == 0 and "privmtl: warning" not in cap.err
    out = json.loads(cap.out)
    assert out["server_update"] == "ditto" and out["lam"] == 1.0  # non-private default λ
    code = main(
        [
            "pmtl",
            "--data",
            "synthetic",
            "--model",
            "logreg",
            "--rounds",
            "1",
            "--epsilon",
            "2",
            "--finetune",
            "none",
            "--json",
        ]
    )
    assert code == 0 and json.loads(capsys.readouterr().out)["lam"] == 0.001


def test_pmtl_clients_per_round_above_population_exits_2(capsys):
    code = main(
        [
            "pmtl",
            "--data",
            "synthetic",
            "--model",
            "logreg",
            "--rounds",
            "1",
            "--clients-per-round",
            "51",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "clients_per_round" in err and "m=50" in err
    assert len(err.strip().splitlines()) == 1


def test_pmtl_default_finetune_is_auto_and_its_grid_options_exit_2(capsys):
    base = [
        "pmtl",
        "--data",
        "synthetic",
        "--num-clients",
        "12",
        "--model",
        "logreg",
        "--rounds",
        "2",
    ]
    assert main([*base, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["finetune"] == "auto" and out["finetune_auto"]["signal"]  # non-private
    auto = out["finetune_auto"]
    assert auto["select"] == "client" and auto["clear_signal"]  # no noise: a clear signal
    assert auto["order"] == ["trained", "local", "billboard-finetune"]  # ties: the billboard
    assert sum(auto["clients_per_candidate"].values()) == out["num_clients"]
    assert out["covered"] is True
    code = main([*base, "--finetune-lrs", "0.1"])
    err = capsys.readouterr().err
    assert code == 2 and "finetune_lrs" in err and len(err.strip().splitlines()) == 1


def test_pmtl_and_evaluate_say_which_model_the_clients_kept_and_what_the_shared_one_scores(
    capsys, tmp_path
):
    """Human output of ``privmtl pmtl`` and ``privmtl evaluate``: the clients' end of the run in
    words and the released global model's own scores, the same numbers as the JSON keys."""
    args = ["pmtl", "--data", "synthetic", "--num-clients", "12", "--model", "logreg",
            "--method", "fedavg", "--rounds", "2", "--epsilon", "2", "--reproducible-noise",
            "--quiet"]  # fmt: skip
    out = _json(capsys, [*args, "--json"])
    assert main([*args, "--save-models", str(tmp_path / "m")]) == 0
    human = capsys.readouterr().out.splitlines()
    shared = (
        "shared model alone (the released global model, scored on each client's own test data): "
        f"test accuracy (pooled) = {out['global_test_accuracy']:.4f}; "
        f"mean client accuracy = {out['global_mean_client_accuracy']:.4f}"
    )
    assert f"end of run: {out['end_of_run']}" in human and shared in human
    assert out["end_of_run"].startswith(f"{out['clients_per_final_model']['trained']} of 12 ")
    assert main(["evaluate", str(tmp_path / "m")]) == 0
    human = capsys.readouterr().out.splitlines()
    assert f"end of run (recorded at training): {out['end_of_run']}" in human and shared in human
    ev = _json(capsys, ["evaluate", str(tmp_path / "m"), "--json"])
    assert ev["clients_per_final_model"] == out["clients_per_final_model"]
    assert ev["global_mean_client_accuracy"] == pytest.approx(out["global_mean_client_accuracy"])
