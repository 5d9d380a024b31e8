"""One run spec: every entry point's defaults are the spec's, its constraints are checked once,
the resolved spec is every result's ``config``, and seeded runs are unchanged by it."""

from __future__ import annotations

import dataclasses
import inspect

import click
import pytest

from privmtl.cli import main
from privmtl.cli.flower import local as flower_local
from privmtl.cli.pmtl import pmtl as pmtl_command
from privmtl.cli.pmtl import pmtl_sweep as sweep_command
from privmtl.data.federated import make_synthetic_federated
from privmtl.exceptions import InvalidParameterError
from privmtl.experiments.pmtl import run_pmtl
from privmtl.experiments.pmtl_sweep import run_pmtl_sweep
from privmtl.federated.spec import (
    SPEC,
    RunSpec,
    default_clients_per_round,
    default_lam,
    resolve_defaults,
)
from privmtl.flower._core import (
    FLOWER_FIXED,
    NONE,
    NOT_GIVEN,
    RUN_DEFAULTS,
    run_options,
    run_spec,
)

FIELDS = [f.name for f in dataclasses.fields(RunSpec)]


def _click_defaults(command: click.Command) -> dict[str, object]:
    """The options' defaults as the command sees them (None for an option without one)."""
    ctx = click.Context(command)
    unset = getattr(click.core, "UNSET", None)  # click >= 8.2 marks "no default" so
    out = {p.name: p.get_default(ctx) for p in command.params if p.name is not None}
    return {n: None if unset is not None and v is unset else v for n, v in out.items()}


def _shared_defaults(defaults: dict[str, object]) -> dict[str, object]:
    """The entry point's defaults of the spec's settings (by the spec's names)."""
    return {name: defaults[name] for name in FIELDS if name in defaults}


def _differing(defaults: dict[str, object]) -> dict[str, tuple[object, object]]:
    shared = _shared_defaults(defaults)
    return {n: (v, getattr(SPEC, n)) for n, v in shared.items() if v != getattr(SPEC, n)}


def test_run_pmtl_keywords_are_the_spec():
    from privmtl.federated.options import PMTL_PARAMETERS

    # every setting of the spec is a keyword of run_pmtl, whose default is the spec's own
    assert {n for n, part in PMTL_PARAMETERS.items() if part is RunSpec} == set(FIELDS)
    assert list(inspect.signature(run_pmtl).parameters) == ["spec", "settings"]


def test_privmtl_pmtl_click_defaults_are_the_spec():
    defaults = _click_defaults(pmtl_command)
    assert _differing(defaults) == {}
    flags = {"reproducible_noise", "paper_delta"}  # noise_source and delta's flags
    missing = set(FIELDS) - set(defaults)
    assert missing == {"noise_source"}, missing
    assert all(defaults[f] is False for f in flags)
    assert SPEC.noise_source == "secure" and SPEC.delta is None


def test_pmtl_sweep_defaults_are_the_spec():
    defaults = _click_defaults(sweep_command)
    defaults["lam"] = defaults.pop("lams")  # a grid; None: the spec's λ rule
    assert _differing(defaults) == {}
    assert len(_shared_defaults(defaults)) >= 5
    assert defaults["reproducible_noise"] is False and SPEC.noise_source == "secure"
    # the grids searched by default contain the spec's value
    assert SPEC.clip in [float(v) for v in str(defaults["clips"]).split(",")]
    assert SPEC.rounds in [int(v) for v in str(defaults["rounds_grid"]).split(",")]
    sig = {n: p.default for n, p in inspect.signature(run_pmtl_sweep).parameters.items()}
    assert _differing(sig) == {}
    assert {"lam", "lr", "finetune", "server_update", "noise_source"} <= set(sig)


def test_flower_local_click_defaults_are_the_spec():
    defaults = _click_defaults(flower_local)
    assert _differing(defaults) == {}
    assert {"rounds", "clip", "lr", "batch_size", "server_update", "seed"} <= set(defaults)
    assert defaults["clients_per_round"] is None and defaults["lam"] is None
    assert defaults["reproducible_noise"] is False and defaults["paper_delta"] is False


def _spec_defaults_of(command: click.Command) -> dict[str, object]:
    """Every setting of the spec as the command's options default it (by the spec's names)."""
    defaults = _click_defaults(command)
    out = _shared_defaults(defaults)
    if "reproducible_noise" in defaults:
        out["noise_source"] = "seeded" if defaults["reproducible_noise"] else "secure"
    if defaults.get("paper_delta"):
        out["delta"] = "paper"
    return out


