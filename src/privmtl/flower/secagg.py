r"""Secure aggregation (SecAgg+) of PMTL's client messages on Flower's Deployment Engine.

With ``--secagg`` the curator of :mod:`privmtl.flower.apps` never sees a single client message:
each round runs the SecAgg+ protocol (Bell et al., CCS 2020) among *all* SuperNodes, and the
curator learns only the sum over the round's sampled clients, which it divides by the fixed ``q``,
noises from its noise source and records in the durable ledger before the billboard changes
(:meth:`privmtl.federated.protocol.Curator.release_sum`).

Implementation
    Flower 1.41 ships SecAgg+ as ``SecAggPlusWorkflow`` (server) and ``secaggplus_mod``
    (client), but both are bound to the legacy API: the workflow needs a ``LegacyContext`` with a
    ``Strategy`` and ``ClientManager``, and the mod converts replies to and from ``FitRes`` through
    ``flwr.compat``. This module runs the same four stages (setup, share keys, collect masked
    vectors, unmask) with the same key agreement and secret sharing, built on Flower's primitives
    (``flwr.common.secure_aggregation``: Shamir shares, ECDH + HKDF shared keys, Fernet
    encryption; ``flwr.supercore.primitives.asymmetric``: SECP384R1 key pairs; reached through
    :func:`privmtl.flower._flwr_compat.secagg_primitives`, which outside the Flower versions it
    supports runs the same primitives on ``cryptography``), over PMTL's own
    Message-API messages (``train.secagg``). Two deliberate differences from Flower's code: the
    masks are the AES-256-CTR key stream of the 32-byte seeds (Flower's ``pseudo_rand_gen`` folds
    a seed to 32 bits for numpy's ``RandomState``, which a curious server could search), and
    removing the pairwise masks of a node that dropped after sharing its keys touches only the
    neighbours whose vectors are in the sum.

Clipping and quantization (client side, trusted to the node)
    Each sampled client's message :math:`g_k` (all parameters flattened, :math:`d` coordinates) is
    clipped to :math:`\gamma_c = \gamma - \sqrt d\,s`, then quantized as Flower quantizes
    (``clipping_range`` :math:`c = \gamma`, ``quantization_range`` :math:`R`): every coordinate
    :math:`x` becomes the integer :math:`\lfloor (x + c) R/(2c) + u\rfloor` with :math:`u` uniform
    in :math:`[0, 1)` (stochastic rounding), so its dequantized value is within one step
    :math:`s = 2c/R` of :math:`x`. A node adds its clients' integer vectors, masks the sum and
    sends it; the masks cancel modulo ``modulus_range`` :math:`M` in the sum over nodes. The
    curator dequantizes the integer total of :math:`n` clients as :math:`s\,T - n c`, which needs
    :math:`n R < M` (at most ``(M - 1) // R`` clients per round).

Accounting
    For any fixed rounding draws, one client's dequantized contribution is within :math:`\sqrt d\,s`
    (ℓ2) of its clipped message, so its ℓ2 norm is at most :math:`\gamma_c + \sqrt d\,s = \gamma`:
    adding or removing one client moves the sum by at most γ and the mean by γ/q, and the release
    is a mixture (over the rounding draws) of Gaussian mechanisms with exactly the sensitivity the
    ledger accounts. The ledger entries, ε and the noise are therefore those of the run without
    secure aggregation.

Quantization error (documented bound)
    Per coordinate, a client's dequantized contribution differs from its message clipped to γ (as
    the curator clips without secure aggregation) by less than :math:`(1 + \sqrt d)\,s`: one step
    of rounding plus the clip shrink :math:`\gamma - \gamma_c = \sqrt d\,s`. With :math:`n`
    clients in the sum, the released mean differs from the one without secure aggregation, on the
    same messages and with the same noise, by less than :math:`n (1 + \sqrt d) s / q` per
    coordinate (:meth:`SecAggParams.error_bound`), up to floating-point rounding.

Trust model (:data:`TRUST_MODEL`)
    SecAgg+ protects individual messages from an honest-but-curious server, also when it colludes
    with fewer than ``reconstruction_threshold`` nodes; up to ``num_shares -
    reconstruction_threshold`` neighbours of a node may drop out and the round still completes.
    The server still adds the noise (central DP: the noise is trusted to the server, and the
    released mean, not the sum, is what is differentially private), and the clipping is trusted to
    the clients (a node that does not clip breaks the sensitivity). The protocol is not robust to
    malicious nodes sending out-of-range vectors.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from privmtl._validation import check_int, check_real
from privmtl.exceptions import InvalidParameterError, PrivmtlError
from privmtl.federated.spec import DEFAULT_CLIENTS_PER_ROUND
from privmtl.flower import _flwr_compat
from privmtl.flower._waits import send_and_receive
from privmtl.privacy.release import clip_factors, drop_nonfinite, update_norms

__all__ = [
    "SECAGG_DEFAULTS",
    "TRUST_MODEL",
    "SecAggParams",
    "SecAggServer",
    "SecureAggregationError",
    "check_secagg_options",
    "dequantize_sum",
    "mask_stream",
    "node_stage",
    "quantize_clients",
]

Params = dict[str, torch.Tensor]

SECAGG_DEFAULTS: dict[str, Any] = {
    "secagg": False,
    "secagg-num-shares": 0,  # 0: every node of the round (SecAgg's full graph)
    "secagg-threshold": 0,  # 0: a majority of the shares
    "secagg-quantization-range": 2**22,
    "secagg-modulus-range": 2**32,
}

TRUST_MODEL = (
    "honest-but-curious server that may collude with fewer than reconstruction_threshold nodes: "
    "it learns only the sum over the round's clients; the server adds the Gaussian noise "
    "(central DP, noise trusted to the server); clipping is trusted to the clients"
)

SETUP, SHARE_KEYS, COLLECT, UNMASK = "setup", "share_keys", "collect_masked_vectors", "unmask"


class SecureAggregationError(PrivmtlError, RuntimeError):
    """A SecAgg+ round could not complete (too few nodes answered to unmask the sum)."""


@dataclass(frozen=True)
class SecAggParams:
    """Quantization of one run's SecAgg+ rounds (module docstring).

    Parameters
    ----------
    clip : float
        γ, the ℓ2 bound of one client's contribution the ledger accounts; also Flower's
        ``clipping_range`` (a coordinate of a clipped message lies in ``[-γ, γ]``).
    dim : int
        ``d``, the number of coordinates of a message (all parameters).
    quantization_range : int
        ``R``: a coordinate is quantized to an integer in ``[0, R]``.
    modulus_range : int
        ``M``, a power of two at most ``2**32``: the sum is computed modulo ``M``.
    """

    clip: float
    dim: int
    quantization_range: int = 2**22
    modulus_range: int = 2**32

    def __post_init__(self) -> None:
        check_real("clip", self.clip, low=0.0, closed="neither")
        check_int("dim", self.dim, low=1)
        check_int("quantization_range", self.quantization_range, low=2)
        m = self.modulus_range
        check_int("modulus_range", m, low=2)
        if m & (m - 1) or m > 2**32 or m <= self.quantization_range:
            raise InvalidParameterError(
                "The 'modulus_range' parameter must be a power of two in (quantization_range, "
                f"2**32]; got modulus_range={m}, quantization_range={self.quantization_range}."
            )
        if self.quantization_range <= 2 * math.sqrt(self.dim):
            raise InvalidParameterError(
                "The 'quantization_range' parameter must exceed 2*sqrt(d) so that the clients "
                f"clip to a positive norm; got {self.quantization_range} with d={self.dim}."
            )

    @property
    def clipping_range(self) -> float:
        """Flower's ``clipping_range`` :math:`c = \\gamma`."""
        return float(self.clip)

    @property
    def step(self) -> float:
        """One quantization step :math:`s = 2c/R`."""
        return 2.0 * self.clipping_range / self.quantization_range

    @property
    def client_clip(self) -> float:
        """:math:`\\gamma_c = \\gamma - \\sqrt d\\,s`, the norm the clients clip to."""
        return self.clip - math.sqrt(self.dim) * self.step

    @property
    def max_clients(self) -> int:
        """The most clients one sum may hold (:math:`nR < M`)."""
        return (self.modulus_range - 1) // self.quantization_range

    def error_bound(self, n: int, q: float) -> float:
        """Per-coordinate bound on the released mean's distance to the central-clipping mean.

        ``n`` clients in the sum, fixed divisor ``q``: :math:`n (1 + \\sqrt d) s / q` (module
        docstring; exact arithmetic).
        """
        return n * (1.0 + math.sqrt(self.dim)) * self.step / q

    def describe(self) -> dict[str, Any]:
        return {
            "clipping_range": self.clipping_range,
            "client_clip": self.client_clip,
            "quantization_range": int(self.quantization_range),
            "modulus_range": int(self.modulus_range),
            "quantization_step": self.step,
            "dim": int(self.dim),
            "max_clients_per_round": self.max_clients,
        }


