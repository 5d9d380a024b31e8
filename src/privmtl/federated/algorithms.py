"""Pieces shared by the batched engine and the per-client reference loop.

Everything random is drawn here, in a fixed order, so that both paths consume identical draws:

* client sampling: ``sampler.sample(rng_sampling)`` with ``rng_sampling`` a numpy Generator seeded
  by ``(seed, 0)``;
* local minibatches of client ``k`` in round ``t``: a function of ``(seed, 1, t, k)`` and the
  client's own size (:func:`draw_round_plan`: its epochs' permutations by a hash keyed by the
  seed sequence of those words, for all clients in one vectorised call; with ``local_steps``, a
  numpy Generator seeded by them); a client's draws therefore do not depend on which other
  clients were sampled or on their data sizes;
* server noise (seeded mode): ``torch.randn`` from a ``torch.Generator`` seeded from ``(seed, 2)``,
  one tensor per parameter in ``model.named_parameters()`` order
  (:class:`~privmtl.privacy.noise.SeededNoise`; :func:`draw_noise` draws the same).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from privmtl._seeding import WORD_MAX, generators_from_states, seed_sequence_states
from privmtl.exceptions import InvalidParameterError
from privmtl.privacy.noise import seeded_torch_generator
from privmtl.privacy.release import clip_factors

if TYPE_CHECKING:  # annotations only: the run's configuration sits above this module
    from privmtl.federated.config import TrainConfig

__all__ = [
    "LOCAL_TRAINING_STREAM",
    "PLAN_HASH_BITS",
    "PackedPlan",
    "Params",
    "RoundPlan",
    "client_generators",
    "client_key_words",
    "clip_factors",
    "draw_noise",
    "draw_round_plan",
    "noise_generator",
    "pack_plan",
    "pad_plan",
    "partition_plan",
    "sampling_rng",
]

Params = dict[str, torch.Tensor]


# ---------------------------------------------------------------------------- random streams
def sampling_rng(seed: int) -> np.random.Generator:
    """The numpy Generator used for client sampling."""
    return np.random.default_rng([seed, 0])


LOCAL_TRAINING_STREAM = 1
"""The stream of :func:`draw_round_plan` of every method's local training in its rounds."""


def noise_generator(seed: int) -> torch.Generator:
    """The torch Generator of the server's seeded Gaussian noise (:class:`SeededNoise` ``(seed)``)."""
    return seeded_torch_generator(seed, (2,))


def _client_batches(
    n: int, base: int, rng: np.random.Generator, config: TrainConfig
) -> list[np.ndarray]:
    """One client's minibatches (rows ``base + i`` of its ``n`` rows): one draw per epoch, the
    epoch's minibatches are views of it."""
    b = config.batch_size
    if not config.epochs_mode:
        size = min(b, n)
        return [rng.choice(n, size=size, replace=False) + base for _ in range(config.n_local_steps)]
    out: list[np.ndarray] = []
    for _ in range(config.n_local_epochs):
        perm = rng.permutation(n) + base
        out.extend(perm[i : i + b] for i in range(0, n, b))
    return out


def client_generators(
    seed: int, stream: int, round_index: int, clients: np.ndarray
) -> Iterator[np.random.Generator]:
    """``default_rng([seed, stream, round_index, k])`` for every client ``k`` of ``clients``, in
    order: the same generators, their seed sequences hashed for all clients in one vectorised
    call (:func:`~privmtl._seeding.seed_sequence_states`) where every entropy value is one 32-bit word, else one
    by one."""
    ks = np.asarray(clients, dtype=np.int64).reshape(-1)
    head = (seed, stream, round_index)
    words_ok = all(type(v) is int or isinstance(v, np.integer) for v in head) and all(
        0 <= int(v) <= WORD_MAX for v in head
    )
    if not (words_ok and (ks.size == 0 or (int(ks.min()) >= 0 and int(ks.max()) <= WORD_MAX))):
        for k in ks.tolist():
            yield np.random.default_rng([seed, stream, round_index, k])
        return
    entropy = np.empty((ks.size, 4), dtype=np.uint64)
    entropy[:, :3] = [int(v) for v in head]
    entropy[:, 3] = ks
    yield from generators_from_states(seed_sequence_states(entropy))