@pytest.mark.parametrize("command", [pmtl_command, flower_local], ids=["pmtl", "flower-local"])
def test_every_setting_of_the_spec_is_an_option_of_both_clis_at_the_spec_default(command):
    defaults = _spec_defaults_of(command)
    assert set(defaults) == set(FIELDS)  # the list comes from RunSpec: a new field is covered
    assert {n: (v, getattr(SPEC, n)) for n, v in defaults.items() if v != getattr(SPEC, n)} == {}


def test_the_spec_options_are_declared_once_from_the_spec():
    from privmtl._validation import Options
    from privmtl.cli._spec_options import SPEC_HELP

    assert set(SPEC_HELP) == set(FIELDS)
    by_cmd = [{p.name: p for p in c.params} for c in (pmtl_command, flower_local)]
    flags = {"noise_source": "reproducible_noise"}
    for name in [*FIELDS, "paper_delta"]:
        pmtl_opt, flower_opt = (params[flags.get(name, name)] for params in by_cmd)
        assert isinstance(pmtl_opt, click.Option) and isinstance(flower_opt, click.Option)
        assert pmtl_opt.opts == flower_opt.opts, name
        assert pmtl_opt.secondary_opts == flower_opt.secondary_opts, name
        assert type(pmtl_opt.type) is type(flower_opt.type), name
        assert pmtl_opt.default == flower_opt.default, name
        if name in SPEC_HELP:  # one text; a command may add a sentence of its own
            assert pmtl_opt.help == SPEC_HELP[name], name
            assert str(flower_opt.help).startswith(SPEC_HELP[name]), name
        # the choices are the spec's constraint table's
        constraint = RunSpec._parameter_constraints.get(name)
        if isinstance(constraint, Options) and name != "noise_source":  # a pair of flags
            assert isinstance(pmtl_opt.type, click.Choice), name
            assert list(pmtl_opt.type.choices) == list(constraint.values), name
            assert list(flower_opt.type.choices) == list(constraint.values), name


def test_flower_run_defaults_are_the_spec():
    by_name = {k.replace("-", "_"): v for k, v in RUN_DEFAULTS.items()}
    given = _shared_defaults(by_name)
    # "not given" is one encoding, the empty string, of every setting whose default is None
    # (no number stands in for None): the spec's rule decides
    assert by_name["clients_per_round"] == by_name["lam"] == NONE == ""
    assert by_name["epsilon"] == by_name["noise_std"] == NONE and by_name["paper_delta"] is False
    assert by_name["local_steps"] == NONE and SPEC.local_steps is None  # one local epoch
    # every setting of the spec is a run-configuration key; a None default is encoded
    assert set(FIELDS) <= set(by_name)
    assert {n: by_name[n] for n in NOT_GIVEN} == NOT_GIVEN
    assert set(NOT_GIVEN) == {n for n in FIELDS if getattr(SPEC, n) is None}
    assert set(NOT_GIVEN.values()) == {NONE}
    plain = {n: v for n, v in given.items() if n not in NOT_GIVEN}
    assert {n: v for n, v in plain.items() if v != getattr(SPEC, n)} == {}
    assert len(plain) >= 10
    # what the Flower run resolves equals the spec's resolution: it takes every setting
    assert FLOWER_FIXED == {}
    for m, private in ((3, False), (50, True), (200, True)):
        opts = run_options({"epsilon": 2.0} if private else {})
        expected = resolve_defaults(SPEC.replace(epsilon=2.0 if private else None), m)
        assert run_spec(opts, m) == expected
    # every setting by its RunSpec name, None as "not given"; a method Flower lacks is refused
    given = {"personal_init": "billboard", "finetune": "mr", "shared_params": ["linear.weight"],
             "delta": "paper", "subspace_dim": 5, "lam": None, "server_optimizer": "adam"}  # fmt: skip
    assert run_spec(run_options(given), 50) == resolve_defaults(SPEC.replace(**given), 50)
    with pytest.raises(InvalidParameterError, match="'method'"):
        run_spec(run_options({"method": "pp-sgd"}), 50)
    with pytest.raises(InvalidParameterError, match="'personal_init'"):
        run_spec(run_options({"personal-init": "nowhere"}), 50)


