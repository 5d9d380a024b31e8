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
# where the clients' end of the run (--finetune auto) is the subject but the population is not:
# a small federation, so that every client's local training grid stays cheap
SMALL = {**KW, "num_clients": 12}


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
    pmtl = run_pmtl(**{**KW, "epsilon": None}, method="pmtl", finetune="none")
    assert 0.0 <= pmtl["global_test_accuracy"] <= 1.0
    assert run_pmtl(**KW, method="local", finetune="none")["global_test_accuracy"] is None


def test_result_says_which_model_every_client_ended_with_and_what_the_global_one_scores(
    tmp_path,
):
    """clients_per_final_model / end_of_run repeat the clients' own choices; the global model's
    mean client accuracy is the released model scored on each client's own test data, averaged
    (oracle: the saved global model, evaluated here without privmtl)."""
    import torch

    from privmtl.data.federated import make_synthetic_federated

    ds = make_synthetic_federated(n_clients=12, random_state=2)
    kw = {**KW, "dataset": ds, "method": "fedavg", "clients_per_round": 6}
    auto = run_pmtl(**kw, save_models=tmp_path / "auto")
    counts = auto["finetune_auto"]["clients_per_candidate"]
    assert auto["clients_per_final_model"] == counts and sum(counts.values()) == 12
    words = [f"{counts['trained']} of 12 clients kept the trained global model"]
    words.append(f"{counts['local']} trained locally from scratch")
    assert auto["end_of_run"].startswith(", ".join(words))
    glob = torch.load(tmp_path / "auto" / "global.pt", weights_only=True)
    per_client = []
    for x, y in zip(ds.test_x, ds.test_y, strict=True):
        if len(y):
            logits = x.double() @ glob["linear.weight"].double().T + glob["linear.bias"].double()
            per_client.append(float((logits.argmax(1) == y).double().mean()))
    assert auto["global_mean_client_accuracy"] == pytest.approx(sum(per_client) / len(per_client))
    assert auto["covered"] is True  # scoring the released model is post-processing
    none = run_pmtl(**kw, finetune="none")
    assert none["clients_per_final_model"] == {"trained": 12}
    assert none["end_of_run"] == "12 of 12 clients kept the trained global model"
    assert none["global_mean_client_accuracy"] == none["mean_client_accuracy"]
    local = run_pmtl(**{**kw, "method": "local"}, finetune="none")
    assert local["global_mean_client_accuracy"] is None  # nothing released, no shared model


def test_finetune_from_billboard_is_local_training_started_at_the_billboard(tmp_path):
    """Oracle: --finetune-start billboard equals train_local run from the saved global model."""
    import torch

    from privmtl.data.federated import make_synthetic_federated
    from privmtl.federated.end_of_run.local import train_local
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
    plain = run_pmtl(**KW, dataset=ds, clients_per_round=10, finetune="none")
    assert out["pre_finetune_test_accuracy"] == plain["test_accuracy"]
    assert out["epsilon"] == plain["epsilon"]
    # one setting chosen on everybody's validation data: outside the guarantee, and labelled so
    assert plain["covered"] is True and out["covered"] is False
    assert out["guarantee"]["not_covered"][0].startswith("finetune_selection")


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


def _saved(out_dir):
    import torch

    return torch.load(out_dir / "personalized.pt", weights_only=True)


def _val_correct(ds, k, params):
    """Client k's correct validation predictions of a logistic model (independent of privmtl)."""
    x, y = ds.val_x[k].double(), ds.val_y[k]
    logits = x @ params["linear.weight"][k].double().T + params["linear.bias"][k].double()
    return int((logits.argmax(1) == y).sum())


