"""A SuperNode's state on disk: its clients' personalized models, written O(sampled) per round.

A node serves ``n`` clients. Their personalized models live in one fixed-size row file per
parameter (``rows-<i>.bin``: ``n`` rows of the parameter's bytes, created sparse, so a node of
``n`` clients of which few were ever sampled costs little disk) and a ``written.bin`` of one
byte per client (1: the client holds a model of its own). A fresh ClientApp process maps these
files (:func:`numpy.memmap`, read only) instead of reading them: a message reads the rows it
needs.

A round writes only its sampled clients' rows, atomically, through a journal
(``journal.bin``): first the journal (the round's key, the node's count of trained rounds, the
rows, their models before and after the round) by an atomic replace, then the rows in place
(``os.pwrite`` of each row, the files ``fsync``-ed). Opening a node re-applies the last
journal's new rows (idempotent), so a node killed between the two writes resumes at the end of
that round; and a server resumed from a checkpoint taken before the round's release asks for
the round again, which puts back the journal's old rows (:meth:`NodeState.undo`). So a round
writes about three times its sampled clients' model bytes, whatever the node's population.

Without a directory the same rows are held in memory (a node of a test or an in-process
simulation).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from privmtl.exceptions import InvalidParameterError
from privmtl.io import write_atomic

if TYPE_CHECKING:
    from privmtl.federated.algorithms import Params

__all__ = ["JOURNAL", "NodeState", "read_personal"]

#: Version of the node state's layout (a node refuses the files of another).
_FORMAT = 1
JOURNAL = "journal.bin"
_LAYOUT = "layout.json"
_WRITTEN = "written.bin"


def _np_dtype(dtype: torch.dtype) -> np.dtype:
    return np.dtype(torch.empty(0, dtype=dtype).numpy().dtype)


class NodeState(Mapping[str, "Params"]):
    """The personalized models of a node's clients ``client_ids``, by client id.

    A read-only mapping of the clients that hold a model of their own to it (``state[cid]``;
    ``len``, ``in`` and iteration as a dict's). :meth:`write_round` stores a round's models,
    :meth:`undo` puts back the models from before the last round.

    Parameters
    ----------
    client_ids : sequence of str
        The node's clients, in the node's order (row ``j`` is client ``client_ids[j]``).
    init : Params
        The initial model: the names, shapes and dtypes of a row.
    directory : path or None
        Where the rows live (created); None holds them in memory.
    """

    def __init__(
        self, client_ids: Sequence[str], init: Params, directory: str | Path | None = None
    ) -> None:
        self.client_ids = list(client_ids)
        self.n = len(self.client_ids)
        self.pos = {cid: j for j, cid in enumerate(self.client_ids)}
        self.names = list(init)
        self.shapes = {k: tuple(init[k].shape) for k in self.names}
        self.dtypes = {k: init[k].dtype for k in self.names}
        self.row_bytes = {
            k: int(np.prod(self.shapes[k], dtype=np.int64)) * _np_dtype(self.dtypes[k]).itemsize
            for k in self.names
        }
        self.directory = None if directory is None else Path(directory)
        self.rounds_trained = 0
        self.last_key: str | None = None
        # the last round's rows and their models before it (None: the client held none)
        self.before: dict[int, Params | None] = {}
        self._rows: dict[str, np.ndarray] = {}
        self._written: np.ndarray
        if self.directory is None:
            self._rows = {
                k: np.zeros((self.n, *self.shapes[k]), dtype=_np_dtype(self.dtypes[k]))
                for k in self.names
            }
            self._written = np.zeros(self.n, dtype=np.uint8)
            return
        self._open()

    # ------------------------------------------------------------------ files
    def _path(self, name: str) -> Path:
        assert self.directory is not None
        return self.directory / name

    def _layout(self) -> dict[str, Any]:
        return {
            "format": _FORMAT,
            "client_ids": self.client_ids,
            "params": [[k, list(self.shapes[k]), str(self.dtypes[k])] for k in self.names],
        }

    def _open(self) -> None:
        assert self.directory is not None
        self.directory.mkdir(parents=True, exist_ok=True)
        layout = self._layout()
        lay = self._path(_LAYOUT)
        if lay.exists():
            found = json.loads(lay.read_text())
            if found != layout:
                raise InvalidParameterError(
                    f"The node state in {self.directory} holds the models of other clients or "
                    "of another model than this node's: use another state directory."
                )
        files = [_WRITTEN] + [f"rows-{i}.bin" for i in range(len(self.names))]
        sizes = [self.n] + [self.n * self.row_bytes[k] for k in self.names]
        for name, size in zip(files, sizes, strict=True):
            path = self._path(name)
            if not path.exists() or path.stat().st_size != size:
                with open(path, "ab") as fh:  # sparse: no byte of it is written
                    fh.truncate(size)
        if not lay.exists():
            write_atomic(lay, json.dumps(layout).encode())
        journal = self._read_journal()
        if journal is not None:
            key, trained, rows, fresh, before, after = journal
            self._apply(rows, after, written=True)
            self.rounds_trained, self.last_key = trained, key or None
            self.before = {
                j: None if f else {k: torch.from_numpy(before[k][i]) for k in self.names}
                for i, (j, f) in enumerate(zip(rows, fresh, strict=True))
            }

    def _map(self, i: int, name: str) -> np.ndarray:
        return np.memmap(
            self._path(f"rows-{i}.bin"), dtype=_np_dtype(self.dtypes[name]), mode="r",
            shape=(self.n, *self.shapes[name]),
        )  # fmt: skip

    def _rows_of(self, name: str) -> np.ndarray:
        if self.directory is None:
            return self._rows[name]
        if self.n == 0:
            return np.zeros((0, *self.shapes[name]), dtype=_np_dtype(self.dtypes[name]))
        return self._map(self.names.index(name), name)

    def _written_flags(self) -> np.ndarray:
        if self.directory is None:
            return self._written
        if self.n == 0:
            return np.zeros(0, dtype=np.uint8)
        return np.memmap(self._path(_WRITTEN), dtype=np.uint8, mode="r", shape=(self.n,))

    def _apply(self, rows: list[int], values: dict[str, np.ndarray], *, written: bool) -> None:
        """Write ``values`` (``(len(rows), ...)`` per name) into ``rows`` and mark them."""
        flag = np.uint8(1 if written else 0)
        if self.directory is None:
            for k in self.names:
                self._rows[k][rows] = values[k]
            self._written[rows] = flag
            return
        for i, k in enumerate(self.names):
            size = self.row_bytes[k]
            fd = os.open(self._path(f"rows-{i}.bin"), os.O_WRONLY)
            try:
                data = np.ascontiguousarray(values[k])
                for r, j in enumerate(rows):
                    os.pwrite(fd, data[r].tobytes(), j * size)
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(self._path(_WRITTEN), os.O_WRONLY)
        try:
            for j in rows:
                os.pwrite(fd, bytes([int(flag)]), j)
            os.fsync(fd)
        finally:
            os.close(fd)

    def _read_journal(
        self,
    ) -> (
        tuple[str, int, list[int], list[bool], dict[str, np.ndarray], dict[str, np.ndarray]] | None
    ):
        path = self._path(JOURNAL)
        if not path.exists():
            return None
        data = path.read_bytes()
        size = int.from_bytes(data[:8], "little")
        head = json.loads(data[8 : 8 + size])
        rows, at = [int(j) for j in head["rows"]], 8 + size
        before: dict[str, np.ndarray] = {}
        after: dict[str, np.ndarray] = {}
        for part in (before, after):
            for k in self.names:
                nbytes = len(rows) * self.row_bytes[k]
                arr = np.frombuffer(data[at : at + nbytes], dtype=_np_dtype(self.dtypes[k]))
                part[k] = arr.reshape(len(rows), *self.shapes[k]).copy()
                at += nbytes
        fresh = [bool(f) for f in head["fresh"]]
        return str(head["key"]), int(head["rounds_trained"]), rows, fresh, before, after

    # ------------------------------------------------------------------ mapping
    def __getitem__(self, cid: str) -> Params:
        j = self.pos.get(cid)
        if j is None or not self._written_flags()[j]:
            raise KeyError(cid)
        return self.row(j)

    def __iter__(self) -> Iterator[str]:
        flags = self._written_flags()
        return iter([self.client_ids[j] for j in np.flatnonzero(flags)])

    def __len__(self) -> int:
        return int(np.count_nonzero(self._written_flags()))

    def __contains__(self, cid: object) -> bool:
        j = self.pos.get(cid) if isinstance(cid, str) else None
        return j is not None and bool(self._written_flags()[j])

    def row(self, j: int) -> Params:
        """The stored model of row ``j`` (copied out of the map)."""
        return {k: torch.from_numpy(np.array(self._rows_of(k)[j])) for k in self.names}

    def written(self, rows: Sequence[int]) -> np.ndarray:
        """Whether the clients at ``rows`` hold a model of their own."""
        return np.asarray(self._written_flags()[list(rows)], dtype=bool)

    def gather(self, rows: Sequence[int]) -> Params:
        """The stored models of ``rows`` stacked (``(len(rows), ...)``; rows never written hold
        what the files hold there: use :meth:`written`)."""
        idx = list(rows)
        return {k: torch.from_numpy(np.array(self._rows_of(k)[idx])) for k in self.names}

    # ------------------------------------------------------------------ rounds
    def put(self, rows: Sequence[int], models: Params) -> None:
        """Store ``models`` at ``rows`` outside any round (a node's models brought back)."""
        self._apply(
            [int(j) for j in rows], {k: models[k].numpy() for k in self.names}, written=True
        )

    def undo(self) -> None:
        """Put back the models from before the last round (its rows only)."""
        if not self.before:
            return
        rows = sorted(self.before)
        kept = [j for j in rows if self.before[j] is not None]
        fresh = [j for j in rows if self.before[j] is None]
        if kept:
            values = {
                k: np.stack([self.before[j][k].numpy() for j in kept])  # type: ignore[index]
                for k in self.names
            }
            self._apply(kept, values, written=True)
        if fresh:
            zeros = {
                k: np.zeros((len(fresh), *self.shapes[k]), dtype=_np_dtype(self.dtypes[k]))
                for k in self.names
            }
            self._apply(fresh, zeros, written=False)
        self.rounds_trained -= 1
        self.before = {}

    def write_round(self, key: str | None, rows: Sequence[int], models: Params | None) -> None:
        """Store round ``key``'s models of ``rows`` (``(len(rows), ...)`` per name; None: the
        round wrote no model) and remember their models before it."""
        rows = [int(j) for j in rows]
        if models is not None and rows:
            written = self.written(rows)
            old = self.gather(rows)
            self.before = {
                j: ({k: old[k][i] for k in self.names} if written[i] else None)
                for i, j in enumerate(rows)
            }
            after = {k: models[k].detach().cpu().numpy() for k in self.names}
            before = {k: old[k].numpy() for k in self.names}
        else:
            rows, written, self.before = [], np.zeros(0, dtype=bool), {}
            before = after = {
                k: np.zeros((0, *self.shapes[k]), dtype=_np_dtype(self.dtypes[k]))
                for k in self.names
            }
        self.last_key = key
        if self.directory is not None:
            head = json.dumps(
                {
                    "key": key or "",
                    "rounds_trained": self.rounds_trained,
                    "rows": rows,
                    "fresh": [int(not w) for w in written],
                }
            ).encode()
            blobs = [
                np.ascontiguousarray(p[k]).tobytes() for p in (before, after) for k in self.names
            ]
            write_atomic(
                self._path(JOURNAL), len(head).to_bytes(8, "little") + head + b"".join(blobs)
            )
        if rows:
            self._apply(rows, after, written=True)


def read_personal(directory: str | Path) -> dict[str, Params]:
    """The personalized models a node's state ``directory`` holds, by client id (for tests and
    tools: reads every written row)."""
    directory = Path(directory)
    layout = json.loads((directory / _LAYOUT).read_text())
    init = {
        k: torch.zeros(shape, dtype=getattr(torch, dtype.removeprefix("torch.")))
        for k, shape, dtype in layout["params"]
    }
    state = NodeState(layout["client_ids"], init, directory)
    return {cid: state[cid] for cid in state}
