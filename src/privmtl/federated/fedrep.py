r"""FedRep under client-level DP: a shared representation and a head per client.

The method of Collins et al. (2021, "Exploiting shared representations for personalized federated
learning") made client-level private as in DP-FedRep / CENTAUR (Shen et al., ICLR 2023, "Share
your representation only"). The model's parameters are split into a *representation* :math:`\phi`
(the ``shared_params``; by default every parameter but the last layer's,
:func:`representation_names`) and a *head* :math:`h_k` that client ``k`` keeps to itself. In
round ``t`` every sampled client

1. starts from the released representation :math:`\phi^t` and its own head,
2. trains its head for ``head_epochs`` local epochs with the representation frozen,
3. trains the representation for the round's local work (``local_epochs`` / ``local_steps``)
   with the new head fixed, and
4. sends :math:`\phi_k - \phi^t` only; it keeps its head.

The curator clips every message, averages over the fixed ``q``, adds Gaussian noise and records
the release in the ledger (:class:`~privmtl.federated.protocol.Curator`): the release has the
representation's dimension only, and the head never leaves the client. At the end every client,
sampled or not, trains its head for ``head_epochs`` epochs on its own training data on top of the
last released representation (:func:`final_heads`): post-processing of the releases, the
guarantee is unchanged.

Random draws: the head's minibatches of client ``k`` in round ``t`` come from
``default_rng([seed, 3, t, k])``, those of its final head training from
``default_rng([seed, 4, 0, k])`` (:func:`~privmtl.federated.algorithms.draw_round_plan`), the
representation's from the usual stream 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import Params, draw_round_plan
from privmtl.federated.client import UpdateRule

if TYPE_CHECKING:
    from privmtl.federated.protocol import Trainer

__all__ = [
    "FINAL_HEAD_STREAM",
    "HEAD_STREAM",
    "PartStep",
    "final_heads",
    "head_names",
    "local_update",
    "representation_names",
]

#: The random stream (:func:`~privmtl.federated.algorithms.draw_round_plan`) of the head's
#: minibatches in the rounds, and of the final head training.
HEAD_STREAM = 3
FINAL_HEAD_STREAM = 4


def representation_names(names: Sequence[str]) -> tuple[str, ...]:
    """The default representation of a model with parameters ``names`` (in module order).

    Every parameter but those of the last layer, the module owning the last parameter (e.g.
    ``classifier`` for ``classifier.weight`` and ``classifier.bias``). A model with a single
    layer has no representation: the ``shared_params`` must then name it.
    """
    names = list(names)
    if not names:
        raise InvalidParameterError("The 'model' parameter must have at least one parameter.")
    last = names[-1].rsplit(".", 1)[0] if "." in names[-1] else names[-1]
    rep = tuple(n for n in names if not (n == last or n.startswith(last + ".")))
    if not rep:
        raise InvalidParameterError(
            "method='fedrep' needs a representation: the model's parameters "
            f"{names} all belong to its last layer {last!r}; pass 'shared_params' "
            "(--shared-params) or use a model with more than one layer."
        )
    return rep


def head_names(names: Sequence[str], representation: Sequence[str]) -> tuple[str, ...]:
    """The parameters of ``names`` not in ``representation``: the client's head."""
    rep = set(representation)
    return tuple(n for n in names if n not in rep)


@dataclass(frozen=True)
class PartStep(UpdateRule):
    """Plain SGD on the ``trainable`` parameters only: :math:`w \\leftarrow w - \\eta g` there,
    every other parameter of the state left as it is (frozen)."""

    lr: float
    trainable: frozenset[str]

    def apply_(self, state: Params, grads: Params) -> None:
        names = [n for n in state if n in self.trainable]
        if names:
            torch._foreach_add_(
                [state[n] for n in names], [grads[n] for n in names], alpha=-self.lr
            )


def _head_config(trainer: Trainer) -> Any:
    cfg = trainer.config
    return dataclasses.replace(cfg, local_epochs=cfg.head_epochs, local_steps=None)


def local_update(
    trainer: Trainer,
    sampled: np.ndarray,
    starts: Params,
    plan: list[list[np.ndarray]],
    pool: Any = None,
) -> tuple[Params, list[float]]:
    """One round's local work of the sampled clients: the head, then the representation.

    ``starts`` are the clients' stored states (their heads); the representation starts from the
    billboard. Returns the new states (new head, new representation) and each client's mean
    minibatch loss during the representation's steps.
    """
    cfg = trainer.config
    rep = frozenset(trainer.shared)
    head = frozenset(n for n in trainer.names if n not in rep)
    board = trainer.curator.billboard
    state = {  # the representation from the billboard, the client's own head
        n: board[n].unsqueeze(0).expand_as(p).clone() if n in rep else p.clone()
        for n, p in starts.items()
    }
    head_plan = draw_round_plan(
        sampled, trainer.offsets, trainer.round, _head_config(trainer), stream=HEAD_STREAM
    )
    state, _ = trainer._train_clients(state, PartStep(cfg.lr, head), head_plan, pool)
    return trainer._train_clients(state, PartStep(cfg.lr, rep), plan, pool)


def final_heads(trainer: Trainer) -> Params:
    """Every client's model after its final head training on the last released representation.

    All ``m`` clients start from the billboard's representation and their own head (the initial
    head for a client never sampled) and train the head for ``head_epochs`` epochs on their own
    training data: a function of the releases and of the client's own data only.
    """
    cfg, m = trainer.config, trainer.m
    board = trainer.curator.billboard
    personal = trainer.clients["personal"]
    starts = {
        n: board[n].unsqueeze(0).expand((m, *board[n].shape)).clone() if n in board else p.clone()
        for n, p in personal.items()
    }
    head = frozenset(n for n in trainer.names if n not in trainer.shared)
    plan = draw_round_plan(
        np.arange(m), trainer.offsets, 0, _head_config(trainer), stream=FINAL_HEAD_STREAM
    )
    state, _ = trainer._train_clients(starts, PartStep(cfg.lr, head), plan, None)
    return state
