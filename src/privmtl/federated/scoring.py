"""Scores of models on clients' data: every client scored with its own model
(:func:`client_scores`, groups of clients in one vectorised call) or with one shared model,
summed a block of clients at a time (:class:`BlockScores`) or over a whole data set
(:func:`evaluate`, :func:`evaluate_dataset`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from privmtl._device import one_thread_per_worker
from privmtl.data.federated import FederatedDataset
from privmtl.federated.blocks import END_OF_RUN_BLOCK, client_blocks
from privmtl.federated.client_models import ClientModels, FilledRows, Params, model_rows

__all__ = [
    "BlockScores",
    "block_rows",
    "client_scores",
    "evaluate",
    "evaluate_dataset",
]


@torch.no_grad()
def client_scores(
    model: nn.Module,
    params: Params,
    buffers: Params,
    xs: list[torch.Tensor],
    ys: list[torch.Tensor],
    *,
    chunk: int = 256,
    clients_together: int = 64,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-client number of correct predictions and summed cross-entropy of stacked models.

    Client ``k`` is scored with its own slice ``params[name][k]`` on ``xs[k], ys[k]`` only.
    Returns two float arrays of length ``len(ys)`` (zeros for clients without examples).
    Groups of ``clients_together`` clients of similar size are scored in one vectorised call
    (``torch.func.vmap`` over their models, examples padded and masked out) when there are more
    clients than that and every client has at most ``chunk`` examples; otherwise client by client.
    The data are moved to the device of ``params`` (and ``model``) a block at a time; the
    scores come back as numpy arrays.
    """
    correct = np.zeros(len(ys))
    losses = np.zeros(len(ys))
    first = next(iter(params.values()))
    dtype, device = first.dtype, first.device
    was_training = model.training
    model.eval()
    try:
        if len(ys) > clients_together > 1:
            try:
                if _scores_vmapped(
                    model, params, buffers, xs, ys, dtype, clients_together, correct, losses
                ):
                    return correct, losses
            except (RuntimeError, NotImplementedError):  # a module vmap cannot batch
                correct[:], losses[:] = 0.0, 0.0
        for k, (x, y) in enumerate(zip(xs, ys, strict=True)):
            pk = {name: p[k] for name, p in params.items()}
            for i in range(0, y.shape[0], chunk):
                xi = x[i : i + chunk].to(device=device, dtype=dtype)
                logits = functional_call(model, (pk, buffers), (xi,))
                yy = y[i : i + chunk].to(device)
                correct[k] += float((logits.argmax(1) == yy).sum())
                losses[k] += float(F.cross_entropy(logits, yy, reduction="sum"))
    finally:
        model.train(was_training)
    return correct, losses


def _scores_vmapped(
    model: nn.Module,
    params: Params,
    buffers: Params,
    xs: list[torch.Tensor],
    ys: list[torch.Tensor],
    dtype: torch.dtype,
    group: int,
    correct: np.ndarray,
    losses: np.ndarray,
) -> bool:
    """:func:`client_scores` for groups of clients at once; False (nothing written) if too big."""
    sizes = np.array([y.shape[0] for y in ys])
    if sizes.max(initial=0) > 256:
        return False
    order = np.argsort(sizes, kind="stable")

    def one(p: Params, x: torch.Tensor) -> torch.Tensor:
        return functional_call(model, (p, buffers), (x,))

    fn = torch.func.vmap(one)
    for g in range(0, len(order), group):
        idx = order[g : g + group]
        n = int(sizes[idx].max(initial=0))
        if n == 0:
            continue
        x = torch.zeros((len(idx), n, *xs[int(idx[0])].shape[1:]), dtype=dtype)
        y = torch.zeros((len(idx), n), dtype=torch.int64)
        mask = torch.zeros((len(idx), n), dtype=torch.bool)
        # client j's examples at the start of row j of the padding, copied in one operation
        s = sizes[idx]
        at = torch.from_numpy(
            np.repeat(np.arange(len(idx)) * n - np.concatenate([[0], np.cumsum(s)[:-1]]), s)
            + np.arange(int(s.sum()))
        )
        ks = idx.tolist()
        x.view(-1, *x.shape[2:])[at] = torch.cat([xs[k] for k in ks]).to(dtype)
        y.view(-1)[at] = torch.cat([ys[k] for k in ks])
        mask.view(-1)[at] = True
        device = next(iter(params.values())).device
        x, y, mask = x.to(device), y.to(device), mask.to(device)
        sel = torch.from_numpy(idx.astype(np.int64)).to(device)
        logits = fn({name: p.index_select(0, sel) for name, p in params.items()}, x)
        hit = (logits.argmax(-1) == y) & mask
        ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
        correct[idx] = hit.sum(1).double().cpu().numpy()
        losses[idx] = (ce * mask).double().sum(1).cpu().numpy()
    return True