@dataclass(frozen=True)
class PackedPlan:
    """A round plan (:func:`draw_round_plan`) as arrays, for :func:`pack_plan`'s loop.

    The clients are taken in ``order`` (by decreasing number of steps, ties in plan order), so
    that the clients still training at step ``s`` are the first ``bounds[s + 1] - bounds[s]``
    of that order; ``rows[bounds[s]:bounds[s + 1]]`` are their minibatches of step ``s`` (in
    that order, padded to the batch size with row 0) and ``weights`` the rows' weights
    (``1 / |batch|``, 0 for padding). ``steps[j]`` is the ``j``-th client's number of steps.
    """

    order: np.ndarray
    steps: np.ndarray
    bounds: np.ndarray
    rows: np.ndarray
    weights: np.ndarray

    @property
    def n_clients(self) -> int:
        return len(self.steps)

    @property
    def n_steps(self) -> int:
        return len(self.bounds) - 1


def _packed_order(steps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:class:`PackedPlan`'s ``order`` and ``bounds`` of clients of ``steps`` steps, and each
    client's place in that order (``rank``)."""
    k = len(steps)
    order = np.argsort(-steps, kind="stable")
    rank = np.empty(k, dtype=np.int64)
    rank[order] = np.arange(k)
    n_steps = int(steps.max(initial=0))
    # clients still training at step s: those with more than s steps (a prefix of the order)
    active = np.bincount(steps, minlength=n_steps + 1)[::-1].cumsum()[::-1][1:]
    bounds = np.concatenate([[0], np.cumsum(active)]).astype(np.int64)
    return order, rank, bounds


def pack_plan(plan: Sequence[Sequence[np.ndarray]] | PackedPlan, batch_size: int) -> PackedPlan:
    """:class:`PackedPlan` of ``plan``, built with one concatenation and array arithmetic (no
    loop over clients or minibatches beyond listing them); a plan already packed
    (:class:`RoundPlan`, of the same batch size) is itself."""
    if isinstance(plan, PackedPlan):
        if plan.rows.shape[1] != batch_size:
            raise InvalidParameterError(
                f"The plan is packed for minibatches of {plan.rows.shape[1]} rows, not the "
                f"'batch_size' {batch_size}."
            )
        return plan
    k = len(plan)
    steps = np.fromiter(map(len, plan), dtype=np.int64, count=k)
    order, rank, bounds = _packed_order(steps)
    batches = [b for p in plan for b in p]
    lengths = np.fromiter(map(len, batches), dtype=np.int64, count=len(batches))
    if len(lengths) and int(lengths.max()) > batch_size:
        raise InvalidParameterError(
            f"A minibatch of the plan has {int(lengths.max())} rows, more than the "
            f"'batch_size' {batch_size}."
        )
    client = np.repeat(np.arange(k), steps)
    step = np.arange(len(batches)) - np.repeat(np.cumsum(steps) - steps, steps)
    slot = bounds[step] + rank[client]
    rows = np.zeros((len(batches), batch_size), dtype=np.int64)
    weights = np.zeros((len(batches), batch_size), dtype=np.float64)
    if batches:
        at = np.repeat(slot, lengths)
        col = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        rows[at, col] = np.concatenate(batches)
        weights[at, col] = np.repeat(1.0 / np.maximum(lengths, 1), lengths)
    return PackedPlan(order, steps, bounds, rows, weights)


@dataclass(frozen=True, eq=False)
class RoundPlan(PackedPlan):
    """A round plan (:func:`draw_round_plan`): packed for the batched loop, and read as the
    list of each client's minibatches (``plan[j][s]``, the rows of step ``s`` of the ``j``-th
    client, made when read) by the paths that go client by client. ``lengths`` are the rows of
    each packed minibatch, ``rank[j]`` the ``j``-th client's place in ``order``."""

    lengths: np.ndarray
    rank: np.ndarray

    @classmethod
    def of(cls, packed: PackedPlan) -> RoundPlan:
        """The :class:`RoundPlan` of a packed plan."""
        rank = np.empty(packed.n_clients, dtype=np.int64)
        rank[packed.order] = np.arange(packed.n_clients)
        lengths = (packed.weights > 0).sum(axis=1)
        return cls(
            packed.order, packed.steps, packed.bounds, packed.rows, packed.weights, lengths, rank
        )

    def __len__(self) -> int:
        return self.n_clients

    def __getitem__(self, j: int) -> list[np.ndarray]:
        i = operator.index(j)
        if not -self.n_clients <= i < self.n_clients:
            raise IndexError(f"client {j} out of range for a plan of {self.n_clients}")
        i %= self.n_clients
        slots = self.bounds[: int(self.steps[i])] + self.rank[i]
        return [self.rows[s, : self.lengths[s]] for s in slots.tolist()]

    def __iter__(self) -> Iterator[list[np.ndarray]]:
        return (self[j] for j in range(self.n_clients))

    def lists(self) -> list[list[np.ndarray]]:
        """Every client's minibatches as lists (the per-client paths' form)."""
        return list(self)


PLAN_HASH_BITS = 40
"""The bits of a row's hash that order a client's permutation (:func:`draw_round_plan`)."""
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_FMIX = (np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53))
_SORT_BITS = 64 - PLAN_HASH_BITS  # a segment's index and a row's index share the rest


