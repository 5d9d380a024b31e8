"""The ledger and checkpoints of an MP-MTL run.

The run's :class:`~privmtl.privacy.ledger.PrivacyLedger` (durable under ``checkpoint_dir``) and its
atomic checkpoints, which a resumed run checks are its own (same estimator parameters, data and
release schedule)."""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from privmtl.checkpoint import has_checkpoint, load_checkpoint, save_checkpoint
from privmtl.exceptions import InvalidParameterError
from privmtl.io import arrays_sha256
from privmtl.linear.common import (
    PreparedTasks,
)
from privmtl.linear.losses import TaskBatch
from privmtl.linear.mpmtl_protocol import MPMTLState
from privmtl.locking import DirectoryLock
from privmtl.privacy.ledger import PrivacyLedger
from privmtl.privacy.noise import NoiseSource

__all__ = ["CHECKPOINT_KIND"]

CHECKPOINT_KIND = "mpmtl"


# checkpoint of an MP-MTL run: parameters that say where and how often, not what is computed
_RUNTIME_PARAMS = (
    "budget_epsilon",
    "callback",
    "checkpoint_dir",
    "checkpoint_every",
    "resume",
    "save_models",
)


def _jsonable_param(value: Any) -> Any:
    if isinstance(value, np.random.Generator):
        return "numpy-generator"
    if isinstance(value, np.ndarray | list | tuple):
        arr = np.ascontiguousarray(np.asarray(value, dtype=np.float64))
        return f"array{list(arr.shape)}:sha256:{hashlib.sha256(arr.tobytes()).hexdigest()[:16]}"
    if isinstance(value, np.generic):
        return value.item()
    return value


def _data_fingerprint(batch: TaskBatch) -> str:
    """SHA-256 of the tasks' training data (features, targets, row mask, rows per task)."""
    return arrays_sha256(
        np.asarray(arr, dtype=np.float64) for arr in (batch.X, batch.y, batch.mask, batch.n)
    )


class _Checkpointer:
    """The run's ledger (durable under ``checkpoint_dir``) and its atomic checkpoints.

    Without a directory: an in-memory ledger and no checkpoint. With one: ``ledger.jsonl`` continued
    with :meth:`PrivacyLedger.open`, and the state written by
    :func:`privmtl.checkpoint.save_checkpoint` after the initial models (before any release), every
    ``checkpoint_every`` iterations and at the end.
    """

    def __init__(
        self,
        directory: Path | None,
        *,
        every: int,
        config: dict[str, Any],
        ledger_kw: dict[str, Any],
        resume: bool,
        noise_source: str,
        notify: Callable[[str, int], None] | None,
    ) -> None:
        self.directory = directory
        self.every = every
        self.config = config
        self.ledger_kw = ledger_kw
        self.ledger = PrivacyLedger(**ledger_kw)  # in memory; durable from restore() on
        self.resume = resume
        self._saved_at: int | None = None
        self.noise_source = noise_source
        self.notify = notify

    @classmethod
    def create(
        cls,
        est: Any,
        p: dict[str, Any],
        *,
        prepared: PreparedTasks,
        schedule: Any,
        delta: float,
        accountant: str,
    ) -> _Checkpointer:
        ledger_kw: dict[str, Any] = {
            "delta": delta,
            "accountant": accountant,
            "relation": p["relation"],
            "budget": p["budget_epsilon"],
        }
        common: dict[str, Any] = {
            "every": p["checkpoint_every"],
            "resume": p["resume"],
            "noise_source": p["noise_source"],
            "notify": p["callback"],
        }
        if p["checkpoint_dir"] is None:
            return cls(None, config={}, ledger_kw=ledger_kw, **common)

        directory = Path(p["checkpoint_dir"])
        # by every setting's own name (the grouped ones too): the identity of checkpoints
        # written before the settings were grouped
        params = {
            f"param.{k}": _jsonable_param(v)
            for k, v in est._flat_params().items()
            if k not in _RUNTIME_PARAMS
        }
        ident = dict(schedule.identity())
        per = np.asarray(ident.pop("per_release"), dtype=np.float64)
        ident["per_release_sha256"] = hashlib.sha256(per.tobytes()).hexdigest()[:16]
        config = {
            "estimator": type(est).__name__,
            "data_sha256": _data_fingerprint(prepared.batch),
            "n_tasks": prepared.batch.n_tasks,
            "n_features": prepared.batch.n_features,
            **params,
            **{f"schedule.{k}": v for k, v in ident.items()},
        }
        ledger_path = directory / "ledger.jsonl"
        # one writer per directory, for as long as the fit holds this checkpointer (or the process)
        lock = DirectoryLock.acquire(directory, name="checkpoint_dir")
        try:
            if not p["resume"] and (has_checkpoint(directory) or ledger_path.exists()):
                raise InvalidParameterError(
                    f"The 'checkpoint_dir' {directory} holds a run already; pass resume=True "
                    "(--resume) to continue it, or choose a new directory."
                )
        except BaseException:
            lock.release()
            raise
        out = cls(directory, config=config, ledger_kw=ledger_kw, **common)
        weakref.finalize(out, lock.release)
        return out

    def restore(self, noise: NoiseSource) -> MPMTLState | None:
        """The checkpointed state (noise state restored in seeded mode), or None to start anew.

        Opens (or creates) the durable ledger once the checkpoint was found to be this run's.
        """
        if self.directory is None:
            return None

        state: MPMTLState | None = None
        seen = None
        if self.resume and has_checkpoint(self.directory):
            saved, manifest = load_checkpoint(
                self.directory, kind=CHECKPOINT_KIND, config=self.config
            )
            noise.load_state_dict(json.loads(saved["noise"]))
            state = MPMTLState.from_dict(saved["state"])
            state.stopped_on_budget = False  # re-checked against this run's budget
            seen = manifest.get("ledger") or {}
        self.directory.mkdir(parents=True, exist_ok=True)
        # the ledger must continue the one the checkpoint saw (deleted, cut or edited: refused)
        self.ledger = PrivacyLedger.open(
            self.directory / "ledger.jsonl",
            **self.ledger_kw,
            seen=seen,
            seen_by=f"the checkpoint of iteration {state.iteration if state else 0} in "
            f"{self.directory}",
        )
        if state is not None:
            self._saved_at = state.iteration
        return state

    def save(self, state: MPMTLState, noise: NoiseSource) -> None:
        """Write the checkpoint of ``state`` (atomic), unless it was just written."""
        if self.directory is None or self._saved_at == state.iteration:
            return

        save_checkpoint(
            self.directory,
            kind=CHECKPOINT_KIND,
            config=self.config,
            state={"state": state.to_dict(), "noise": json.dumps(noise.state_dict())},
            step=state.iteration,
            noise_source=self.noise_source,
            ledger=self.ledger.seen(),
        )
        self._saved_at = state.iteration
        if self.notify is not None:
            self.notify("checkpoint", state.iteration)

    def maybe_save(self, state: MPMTLState, noise: NoiseSource) -> None:
        if state.iteration % self.every == 0:
            self.save(state, noise)
