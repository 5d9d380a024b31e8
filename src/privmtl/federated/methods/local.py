"""Methods without communication: ``local`` (sampled clients train their own model, nothing
leaves them) and ``local-all`` (every client trains alone with its own model selection,
:func:`~privmtl.federated.end_of_run.local.train_local`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from privmtl.federated.methods.base import Method

if TYPE_CHECKING:
    from privmtl.federated.config import TrainConfig

__all__ = ["Local", "LocalAll"]


class Local(Method):
    """Sampled clients run local SGD on their own model; no release, ε = 0 towards others."""

    name: ClassVar[str] = "local"
    communicates: ClassVar[bool] = False
    message: ClassVar[str] = "delta"

    def release_settings(
        self, clip: float | None, sigma: float, q: int
    ) -> tuple[Any, float, float]:
        return clip, 0.0, float(q)

    @classmethod
    def is_private(cls, config: TrainConfig) -> bool:
        return False


class LocalAll(Local):
    """Every client trains alone on its own data and picks its own (epochs, lr)."""

    name: ClassVar[str] = "local-all"
    in_engine: ClassVar[bool] = False
    engine_method: ClassVar[str | None] = "pmtl"
    every_client: ClassVar[bool] = True
    result_keys: ClassVar[tuple[str, ...]] = ("local_selection",)
    fit_options: ClassVar[tuple[str, ...]] = ("local_select", "local_solver", "local_patience")
