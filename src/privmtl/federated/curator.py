"""The curator of a federated run: billboard, round, client sampling, the release and its ledger.

Every backend (the in-process :class:`~privmtl.federated.trainer.Trainer`, Flower's ServerApp)
keeps one :class:`Curator`: it samples the round's clients, and releases the clients' messages
through its :class:`~privmtl.privacy.release.GaussianMeanRelease` (clip → mean over the fixed
``q`` → noise → write-ahead ledger record → billboard update).

With banded noise (a release with a ``strategy``) the curator also keeps the noise state
(:class:`~privmtl.privacy.release.BandedMeanNoise`) and records the run's one event
(:meth:`~privmtl.privacy.release.GaussianMeanRelease.run_event`, release id ``"{name}banded:run"``)
before its first release: the budget is checked for the whole run up front, and a run cut short
reports the whole run's ε. Its checkpoint state holds the past noise with seeded noise only; a
run with secure banded noise cannot be resumed (its past noise is never written down).
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from typing import Any

import numpy as np

from privmtl._validation import check_choice
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import (
    Params,
    sampling_rng,
)
from privmtl.federated.server_optim import ServerOptimizer
from privmtl.privacy.calibration import noise_std_for
from privmtl.privacy.curator import ReleaseCurator
from privmtl.privacy.ledger import PrivacyLedger
from privmtl.privacy.noise import NoiseSource
from privmtl.privacy.release import (
    BANDED_RUN_MECHANISM,
    AdaptiveClip,
    BandedMeanNoise,
    GaussianMeanRelease,
    Release,
)
from privmtl.privacy.sampling import ClientSampler

__all__ = ["Curator"]


class Curator(ReleaseCurator):
    """The server: billboard, round index, sampler and its randomness, the release, the ledger.

    Its releases pass the gate of :class:`~privmtl.privacy.curator.ReleaseCurator` (release ids
    ``"{name}round:{t}"``, replays of seeded runs, budget check, write-ahead record).

    Parameters
    ----------
    release : GaussianMeanRelease
        Clip, noise and sampler of every release (the sampler also draws the clients).
    billboard : dict of str to Tensor
        The initial billboard :math:`\\tilde w^0` (stacked ``(m, ...)`` blocks for ``"blocks"``).
    noise : NoiseSource
    ledger : PrivacyLedger or None
        Receives every private release before it leaves (None: not private).
    update : {"add", "replace", "blocks"}
        How a release enters the billboard: :math:`\\tilde w + r`, :math:`r`, or block-wise add.
    seed : int
        Seed of the client-sampling stream in seeded mode.
    name : str
        Prefix of the release ids in the ledger (several curators may share one).
    optimizer : ServerOptimizer, optional
        With ``update="add"``: the billboard adds ``optimizer.step(r)`` instead of the released
        value ``r`` (post-processing of what was released; it never sees the un-noised mean).
    adaptive_clip : AdaptiveClip, optional
        With a release that also releases the noisy unclipped fraction (``count_noise_std``):
        after every release the clip moves to ``adaptive_clip.next_clip(clip, fraction)`` and the
        noise std to :math:`zC/q` with the initial multiplier ``z`` fixed, so that the next
        release is clipped with, and accounted for, the same clip.
    """

    def __init__(
        self,
        release: GaussianMeanRelease,
        billboard: Params,
        *,
        noise: NoiseSource,
        ledger: PrivacyLedger | None,
        update: str = "add",
        seed: int = 0,
        name: str = "",
        optimizer: ServerOptimizer | None = None,
        adaptive_clip: AdaptiveClip | None = None,
    ) -> None:
        if adaptive_clip is not None and (release.count_noise_std is None or release.clip is None):
            raise InvalidParameterError(
                "An adaptive clip needs a release with a finite clip and a noisy count "
                "('count_noise_std')."
            )
        super().__init__(ledger=ledger, noise=noise, name=name)
        self.adaptive_clip = adaptive_clip
        self._z = release.noise_multiplier
        self.release_mechanism = release
        self.billboard = {n: p.clone() for n, p in billboard.items()}
        self.update = check_choice("update", update, ("add", "replace", "blocks"))
        if optimizer is not None and self.update != "add":
            raise InvalidParameterError(
                f"A server optimizer needs update='add'; got update={update!r}."
            )
        self.optimizer = optimizer
        self.round = 0
        self._rng = sampling_rng(seed) if noise.kind == "seeded" else None
        self.banded: BandedMeanNoise | None = None
        self._run_recorded = False
        if release.strategy is not None:
            if self.update == "blocks" or adaptive_clip is not None:
                raise InvalidParameterError(
                    "Banded noise needs update='add' or 'replace' without an adaptive clip; got "
                    f"update={update!r}, adaptive_clip={adaptive_clip!r}."
                )
            self.banded = BandedMeanNoise(release.strategy, release.noise_std, noise)

    @property
    def sampler(self) -> ClientSampler:
        return self.release_mechanism.sampler

    def event(self) -> Any:
        """The privacy event the next release charges (None when not private): a banded run's
        one event until it is recorded, else the round's."""
        run = self._pending_run_event()
        return run if run is not None else self.release_mechanism.event(self.round)

    @property
    def run_release_id(self) -> str:
        """The ledger id of a banded run's one event."""
        return f"{self.name}banded:run"

    def _pending_run_event(self) -> Any:
        """The banded run's event while the ledger does not hold it yet (else None)."""
        if self.banded is None or self.ledger is None or self._run_recorded:
            return None  # cheap checks first: the event's sensitivity is a T x T computation
        if isinstance(self.ledger, PrivacyLedger) and self.ledger.has_release(self.run_release_id):
            self._run_recorded = True  # recorded before a resume
            return None
        return self.release_mechanism.run_event()

    def record_run(self) -> None:
        """Record a banded run's one event (write-ahead, before its first release; budget
        checked for the whole run). Does nothing with independent noise or once recorded."""
        event = self._pending_run_event()
        if event is not None:
            self.record(
                event,
                release_id=self.run_release_id,
                mechanism=BANDED_RUN_MECHANISM,
                params=self.release_mechanism.run_params(),
            )
            self._run_recorded = True

    release_kind = "round"

    def release_id(self) -> str:
        """The ledger id of the next release."""
        return self.release_id_at(self.round)

    def would_exceed_budget(self) -> bool:
        """True when the ledger has a budget that the next release would exceed.

        A seeded replay of a release the ledger holds already (a resumed run) was charged when it
        was first made, so it never exceeds the budget.
        """
        run = self._pending_run_event()
        if run is not None:
            return self.would_exceed(run, self.run_release_id)
        return self.would_exceed(self.release_mechanism.event(self.round), self.release_id())

    def sample_round(self) -> np.ndarray:
        """The sorted indices of this round's clients."""
        rng = self._rng if self._rng is not None else np.random.default_rng(secrets.randbits(128))
        at = getattr(self.sampler, "sample_at", None)  # a sampler of sample() alone draws the same
        drawn = at(rng, self.round) if at is not None else self.sampler.sample(rng)
        return np.asarray(drawn, dtype=np.int64).reshape(-1)

    def release(self, messages: Params, rows: np.ndarray | None = None) -> Release:
        """Clip → mean → noise → record → billboard update; returns what was released."""
        # this curator is the mechanism's ledger gate: it records with its ids and replay policy
        self.record_run()
        common: dict[str, Any] = {
            "ledger": self,
            "round": self.round,
            "release_id": self.release_id(),
        }
        mech = self.release_mechanism
        if self.update == "blocks":
            assert rows is not None
            num = next(iter(self.billboard.values())).shape[0]
            out = mech.release_blocks(messages, rows, num, self.noise, **common)
        else:
            out = mech.release(
                messages, self.noise, template=self.billboard, banded=self.banded, **common
            )
        self._apply(out)
        return out

    def release_sum(self, total: Params) -> Release:
        """Like :meth:`release` from the sum of messages clipped elsewhere (secure aggregation).

        ``total`` is the sum over this round's answering clients of their messages, each clipped
        by the client to ℓ2 norm at most γ; the rest (fixed divisor, noise, write-ahead ledger
        record, billboard update) is :meth:`release`'s. Only for ``update="add"``.
        """
        if self.update != "add":
            raise InvalidParameterError(
                f"A release from a clipped sum needs update='add'; got update={self.update!r}."
            )
        self.record_run()
        out = self.release_mechanism.release_sum(
            total,
            self.noise,
            ledger=self,
            round=self.round,
            release_id=self.release_id(),
            banded=self.banded,
        )
        self._apply(out)
        return out

    def _apply(self, out: Release) -> None:
        # the ledger has the release on disk: it may now leave the curator
        if self.update == "replace":
            self.billboard = out.value
        elif self.optimizer is not None:  # post-processing of the released (noised) value only
            inc = self.optimizer.step(out.value)
            self.billboard = {n: self.billboard[n] + inc[n] for n in self.billboard}
        else:
            self.billboard = {n: self.billboard[n] + out.value[n] for n in self.billboard}
        if self.adaptive_clip is not None:  # post-processing of the released count
            mech = self.release_mechanism
            assert mech.clip is not None
            self._set_clip(
                self.adaptive_clip.next_clip(mech.clip, out.details["unclipped_fraction"])
            )
        self.round += 1

    def _set_clip(self, clip: float) -> None:
        mech = self.release_mechanism
        sigma = 0.0 if self._z is None else noise_std_for(self._z, mech.q, clip)
        self.release_mechanism = dataclasses.replace(mech, clip=clip, noise_std=sigma)

    def state_dict(self) -> dict[str, Any]:
        """Billboard, round and (seeded mode only) the sampling and noise generator states."""
        state: dict[str, Any] = {"billboard": self.billboard, "round": self.round}
        if self._rng is not None:
            state["sampling_rng"] = json.dumps(self._rng.bit_generator.state)
            state["noise"] = self.noise.state_dict()
        if self.optimizer is not None:
            state["server_optimizer"] = self.optimizer.state_dict()
        if self.adaptive_clip is not None:
            state["clip"] = self.release_mechanism.clip
        if self.banded is not None and self._rng is not None:  # secret: seeded noise only
            state["banded_noise"] = self.banded.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.billboard = {n: p.clone() for n, p in state["billboard"].items()}
        self.round = int(state["round"])
        if self._rng is not None:
            self._rng.bit_generator.state = json.loads(state["sampling_rng"])
            self.noise.load_state_dict(state["noise"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state.get("server_optimizer", {}))
        if self.adaptive_clip is not None:
            self._set_clip(float(state["clip"]))
        if self.banded is not None:
            if "banded_noise" not in state:
                raise InvalidParameterError(
                    "A run with banded noise resumes only with seeded noise (its past noise is "
                    "checkpointed then); this checkpoint has none: start the run again."
                )
            self.banded.load_state_dict(state["banded_noise"], self.billboard)