@pytest.mark.parametrize("epsilon", [None, 2.0])
def test_finetune_auto_is_each_clients_choice_on_its_own_validation(tmp_path, epsilon):
    """Oracle: every client keeps, of (its trained model, its local-all model, the billboard
    fine-tuned over the auto grid), the one with the most correct predictions on ITS validation
    split, ties to the later; each candidate comes from the explicit run that produces it."""
    import torch

    from privmtl.data.federated import make_synthetic_federated
    from privmtl.experiments.pmtl import AUTO_FINETUNE_EPOCHS, AUTO_FINETUNE_LRS

    ds = make_synthetic_federated(n_clients=30, random_state=4)
    kw = {**KW, "epsilon": epsilon, "clients_per_round": 10, "dataset": ds}
    auto = run_pmtl(**kw, save_models=tmp_path / "auto")
    info = auto["finetune_auto"]
    runs = {
        "trained": {"finetune": "none"},
        "local": {"method": "local-all", "finetune": "none"},
        "billboard-finetune": {
            "finetune": "vanilla",
            "finetune_start": "billboard",
            "finetune_epochs": list(AUTO_FINETUNE_EPOCHS),
            "finetune_lrs": list(AUTO_FINETUNE_LRS),
        },
    }
    assert info["select"] == "client" and info["order"] == [
        n for n in runs if n != "billboard-finetune" or info["signal"]
    ]
    cands = {}
    for name in info["order"]:
        out = run_pmtl(**{**kw, **runs[name]}, save_models=tmp_path / name)
        assert out["covered"] is True
        cands[name] = _saved(tmp_path / name)
    got = _saved(tmp_path / "auto")
    counts = dict.fromkeys(info["order"], 0)
    for k in range(ds.n_clients):
        correct = [_val_correct(ds, k, cands[n]) for n in info["order"]]
        pick = info["order"][max(range(len(correct)), key=lambda i: (correct[i], i))]
        counts[pick] += 1
        for n in got:
            assert torch.equal(got[n][k], cands[pick][n][k]), (k, pick)
    assert info["clients_per_candidate"] == counts
    plain = run_pmtl(**kw, finetune="none")
    assert auto["pre_finetune_test_accuracy"] == plain["test_accuracy"]
    assert auto["epsilon"] == plain["epsilon"] and auto["covered"] is True
    assert any("finetune=auto" in n for n in auto["guarantee"]["notes"])


def test_finetune_auto_never_reads_another_clients_validation_data(tmp_path):
    """Replacing client 0's validation labels (not used by training) leaves every other client's
    auto-chosen model bit-identical: no choice reads pooled validation data."""
    import copy

    import torch

    from privmtl.data.federated import make_synthetic_federated

    ds = make_synthetic_federated(n_clients=12, random_state=4)
    other = copy.deepcopy(ds)
    k0 = next(k for k in range(ds.n_clients) if ds.val_y[k].numel())
    other.val_y[k0] = (other.val_y[k0] + 1) % ds.n_classes
    kw = {**KW, "epsilon": None, "clients_per_round": 6}
    run_pmtl(**kw, dataset=ds, save_models=tmp_path / "a")
    run_pmtl(**kw, dataset=other, save_models=tmp_path / "b")
    a, b = _saved(tmp_path / "a"), _saved(tmp_path / "b")
    keep = [k for k in range(ds.n_clients) if k != k0]
    for n in a:
        assert torch.equal(a[n][keep], b[n][keep])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"noise_std": 1.0, "epsilon": None},
        {"method": "local"},
        {"epsilon": None, "shared_params": ["linear.bias"]},
    ],
)
def test_finetune_auto_without_signal_has_no_billboard_candidate(kwargs):
    """σ√(kT) > Tγ (public parameters), no billboard, or a billboard of part of the model only:
    the clients choose between their local training and their trained model."""
    out = run_pmtl(**{**SMALL, **kwargs})
    info = out["finetune_auto"]
    assert not info["signal"] and info["order"] == ["trained", "local"]
    assert "billboard_grid" not in info and "finetune_selection" not in out
    assert sum(info["clients_per_candidate"].values()) == out["num_clients"]
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


@pytest.mark.parametrize(
    ("noise_std", "clear", "order"),
    [
        (0.01, True, ["trained", "local", "billboard-finetune"]),  # 0.43 <= 0.75
        (0.025, False, ["trained", "billboard-finetune", "local"]),  # 0.75 < 1.07 <= 1.5
    ],
)
def test_finetune_auto_prefers_the_billboard_on_ties_only_with_a_clear_signal(
    noise_std, clear, order
):
    """The public tie order: the fine-tuned billboard last (preferred) where the noise of the T
    releases is at most half of T*clip, local training last where the billboard carries a weak
    signal (sigma*sqrt(kT) = noise_std * sqrt(610 * 3) against T * clip = 1.5)."""
    from privmtl.experiments.pmtl import AUTO_CLEAR_SIGNAL

    out = run_pmtl(**{**SMALL, "epsilon": None, "noise_std": noise_std})
    info = out["finetune_auto"]
    assert info["signal"] and info["clear_signal"] is clear and info["order"] == order
    assert (info["noise_norm"] <= AUTO_CLEAR_SIGNAL * info["signal_bound"]) is clear
    assert info["noise_norm"] == pytest.approx(noise_std * (610 * 3) ** 0.5)
    assert out["covered"] is True
