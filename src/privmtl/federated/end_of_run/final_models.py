"""Which model every client ended the run with, counted and in words (the result's
``clients_per_final_model`` and ``end_of_run``), and the trained models stacked per client."""

from __future__ import annotations

from typing import Any

from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import Params

__all__ = [
    "FINAL_MODEL_WORDS",
    "describe_final_models",
    "final_model_counts",
    "final_models_keys",
    "stack_trained",
]


def stack_trained(trained: Params | None, billboard: Params, m: int) -> Params:
    """The trained models of ``m`` clients: the personalized ones, or the billboard stacked."""
    if trained is not None:
        return trained
    return {n: p.unsqueeze(0).expand((m, *p.shape)) for n, p in billboard.items()}


FINAL_MODEL_WORDS = {
    "trained": "kept the trained {kind} model",
    "local": "trained locally from scratch",
    "billboard-finetune": "fine-tuned the released global model on their own data",
    "finetuned": "fine-tuned the trained {kind} model on their own data",
}
"""What a client did at the end of the run, in words, for each key of
:func:`final_model_counts` (``{kind}``: "personalized" or "global", the trained model's kind)."""


def final_model_counts(
    finetune: str,
    n_clients: int,
    *,
    auto_counts: dict[str, int] | None = None,
    from_billboard: bool = False,
) -> dict[str, int]:
    """How many clients ended the run with each kind of model (keys of :data:`FINAL_MODEL_WORDS`).

    ``finetune="none"``: every client keeps its trained model; ``"auto"``: the clients' own
    choices (``auto_counts``, :func:`auto_info`'s ``clients_per_candidate``); an explicit
    fine-tuning method: every client fine-tuned its trained model, or the released global model
    (``from_billboard``). A histogram of the clients' own choices: a summary of the population,
    no client's output.
    """
    if finetune == "none":
        return {"trained": int(n_clients)}
    if finetune == "auto":
        if auto_counts is None:
            raise InvalidParameterError("final_model_counts(finetune='auto') needs 'auto_counts'.")
        return {name: int(c) for name, c in auto_counts.items()}
    return {"billboard-finetune" if from_billboard else "finetuned": int(n_clients)}


def describe_final_models(counts: dict[str, int], *, personalized: bool) -> str:
    """:func:`final_model_counts` in words, e.g. "0 of 20 clients kept the trained personalized
    model, 20 trained locally from scratch" (``personalized``: the method trains personalized
    models; else the trained model is the global one)."""
    kind = "personalized" if personalized else "global"
    total = sum(counts.values())
    parts = []
    for i, (name, count) in enumerate(counts.items()):
        words = FINAL_MODEL_WORDS[name].format(kind=kind)
        parts.append(f"{count} of {total} clients {words}" if i == 0 else f"{count} {words}")
    return ", ".join(parts)


def final_models_keys(
    finetune: str,
    n_clients: int,
    *,
    auto: dict[str, Any] | None,
    from_billboard: bool,
    personalized: bool,
) -> dict[str, Any]:
    """The result keys saying which model every client ended the run with:
    ``clients_per_final_model`` (:func:`final_model_counts`) and ``end_of_run`` (the same in
    words, :func:`describe_final_models`). ``auto`` is the result's ``finetune_auto``."""
    counts = final_model_counts(
        finetune,
        n_clients,
        auto_counts=None if auto is None else auto["clients_per_candidate"],
        from_billboard=from_billboard,
    )
    return {
        "clients_per_final_model": counts,
        "end_of_run": describe_final_models(counts, personalized=personalized),
    }
