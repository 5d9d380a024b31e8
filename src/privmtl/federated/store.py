"""The clients' stored state: :class:`ClientStore`, rows only for the clients that wrote one.

A federated method keeps per-client state between rounds (a personalized model, PP-SGD's local
part ``θ``). Of ``m`` clients only those sampled at least once ever hold a state of their own;
every other client holds the field's *default row* (the initial model, zeros). The store keeps
an ``(m,)`` index map from client to row (``-1``: never written) and, per field and parameter,
one row tensor that grows by doubling as clients are written, so ``m`` clients of which ``n``
were written cost ``O(m)`` integers and ``O(n)`` rows, never ``O(m)`` rows (pfl-research keeps
user state in a storage object in the same way).

The rows live on the device of the defaults (:meth:`ClientStore.to` moves them, e.g. to a GPU);
the index map stays on the CPU, and :meth:`ClientStore.state_dict` is always on the CPU, so a
checkpoint taken on a GPU resumes on a CPU and the other way round.

A row holds every field of its client: writing one field of a new client gives it a row in
every field (the other fields at their defaults), so :meth:`ClientStore.written` is one answer
per client, whatever field was written.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from privmtl.exceptions import InvalidParameterError

if TYPE_CHECKING:
    from privmtl.federated.algorithms import Params

__all__ = ["ClientStore"]

#: Version of :meth:`ClientStore.state_dict`'s layout (refused by a store of another).
_FORMAT = 1


def _check_index(name: str, sel: torch.Tensor, m: int) -> torch.Tensor:
    """``sel`` as an int64 vector of client indices in ``[0, m)``, on the CPU (where the index map
    lives)."""
    sel = torch.as_tensor(sel).cpu()
    if sel.ndim != 1 or sel.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise InvalidParameterError(
            f"The '{name}' parameter must be a 1-d integer tensor of client indices; got "
            f"shape {tuple(sel.shape)} and dtype {sel.dtype}."
        )
    sel = sel.to(torch.int64)
    if len(sel) and (int(sel.min()) < 0 or int(sel.max()) >= m):
        bad = sel[(sel < 0) | (sel >= m)]
        raise InvalidParameterError(
            f"The '{name}' parameter must hold client indices in [0, {m}); got {bad[:5].tolist()}."
        )
    return sel


class ClientStore:
    """Per-client state of ``m`` clients by field, stored only for the clients written.

    Parameters
    ----------
    m : int
        The number of clients (rows ``0 .. m-1``).
    defaults : dict of str to Params
        One entry per field (``"personal"``, ``"theta"``, ...): the field's default row, a dict
        of parameter name to tensor of the per-client shape. A client never written holds it.
        The tensors are copied.

    Notes
    -----
    :meth:`gather` returns fresh tensors (``(K, ...)``, defaults for the clients never written),
    :meth:`scatter` writes rows in place and marks the clients written, :meth:`written` says
    which were, :meth:`dense` materializes a field for all ``m`` clients (``(m, ...)``: for the
    end of a run). :meth:`state_dict` holds the written rows only; :meth:`load_state_dict`
    refuses the state of another store (other ``m``, fields, parameters, shapes or dtypes).

    Examples
    --------
    >>> import torch
    >>> store = ClientStore(1000, {"personal": {"w": torch.zeros(3)}})
    >>> store.scatter("personal", torch.tensor([7]), {"w": torch.ones(1, 3)})
    >>> store.gather("personal", torch.tensor([7, 8]))["w"]
    tensor([[1., 1., 1.],
            [0., 0., 0.]])
    >>> store.written(torch.tensor([7, 8])).tolist(), store.n_written
    ([True, False], 1)
    """

    def __init__(self, m: int, defaults: Mapping[str, Params]) -> None:
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise InvalidParameterError(
                f"The 'm' parameter must be an int >= 0 (the number of clients); got {m!r}."
            )
        for field, row in defaults.items():
            if not isinstance(row, Mapping) or not all(
                isinstance(t, torch.Tensor) for t in row.values()
            ):
                raise InvalidParameterError(
                    f"The 'defaults' parameter must map each field to a dict of tensors; field "
                    f"{field!r} holds {type(row).__name__}."
                )
        self.m = m
        self._defaults: dict[str, Params] = {
            f: {n: t.detach().clone() for n, t in row.items()} for f, row in defaults.items()
        }
        self._index = torch.full((m,), -1, dtype=torch.int64)
        self._n = 0
        self._rows: dict[str, Params] = {
            f: {n: t.new_empty((0, *t.shape)) for n, t in row.items()}
            for f, row in self._defaults.items()
        }

    @classmethod
    def from_dense(
        cls, dense: Mapping[str, Params], written: torch.Tensor | None = None
    ) -> ClientStore:
        """A store holding the stacked states ``dense`` (``(m, ...)`` per parameter).

        Every client is written, or those where the ``(m,)`` bool ``written`` is True; the others
        hold their field's default, which is taken from the first of them (a client never
        written holds the default: their rows are all equal).
        """
        m = next((int(t.shape[0]) for row in dense.values() for t in row.values()), None)
        if m is None:
            m = 0 if written is None else len(written)
        mask = torch.ones(m, dtype=torch.bool) if written is None else torch.as_tensor(written)
        if mask.dtype != torch.bool or tuple(mask.shape) != (m,):
            raise InvalidParameterError(
                f"The 'written' parameter must be a ({m},) bool tensor; got shape "
                f"{tuple(mask.shape)} and dtype {mask.dtype}."
            )
        for field, row in dense.items():
            for n, t in row.items():
                if t.ndim < 1 or int(t.shape[0]) != m:
                    raise InvalidParameterError(
                        f"The 'dense' parameter's {field!r} parameter {n!r} must stack {m} "
                        f"clients on its first axis; got shape {tuple(t.shape)}."
                    )
        never = torch.nonzero(~mask).flatten()
        at = int(never[0]) if len(never) else 0
        store = cls(m, {f: {n: t[at] for n, t in row.items()} for f, row in dense.items()})
        sel = torch.nonzero(mask).flatten()
        for field, row in dense.items():
            store.scatter(field, sel, {n: t.index_select(0, sel) for n, t in row.items()})
        return store

    def __repr__(self) -> str:
        return f"ClientStore(m={self.m}, fields={self.fields}, written={self._n})"

    # ------------------------------------------------------------------ fields
    @property
    def fields(self) -> list[str]:
        """The fields held, in the order given."""
        return list(self._defaults)

    def __contains__(self, field: object) -> bool:
        return field in self._defaults

    def __iter__(self) -> Iterator[str]:
        return iter(self._defaults)

    def names(self, field: str) -> list[str]:
        """The parameters of ``field``."""
        return list(self._field(field, self._defaults))

    def default(self, field: str) -> Params:
        """A copy of ``field``'s default row."""
        return {n: t.clone() for n, t in self._field(field, self._defaults).items()}

    @property
    def n_written(self) -> int:
        """How many clients have been written."""
        return self._n

    @property
    def capacity(self) -> int:
        """How many rows are allocated per field and parameter (at least :attr:`n_written`)."""
        for row in self._rows.values():
            for t in row.values():
                return int(t.shape[0])
        return self._n

    def _field(self, field: str, where: dict[str, Params]) -> Params:
        if field not in where:
            raise InvalidParameterError(
                f"The 'field' parameter must be one of the store's fields {self.fields}; "
                f"got {field!r}."
            )
        return where[field]

    # ------------------------------------------------------------------ rows
    def written(self, sel: torch.Tensor) -> torch.Tensor:
        """``(K,)`` bool: whether each client of ``sel`` has been written before."""
        sel = _check_index("sel", sel, self.m)
        return self._index.index_select(0, sel) >= 0

    def gather(self, field: str, sel: torch.Tensor) -> Params:
        """``field`` of the clients ``sel`` as fresh ``(K, ...)`` tensors (the field's default
        for a client never written)."""
        defaults = self._field(field, self._defaults)
        sel = _check_index("sel", sel, self.m)
        idx = self._index.index_select(0, sel)
        have = idx >= 0
        rows = self._rows[field]
        if bool(have.all()):
            at = idx.to(self.device)
            return {n: rows[n].index_select(0, at) for n in defaults}
        out = {n: d.unsqueeze(0).expand((len(sel), *d.shape)).clone() for n, d in defaults.items()}
        if bool(have.any()):
            pos = torch.nonzero(have).flatten().to(self.device)
            src = idx[have].to(self.device)
            for n, t in out.items():
                t[pos] = rows[n].index_select(0, src)
        return out

    def scatter(self, field: str, sel: torch.Tensor, values: Params) -> None:
        """Write ``values`` (``(K, ...)`` per parameter) as ``field`` of the clients ``sel``, in
        place, and mark them written (a new client gets a row in every field, the others at
        their defaults)."""
        defaults = self._field(field, self._defaults)
        sel = _check_index("sel", sel, self.m)
        if set(values) != set(defaults):
            raise InvalidParameterError(
                f"The 'values' parameter must hold the parameters {sorted(defaults)} of field "
                f"{field!r}; got {sorted(values)}."
            )
        for n, d in defaults.items():
            if tuple(values[n].shape) != (len(sel), *d.shape):
                raise InvalidParameterError(
                    f"The 'values' parameter's {n!r} of field {field!r} must have shape "
                    f"{(len(sel), *d.shape)}; got {tuple(values[n].shape)}."
                )
        self._allocate(sel)
        idx = self._index.index_select(0, sel).to(self.device)
        for n, t in self._rows[field].items():
            t[idx] = values[n].to(device=t.device, dtype=t.dtype)

    def _allocate(self, sel: torch.Tensor) -> None:
        """Give a row to every client of ``sel`` never written (in order of first appearance)."""
        new = sel[self._index.index_select(0, sel) < 0]
        if not len(new):
            return
        uniq, inverse = torch.unique(new, return_inverse=True)
        first = torch.full((len(uniq),), len(new), dtype=torch.int64)
        first.scatter_reduce_(0, inverse, torch.arange(len(new)), reduce="amin")
        new = uniq[torch.argsort(first)]
        need = self._n + len(new)
        if need > self.capacity:
            cap = min(max(need, 2 * self.capacity), self.m)  # never more than m rows
            for row in self._rows.values():
                for n, t in row.items():
                    grown = t.new_empty((cap, *t.shape[1:]))
                    grown[: self._n] = t[: self._n]
                    row[n] = grown
        for field, row in self._rows.items():
            for n, t in row.items():
                t[self._n : need] = self._defaults[field][n]
        self._index[new] = torch.arange(self._n, need, dtype=torch.int64)
        self._n = need

    @property
    def device(self) -> torch.device:
        """Where the rows live (the defaults' device; the CPU for a store without parameters)."""
        first = next((t for row in self._defaults.values() for t in row.values()), None)
        return torch.device("cpu") if first is None else first.device

    def to(self, device: torch.device | str) -> ClientStore:
        """Move the defaults and rows to ``device`` (in place; the index map stays on the CPU);
        returns the store. Nothing is copied when they are already there."""
        self._defaults = {
            f: {n: t.to(device) for n, t in r.items()} for f, r in self._defaults.items()
        }
        self._rows = {f: {n: t.to(device) for n, t in r.items()} for f, r in self._rows.items()}
        return self

    def dense(self, field: str) -> Params:
        """``field`` of all ``m`` clients, materialized ``(m, ...)`` (defaults for the clients
        never written)."""
        return self.gather(field, torch.arange(self.m))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The store as CPU tensors and ints (:func:`privmtl.checkpoint.save_checkpoint` saves
        it): ``m``, the index map, the defaults and the written rows only."""
        n = self._n
        return {
            "format": _FORMAT,
            "m": self.m,
            "index": self._index.clone(),
            "defaults": {
                f: {k: t.cpu().clone() for k, t in r.items()} for f, r in self._defaults.items()
            },
            "rows": {
                f: {k: t[:n].cpu().clone() for k, t in r.items()} for f, r in self._rows.items()
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace the contents by ``state`` (from :meth:`state_dict` of a store like this one).

        Raises
        ------
        InvalidParameterError
            When ``state`` is not a store's state or belongs to another store: other ``m``,
            fields, parameters, per-row shapes or dtypes (the message names what differs), or
            an index map that does not address its rows.
        """
        keys = {"format", "m", "index", "defaults", "rows"}
        if not isinstance(state, Mapping) or set(state) != keys:
            got = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise InvalidParameterError(
                f"The 'state' parameter must be a ClientStore.state_dict() (keys {sorted(keys)}); "
                f"got {got}."
            )
        if state["format"] != _FORMAT:
            raise InvalidParameterError(
                f"The 'state' parameter has store format {state['format']!r}; this store reads "
                f"format {_FORMAT}."
            )
        if int(state["m"]) != self.m:
            raise InvalidParameterError(
                f"The 'state' parameter is a store of m={int(state['m'])} clients; this store "
                f"has m={self.m}."
            )
        if sorted(state["defaults"]) != sorted(self._defaults) or sorted(state["rows"]) != sorted(
            self._defaults
        ):
            raise InvalidParameterError(
                f"The 'state' parameter holds the fields {sorted(state['defaults'])}; this store "
                f"holds {sorted(self._defaults)}."
            )
        index = state["index"]
        if not isinstance(index, torch.Tensor) or index.dtype != torch.int64:
            raise InvalidParameterError(
                "The 'state' parameter's index map must be an int64 tensor; got "
                f"{getattr(index, 'dtype', type(index).__name__)}."
            )
        if tuple(index.shape) != (self.m,):
            raise InvalidParameterError(
                f"The 'state' parameter's index map must have shape ({self.m},); got "
                f"{tuple(index.shape)}."
            )
        index = index.cpu()
        n = int((index >= 0).sum())
        used = index[index >= 0]
        below = self.m > 0 and int(index.min()) < -1
        if below or (n and not torch.equal(torch.sort(used).values, torch.arange(n))):
            raise InvalidParameterError(
                f"The 'state' parameter's index map must give the {n} written clients the rows "
                f"0..{n - 1} once each (-1 for the others)."
            )
        for field, mine in self._defaults.items():
            theirs, rows = state["defaults"][field], state["rows"][field]
            if sorted(theirs) != sorted(mine) or sorted(rows) != sorted(mine):
                raise InvalidParameterError(
                    f"The 'state' parameter's field {field!r} holds the parameters "
                    f"{sorted(theirs)}; this store's holds {sorted(mine)}."
                )
            for name, d in mine.items():
                t, r = theirs[name], rows[name]
                if tuple(t.shape) != tuple(d.shape) or t.dtype != d.dtype:
                    raise InvalidParameterError(
                        f"The 'state' parameter's {field!r} parameter {name!r} has rows of shape "
                        f"{tuple(t.shape)} and dtype {t.dtype}; this store's have shape "
                        f"{tuple(d.shape)} and dtype {d.dtype}."
                    )
                if tuple(r.shape) != (n, *d.shape) or r.dtype != d.dtype:
                    raise InvalidParameterError(
                        f"The 'state' parameter's {field!r} parameter {name!r} holds rows of shape "
                        f"{tuple(r.shape)} and dtype {r.dtype}; its index map needs "
                        f"{(n, *d.shape)} and dtype {d.dtype}."
                    )
        device = self.device  # the state's tensors come onto this store's device
        self._index = index.cpu().clone()
        self._n = n
        self._defaults = {
            f: {k: state["defaults"][f][k].to(device).clone() for k in row}
            for f, row in self._defaults.items()
        }
        self._rows = {
            f: {k: state["rows"][f][k].to(device).clone() for k in row}
            for f, row in self._defaults.items()
        }
