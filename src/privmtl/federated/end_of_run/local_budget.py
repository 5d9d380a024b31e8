"""Adam's local grid as a budget of steps: a client with few examples trains more epochs.

A grid point of ``e`` epochs gives a client with ``b`` minibatches per epoch ``e * b`` steps, so
a fixed number of epochs gives a client of 20 examples a tenth of the optimisation of a client of
200. With ``solver="adam"``, :func:`~privmtl.federated.end_of_run.local.train_local` reads a grid
point of ``e`` epochs as at least ``e`` epochs and at least ``e * ADAM_EPOCH_STEPS`` steps:
client ``k`` trains

.. math:: e_k = \\max\\left(e,\\ \\left\\lceil e \\cdot R / b_k \\right\\rceil\\right)

epochs (:func:`client_epochs`, ``R`` = :data:`ADAM_EPOCH_STEPS`), the first ``e_k`` epochs of its
own minibatch plan. A client with at least ``R`` minibatches per epoch trains exactly ``e``
epochs; a smaller one trains the steps of a client with ``R`` minibatches. The rule reads the
client's own size only, which is public to nobody but the client (each client's run, and its
choice on its own validation split, depends on its own data alone).

Cost: the grid's vectorised call runs, per chunk of clients of similar size, as many steps as its
longest run, so a client trains about ``max(e * b_k, e * R)`` steps; for a population whose
clients hold at least ``R * batch_size`` examples the grid is unchanged.
"""

from __future__ import annotations

import numpy as np

from privmtl._validation import check_int

__all__ = ["ADAM_EPOCH_STEPS", "client_epochs"]

ADAM_EPOCH_STEPS = 8
"""``R``: Adam's grid gives every client at least ``R`` steps per epoch of the grid (a client with
``R`` minibatches of 10 holds 71 to 80 training examples)."""


def client_epochs(epochs: int, per_epoch: np.ndarray, epoch_steps: int | None) -> np.ndarray:
    """Every client's number of epochs for a grid point of ``epochs`` epochs.

    Parameters
    ----------
    epochs : int
        The grid point's epochs ``e`` (>= 1).
    per_epoch : ndarray of int
        Minibatches per epoch ``b_k`` of every client (0 for a client without training data).
    epoch_steps : int or None
        ``R`` (>= 1): ``max(e, ceil(e * R / b_k))`` epochs per client; None: ``e`` for all.

    Returns
    -------
    ndarray of int64
        ``e_k`` per client (``e`` for a client without training data).
    """
    epochs = check_int("epochs", epochs, low=1)
    b = np.asarray(per_epoch, dtype=np.int64)
    if epoch_steps is None:
        return np.full(b.shape, epochs, dtype=np.int64)
    r = check_int("epoch_steps", epoch_steps, low=1)
    stretched = -(-(epochs * r) // np.maximum(b, 1))
    return np.where(b > 0, np.maximum(epochs, stretched), epochs).astype(np.int64)
