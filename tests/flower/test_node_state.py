"""A SuperNode's clients on disk: a round writes its sampled clients' rows only, atomically."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_defaults import old_config

from privmtl.data.federated import make_synthetic_federated
from privmtl.experiments.pmtl import make_model
from privmtl.flower._core import run_options
from privmtl.flower.node_clients import NodeClients, load_node
from privmtl.flower.node_state import NodeState, read_personal
from privmtl.flower.server_run import ServerRun

_IO = Path("/proc/self/io")


def _wchar() -> int:
    """Bytes this process passed to write calls (Linux: ``/proc/self/io``)."""
    for line in _IO.read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


def _opts(**kw):
    base = {
        "rounds": 3,
        "clients-per-round": 4,
        "noise-std": 0.05,
        "seed": 3,
        "noise-source": "seeded",
        "local-steps": 2,
    }
    base.update(kw)
    return run_options(base)


@pytest.mark.skipif(not _IO.exists(), reason="counts bytes through /proc/self/io (Linux)")
@pytest.mark.parametrize("m", [40, 400])
def test_a_round_writes_only_its_sampled_clients_rows(tmp_path, m):
    """Every client of the node written once, then a round of 4 clients: the node writes about
    three times their model bytes (journal before/after, the rows), whatever its population."""
    ds = make_synthetic_federated(n_clients=m, n_features=20, random_state=0)
    opts = _opts()
    node = NodeClients(
        ds, make_model("logreg", ds, 3), partition_id=0, num_partitions=1,
        state_dir=tmp_path / "node",
    )  # fmt: skip
    run = ServerRun(opts, node.init, ds.n_clients)
    cfg = old_config(**json.loads(json.dumps(asdict(run.config))))
    board = {n: p.clone() for n, p in run.curator.billboard.items()}
    node.train(list(range(m)), board, 0, cfg, key="r0")  # every client holds a model now
    assert len(node.personal) == m
    row = sum(p.numel() * p.element_size() for p in node.init.values())
    sampled = [1, 7, 12, 33]
    before = _wchar()
    node.train(sampled, board, 1, cfg, key="r1")
    written = _wchar() - before
    assert written <= 3 * len(sampled) * row + 2048, (written, row)
    # the population's models are all there, and a fresh node reads them back
    again = NodeClients(
        ds, make_model("logreg", ds, 3), partition_id=0, num_partitions=1,
        state_dir=tmp_path / "node",
    )  # fmt: skip
    assert again.rounds_trained == 2 and again.last_key == "r1"
    back = read_personal(tmp_path / "node" / "personal")
    assert set(back) == set(ds.client_ids)
    for k in sampled:
        cid = ds.client_ids[k]
        for n, p in node.personal[cid].items():
            assert torch.equal(back[cid][n], p)


def test_a_round_cut_between_its_journal_and_its_rows_is_completed_on_open(tmp_path, monkeypatch):
    init = {"w": torch.zeros(3, 2), "b": torch.zeros(2)}
    ids = [f"c{j}" for j in range(10)]
    state = NodeState(ids, init, tmp_path)
    models = {"w": torch.ones(2, 3, 2), "b": torch.full((2, 2), 2.0)}
    state.rounds_trained = 1
    state.write_round("k0", [3, 5], models)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(NodeState, "_apply", killed)
    state.rounds_trained = 2
    with pytest.raises(KeyboardInterrupt):
        state.write_round("k1", [5, 8], {"w": 3 * models["w"], "b": 3 * models["b"]})
    monkeypatch.undo()
    back = NodeState(ids, init, tmp_path)  # the journal is applied again: round k1 complete
    assert back.rounds_trained == 2 and back.last_key == "k1"
    assert sorted(back) == ["c3", "c5", "c8"]
    assert torch.equal(back["c8"]["w"], torch.full((3, 2), 3.0))
    assert torch.equal(back["c3"]["b"], torch.full((2,), 2.0))
    back.undo()  # the server asks for round k1 again: its rows as before it
    assert sorted(back) == ["c3", "c5"]
    assert torch.equal(back["c5"]["w"], torch.ones(3, 2)) and back.rounds_trained == 1


def _table(path: Path, n_clients: int = 9, rows: int = 12) -> None:
    import pandas as pd

    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(n_clients * rows, 3)), columns=list("abc"))
    frame.insert(0, "user", [f"u{c}" for c in range(n_clients) for _ in range(rows)])
    frame["label"] = rng.integers(0, 2, size=n_clients * rows)
    frame.to_csv(path, index=False)


def test_a_fresh_client_app_maps_the_node_cache_without_copying(tmp_path):
    _table(tmp_path / "t.csv")
    opts = {
        **_opts(), "data": "table", "data-path": str(tmp_path / "t.csv"), "model": "logreg",
        "client-column": "user", "label-column": "label",
    }  # fmt: skip
    first = load_node(opts, 1, 3, str(tmp_path))
    cache = next(tmp_path.glob("data-*.pt"))
    again = load_node(opts, 1, 3, str(tmp_path))
    assert again.client_ids == first.client_ids
    x_again, y_again, _ = again.local.concat("train")
    x_first, y_first, _ = first.local.concat("train")
    assert torch.equal(x_again, x_first) and torch.equal(y_again, y_first)
    np.testing.assert_array_equal(again.offsets, first.offsets)
    for split in ("val", "test"):
        for a, b in zip(again.local.split(split)[0], first.local.split(split)[0], strict=True):
            assert torch.equal(a, b)
    # each client's tensors are views of the stacked (mapped) ones: nothing was re-stacked
    ptr = x_again.untyped_storage().data_ptr()
    assert all(x.untyped_storage().data_ptr() == ptr for x in again.local.split("train")[0])
    assert os.path.getsize(cache) > 0
