"""The clients' state store: defaults for unwritten rows, rows only for written clients, exact
checkpoints, and the engine's numbers unchanged by it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from privmtl.checkpoint import load_checkpoint, save_checkpoint
from privmtl.data.federated import FederatedDataset
from privmtl.exceptions import InvalidParameterError
from privmtl.federated import ClientStore, MultinomialLogReg, TrainConfig
from privmtl.federated.methods import get_method
from privmtl.federated.protocol import Trainer, client_starts


def _defaults() -> dict[str, dict[str, torch.Tensor]]:
    return {
        "personal": {"w": torch.arange(6.0).reshape(2, 3), "b": torch.tensor([-1.0, 1.0])},
        "theta": {"w": torch.zeros(2, 3)},
    }


def _store(m: int = 10) -> ClientStore:
    return ClientStore(m, _defaults())


def _values(k: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"w": torch.randn((k, 2, 3), generator=gen), "b": torch.randn((k, 2), generator=gen)}


# ------------------------------------------------------------------- rows
def test_gather_of_unwritten_rows_is_the_default() -> None:
    store = _store()
    got = store.gather("personal", torch.tensor([0, 9, 9]))
    for n, d in _defaults()["personal"].items():
        assert got[n].shape == (3, *d.shape)
        for row in got[n]:
            assert torch.equal(row, d)
    assert store.n_written == 0 and store.capacity == 0
    # fresh tensors: changing them changes nothing stored
    got["w"] += 1.0
    assert torch.equal(
        store.gather("personal", torch.tensor([0]))["w"][0], _defaults()["personal"]["w"]
    )


def test_scatter_then_gather_roundtrip_and_written() -> None:
    store = _store()
    sel = torch.tensor([7, 2, 5])
    values = _values(3, 0)
    store.scatter("personal", sel, values)
    assert store.written(torch.arange(10)).tolist() == [k in (2, 5, 7) for k in range(10)]
    got = store.gather("personal", torch.tensor([5, 0, 7, 2]))
    for n, v in values.items():
        assert torch.equal(got[n][0], v[2]) and torch.equal(got[n][2], v[0])
        assert torch.equal(got[n][3], v[1])
        assert torch.equal(got[n][1], _defaults()["personal"][n])
    # a written client's other field is its default; writing it again overwrites in place
    assert torch.equal(store.gather("theta", torch.tensor([7]))["w"][0], torch.zeros(2, 3))
    again = _values(1, 1)
    store.scatter("personal", torch.tensor([2]), again)
    assert torch.equal(store.gather("personal", torch.tensor([2]))["w"][0], again["w"][0])
    assert store.n_written == 3
    dense = store.dense("personal")
    assert dense["w"].shape == (10, 2, 3)
    assert torch.equal(dense["w"][7], values["w"][0])
    assert torch.equal(dense["w"][1], _defaults()["personal"]["w"])


def test_bad_arguments_name_the_parameter() -> None:
    store = _store()
    with pytest.raises(InvalidParameterError, match=r"'field'.*'nope'"):
        store.gather("nope", torch.tensor([0]))
    with pytest.raises(InvalidParameterError, match=r"'sel'.*\[0, 10\).*\[10\]"):
        store.gather("personal", torch.tensor([1, 10]))
    with pytest.raises(InvalidParameterError, match=r"'values'.*'w'.*shape"):
        store.scatter("personal", torch.tensor([1]), _values(2, 0))
    with pytest.raises(InvalidParameterError, match=r"'values'.*parameters"):
        store.scatter("personal", torch.tensor([1]), {"w": torch.zeros(1, 2, 3)})
    with pytest.raises(InvalidParameterError, match="'m'"):
        ClientStore(-1, _defaults())


def test_memory_holds_rows_of_the_written_clients_only() -> None:
    m = 1_000_000
    store = ClientStore(m, {"personal": {"w": torch.zeros(4)}, "theta": {"w": torch.zeros(4)}})
    gen = torch.Generator().manual_seed(0)
    clients = torch.randperm(m, generator=gen)[:1000]
    for sel in clients.split(100):  # 10 rounds of 100 new clients
        store.scatter("personal", sel, {"w": torch.ones(len(sel), 4)})
    assert store.n_written == 1000
    assert 1000 <= store.capacity < 2000
    assert store.written(clients).all() and int(store.written(torch.arange(m)).sum()) == 1000
    sd = store.state_dict()
    assert sd["index"].shape == (m,) and sd["index"].dtype == torch.int64
    for field in ("personal", "theta"):
        assert sd["rows"][field]["w"].shape == (store.n_written, 4)


# ------------------------------------------------------------------- state
def test_state_dict_roundtrip_through_a_checkpoint(tmp_path: Path) -> None:
    store = _store()
    store.scatter("personal", torch.tensor([3, 8]), _values(2, 0))
    store.scatter("theta", torch.tensor([1]), {"w": torch.ones(1, 2, 3)})
    save_checkpoint(
        tmp_path,
        kind="store-test",
        config={},
        state={"clients": store.state_dict()},
        step=1,
        noise_source="seeded",
    )
    state, _ = load_checkpoint(tmp_path, kind="store-test", config={})
    back = _store()
    back.load_state_dict(state["clients"])
    all_ = torch.arange(10)
    assert torch.equal(back.written(all_), store.written(all_))
    for field in store.fields:
        for n, p in store.dense(field).items():
            assert torch.equal(back.dense(field)[n], p)
    # the loaded store keeps growing where the saved one stopped
    back.scatter("personal", torch.tensor([0]), _values(1, 2))
    assert back.n_written == 4 and torch.equal(
        back.written(all_)[[0, 1, 3, 8]], torch.ones(4, dtype=torch.bool)
    )


@pytest.mark.parametrize(
    ("other", "match"),
    [
        (lambda: ClientStore(11, _defaults()), "m=10 clients; this store has m=11"),
        (
            lambda: ClientStore(10, {"personal": _defaults()["personal"]}),
            r"fields \['personal', 'theta'\]; this store holds \['personal'\]",
        ),
        (
            lambda: ClientStore(
                10, {**_defaults(), "personal": {"w": torch.zeros(2, 4), "b": torch.zeros(2)}}
            ),
            r"'personal' parameter 'w' has rows of shape \(2, 3\).*this store's have shape \(2, 4\)",
        ),
        (
            lambda: ClientStore(10, {**_defaults(), "theta": {"v": torch.zeros(2, 3)}}),
            r"field 'theta' holds the parameters \['w'\]; this store's holds \['v'\]",
        ),
        (
            lambda: ClientStore(
                10, {**_defaults(), "theta": {"w": torch.zeros(2, 3, dtype=torch.float64)}}
            ),
            r"'theta' parameter 'w'.*dtype torch.float32.*dtype torch.float64",
        ),
    ],
)
def test_load_refuses_the_state_of_another_store(other, match) -> None:
    store = _store()
    store.scatter("personal", torch.tensor([3]), _values(1, 0))
    target = other()
    with pytest.raises(InvalidParameterError, match=match):
        target.load_state_dict(store.state_dict())


def test_load_refuses_a_state_whose_index_does_not_address_its_rows() -> None:
    store = _store()
    store.scatter("personal", torch.tensor([3, 4]), _values(2, 0))
    sd = store.state_dict()
    sd["index"][4] = 0  # two clients on row 0, row 1 orphaned
    with pytest.raises(InvalidParameterError, match=r"rows 0\.\.1 once each"):
        _store().load_state_dict(sd)
    with pytest.raises(InvalidParameterError, match=r"ClientStore\.state_dict"):
        _store().load_state_dict({"personal": {}})


def test_from_dense_writes_the_marked_rows() -> None:
    dense = {"personal": {"w": torch.zeros(5, 2)}}
    dense["personal"]["w"][[1, 3]] = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    store = ClientStore.from_dense(dense, written=torch.tensor([False, True, False, True, False]))
    assert store.written(torch.arange(5)).tolist() == [False, True, False, True, False]
    assert torch.equal(store.dense("personal")["w"], dense["personal"]["w"])
    assert store.capacity == 2
    every = ClientStore.from_dense(dense)
    assert every.n_written == 5


# ------------------------------------------------------------------- the engine on the store
def _billboard_run_config(rounds: int) -> TrainConfig:
    return TrainConfig(
        rounds=rounds, clients_per_round=3, clip=0.5, noise_std=0.3, lam=0.5, progress=False,
        threads=1, noise_source="seeded", sampling="fixed", relation="replace-one",
        personal_init="billboard", seed=3,
    )  # fmt: skip


def _model(ds: FederatedDataset) -> MultinomialLogReg:
    return MultinomialLogReg(ds.n_features, ds.n_classes, zero_init=False, random_state=1)


def _check_pinned(res, n_clients: int) -> None:
    # Pinned from this seeded run: personalized and global sums printed with
    # repr(float(p.double().sum())). The store's numbers equalled the dense (m, ...) client state's
    # on the single-stream synthetic data; re-recorded from the store for the per-client streams
    # (the clients' sizes and the sampling are the same, their examples differ), and again when
    # a client's splits came to be drawn in turn (float32 features, no permutation), when the
    # logistic step's kernels changed (its gradients' last bits), and when Ditto's two trainings
    # came to share one model a client (the same, in the last bits), and when a client's normals
    # came from a table of 2^16 normal quantiles.
    assert res.personalized_params is not None
    pers, glob = res.personalized_params, res.global_params
    assert float(pers["linear.weight"].double().sum()) == 11.536838378757238
    assert float(pers["linear.bias"].double().sum()) == -18.52529364079237
    assert float(pers["linear.weight"][0].double().sum()) == 0.6911673648282886
    assert float(glob["linear.weight"].double().sum()) == 1.9517043083906174
    assert float(glob["linear.bias"].double().sum()) == -2.317390486598015
    sampled = {k for h in res.history for k in h["sampled"]}
    assert sampled == {0, 1, 2, 3, 4, 6, 7, 8, 9}
    for k in set(range(n_clients)) - sampled:  # never sampled: the billboard
        for n, p in glob.items():
            assert torch.equal(pers[n][k], p)


def test_billboard_personal_init_run_equals_the_dense_state_numbers(
    tabular: FederatedDataset,
) -> None:
    tr = Trainer(tabular, _model(tabular), _billboard_run_config(4))
    res = tr.run()
    _check_pinned(res, tabular.n_clients)
    assert tr.clients.n_written == 9 and tr.clients.capacity <= tabular.n_clients


def test_billboard_run_resumed_from_a_checkpoint_is_exact(
    tabular: FederatedDataset, tmp_path: Path
) -> None:
    first = Trainer(tabular, _model(tabular), _billboard_run_config(4), checkpoint_dir=tmp_path)
    first.step()
    first.step()  # checkpointed every round
    state, _ = load_checkpoint(tmp_path, kind="pmtl-family", config=first.fingerprint_config())
    assert set(state["clients"]) == {"format", "m", "index", "defaults", "rows"}
    n = int((state["clients"]["index"] >= 0).sum())
    assert 0 < n == first.clients.n_written and n < tabular.n_clients
    assert state["clients"]["rows"]["personal"]["linear.weight"].shape[0] == n
    del first  # releases the directory's lock
    resumed = Trainer(
        tabular, _model(tabular), _billboard_run_config(4), checkpoint_dir=tmp_path, resume=True
    )
    assert resumed.round == 2
    _check_pinned(resumed.run(), tabular.n_clients)


def test_client_starts_from_stacked_states(tabular: FederatedDataset) -> None:
    cfg = _billboard_run_config(1)
    method = get_method("pmtl", cfg)
    board = {"w": torch.full((2,), 9.0)}
    personal = {"w": torch.arange(8.0).reshape(4, 2)}
    joined = torch.tensor([True, False, True, False])
    starts, _ = client_starts(method, board, torch.tensor([0, 1]), personal=personal, joined=joined)
    assert torch.equal(starts["w"], torch.tensor([[0.0, 1.0], [9.0, 9.0]]))


def test_a_state_of_stacked_client_states_still_loads(tabular: FederatedDataset) -> None:
    """A checkpoint written before the store holds the stacked states and the joined mask."""
    first = Trainer(tabular, _model(tabular), _billboard_run_config(4))
    first.step()
    first.step()
    sd = first.state_dict()
    every = torch.arange(tabular.n_clients)
    sd["clients"] = {
        "personal": first.clients.dense("personal"),
        "joined": {"mask": first.clients.written(every)},
    }
    resumed = Trainer(tabular, _model(tabular), _billboard_run_config(4))
    resumed.load_state_dict(sd)
    assert torch.equal(resumed.clients.written(every), first.clients.written(every))
    assert resumed.clients.n_written < tabular.n_clients
    _check_pinned(resumed.run(), tabular.n_clients)


def test_pp_sgd_initial_theta_writes_every_row() -> None:
    method = get_method("pp-sgd", TrainConfig(method="pp-sgd"))
    init = {"w": torch.zeros(2, 3), "b": torch.zeros(2)}
    gen = torch.Generator().manual_seed(0)
    theta = {"w": torch.randn((5, 2, 3), generator=gen), "b": torch.randn((5, 2), generator=gen)}
    store = method.initial_state(init, 5, {"theta": theta})
    assert store.fields == ["theta"] and store.n_written == 5
    for n, t in store.dense("theta").items():
        assert torch.equal(t, theta[n])
    fresh = method.initial_state(init, 5)
    assert fresh.n_written == 0 and torch.equal(fresh.dense("theta")["w"], torch.zeros(5, 2, 3))
