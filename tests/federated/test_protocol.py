"""The round-by-round protocol: resume after SIGKILL, budget stop, noise sources, saved models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import dp_accounting
import pytest
import torch
from engine_defaults import old_config

from privmtl.data.federated import FederatedDataset, make_synthetic_federated
from privmtl.exceptions import InvalidParameterError, PrivmtlWarning
from privmtl.federated import FemnistCNN, MultinomialLogReg, TrainConfig
from privmtl.federated.protocol import Trainer
from privmtl.privacy.accounting import compute_epsilon
from privmtl.privacy.ledger import reaccount
from privmtl.privacy.sampling import make_sampler

KILL_SCRIPT = Path(__file__).with_name("kill_run.py")
CFG = {
    "rounds": 4,
    "clients_per_round": 5,
    "clip": 0.5,
    "noise_std": 0.02,
    "lam": 0.01,
    "progress": False,
    "threads": 1,
    "noise_source": "seeded",
}


def _equal(a: dict[str, torch.Tensor] | None, b: dict[str, torch.Tensor] | None) -> bool:
    assert a is not None and b is not None
    return all(torch.equal(a[n], b[n]) for n in a)


@pytest.fixture(scope="module")
def femnist(femnist_dir: Path, tmp_path_factory: Any) -> tuple[Path, Path, FederatedDataset]:
    from privmtl.data.federated import load_leaf

    cache = tmp_path_factory.mktemp("leaf-cache")
    return femnist_dir, cache, load_leaf(femnist_dir, cache_dir=cache)


def _kill(femnist: Any, ckpt: Path, cfg: dict[str, Any], point: str, at: int) -> None:
    data_dir, cache, _ = femnist
    proc = subprocess.run(
        [sys.executable, str(KILL_SCRIPT), str(data_dir), str(cache), str(ckpt),
         json.dumps(cfg), point, str(at)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == -9, proc.stderr[-2000:]


@pytest.mark.shared_data
@pytest.mark.parametrize(
    ("point", "at"),
    [
        ("recorded", 0),  # before the first checkpoint: only the ledger exists
        ("message", 2),
        ("recorded", 1),
        ("recorded", 3),
        ("state_written", 2),
        ("checkpointed", 2),
    ],
)
def test_sigkill_then_resume_equals_the_uninterrupted_run(femnist, tmp_path, point, at):
    _, _, ds = femnist
    whole = Trainer(ds, FemnistCNN(random_state=0), old_config(**CFG)).run()
    _kill(femnist, tmp_path, CFG, point, at)
    resumed = Trainer(
        ds, FemnistCNN(random_state=0), old_config(**CFG), checkpoint_dir=tmp_path, resume=True
    ).run()
    assert _equal(resumed.global_params, whole.global_params)  # same billboard bits
    assert _equal(resumed.personalized_params, whole.personalized_params)
    assert resumed.test_accuracy == whole.test_accuracy
    assert resumed.epsilon == whole.epsilon
    ledger = reaccount(tmp_path)
    assert ledger["releases"] == CFG["rounds"]  # a seeded replay is not charged twice
    assert ledger["epsilon"] == pytest.approx(whole.epsilon, rel=1e-12)


@pytest.mark.shared_data
def test_secure_resume_charges_the_repeated_release(femnist, tmp_path):
    _, _, ds = femnist
    cfg = {**CFG, "noise_source": "secure"}
    _kill(femnist, tmp_path, cfg, "recorded", 2)  # round 2 recorded, maybe released, then killed
    resumed = Trainer(
        ds, FemnistCNN(random_state=0), old_config(**cfg), checkpoint_dir=tmp_path, resume=True
    ).run()
    ledger = reaccount(tmp_path)
    assert ledger["releases"] == CFG["rounds"] + 1  # round 2 drew fresh noise: released twice
    assert resumed.epsilon == pytest.approx(ledger["epsilon"], rel=1e-12)
    sampler = make_sampler("poisson", ds.n_clients, CFG["clients_per_round"])
    z = CFG["noise_std"] * CFG["clients_per_round"] / CFG["clip"]
    released = compute_epsilon(
        dp_accounting.SelfComposedDpEvent(sampler.event(z), CFG["rounds"] + 1),
        delta=min(1e-5, 1.0 / (100 * ds.n_clients)),  # the default δ, below 1/m
    )
    assert resumed.epsilon == pytest.approx(released, rel=1e-9)


# ---------------------------------------------------------------------------- fast, synthetic
@pytest.fixture(scope="module")
def data() -> FederatedDataset:
    return make_synthetic_federated(
        n_clients=12, n_features=5, n_classes=3, samples_per_client=(10, 30), random_state=0
    )


def _cfg(**kw: Any) -> TrainConfig:
    base = {**CFG, "rounds": 6, "noise_std": 0.05, "clients_per_round": 4}
    base.update(kw)
    return old_config(**base)


def _model(data: FederatedDataset) -> MultinomialLogReg:
    return MultinomialLogReg(data.n_features, data.n_classes, zero_init=False, random_state=0)


@pytest.mark.parametrize("method", ["pmtl", "fedavg", "joint-dp", "pp-sgd"])
def test_stepping_checkpointing_and_resuming_in_process(data, tmp_path, method):
    cfg = _cfg(method=method)
    whole = Trainer(data, _model(data), cfg).run()
    first = Trainer(data, _model(data), cfg, checkpoint_dir=tmp_path, checkpoint_every=2)
    assert [first.step().round for _ in range(3)] == [0, 1, 2]  # checkpoint after round 2 only
    again = Trainer(data, _model(data), cfg, checkpoint_dir=tmp_path, resume=True)
    assert again.round == 2
    rest = again.run()
    assert _equal(rest.global_params, whole.global_params)
    if whole.personalized_params is not None:
        assert _equal(rest.personalized_params, whole.personalized_params)
    assert rest.epsilon == whole.epsilon
    assert [h["round"] for h in rest.history] == list(range(6))


def test_a_checkpoint_of_another_configuration_or_an_unasked_one_is_refused(data, tmp_path):
    Trainer(data, _model(data), _cfg(rounds=2), checkpoint_dir=tmp_path).run()
    with pytest.raises(InvalidParameterError, match="--resume"):
        Trainer(data, _model(data), _cfg(rounds=2), checkpoint_dir=tmp_path)
    from privmtl.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match=r"lam: 0\.01 \(checkpoint\) vs 0\.5 \(now\)"):
        Trainer(data, _model(data), _cfg(rounds=2, lam=0.5), checkpoint_dir=tmp_path, resume=True)


def test_budget_stops_before_the_release_that_would_exceed_it(data, tmp_path):
    cfg = _cfg(rounds=40, noise_std=0.2)
    full = Trainer(data, _model(data), cfg).run()
    budget = full.epsilon / 2
    with pytest.warns(PrivmtlWarning, match="stopped on the privacy budget") as caught:
        stopped = Trainer(data, _model(data), cfg, budget_epsilon=budget).run()
    assert len(caught) == 1  # said once, not once per remaining round
    assert f"{len(stopped.history)} of 40 rounds ran" in str(caught[0].message)
    assert stopped.stopped_on_budget and not full.stopped_on_budget
    assert stopped.epsilon <= budget < full.epsilon
    assert 0 < len(stopped.history) < 40
    assert stopped.personalized_params is not None  # the models are kept


def test_secure_noise_differs_and_seeded_noise_repeats(data):
    runs = [
        Trainer(data, _model(data), _cfg(rounds=2, noise_source=src)).run()
        for src in ("secure", "secure", "seeded", "seeded")
    ]
    w = "linear.weight"
    assert not torch.equal(runs[0].global_params[w], runs[1].global_params[w])
    assert torch.equal(runs[2].global_params[w], runs[3].global_params[w])
    assert [r.noise_source for r in runs] == ["secure", "secure", "seeded", "seeded"]
    assert runs[0].epsilon == runs[2].epsilon  # the same releases are accounted


def test_message_hook_sees_messages_before_clipping_and_can_replace_them(data):
    seen: list[torch.Tensor] = []

    def canary(t, sampled, messages):  # every sampled client sends a huge update
        seen.append(messages["linear.weight"].clone())
        return {n: torch.full_like(m, 100.0) for n, m in messages.items()}

    trainer = Trainer(data, _model(data), _cfg(rounds=1, noise_std=0.0), message_hook=canary)
    before = {n: p.clone() for n, p in trainer.curator.billboard.items()}
    rec = trainer.step()
    assert rec is not None and len(seen) == 1
    step = torch.cat([(rec.released[n] - before[n]).flatten() for n in before])
    k = len(rec.sampled)
    assert float(step.norm()) == pytest.approx(CFG["clip"] * k / 4, rel=1e-5)  # clipped to γ, /q


def test_result_states_its_full_guarantee(data):
    res = Trainer(data, _model(data), _cfg(rounds=2)).run()
    g = res.guarantee
    assert (g.epsilon, g.delta) == (res.epsilon, res.delta) and g.noise_source == "seeded"
    assert (g.relation, g.sampling, g.accountant) == ("add-remove", "poisson", "rdp")
    assert "SEEDED" in g.describe()
    assert Trainer(data, _model(data), _cfg(method="local")).run().guarantee.epsilon == 0.0


def test_a_resumed_seeded_run_replays_within_its_budget(data, tmp_path):
    """Releases recorded before a kill are replayed, not refused, even with ε at the budget."""
    cfg = _cfg(rounds=6, noise_std=0.2)
    whole = Trainer(data, _model(data), cfg).run()
    first = Trainer(data, _model(data), cfg, checkpoint_dir=tmp_path, checkpoint_every=3)
    for t in range(6):  # all 6 releases recorded; killed before the checkpoint after round 5
        if t == 3:
            first.save = lambda: None  # type: ignore[method-assign]
        first.step()
    assert len(first.ledger.records) == 6
    again = Trainer(
        data, _model(data), cfg, checkpoint_dir=tmp_path, resume=True,
        budget_epsilon=whole.epsilon * (1 + 1e-9),
    )  # fmt: skip
    rest = again.run()
    assert not rest.stopped_on_budget and len(rest.history) == 6
    assert rest.epsilon == whole.epsilon


def test_ditto_billboard_is_fedavgs_and_its_personal_models_are_never_sent(data):
    """Ditto's message trains a copy of the billboard without the pull: with the same sampler,
    minibatches and seeded noise its billboard is FedAvg's, round by round; the personalized
    models are trained with the pull (after one round: the offset run's models, up to the
    rounding of the kernels, since Ditto trains them beside the copies as one model) and differ
    from anything released."""
    kw = {"lam": 0.5, "personal_init": "model"}
    ditto = Trainer(data, _model(data), _cfg(server_update="ditto", **kw))
    fedavg = Trainer(data, _model(data), _cfg(method="fedavg"))
    for a, b in zip(ditto, fedavg, strict=True):
        assert a.sampled.tolist() == b.sampled.tolist()
        for n in a.released:
            torch.testing.assert_close(a.released[n], b.released[n], rtol=0, atol=1e-6)
    assert ditto.epsilon == fedavg.epsilon
    offset = Trainer(data, _model(data), _cfg(server_update="offset", rounds=1, **kw)).run()
    first = Trainer(data, _model(data), _cfg(server_update="ditto", rounds=1, **kw)).run()
    assert first.personalized_params is not None and offset.personalized_params is not None
    for n in offset.personalized_params:
        torch.testing.assert_close(
            first.personalized_params[n], offset.personalized_params[n], rtol=0, atol=1e-6
        )
    assert not torch.allclose(
        first.global_params["linear.weight"], offset.global_params["linear.weight"]
    )
    res = ditto.result()
    assert res.personalized_params is not None
    gap = res.personalized_params["linear.weight"] - res.global_params["linear.weight"]
    assert float(gap.abs().max()) > 1e-2  # personal models are not the billboard


def test_dittos_two_trainings_in_one_pass_share_one_model_and_match_them_apart(data, monkeypatch):
    """In one pass the personal models and the billboard's copies train as one model (one
    product a step for both sets); in chunks of clients they train one after the other: the
    same releases, models and losses up to float32 rounding."""
    import privmtl.federated.client as client_module

    calls = []
    joint = client_module.logreg_sets_step
    monkeypatch.setattr(
        client_module, "logreg_sets_step", lambda *a: calls.append(a[2].shape[2]) or joint(*a)
    )
    kw = {"server_update": "ditto", "lam": 0.5, "personal_init": "model", "local_epochs": 2}
    together = Trainer(data, _model(data), _cfg(**kw))
    apart = Trainer(data, _model(data), _cfg(client_chunk=3, **kw))
    for a, b in zip(together, apart, strict=True):
        for n in a.released:
            torch.testing.assert_close(a.released[n], b.released[n], rtol=0, atol=1e-5)
        assert a.record["train_loss"] == pytest.approx(b.record["train_loss"], abs=1e-6)
    assert calls and set(calls) == {2}  # the one pass took the joint step, two sets a step
    ra, rb = together.result(), apart.result()
    assert ra.personalized_params is not None and rb.personalized_params is not None
    for n in rb.personalized_params:
        torch.testing.assert_close(
            ra.personalized_params[n], rb.personalized_params[n], rtol=0, atol=1e-5
        )
    for n in rb.global_params:
        torch.testing.assert_close(ra.global_params[n], rb.global_params[n], rtol=0, atol=1e-5)


def test_a_rounds_train_function_is_freed_without_the_garbage_collector(data):
    """The train function a round hands its method (with its ``sets`` attribute) is in no
    reference cycle: it and the round's rows it holds go when the round drops it, not at the
    collector's next full pass (the rounds' rows would pile up until then, and the end of run's
    forked workers would inherit them)."""
    import gc
    import weakref

    import numpy as np

    tr = Trainer(data, _model(data), _cfg(server_update="ditto", lam=0.5))
    sampled = np.array([0, 2, 3])
    gc.collect()
    gc.disable()
    try:
        train = tr._train_fn(sampled, 0, None, None)
        assert callable(getattr(train, "sets", None))
        gone = weakref.ref(train)
        del train
        assert gone() is None
    finally:
        gc.enable()


def test_ditto_with_partial_sharing_batched_equals_reference(data):
    """The billboard copy takes the shared parameters from the billboard and the personal ones
    from the client's own model; only the shared part is released (both training paths)."""
    kw = {"server_update": "ditto", "shared_params": ("linear.bias",), "personal_init": "model"}
    a = Trainer(data, _model(data), _cfg(**kw)).run()
    b = Trainer(data, _model(data), _cfg(batched=False, **kw)).run()
    assert set(a.global_params) == {"linear.bias", "linear.weight"}
    init = _model(data).linear.weight.detach()
    assert torch.equal(a.global_params["linear.weight"], init)  # never released, never moved
    assert a.personalized_params is not None and b.personalized_params is not None
    for n in a.personalized_params:
        torch.testing.assert_close(a.personalized_params[n], b.personalized_params[n])
    torch.testing.assert_close(a.global_params["linear.bias"], b.global_params["linear.bias"])
    offset = Trainer(data, _model(data), _cfg(**{**kw, "server_update": "offset"})).run()
    gap = a.global_params["linear.bias"] - offset.global_params["linear.bias"]
    assert float(gap.abs().max()) > 1e-4