def check_secagg_options(opts: dict[str, Any], num_supernodes: int) -> None:
    """Refuse invalid SecAgg+ run options before any process starts (InvalidParameterError)."""
    if not opts.get("secagg"):
        return
    if num_supernodes < 3:
        raise InvalidParameterError(
            "Secure aggregation needs at least 3 SuperNodes (the sum of two reveals each to "
            f"the other); got num_supernodes={num_supernodes}."
        )
    shares = int(opts.get("secagg-num-shares", 0))
    threshold = int(opts.get("secagg-threshold", 0))
    check_int("secagg_num_shares", shares, low=0)
    check_int("secagg_threshold", threshold, low=0)
    n_shares, thr = round_shares(num_supernodes, shares, threshold)
    if shares and shares > num_supernodes:
        raise InvalidParameterError(
            "The 'secagg_num_shares' parameter must be at most the number of SuperNodes "
            f"({num_supernodes}); got {shares}."
        )
    if not 2 <= thr <= n_shares:
        raise InvalidParameterError(
            "The 'secagg_threshold' parameter must be in [2, num_shares]; got "
            f"secagg_threshold={thr}, num_shares={n_shares}."
        )
    params = SecAggParams(
        clip=float(opts["clip"]),
        dim=1,
        quantization_range=int(opts.get("secagg-quantization-range", 2**22)),
        modulus_range=int(opts.get("secagg-modulus-range", 2**32)),
    )

    # not given: the spec's default, min(20, m) (resolve_clients_per_round, once m is known): checked
    # here before the data is loaded, at its largest, DEFAULT_CLIENTS_PER_ROUND, so that it holds
    # for every m; an explicit q is checked as given (above m it is refused when m is known)
    given = opts.get("clients-per-round", "")  # "": not given (the run configuration's None)
    q = DEFAULT_CLIENTS_PER_ROUND if given in ("", None) else int(given)
    if q > params.max_clients:
        raise InvalidParameterError(
            "With secure aggregation 'clients_per_round' must be at most "
            f"(modulus_range - 1) // quantization_range = {params.max_clients}; got {q}."
        )


