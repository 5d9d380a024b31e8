"""A synthetic federated classification problem in the spirit of LEAF's ``synthetic(alpha, beta)``
(Li et al., FedProx): :func:`make_synthetic_federated` draws per-client softmax models scattered
around a shared one, per-client feature shifts and unequal client sizes, so that both federation
(shared part) and personalization (client part) help; :func:`synthetic_law` is the law it draws
from. (MP-MTL's synthetic regression data are :mod:`privmtl.data.synthetic`.)

Random streams: the shared part (:math:`W_0`, then :math:`b_0`, then every client's size in one
vectorised draw) comes from the generator of ``random_state`` (``numpy.random.default_rng(seed)``
for an int). Client :math:`k`'s draws come from a generator of its own,
``Generator(PCG64(SeedSequence(entropy, spawn_key=(k,))))`` (:meth:`SyntheticLaw.client_rng`): for
an int seed ``entropy`` is the seed, so client :math:`k`'s generator is the :math:`k`-th child of
``SeedSequence(seed).spawn``; for a Generator (or None) ``entropy`` is 128 bits drawn from it once,
after the shared part. A client is therefore drawn from ``(seed, k)`` and its size alone, without
drawing any other client: the first :math:`m'` clients of a federation of :math:`m > m'` clients
are those of the federation of :math:`m'` clients for the same seed, and
:class:`~privmtl.data.streamed.SyntheticFederation` draws any client directly. SeedSequence's spawn
keys give statistically independent streams; PCG64 is numpy's default bit generator and draws
normals faster than Philox, whose keyed construction is slightly cheaper but a small part of a
client's draw.

Within client :math:`k`'s stream (:meth:`SyntheticLaw.draw_into`): its model, bias, feature shift
and mean first, then its splits in the order train, validation, test (:data:`SPLIT_ORDER`), each
split its own standard normal features, label-noise coins and noise labels, its labels
computed from its own features. A client's standard normals (its model's, bias's and mean's,
and its features') are read from a table of :math:`2^{16}` normal quantiles by 16-bit words of
its generator (:func:`quantile_normals`): a normal variable rounded to the middle of its
:math:`2^{-16}`-probability cell, a table read per value instead of numpy's ziggurat, and the same
bits on every machine. A client's examples are i.i.d., so the split is positional (no
permutation), and taking a round's training rows stops after them: the validation and test rows
are drawn only when asked for. The stream is named by :data:`SYNTHETIC_STREAM`, which the lazy
federation's fingerprint includes. Earlier versions drew numpy's standard normals (version 3),
before that every example of a client in float64 then a permutation that split them: the
clients' sizes and the law of their data are unchanged (up to the quantile rounding), their
examples are not, so seeded synthetic results differ from those versions'.
"""

from __future__ import annotations

import bisect
import math
import numbers
import operator
import statistics
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch

from privmtl._seeding import spawned_generators
from privmtl._validation import (
    CLIENT_BYTES,
    check_choice,
    check_int,
    check_memory,
    check_real,
    check_rng,
)
from privmtl.data.federated_dataset import FederatedDataset
from privmtl.exceptions import InvalidParameterError

__all__ = [
    "DRAW_CHUNK_ROWS",
    "FEATURE_COVS",
    "LEAF_SIZE_BOUNDS",
    "LEAF_SIZE_LOGNORMAL",
    "NORMAL_TABLE_BITS",
    "SPLIT_ORDER",
    "SYNTHETIC_STREAM",
    "SyntheticClientIds",
    "SyntheticLaw",
    "client_id_list",
    "make_synthetic_federated",
    "normal_quantiles",
    "quantile_indices",
    "quantile_normals",
    "synthetic_client_ids",
    "synthetic_client_sizes",
    "synthetic_law",
]


LEAF_SIZE_LOGNORMAL = (3.0, 2.0)
"""``(mu, s)`` of LEAF's law of examples per client (``data/synthetic/main.py``)."""
FEATURE_COVS = ("isotropic", "leaf")
"""Within-client feature covariances of :func:`make_synthetic_federated`."""
LEAF_SIZE_BOUNDS = (5, 1000)
"""Smallest and largest client of LEAF's law: ``n_k = min(5 + floor(LogNormal(3, 2)), 1000)``."""
DRAW_CHUNK_ROWS = 1 << 11
"""The most examples :meth:`SyntheticLaw.draw_block` draws at once (a client larger than it
alone): their float32 features and the float64 copy the labels' product reads (1.5 MB at 60
features) stay near the core between their draw and the product, and the chunk's element-wise
steps are shared by a dozen clients or more, whatever the number of clients."""
SYNTHETIC_STREAM = (
    "per-client PCG64 (SeedSequence spawn key k); splits train, val, test drawn in turn, "
    "normals from a 2^16-quantile table read by 16-bit words, no permutation; version 4"
)
"""The random streams :func:`make_synthetic_federated` draws from (the module's documentation):
part of :meth:`~privmtl.data.streamed.SyntheticFederation.content_sha256`, so that data drawn by
another stream never share a fingerprint."""
SPLIT_ORDER = ("train", "val", "test")
"""The order in which a client's stream draws its splits (:meth:`SyntheticLaw.draw_into`): the
training rows first, so that a round stops drawing after them."""