def test_sampling_all_reports_the_clients_it_samples():
    # every client takes part: the q reported (and accounted) is m, never a smaller default
    assert resolve_defaults(SPEC.replace(sampling="all"), 50).clients_per_round == 50
    assert (
        resolve_defaults(SPEC.replace(sampling="all", clients_per_round=50), 50).sampling == "all"
    )
    with pytest.raises(InvalidParameterError, match=r"'clients_per_round'.*m=8.*'all'.*got 4"):
        resolve_defaults(SPEC.replace(sampling="all", clients_per_round=4), 8)


def test_resolution_of_the_data_dependent_defaults():
    for m in (1, 5, 20, 21, 500):
        r = resolve_defaults(SPEC, m)
        assert r.clients_per_round == min(20, m) == default_clients_per_round(m)
        assert r.delta == min(1e-5, 1.0 / (100 * m))
        assert r.sampling == ("all" if min(20, m) == m else "poisson")
    assert resolve_defaults(SPEC, 50).lam == 1.0
    assert resolve_defaults(SPEC.replace(epsilon=1.0), 50).lam == 0.001
    assert resolve_defaults(SPEC.replace(noise_std=0.1), 50).lam == 0.001
    assert (
        resolve_defaults(SPEC.replace(method="fedprox"), 50).lam
        == 0.01
        == default_lam("fedprox", private=True)
    )
    assert resolve_defaults(SPEC.replace(delta="paper"), 40).delta == 1.0 / 40
    assert resolve_defaults(SPEC.replace(method="local-all"), 50).clients_per_round == 50
    # personal_init "auto": billboard when one release's noise norm sigma*sqrt(k) <= clip
    assert resolve_defaults(SPEC, 50, noise_std=0.05, released_dim=100).personal_init == (
        "billboard"  # 0.05 * 10 = 0.5 <= 0.5
    )
    assert resolve_defaults(SPEC, 50, noise_std=0.051, released_dim=100).personal_init == "model"
    assert resolve_defaults(SPEC, 50).personal_init == "auto"
    with pytest.raises(InvalidParameterError, match=r"'clients_per_round'.*m=5.*got 6"):
        resolve_defaults(SPEC.replace(clients_per_round=6), 5)


BAD = {
    "method": "sgd",
    "server_update": "mean",
    "clip": 0.0,
    "clients_per_round": 0,
    "lam": -0.5,
    "personal_init": "zeros",
    "lr": 0.0,
    "batch_size": 0,
    "rounds": 0,
    "local_steps": 0,
    "local_epochs": 0,
    "epsilon": -1.0,
    "noise_std": -0.25,
    "delta": 1.5,
    "sampling": "uniform",
    "groups": 0,
    "noise_mechanism": "correlated",
    "accountant": "gdp",
    "relation": "swap",
    "finetune": "twice",
    "noise_source": "urandom",
    "seed": -3,
    "server_optimizer": "sgd",
    "server_lr": -1.0,
    "server_momentum": 1.0,
    "head_epochs": 0,
    "subspace_dim": 0,
    "adaptive_clip_quantile": 1.0,
    "adaptive_clip_lr": 0.0,
    "adaptive_clip_noise": 0.0,
}


def test_every_declared_constraint_has_a_rejected_value():
    assert set(BAD) == set(RunSpec._parameter_constraints)
    assert set(RunSpec._parameter_constraints) == set(FIELDS) - {"shared_params"}


@pytest.mark.parametrize("name", sorted(BAD))
def test_constraint_table_rejects_a_bad_value_naming_the_parameter(name):
    with pytest.raises(InvalidParameterError) as err:
        RunSpec(**{name: BAD[name]})
    msg = str(err.value)
    assert f"'{name}'" in msg and repr(BAD[name]) in msg


def test_cross_constraints_and_shared_params():
    with pytest.raises(InvalidParameterError, match="'epsilon' and 'noise_std'"):
        RunSpec(epsilon=1.0, noise_std=0.1)
    with pytest.raises(InvalidParameterError, match="'local_steps' and 'local_epochs'"):
        RunSpec(local_steps=2, local_epochs=1)
    with pytest.raises(InvalidParameterError, match="'shared_params'"):
        RunSpec(shared_params="fc")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="'delta'"):
        RunSpec(delta="papr")
    assert RunSpec(shared_params=["fc"]).shared_params == ("fc",)  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        SPEC.clip = 1.0  # type: ignore[misc]


