"""Users' tables at default flags: small populations, any feature scales, a user's own split."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from privmtl.cli import main
from privmtl.data.federated_table import DEFAULT_CLIENT_SCALING, SCALING_DESCRIPTIONS

FEATURES = [f"f{j}" for j in range(6)]


def _clients(path, *, scales=None, n_clients=12, rows=50, seed=0):
    """Three well-separated classes, every client the same mix; ``scales`` multiplies features."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(3, len(FEATURES))) * 1.5
    frames = []
    for c in range(n_clients):
        y = rng.integers(0, 3, size=rows)
        x = centers[y] + rng.normal(size=(rows, len(FEATURES)))
        f = pd.DataFrame(x * (1.0 if scales is None else scales), columns=FEATURES)
        f.insert(0, "user", f"u{c:02d}")
        f["label"] = y
        frames.append(f)
    frame = pd.concat(frames, ignore_index=True)
    frame.to_csv(path, index=False)
    return frame


def _pmtl(capsys, path, *extra):
    code = main(["pmtl", "--data", "table", "--data-path", str(path), "--client-column", "user",
                 "--label-column", "label", "--model", "logreg", "--json", *extra])  # fmt: skip
    cap = capsys.readouterr()
    assert code == 0, cap.err
    return json.loads(cap.out)


