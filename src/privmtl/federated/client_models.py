"""Every client's model without holding every client's model: :class:`ClientModels`.

A method that keeps a model per client (:class:`~privmtl.federated.store.ClientStore`'s
``"personal"`` field) holds rows only for the clients it sampled; every other client holds a
fill (the initial model, or the billboard a client joining would download). The end of a run
reads these models a block of clients at a time (:meth:`ClientModels.rows`,
:func:`~privmtl.federated.scoring.block_rows`), so a population of ``m`` clients costs the
sampled clients' rows and ``O(m)`` integers, never ``(m, ...)`` stacked models.

It is also the ``dict`` of stacked ``(m, ...)`` tensors that
:attr:`~privmtl.federated.train_result.TrainResult.personalized_params` has always been: read as
a dict (a key, ``items()``, ``torch.save``) it stacks every client's model once and keeps the
stack. Code that must stay flat in ``m`` reads rows; a small population may read it whole.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import ItemsView, Iterator, KeysView, ValuesView
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from privmtl.exceptions import InvalidParameterError
from privmtl.federated.store import ClientStore

__all__ = [
    "ClientModels",
    "FilledRows",
    "SpilledModels",
    "StoredModels",
    "filled_rows",
    "model_rows",
]

Params = dict[str, torch.Tensor]


class ClientModels(dict[str, torch.Tensor]):
    """The models of ``m`` clients, read a block of clients at a time (:meth:`rows`); read as a
    dict they are the stacked ``(m, ...)`` models (computed at the first such read, then kept).

    Subclasses say where the rows come from (:class:`StoredModels`: a client store;
    :class:`SpilledModels`: blocks written to disk as the end of run finishes them). Models are
    on the CPU.
    """

    def __init__(self, m: int, names: list[str]) -> None:
        super().__init__()
        self.m = m
        self._names = list(names)
        self._stacked = False

    @property
    def stacked(self) -> bool:
        """Whether the ``(m, ...)`` stack has been computed (and is held)."""
        return self._stacked

    def rows(self, pos: np.ndarray | torch.Tensor) -> Params:
        """The models of the clients ``pos`` (positions in ``0 .. m-1``), fresh ``(K, ...)``
        tensors."""
        pos = np.asarray(pos, dtype=np.int64)
        if self._stacked:
            sel = torch.from_numpy(pos)
            return {n: dict.__getitem__(self, n).index_select(0, sel) for n in self._names}
        return self._read(pos)

    def _read(self, pos: np.ndarray) -> Params:
        raise NotImplementedError

    def _release(self) -> None:
        """Drop the source of the rows once the stack holds them."""

    def _stack(self) -> None:
        if not self._stacked:
            dense = self._read(np.arange(self.m, dtype=np.int64))
            dict.update(self, dense)
            self._stacked = True
            self._release()

    # ------------------------------------------------------------------ read as a dict
    def __getitem__(self, name: str) -> torch.Tensor:
        self._stack()
        return dict.__getitem__(self, name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def keys(self) -> KeysView[str]:  # type: ignore[override]
        self._stack()
        return dict.keys(self)

    def values(self) -> ValuesView[torch.Tensor]:  # type: ignore[override]
        self._stack()
        return dict.values(self)

    def items(self) -> ItemsView[str, torch.Tensor]:  # type: ignore[override]
        self._stack()
        return dict.items(self)

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return self[name] if name in self._names else default

    def copy(self) -> Params:
        return dict(self.items())

    def __reduce__(self) -> Any:  # pickled (torch.save, a worker process) as the plain stack
        return dict, (dict(self.items()),)

    def __repr__(self) -> str:
        state = "stacked" if self._stacked else "rows"
        return f"{type(self).__name__}(m={self.m}, names={self._names}, {state})"


class StoredModels(ClientModels):
    """The rows of field ``field`` of ``store`` (copied: a snapshot, later writes to ``store``
    do not change it), and ``fill`` for the clients never written (None: the field's default
    row): a method's personalized models at the end of its rounds."""

    def __init__(self, store: ClientStore, field: str, fill: Params | None = None) -> None:
        own = ClientStore(store.m, {f: store.default(f) for f in store.fields})
        own.load_state_dict(store.state_dict())  # the written rows and the index map, on the CPU
        super().__init__(store.m, own.names(field))
        self._store: ClientStore | None = own.to("cpu")
        self._field = field
        self._fill = None if fill is None else {n: t.detach().cpu() for n, t in fill.items()}

    def _read(self, pos: np.ndarray) -> Params:
        assert self._store is not None
        sel = torch.from_numpy(pos)
        out = self._store.gather(self._field, sel)
        if self._fill is not None:
            never = ~self._store.written(sel)
            if bool(never.any()):
                for n, t in out.items():
                    t[never] = self._fill[n]
        return out

    def filled_rows(self, pos: np.ndarray) -> Params | FilledRows:
        """The models of the clients ``pos``: the rows of those written, and the fill shared by
        the others (:class:`FilledRows`), without a row per client for the fill; the rows
        (:meth:`rows`) where there is no fill or the stack is held."""
        if self._fill is None or self._stacked:
            return self.rows(pos)
        assert self._store is not None
        sel = torch.from_numpy(np.asarray(pos, dtype=np.int64))
        has = self._store.written(sel).numpy()
        own = self._store.gather(self._field, sel[torch.from_numpy(has)])
        return FilledRows(own, has, self._fill)

    def _release(self) -> None:
        self._store = None


