"""Banded matrix-factorization noise in the PMTL engine, and cyclic participation.

The released noise is checked against the dense oracle C^{-1} z (the same seeded draws), the
ledger's ε against banded_epsilon computed independently, the cyclic sampler against its public
rule, and every refusal for its message. Default (independent) runs are covered by the existing
pin tests.
"""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
import torch
from scipy.linalg import solve_triangular

from privmtl.exceptions import InvalidParameterError, PrivacyBudgetError
from privmtl.federated.config import TrainConfig
from privmtl.federated.curator import Curator
from privmtl.federated.spec import RunSpec, check_resume, resolve_clients_per_round
from privmtl.privacy.accounting import compute_epsilon
from privmtl.privacy.ledger import PrivacyLedger, reaccount
from privmtl.privacy.matrix_factorization import (
    BandedStrategy,
    CyclicParticipation,
    banded_epsilon,
    run_strategy,
)
from privmtl.privacy.noise import make_noise_source
from privmtl.privacy.release import (
    BANDED_ROUND_MECHANISM,
    BANDED_RUN_MECHANISM,
    GaussianMeanRelease,
)
from privmtl.privacy.sampling import CyclicSampler, make_sampler

M, GROUPS, T, CLIP, SIGMA, DELTA = 7, 3, 6, 0.5, 0.8, 1e-5
SHAPES = {"w": (3, 2), "b": (2,)}


def _release(groups: int = GROUPS, rounds: int = T) -> GaussianMeanRelease:
    sampler = make_sampler("cyclic" if groups > 1 else "all", M, groups=groups)
    return GaussianMeanRelease(
        clip=CLIP, noise_std=SIGMA, sampler=sampler, strategy=run_strategy(rounds, groups)
    )


def _curator(ledger=None, seed: int = 5, groups: int = GROUPS) -> Curator:
    board = {n: torch.zeros(s) for n, s in SHAPES.items()}
    return Curator(_release(groups), board, noise=make_noise_source("seeded", seed), ledger=ledger)


def _zero_round(cur: Curator):
    """One round of zero messages: the released value is the noise alone."""
    rows = cur.sample_round()
    msgs = {n: torch.zeros((len(rows), *s)) for n, s in SHAPES.items()}
    return rows, cur.release(msgs)


# ------------------------------------------------------------------------------ cyclic sampler
def test_cyclic_sampler_takes_group_t_mod_b():
    s = make_sampler("cyclic", 10, groups=3)
    assert isinstance(s, CyclicSampler) and s.kind == "cyclic"
    assert s.clients_per_round == 4  # the largest group: ceil(10 / 3)
    rng = np.random.default_rng(0)
    for t in range(7):
        assert np.array_equal(s.sample_at(rng, t), np.arange(t % 3, 10, 3))
    seen = np.concatenate([s.sample_at(rng, t) for t in range(3)])
    assert np.array_equal(np.sort(seen), np.arange(10))  # every client exactly once per cycle
    with pytest.raises(InvalidParameterError, match="sample_at"):
        s.sample(rng)


def test_curator_samples_the_cyclic_group_of_its_round():
    cur = _curator()
    for t in range(T):
        rows, _ = _zero_round(cur)
        assert np.array_equal(rows, np.arange(t % GROUPS, M, GROUPS))


def test_cyclic_independent_noise_composes_ceil_t_over_b_gaussians():
    s = make_sampler("cyclic", 10, groups=3)
    z, rounds = 1.3, 8
    expected = compute_epsilon(
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), 3), delta=DELTA
    )
    ledger = PrivacyLedger(delta=DELTA)
    for t in range(rounds):
        ledger.record(s.event_at(z, t))
    assert ledger.epsilon() == pytest.approx(expected, rel=1e-9)
    assert compute_epsilon(s.composed_event(z, rounds), delta=DELTA) == pytest.approx(
        expected, rel=1e-9
    )
    # after round t the ledger holds the most rounds any client took part in: ceil((t+1)/b)
    one = compute_epsilon(dp_accounting.GaussianDpEvent(z), delta=DELTA)
    assert ledger.history[0] == pytest.approx(one) and ledger.history[2] == pytest.approx(one)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": "cyclic", "groups": 0}, r"'groups' parameter must be .*got 0"),
        ({"kind": "cyclic", "groups": 11}, r"'groups' parameter must be in \[1, 10\]; got 11"),
        ({"kind": "cyclic", "groups": 2.5}, r"'groups' parameter must be an integer"),
        ({"kind": "cyclic"}, r"'groups' parameter is required"),
        ({"kind": "poisson", "clients_per_round": 3, "groups": 2}, r"sampling='cyclic' only"),
        ({"kind": "cyclic", "clients_per_round": 3, "groups": 2}, r"ceil\(num_clients"),
    ],
)
def test_cyclic_sampler_refusals(kwargs, match):
    kind = kwargs.pop("kind")
    with pytest.raises(InvalidParameterError, match=match):
        make_sampler(kind, 10, **kwargs)