@torch.no_grad()
def evaluate(
    model: nn.Module,
    params: Params,
    buffers: Params,
    xs: list[torch.Tensor],
    ys: list[torch.Tensor],
    *,
    personalized: bool,
    chunk: int = 256,
) -> dict[str, float]:
    """Accuracy and loss of a global model or of stacked personalized models on per-client data.

    Returns ``accuracy`` (pooled: correct / examples over all clients), ``mean_client_accuracy``
    (mean over clients with at least one example), ``loss`` (pooled mean cross-entropy) and ``n``.
    It computes on the device of ``params`` (and ``model``), moving the data there in blocks.
    """
    return _summary(*_correct_and_loss(model, params, buffers, xs, ys, personalized, chunk))


def evaluate_dataset(
    model: nn.Module,
    models: Mapping[str, tuple[Params, bool]],
    buffers: Params,
    dataset: FederatedDataset,
    splits: Sequence[str] = ("val", "test"),
    *,
    block: int = END_OF_RUN_BLOCK,
) -> dict[str, dict[str, dict[str, float]]]:
    """:func:`evaluate` of several models on several splits of every client of ``dataset``, in
    one pass over blocks of at most ``block`` clients
    (:func:`~privmtl.federated.blocks.client_blocks`): one block's data are read at a time.

    ``models`` maps a name to ``(params, personalized)`` (personalized: stacked ``(m, ...)``).
    Returns ``{split: {name: evaluate(...)}}``. On the CPU it scores with one torch thread
    (:func:`~privmtl._device.one_thread_per_worker`).
    """
    with one_thread_per_worker():
        return _evaluate_blocks(model, models, buffers, dataset, splits, block)


def _evaluate_blocks(
    model: nn.Module,
    models: Mapping[str, tuple[Params, bool]],
    buffers: Params,
    dataset: FederatedDataset,
    splits: Sequence[str],
    block: int,
) -> dict[str, dict[str, dict[str, float]]]:
    m = dataset.n_clients
    book = BlockScores(model, buffers, splits)
    if m <= block:
        for name, (params, personal) in models.items():
            if isinstance(params, ClientModels):  # its rows: a store's models are not stacked
                params = params.rows(np.arange(m))
            book.add(name, params, personal, dataset)
        return book.summary()
    for pos in client_blocks(m, block):
        piece = dataset.subset(pos.tolist())
        for name, (params, personal) in models.items():
            book.add(name, block_rows(params, pos) if personal else params, personal, piece)
    return book.summary()


def block_rows(params: Params, pos: np.ndarray) -> Params:
    """The rows ``pos`` of stacked models (a block of clients' own models; of a
    :class:`~privmtl.federated.client_models.ClientModels`, without stacking the others)."""
    return model_rows(params, pos)


