"""SecAgg+ on a real SuperLink and SuperNodes: the billboards match the run without it up to the
documented quantization error, with the same ledger (needs pip install 'privmtl[flower]')."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'privmtl[flower]')")

from privmtl.data.federated import make_synthetic_federated
from privmtl.experiments.pmtl import make_model
from privmtl.flower._core import run_options
from privmtl.flower.launcher import run_local
from privmtl.flower.node_clients import NodeClients
from privmtl.flower.server_run import ServerRun

pytestmark = pytest.mark.slow

CONFIG = {
    "data": "synthetic",
    "model": "logreg",
    "rounds": 3,
    "clients-per-round": 6,
    "noise-std": 0.05,
    "seed": 3,
    "noise-source": "seeded",
    "local-steps": 3,
}
# a coarse quantization, so that the rounding is visible above float32 rounding (1e-5)
SECAGG = {"secagg": True, "secagg-quantization-range": 2**12}
FP = 1e-5


def _ledger(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _boards(work):
    return torch.load(work / "server" / "billboards.pt", weights_only=True)


def _dist(a, b):
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def test_secagg_billboards_match_the_plain_run_up_to_the_quantization_bound(tmp_path):
    plain = run_local(num_supernodes=3, run_config=CONFIG, work_dir=tmp_path / "plain", timeout=600)
    sec = run_local(
        num_supernodes=3, run_config={**CONFIG, **SECAGG}, work_dir=tmp_path / "sec", timeout=900
    )
    assert plain["secure_aggregation"] is None
    sa = sec["secure_aggregation"]
    assert sa["protocol"] == "secagg+" and sa["clipping"] == "client-side"
    assert "honest-but-curious" in sa["trust_model"]
    assert (sa["num_shares"], sa["reconstruction_threshold"]) == (3, 2)
    assert sa["quantization_range"] == 2**12 and sa["clipping_range"] == 0.5
    assert (
        sec["rounds_run"] == 3
        and sec["clients_answered_per_round"] == (plain["clients_answered_per_round"])
    )

    # the same accounting: identical ledger entries and epsilon
    assert _ledger(tmp_path / "sec" / "server" / "ledger.jsonl") == _ledger(
        tmp_path / "plain" / "server" / "ledger.jsonl"
    )
    assert sec["epsilon"] == plain["epsilon"]
    assert sec["epsilon_per_round"] == plain["epsilon_per_round"]

    bounds = sa["quantization_error_bound_per_round"]
    assert len(bounds) == 3 and sa["max_quantization_error"] == max(bounds)
    b_sec, b_plain = _boards(tmp_path / "sec"), _boards(tmp_path / "plain")
    # round 1 starts from the same billboard and models: within the documented bound
    assert _dist(b_sec[0], b_plain[0]) <= bounds[0] + FP
    assert _dist(b_sec[0], b_plain[0]) > FP  # the quantization is real

    # every round: the release equals the plain curator's release of the exact messages of
    # the same clients from the same billboard (replayed in process), within the bound
    ds = make_synthetic_federated(random_state=3)
    opts = run_options(CONFIG)
    node = NodeClients(ds, make_model("logreg", ds, 3), partition_id=0, num_partitions=1)
    oracle = ServerRun(opts, node.init, ds.n_clients)
    board = dict(node.init)
    for t in range(3):
        sampled = oracle.curator.sample_round()
        msgs, _ = node.train([int(k) for k in sampled], board, t, oracle.config)
        oracle.curator.billboard = {n: p.clone() for n, p in board.items()}
        oracle.release(
            sampled, {int(k): {n: msgs[n][j] for n in msgs} for j, k in enumerate(sampled)}, {}, 0
        )
        assert _dist(b_sec[t], oracle.curator.billboard) <= bounds[t] + FP
        board = b_sec[t]
