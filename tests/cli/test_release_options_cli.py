"""``privmtl pmtl --subspace-dim``, ``--adaptive-clip-*`` and ``--local-epochs``."""

import json

import pytest

from privmtl.cli import main

RUN = ["pmtl", "--data", "synthetic", "--num-clients", "30", "--model", "logreg", "--rounds", "3",
       "--clients-per-round", "6", "--epsilon", "2", "--reproducible-noise", "--finetune", "none",
       "--json"]  # fmt: skip


def test_subspace_and_adaptive_clip_flags_reach_the_run(capsys):
    code = main([*RUN, "--subspace-dim", "7", "--adaptive-clip-quantile", "0.5",
                 "--adaptive-clip-noise", "3", "--local-epochs", "2", "--diagnostics"])  # fmt: skip
    cap = capsys.readouterr()
    assert code == 0, cap.err
    out = json.loads(cap.out)
    assert out["epsilon"] == pytest.approx(2.0, rel=1e-3)
    assert out["released_dim"] == 7 and out["subspace_dim"] == 7
    assert out["adaptive_clip_quantile"] == 0.5 and out["adaptive_clip_noise"] == 3.0
    assert out["clip_per_round"][0] == 0.5 and len(set(out["clip_per_round"])) == 3
    diag = out["curator_diagnostics"]
    assert len(diag["signal_norm_per_round"]) == len(diag["noise_norm_per_round"]) == 3
    assert len(diag["full_signal_norm_per_round"]) == 3


def test_too_little_count_noise_exits_2_naming_the_parameter(capsys):
    code = main([*RUN, "--adaptive-clip-quantile", "0.5", "--adaptive-clip-noise", "0.1"])
    cap = capsys.readouterr()
    assert code == 2
    assert cap.err.startswith("privmtl: error:") and "adaptive_clip_noise" in cap.err
    assert "Traceback" not in cap.err