class BlockScores:
    """:func:`evaluate`'s scores of named models on ``splits``, added one block of clients at a
    time and summed over them (each client is scored on its own data with its own model, so a
    client's score does not depend on its block)."""

    def __init__(self, model: nn.Module, buffers: Params, splits: Sequence[str]) -> None:
        self.model, self.buffers, self.splits = model, buffers, tuple(splits)
        self._parts: dict[tuple[str, str], list[tuple[np.ndarray, np.ndarray, float]]] = {}
        self._dtypes: dict[tuple[str, str], tuple[np.dtype[Any], np.dtype[Any]]] = {}
        self._names: list[str] = []

    def add(self, name: str, params: Params, personalized: bool, piece: FederatedDataset) -> None:
        """Score ``params`` (stacked for ``piece``'s clients when ``personalized``) on ``piece``."""
        self.keep(self.score(name, params, personalized, piece))

    def score(
        self,
        name: str,
        params: Params | FilledRows,
        personalized: bool,
        piece: FederatedDataset,
        model: nn.Module | None = None,
        memo: dict[str, _Memo] | None = None,
    ) -> list[tuple[str, str, tuple[np.ndarray, np.ndarray, float]]]:
        """:meth:`add`'s scores without keeping them (blocks scored concurrently are kept in
        their order with :meth:`keep`); ``model``: a copy of the architecture to compute with
        (a thread's own: scoring swaps a module's parameters); ``memo``: one per block, the
        shared models scored on it by split (the clients of
        :class:`~privmtl.federated.client_models.FilledRows` holding one of them take its
        scores)."""
        net = self.model if model is None else model
        out = []
        for split in self.splits:
            xs, ys = piece.split(split)
            seen = None if memo is None else memo.setdefault(split, [])
            part = _correct_and_loss(net, params, self.buffers, xs, ys, personalized, 256, seen)
            out.append((split, name, part))
        return out

    def keep(self, scored: list[tuple[str, str, tuple[np.ndarray, np.ndarray, float]]]) -> None:
        """Keep the scores of one block (:meth:`score`), after those kept before: the counts
        as 32-bit integers where they are such (a few bytes a client and model, whatever the
        population), read back in their own type."""
        for split, name, (correct, counts, loss) in scored:
            if name not in self._names:
                self._names.append(name)
            self._dtypes[(split, name)] = (correct.dtype, counts.dtype)
            part = (_as_int32(correct), _as_int32(counts), loss)
            self._parts.setdefault((split, name), []).append(part)

    def per_client(self, split: str, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Every client's correct predictions and examples of ``name`` on ``split``, in the
        order the blocks were kept."""
        parts = self._parts[(split, name)]
        dc, dn = self._dtypes[(split, name)]
        return (
            np.concatenate([c for c, _, _ in parts]).astype(dc, copy=False),
            np.concatenate([n for _, n, _ in parts]).astype(dn, copy=False),
        )

    def summary(self) -> dict[str, dict[str, dict[str, float]]]:
        """``{split: {name: evaluate(...)}}`` over every block added."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for split in self.splits:
            out[split] = {}
            for name in self._names:
                parts = self._parts[(split, name)]
                out[split][name] = _summary(
                    *self.per_client(split, name), sum(lo for _, _, lo in parts)
                )
        return out


def _as_int32(a: np.ndarray) -> np.ndarray:
    """``a`` as 32-bit integers where that holds every value exactly, else ``a``."""
    if a.dtype == np.int32 or not a.size or not np.issubdtype(a.dtype, np.number):
        return a
    if np.all(np.isfinite(a)) and np.abs(a).max() < 2**31:
        small = a.astype(np.int32)
        if np.array_equal(small, a):
            return small
    return a


_Memo = list[tuple[Params, tuple[np.ndarray, np.ndarray, np.ndarray]]]
"""Shared models already scored on one split of one block, with their per-client correct
predictions, examples and summed cross-entropies."""


def _correct_and_loss(
    model: nn.Module,
    params: Params | FilledRows,
    buffers: Params,
    xs: list[torch.Tensor],
    ys: list[torch.Tensor],
    personalized: bool,
    chunk: int,
    memo: _Memo | None = None,
) -> tuple[np.ndarray, np.ndarray, float]:
    """Per-client correct predictions and examples, and the summed cross-entropy (of
    :class:`~privmtl.federated.client_models.FilledRows`: the clients with a model of their own
    scored as personalized, the others as the fill's). ``memo``: the shared models scored on
    these data before (a fill among them is not scored again), to which a shared model is
    added."""
    if isinstance(params, FilledRows):
        return _filled_correct_and_loss(model, params, buffers, xs, ys, chunk, memo)
    if not personalized:
        got = _shared_scores(model, params, buffers, xs, ys, chunk)
        if memo is not None:
            memo.append((params, got))
        return got[0], got[1], float(got[2].sum())
    counts = np.array([y.shape[0] for y in ys], dtype=np.int64)
    if counts.sum() == 0:
        return np.zeros(len(ys)), counts, 0.0
    correct, losses = client_scores(model, params, buffers, xs, ys, chunk=chunk)  # in eval mode
    return correct, counts, float(losses.sum())


def _shared_scores(
    model: nn.Module,
    params: Params,
    buffers: Params,
    xs: list[torch.Tensor],
    ys: list[torch.Tensor],
    chunk: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One model's per-client correct predictions, examples and summed cross-entropies, its
    logits computed over every client's examples at once, ``chunk`` rows at a time."""
    counts = np.array([y.shape[0] for y in ys], dtype=np.int64)
    if counts.sum() == 0:
        return np.zeros(len(ys)), counts, np.zeros(len(ys))
    first = next(iter(params.values()))
    dtype, device = first.dtype, first.device
    x_all, y_all = torch.cat(xs), torch.cat(ys)
    hits = torch.empty(y_all.shape[0], dtype=torch.bool)
    ce = torch.empty(y_all.shape[0], dtype=torch.float64)
    was_training = model.training
    model.eval()
    try:
        for i in range(0, y_all.shape[0], chunk):
            xi = x_all[i : i + chunk].to(device=device, dtype=dtype)
            logits = functional_call(model, (params, buffers), (xi,))
            yy = y_all[i : i + chunk].to(device)
            hits[i : i + chunk] = (logits.argmax(1) == yy).cpu()
            ce[i : i + chunk] = F.cross_entropy(logits, yy, reduction="none").cpu()
    finally:
        model.train(was_training)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    csum = np.concatenate([[0], np.cumsum(hits.numpy())])
    lsum = np.concatenate([[0.0], np.cumsum(ce.numpy())])
    correct = (csum[offsets[1:]] - csum[offsets[:-1]]).astype(float)
    return correct, counts, lsum[offsets[1:]] - lsum[offsets[:-1]]


def _filled_correct_and_loss(
    model: nn.Module,
    params: FilledRows,
    buffers: Params,
    xs: list[torch.Tensor],
    ys: list[torch.Tensor],
    chunk: int,
    memo: _Memo | None,
) -> tuple[np.ndarray, np.ndarray, float]:
    own, fill = np.flatnonzero(params.has_own), np.flatnonzero(~params.has_own)
    correct = np.zeros(len(ys))
    counts = np.zeros(len(ys), dtype=np.int64)
    got = _correct_and_loss(
        model, params.own, buffers, [xs[i] for i in own], [ys[i] for i in own], True, chunk
    )
    correct[own], counts[own], loss_sum = got
    # the fill's scores on these data where a shared model equal to it was scored before
    seen = next((s for p, s in memo or () if _same_params(p, params.fill)), None)
    if seen is None:
        seen = _shared_scores(
            model, params.fill, buffers, [xs[i] for i in fill], [ys[i] for i in fill], chunk
        )
        at = np.arange(len(fill))
    else:
        at = fill
    correct[fill], counts[fill] = seen[0][at], seen[1][at]
    return correct, counts, loss_sum + float(seen[2][at].sum())


def _same_params(a: Params, b: Params) -> bool:
    return a.keys() == b.keys() and all(
        a[n].shape == b[n].shape
        and a[n].dtype == b[n].dtype
        and torch.equal(a[n], b[n].to(a[n].device))
        for n in a
    )


def _summary(correct: np.ndarray, counts: np.ndarray, loss_sum: float) -> dict[str, float]:
    """:func:`evaluate`'s dictionary from per-client correct predictions and examples."""
    if counts.sum() == 0:
        nan = float("nan")
        return {"accuracy": nan, "mean_client_accuracy": nan, "loss": nan, "n": 0}
    has = counts > 0
    return {
        "accuracy": float(correct.sum() / counts.sum()),
        "mean_client_accuracy": float(np.mean(correct[has] / counts[has])),
        "loss": loss_sum / float(counts.sum()),
        "n": int(counts.sum()),
    }
