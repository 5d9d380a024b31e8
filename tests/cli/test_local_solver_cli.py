"""``privmtl pmtl --local-solver``: the end of run's local trainings solved as ridge problems.

- ``--local-solver ridge`` is reported (``finetune_auto.solver``, ``local_selection.solver``),
  its grids are the public prior strengths, and the default stays ``sgd``;
- with ``--method local-all --local-solver ridge``, replacing one client's labels leaves every
  other client's saved model bit-identical (a client's solve reads its own data only);
- a model other than logistic regression is refused in one line, exit 2, before any round;
- ``--local-patience`` (early stopping of the SGD runs) is reported, and refused with ridge.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import torch

from privmtl.cli import main
from privmtl.federated.end_of_run.finish import AUTO_FINETUNE_RIDGES
from privmtl.federated.end_of_run.local import LOCAL_RIDGES

SYN = ["--data", "synthetic", "--num-clients", "20"]
FAST = ["--model", "logreg", "--rounds", "3", "--clients-per-round", "5", "--json", "--quiet",
        "--reproducible-noise", "--threads", "1"]  # fmt: skip


def _run(capsys, *args) -> dict:
    assert main(["pmtl", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_ridge_solver_is_reported_and_sgd_stays_the_default(capsys):
    ridge = _run(capsys, *SYN, *FAST, "--epsilon", "4", "--local-solver", "ridge")
    auto = ridge["finetune_auto"]
    assert auto["solver"] == "ridge"
    assert auto["local_grid"] == [[c] for c in LOCAL_RIDGES]
    if "billboard-finetune" in auto["order"]:
        assert auto["billboard_grid"] == [[c] for c in AUTO_FINETUNE_RIDGES]
    assert ridge["covered"] is True
    default = _run(capsys, *SYN, *FAST, "--epsilon", "4")
    assert default["finetune_auto"]["solver"] == "sgd"
    assert default["finetune_auto"]["local_grid"][0] == [10, 0.03]
    alone = _run(capsys, *SYN, *FAST, "--method", "local-all", "--local-solver", "ridge")
    assert alone["local_selection"]["solver"] == "ridge"
    assert alone["local_selection"]["grid"] == [[c] for c in LOCAL_RIDGES]


def test_ridge_local_models_do_not_depend_on_another_clients_labels(tmp_path, capsys):
    rng = np.random.default_rng(0)
    frames = []
    for c in range(8):
        n = 30 * (10 if c == 3 else 1)
        y = rng.integers(0, 3, size=n)
        f = pd.DataFrame(rng.normal(size=(n, 4)) + y[:, None], columns=[f"f{j}" for j in range(4)])
        f.insert(0, "user", f"u{c}")
        f["label"] = y
        frames.append(f)
    frame = pd.concat(frames, ignore_index=True)
    frame.to_csv(tmp_path / "a.csv", index=False)
    who = frame["user"] == "u3"
    noise = np.random.default_rng(1).integers(0, 3, size=len(frame))
    frame.assign(label=frame["label"].where(~who, noise)).to_csv(tmp_path / "b.csv", index=False)
    for name in ("a", "b"):
        _run(capsys, "--data", "table", "--client-column", "user", "--label-column", "label",
             "--data-path", str(tmp_path / f"{name}.csv"), *FAST, "--method", "local-all",
             "--local-solver", "ridge", "--save-models", str(tmp_path / name))  # fmt: skip
    a = torch.load(tmp_path / "a" / "personalized.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "personalized.pt", weights_only=True)
    ids = json.loads((tmp_path / "a" / "model.json").read_text())["client_ids"]
    k = ids.index("u3")
    others = [i for i in range(len(ids)) if i != k]
    for n in a:
        assert torch.equal(a[n][others], b[n][others])
    assert any(not torch.equal(a[n][k], b[n][k]) for n in a)


def test_ridge_with_a_cnn_is_refused_before_any_round(femnist_dir, tmp_path, capsys):
    args = ["pmtl", "--data", "femnist-leaf", "--data-path", str(femnist_dir), "--model", "cnn",
            "--rounds", "1", "--local-solver", "ridge", "--quiet"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "local_solver" in err[0] and "ridge" in err[0] and "logreg" in err[0]


def test_local_patience_is_reported_and_refused_with_ridge(capsys):
    alone = _run(capsys, *SYN, *FAST, "--method", "local-all", "--local-patience", "3")
    assert alone["local_selection"]["patience"] == 3
    auto = _run(capsys, *SYN, *FAST, "--epsilon", "4", "--local-patience", "3")
    assert auto["finetune_auto"]["patience"] == 3 and auto["covered"] is True
    assert "patience" not in _run(capsys, *SYN, *FAST, "--epsilon", "4")["finetune_auto"]
    argv = ["pmtl", *SYN, *FAST, "--local-solver", "ridge", "--local-patience", "3"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "local_patience" in err[0] and "ridge" in err[0]
