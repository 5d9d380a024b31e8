r"""One round at a time: the curator, the clients and the driver of every federated method.

The backbone of the PMTL family, written once:

1. the **curator** samples the round's clients (its sampler names the privacy event of the round)
   and broadcasts the billboard;
2. every sampled **client** runs the method's local update from its start model
   (:mod:`privmtl.federated.client`) and sends a message;
3. the curator **releases**: clip every message → mean over the fixed ``q`` → Gaussian noise from
   its noise source → ledger record (write-ahead, durable with a checkpoint directory) → billboard
   update (:class:`~privmtl.privacy.release.GaussianMeanRelease`);
4. the **driver** (:class:`Trainer`) records the round and, every ``checkpoint_every`` rounds,
   saves the curator's and the clients' state atomically.

The protocol is written once for two transports: the in-process :class:`Trainer` and Flower's
ServerApp and ClientApp (:mod:`privmtl.flower`) both call :func:`setup_run` and
:func:`make_curator` (the release, the billboard, the curator), :func:`new_ledger`,
:func:`budget_stops`, :func:`round_record`, :func:`fingerprint_base` and :func:`run_result`, and
drive the method object's client half (:class:`~privmtl.federated.methods.base.Method`: starts,
local update, message, what is kept); they differ only in how the clients' data and states are
held and how the messages travel. Neither names a method: what a client starts from, its update
rule, what it sends and how the billboard absorbs a release are the method's
(:mod:`privmtl.federated.methods`, whose documentation holds the table of the methods).

Randomness (seeded mode reproduces a run bit for bit, and a resumed run equals the uninterrupted
one): client sampling from ``numpy.random.default_rng([seed, 0])``, client ``k``'s minibatches of
round ``t`` from ``default_rng([seed, 1, t, k])``, server noise from
:class:`~privmtl.privacy.noise.SeededNoise` ``(seed, (2,))``. In secure mode (the default) the noise
comes from OS entropy and every round's client sampling from a generator freshly seeded with 128
bits of OS entropy, so that no client can predict who is sampled; neither is ever checkpointed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from privmtl.federated.algorithms import Params
from privmtl.federated.backend import (
    RoundRecord,
    RunSetup,
    budget_stops,
    fingerprint_base,
    make_curator,
    new_ledger,
    round_record,
    run_result,
    setup_run,
)
from privmtl.federated.client import UpdateRule
from privmtl.federated.config import TrainConfig
from privmtl.federated.curator import Curator
from privmtl.federated.methods import ClientStep, Method, TrainFn, get_method
from privmtl.federated.store import ClientStore
from privmtl.federated.trainer import Trainer
from privmtl.privacy.release import billboard_carries_signal, billboard_noise_and_bound

__all__ = [
    "ClientStep",
    "ClientStore",
    "Curator",
    "MethodSpec",
    "RoundRecord",
    "RunSetup",
    "Trainer",
    "billboard_carries_signal",
    "billboard_noise_and_bound",
    "budget_stops",
    "client_messages",
    "client_rule",
    "client_starts",
    "client_step",
    "fingerprint_base",
    "make_curator",
    "method_spec",
    "new_ledger",
    "round_record",
    "run_result",
    "setup_run",
]


# ---------------------------------------------------------------------------------- methods
MethodSpec = Method
"""A method's declarations: :class:`~privmtl.federated.methods.base.Method`."""


def method_spec(config: TrainConfig) -> Method:
    """The method object of ``config.method`` (:func:`~privmtl.federated.methods.get_method`)."""
    return get_method(config.method, config)


def client_rule(spec: Method, config: TrainConfig, anchor: Params | None) -> UpdateRule:
    """The local update rule of method ``spec`` (:meth:`Method.rule`)."""
    return spec.with_config(config).rule(anchor)


def client_starts(
    spec: Method,
    billboard: Params,
    sel: torch.Tensor,
    store: ClientStore | None = None,
    *,
    personal: Params | None = None,
    joined: torch.Tensor | None = None,
    theta: Params | None = None,
) -> tuple[Params, Params | None]:
    """Start states of the clients ``sel`` and the anchor of the local rule (:meth:`Method.starts`
    of the clients' ``store``).

    Without ``store``, one is made of the stacked states ``personal`` / ``theta`` over the index
    space of ``sel`` (:meth:`ClientStore.from_dense`): ``joined`` (``(m,)`` bool) marks the
    clients that took part before, the others hold the initial model (a method with
    ``personal_init="billboard"`` starts them from the billboard).
    """
    if store is None:
        dense = {f: v for f, v in (("personal", personal), ("theta", theta)) if v is not None}
        if dense:
            store = ClientStore.from_dense(dense, written=joined)
        else:
            store = ClientStore(0 if joined is None else len(joined), {})
    return spec.starts(billboard, sel, store)


def client_messages(
    spec: Method, billboard: Params, shared: Sequence[str], starts: Params, news: Params
) -> Params:
    """The clients' messages (shared parameters only) from their starts and new states."""
    return spec.messages(billboard, shared, starts, news)


def client_step(
    spec: Method,
    config: TrainConfig,
    billboard: Params,
    shared: Sequence[str],
    starts: Params,
    anchor: Params | None,
    train: TrainFn,
) -> ClientStep:
    """The client step of method ``spec``, written once for every transport
    (:meth:`Method.client_update`)."""
    return spec.with_config(config).client_update(billboard, shared, starts, anchor, train)
