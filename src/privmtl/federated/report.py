"""The JSON result of a PMTL-family run and its privacy guarantee, for every backend.

:func:`~privmtl.experiments.pmtl.run_pmtl` (the in-process engine) and Flower's ServerApp
(:mod:`privmtl.flower`) report a trained run with the same keys in the same order: the settings,
the accuracies, the guarantee read from the run's ledger, ``covered`` and ``summary``. The notes
and not-covered reasons the two add (features scaled per client, a client's own selection, the
opt-ins that read pooled or un-noised data, joint DP after fine-tuning) are written here once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from privmtl.federated.methods import method_class
from privmtl.privacy import PrivacyGuarantee
from privmtl.privacy.calibration import noise_multiplier
from privmtl.privacy.release import BANDED_RUN_MECHANISM
from privmtl.privacy.selection import VOTE_MECHANISM

__all__ = [
    "CURATOR_DIAGNOSTICS",
    "DIAGNOSTICS_NOT_COVERED",
    "FINETUNE_SELECT_POOLED",
    "JOINT_DP_NOTE",
    "JOINT_DP_NOTION",
    "LOCAL_SELECT_CLIENT_NOTE",
    "LOCAL_SELECT_POOLED",
    "banded_summary",
    "curator_diagnostics",
    "finish_guarantee",
    "global_accuracy",
    "joint_dp",
    "local_selection_summary",
    "noise_notes",
    "released_dim",
    "result_dict",
    "result_parts",
    "scaling_note",
]

#: The notion of the billboard's guarantee once every client's model reads its own data only.
JOINT_DP_NOTION = "JDP (billboard)"

JOINT_DP_NOTE = "joint-model DP becomes joint DP once each client fine-tunes on its own data"

#: The per-round curator quantities of ``curator_diagnostics`` (``diagnostics=True`` only):
#: JSON key -> key of the engine's round record.
CURATOR_DIAGNOSTICS = {
    "train_loss_per_round": "train_loss",
    "signal_norm_per_round": "signal_norm",
    "noise_norm_per_round": "noise_norm",
    "full_signal_norm_per_round": "full_signal_norm",
}

#: Not covered: the curator's diagnostics read un-noised client updates.
DIAGNOSTICS_NOT_COVERED = (
    "curator_diagnostics: per-round training loss and norms of the un-noised mean and of "
    "the noise, computed by the curator from un-noised client updates (--diagnostics)"
)

#: Not covered: local training's grid chosen once for all clients on pooled validation data.
LOCAL_SELECT_POOLED = (
    "local_selection: one (epochs, lr) for every client chosen on the pooled "
    "validation accuracy of all clients (--local-select pooled)"
)

LOCAL_SELECT_CLIENT_NOTE = (
    "every client trained alone on its own data and chose (epochs, lr) on its own "
    "validation split: nothing depends on another client"
)

#: Not covered: fine-tuning's grid chosen once for all clients on pooled validation data.
FINETUNE_SELECT_POOLED = (
    "finetune_selection: one (epochs, lr) for every client chosen on the pooled "
    "validation accuracy of all clients (--finetune-select pooled)"
)


def noise_notes(noise_source: str) -> tuple[str, ...]:
    """The guarantee's note on where the noise came from (seeded noise protects nobody)."""
    if noise_source == "seeded":
        return (
            "seeded noise (--reproducible-noise): anyone who knows the seed can regenerate and "
            "subtract it; for research simulation only, it protects nobody",
        )
    return ()


def scaling_note(scaling: str) -> tuple[str, ...]:
    """The guarantee's note on the clients' feature scaling (none when features are as given)."""
    if scaling == "none":
        return ()
    return (
        f"features: {scaling}: each client's mean and standard deviation come from its "
        "own training rows (never pooled over clients), part of its local computation",
    )


def global_accuracy(result: Any, key: str = "accuracy") -> float | None:
    """The released global model's test ``key`` (None where the run has no global model)."""
    acc = result.accuracies.get("test", {}).get("global")
    return None if not isinstance(acc, dict) else float(acc[key])


def released_dim(result: Any) -> int | None:
    """The coordinates of one release, as the engine recorded them (None: nothing released)."""
    return next((h["released_dim"] for h in result.history if "released_dim" in h), None)


def curator_diagnostics(result: Any) -> dict[str, list[Any]]:
    """The curator's per-round diagnostics: they read un-noised client updates (the signal norm is
    the norm of the un-noised mean; the noise norm, with the release, partly denoises it)."""
    out = {key: [h.get(rec) for h in result.history] for key, rec in CURATOR_DIAGNOSTICS.items()}
    if result.config.subspace_dim is None:
        del out["full_signal_norm_per_round"]
    return out


