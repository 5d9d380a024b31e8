"""FedRep under client-level DP (:mod:`privmtl.federated.fedrep`): a shared representation on
the billboard and a head that stays with each client."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import Params
from privmtl.federated.fedrep import final_heads, local_update, representation_names
from privmtl.federated.methods.base import ClientStep, Method, State, TrainFn, shared_names

__all__ = ["FedRep"]


class FedRep(Method):
    """Head, then representation; sends φ − w̃ (the representation's change); keeps its head;
    at the end every client trains its head on the last released representation."""

    name: ClassVar[str] = "fedrep"
    partial_sharing: ClassVar[bool] = True
    joins_from_billboard: ClassVar[bool] = False
    result_keys: ClassVar[tuple[str, ...]] = ("representation", "head", "head_epochs")
    backends: ClassVar[tuple[str, ...]] = ("in-process", "flower")

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._final: tuple[int, Params] | None = None  # (round, models after the final heads)

    def shared_names(self, init: Params) -> list[str]:
        """The ``shared_params`` (default :func:`~privmtl.federated.fedrep.representation_names`);
        refused when they leave no head."""
        given = self.config.shared_params
        rep = representation_names(list(init)) if given is None else given
        shared = shared_names(init, rep)
        if len(shared) == len(init):
            raise InvalidParameterError(
                "method='fedrep' needs a head that stays with the client: the 'shared_params' "
                f"parameter must leave some parameters of the model out; got {list(rep or ())}."
            )
        return shared

    def client_update(
        self,
        billboard: Params,
        shared: Sequence[str],
        starts: Params,
        anchor: Params | None,
        train: TrainFn,
    ) -> ClientStep:
        cfg = self.config
        news, losses = local_update(billboard, shared, starts, cfg.lr, cfg.head_epochs, train)
        return ClientStep(news, self.messages(billboard, shared, starts, news), losses)

    def outputs(
        self,
        billboard: Params,
        state: State,
        *,
        personal_init: Params,
        names: Sequence[str],
        round: int,
        train_all: TrainFn,
    ) -> tuple[Params | None, Params]:
        """Every client's final head on the last representation (computed once per round)."""
        _, board = super().outputs(
            billboard, state, personal_init=personal_init, names=names, round=round,
            train_all=train_all,
        )  # fmt: skip
        if self._final is None or self._final[0] != round:
            cfg = self.config
            heads = final_heads(
                billboard,
                state.dense("personal"),
                list(billboard),
                cfg.lr,
                cfg.head_epochs,
                train_all,
            )
            self._final = (round, heads)
        return self._final[1], board

    def extra(self, shared: Sequence[str], names: Sequence[str]) -> dict[str, Any]:
        return {
            "representation": list(shared),
            "head": [n for n in names if n not in shared],
            "head_epochs": self.config.head_epochs,
        }

    def with_config(self, config: Any) -> Method:
        out = super().with_config(config)
        assert isinstance(out, FedRep)
        out._final = None
        return out