def test_twelve_clients_at_default_flags(tmp_path, capsys):
    _clients(tmp_path / "t.csv")
    out = _pmtl(capsys, tmp_path / "t.csv")
    assert out["num_clients"] == 12 and out["clients_per_round"] == 12
    assert out["clients_per_round_default"] is True
    assert out["scaling"] == SCALING_DESCRIPTIONS[DEFAULT_CLIENT_SCALING]
    assert any("own training rows" in n for n in out["guarantee"]["notes"])
    assert out["test_accuracy"] > 0.9
    # an explicit value that cannot work is still an error, in one line
    code = main(["pmtl", "--data", "table", "--data-path", str(tmp_path / "t.csv"),
                 "--client-column", "user", "--label-column", "label", "--model", "logreg",
                 "--clients-per-round", "20"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "clients_per_round" in err[0] and "m=12" in err[0]


def test_help_states_per_client_statistics(capsys):
    assert main(["pmtl", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--scaling" in text and "OWN training split" in text and "pooled" in text


def test_features_times_1000_score_the_same(tmp_path, capsys):
    frame = _clients(tmp_path / "a.csv")
    frame.assign(**{c: frame[c] * 1000 for c in FEATURES}).to_csv(tmp_path / "b.csv", index=False)
    a = _pmtl(capsys, tmp_path / "a.csv")["test_accuracy"]  # default flags
    b = _pmtl(capsys, tmp_path / "b.csv")["test_accuracy"]
    assert abs(a - b) <= 0.03


def test_mixed_scales_score_like_the_users_standardized_table(tmp_path, capsys):
    frame = _clients(tmp_path / "raw.csv", scales=np.logspace(-3, 3, len(FEATURES)))
    cols = frame[FEATURES]
    frame.assign(**((cols - cols.mean()) / cols.std(ddof=0))).to_csv(tmp_path / "std.csv")
    raw = _pmtl(capsys, tmp_path / "raw.csv")["test_accuracy"]  # default flags
    user = _pmtl(capsys, tmp_path / "std.csv", "--feature-columns", ",".join(FEATURES))
    user = user["test_accuracy"]
    assert abs(raw - user) <= 0.03
    # without scaling these scales break training: the comparison above can fail
    unscaled = _pmtl(capsys, tmp_path / "raw.csv", "--scaling", "none")
    assert unscaled["scaling"] == "none" and unscaled["test_accuracy"] < raw - 0.2


def test_scaling_only_with_a_table(capsys):
    code = main(["pmtl", "--data", "synthetic", "--model", "logreg", "--scaling", "none"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--scaling" in err[0]


def _tasks(path, *, offset, seed=0, m=10, n=60, d=5):
    """Low-rank regression tasks with feature scales 1e-3..1e3 and per-task target offsets."""
    rng = np.random.default_rng(seed)
    U = rng.normal(size=(d, 2))
    frames = []
    for t in range(m):
        z = rng.normal(size=(n, d))
        y = z @ (U @ rng.normal(size=2)) + offset * rng.normal() + 0.5 * rng.normal(size=n)
        f = pd.DataFrame(z * np.logspace(-3, 3, d), columns=[f"x{j}" for j in range(d)])
        f.insert(0, "site", f"s{t}")
        f["outcome"] = y
        frames.append(f)
    frame = pd.concat(frames, ignore_index=True)
    frame.to_csv(path, index=False)
    return frame


def _mpmtl(capsys, path, *extra):
    code = main(["mpmtl", "--data", "table", "--data-path", str(path), "--task-column", "site",
                 "--target-column", "outcome", "--method", "stl-l2", "--json", *extra])  # fmt: skip
    cap = capsys.readouterr()
    assert code == 0, cap.err
    return json.loads(cap.out)


@pytest.mark.parametrize("offset", [0.0, 2.0])
def test_mpmtl_table_defaults_match_the_users_own_standardized_70_30(tmp_path, capsys, offset):
    frame = _tasks(tmp_path / "t.csv", offset=offset)
    cols = [c for c in frame.columns if c.startswith("x")]
    user = frame.assign(**((frame[cols] - frame[cols].mean()) / frame[cols].std(ddof=0)))
    user.to_csv(tmp_path / "user.csv", index=False)
    ours = _mpmtl(capsys, tmp_path / "t.csv")
    theirs = _mpmtl(capsys, tmp_path / "user.csv", "--scaling", "none", "--train-fraction", "0.7")
    assert ours["scaling"] == "per-task" and ours["train_fraction"] == 0.7
    assert ours["nmse"] <= 1.1 * theirs["nmse"]
    # the paper's School protocol would be a poor default here
    paper = _mpmtl(capsys, tmp_path / "t.csv", "--scaling", "unit-norm", "--train-fraction", "0.3")
    assert paper["nmse"] > 2 * ours["nmse"]


def test_sweeps_take_the_same_table_options(tmp_path, capsys):
    _clients(tmp_path / "c.csv", n_clients=5, rows=30)
    code = main(["pmtl-sweep", "--data", "table", "--data-path", str(tmp_path / "c.csv"),
                 "--client-column", "user", "--label-column", "label", "--methods", "pmtl",
                 "--epsilons", "4", "--clips", "0.5", "--rounds-grid", "2", "--finetune", "none",
                 "--out", str(tmp_path / "ps"), "--json"])  # fmt: skip
    cap = capsys.readouterr()
    assert code == 0, cap.err
    keys = _logged_keys(tmp_path / "ps")
    assert keys and all(
        k["scaling"] == DEFAULT_CLIENT_SCALING and k["client_column"] == "user" for k in keys
    )
    _tasks(tmp_path / "t.csv", offset=0.0, m=4, n=30)
    code = main(["mpmtl-sweep", "--data", "table", "--data-path", str(tmp_path / "t.csv"),
                 "--task-column", "site", "--target-column", "outcome", "--methods",
                 "stl-l2,dp-aggr", "--epsilons", "1", "--tune", "none",
                 "--out", str(tmp_path / "ms"), "--json"])  # fmt: skip
    cap = capsys.readouterr()
    assert code == 0, cap.err
    assert {r["method"] for r in json.loads(cap.out)["summary"]} == {"stl-l2", "dp-aggr"}
    scaling = {k["method"]: k["scaling"] for k in _logged_keys(tmp_path / "ms")}
    assert scaling == {"stl-l2": "per-task", "dp-aggr": "unit-norm"}


def _logged_keys(out_dir):
    """The configurations of a sweep's logged runs (runs.jsonl)."""
    lines = (out_dir / "runs.jsonl").read_text().splitlines()
    return [json.loads(json.loads(line)["key"]) for line in lines if line.strip()]


def test_mpmtl_feature_columns_select_the_features(tmp_path, capsys):
    _tasks(tmp_path / "t.csv", offset=1.0, m=4, n=40)
    out = _mpmtl(capsys, tmp_path / "t.csv", "--feature-columns", "x0,x3", "--no-tune")
    assert out["n_features"] == 3  # x0, x3 and the appended intercept column
    code = main(["mpmtl", "--data", "synthetic-lowrank", "--method", "stl-l2",
                 "--feature-columns", "x0"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--feature-columns" in err[0]


def test_dp_aggr_keeps_unit_norm_rows_its_proof_needs(tmp_path, capsys):
    rng = np.random.default_rng(4)
    frames = []
    for t in range(5):
        x = rng.normal(size=(40, 3)) * [1e-2, 1, 1e2]
        f = pd.DataFrame(x, columns=["p", "q", "r"])
        f.insert(0, "site", f"s{t}")
        f["outcome"] = (x[:, 1] + 0.3 * rng.normal(size=40) > 0).astype(int)
        frames.append(f)
    pd.concat(frames, ignore_index=True).to_csv(tmp_path / "c.csv", index=False)
    base = ["mpmtl", "--data", "table", "--data-path", str(tmp_path / "c.csv"), "--task-column",
            "site", "--target-column", "outcome", "--no-tune", "--json"]  # fmt: skip
    aggr = _json_of(capsys, [*base, "--method", "dp-aggr", "--epsilon", "1"])
    assert aggr["scaling"] == "unit-norm" and aggr["guarantee"]["valid"] is True
    stl = _json_of(capsys, [*base, "--method", "stl-l2"])
    assert stl["scaling"] == "per-task" and "auc" in stl


def _json_of(capsys, argv):
    code = main(argv)
    cap = capsys.readouterr()
    assert code == 0, cap.err
    return json.loads(cap.out)