def local_selection_summary(selection: dict[str, Any]) -> dict[str, Any]:
    """The JSON ``local_selection`` of a training-alone run: the grid (and its ``solver``), how
    many clients chose each setting, every setting's validation and test accuracy, and the
    early stopping's ``patience`` where it stopped runs."""
    return {
        "grid": selection["grid"],
        "solver": selection.get("solver", "sgd"),
        "select": selection["select"],
        "clients_per_choice": np.bincount(
            selection["choice"], minlength=len(selection["grid"])
        ).tolist(),
        "grid_val_accuracy": selection["grid_val_accuracy"],
        "grid_test_accuracy": selection["grid_test_accuracy"],
        **({"patience": selection["patience"]} if selection.get("patience") else {}),
    }


def joint_dp(guarantee: PrivacyGuarantee, notion: str) -> tuple[PrivacyGuarantee, tuple[str, ...]]:
    """The guarantee once each client fine-tunes on its own data, and the note saying so: a
    private joint-model guarantee (``notion``, the method's) becomes joint DP; any other is kept."""
    if notion != JOINT_DP_NOTION and guarantee.is_private:
        return replace(guarantee, notion=JOINT_DP_NOTION), (JOINT_DP_NOTE,)
    return guarantee, ()


def finish_guarantee(
    out: dict[str, Any],
    guarantee: PrivacyGuarantee,
    notes: Sequence[str] = (),
    not_covered: Sequence[str] = (),
) -> PrivacyGuarantee:
    """Add ``notes`` and the ``not_covered`` reasons to ``guarantee``, and write ``guarantee``,
    ``covered`` and ``summary`` into ``out`` (the last keys of a result); returns the guarantee."""
    guarantee = replace(guarantee, notes=guarantee.notes + tuple(notes)).with_not_covered(
        *not_covered
    )
    out["guarantee"] = guarantee.to_dict()
    out["covered"] = guarantee.covered
    out["summary"] = guarantee.describe()
    return guarantee


