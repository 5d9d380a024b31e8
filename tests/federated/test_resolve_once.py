"""A run is resolved once: ``privmtl pmtl`` and Flower's ServerApp call the one resolution
(:func:`privmtl.federated.config.resolve`) exactly once per run, and a resolved run is a type of
its own that cannot be resolved again."""

from __future__ import annotations

import json

import pytest

import privmtl.federated.config as config_module
from privmtl.cli import main
from privmtl.data.federated import make_synthetic_federated
from privmtl.exceptions import InvalidParameterError
from privmtl.experiments.pmtl import make_model
from privmtl.federated.config import ResolvedRun, TrainConfig, resolve
from privmtl.federated.spec import SPEC, RunSpec
from privmtl.flower._core import run_options
from privmtl.flower.node_clients import NodeClients
from privmtl.flower.server_run import ServerRun


@pytest.fixture
def counted(monkeypatch):
    """Count the data-dependent resolutions (spec defaults, and the engine's q, λ, δ and σ)."""
    calls = {"defaults": 0, "engine": 0}
    defaults, engine = config_module.resolve_defaults, config_module._resolve_engine

    def count_defaults(*a, **k):
        calls["defaults"] += 1
        return defaults(*a, **k)

    def count_engine(*a, **k):
        calls["engine"] += 1
        return engine(*a, **k)

    monkeypatch.setattr(config_module, "resolve_defaults", count_defaults)
    monkeypatch.setattr(config_module, "_resolve_engine", count_engine)
    return calls


@pytest.mark.parametrize("privacy", [["--epsilon", "2"], ["--noise-std", "0.01"], []])
def test_privmtl_pmtl_resolves_its_run_once(counted, capsys, privacy):
    args = [
        "pmtl",
        "--data",
        "synthetic",
        "--rounds",
        "2",
        "--clients-per-round",
        "5",
        "--finetune",
        "none",
    ]
    assert main([*args, *privacy, "--reproducible-noise", "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["rounds"] == 2
    assert counted == {"defaults": 1, "engine": 1}


@pytest.mark.parametrize("method", ["fedavg", "local", "local-all", "joint-dp", "pp-sgd"])
def test_every_method_of_run_pmtl_resolves_its_run_once(counted, method):
    """The whole-run methods (joint-dp, pp-sgd) take the run's resolution along too."""
    from privmtl.experiments.pmtl import run_pmtl

    private = {} if method.startswith("local") else {"epsilon": 2.0}
    run_pmtl(
        data="synthetic", num_clients=12, model="logreg", rounds=2, clients_per_round=4,
        method=method, finetune="none", show_progress=False, threads=1, baseline=False,
        noise_source="seeded", **private,
    )  # fmt: skip
    assert counted == {"defaults": 1, "engine": 1}


def test_the_flower_serverapp_resolves_its_run_once(counted):
    ds = make_synthetic_federated(random_state=0)
    opts = run_options({"rounds": 2, "clients-per-round": 5, "epsilon": 2.0, "seed": 1})
    node = NodeClients(ds, make_model("logreg", ds, 1), partition_id=0, num_partitions=1)
    run = ServerRun({**opts, "noise-source": "seeded"}, node.init, ds.n_clients)
    while not run.finished:
        sampled = run.curator.sample_round()
        board = {n: p.clone() for n, p in run.curator.billboard.items()}
        msgs, losses = node.train(
            [int(k) for k in sampled], board, run.curator.round, run.config, key=run.round_key()
        )
        run.release(sampled, {int(k): {n: p[j] for n, p in msgs.items()}
                              for j, k in enumerate(sampled)}, list(losses), 0.0)  # fmt: skip
    run.finish()
    out = run.result_dict([node.evaluate(run.curator.billboard, run.finish_settings())], 0.0)
    assert out["config"]["epsilon"] == 2.0
    assert counted == {"defaults": 1, "engine": 1}


def test_a_resolved_run_is_not_resolved_again():
    run = resolve(RunSpec(rounds=2, epsilon=1.0), 30)
    assert isinstance(run, ResolvedRun) and not isinstance(run, RunSpec | TrainConfig)
    assert run.config.noise_std == 0 and run.target is not None  # the release calibrates σ
    assert run.spec is not None and run.spec.delta == pytest.approx(min(1e-5, 1 / 3000))
    with pytest.raises(InvalidParameterError, match=r"'settings'.*ResolvedRun"):
        resolve(run, 30)  # type: ignore[arg-type]


def test_resolving_a_spec_equals_resolving_its_engine_config():
    """The spec path and the engine-config path give the same engine configuration."""
    from privmtl.federated.config import train_config
    from privmtl.federated.spec import resolve_defaults

    spec = SPEC.replace(rounds=3, epsilon=2.0)
    by_spec = resolve(spec, 40).config
    by_config = resolve(train_config(resolve_defaults(spec, 40)), 40).config
    assert by_spec == by_config