NORMAL_TABLE_BITS = 16
"""A client's standard normals are the :math:`2^{16}` quantiles of :func:`normal_quantiles`,
indexed by 16-bit words of its generator (:func:`quantile_normals`)."""


def normal_quantiles(dtype: type = np.float32) -> np.ndarray:
    r"""The quantiles :math:`\Phi^{-1}((i + 1/2) / 2^{16})`, :math:`i = 0, \ldots, 2^{16} - 1`, of
    the standard normal law, rounded to float32 (``dtype=np.float64``: the same values widened).

    Read only. A standard normal variable rounded to the middle quantile of its
    :math:`2^{-16}`-probability cell: mean 0, variance :math:`1 - 2 \cdot 10^{-5}`, largest
    magnitude 4.32. The quantiles come from :class:`statistics.NormalDist` (Wichura's AS 241, in
    double precision), then float32: the same 256 KB on every machine
    (``tests/data/test_federated.py`` pins their digest).
    """
    wide = np.dtype(dtype) == np.float64
    narrow = _QUANTILES[False]
    if narrow is None:
        dist = statistics.NormalDist()
        size = 1 << NORMAL_TABLE_BITS
        cells = (np.arange(size) + 0.5) / size
        narrow = np.array([dist.inv_cdf(p) for p in cells.tolist()], dtype=np.float32)
        narrow.flags.writeable = False
        _QUANTILES[False] = narrow
    if not wide:
        return narrow
    table = _QUANTILES[True]
    if table is None:
        table = narrow.astype(np.float64)
        table.flags.writeable = False
        _QUANTILES[True] = table
    return table


_QUANTILES: list[np.ndarray | None] = [None, None]  # float32, float64


def quantile_normals(rng: np.random.Generator, out: np.ndarray) -> None:
    """Fill ``out`` (C-contiguous, float32 or float64) with standard normals of
    :func:`normal_quantiles`: ``ceil(out.size / 4)`` raw 64-bit words of ``rng``'s bit generator,
    each read as four little-endian 16-bit indices, in order (the last word's unused ones
    dropped).

    Cheaper than ``rng.standard_normal`` (a table read per value, no ziggurat), and the same
    bits on every machine: integer draws and a table read, no floating-point arithmetic.
    """
    n = out.size
    table = _QUANTILES[out.dtype == np.float64]
    if table is None:
        table = normal_quantiles(out.dtype.type)
    table.take(quantile_indices(rng, n)[:n], out=out.reshape(-1), mode="clip")


def quantile_indices(rng: np.random.Generator, n: int) -> np.ndarray:
    """The table indices of :func:`quantile_normals`' first ``n`` normals and the rest of their
    last word: ``ceil(n / 4)`` raw 64-bit words of ``rng``'s bit generator as little-endian
    16-bit integers (``4 ceil(n / 4)`` of them, in order)."""
    words = rng.bit_generator.random_raw((n + 3) >> 2)
    if _BIG_ENDIAN:
        words = words.byteswap()
    return words.view(np.uint16)


_BIG_ENDIAN = sys.byteorder == "big"