def round_shares(num_nodes: int, num_shares: int, threshold: int) -> tuple[int, int]:
    """Shares per secret and reconstruction threshold of a round with ``num_nodes`` nodes.

    ``num_shares = 0`` means every node (SecAgg's complete graph); an even count below the number
    of nodes is raised by one (SecAgg+ neighbourhoods are symmetric around a node).
    ``threshold = 0`` means a majority of the shares.
    """
    shares = num_nodes if num_shares <= 0 else min(num_shares, num_nodes)
    if shares < num_nodes and shares % 2 == 0:
        shares += 1
    thr = threshold if threshold > 0 else shares // 2 + 1
    return shares, thr


# ----------------------------------------------------------------------------- quantization
def _flatten(messages: Params, names: list[str]) -> torch.Tensor:
    k = next(iter(messages.values())).shape[0]
    return torch.cat([messages[n].double().reshape(k, -1) for n in names], dim=1)


def quantize_clients(
    messages: Params, names: list[str], params: SecAggParams, rng: np.random.Generator
) -> np.ndarray:
    """The node's integer vector: the sum of its clients' clipped, quantized messages.

    ``messages`` are stacked ``(K, ...)`` client messages (``K`` may be 0), flattened in the
    order of ``names``. Each row is clipped to :attr:`SecAggParams.client_clip` (ℓ2 over all
    parameters), mapped to ``[0, R]`` as Flower's ``quantize`` does and stochastically rounded
    with draws from ``rng``.
    """
    if not names or next(iter(messages.values())).shape[0] == 0:
        return np.zeros(params.dim, dtype=np.int64)
    norms = update_norms({n: messages[n] for n in names})
    flat = _flatten(drop_nonfinite(messages, norms), names)
    if flat.shape[1] != params.dim:
        raise InvalidParameterError(
            f"The messages have {flat.shape[1]} coordinates; the SecAgg+ round expects "
            f"{params.dim}."
        )
    factors = clip_factors(norms, params.client_clip)
    clipped = (flat * factors.double().unsqueeze(1)).numpy()
    c = params.clipping_range
    scaled = (np.clip(clipped, -c, c) + c) * (params.quantization_range / (2.0 * c))
    ints = np.floor(scaled + rng.random(scaled.shape)).astype(np.int64)
    return np.asarray(ints.sum(axis=0), dtype=np.int64)


