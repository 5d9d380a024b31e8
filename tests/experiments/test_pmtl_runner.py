"""The one-run PMTL runner behind ``privmtl pmtl`` (fine-tuning bookkeeping, bad input)."""

import pytest

from privmtl.exceptions import InvalidParameterError
from privmtl.experiments.pmtl import run_pmtl

KW = {
    "data": "synthetic",
    "rounds": 3,
    "epsilon": 2.0,
    "show_progress": False,
    "threads": 1,
    "noise_source": "seeded",
}


def test_extra_finetunes_score_the_same_run_as_finetune():
    """Each variant in extra_finetunes equals a separate --finetune run with the same seed."""
    both = run_pmtl(**KW, extra_finetunes=["vanilla", "mr"])
    alone = run_pmtl(**KW, finetune="mr")
    assert set(both["finetune_results"]) == {"vanilla", "mr"}
    assert both["finetune_results"]["mr"]["test_accuracy"] == alone["test_accuracy"]
    # the headline accuracy stays the trained model's when only extra variants are requested
    assert both["test_accuracy"] == alone["pre_finetune_test_accuracy"]
    assert both["epsilon"] == pytest.approx(2.0, rel=0.03)


def test_extra_finetunes_rejects_unknown_variant():
    with pytest.raises(InvalidParameterError, match="extra_finetunes"):
        run_pmtl(**KW, extra_finetunes=["none"])


def test_global_accuracy_is_reported_for_the_billboard():
    fedavg = run_pmtl(**{**KW, "epsilon": None}, method="fedavg")
    assert fedavg["global_test_accuracy"] == fedavg["test_accuracy"]  # its model IS the global one
    pmtl = run_pmtl(**{**KW, "epsilon": None}, method="pmtl")
    assert 0.0 <= pmtl["global_test_accuracy"] <= 1.0
    assert run_pmtl(**KW, method="local")["global_test_accuracy"] is None
