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


def test_finetune_from_billboard_is_local_training_started_at_the_billboard(tmp_path):
    """Oracle: --finetune-start billboard equals train_local run from the saved global model."""
    import torch

    from privmtl.data.federated import make_synthetic_federated
    from privmtl.federated.local import train_local
    from privmtl.federated.models import MultinomialLogReg

    ds = make_synthetic_federated(n_clients=30, random_state=4)
    out = run_pmtl(
        **KW,
        dataset=ds,
        clients_per_round=10,
        finetune="vanilla",
        finetune_start="billboard",
        finetune_epochs=[1, 5],
        finetune_lrs=[0.01, 0.1],
        finetune_select="pooled",
        save_models=tmp_path / "models",
    )
    board = torch.load(tmp_path / "models" / "global.pt")
    net = MultinomialLogReg(ds.n_features, ds.n_classes)
    net.load_state_dict(board)
    ref = train_local(ds, net, epochs=[1, 5], lrs=[0.01, 0.1], select="pooled", seed=0)
    assert out["test_accuracy"] == pytest.approx(
        ref.accuracies["test"]["personalized"]["accuracy"], abs=1e-12
    )
    sel = out["finetune_selection"]
    assert sel["grid"] == [[1, 0.01], [1, 0.1], [5, 0.01], [5, 0.1]]
    assert sel["select"] == "pooled" and sum(sel["choice_counts"]) == 30
    assert max(sel["choice_counts"]) == 30  # pooled: one grid point for every client
    assert out["finetune_start"] == "global"
    # the trained run itself is unchanged by fine-tuning (post-processing)
    plain = run_pmtl(**KW, dataset=ds, clients_per_round=10)
    assert out["pre_finetune_test_accuracy"] == plain["test_accuracy"]
    assert out["epsilon"] == plain["epsilon"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"finetune": "vanilla", "finetune_epochs": [1, 3]}, "finetune_epochs"),
        ({"finetune": "vanilla", "finetune_select": "pooled"}, "finetune_select"),
        ({"finetune": "mr", "finetune_start": "billboard"}, "finetune_start"),
        ({"finetune": "vanilla", "finetune_start": "start"}, "finetune_start"),
        ({"finetune": "vanilla", "finetune_epochs": 0}, "finetune_epochs"),
    ],
)
def test_finetune_start_bad_input(kwargs, match):
    with pytest.raises(InvalidParameterError, match=match):
        run_pmtl(**KW, **kwargs)