def dequantize_sum(total: np.ndarray, n: int, params: SecAggParams) -> np.ndarray:
    """The float sum of ``n`` clients' messages from their integer total: :math:`sT - nc`."""
    return np.asarray(total, dtype=np.float64) * params.step - n * params.clipping_range


def unflatten(vector: np.ndarray, template: Params) -> Params:
    """Split a flat vector into tensors shaped (and typed) like ``template`` (in its order)."""
    out, at = {}, 0
    for n, p in template.items():
        size = p.numel()
        out[n] = torch.from_numpy(np.array(vector[at : at + size])).reshape(p.shape)
        at += size
    return out


def mask_stream(seed: bytes, modulus: int, dim: int) -> np.ndarray:
    """``dim`` integers uniform modulo ``modulus`` (a power of two ≤ 2**32) from a seed.

    The AES-256-CTR key stream under the key SHA-256(seed), read as little-endian uint32.
    """
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    key = hashlib.sha256(seed).digest()
    enc = Cipher(algorithms.AES(key), modes.CTR(b"\0" * 16)).encryptor()
    stream = enc.update(b"\0" * (4 * dim)) + enc.finalize()
    return np.frombuffer(stream, dtype="<u4").astype(np.int64) & (modulus - 1)


# ----------------------------------------------------------------------------- wire format
def _enc(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return {"b64": base64.b64encode(obj).decode()}
    if isinstance(obj, dict):
        return {k: _enc(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_enc(v) for v in obj]
    return obj


def _dec(obj: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {"b64"}:
            return base64.b64decode(obj["b64"])
        return {k: _dec(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_dec(v) for v in obj]
    return obj


def dumps(obj: dict[str, Any]) -> str:
    """JSON of a protocol payload (bytes as base64)."""
    return json.dumps(_enc(obj))


def loads(text: str) -> dict[str, Any]:
    """Inverse of :func:`dumps`."""
    return dict(_dec(json.loads(text)))


# ----------------------------------------------------------------------------- node side
def _shared_key(private_pem: bytes, public_pem: bytes) -> bytes:
    return bytes(_flwr_compat.secagg_primitives().shared_key(private_pem, public_pem))


def _key_pair() -> tuple[bytes, bytes]:
    return tuple(_flwr_compat.secagg_primitives().key_pair())  # type: ignore[return-value]


def _plaintext(src: int, dst: int, seed_share: bytes, sk_share: bytes) -> bytes:
    return b"".join(
        [
            src.to_bytes(8, "little"),
            dst.to_bytes(8, "little"),
            len(seed_share).to_bytes(4, "little"),
            seed_share,
            sk_share,
        ]
    )


def _split_plaintext(data: bytes) -> tuple[int, int, bytes, bytes]:
    mark = int.from_bytes(data[16:20], "little")
    return (
        int.from_bytes(data[:8], "little"),
        int.from_bytes(data[8:16], "little"),
        data[20 : 20 + mark],
        data[20 + mark :],
    )


def node_stage(
    payload: dict[str, Any],
    state: dict[str, Any],
    node_id: int,
    vector: Callable[[], np.ndarray],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One SecAgg+ stage on a node: returns the reply and the node's new protocol state.

    ``payload`` is the server's message (``stage`` and the stage's fields), ``state`` what this
    function returned at the previous stage of the round (empty at setup). ``vector`` is called
    at the collect stage only: it trains the node's sampled clients and returns their
    :func:`quantize_clients` vector.
    """
    crypto = _flwr_compat.secagg_primitives()
    create_shares, encrypt, decrypt = crypto.create_shares, crypto.encrypt, crypto.decrypt
    stage = payload["stage"]
    expected = {SETUP: None, SHARE_KEYS: SETUP, COLLECT: SHARE_KEYS, UNMASK: COLLECT}
    if stage not in expected:
        raise SecureAggregationError(f"unknown SecAgg+ stage {stage!r}")
    if stage != SETUP and state.get("stage") != expected[stage]:
        raise SecureAggregationError(
            f"node {node_id}: SecAgg+ stage {stage!r} after {state.get('stage')!r}"
        )
    if stage == SETUP:
        sk1, pk1 = _key_pair()
        sk2, pk2 = _key_pair()
        new = {
            "stage": SETUP,
            "round": int(payload["round"]),
            "share_num": int(payload["share_num"]),
            "threshold": int(payload["threshold"]),
            "modulus_range": int(payload["modulus_range"]),
            "sk1": sk1,
            "pk1": pk1,
            "sk2": sk2,
            "pk2": pk2,
        }
        return {"pk1": pk1, "pk2": pk2}, new
    new = dict(state)
    new["stage"] = stage
    threshold = int(state["threshold"])
    if stage == SHARE_KEYS:
        keys = {int(nid): (pk1, pk2) for nid, pk1, pk2 in payload["keys"]}
        if len(keys) < threshold:
            raise SecureAggregationError(f"node {node_id}: fewer neighbours than the threshold")
        if keys.get(node_id) != (state["pk1"], state["pk2"]):
            raise SecureAggregationError(f"node {node_id}: its own public keys were altered")
        flat = [k for pair in keys.values() for k in pair]
        if len(set(flat)) != len(flat):
            raise SecureAggregationError(f"node {node_id}: repeated public keys")
        seed = os.urandom(32)
        seed_shares = create_shares(seed, threshold, int(state["share_num"]))
        sk_shares = create_shares(state["sk1"], threshold, int(state["share_num"]))
        own: dict[str, list[bytes]] = {}
        dsts, ctxts, ss2 = [], [], {}
        for idx, (nid, (_, pk2)) in enumerate(keys.items()):
            if nid == node_id:
                own[str(nid)] = [seed_shares[idx], sk_shares[idx]]
                continue
            key = _shared_key(state["sk2"], pk2)
            ss2[str(nid)] = key
            dsts.append(nid)
            ctxts.append(encrypt(key, _plaintext(node_id, nid, seed_shares[idx], sk_shares[idx])))
        new.update(
            seed=seed,
            shares=own,
            ss2=ss2,
            pk1s={str(nid): pair[0] for nid, pair in keys.items()},
        )
        return {"dsts": dsts, "ctxts": ctxts}, new
    if stage == COLLECT:
        srcs = [int(v) for v in payload["srcs"]]
        if len(srcs) + 1 < threshold:
            raise SecureAggregationError(f"node {node_id}: fewer neighbours than the threshold")
        shares = dict(state["shares"])
        for src, ctxt in zip(srcs, payload["ctxts"], strict=True):
            actual, dst, seed_share, sk_share = _split_plaintext(
                decrypt(state["ss2"][str(src)], ctxt)
            )
            if actual != src or dst != node_id:
                raise SecureAggregationError(
                    f"node {node_id}: a key share from {actual} to {dst} arrived as from {src}"
                )
            shares[str(src)] = [seed_share, sk_share]
        mod = int(state["modulus_range"])
        vec = np.asarray(vector(), dtype=np.int64) % mod
        vec = (vec + mask_stream(state["seed"], mod, vec.size)) % mod
        for src in srcs:
            pair = mask_stream(_shared_key(state["sk1"], state["pk1s"][str(src)]), mod, vec.size)
            vec = (vec + pair if node_id > src else vec - pair) % mod
        new.update(shares=shares, ss2={})
        return {"masked": vec.astype("<u8").tobytes()}, new
    # UNMASK: the seed share of every neighbour in the sum, the key share of every dropped one
    active = [int(v) for v in payload["active"]]
    dead = [int(v) for v in payload["dead"]]
    if set(active) & set(dead):
        raise SecureAggregationError(f"node {node_id}: a node both in and out of the sum")
    if len(active) < threshold:
        raise SecureAggregationError(f"node {node_id}: fewer active neighbours than the threshold")
    shares = state["shares"]
    nids = [nid for nid in active + dead if str(nid) in shares]
    out = [shares[str(nid)][0] for nid in active if str(nid) in shares]
    out += [shares[str(nid)][1] for nid in dead if str(nid) in shares]
    new.update(shares={}, seed=b"", sk1=b"", sk2=b"")
    return {"nids": nids, "shares": out}, new


# ----------------------------------------------------------------------------- server side
@dataclass
class SecureSum:
    """What one SecAgg+ round gave the server: the integer total and whose vectors are in it."""

    total: np.ndarray
    included: list[int]
    dropped: list[int]
    num_shares: int
    threshold: int


Exchange = Callable[[str, dict[int, dict[str, Any]]], dict[int, dict[str, Any]]]


class SecAggServer:
    """The server side of SecAgg+ rounds (the stages of Flower's ``SecAggPlusWorkflow``).

    Parameters
    ----------
    params : SecAggParams
    num_shares, threshold : int
        0 for the defaults of :func:`round_shares`.
    """

    def __init__(self, params: SecAggParams, *, num_shares: int = 0, threshold: int = 0) -> None:
        self.params = params
        self.num_shares = int(num_shares)
        self.threshold = int(threshold)

    def run(self, nodes: list[int], exchange: Exchange, round_index: int = 0) -> SecureSum:
        """One round among ``nodes``; ``exchange(stage, {node: payload})`` returns the replies
        of the nodes that answered (``{node: reply}``)."""
        combine_shares = _flwr_compat.secagg_primitives().combine_shares
        mod = self.params.modulus_range
        n = len(nodes)
        shares, thr = round_shares(n, self.num_shares, self.threshold)
        if n < 3 or not 2 <= thr <= shares:
            raise SecureAggregationError(
                f"SecAgg+ needs >= 3 nodes and 2 <= threshold <= shares; got {n} nodes, "
                f"{shares} shares, threshold {thr}"
            )
        order = list(nodes)
        random.SystemRandom().shuffle(order)
        half = shares >> 1
        neigh = {
            nid: {order[(i + o) % n] for o in range(-half, half + 1)} for i, nid in enumerate(order)
        }

        def check(alive: set[int], what: str) -> None:
            for nid in alive:
                if len(neigh[nid] & alive) < thr:
                    raise SecureAggregationError(
                        f"SecAgg+ {what}: node {nid} has fewer than {thr} live neighbours "
                        f"({len(alive)} of {n} nodes answered)"
                    )

        setup = {
            "stage": SETUP,
            "round": round_index,
            "share_num": shares,
            "threshold": thr,
            "modulus_range": mod,
        }
        replies = exchange(SETUP, {nid: dict(setup) for nid in nodes})
        pks = {nid: (r["pk1"], r["pk2"]) for nid, r in replies.items()}
        alive = set(replies)
        check(alive, SETUP)

        msgs: dict[int, dict[str, Any]] = {
            nid: {
                "stage": SHARE_KEYS,
                "keys": [[j, *pks[j]] for j in sorted(neigh[nid] & alive)],
            }
            for nid in alive
        }
        replies = exchange(SHARE_KEYS, msgs)
        shared = set(replies)
        fwd: dict[int, list[tuple[int, bytes]]] = {nid: [] for nid in shared}
        for src, r in replies.items():
            for dst, ctxt in zip(r["dsts"], r["ctxts"], strict=True):
                if int(dst) in fwd:
                    fwd[int(dst)].append((src, ctxt))
        check(shared, SHARE_KEYS)

        msgs = {
            nid: {
                "stage": COLLECT,
                "srcs": [s for s, _ in fwd[nid]],
                "ctxts": [c for _, c in fwd[nid]],
            }
            for nid in shared
        }
        replies = exchange(COLLECT, msgs)
        included = set(replies)
        total = np.zeros(self.params.dim, dtype=np.int64)
        for r in replies.values():
            total = (total + np.frombuffer(r["masked"], dtype="<u8").astype(np.int64)) % mod
        check(included, COLLECT)

        dead = shared - included
        msgs = {
            nid: {
                "stage": UNMASK,
                "active": sorted(neigh[nid] & included),
                "dead": sorted(neigh[nid] & dead),
            }
            for nid in included
        }
        replies = exchange(UNMASK, msgs)
        collected: dict[int, list[bytes]] = {nid: [] for nid in included | dead}
        for r in replies.values():
            for owner, share in zip(r["nids"], r["shares"], strict=True):
                if int(owner) in collected:
                    collected[int(owner)].append(share)
        for nid, got in collected.items():
            if len(got) < thr:
                raise SecureAggregationError(
                    f"SecAgg+ unmask: {len(got)} shares of node {nid}, {thr} needed"
                )
            secret = combine_shares(got)
            if nid in included:  # its private mask
                total = (total - mask_stream(secret, mod, total.size)) % mod
                continue
            # a node that shared keys but sent no vector: its pairwise masks with the
            # neighbours in the sum stay in the total; rebuild them from its first secret key
            for j in neigh[nid] & included:
                pair = mask_stream(_shared_key(secret, pks[j][0]), mod, total.size)
                total = (total - pair if j > nid else total + pair) % mod
        return SecureSum(
            total=total,
            included=sorted(included),
            dropped=sorted(set(nodes) - included),
            num_shares=shares,
            threshold=thr,
        )


# ----------------------------------------------------------------------------- Flower glue
_STATE_KEY = "privmtl-secagg"
MESSAGE_TYPE = "train.secagg"


def node_vector(messages: Params, spec: dict[str, Any], partition_id: int) -> np.ndarray:
    """The node's :func:`quantize_clients` vector for the round described by ``spec``.

    ``spec`` is the round's JSON (``names``, ``secagg`` parameters, ``round`` and ``config``).
    The rounding draws come from OS entropy, or in reproducible-noise mode from a generator
    seeded by (seed, round, partition), so that a seeded run repeats exactly.
    """
    import secrets

    params = SecAggParams(**spec["secagg"])
    cfg = spec["config"]
    if cfg.get("noise_source") == "seeded":
        rng = np.random.default_rng([int(cfg["seed"]), int(spec["round"]), int(partition_id)])
    else:
        rng = np.random.default_rng(secrets.randbits(128))
    return quantize_clients(messages, list(spec["names"]), params, rng)


def client_message(msg: Any, context: Any, vector: Callable[[Any], np.ndarray]) -> Any:
    """Answer one ``train.secagg`` message on a node (state kept in ``Context.state``)."""
    from flwr.app import ConfigRecord, Message, RecordDict

    payload = loads(str(msg.content.config_records["secagg"]["json"]))
    state: dict[str, Any] = {}
    if _STATE_KEY in context.state.config_records:
        state = loads(str(context.state.config_records[_STATE_KEY]["json"]))
    reply, new = node_stage(payload, state, int(msg.metadata.dst_node_id), lambda: vector(msg))
    context.state[_STATE_KEY] = ConfigRecord({"json": dumps(new)})
    return Message(RecordDict({"secagg": ConfigRecord({"json": dumps(reply)})}), reply_to=msg)


def grid_exchange(grid: Any, collect: dict[int, dict[str, Any]], timeout: float) -> Exchange:
    """An :data:`Exchange` over Flower's ``Grid``; ``collect`` holds each node's train records
    (billboard and round), sent along with the collect stage."""
    from flwr.app import ConfigRecord, Message, RecordDict

    def exchange(stage: str, payloads: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        msgs = []
        for nid, payload in payloads.items():
            parts = dict(collect[nid]) if stage == COLLECT else {}
            parts["secagg"] = ConfigRecord({"json": dumps(payload)})
            msgs.append(Message(RecordDict(parts), dst_node_id=nid, message_type=MESSAGE_TYPE))
        out = {}
        for reply in send_and_receive(grid, msgs, timeout):
            if not reply.has_error():
                text = str(reply.content.config_records["secagg"]["json"])
                out[int(reply.metadata.src_node_id)] = loads(text)
        return out

    return exchange


def describe(
    params: SecAggParams, server: SecAggServer, num_nodes: int, bounds: list[float]
) -> dict[str, Any]:
    """The ``secure_aggregation`` entry of a run's JSON."""
    shares, thr = round_shares(num_nodes, server.num_shares, server.threshold)
    return {
        "protocol": "secagg+",
        "implementation": "privmtl.flower.secagg on flwr.common.secure_aggregation primitives",
        "clipping": "client-side",
        "trust_model": TRUST_MODEL,
        "noise": "server-side (central DP)",
        "sensitivity": "gamma/q of the mean (add/remove one client), as without secure aggregation",
        **params.describe(),
        "num_shares": shares,
        "reconstruction_threshold": thr,
        "max_quantization_error": max(bounds) if bounds else 0.0,
        "quantization_error_bound_per_round": bounds,
    }