def synthetic_client_sizes(
    n_clients: int,
    samples_per_client: int | tuple[int, int] | None = None,
    *,
    size_lognormal: tuple[float, float] = LEAF_SIZE_LOGNORMAL,
    random_state: int | np.random.Generator | None = None,
) -> np.ndarray:
    r"""Examples per client (before the train/validation/test split) of the synthetic federation.

    Parameters
    ----------
    n_clients : int
        ``m``.
    samples_per_client : int, (int, int) or None, default None
        ``None``: LEAF's law, :math:`n_k = \min(5 + \lfloor e^{Z_k} \rfloor, 1000)` with
        :math:`Z_k \sim N(\mu, s^2)` and :math:`(\mu, s)` = ``size_lognormal`` (LEAF's
        ``synthetic``: (3, 2): median 24 examples, a third of the clients below 15, about 3 %
        at the cap of 1000). An int: every client has that many. ``(lo, hi)``: log-uniform on
        ``[lo, hi]``.
    size_lognormal : (float, float), default (3.0, 2.0)
        :math:`(\mu, s)` of the lognormal law (``s >= 0``), used when ``samples_per_client`` is
        None.
    random_state : int, numpy Generator or None

    Returns
    -------
    ndarray of int64, shape (n_clients,)
    """
    m = check_int("n_clients", n_clients, low=1)
    rng = check_rng(random_state)
    if samples_per_client is None:
        if not isinstance(size_lognormal, tuple | list) or len(size_lognormal) != 2:
            raise InvalidParameterError(
                f"The 'size_lognormal' parameter must be a (mu, s) pair; got {size_lognormal!r}."
            )
        mu = check_real("size_lognormal[0]", size_lognormal[0])
        s = check_real("size_lognormal[1]", size_lognormal[1], low=0.0)
        lo, hi = LEAF_SIZE_BOUNDS
        raw = (
            np.floor(rng.lognormal(mu, s, size=m))
            if s > 0
            else np.full(m, math.floor(math.exp(mu)))
        )
        return np.asarray(np.minimum(lo + np.minimum(raw, hi), hi), dtype=np.int64)
    if isinstance(samples_per_client, tuple | list):
        if len(samples_per_client) != 2:
            raise InvalidParameterError(
                "The 'samples_per_client' parameter must be None, an int or a (low, high) pair; "
                f"got {samples_per_client!r}."
            )
        lo = check_int("samples_per_client[0]", samples_per_client[0], low=3)
        hi = check_int("samples_per_client[1]", samples_per_client[1], low=lo)
    else:
        lo = hi = check_int("samples_per_client", samples_per_client, low=3)
    if lo == hi:
        return np.full(m, lo, dtype=np.int64)
    sizes = np.floor(np.exp(rng.uniform(np.log(lo), np.log(hi + 1), size=m))).astype(np.int64)
    return np.asarray(np.clip(sizes, lo, hi), dtype=np.int64)