def _fmix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser (a bijection of uint64), in place."""
    s = np.uint64(33)
    x ^= x >> s
    x *= _FMIX[0]
    x ^= x >> s
    x *= _FMIX[1]
    x ^= x >> s
    return x


def client_key_words(seed: int, stream: int, round_index: int, clients: np.ndarray) -> np.ndarray:
    """The first two words of ``SeedSequence([seed, stream, round_index, k]).generate_state(4,
    np.uint64)`` for every client ``k`` (``(K, 2)`` uint64): the keys of the round plan's hash,
    hashed for all clients in one vectorised call where every entropy value is one 32-bit word,
    else one by one."""
    ks = np.asarray(clients, dtype=np.int64).reshape(-1)
    head = (seed, stream, round_index)
    words_ok = all(type(v) is int or isinstance(v, np.integer) for v in head) and all(
        0 <= int(v) <= WORD_MAX for v in head
    )
    if not (words_ok and (ks.size == 0 or (int(ks.min()) >= 0 and int(ks.max()) <= WORD_MAX))):
        out = np.empty((ks.size, 2), dtype=np.uint64)
        for j, k in enumerate(ks.tolist()):
            seq = np.random.SeedSequence([seed, stream, round_index, k])
            out[j] = seq.generate_state(4, np.uint64)[:2]
        return out
    entropy = np.empty((ks.size, 4), dtype=np.uint64)
    entropy[:, :3] = [int(v) for v in head]
    entropy[:, 3] = ks
    return seed_sequence_states(entropy)[:, :2]


def _epoch_permutations(keys: np.ndarray, sizes: np.ndarray, epochs: int) -> np.ndarray:
    """Every client's permutation of each epoch, concatenated client after client, epoch after
    epoch (a client's ``n`` row indices in ``[0, n)`` per epoch): row ``i`` of epoch ``e`` of a
    client of key words ``(w0, w1)`` is ordered by the top :data:`PLAN_HASH_BITS` bits of
    ``h = fmix64(fmix64(w0 + c * G) ^ w1)``, ``c = e * 2**32 + i``, ``G`` = 0x9E3779B97F4A7C15,
    ties (rare) by ``i``. One hash and one sort for all clients and epochs."""
    seg_len = np.repeat(sizes, epochs)
    total = int(seg_len.sum())
    seg_start = np.cumsum(seg_len) - seg_len
    seg = np.repeat(np.arange(len(seg_len), dtype=np.uint64), seg_len)
    i = (np.arange(total, dtype=np.int64) - np.repeat(seg_start, seg_len)).astype(np.uint64)
    e = np.tile(np.arange(epochs, dtype=np.uint64), len(sizes))  # each segment's epoch
    counter = np.repeat(e << np.uint64(32), seg_len) | i
    w = np.repeat(np.repeat(keys, epochs, axis=0), seg_len, axis=0)
    with np.errstate(over="ignore"):
        h = counter * _GOLDEN
        h += w[:, 0]
        _fmix64(h)
        h ^= w[:, 1]
        _fmix64(h)
    h >>= np.uint64(64 - PLAN_HASH_BITS)
    i_bits = max(int(sizes.max(initial=1)) - 1, 1).bit_length()
    s_bits = max(len(seg_len) - 1, 1).bit_length()
    if i_bits + s_bits <= _SORT_BITS:  # one uint64 per row: (segment, hash, row), all distinct
        comb = (seg << np.uint64(64 - s_bits)) | (h << np.uint64(i_bits)) | i
        comb.sort()
        return (comb & np.uint64((1 << i_bits) - 1)).astype(np.int64)
    return i[np.lexsort((i, h, seg))].astype(np.int64)


def draw_round_plan(
    sampled: Sequence[int] | np.ndarray,
    offsets: np.ndarray,
    round_index: int,
    config: TrainConfig,
    *,
    stream: int = LOCAL_TRAINING_STREAM,
    starts: np.ndarray | None = None,
) -> RoundPlan:
    """Minibatches of every sampled client for one round, as rows of the stacked train data.

    ``plan[j][s]`` holds the rows (into ``dataset.concat("train")``, or, with ``starts``, into
    the stacked rows of the sampled clients whose ``j``-th begins at ``starts[j]``:
    ``dataset.take(sampled)``) of step ``s`` of the ``j``-th sampled client; see
    :class:`~privmtl.federated.config.TrainConfig` for how steps are defined. ``offsets`` are
    the population's (client ``k``'s size is ``offsets[k + 1] - offsets[k]``). The plan comes
    packed (:class:`RoundPlan`, a :class:`PackedPlan` read as the list of each client's
    minibatches).

    Client ``k``'s draws are a function of ``(seed, stream, round_index, k)`` and its own
    size alone, never of the other sampled clients: ``stream`` 1 is the local training of
    every method; other streams are independent draws (``fedrep``'s head training uses 3 in
    its rounds and 4 at the end). With local epochs (the default), epoch ``e`` is a
    permutation of the client's ``n`` rows cut into minibatches of ``batch_size`` in turn (the
    last one shorter): its row ``i`` is ordered by a keyed hash of the counter
    ``e * 2**32 + i``, keyed by the first two words ``(w0, w1)`` of
    ``SeedSequence([seed, stream, round_index, k]).generate_state(4, uint64)``:
    ``fmix64(fmix64(w0 + c * 0x9E3779B97F4A7C15) ^ w1)`` (MurmurHash3's finaliser), its top
    :data:`PLAN_HASH_BITS` bits, ties by ``i``. Every client's every epoch is hashed and
    sorted in one vectorised call. With ``local_steps``, each step's minibatch is
    ``rng.choice(n, min(batch_size, n), replace=False)`` of the client's own generator
    ``default_rng([seed, stream, round_index, k])`` (:func:`client_generators`).
    """
    ks = (
        sampled.astype(np.int64).reshape(-1)
        if isinstance(sampled, np.ndarray)
        else np.fromiter((int(k) for k in sampled), dtype=np.int64)
    )
    offsets = np.asarray(offsets, dtype=np.int64)
    sizes = offsets[ks + 1] - offsets[ks]
    bases = offsets[ks] if starts is None else np.asarray(starts, dtype=np.int64)[: len(ks)]
    b = config.batch_size
    if not config.epochs_mode:
        gens = client_generators(config.seed, stream, round_index, ks)
        lists = [
            _client_batches(int(n), int(base), rng, config)
            for n, base, rng in zip(sizes.tolist(), bases.tolist(), gens, strict=True)
        ]
        return RoundPlan.of(pack_plan(lists, b))
    epochs = config.n_local_epochs
    keys = client_key_words(config.seed, stream, round_index, ks)
    perm = _epoch_permutations(keys, sizes, epochs)
    per_epoch = -(-sizes // b)  # minibatches of an epoch: ceil(n / b)
    steps = epochs * per_epoch
    order, rank, bounds = _packed_order(steps)
    # the p-th row of a client's epoch e goes to its step e * per_epoch + p // b, column p % b
    seg_len = np.repeat(sizes, epochs)
    p = np.arange(len(perm), dtype=np.int64) - np.repeat(np.cumsum(seg_len) - seg_len, seg_len)
    client = np.repeat(np.arange(len(ks)), sizes * epochs)
    e = np.repeat(np.tile(np.arange(epochs), len(ks)), seg_len)
    step = e * per_epoch[client] + p // b
    slot = bounds[step] + rank[client]
    n_slots = int(bounds[-1])
    rows = np.zeros((n_slots, b), dtype=np.int64)
    weights = np.zeros((n_slots, b), dtype=np.float64)
    rows[slot, p % b] = perm + bases[client]
    # a minibatch of a client of n rows: b rows, the epoch's last n - (per_epoch - 1) * b
    s_client = np.repeat(np.arange(len(ks)), steps)
    s_step = np.arange(int(steps.sum())) - np.repeat(np.cumsum(steps) - steps, steps)
    u = s_step % np.maximum(per_epoch, 1)[s_client]
    lengths = np.zeros(n_slots, dtype=np.int64)
    s_slot = bounds[s_step] + rank[s_client]
    lengths[s_slot] = np.minimum(b, sizes[s_client] - u * b)
    weights[slot, p % b] = 1.0 / lengths[slot]
    return RoundPlan(order, steps, bounds, rows, weights, lengths, rank)


def pad_plan(
    plan: list[list[np.ndarray]], batch_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad a round plan to ``(S, K, B)`` row indices, per-row weights and ``(S, K)`` activity.

    ``weights[s, j, i] = 1 / |batch|`` for real rows and 0 for padding (so the weighted sum of
    per-example losses is the minibatch mean), ``active[s, j] = 1`` while client ``j`` still has
    steps to run. Padded rows point at row 0 with weight 0.
    """
    k = len(plan)
    s = max((len(p) for p in plan), default=0)
    rows = np.zeros((s, k, batch_size), dtype=np.int64)
    weights = np.zeros((s, k, batch_size), dtype=np.float64)
    active = np.zeros((s, k), dtype=np.float32)
    for j, steps in enumerate(plan):
        for t, idx in enumerate(steps):
            rows[t, j, : len(idx)] = idx
            weights[t, j, : len(idx)] = 1.0 / len(idx)
            active[t, j] = 1.0
    return torch.from_numpy(rows), torch.from_numpy(weights), torch.from_numpy(active)


def partition_plan(
    plan: Sequence[Sequence[np.ndarray]] | PackedPlan, n_groups: int, max_group: int | None = None
) -> list[np.ndarray]:
    """Split the clients of a round plan into groups of nearly equal work (number of steps).

    Greedy longest-processing-time scheduling: clients in decreasing order of steps, each to the
    group with the least work so far. There are ``n_groups * ceil(K / (n_groups * max_group))``
    groups (``K`` clients), i.e. ``max_group`` clients per group on average (a group may hold more
    clients with little work each), so that ``n_groups`` workers taking the groups in order get
    nearly equal work. Returns the client positions (into ``plan``) of every non-empty group, each
    in increasing order.
    """
    steps = plan.steps if isinstance(plan, PackedPlan) else np.array([len(p) for p in plan])
    k = len(steps)
    per_worker = 1 if max_group is None else max(1, -(-k // (n_groups * max_group)))
    n = min(k, n_groups * per_worker)
    if n == 0:
        return []
    load = np.zeros(n)
    members: list[list[int]] = [[] for _ in range(n)]
    for j in np.argsort(-steps, kind="stable"):
        g = int(np.argmin(load))
        members[g].append(int(j))
        load[g] += steps[j]
    return [np.sort(np.asarray(g, dtype=np.int64)) for g in members if g]


def draw_noise(template: Params, std: float, gen: torch.Generator) -> Params | None:
    """``N(0, std² I)`` for every parameter (in ``template`` order), or None if ``std == 0``."""
    if std == 0:
        return None
    return {
        name: torch.randn(p.shape, generator=gen, dtype=p.dtype) * std
        for name, p in template.items()
    }
