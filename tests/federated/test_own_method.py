"""A user's own method runs in process with privmtl's release, accounting and ledger."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from privmtl.data.federated import make_synthetic_federated
from privmtl.exceptions import InvalidParameterError
from privmtl.experiments.pmtl import run_pmtl
from privmtl.federated import TrainConfig
from privmtl.federated.methods import ClientStep, Method, get_method, register_method
from privmtl.federated.protocol import Trainer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_method.py"
SMALL = {"data": "synthetic", "num_clients": 12, "rounds": 3, "finetune": "none"}


class DampedFedAvg(Method):
    """Written here, not in privmtl: FedAvg whose message is half the trained change."""

    name: ClassVar[str] = "test-damped-fedavg"
    start: ClassVar[str] = "global"
    personalized: ClassVar[bool] = False

    def client_update(self, billboard, shared, starts, anchor, train):
        news, losses = train(starts, self.rule(anchor))
        messages = {n: 0.5 * (news[n] - billboard[n]) for n in shared}
        return ClientStep(news, messages, losses)


def test_own_method_runs_in_process_within_the_target_epsilon():
    out = run_pmtl(method=DampedFedAvg, epsilon=1.0, show_progress=False, **SMALL)
    assert out["method"] == "test-damped-fedavg"
    assert out["config"]["method"] == "test-damped-fedavg"
    # ε from the ledger's releases, at most the target
    assert 0.0 < out["epsilon"] <= 1.0 + 1e-9
    assert out["guarantee"]["private"] is True
    assert out["guarantee"]["details"]["releases"] == 3


def test_own_method_changes_the_billboard_as_it_declares():
    """The engine calls the method's client half: its halved message halves the first step."""
    ds = make_synthetic_federated(n_clients=6, random_state=1)
    torch.manual_seed(0)
    net = torch.nn.Linear(ds.n_features, ds.n_classes)
    cfg = TrainConfig(
        rounds=1, clients_per_round=6, sampling="all", clip=None, noise_source="seeded",
        progress=False, method="fedavg",
    )  # fmt: skip
    init = {n: p.detach().clone() for n, p in net.named_parameters()}
    full = Trainer(ds, net, cfg).run().global_params
    register_method(DampedFedAvg)
    own_cfg = TrainConfig(**{**cfg.to_dict(), "method": DampedFedAvg.name})
    half = Trainer(ds, net, own_cfg).run().global_params
    for n in init:
        torch.testing.assert_close(half[n] - init[n], 0.5 * (full[n] - init[n]))


def test_own_method_instance_keeps_its_settings():
    register_method(DampedFedAvg)
    cfg = TrainConfig(method=DampedFedAvg.name, progress=False)
    proto = DampedFedAvg(cfg)
    bound = get_method(proto, TrainConfig(method=DampedFedAvg.name, lr=0.5, progress=False))
    assert isinstance(bound, DampedFedAvg) and bound is not proto and bound.config.lr == 0.5


def test_own_method_may_not_take_a_name_of_ours():
    class Fake(Method):
        name: ClassVar[str] = "pmtl"

    with pytest.raises(InvalidParameterError, match="must not be one of privmtl's methods"):
        register_method(Fake)
    with pytest.raises(InvalidParameterError, match="'method' parameter"):
        get_method(object(), TrainConfig(progress=False))  # type: ignore[arg-type]


def test_example_method_from_its_file_records_the_source(tmp_path):
    out = run_pmtl(method=f"{EXAMPLE}:OwnMethod", epsilon=1.0, show_progress=False, **SMALL)
    assert out["method"] == "own-mixture" and out["epsilon"] <= 1.0 + 1e-9
    import hashlib

    sha = hashlib.sha256(EXAMPLE.read_text(encoding="utf-8").encode()).hexdigest()
    assert out["method_source"]["sha256"] == sha
    assert out["method_source"]["class"] == "OwnMethod"
    json.dumps(out["method_source"])


def test_cli_runs_the_example_method_and_refuses_a_missing_file(capsys, tmp_path):
    from privmtl.cli import main

    args = ["pmtl", "--method", f"{EXAMPLE}:OwnMethod", "--data", "synthetic", "--model", "logreg", "--epsilon", "1",
            "--num-clients", "12", "--rounds", "2", "--finetune", "none", "--json"]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "own-mixture" and out["epsilon"] <= 1.0 + 1e-9
    missing = str(tmp_path / "nope.py") + ":Nope"
    code = main(["pmtl", "--method", missing, "--data", "synthetic", "--model", "logreg", "--json"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--method" in err and "file not found" in err
    assert len(err.splitlines()) == 1


def test_a_result_of_an_own_method_reruns_as_config(capsys, tmp_path, monkeypatch):
    """Its result is signed and names the method's file: this user's --config reruns it; an
    unsigned copy needs --method FILE:NAME again or --trust-code; its model.json too."""
    from privmtl.cli import main

    monkeypatch.chdir(tmp_path)
    spec = f"{EXAMPLE}:OwnMethod"
    args = ["pmtl", "--method", spec, "--data", "synthetic", "--model", "logreg", "--epsilon",
            "1", "--num-clients", "12", "--rounds", "2", "--finetune", "none", "--seed", "3",
            "--reproducible-noise", "--threads", "1", "--json"]  # fmt: skip
    assert main([*args, "--save-models", "M"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["signature"].startswith("hmac-sha256:")
    Path("a.json").write_text(json.dumps(first))
    unsigned = {k: v for k, v in first.items() if k != "signature"}
    Path("u.json").write_text(json.dumps(unsigned))

    def rerun(*argv):
        rc = main(["pmtl", "--config", *argv, "--threads", "1", "--json"])
        cap = capsys.readouterr()
        return rc, cap

    for argv in (["a.json"], ["M/model.json"], ["u.json", "--trust-code"],
                 ["u.json", "--method", spec]):  # fmt: skip
        rc, cap = rerun(*argv)
        assert rc == 0, (argv, cap.err)
        again = json.loads(cap.out)
        assert again["method"] == "own-mixture" and again["config"] == first["config"], argv
        assert again["test_accuracy"] == first["test_accuracy"], argv
        assert again["method_source"]["sha256"] == first["method_source"]["sha256"]
    rc, cap = rerun("u.json")
    err = cap.err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "did not sign" in err[0] and "--method" in err[0]