def make_synthetic_federated(
    *,
    n_clients: int = 50,
    n_features: int = 60,
    n_classes: int = 10,
    samples_per_client: int | tuple[int, int] | None = None,
    size_lognormal: tuple[float, float] = LEAF_SIZE_LOGNORMAL,
    heterogeneity: float = 0.5,
    feature_shift: float = 0.5,
    feature_spread: float = 0.5,
    feature_cov: str = "isotropic",
    label_noise: float = 0.0,
    test_fraction: float = 0.2,
    val_fraction: float = 0.1,
    random_state: int | np.random.Generator | None = None,
) -> FederatedDataset:
    r"""Heterogeneous synthetic federated classification (LEAF-style; softmax models around a shared one).

    For client :math:`k` (all draws independent):

    * shared model :math:`W_0 \in \mathbb{R}^{C \times d}, b_0 \in \mathbb{R}^C` with i.i.d.
      :math:`N(0, 1)` entries (drawn once);
    * client model :math:`W_k = W_0 + \tau A_k`, :math:`b_k = b_0 + \tau a_k`, :math:`A_k, a_k`
      i.i.d. :math:`N(0, 1)` (here and below, a client's normals are rounded to the
      :math:`2^{16}` quantiles of :func:`normal_quantiles`), :math:`\tau` = ``heterogeneity``;
    * features :math:`x \sim N(v_k, \Sigma)` with :math:`\Sigma = I` (``feature_cov="isotropic"``)
      or :math:`\Sigma = \mathrm{diag}(j^{-1.2})_{j=1..d}` (``"leaf"``, LEAF's and FedProx's law);
      client mean :math:`v_k \sim N(\beta_k \mathbf 1, s^2 I)` with :math:`s` =
      ``feature_spread`` and :math:`\beta_k \sim N(0,` ``feature_shift``:math:`^2)`;
    * label :math:`y = \arg\max_c (W_k x + b_k)_c`, then, with probability ``label_noise``,
      replaced by a class drawn uniformly (it may draw the same class);
    * size :math:`n_k` from :func:`synthetic_client_sizes` (default: LEAF's lognormal law, many
      clients with a few examples and a few with hundreds); ``round(test_fraction * n_k)``
      examples go to test, then ``floor(val_fraction * rest)`` to validation (at least one
      training example is always kept, so the smallest clients have no validation example).

    The defaults follow the federated-learning literature where it describes a learning problem:
    ``d = 60`` features and ``C = 10`` classes as in FedProx's synthetic(alpha, beta), LEAF's law
    of examples per client (many clients with a few examples, a few with hundreds), a feature
    shift :math:`\beta_k` of spread 0.5 (FedProx's synthetic(0.5, 0.5)) and noise-free labels.
    Unlike FedProx's generator, whose client models share nothing but a scalar mean, and LEAF's,
    whose client models are all multiples of one matrix, the client models here share
    :math:`W_0` and keep a part of their own: :math:`\tau = 0.5` puts a fifth of the variance of
    a client's model in its own part (:math:`\tau^2 / (1 + \tau^2) = 0.2`).

    The feature law departs from LEAF's on purpose. With LEAF's covariance (small variance
    :math:`j^{-1.2}` within a client) and unit spread of client means (``feature_cov="leaf",
    feature_spread=1``), a client's examples sit in a small region where one class dominates:
    predicting each client's majority class is right on 84 % of the examples (m = 1 000, seed 0),
    so a client with ten examples needs nobody and the data measure class priors, not learning.
    The default (isotropic features, client means spread by half the within-client standard
    deviation) keeps a per-client feature shift while a client's labels need its model: the
    majority class covers 33 % of the examples. ``benchmarks/results/pmtl_population.md``
    measures collaboration against training alone under both laws and other settings.

    With ``heterogeneity = 0`` all clients share one labelling rule (a global model suffices); as it
    grows, client models diverge and personalization helps, while the shared :math:`W_0` keeps
    federation useful for clients with few samples.

    Parameters
    ----------
    n_clients, n_features, n_classes : int
        ``m``, ``d`` (>= 1) and ``C`` (>= 2).
    samples_per_client : int, (int, int) or None, default None
        Total examples per client before splitting (see :func:`synthetic_client_sizes`; >= 3 each
        for an int or a pair). None: LEAF's lognormal law.
    size_lognormal : (float, float), default (3.0, 2.0)
        :math:`(\mu, s)` of the lognormal law (LEAF: (3, 2)).
    heterogeneity : float >= 0, default 0.5
        Spread :math:`\tau` of client models around the shared model.
    feature_shift : float >= 0, default 0.5
        Standard deviation of the per-client feature offset :math:`\beta_k`.
    feature_spread : float >= 0, default 0.5
        Standard deviation :math:`s` of a client's feature mean around :math:`\beta_k \mathbf 1`
        (LEAF and FedProx: 1).
    feature_cov : {"isotropic", "leaf"}, default "isotropic"
        Within-client feature covariance: :math:`I`, or LEAF's :math:`\mathrm{diag}(j^{-1.2})`.
    label_noise : float in [0, 1], default 0.0
        Probability that a label is redrawn uniformly.
    test_fraction, val_fraction : float in [0, 1)
    random_state : int, numpy Generator or None
        Seed of the federation's random streams (see Notes).

    Returns
    -------
    FederatedDataset
        ``client_ids`` ``"synthetic_000"``, ...; ``feature_shape = (d,)``.

    Notes
    -----
    The shared part comes from the generator of ``random_state``, each client from a random
    stream of its own (:data:`SYNTHETIC_STREAM`, described in the module's documentation).
    """
    law, sizes = synthetic_law(
        n_clients=n_clients, n_features=n_features, n_classes=n_classes,
        samples_per_client=samples_per_client, size_lognormal=size_lognormal,
        heterogeneity=heterogeneity, feature_shift=feature_shift,
        feature_spread=feature_spread, feature_cov=feature_cov, label_noise=label_noise,
        test_fraction=test_fraction, val_fraction=val_fraction, random_state=random_state,
    )  # fmt: skip
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in ("tx", "ty", "vx", "vy", "sx", "sy")}
    for k, n in enumerate(sizes.tolist()):
        drawn = law.draw_client(law.client_rng(k), n)
        for key, arr in zip(parts, drawn, strict=True):
            parts[key].append(torch.from_numpy(arr))
    m = len(sizes)
    return FederatedDataset(
        client_ids=synthetic_client_ids(m),
        train_x=parts["tx"],
        train_y=parts["ty"],
        val_x=parts["vx"],
        val_y=parts["vy"],
        test_x=parts["sx"],
        test_y=parts["sy"],
        n_classes=law.n_classes,
        feature_shape=(law.n_features,),
        name=law.name(m),
    )


def synthetic_client_ids(m: int) -> list[str]:
    """The client ids of the synthetic federation: ``"synthetic_000"``, ..."""
    return list(SyntheticClientIds(m))


class SyntheticClientIds(Sequence[str]):
    """The ids ``"synthetic_000"``, ... of ``m`` synthetic clients, each made when read.

    Reads as the list :func:`synthetic_client_ids` gives (length, index, slice, iteration, and
    equal to that list) without holding ``m`` strings: a list of them costs about 70 bytes a
    client, more than the rest of a drawn-on-demand federation's per-client state, and a forked
    worker's copy of it is counted again in every worker's resident memory.
    """

    __slots__ = ("_m",)

    def __init__(self, m: int) -> None:
        self._m = int(m)

    def __len__(self) -> int:
        return self._m

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [f"synthetic_{i:03d}" for i in range(*k.indices(self._m))]
        i = operator.index(k)
        if i < 0:
            i += self._m
        if not 0 <= i < self._m:
            raise IndexError(f"client position {k} out of range for {self._m} clients")
        return f"synthetic_{i:03d}"

    def __iter__(self) -> Iterator[str]:
        return (f"synthetic_{k:03d}" for k in range(self._m))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SyntheticClientIds):
            return self._m == other._m
        if isinstance(other, list | tuple):
            return len(other) == self._m and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SyntheticClientIds({self._m})"


