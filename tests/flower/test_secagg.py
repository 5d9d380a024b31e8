"""SecAgg+ of PMTL's client messages: client-side clipping, quantization bound, exact unmasking.

The quantization tests need no Flower; the protocol tests run both sides in process over a
dictionary "network" (Flower's cryptographic primitives, no SuperLink).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from privmtl.exceptions import InvalidParameterError
from privmtl.flower.secagg import (
    COLLECT,
    SETUP,
    SHARE_KEYS,
    UNMASK,
    SecAggParams,
    SecAggServer,
    SecureAggregationError,
    check_secagg_options,
    dequantize_sum,
    dumps,
    loads,
    mask_stream,
    node_stage,
    quantize_clients,
    round_shares,
)
from privmtl.privacy.release import clip_factors, update_norms


def _messages(k, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn((k, 6, 4), generator=g, dtype=torch.float32) * scale,
        "b": torch.randn((k, 6), generator=g, dtype=torch.float32) * scale,
    }


NAMES = ["w", "b"]
D = 30


def _flat(msgs):
    k = msgs["w"].shape[0]
    return torch.cat([msgs[n].double().reshape(k, -1) for n in NAMES], 1).numpy()


def _clipped(msgs, clip):
    fac = clip_factors(update_norms(msgs), clip).double().numpy()
    return _flat(msgs) * fac[:, None]


def test_params_derive_step_client_clip_and_capacity():
    p = SecAggParams(clip=0.5, dim=D, quantization_range=2**10, modulus_range=2**16)
    assert p.step == pytest.approx(1.0 / 2**10)
    assert p.client_clip == pytest.approx(0.5 - math.sqrt(D) / 2**10)
    assert p.max_clients == (2**16 - 1) // 2**10 == 63
    assert p.error_bound(6, 4) == pytest.approx(6 * (1 + math.sqrt(D)) / 2**10 / 4)
    with pytest.raises(InvalidParameterError, match="modulus_range"):
        SecAggParams(clip=0.5, dim=D, quantization_range=2**10, modulus_range=3 * 2**10)
    with pytest.raises(InvalidParameterError, match="quantization_range"):
        SecAggParams(clip=0.5, dim=10**6, quantization_range=2**10, modulus_range=2**16)


def test_every_quantized_client_contribution_has_norm_at_most_gamma():
    # the accounted sensitivity: whatever the rounding draws, one client moves the dequantized
    # sum by at most gamma (coarse quantization so that rounding matters; large and small
    # messages). Clipping to gamma instead of gamma_c, or not clipping, breaks it.
    p = SecAggParams(clip=0.5, dim=D, quantization_range=2**8, modulus_range=2**16)
    rng = np.random.default_rng(0)
    worst = 0.0
    for trial in range(400):
        msgs = _messages(1, trial, scale=[0.02, 0.1, 10.0][trial % 3])
        vec = quantize_clients(msgs, NAMES, p, rng)
        worst = max(worst, float(np.linalg.norm(dequantize_sum(vec, 1, p))))
    assert worst <= p.clip + 1e-12
    assert worst > p.client_clip  # the rounding does push beyond gamma_c: the shrink is needed


def test_the_node_sum_is_within_the_documented_quantization_error():
    p = SecAggParams(clip=0.5, dim=D, quantization_range=2**12, modulus_range=2**20)
    msgs = _messages(40, 1, scale=0.3)
    rng = np.random.default_rng(1)
    # two nodes: 25 and 15 clients; the server dequantizes the integer total of 40 clients
    total = quantize_clients({n: t[:25] for n, t in msgs.items()}, NAMES, p, rng)
    total = total + quantize_clients({n: t[25:] for n, t in msgs.items()}, NAMES, p, rng)
    got = dequantize_sum(total, 40, p)
    exact_c = _clipped(msgs, p.client_clip).sum(0)  # what the clients clip to
    central = _clipped(msgs, p.clip).sum(0)  # what the curator clips to without SecAgg
    assert np.abs(got - exact_c).max() < 40 * p.step
    q = 8
    assert np.abs(got - central).max() / q < p.error_bound(40, q)
    assert np.abs(got - exact_c).max() > p.step  # the rounding is real, the bound not vacuous
    assert _clipped(msgs, p.clip).max() > p.client_clip / 10  # messages were clipped


def test_stochastic_rounding_is_unbiased():
    p = SecAggParams(clip=0.5, dim=D, quantization_range=2**6, modulus_range=2**24)
    msgs = {n: t[:1].expand(4000, *t.shape[1:]) for n, t in _messages(1, 2, 0.05).items()}
    got = dequantize_sum(quantize_clients(msgs, NAMES, p, np.random.default_rng(3)), 4000, p)
    exact = _clipped(msgs, p.client_clip).sum(0)
    # per client the rounding error has |mean 0| and std <= step/2: 5 sigma of the sum
    assert np.abs(got - exact).max() < 5 * p.step / 2 * math.sqrt(4000)


def test_no_clients_give_the_zero_vector():
    p = SecAggParams(clip=0.5, dim=D)
    vec = quantize_clients(_messages(0, 0), NAMES, p, np.random.default_rng(0))
    assert vec.shape == (D,) and not vec.any()
    assert np.all(dequantize_sum(vec, 0, p) == 0)


def test_mask_stream_is_deterministic_uniform_and_seed_dependent():
    a = mask_stream(b"x" * 32, 2**32, 20000)
    assert np.array_equal(a, mask_stream(b"x" * 32, 2**32, 20000))
    assert not np.array_equal(a, mask_stream(b"y" * 32, 2**32, 20000))
    assert a.min() >= 0 and a.max() < 2**32
    assert abs(a.mean() / 2**32 - 0.5) < 0.01
    assert mask_stream(b"x" * 32, 2**8, 5).max() < 2**8


def test_round_shares_and_option_checks():
    assert round_shares(5, 0, 0) == (5, 3)
    assert round_shares(7, 4, 0) == (5, 3)  # an even count below the nodes is raised by one
    assert round_shares(3, 0, 2) == (3, 2)
    opts = {"secagg": True, "clip": 0.5, "clients-per-round": 6}
    check_secagg_options(opts, 3)
    with pytest.raises(InvalidParameterError, match="3 SuperNodes"):
        check_secagg_options(opts, 2)
    with pytest.raises(InvalidParameterError, match="secagg_threshold"):
        check_secagg_options({**opts, "secagg-threshold": 4}, 3)
    with pytest.raises(InvalidParameterError, match="clients_per_round"):
        check_secagg_options(
            {**opts, "secagg-quantization-range": 2**30, "clients-per-round": 6}, 3
        )
    with pytest.raises(InvalidParameterError, match=r"clients_per_round.*got 20"):
        # not given (""): the spec's min(20, m) may reach 20
        check_secagg_options(
            {**opts, "secagg-quantization-range": 2**30, "clients-per-round": ""}, 3
        )
    check_secagg_options({"secagg": False}, 1)


def test_cli_refuses_secagg_with_two_supernodes(capsys):
    from privmtl.cli import main

    rc = main(
        ["flower", "local", "--data", "synthetic", "--model", "logreg", "--secagg",
         "--num-supernodes", "2"]
    )  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and "3 SuperNodes" in err[0]


def test_payload_wire_format_round_trips_bytes():
    obj = {"a": b"\x00\xff", "b": [b"x", 3], "c": {"d": [1, 2]}, "s": "t"}
    assert loads(dumps(obj)) == obj


# ----------------------------------------------------------------------------- protocol
pytest.importorskip("flwr", reason="Flower is not installed (pip install 'privmtl[flower]')")


class Network:
    """Nodes answering the server in process; ``drop`` makes a node silent from a stage on."""

    def __init__(self, vectors, drop=None):
        self.vectors = vectors
        self.states = {nid: {} for nid in vectors}
        self.drop = drop or {}
        self.masked = {}

    def __call__(self, stage, payloads):
        order = [SETUP, SHARE_KEYS, COLLECT, UNMASK]
        out = {}
        for nid, payload in payloads.items():
            if nid in self.drop and order.index(stage) >= order.index(self.drop[nid]):
                continue
            payload = loads(dumps(payload))  # the wire
            reply, self.states[nid] = node_stage(
                payload, self.states[nid], nid, lambda n=nid: self.vectors[n]
            )
            out[nid] = loads(dumps(reply))
            if stage == COLLECT:
                self.masked[nid] = np.frombuffer(out[nid]["masked"], dtype="<u8")
        return out


def _vectors(nodes, p, seed=0):
    rng = np.random.default_rng(seed)
    return {nid: rng.integers(0, 3 * p.quantization_range, p.dim) for nid in nodes}


P = SecAggParams(clip=0.5, dim=D, quantization_range=2**12, modulus_range=2**16)
NODES = [11, 22, 33, 44, 55]


def test_unmasked_total_is_exactly_the_sum_of_the_node_vectors():
    vec = _vectors(NODES, P)
    net = Network(vec)
    res = SecAggServer(P).run(NODES, net)
    assert np.array_equal(res.total, sum(vec.values()) % P.modulus_range)
    assert res.included == NODES and res.dropped == []
    assert (res.num_shares, res.threshold) == (5, 3)
    # what the server received from each node is not the node's vector (it is masked)
    for nid, m in net.masked.items():
        assert np.mean(m.astype(np.int64) == vec[nid] % P.modulus_range) < 0.1


def test_a_node_dropping_after_sharing_keys_is_unmasked_out_of_the_sum():
    vec = _vectors(NODES, P, seed=1)
    res = SecAggServer(P, num_shares=3, threshold=2).run(NODES, Network(vec, drop={33: COLLECT}))
    assert res.included == [11, 22, 44, 55] and res.dropped == [33]
    want = sum(v for nid, v in vec.items() if nid != 33) % P.modulus_range
    assert np.array_equal(res.total, want)


@pytest.mark.parametrize("stage", [SETUP, SHARE_KEYS, UNMASK])
def test_drop_outs_at_other_stages(stage):
    vec = _vectors(NODES, P, seed=2)
    res = SecAggServer(P).run(NODES, Network(vec, drop={22: stage}))
    keep = NODES if stage == UNMASK else [n for n in NODES if n != 22]
    assert res.included == keep
    assert np.array_equal(res.total, sum(vec[n] for n in keep) % P.modulus_range)


def test_too_many_drop_outs_stop_the_round():
    vec = _vectors(NODES, P, seed=3)
    with pytest.raises(SecureAggregationError):
        SecAggServer(P).run(NODES, Network(vec, drop={11: COLLECT, 22: COLLECT, 33: COLLECT}))


def test_a_node_refuses_stages_out_of_order():
    state = {}
    _, state = node_stage(
        {"stage": SETUP, "round": 0, "share_num": 3, "threshold": 2, "modulus_range": 2**16},
        state,
        1,
        lambda: np.zeros(D, dtype=np.int64),
    )
    with pytest.raises(SecureAggregationError, match="stage"):
        node_stage({"stage": UNMASK, "active": [1], "dead": []}, state, 1, lambda: None)