def test_run_settings_refuse_groups_and_banded_without_their_sampling():
    with pytest.raises(InvalidParameterError, match=r"'groups' parameter applies .*'poisson'"):
        RunSpec(groups=3)
    with pytest.raises(InvalidParameterError, match=r"'noise_mechanism' .*'sampling' .*poisson"):
        RunSpec(noise_mechanism="banded")
    with pytest.raises(InvalidParameterError, match=r"'noise_mechanism' .*'sampling' .*fixed"):
        TrainConfig(noise_mechanism="banded", sampling="fixed")
    with pytest.raises(InvalidParameterError, match="groups"):
        RunSpec(sampling="cyclic", groups=0)
    with pytest.raises(InvalidParameterError, match="subspace_dim"):
        TrainConfig(noise_mechanism="banded", sampling="all", subspace_dim=2)
    with pytest.raises(InvalidParameterError, match=r"'banded' needs .*adds.*'workshop'"):
        TrainConfig(method="workshop", ball=1.0, noise_mechanism="banded", sampling="all")
    TrainConfig(method="workshop", ball=1.0, sampling="all")  # independent noise: its default
    with pytest.raises(InvalidParameterError, match=r"ceil\(m / groups\) = 4"):
        resolve_clients_per_round(3, 10, sampling="cyclic", groups=3)
    with pytest.raises(InvalidParameterError, match="'resume' parameter needs"):
        check_resume(True, "banded", "secure")
    check_resume(True, "banded", "seeded")
    check_resume(True, "independent", "secure")
    poisson = make_sampler("poisson", M, 3)
    with pytest.raises(InvalidParameterError, match=r"'noise_mechanism'.*'sampling'.*poisson"):
        GaussianMeanRelease(CLIP, SIGMA, poisson, strategy=run_strategy(T, 1))


# ---------------------------------------------------------------------------------- the noise
@pytest.mark.parametrize("groups", [1, GROUPS])
def test_released_noise_is_the_dense_factorization(groups):
    cur = _curator(groups=groups)
    released = {n: [] for n in SHAPES}
    for _ in range(T):
        _, out = _zero_round(cur)
        for n in SHAPES:
            released[n].append(out.value[n].double().numpy().ravel())
    strategy = cur.release_mechanism.strategy
    assert strategy is not None and strategy.bands == (2 if groups == 1 else groups)
    C = strategy.matrix()
    oracle_noise = make_noise_source("seeded", 5)  # the same draws, in the same order
    draws = {n: [] for n in SHAPES}
    for _ in range(T):
        for n, s in SHAPES.items():
            draws[n].append(oracle_noise.normal_numpy(s, SIGMA).ravel())
    for n in SHAPES:
        W = solve_triangular(C, np.asarray(draws[n]), lower=True)  # w = C^{-1} z
        np.testing.assert_allclose(np.asarray(released[n]), W, rtol=1e-5, atol=1e-6)
        # the billboard (prefix sum of the releases) carries the factorization's noise B z
        np.testing.assert_allclose(
            cur.billboard[n].double().numpy().ravel(), W.sum(axis=0), rtol=1e-5, atol=1e-5
        )


