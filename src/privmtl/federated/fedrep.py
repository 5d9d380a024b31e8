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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import Params
from privmtl.federated.client import UpdateRule

if TYPE_CHECKING:
    from privmtl.federated.methods.base import TrainFn

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


def local_update(
    billboard: Params,
    representation: Sequence[str],
    starts: Params,
    lr: float,
    head_epochs: int,
    train: TrainFn,
) -> tuple[Params, list[float]]:
    """One round's local work of the sampled clients: the head, then the representation.

    ``starts`` are the clients' stored states (their heads); the representation starts from the
    billboard. ``train`` is the backend's local training of the round's clients
    (:class:`~privmtl.federated.methods.base.TrainFn`): the head's minibatches come from
    :data:`HEAD_STREAM` with ``head_epochs`` epochs, the representation's from the round's plan.
    Returns the new states (new head, new representation) and each client's mean minibatch loss
    during the representation's steps.
    """
    rep = frozenset(representation)
    head = frozenset(n for n in starts if n not in rep)
    state = {  # the representation from the billboard, the client's own head
        n: billboard[n].unsqueeze(0).expand_as(p).clone() if n in rep else p.clone()
        for n, p in starts.items()
    }
    state, _ = train(state, PartStep(lr, head), stream=HEAD_STREAM, epochs=head_epochs)
    return train(state, PartStep(lr, rep))


def final_heads(
    billboard: Params,
    personal: Params,
    representation: Sequence[str],
    lr: float,
    head_epochs: int,
    train_all: TrainFn,
) -> Params:
    """Every client's model after its final head training on the last released representation.

    All ``m`` clients start from the billboard's representation and their own head (the initial
    head for a client never sampled) and train the head for ``head_epochs`` epochs on their own
    training data (``train_all``, minibatches from :data:`FINAL_HEAD_STREAM`): a function of the
    releases and of the client's own data only.
    """
    m = next(iter(personal.values())).shape[0]
    starts = {
        n: billboard[n].unsqueeze(0).expand((m, *billboard[n].shape)).clone()
        if n in billboard
        else p.clone()
        for n, p in personal.items()
    }
    head = frozenset(n for n in personal if n not in set(representation))
    state, _ = train_all(starts, PartStep(lr, head), stream=FINAL_HEAD_STREAM, epochs=head_epochs)
    return state