def result_dict(
    result: Any,
    *,
    method: str,
    model: str,
    data: str,
    sigma: float,
    q: int,
    m: int,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """The JSON result of a trained run, its guarantee included (with ``notes`` added)."""
    out, guarantee = result_parts(
        result, method=method, model=model, data=data, sigma=sigma, q=q, m=m
    )
    finish_guarantee(out, guarantee, notes)
    return out


def result_parts(
    result: Any, *, method: str, model: str, data: str, sigma: float, q: int, m: int
) -> tuple[dict[str, Any], PrivacyGuarantee]:
    """The run's JSON result and its guarantee (the caller adds notes and what is not covered,
    then writes ``guarantee``, ``covered`` and ``summary``: :func:`finish_guarantee`).

    ``result`` is the trained run (:class:`~privmtl.federated.config.TrainResult`), ``sigma`` the
    noise of the released mean, ``q`` the clients per round and ``m`` the population's size.
    """
    cfg = result.config
    declared = method_class(method)
    released = declared.communicates
    z = noise_multiplier(sigma, q, cfg.clip) if cfg.clip else None
    private = sigma > 0 and released
    noise_source = result.noise_source if private else "none"
    guarantee = _run_guarantee(result, declared, private=private, rate=q / m, z=z)
    per_round = [h.get("epsilon") for h in result.history]
    out = {
        "method": method,
        "data": data,
        "model": model,
        "epsilon": guarantee.epsilon,
        "delta": guarantee.delta,
        "accountant": guarantee.accountant,
        "sampling": guarantee.sampling,
        "relation": guarantee.relation,
        "noise_std": sigma,
        "noise_multiplier": z,
        "clip": cfg.clip,
        "clients_per_round": q,
        "num_clients": m,
        "rounds": cfg.rounds,
        "lam": cfg.lam,
        "lr": cfg.lr,
        "seed": cfg.seed,
        "batched": cfg.batched,
        "server_update": cfg.server_update,
        "server_optimizer": cfg.server_optimizer,
        "personal_init": cfg.personal_init,
        "shared_params": None if cfg.shared_params is None else list(cfg.shared_params),
        "subspace_dim": cfg.subspace_dim,
        "adaptive_clip_quantile": cfg.adaptive_clip_quantile,
        "adaptive_clip_lr": cfg.adaptive_clip_lr,
        "adaptive_clip_noise": cfg.count_noise_std_for(q),
        "clip_per_round": [h.get("clip") for h in result.history],
        "test_accuracy": float(result.test_accuracy),
        "mean_client_accuracy": float(result.mean_client_accuracy),
        "val_accuracy": float(result.val_accuracy),
        # the released global model (the billboard) evaluated on every client, where there is one
        "global_test_accuracy": global_accuracy(result),
        # the same model scored on every client's own test data, averaged over the clients
        # (None where nothing is released: the methods that train every client alone)
        "global_mean_client_accuracy": (
            global_accuracy(result, "mean_client_accuracy") if released else None
        ),
        "seconds": float(result.seconds),
        "seconds_per_round": float(result.seconds_per_round),
        "epsilon_per_round": [None if e is None or not math.isfinite(e) else e for e in per_round],
        "released_dim": released_dim(result),
        "noise_source": noise_source,
        "stopped_on_budget": bool(result.stopped_on_budget),
        "rounds_run": len(result.history),
    }
    if any("val_accuracy" in h for h in result.history):  # evaluation rounds (eval_every)
        out["val_accuracy_per_round"] = [h.get("val_accuracy") for h in result.history]
    if cfg.sampling == "cyclic":
        out["groups"] = cfg.groups
    if cfg.noise_mechanism != "independent":
        out["noise_mechanism"] = cfg.noise_mechanism
        out["banded"] = banded_summary(result.ledger, guarantee)
    return out, guarantee


def _run_guarantee(
    result: Any, declared: Any, *, private: bool, rate: float, z: float | None
) -> PrivacyGuarantee:
    """The guarantee of a trained run: ε = 0 when nothing is released (``declared``, the method's
    class, does not communicate), non-private without noise, else the ledger's (ε, δ) with the
    details of its releases (``rate``: the clients per round over the population; ``z``: the
    noise multiplier)."""
    cfg = result.config
    eps = float(result.epsilon)
    released = declared.communicates
    if not released:
        guarantee = PrivacyGuarantee(
            epsilon=0.0,
            delta=0.0,
            relation=cfg.relation,
            sampling="none",
            accountant="none",
            notes=("local training: nothing leaves a client, epsilon = 0 towards the others",),
            noise_source="none",
        )
    elif not private:
        guarantee = replace(
            PrivacyGuarantee.non_private(
                notion=JOINT_DP_NOTION, relation=cfg.relation, sampling=cfg.sampling
            ),
            noise_source="none",
        )
    else:
        details: dict[str, Any] = {"noise_multiplier": z, "rounds": cfg.rounds, "rate": rate}
        notes = noise_notes(result.noise_source)
        if cfg.noise_mechanism == "banded":
            notes += (
                "banded matrix-factorization noise: the whole run is one Gaussian mechanism, "
                "charged in full before its first round (details.run_noise_multiplier; "
                "noise_multiplier is sigma*q/clip of the strategy's z)",
            )
            run = banded_summary(result.ledger, None)
            if run is not None:
                details["run_noise_multiplier"] = run["run_noise_multiplier"]
        if result.ledger is not None:
            # ε composes every release the ledger holds, which is not always one per round run;
            # an end-of-run vote is a release of its own, counted apart
            votes = sum(r.get("mechanism") == VOTE_MECHANISM for r in result.ledger.records)
            releases = len(result.ledger.records) - votes
            details.update(releases=releases, rounds_run=len(result.history))
            if votes:
                details.update(votes=votes)
            if releases != len(result.history):
                notes += (
                    f"the ledger holds {releases} releases for {len(result.history)} rounds run, "
                    "and epsilon composes all of them (a run resumed with secure noise repeats "
                    "the releases made after its checkpoint with fresh noise, each charged; a "
                    "continued Flower work directory also holds its earlier runs' releases)",
                )
        guarantee = PrivacyGuarantee(
            epsilon=eps,
            delta=float(result.delta),
            relation=cfg.relation,
            sampling=cfg.sampling,
            accountant=cfg.accountant,
            notion=declared.notion,
            details=details,
            noise_source=result.noise_source,
            notes=notes,
        )
    return guarantee


def banded_summary(ledger: Any, guarantee: PrivacyGuarantee | None) -> dict[str, Any] | None:
    """What a banded run's result states of its noise: the strategy's ``bands``, the
    participation ``groups``, the ``sensitivity`` of the released means, the run's noise
    multiplier and σ of :math:`z`, read from the run's one ledger event, with the guarantee's
    ε and δ when one is given (None without a ledger: not private)."""
    runs = (
        []
        if ledger is None
        else [r for r in ledger.records if r.get("mechanism") == BANDED_RUN_MECHANISM]
    )
    if not runs:
        return None
    params = runs[-1]["params"]
    return {
        "mechanism": "banded",
        "bands": params["bands"],
        "groups": params["groups"],
        "rounds": params["rounds"],
        "sensitivity": params["sensitivity"],
        "noise_std": params["noise_std"],
        "run_noise_multiplier": params["run_noise_multiplier"],
        **({} if guarantee is None else {"epsilon": guarantee.epsilon, "delta": guarantee.delta}),
    }
