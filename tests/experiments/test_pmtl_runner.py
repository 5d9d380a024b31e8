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
    both = run_pmtl(**KW, finetune="none", extra_finetunes=["vanilla", "mr"])
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
    fedavg = run_pmtl(**{**KW, "epsilon": None}, method="fedavg", finetune="none")
    assert fedavg["global_test_accuracy"] == fedavg["test_accuracy"]  # its model IS the global one
    tuned = run_pmtl(**{**KW, "epsilon": None}, method="fedavg")  # finetune="auto"
    assert tuned["global_test_accuracy"] == tuned["pre_finetune_test_accuracy"]
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


def _auto_kwargs():
    from privmtl.experiments.pmtl import AUTO_FINETUNE_EPOCHS
    from privmtl.federated.local import LOCAL_LRS

    return {
        "finetune": "vanilla",
        "finetune_start": "billboard",
        "finetune_epochs": list(AUTO_FINETUNE_EPOCHS),
        "finetune_lrs": list(LOCAL_LRS),
        "finetune_select": "pooled",
    }


def test_finetune_auto_is_billboard_finetuning_kept_when_better_on_validation():
    """Oracle: with signal, the default equals the explicit billboard fine-tuning over the auto
    grid, kept iff its pooled validation accuracy beats the trained models'."""
    kw = {**KW, "epsilon": None, "clients_per_round": 10}
    auto = run_pmtl(**kw)
    explicit = run_pmtl(**kw, **_auto_kwargs())
    plain = run_pmtl(**kw, finetune="none")
    info = auto["finetune_auto"]
    assert info["signal"] and info["noise_norm"] == 0.0 and info["signal_bound"] == 1.5
    assert info["trained_val_accuracy"] == plain["val_accuracy"]
    assert info["finetuned_val_accuracy"] == explicit["val_accuracy"]
    assert explicit["val_accuracy"] > plain["val_accuracy"]  # 3 rounds: fine-tuning must win
    assert info["chosen"] == "billboard-finetune"
    assert auto["test_accuracy"] == explicit["test_accuracy"]
    assert auto["pre_finetune_test_accuracy"] == plain["test_accuracy"]
    assert auto["finetune_selection"]["grid"] == explicit["finetune_selection"]["grid"]
    assert any("finetune=auto" in n for n in auto["guarantee"]["notes"])


def test_finetune_auto_keeps_the_trained_models_when_they_validate_better(monkeypatch):
    import privmtl.experiments.pmtl as runner

    real = runner._finetune_from_billboard

    def worse(*args, **kwargs):
        return {**real(*args, **kwargs), "val_accuracy": -1.0}

    monkeypatch.setattr(runner, "_finetune_from_billboard", worse)
    kw = {**KW, "epsilon": None, "clients_per_round": 10}
    auto = run_pmtl(**kw)
    plain = run_pmtl(**kw, finetune="none")
    assert auto["finetune_auto"]["chosen"] == "trained"
    assert auto["test_accuracy"] == plain["test_accuracy"] == auto["pre_finetune_test_accuracy"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"noise_std": 1.0, "epsilon": None},
        {"method": "local"},
        {"epsilon": None, "shared_params": ["linear.bias"]},
    ],
)
def test_finetune_auto_without_signal_keeps_the_trained_models(kwargs):
    """σ√(kT) > Tγ (public parameters), no billboard, or a billboard of part of the model only:
    no fine-tuning at all."""
    out = run_pmtl(**{**KW, **kwargs})
    info = out["finetune_auto"]
    assert not info["signal"] and info["chosen"] == "trained"
    assert "finetuned_val_accuracy" not in info and "finetune_selection" not in out
    assert out["test_accuracy"] == out["pre_finetune_test_accuracy"]
    if "noise_std" in kwargs:  # sigma * sqrt(k T) against T * clip, k = 610, T = 3
        assert info["noise_norm"] == pytest.approx(1.0 * (610 * 3) ** 0.5)
        assert info["signal_bound"] == pytest.approx(3 * 0.5)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"finetune_lrs": [0.1]},
        {"finetune_lams": [1.0]},
        {"finetune_epochs": 3},
        {"finetune_start": "billboard"},
        {"finetune_select": "pooled"},
    ],
)
def test_finetune_auto_refuses_its_grid_options(kwargs):
    (name,) = kwargs
    with pytest.raises(InvalidParameterError, match=f"finetune='auto'.*'{name}'"):
        run_pmtl(**KW, **kwargs)