def client_id_list(ids: Sequence[str]) -> list[str]:
    """A copy of a data set's client ids that a result may keep: a list, or the same
    :class:`SyntheticClientIds` (immutable, and made when read: no ``m`` strings held)."""
    return cast(list[str], ids) if isinstance(ids, SyntheticClientIds) else list(ids)


@dataclass(frozen=True)
class SyntheticLaw:
    """The law of one client of :func:`make_synthetic_federated`: its parameters, the shared
    model and the entropy of the clients' random streams.

    Client ``k`` of ``n`` examples is ``draw_client(client_rng(k), n)``: it needs no other
    client's draws.
    """

    n_features: int
    n_classes: int
    heterogeneity: float
    feature_shift: float
    feature_spread: float
    feature_cov: str
    label_noise: float
    test_fraction: float
    val_fraction: float
    w0: np.ndarray = field(repr=False)
    b0: np.ndarray = field(repr=False)
    entropy: int = field(repr=False)

    def client_rng(self, k: int) -> np.random.Generator:
        """Client ``k``'s own generator, ``Generator(PCG64(SeedSequence(entropy,
        spawn_key=(k,))))``: a function of ``(entropy, k)`` only."""
        seq = np.random.SeedSequence(self.entropy, spawn_key=(int(k),))
        return np.random.Generator(np.random.PCG64(seq))

    def client_rngs(self, keys: np.ndarray) -> Iterator[np.random.Generator]:
        """:meth:`client_rng` of every client of ``keys``, in order: the same generators, their
        seed sequences hashed in one vectorised call
        (:func:`~privmtl._seeding.spawned_generators`)."""
        return spawned_generators(self.entropy, keys)

    def name(self, m: int) -> str:
        """The data set's name for ``m`` clients."""
        return (
            f"synthetic(m={m}, d={self.n_features}, C={self.n_classes}, "
            f"tau={self.heterogeneity:g}, shift={self.feature_shift:g}, "
            f"spread={self.feature_spread:g}, cov={self.feature_cov}, noise={self.label_noise:g})"
        )

    def split_sizes(self, n: np.ndarray) -> dict[str, np.ndarray]:
        """Examples of each split (``"train"``, ``"val"``, ``"test"``) of clients of ``n``
        examples, without drawing them."""
        n = np.asarray(n, dtype=np.int64)
        n_test = np.minimum(np.round(self.test_fraction * n).astype(np.int64), n - 1)
        n_val = np.minimum(
            np.floor(self.val_fraction * (n - n_test)).astype(np.int64), n - n_test - 1
        )
        return {"train": n - n_test - n_val, "val": n_val, "test": n_test}

    def split_counts(self, n: int) -> tuple[int, int, int]:
        """:meth:`split_sizes` of one client of ``n`` examples: ``(n_train, n_val, n_test)``."""
        n_test = min(round(self.test_fraction * n), n - 1)
        n_val = min(math.floor(self.val_fraction * (n - n_test)), n - n_test - 1)
        return n - n_test - n_val, n_val, n_test

    def draw_client(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, ...]:
        """Draw one client of ``n`` examples from ``rng`` (client ``k``'s is
        :meth:`client_rng`): ``(train_x, train_y, val_x, val_y, test_x, test_y)`` as
        ``float32`` / ``int64`` arrays."""
        d = self.n_features
        out = {
            split: (np.empty((size, d), np.float32), np.empty(size, np.int64))
            for split, size in zip(SPLIT_ORDER, self.split_counts(n), strict=True)
        }
        self.draw_rows(rng, n, out)
        return tuple(a for split in SPLIT_ORDER for a in out[split])

    def draw_rows(
        self,
        rng: np.random.Generator,
        n: int,
        out: Mapping[str, tuple[np.ndarray, np.ndarray]],
        work: np.ndarray | None = None,
    ) -> None:
        """Draw one client of ``n`` examples and write its rows of each split of ``out``
        (``"train"``, ``"val"`` or ``"test"`` to ``(x, y)``: float32 ``(n_split, d)`` and int64
        ``(n_split,)``, the split's size of :meth:`split_sizes`), drawing no split after the
        last one asked for (see :meth:`draw_into`)."""
        self.draw_into(rng, n, out, work)

    def draw_into(
        self,
        rng: np.random.Generator,
        n: int,
        targets: Mapping[str, tuple[np.ndarray, np.ndarray]],
        work: np.ndarray | None = None,
    ) -> None:
        """Client ``k``'s stream (``rng`` is :meth:`client_rng` ``(k)``; ``n`` its examples):
        write the splits of ``targets`` (``{split: (x, y)}``, float32 ``(n_split, d)`` and int64
        ``(n_split,)``, C-contiguous, sizes of :meth:`split_counts`).

        The draws, in this order: the client's model ``W_k = W_0 + tau A_k`` (``A_k``, ``(C,
        d)`` float64 normals), its bias ``b_k = b_0 + tau a_k``, its feature shift
        ``beta_k`` and mean ``v_k`` (float64; the four in one call of
        :func:`quantile_normals`, as ``normal(loc, scale)`` is ``loc + scale * z``); then each
        split in the order of :data:`SPLIT_ORDER` (train, validation, test): its ``n_split * d``
        float32 standard normals ``z`` (one call of :func:`quantile_normals`, written straight
        into the split's ``x``), and when ``label_noise > 0`` its label-noise coins
        (``rng.random(n_split) < label_noise``) and noise labels (``rng.integers(0, C,
        n_split)``). A split's features are ``x = v_k + z * scale`` (float32) and its labels
        ``argmax_c (W_k x + b_k)_c`` from those stored features (a float64 product), replaced by
        the noise label where the coin says so. The rows are i.i.d., so the split is positional:
        no permutation. Drawing stops after the last split asked for, so a round's training rows
        cost the client's parameters and training rows alone; a later split asked for alone
        draws the earlier ones' features and coins (into ``work``, float32, or a new buffer)
        without computing their labels, so a client's rows are the same whatever splits are
        asked for. :meth:`draw_rows`, :meth:`draw_client` and :meth:`draw_block` take the same
        draws.
        """
        self.draw_block(iter([rng]), [n], targets, work)

    def draw_block(
        self,
        rngs: Iterator[np.random.Generator],
        sizes: Sequence[int] | np.ndarray,
        outs: Mapping[str, tuple[np.ndarray, np.ndarray]],
        work: np.ndarray | None = None,
    ) -> None:
        """:meth:`draw_into` of many clients: the ``j``-th, of ``sizes[j]`` examples, from the
        ``j``-th generator of ``rngs``. Each ``(x, y)`` of ``outs`` (``{split: (x, y)}``)
        receives every client's rows of its split, client after client (float32 ``(N_split,
        d)`` and int64 ``(N_split,)``, C-contiguous; the sizes of :meth:`split_sizes`).

        Each client takes the same draws in the same order as alone, and its rows are the same
        bits; only the element-wise steps (its model's and feature mean's shift, the bias, the
        features' shift, the labels' argmax and noise) run once for a chunk of clients instead
        of once per client: every client's draws and its labels' product (one for all its
        splits asked for) stay its own. Clients are drawn in chunks of at most
        :data:`DRAW_CHUNK_ROWS` examples (a larger client alone). ``work`` (float32) receives
        the splits drawn but not asked for.
        """
        n = np.asarray(sizes, dtype=np.int64).reshape(-1)
        d = self.n_features
        unknown = sorted(set(outs) - set(SPLIT_ORDER))
        if unknown:
            raise InvalidParameterError(
                f"The 'outs' parameter takes the splits {SPLIT_ORDER}; got {unknown}."
            )
        last = max((SPLIT_ORDER.index(split) for split in outs), default=-1)
        drawn = SPLIT_ORDER[: last + 1]
        counts = self.split_sizes(n)
        firsts = {}
        for split in outs:
            firsts[split] = np.concatenate([[0], np.cumsum(counts[split])]).tolist()
            x, y = outs[split]
            if x.shape != (firsts[split][-1], d) or y.shape != (firsts[split][-1],):
                raise InvalidParameterError(
                    f"The {split!r} rows of 'outs' must be ({firsts[split][-1]}, {d}) features "
                    f"and ({firsts[split][-1]},) labels; got {x.shape} and {y.shape}."
                )
        skipped = [split for split in drawn if split not in outs]
        skip_rows = max((int(counts[s].max(initial=0)) for s in skipped), default=0)
        if work is None or len(work) < skip_rows * d or work.dtype != np.float32:
            work = np.empty(skip_rows * d, np.float32)
        rows = np.zeros(len(n), dtype=np.int64)  # each client's rows drawn
        for split in drawn:
            rows += counts[split]
        wanted = np.zeros(len(n), dtype=np.int64)  # each client's rows asked for
        for split in outs:
            wanted += counts[split]
        chunk_rows = min(int(wanted.sum()), max(DRAW_CHUNK_ROWS, int(wanted.max(initial=0))))
        x64 = np.empty(chunk_rows * d)  # the float64 features of a chunk's labels' products
        ends = np.cumsum(rows).tolist()
        start = 0
        while start < len(n):
            before = ends[start - 1] if start else 0
            stop = start + max(
                1, bisect.bisect_right(ends, before + DRAW_CHUNK_ROWS, lo=start) - start
            )
            chunk = {
                split: (
                    outs[split][0][f[start] : f[stop]],
                    outs[split][1][f[start] : f[stop]],
                    counts[split][start:stop],
                )
                for split, f in firsts.items()
            }
            skip = [counts[s][start:stop].tolist() for s in skipped]
            self._draw_chunk(rngs, drawn, chunk, skip, work, x64, wanted[start:stop])
            start = stop

    def _draw_chunk(
        self,
        rngs: Iterator[np.random.Generator],
        drawn: tuple[str, ...],
        chunk: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
        skip: list[list[int]],
        work: np.ndarray,
        x64: np.ndarray,
        wanted: np.ndarray,
    ) -> None:
        """One chunk of :meth:`draw_block`: ``chunk`` holds each asked split's ``(x, y,
        counts)`` of the chunk's clients, ``skip`` the counts of the splits drawn and not asked
        for (in :data:`SPLIT_ORDER`), ``x64`` room for the float64 copy of the asked rows."""
        c, d, tau, flip = self.n_classes, self.n_features, self.heterogeneity, self.label_noise
        k = len(wanted)
        shift, spread = self.feature_shift, self.feature_spread
        n_shift = 1 if shift > 0 else 0
        head = np.empty((k, c * d + c + n_shift + d))
        # each client's draws in stream order: its head, then each split drawn in turn
        bounds = {
            s: np.concatenate([[0], np.cumsum(cnt)]).tolist() for s, (_, _, cnt) in chunk.items()
        }
        coins = (
            {
                s: (np.empty(len(y), dtype=bool), np.empty(len(y), dtype=np.int64))
                for s, (_, y, _) in chunk.items()
            }
            if flip > 0
            else {}
        )
        steps: list[tuple[Any, ...]] = []
        skips = iter(skip)
        for split in drawn:
            if split in chunk:
                steps.append((chunk[split][0], bounds[split], coins.get(split)))
            else:
                steps.append((None, next(skips), None))
        self._draw_normals(rngs, head, steps, work)
        wk = head[:, : c * d].reshape(k, c, d) * tau
        wk += self.w0  # w0 + tau * a, element by element
        bk = head[:, c * d : c * d + c] * tau
        bk += self.b0
        loc = 0.0 + shift * head[:, c * d + c] if n_shift else np.zeros(k)
        vk = spread * head[:, c * d + c + n_shift :]
        vk += loc[:, None]  # normal(loc, spread): loc + spread * z
        vk32 = vk.astype(np.float32)
        total = int(wanted.sum())
        feats = x64[: total * d].reshape(total, d)
        # the asked rows of a client lie together in feats, its splits in stream order
        client_first = np.concatenate([[0], np.cumsum(wanted)])
        places = {}
        split_first = client_first[:-1].copy()
        for split in (s for s in drawn if s in chunk):
            xs, _, cnt = chunk[split]
            if self.feature_cov != "isotropic":  # z * 1 is z: isotropic features skip the product
                xs *= self._scale().astype(np.float32)
            xs += np.repeat(vk32, cnt, axis=0)  # vk + z * scale, element by element
            if len(chunk) == 1:
                np.copyto(feats, xs)
                continue
            place = np.repeat(split_first - np.concatenate([[0], np.cumsum(cnt)[:-1]]), cnt)
            place += np.arange(len(xs))
            feats[place] = xs
            places[split] = place
            split_first += cnt
        logits = np.empty((total, c))
        cf = client_first.tolist()
        for j in range(k):  # each client's labels' product: its float64 features, its model
            np.matmul(feats[cf[j] : cf[j + 1]], wk[j].T, out=logits[cf[j] : cf[j + 1]])
        logits += np.repeat(bk, wanted, axis=0)
        labels = logits.argmax(axis=1)
        for split, (_, y, _) in chunk.items():
            y[...] = labels if len(chunk) == 1 else labels[places[split]]
            if flip > 0:
                np.copyto(y, coins[split][1], where=coins[split][0])

    def _draw_normals(
        self,
        rngs: Iterator[np.random.Generator],
        head: np.ndarray,
        steps: list[tuple[Any, ...]],
        work: np.ndarray,
    ) -> None:
        """The draws of :meth:`_draw_chunk`'s clients in stream order: each client's head
        (into ``head``), then each split drawn (``steps``: ``(x, row bounds, coins)`` of a split
        asked for, ``(None, counts, None)`` of one only drawn), its normals and, with label
        noise, its coins and noise labels."""
        c, d, flip = self.n_classes, self.n_features, self.label_noise
        k = len(head)
        if len(steps) == 1 and steps[0][0] is not None and flip == 0:
            # a round's take (its training rows alone): the general case below, without its
            # per-chunk bookkeeping, on the rounds' hot path
            xs, bnd = steps[0][0], steps[0][1]
            flat = xs.reshape(-1)
            n_head = head.shape[1]
            head_slots = 4 * ((n_head + 3) >> 2)
            q32, q64 = normal_quantiles(np.float32), normal_quantiles(np.float64)
            for j, rng in zip(range(k), rngs, strict=False):
                a, b = bnd[j] * d, bnd[j + 1] * d
                index = quantile_indices(rng, head_slots + b - a)
                q64.take(index[:n_head], out=head[j], mode="clip")
                q32.take(index[head_slots : head_slots + b - a], out=flat[a:b], mode="clip")
        elif flip == 0:
            # the head's and every split's quantile_normals from one draw of their words (a
            # generator's raw words are one sequence), each part starting on a word of its own
            # as when drawn alone
            n_head = head.shape[1]
            head_slots = 4 * ((n_head + 3) >> 2)
            q32, q64 = normal_quantiles(np.float32), normal_quantiles(np.float64)
            # each split's normals of every client (a split not asked for: its size in rows),
            # and where they start in the client's indices: after the head and the splits before
            sizes = (
                np.array(
                    [np.asarray(bnd[:k]) if xs is None else np.diff(bnd) for xs, bnd, _ in steps]
                ).reshape(len(steps), k)
                * d
            )
            slots = 4 * ((sizes + 3) >> 2)  # whole words
            ends = head_slots + np.cumsum(slots, axis=0)
            starts = ends - slots
            asked = [
                (xs.reshape(-1), (np.asarray(bnd[:k]) * d).tolist(), st.tolist(), sz.tolist())
                for (xs, bnd, _), st, sz in zip(steps, starts, sizes, strict=True)
                if xs is not None
            ]
            # the finite list first: zip then takes no generator beyond this chunk's clients
            for j, (words, rng) in enumerate(zip(ends[-1].tolist(), rngs, strict=False)):
                index = quantile_indices(rng, words)
                q64.take(index[:n_head], out=head[j], mode="clip")
                for flat, first, at, size in asked:
                    q32.take(
                        index[at[j] : at[j] + size[j]],
                        out=flat[first[j] : first[j] + size[j]],
                        mode="clip",
                    )
        else:  # label noise: each split's coins and noise labels follow its normals
            for j, rng in zip(range(k), rngs, strict=False):
                quantile_normals(rng, head[j])
                for xs, bnd, coin in steps:
                    if xs is None:  # a split drawn, not asked for: its draws, no labels
                        size = bnd[j]
                        quantile_normals(rng, work[: size * d])
                        rng.random(size)
                        rng.integers(0, c, size=size)
                        continue
                    a, b = bnd[j], bnd[j + 1]
                    quantile_normals(rng, xs[a:b])
                    coin[0][a:b] = rng.random(b - a) < flip
                    coin[1][a:b] = rng.integers(0, c, size=b - a)

    def _scale(self) -> np.ndarray:
        """Square root of the diagonal within-client covariance."""
        d = self.n_features
        if self.feature_cov == "leaf":
            return np.asarray(np.arange(1, d + 1, dtype=np.float64) ** -0.6)
        return np.ones(d)