class SpilledModels(ClientModels):
    """Models written block by block, in the clients' order, to files in a private temporary
    folder (:meth:`append`), read back by rows: the final models of a run that saves them, held
    on disk until the saved files are written (the folder goes with the object)."""

    def __init__(self, m: int) -> None:
        super().__init__(m, [])
        self._dir = tempfile.mkdtemp(prefix="privmtl-models-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, True)
        self._starts: list[int] = []
        self._n = 0

    def append(self, pos: np.ndarray, params: Params, data: object = None) -> None:
        """Write the models of the next block of clients ``pos`` (consecutive, from where the
        last block stopped); a :data:`~privmtl.federated.end_of_run.plan.BlockSink` (the
        block's ``data`` are not needed)."""
        pos = np.asarray(pos, dtype=np.int64)
        if len(pos) and (int(pos[0]) != self._n or int(pos[-1]) != self._n + len(pos) - 1):
            raise InvalidParameterError(
                f"SpilledModels.append takes consecutive blocks from client {self._n}; got "
                f"clients {int(pos[0])} to {int(pos[-1])}."
            )
        if not self._names:
            self._names = list(params)
        path = os.path.join(self._dir, f"{len(self._starts):07d}.pt")
        torch.save({n: p.detach().cpu().contiguous() for n, p in params.items()}, path)
        self._starts.append(self._n)
        self._n += len(pos)

    def _read(self, pos: np.ndarray) -> Params:
        if self._n != self.m:
            raise InvalidParameterError(
                f"SpilledModels holds {self._n} of its {self.m} clients' models; append the rest "
                "before reading them."
            )
        starts = np.asarray(self._starts, dtype=np.int64)
        which = np.searchsorted(starts, pos, side="right") - 1
        parts: dict[str, list[torch.Tensor]] = {n: [] for n in self._names}
        order = []
        for b in np.unique(which):
            at = np.flatnonzero(which == b)
            block = torch.load(os.path.join(self._dir, f"{int(b):07d}.pt"), weights_only=True)
            rows = torch.from_numpy(pos[at] - starts[b])
            for n in self._names:
                parts[n].append(block[n].index_select(0, rows))
            order.append(at)
        back = torch.from_numpy(np.argsort(np.concatenate(order), kind="stable"))
        return {n: torch.cat(p).index_select(0, back) for n, p in parts.items()}

    def _release(self) -> None:
        self._cleanup()


@dataclass(frozen=True)
class FilledRows:
    """The models of a block of ``K`` clients, those that never had one of their own holding one
    shared model: ``own`` ``(K_own, ...)`` the rows of the clients where ``has_own`` (bool
    ``(K,)``) is true, in their order, and ``fill`` the model of every other client. A client's
    model is the same as in the stacked rows; only its storage differs (scoring computes the
    fill's clients as one model's, :func:`~privmtl.federated.scoring.client_scores` the
    others)."""

    own: Params
    has_own: np.ndarray
    fill: Params


def filled_rows(params: Params, pos: np.ndarray) -> Params | FilledRows:
    """The models of the clients ``pos``: :meth:`StoredModels.filled_rows` for a method's stored
    models, else the rows of stacked models (:func:`model_rows`)."""
    if isinstance(params, StoredModels):
        return params.filled_rows(pos)
    return model_rows(params, pos)


def model_rows(params: Params, pos: np.ndarray) -> Params:
    """The rows ``pos`` of stacked models: :meth:`ClientModels.rows`, or the rows of a plain
    stack."""
    if isinstance(params, ClientModels):
        return params.rows(pos)
    rows = torch.from_numpy(np.asarray(pos, dtype=np.int64))
    return {n: p.index_select(0, rows.to(p.device)) for n, p in params.items()}