def test_seeded_checkpoint_continues_the_same_noise():
    a = _curator()
    for _ in range(2):
        _zero_round(a)
    state = a.state_dict()
    assert "banded_noise" in state
    rest_a = [_zero_round(a)[1].value["w"] for _ in range(T - 2)]
    b = _curator()
    b.load_state_dict(state)
    rest_b = [_zero_round(b)[1].value["w"] for _ in range(T - 2)]
    for x, y in zip(rest_a, rest_b, strict=True):
        assert torch.equal(x, y)


def test_secure_banded_checkpoint_refuses_to_resume():
    board = {n: torch.zeros(s) for n, s in SHAPES.items()}
    cur = Curator(_release(), board, noise=make_noise_source("secure"), ledger=None)
    state = cur.state_dict()
    assert "banded_noise" not in state  # secure noise is never written down
    with pytest.raises(InvalidParameterError, match="resumes only with seeded noise"):
        cur.load_state_dict(state)


# --------------------------------------------------------------------------------- the ledger
def test_ledger_holds_one_run_event_and_reaccounts_to_banded_epsilon(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = PrivacyLedger(delta=DELTA, path=path)
    cur = _curator(ledger)
    _zero_round(cur)
    # independently: σ over the bound γ/q times the strategy's sensitivity
    q = -(-M // GROUPS)
    strategy = BandedStrategy.from_dict(run_strategy(T, GROUPS).to_dict())
    expected = banded_epsilon(
        strategy, SIGMA, CyclicParticipation(GROUPS), delta=DELTA, bound=CLIP / q
    )
    # the whole run is charged before its first release leaves: cut short, it reports all of it
    assert ledger.epsilon() == pytest.approx(expected, rel=1e-9)
    for _ in range(T - 1):
        _zero_round(cur)
    assert ledger.epsilon() == pytest.approx(expected, rel=1e-9)
    mechanisms = [r["mechanism"] for r in ledger.records]
    assert mechanisms == [BANDED_RUN_MECHANISM] + [BANDED_ROUND_MECHANISM] * T
    run = ledger.records[0]
    assert run["params"]["bands"] == GROUPS and run["params"]["groups"] == GROUPS
    assert run["params"]["sensitivity"] == pytest.approx(
        strategy.sensitivity(CyclicParticipation(GROUPS)) * CLIP / q
    )
    assert all(r["event"] == {"type": "noop"} for r in ledger.records[1:])
    again = reaccount(path)
    assert again["epsilon"] == pytest.approx(expected, rel=1e-9)
    assert again["releases"] == T + 1


def test_budget_is_checked_for_the_whole_run_up_front():
    ledger = PrivacyLedger(delta=DELTA, budget=0.5)
    cur = _curator(ledger)
    assert cur.would_exceed_budget()
    with pytest.raises(PrivacyBudgetError):
        _zero_round(cur)
    assert ledger.records == []  # nothing was released


# ------------------------------------------------------------------------------- a whole run
def test_run_pmtl_reports_the_banded_epsilon_and_the_ledger_agrees(tmp_path):
    from privmtl.experiments.pmtl import run_pmtl

    rounds, groups, m = 4, 3, 12
    out = run_pmtl(
        data="synthetic",
        num_clients=m,
        model="logreg",
        rounds=rounds,
        sampling="cyclic",
        groups=groups,
        noise_mechanism="banded",
        epsilon=2.0,
        noise_source="seeded",
        finetune="none",
        checkpoint_dir=tmp_path / "ck",
        show_progress=False,
        threads=1,
    )
    q = out["clients_per_round"]
    assert (out["sampling"], out["groups"], q) == ("cyclic", groups, 4)
    expected = banded_epsilon(
        run_strategy(rounds, groups),
        out["noise_std"],
        CyclicParticipation(groups),
        delta=out["delta"],
        bound=out["clip"] / q,
    )
    assert out["epsilon"] == pytest.approx(expected, rel=1e-9)
    assert out["epsilon"] == pytest.approx(2.0, rel=1e-3)  # calibrated to the target
    banded = out["banded"]
    assert (banded["mechanism"], banded["bands"], banded["groups"]) == ("banded", groups, groups)
    assert banded["epsilon"] == out["epsilon"] and banded["delta"] == out["delta"]
    details = out["guarantee"]["details"]
    assert details["run_noise_multiplier"] == banded["run_noise_multiplier"]
    assert reaccount(tmp_path / "ck" / "ledger.jsonl")["epsilon"] == pytest.approx(expected)
    with pytest.raises(InvalidParameterError, match="'resume' parameter needs"):
        run_pmtl(
            data="synthetic", num_clients=m, model="logreg", rounds=rounds, sampling="cyclic",
            groups=groups, noise_mechanism="banded", epsilon=2.0, finetune="none",
            checkpoint_dir=tmp_path / "ck", resume=True, show_progress=False, threads=1,
        )  # fmt: skip


def test_cli_refuses_banded_noise_with_poisson_sampling_in_one_line(tmp_path, capsys):
    from privmtl.cli import main

    args = ["pmtl", "--data", "synthetic", "--num-clients", "8", "--rounds", "2", "--json"]
    assert main([*args, "--noise-mechanism", "banded", "--sampling", "poisson"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "'noise_mechanism'" in err and "'sampling'" in err
    ck = tmp_path / "ck"
    resume = ["--sampling", "all", "--noise-mechanism", "banded", "--epsilon", "1"]
    assert main([*args, *resume, "--checkpoint-dir", str(ck), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--reproducible-noise" in err
    assert not ck.exists()  # refused before anything was written


def test_seeded_banded_run_resumed_from_a_checkpoint_equals_the_whole_run(tmp_path):
    from privmtl.data.federated import make_synthetic_federated
    from privmtl.federated import MultinomialLogReg
    from privmtl.federated.protocol import Trainer

    data = make_synthetic_federated(
        n_clients=9, n_features=4, n_classes=3, samples_per_client=(10, 20), random_state=0
    )
    cfg = TrainConfig(
        rounds=5, sampling="cyclic", groups=3, noise_mechanism="banded", noise_std=0.3,
        clip=0.5, lam=0.01, noise_source="seeded", progress=False, threads=1,
    )  # fmt: skip

    def model():
        return MultinomialLogReg(data.n_features, data.n_classes, zero_init=False, random_state=0)

    whole = Trainer(data, model(), cfg).run()
    first = Trainer(data, model(), cfg, checkpoint_dir=tmp_path, checkpoint_every=2)
    assert [first.step().round for _ in range(3)] == [0, 1, 2]  # checkpoint after round 2
    rest = Trainer(data, model(), cfg, checkpoint_dir=tmp_path, resume=True).run()
    assert all(
        torch.equal(rest.global_params[n], whole.global_params[n]) for n in rest.global_params
    )
    assert rest.epsilon == whole.epsilon
    assert reaccount(tmp_path)["releases"] == 5 + 1  # the run event and five rounds, none twice
    assert [h["sampled"] for h in whole.history][:3] == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]


def test_a_budget_below_the_run_stops_the_trainer_before_its_first_round():
    from privmtl.data.federated import make_synthetic_federated
    from privmtl.federated import MultinomialLogReg
    from privmtl.federated.protocol import Trainer

    data = make_synthetic_federated(
        n_clients=6, n_features=4, n_classes=3, samples_per_client=(10, 20), random_state=0
    )
    cfg = TrainConfig(
        rounds=4, sampling="all", noise_mechanism="banded", epsilon=2.0, clip=0.5, lam=0.01,
        noise_source="seeded", progress=False, threads=1,
    )  # fmt: skip
    model = MultinomialLogReg(data.n_features, data.n_classes, zero_init=False, random_state=0)
    with pytest.warns(UserWarning, match="stopped on the privacy budget"):
        res = Trainer(data, model, cfg, budget_epsilon=1.0).run()
    assert res.stopped_on_budget and res.history == []
    assert res.ledger is not None and res.ledger.records == []


def test_banded_run_refuses_the_end_of_run_vote_in_one_line(tmp_path, capsys):
    from privmtl.cli import main

    args = ["pmtl", "--data", "synthetic", "--num-clients", "300", "--rounds", "2", "--json"]
    args += ["--sampling", "all", "--noise-mechanism", "banded", "--epsilon", "1"]
    out = tmp_path / "out"
    assert main([*args, "--finetune-select", "vote", "--save-models", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "'banded'" in err and "finetune_select='vote'" in err
    assert not out.exists()  # refused before anything was written
