"""``privmtl pmtl``: every default output is covered by the guarantee (the contract).

- ``--method local-all`` (no release): replacing one client's labels leaves every other client's
  tensors in ``DIR/personalized.pt`` bit-identical;
- the default JSON has no curator diagnostic; ``--diagnostics`` adds them, labelled not covered;
- the default δ is below 1/m on every data set; ``--paper-delta`` is the paper's 1/m;
- a run without noise says ``noise_source: "none"``; every result carries ``covered``.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from privmtl.cli import main
from privmtl.federated.spec import pmtl_delta

DIAGNOSTIC_KEYS = (
    "signal_norm_per_round",
    "noise_norm_per_round",
    "train_loss_per_round",
    "full_signal_norm_per_round",
    "curator_diagnostics",
)


def _table(path, *, n_clients=12, rows=30, d=4, k=3, seed=0, big=None):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(k, d)) * 2
    frames = []
    for c in range(n_clients):
        y = rng.integers(0, k, size=rows * (20 if c == big else 1))
        x = centers[y] + rng.normal(size=(len(y), d))
        f = pd.DataFrame(x, columns=[f"f{j}" for j in range(d)])
        f.insert(0, "user", f"u{c:02d}")
        f["label"] = y
        frames.append(f)
    frame = pd.concat(frames, ignore_index=True)
    frame.to_csv(path, index=False)
    return frame


TABLE = ["--data", "table", "--client-column", "user", "--label-column", "label"]
SYN = ["--data", "synthetic", "--num-clients", "20"]
FAST = ["--model", "logreg", "--rounds", "3", "--clients-per-round", "5", "--json", "--quiet",
        "--reproducible-noise", "--threads", "1"]  # fmt: skip
# where the clients' end of the run (--finetune auto's local training grid) is not what is tested
NO_FINISH = ["--finetune", "none"]


def _run(capsys, *args) -> dict:
    assert main(["pmtl", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_local_all_models_do_not_depend_on_another_clients_labels(tmp_path, capsys):
    """The contract: --method local-all --save-models DIR; replace client u03's labels; every
    other client's tensors in DIR/personalized.pt are bit-identical. Client u03 holds most of
    the rows and its new labels are noise, so a choice on pooled validation data would change."""
    frame = _table(tmp_path / "a.csv", big=3)
    who = frame["user"] == "u03"
    noise = np.random.default_rng(1).integers(0, 3, size=len(frame))
    changed = frame.assign(label=frame["label"].where(~who, noise))
    changed.to_csv(tmp_path / "b.csv", index=False)
    for name in ("a", "b"):
        out = _run(capsys, *TABLE, "--data-path", str(tmp_path / f"{name}.csv"), *FAST,
                   "--method", "local-all", "--save-models", str(tmp_path / name))  # fmt: skip
        assert out["covered"] is True and out["guarantee"]["not_covered"] == []
        assert out["local_selection"]["select"] == "client"
        assert out["noise_source"] == "none" and out["guarantee"]["noise_source"] == "none"
    a = torch.load(tmp_path / "a" / "personalized.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "personalized.pt", weights_only=True)
    ids = json.loads((tmp_path / "a" / "model.json").read_text())["client_ids"]
    k = ids.index("u03")
    others = [i for i in range(len(ids)) if i != k]
    for n in a:
        assert torch.equal(a[n][others], b[n][others])
    assert any(not torch.equal(a[n][k], b[n][k]) for n in a)  # the changed client did change
    assert main(["evaluate", "--models", str(tmp_path / "a"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["covered"] is True


def test_pooled_local_selection_is_opt_in_and_not_covered(tmp_path, capsys):
    out = _run(capsys, *SYN, *FAST, "--method", "local-all", "--local-select", "pooled")
    assert out["local_selection"]["select"] == "pooled"
    assert out["covered"] is False and out["guarantee"]["covered"] is False
    assert out["guarantee"]["not_covered"][0].startswith("local_selection")
    assert "NOT COVERED" in out["summary"]


def test_default_json_has_no_curator_diagnostics(capsys):
    out = _run(capsys, *SYN, *FAST, "--epsilon", "2", "--subspace-dim", "50")
    assert not set(DIAGNOSTIC_KEYS) & set(out)
    assert out["covered"] is True and out["guarantee"]["covered"] is True


def test_diagnostics_flag_brings_them_back_labelled_not_covered(capsys):
    out = _run(capsys, *SYN, *FAST, *NO_FINISH, "--epsilon", "2", "--subspace-dim", "50",
               "--diagnostics")  # fmt: skip
    diag = out["curator_diagnostics"]
    assert set(diag) == {
        "train_loss_per_round",
        "signal_norm_per_round",
        "noise_norm_per_round",
        "full_signal_norm_per_round",
    }
    assert all(len(v) == 3 for v in diag.values())
    assert all(v is not None and v > 0 for v in diag["noise_norm_per_round"])
    assert not {"train_loss_per_round", "signal_norm_per_round"} & set(out)
    assert out["covered"] is False
    assert out["guarantee"]["not_covered"][0].startswith("curator_diagnostics")


def test_human_summary_says_not_covered(capsys):
    args = [*SYN, *[a for a in FAST if a != "--json"], *NO_FINISH, "--diagnostics"]
    assert main(["pmtl", *args]) == 0
    privacy = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("privacy:")]
    assert len(privacy) == 1 and "NOT COVERED: curator_diagnostics" in privacy[0]


@pytest.mark.parametrize("m", [1, 10, 105, 1000, 10**6])
def test_default_delta_is_below_one_over_m(m):
    delta, notes = pmtl_delta(None, m)  # the default of every data set (one rule)
    assert delta < 1.0 / m and notes == ()
    assert delta == min(1e-5, 1.0 / (100 * m))


def test_default_delta_end_to_end_on_a_table_and_synthetic(tmp_path, capsys):
    _table(tmp_path / "t.csv")
    table = _run(capsys, *TABLE, "--data-path", str(tmp_path / "t.csv"), *FAST, *NO_FINISH,
                 "--epsilon", "2")  # fmt: skip
    syn = _run(capsys, *SYN, *FAST, *NO_FINISH, "--epsilon", "2")
    for out in (table, syn):
        m = out["num_clients"]
        assert out["delta"] < 1.0 / m and out["guarantee"]["delta"] == out["delta"]
        assert out["delta"] == min(1e-5, 1 / (100 * m))


def test_paper_delta_is_explicit(capsys):
    out = _run(capsys, *SYN, *FAST, *NO_FINISH, "--epsilon", "2", "--paper-delta")
    assert out["delta"] == pytest.approx(1 / 20)
    assert any("paper" in n for n in out["guarantee"]["notes"])
    assert main(["pmtl", *SYN, *FAST, "--paper-delta", "--delta", "1e-6"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--delta" in err[0]


@pytest.mark.parametrize(
    ("args", "source"),
    [
        (["--method", "pmtl"], "none"),  # no --epsilon, no --noise-std: non-private, no noise
        (["--method", "local"], "none"),
        (["--method", "pmtl", "--epsilon", "2"], "seeded"),
    ],
)
def test_noise_source_is_none_without_noise(capsys, args, source):
    out = _run(capsys, *SYN, *FAST, "--finetune", "none", *args)
    assert out["noise_source"] == source and out["guarantee"]["noise_source"] == source
    assert out["covered"] is out["guarantee"]["covered"] is True