def test_cli_exits_2_naming_the_parameter(capsys):
    rc = main(["pmtl", "--data", "synthetic", "--model", "logreg", "--lr", "0", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "'lr'" in err[0]


def test_config_of_a_run_is_the_resolved_spec():
    ds = make_synthetic_federated(n_clients=12, random_state=0)
    given = {"epsilon": 2.0, "rounds": 2, "finetune": "none", "seed": 1, "noise_source": "seeded"}
    out = run_pmtl(data="synthetic", dataset=ds, model="logreg", show_progress=False, **given)
    dim = (ds.n_features + 1) * ds.n_classes  # logreg: weights and biases, all shared
    expected = resolve_defaults(
        RunSpec(**given), ds.n_clients, noise_std=out["noise_std"], released_dim=dim
    )
    assert out["config"] == expected.to_dict()
    assert list(out["config"]) == FIELDS
    assert out["config"]["clients_per_round"] == 12 and out["config"]["sampling"] == "all"
    assert out["config"]["lam"] == 0.001 and out["config"]["delta"] == 1e-5
    # the result's own keys agree with its config
    for key in ("clip", "rounds", "lam", "lr", "server_update", "personal_init", "noise_source"):
        assert out[key] == out["config"][key], key
    # the config runs again as it is, to the same result
    again = run_pmtl(
        data="synthetic", dataset=ds, model="logreg", show_progress=False, **out["config"]
    )
    assert again["config"] == out["config"]
    assert again["test_accuracy"] == out["test_accuracy"]


# Seeded runs recorded on the commit before the run spec existed: the spec must not change any
# result. Synthetic data (12 clients), logreg, 3 rounds, seeded noise, one thread.
# The accuracies after finetune="auto" (test, mean client, validation of the two auto cases) were
# re-recorded when auto's per-client rule changed from the lowest validation loss to the most
# correct validation predictions. Every accuracy was re-recorded when the synthetic federation's
# clients moved to their own random streams, and again when a client's stream came to draw its
# splits in turn (float32 features, no permutation), and again when the local training's
# minibatch plan came from one keyed hash per round and the logistic step's kernels changed (its
# gradients' last bits), and again when a client's normals came from a table of 2^16 normal
# quantiles: other examples and minibatches, the same sizes, so ε and σ are those recorded before
# the spec.
BEFORE = {
    "pmtl_eps": (
        {"method": "pmtl", "epsilon": 2.0, "server_update": "ditto", "clip": 0.5,
         "clients_per_round": 6, "lam": 0.001, "personal_init": "auto", "finetune": "none"},
        {"epsilon": 2.0, "noise_std": 0.17194506012952507, "test_accuracy": 0.2097902097902098,
         "mean_client_accuracy": 0.18801761104392686, "val_accuracy": 0.19444444444444445,
         "global_test_accuracy": 0.04895104895104895, "personal_init": "model"},
    ),
    "pmtl_offset": (
        {"method": "pmtl", "noise_std": 0.05, "server_update": "offset", "clip": 1.0,
         "clients_per_round": 5, "lam": 0.1, "personal_init": "model", "finetune": "none"},
        {"epsilon": 50.57123519373476, "noise_std": 0.05, "test_accuracy": 0.2062937062937063,
         "mean_client_accuracy": 0.1871018601281759, "val_accuracy": 0.19444444444444445,
         "global_test_accuracy": 0.11538461538461539, "personal_init": "model"},
    ),
    "fedavg_auto": (
        {"method": "fedavg", "epsilon": 4.0, "server_update": "ditto", "clip": 0.5,
         "clients_per_round": 6, "lam": 0.01, "personal_init": "auto", "finetune": "auto"},
        {"epsilon": 3.9999999999994538, "noise_std": 0.1051656385272594,
         "test_accuracy": 0.6433566433566433, "mean_client_accuracy": 0.35439951130740605,
         "val_accuracy": 0.7129629629629629, "global_test_accuracy": 0.06993006993006994,
         "personal_init": "model"},
    ),
    # every other setting at its default: what `privmtl pmtl --data synthetic --model logreg
    # --num-clients 12 --rounds 3 --epsilon 2 --clients-per-round 6 --reproducible-noise` gave
    "defaults": (
        {"epsilon": 2.0, "clients_per_round": 6},
        {"epsilon": 1.9999999999997666, "noise_std": 0.1951287707192182,
         "test_accuracy": 0.6433566433566433, "mean_client_accuracy": 0.35439951130740605,
         "val_accuracy": 0.7222222222222222, "global_test_accuracy": 0.045454545454545456,
         "personal_init": "model", "delta": 1e-05, "lam": 0.001},
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BEFORE))
def test_seeded_runs_are_bit_for_bit_those_before_the_spec(case):
    options, expected = BEFORE[case]
    explicit = {} if case == "defaults" else {
        "lr": 0.1, "batch_size": 10, "sampling": "poisson", "accountant": "rdp",
        "relation": "add-remove", "delta": 1e-4,
    }  # fmt: skip
    out = run_pmtl(
        data="synthetic",
        num_clients=12,
        model="logreg",
        rounds=3,
        seed=0,
        noise_source="seeded",
        show_progress=False,
        threads=1,
        **explicit,
        **options,
    )
    assert {k: out[k] for k in expected} == expected


def test_privmtl_pmtl_json_prints_the_resolved_spec_as_config(capsys):
    import json

    argv = ["pmtl", "--data", "synthetic", "--model", "logreg", "--num-clients", "8", "--rounds",
            "2", "--epsilon", "2", "--finetune", "none", "--reproducible-noise", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["config"]) == FIELDS
    assert out["config"]["clients_per_round"] == 8 and out["config"]["sampling"] == "all"
    assert out["config"]["lam"] == 0.001 and out["config"]["delta"] == min(1e-5, 1 / 800)
    assert out["config"]["server_update"] == SPEC.server_update


def test_flower_config_with_the_earlier_defaults_given_is_the_earlier_one():
    """Flower's engine config is what the code before the spec built (then its seeded runs are
    too): the earlier defaults (delta message, λ 0.1, 6 clients, 3 rounds, clients starting from
    the initial model, no fine-tuning) given explicitly."""
    from privmtl.federated.baselines import config_for_epsilon
    from privmtl.federated.config import TrainConfig
    from privmtl.flower._core import make_config

    earlier = {"rounds": 3, "clients-per-round": 6, "lam": 0.1, "server-update": "delta",
               "seed": 3, "noise-source": "seeded", "local-steps": 3,
               "personal-init": "model", "finetune": "none"}  # fmt: skip
    # q = m = 5 given as such: clients per round above m is an error on Flower as everywhere
    for m, extra in (
        (50, {"noise-std": 0.05}),
        (40, {"epsilon": 2.0}),
        (5, {"clients-per-round": 5}),
    ):
        cfg, sigma = make_config(run_options({**earlier, **extra}), m)
        q = min(6, m)
        old = TrainConfig(
            method="pmtl", rounds=3, clients_per_round=q, local_steps=3, batch_size=10, lr=0.1,
            lam=0.1, clip=0.5, noise_std=float(extra.get("noise-std", 0.0)), personal_init="model",
            sampling="all" if q == m else "poisson", seed=3, delta=min(1e-5, 1 / (100 * m)),
            accountant="rdp", relation="add-remove", batched=True, progress=False,
            server_update="delta", threads=1, noise_source="seeded",
        )  # fmt: skip
        if "epsilon" in extra:
            old = config_for_epsilon(old, m, 2.0)
        assert cfg == old and sigma == old.noise_std
    with pytest.raises(InvalidParameterError, match=r"'clients_per_round'.*m=5"):
        make_config(run_options(earlier), 5)


def test_saved_models_record_the_resolved_spec(tmp_path):
    import json

    ds = make_synthetic_federated(n_clients=6, random_state=0)
    out = run_pmtl(
        data="synthetic", dataset=ds, model="logreg", rounds=1, noise_std=0.1, finetune="none",
        noise_source="seeded", show_progress=False, save_models=tmp_path / "m",
    )  # fmt: skip
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    assert meta["run"]["config"] == out["config"]
    assert RunSpec(**meta["run"]["config"]) == resolve_defaults(
        RunSpec(rounds=1, noise_std=0.1, finetune="none", noise_source="seeded"),
        6,
        noise_std=0.1,
        released_dim=(ds.n_features + 1) * ds.n_classes,
    )
