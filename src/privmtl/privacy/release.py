r"""The server release of the federated family: clip every update, average over a fixed q, add noise.

:class:`GaussianMeanRelease` is the one place where a PMTL-family curator turns client messages
into something that leaves it. For ``K`` sampled clients with messages :math:`g_k` it releases

.. math:: \frac{1}{q}\sum_{k=1}^{K} g_k \min\Bigl(1, \frac{\gamma}{\lVert g_k\rVert_2}\Bigr)
          + N(0, \sigma^2 I),

with the *fixed* divisor ``q`` (``clients_per_round`` of the sampler, never the realised Poisson
count), so that adding or removing one client moves the mean by at most :math:`\gamma/q`. The
noise multiplier handed to the accountant is therefore

.. math:: z = \sigma q / \gamma,

and the privacy event of one release is the sampler's own event for ``z``
(:meth:`ClientSampler.event`): the sampling performed is the sampling accounted. The order inside
:meth:`GaussianMeanRelease.release` is the write-ahead order: clip → mean → noise → ledger record
(on disk when the ledger is durable) → return; the caller publishes only what was returned.

The norm is taken over all parameters of a message jointly. A *block* release
(:meth:`GaussianMeanRelease.release_blocks`, joint-model DP) puts each client's clipped message in
its own block of an ``m``-block vector and adds noise to every block; with ``divisor = 1`` its
noise multiplier is again :math:`z = \sigma/\gamma`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from dp_accounting import dp_event as dpe

from privmtl._validation import check_real
from privmtl.exceptions import InvalidParameterError
from privmtl.privacy.noise import NoiseSource
from privmtl.privacy.sampling import ClientSampler

__all__ = [
    "GaussianMeanRelease",
    "Release",
    "clip_factors",
    "clipped_mean",
    "noise_multiplier",
    "noise_std_for",
    "signal_noise",
    "update_norms",
]


def noise_multiplier(noise_std: float, divisor: float, clip: float) -> float:
    """:math:`z = \\sigma q/\\gamma`: the noise std over the add/remove sensitivity γ/q of the mean."""
    return noise_std * divisor / clip


def noise_std_for(multiplier: float, divisor: float, clip: float) -> float:
    """:math:`\\sigma = z\\gamma/q`, the inverse of :func:`noise_multiplier`."""
    return multiplier * clip / divisor


Params = dict[str, torch.Tensor]


def update_norms(updates: Params) -> torch.Tensor:
    """ℓ2 norm over all parameters of every row ``k`` of stacked ``(K, ...)`` updates (float64)."""
    sq = sum(t.double().flatten(1).pow(2).sum(1) for t in updates.values())
    return torch.as_tensor(sq).sqrt()


def clip_factors(norms: torch.Tensor, clip: float | None) -> torch.Tensor:
    """``min(1, γ / ‖g_k‖)`` per row (1 for a zero update, or for every row when ``clip`` is None)."""
    if clip is None:
        return torch.ones_like(norms)
    return torch.where(norms > clip, clip / norms.clamp_min(1e-30), torch.ones_like(norms))


def _norm(params: Params) -> float:
    return float(sum(t.double().pow(2).sum() for t in params.values()) ** 0.5)


def signal_noise(mean: Params, draws: Params | None) -> dict[str, Any]:
    """Curator-side diagnostics of one release: ``signal_norm`` ‖mean of clipped messages‖,
    ``noise_norm`` ‖noise drawn‖ (0 without noise) and ``released_dim`` (coordinates noised).

    The signal norm is computed from the un-noised mean: it is *not* covered by the privacy
    guarantee and stays in the curator's history (a simulation diagnostic, like the per-client
    update norms).
    """
    return {
        "signal_norm": _norm(mean),
        "noise_norm": 0.0 if draws is None else _norm(draws),
        "released_dim": int(sum(t.numel() for t in mean.values())),
    }


def clipped_mean(
    updates: Params, clip: float | None, divisor: float, template: Params | None = None
) -> tuple[Params, np.ndarray, np.ndarray]:
    """Clip every row of stacked ``(K, ...)`` messages to ``clip`` and sum over ``divisor``.

    Returns the clipped mean (zeros like ``template`` when ``K = 0``), the norms before
    clipping and a boolean "was clipped" per row.
    """
    first = next(iter(updates.values()))
    if first.shape[0] == 0:
        if template is None:
            raise InvalidParameterError("A mean of no messages needs a 'template'.")
        zeros = {n: torch.zeros_like(p) for n, p in template.items()}
        return zeros, np.zeros(0), np.zeros(0, dtype=bool)
    norms = update_norms(updates)
    factors = clip_factors(norms, clip)
    mean = {
        n: torch.tensordot(factors.to(t.dtype), t, dims=1) / divisor for n, t in updates.items()
    }
    return mean, norms.numpy(), (factors < 1).numpy()


@dataclass
class Release:
    """What one release produced: the released ``value`` and what the curator may log about it.

    ``norms`` are the message norms before clipping and ``clipped`` whether each was clipped (both
    stay with the curator: they are not part of the release); ``epsilon`` is the ledger's ε after
    the release (``inf`` when not private) and ``event`` the recorded privacy event.
    """

    value: Params
    norms: np.ndarray
    clipped: np.ndarray
    epsilon: float
    event: dpe.DpEvent | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GaussianMeanRelease:
    """Clipped mean of client messages over a fixed divisor plus Gaussian noise (module docstring).

    Parameters
    ----------
    clip : float or None
        γ. ``None`` disables clipping (the release is then not private, whatever the noise).
    noise_std : float
        σ: standard deviation of the noise on the released mean.
    sampler : ClientSampler
        Draws the clients and names the privacy event of one release.
    divisor : float, optional
        The fixed divisor (default ``sampler.clients_per_round``, i.e. q); ``1`` for block
        releases.
    """

    clip: float | None
    noise_std: float
    sampler: ClientSampler
    divisor: float | None = None

    def __post_init__(self) -> None:
        if self.clip is not None:
            check_real("clip", self.clip, low=0.0, closed="neither")
        check_real("noise_std", self.noise_std, low=0.0)
        if self.divisor is not None:
            check_real("divisor", self.divisor, low=0.0, closed="neither")

    @property
    def q(self) -> float:
        """The fixed divisor of the sum of clipped messages."""
        return float(self.sampler.clients_per_round if self.divisor is None else self.divisor)

    @property
    def private(self) -> bool:
        """True when the release is a Gaussian mechanism (finite clip and positive noise)."""
        return self.clip is not None and self.noise_std > 0

    @property
    def noise_multiplier(self) -> float | None:
        """:math:`z = \\sigma q/\\gamma` (None when not private): noise std over sensitivity."""
        if not self.private:
            return None
        assert self.clip is not None
        return noise_multiplier(self.noise_std, self.q, self.clip)

    def event(self) -> dpe.DpEvent | None:
        """The dp-accounting event of one release (None when not private)."""
        z = self.noise_multiplier
        return None if z is None else self.sampler.event(z)

    def params(self) -> dict[str, Any]:
        """The release's parameters as a ledger entry records them."""
        return {
            "clip": self.clip,
            "noise_std": self.noise_std,
            "divisor": self.q,
            "noise_multiplier": self.noise_multiplier,
            "sampling": getattr(self.sampler, "kind", None),
            "num_clients": getattr(self.sampler, "num_clients", None),
            "clients_per_round": getattr(self.sampler, "clients_per_round", None),
        }

    # ------------------------------------------------------------------------------- pieces
    def aggregate(
        self, updates: Params, template: Params | None = None
    ) -> tuple[Params, np.ndarray, np.ndarray]:
        """:func:`clipped_mean` with this release's clip and divisor."""
        return clipped_mean(updates, self.clip, self.q, template)

    def _record(
        self, ledger: Any, round: int | None, release_id: str | None, replay_ok: bool, kind: str
    ) -> tuple[float, dpe.DpEvent | None]:
        event = self.event()
        if event is None or ledger is None:
            return (float("inf") if event is None else float("nan")), event
        from privmtl.privacy.ledger import PrivacyLedger

        if not isinstance(ledger, PrivacyLedger):  # a stand-in with record(event, round=...)
            return float(ledger.record(event, round=round)), event
        eps = ledger.record(
            event,
            round=round,
            mechanism=kind,
            params=self.params(),
            release_id=release_id,
            replay_ok=replay_ok,
        )
        return float(eps), event

    # ------------------------------------------------------------------------------- releases
    def release(
        self,
        updates: Params,
        noise: NoiseSource,
        *,
        template: Params | None = None,
        ledger: Any = None,
        round: int | None = None,
        release_id: str | None = None,
        replay_ok: bool = False,
    ) -> Release:
        """Clip → mean over the fixed divisor → noise → ledger record → the released mean.

        ``updates`` are stacked ``(K, ...)`` messages (``K`` may be 0; then ``template`` gives the
        shapes). Noise is drawn from ``noise`` only when σ > 0, one tensor per parameter in
        ``updates`` order. The ledger (when given and the release is private) records the
        sampler's event before this method returns; ``replay_ok`` is passed on to
        :meth:`~privmtl.privacy.ledger.PrivacyLedger.record` (seeded replays after resume).
        """
        mean, norms, clipped = self.aggregate(updates, template)
        if self.noise_std > 0:
            draws = noise.normal_like(mean, self.noise_std)
            value = {n: mean[n] + draws[n] for n in mean}
        else:
            draws, value = None, mean
        eps, event = self._record(ledger, round, release_id, replay_ok, "gaussian-mean")
        return Release(value, norms, clipped, eps, event, signal_noise(mean, draws))

    def release_blocks(
        self,
        updates: Params,
        rows: np.ndarray,
        num_blocks: int,
        noise: NoiseSource,
        *,
        ledger: Any = None,
        round: int | None = None,
        release_id: str | None = None,
        replay_ok: bool = False,
    ) -> Release:
        """Block release: row ``j`` of the clipped messages lands in block ``rows[j]`` of an
        ``(num_blocks, ...)`` vector (divided by the divisor), and every block gets noise."""
        first = next(iter(updates.values()))
        value = {
            n: torch.zeros((num_blocks, *t.shape[1:]), dtype=t.dtype) for n, t in updates.items()
        }
        norms, clipped = np.zeros(0), np.zeros(0, dtype=bool)
        if first.shape[0]:
            nrm = update_norms(updates)
            fac = clip_factors(nrm, self.clip)
            idx = torch.as_tensor(np.asarray(rows, dtype=np.int64))
            for n, t in updates.items():
                shape = (-1,) + (1,) * (t.ndim - 1)
                value[n][idx] = t * fac.to(t.dtype).view(shape) / self.q
            norms, clipped = nrm.numpy(), (fac < 1).numpy()
        if self.noise_std > 0:
            draws = noise.normal_like(value, self.noise_std)
            value = {n: value[n] + draws[n] for n in value}
        eps, event = self._record(ledger, round, release_id, replay_ok, "gaussian-blocks")
        return Release(value, norms, clipped, eps, event)
