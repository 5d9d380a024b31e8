"""The train message's content: a small billboard and the nodes' messages travel packed in one
record (fewer Flower objects per message), a large one as Flower's ArrayRecord; a node reads both."""

from __future__ import annotations

import json
from dataclasses import asdict, fields

import pytest
import torch

from privmtl.flower._core import make_config, run_options

flwr = pytest.importorskip("flwr", reason="Flower is not installed (pip install 'privmtl[flower]')")

from flwr.app import ConfigRecord, Context, RecordDict  # noqa: E402

from privmtl.flower import apps  # noqa: E402

OPTS = {"data": "synthetic", "num-clients": 9, "model": "logreg", "rounds": 2, "seed": 1}


def test_small_parameters_are_packed_bit_for_bit_and_large_ones_are_not():
    params = {"w": torch.randn(10, 21, dtype=torch.float64), "b": torch.randn(10)}
    packed = apps._pack(params)
    assert isinstance(packed, bytes)
    back = apps._unpack(packed)
    assert back.keys() == params.keys()
    for n in params:
        assert back[n].dtype == params[n].dtype and torch.equal(back[n], params[n])
    big = {"w": torch.zeros(apps.PACKED_BYTES // 4 + 1)}
    assert apps._pack(big) is None


def test_a_node_trains_from_a_packed_round_as_from_an_array_record(monkeypatch):
    monkeypatch.setattr(apps, "_NODES", {})
    opts = run_options(OPTS)

    def context() -> Context:  # a node without storage keeps its clients' models in its state
        nc = {"partition-id": 0, "num-partitions": 1}
        return Context(run_id=1, node_id=1, node_config=nc, state=RecordDict(), run_config=opts)

    node = apps._node(context())
    config, _ = make_config(opts, node.m)
    cfg = {f.name: getattr(config, f.name) for f in fields(config)}
    board = {n: p.clone() for n, p in node.init.items()}
    text = json.dumps({"round": 0, "key": None, "config": cfg, "clients": [0, 3]})
    packed = RecordDict({"round": ConfigRecord({"json": text, "billboard": apps._pack(board)})})
    assert not packed.array_records and len(packed) == 1
    plain = RecordDict({"billboard": apps._arrays(board), "round": ConfigRecord({"json": text})})
    out = []
    for content in (packed, plain):
        monkeypatch.setattr(apps, "_NODES", {})  # a fresh node: the same round from the start
        _, _, msgs, losses = apps._train(content, context())
        out.append((msgs, losses))
    assert out[0][1] == out[1][1]
    for n in out[0][0]:
        assert torch.equal(out[0][0][n], out[1][0][n])
    assert asdict(config)  # the TrainConfig round-trips through the message as JSON


def test_a_nodes_per_client_scores_travel_as_arrays_and_come_back_equal():
    """The evaluation reply carries a node's per-client lists as arrays (the ServerApp holds
    numpy arrays, not Python lists of its clients' numbers); the rest stays JSON."""
    import numpy as np

    scores = {
        "val_n": [3.0, 4.0], "test_personal": [1.0, 0.1 + 0.2], "test_final": [2.0, 1.0 / 3.0],
        "train_n": [5.0, 6.0], "clients": [7, 9], "choice": [0, 2], "client_ids": ["a", "bb"],
        "grids": {"ridge": [0.1, 1.0]}, "score_seconds": 0.5, "voters": 2,
        "baseline": {"clients": [7], "final": [1.0], "local": [0.0], "n": [1.0]},
    }  # fmt: skip
    arrays, rest = apps._split_scores(scores)
    assert set(arrays) == {"val_n", "test_personal", "test_final", "train_n", "clients", "choice",
                           "client_ids"}  # fmt: skip
    assert set(rest) == {"grids", "score_seconds", "voters", "baseline"}
    reply = RecordDict({"scores": ConfigRecord({"json": json.dumps(rest)}), "score_arrays": arrays})
    back = apps._joined_scores(reply)
    assert back.keys() == scores.keys()
    for key, value in scores.items():
        if key in arrays:
            assert isinstance(back[key], np.ndarray)
            assert back[key].tolist() == value  # bit for bit: the same floats, ints and ids
        else:
            assert back[key] == value
    assert back["clients"].dtype == np.int64 and back["test_final"].dtype == np.float64
    assert arrays["val_n"].numpy().dtype == np.int32  # whole numbers: 4 bytes each
    assert arrays["test_final"].numpy().dtype == np.float64  # 1/3: kept whole