def synthetic_law(
    *,
    n_clients: int,
    n_features: int,
    n_classes: int,
    samples_per_client: int | tuple[int, int] | None,
    size_lognormal: tuple[float, float],
    heterogeneity: float,
    feature_shift: float,
    feature_spread: float,
    feature_cov: str,
    label_noise: float,
    test_fraction: float,
    val_fraction: float,
    random_state: int | np.random.Generator | None,
) -> tuple[SyntheticLaw, np.ndarray]:
    """Check :func:`make_synthetic_federated`'s parameters and draw its shared part: the law of a
    client (with the entropy of the clients' streams) and every client's number of examples
    (vectorised: no work per client beyond the size draw)."""
    m = check_int("n_clients", n_clients, low=1)
    check_memory("n_clients", m, CLIENT_BYTES, "clients")
    d = check_int("n_features", n_features, low=1)
    c = check_int("n_classes", n_classes, low=2)
    tau = check_real("heterogeneity", heterogeneity, low=0.0)
    shift = check_real("feature_shift", feature_shift, low=0.0)
    spread = check_real("feature_spread", feature_spread, low=0.0)
    check_choice("feature_cov", feature_cov, FEATURE_COVS)
    flip = check_real("label_noise", label_noise, low=0.0, high=1.0)
    test_fraction = check_real("test_fraction", test_fraction, low=0.0, high=1.0, closed="left")
    val_fraction = check_real("val_fraction", val_fraction, low=0.0, high=1.0, closed="left")
    rng = check_rng(random_state)
    w0 = rng.standard_normal((c, d))
    b0 = rng.standard_normal(c)
    sizes = synthetic_client_sizes(
        m, samples_per_client, size_lognormal=size_lognormal, random_state=rng
    )
    # an int seed is the clients' entropy; a Generator (or None) gives 128 bits, drawn once
    entropy = (
        int(random_state)
        if isinstance(random_state, numbers.Integral)
        else int.from_bytes(rng.bytes(16), "little")
    )
    law = SyntheticLaw(
        d, c, tau, shift, spread, feature_cov, flip, test_fraction, val_fraction, w0, b0, entropy
    )
    return law, sizes
