"""One PMTL-family federated run (data → model → private training → optional fine-tuning → metrics).

This is what ``privmtl pmtl`` and ``privmtl pmtl-sweep`` call. Privacy is client-level: the server's
released sequence (noisy mean of clipped updates, the billboard) is accounted by the ledger of the
training engine with the sampler it actually used; personalized models and local fine-tuning are
post-processing and keep the guarantee (billboard privacy ⇒ joint DP).

Every default output is covered by the reported guarantee: a client's models and numbers depend
on the other clients only through the recorded releases. Choices are made by each client on its
own validation split (``finetune="auto"``, ``local_select="client"``, ``finetune_select="client"``).
The opt-ins that break this — a choice on pooled validation data (``local_select="pooled"``,
``finetune_select="pooled"``) and the curator's diagnostics computed from un-noised updates
(``diagnostics=True``) — are listed in the guarantee's ``not_covered`` and make ``covered`` false.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privmtl._validation import check_choice
from privmtl.data.federated import FederatedDataset
from privmtl.data.federated_table import DEFAULT_CLIENT_SCALING
from privmtl.data.registry import (
    absolute_data_path,
    dataset_names,
    default_femnist_dir,
    load_federated,
)
from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.federated.config import resolve_config
from privmtl.federated.finetune import FINETUNE_METHODS
from privmtl.federated.finetune_selection import SELECT_MODES
from privmtl.federated.finish import (
    AUTO_CANDIDATES,
    AUTO_CLEAR_SIGNAL,
    AUTO_FINETUNE_EPOCHS,
    AUTO_FINETUNE_LRS,
    AUTO_NOTE,
    AUTO_ORDERS,
    auto_info,
    auto_plan,
    final_models_keys,
    finish_clients,
    stack_trained,
)
from privmtl.federated.local import LOCAL_SELECT
from privmtl.federated.methods import Method, get_method, method_class
from privmtl.federated.methods.loading import resolve_method
from privmtl.federated.models import DEFAULT_MODEL, MODELS, make_model
from privmtl.federated.spec import (
    DEFAULT_CLIENTS_PER_ROUND,
    DEFAULT_FEDPROX_MU,
    DEFAULT_LAM_NONPRIVATE,
    DEFAULT_LAM_PRIVATE,
    RUN_METHODS,
    SPEC,
    RunSpec,
    default_clients_per_round,
    default_lam,
    resolve_defaults,
    resolve_delta,
    train_config,
)
from privmtl.locking import holding_directories
from privmtl.privacy import PrivacyGuarantee
from privmtl.privacy.calibration import noise_multiplier

__all__ = [
    "AUTO_CANDIDATES",
    "AUTO_CLEAR_SIGNAL",
    "AUTO_FINETUNE_EPOCHS",
    "AUTO_FINETUNE_LRS",
    "AUTO_ORDERS",
    "DEFAULT_CLIENTS_PER_ROUND",
    "DEFAULT_FEDPROX_MU",
    "DEFAULT_LAM_NONPRIVATE",
    "DEFAULT_LAM_PRIVATE",
    "FINETUNE_STARTS",
    "FL_DATASETS",
    "FL_METHODS",
    "FL_MODELS",
    "NO_RELEASE_METHODS",
    "default_clients_per_round",
    "default_femnist_dir",
    "default_lam",
    "evaluate_saved",
    "load_federated",
    "make_model",
    "run_pmtl",
]

FL_DATASETS = dataset_names("pmtl")
FL_MODELS = MODELS
FL_METHODS = RUN_METHODS
NO_RELEASE_METHODS = tuple(n for n in RUN_METHODS if not method_class(n).communicates)
"""The methods that train every client alone: nothing is released, there is no shared model."""
FINETUNE_STARTS = ("auto", "billboard")
"""Where fine-tuning starts: the personalized models when the method has them, else the released
global model (auto), or the released global model (billboard)."""


def _absolute_data_path(data: str, data_path: str | Path | None) -> str | None:
    """The data's absolute path, so that saved models can be evaluated from anywhere."""
    return absolute_data_path("pmtl", data, data_path)


@holding_directories("checkpoint_dir", "save_models")
def run_pmtl(
    *,
    data: str = "synthetic",
    data_path: str | Path | None = None,
    client_column: str | None = None,
    label_column: str | None = None,
    feature_columns: Sequence[str] | None = None,
    model: str = DEFAULT_MODEL,
    method: str | type[Method] | Method = SPEC.method,
    epsilon: float | None = None,
    noise_std: float | None = None,
    clip: float = SPEC.clip,
    rounds: int = SPEC.rounds,
    clients_per_round: int | None = None,
    local_steps: int | None = None,
    local_epochs: int | None = None,
    lam: float | None = None,
    lr: float = SPEC.lr,
    batch_size: int = SPEC.batch_size,
    finetune: str = SPEC.finetune,
    finetune_epochs: int | Sequence[int] = 1,
    extra_finetunes: tuple[str, ...] | list[str] = (),
    finetune_lrs: Sequence[float] | None = None,
    finetune_lams: Sequence[float] | None = None,
    finetune_start: str = "auto",
    finetune_select: str = "client",
    seed: int = SPEC.seed,
    sequential: bool = False,
    sampling: str = SPEC.sampling,
    accountant: str = SPEC.accountant,
    relation: str = SPEC.relation,
    delta: float | str | None = SPEC.delta,
    server_update: str = SPEC.server_update,
    show_progress: bool = True,
    dataset: FederatedDataset | None = None,
    threads: int = 2,
    noise_source: str = SPEC.noise_source,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int = 1,
    resume: bool = False,
    budget_epsilon: float | None = None,
    save_models: str | Path | None = None,
    num_clients: int | None = None,
    server_optimizer: str = SPEC.server_optimizer,
    server_lr: float = SPEC.server_lr,
    server_momentum: float = SPEC.server_momentum,
    shared_params: Sequence[str] | None = None,
    head_epochs: int = SPEC.head_epochs,
    personal_init: str = SPEC.personal_init,
    subspace_dim: int | None = None,
    adaptive_clip_quantile: float | None = None,
    adaptive_clip_lr: float = SPEC.adaptive_clip_lr,
    adaptive_clip_noise: float | None = None,
    local_select: str = "client",
    diagnostics: bool = False,
    scaling: str = DEFAULT_CLIENT_SCALING,
) -> dict[str, Any]:
    """Run one federated method and return a JSON-ready result dictionary (see the CLI contract).

    The algorithm and privacy defaults are the run spec's (:data:`~privmtl.federated.spec.SPEC`,
    shared with ``privmtl pmtl``, the sweep and Flower); the settings are checked once by
    :class:`~privmtl.federated.spec.RunSpec`, the data-dependent defaults filled in by
    :func:`~privmtl.federated.spec.resolve_defaults`, and the result reports the resolved spec
    under ``config`` (``personal_init`` as the trainer resolved it): passed back to ``run_pmtl``,
    it runs the same settings. They differ from
    :class:`~privmtl.federated.config.TrainConfig`'s where the benchmarks found better behaviour: ``server_update="ditto"`` (the billboard follows FedAvg's
    and the personalized models are pulled towards it; ``"offset"`` is the authors' code,
    ``"delta"`` Algorithm 1 as printed) and ``finetune="auto"`` (:data:`AUTO_FINETUNE_EPOCHS`:
    every client chooses on its own validation split between its trained model, the billboard
    fine-tuned on its data and its own local training).

    ``finetune`` replaces the reported accuracies by those after local fine-tuning (the CLI's
    ``--finetune``); ``extra_finetunes`` additionally scores each listed variant on the same trained
    run and stores them under ``finetune_results[name]`` (benchmarks compare variants this way).
    ``finetune_lrs`` / ``finetune_lams`` turn fine-tuning into a per-client choice over that grid
    of step sizes and penalty weights (default: ``[lr]`` / ``[lam]``), each client choosing on its
    own validation split (:func:`~privmtl.federated.finetune_selection.finetune_select`; the
    privacy guarantee is unchanged).
    ``finetune_start="billboard"`` (vanilla only) starts every client from the released global
    model instead of its personalized one (``"auto"``: personalized when the method has
    personalized models); it runs :func:`~privmtl.federated.local.train_local` from the billboard,
    so ``finetune_epochs`` may be a grid, each client choosing on its own validation split;
    ``finetune_select="pooled"`` (opt-in, not covered by the guarantee) picks one ``(epochs, lr)``
    for all clients on the pooled validation accuracy.

    ``method="fedrep"`` (:mod:`~privmtl.federated.fedrep`, DP-FedRep) shares a representation
    only (``shared_params``; default every parameter but the last layer's): each sampled client
    trains its own head for ``head_epochs`` epochs on the released representation, then the
    representation, and sends the representation's change; at the end every client trains its
    head on the last release. The result reports ``representation``, ``head`` and
    ``head_epochs``; ``released_dim`` is the representation's size.

    ``method="local-all"`` is the training-alone baseline of
    :func:`~privmtl.federated.local.train_local`: every client (not only sampled ones) trains on its
    own data over a grid of epochs and step sizes, each client choosing on its own validation split
    (``local_select="client"``; ``"pooled"``: one setting for all on the pooled validation
    accuracy, opt-in and not covered by the guarantee); ``rounds``, ``clients_per_round``, ``lr``
    and the privacy options do not apply (ε = 0 towards the others).

    ``delta``: None (default) is :func:`~privmtl.privacy.delta.user_data_delta`,
    min(1e-5, 1/(100 m)) on every data set (:func:`~privmtl.federated.spec.resolve_delta`);
    ``"paper"`` the PMTL paper's 1/m (reproductions); a float is checked (δ ≥ 1/m warns).
    ``diagnostics=True`` adds ``curator_diagnostics`` (per-round training loss and the norms of
    the un-noised mean, of the noise, and with ``subspace_dim`` of the full un-noised mean): they
    read un-noised client updates, so the result is labelled not covered. Without it the result
    has none of them.

    ``noise_source`` (``"secure"``: OS entropy, the default; ``"seeded"``: reproducible from
    ``seed``, research simulation only), ``checkpoint_dir``/``checkpoint_every``/``resume`` and
    ``budget_epsilon`` are passed to :class:`~privmtl.federated.protocol.Trainer`; the result
    reports ``noise_source`` and ``stopped_on_budget``. ``save_models`` writes the trained models
    (:func:`privmtl.federated.saved.save_models`). ``num_clients`` sets the synthetic population's
    size; ``server_optimizer``/``server_lr``/``server_momentum``, ``shared_params`` and
    ``personal_init``, ``subspace_dim`` and ``adaptive_clip_*`` are the
    :class:`~privmtl.federated.config.TrainConfig` options of the same names (post-processing,
    partial sharing and random-subspace releases leave the guarantee unchanged; adaptive clipping's
    count is accounted with the mean, so with ``epsilon`` the mean gets a little more noise).

    ``clients_per_round`` defaults to :func:`default_clients_per_round` (``min(20, m)``); an
    explicit value above ``m`` is an error. ``scaling`` applies to ``data="table"``
    (:func:`load_federated`); the result reports what was done under ``"scaling"``. A user's
    ``model`` factory is loaded before the data and checked by a forward pass before training.

    ``method`` is a method name, or your own method: a
    :class:`~privmtl.federated.methods.base.Method` subclass or instance, or ``"PATH.py:NAME"`` /
    ``"MODULE:NAME"`` naming one (loaded as a ``model`` factory is; the result's
    ``method_source`` records the file and its SHA-256). It runs with the same release,
    accounting, ledger and checkpointing as privmtl's methods.
    """
    own_method, method_source = resolve_method(method)
    method = own_method if isinstance(own_method, str) else own_method.name
    spec = RunSpec(
        method=method,
        server_update=server_update,
        clip=clip,
        clients_per_round=clients_per_round,
        lam=lam,
        personal_init=personal_init,
        lr=lr,
        batch_size=batch_size,
        rounds=rounds,
        local_steps=local_steps,
        local_epochs=local_epochs,
        epsilon=epsilon,
        noise_std=noise_std,
        delta=delta,
        sampling=sampling,
        accountant=accountant,
        relation=relation,
        finetune=finetune,
        noise_source=noise_source,
        seed=seed,
        server_optimizer=server_optimizer,
        server_lr=server_lr,
        server_momentum=server_momentum,
        shared_params=None if shared_params is None else tuple(shared_params),
        head_epochs=head_epochs,
        subspace_dim=subspace_dim,
        adaptive_clip_quantile=adaptive_clip_quantile,
        adaptive_clip_lr=adaptive_clip_lr,
        adaptive_clip_noise=adaptive_clip_noise,
    )
    check_choice("finetune_start", finetune_start, FINETUNE_STARTS)
    check_choice("finetune_select", finetune_select, SELECT_MODES)
    check_choice("local_select", local_select, LOCAL_SELECT)
    if not isinstance(diagnostics, bool):
        raise InvalidParameterError(
            f"The 'diagnostics' parameter must be a bool; got {diagnostics!r}."
        )
    if finetune == "auto":
        fixed = {
            "finetune_epochs": (finetune_epochs, 1),
            "finetune_lrs": (finetune_lrs, None),
            "finetune_lams": (finetune_lams, None),
            "finetune_start": (finetune_start, "auto"),
            "finetune_select": (finetune_select, "client"),
        }
        for name, (value, default) in fixed.items():
            if value != default:
                raise InvalidParameterError(
                    f"finetune='auto' chooses its own grid and start; the '{name}' parameter "
                    f"needs an explicit finetune method (e.g. 'vanilla'); got {name}={value!r}."
                )
    ft_epochs = _epochs_grid(finetune_epochs)
    if finetune_start != "billboard" and (len(ft_epochs) > 1 or finetune_select != "client"):
        raise InvalidParameterError(
            "A grid of 'finetune_epochs' and finetune_select='pooled' need "
            f"finetune_start='billboard'; got finetune_start={finetune_start!r}, "
            f"finetune_epochs={finetune_epochs!r}, finetune_select={finetune_select!r}."
        )
    if finetune_start == "billboard" and (finetune not in ("none", "vanilla") or extra_finetunes):
        raise InvalidParameterError(
            "finetune_start='billboard' supports finetune='vanilla' only (fine-tuning from the "
            f"billboard, no penalty); got finetune={finetune!r}, "
            f"extra_finetunes={list(extra_finetunes)!r}."
        )
    for name in extra_finetunes:
        check_choice("extra_finetunes", name, FINETUNE_METHODS)
    seed, epsilon, noise_std, lr = spec.seed, spec.epsilon, spec.noise_std, spec.lr
    from privmtl.federated.user_model import is_factory_spec, load_factory

    user_factory = load_factory(model) if is_factory_spec(model) else None
    t_load = time.perf_counter()
    table: dict[str, Any] = {
        "client_column": client_column,
        "label_column": label_column,
        "feature_columns": None if feature_columns is None else list(feature_columns),
    }
    ds = (
        dataset
        if dataset is not None
        else load_federated(
            data,
            data_path=data_path,
            seed=seed,
            **table,
            num_clients=num_clients,
            scaling=scaling,
        )
    )
    load_seconds = time.perf_counter() - t_load
    m = ds.n_clients
    resolved = resolve_defaults(spec, m)
    q, lam = int(resolved.clients_per_round or m), float(resolved.lam or 0.0)
    notes: list[str] = list(resolve_delta(spec.delta, m)[1])
    not_covered: list[str] = []
    net = make_model(model, ds, seed, factory=user_factory)
    config = train_config(resolved, batched=not sequential, progress=show_progress, threads=threads)
    if get_method(own_method, config).communicates:  # the target ε becomes the release's σ, once
        config = resolve_config(config, m, method=own_method)[0]
    sigma = config.noise_std
    run: dict[str, Any] = {
        "checkpoint_dir": checkpoint_dir,
        "checkpoint_every": checkpoint_every,
        "resume": resume,
        "budget_epsilon": budget_epsilon,
        "on_budget": "stop",
    }
    runner = get_method(own_method, config)  # bound to the calibrated noise
    if runner.models is not None and model not in runner.models:
        raise InvalidParameterError(
            f"The 'method' parameter {method!r} supports --model {', '.join(runner.models)} "
            f"only; got model={model!r}."
        )
    options = {"local_select": local_select}
    result = runner.fit(ds, net, **{k: options[k] for k in runner.fit_options}, **run)
    if runner.every_client:  # nothing released: no noise, every client trains
        sigma, q = 0.0, m
    out, guarantee = _result_parts(
        result, method=method, model=model, data=data, sigma=sigma, q=q, m=m
    )
    out["data_seconds"] = load_seconds
    out.update({k: result.extra[k] for k in runner.result_keys if k != "local_selection"})
    if method_source is not None:
        out["method_source"] = method_source
    # the resolved settings (personal_init as the trainer resolved it), re-runnable as they are
    out["config"] = resolved.replace(personal_init=result.config.personal_init).to_dict()
    out["clients_per_round_default"] = clients_per_round is None  # then min(20, m)
    out["scaling"] = ds.scaling
    if ds.scaling != "none":
        notes.append(
            f"features: {ds.scaling}: each client's mean and standard deviation come from its "
            "own training rows (never pooled over clients), part of its local computation"
        )
    if diagnostics:
        out["curator_diagnostics"] = _curator_diagnostics(result)
        not_covered.append(
            "curator_diagnostics: per-round training loss and norms of the un-noised mean and of "
            "the noise, computed by the curator from un-noised client updates (--diagnostics)"
        )
    if "local_selection" in runner.result_keys:
        sel = result.extra["local_selection"]
        out["local_selection"] = {
            "grid": sel["grid"],
            "select": sel["select"],
            "clients_per_choice": np.bincount(sel["choice"], minlength=len(sel["grid"])).tolist(),
            "grid_val_accuracy": sel["grid_val_accuracy"],
            "grid_test_accuracy": sel["grid_test_accuracy"],
        }
        if local_select == "pooled":
            not_covered.append(
                "local_selection: one (epochs, lr) for every client chosen on the pooled "
                "validation accuracy of all clients (--local-select pooled)"
            )
        else:
            notes.append(
                "every client trained alone on its own data and chose (epochs, lr) on its own "
                "validation split: nothing depends on another client"
            )
    if checkpoint_dir is not None:
        out["checkpoint_dir"] = str(checkpoint_dir)
    grid = None
    if finetune_lrs is not None or finetune_lams is not None:
        grid = (
            [float(v) for v in (finetune_lrs if finetune_lrs is not None else [lr])],
            [float(v) for v in (finetune_lams if finetune_lams is not None else [lam])],
        )
    if extra_finetunes:
        # Several fine-tuning variants of the SAME trained run (post-processing, no privacy cost):
        # cheaper and a fairer comparison than one training run per variant.
        out["finetune_results"] = {
            name: _finetune(result, ds, net, name, ft_epochs[0], lr, batch_size, lam, seed, grid)
            for name in extra_finetunes
        }
        for res in out["finetune_results"].values():
            res.pop("_params")
    tuned = None
    if finetune == "auto" and not runner.every_client:
        out.update(_finetune_auto(result, ds, net, out, batch_size, seed))
        tuned = out.pop("_params")
        notes.append(AUTO_NOTE)
        if runner.notion != "JDP (billboard)" and guarantee.is_private:
            guarantee = replace(guarantee, notion="JDP (billboard)")
            notes.append(
                "joint-model DP becomes joint DP once each client fine-tunes on its own data"
            )
    elif finetune == "auto":
        out["finetune"] = "auto"
        out["finetune_auto"] = {
            "select": "client",
            "rule": "local-all: every client's model is already its own local training",
            "clients_per_candidate": {"trained": m},
        }
    elif finetune != "none":
        out.update(
            _finetune_from_billboard(
                result, ds, net, ft_epochs, grid[0] if grid else [lr], batch_size, seed,
                finetune_select,
            )
            if finetune_start == "billboard"
            else _finetune(
                result, ds, net, finetune, ft_epochs[0], lr, batch_size, lam, seed, grid
            )
        )  # fmt: skip
        tuned = out.pop("_params")
        if finetune_start == "billboard" and finetune_select == "pooled":
            not_covered.append(
                "finetune_selection: one (epochs, lr) for every client chosen on the pooled "
                "validation accuracy of all clients (--finetune-select pooled)"
            )
        if runner.notion != "JDP (billboard)" and guarantee.is_private:
            # Each client's fine-tuned model reads its own data: what remains is joint DP.
            guarantee = replace(guarantee, notion="JDP (billboard)")
            notes.append(
                "joint-model DP becomes joint DP once each client fine-tunes on its own data"
            )
    out.update(
        final_models_keys(
            str(out.get("finetune") or "none"),
            m,
            auto=out.get("finetune_auto"),
            from_billboard=finetune_start == "billboard",
            personalized=result.primary == "personalized",
        )
    )
    guarantee = replace(guarantee, notes=guarantee.notes + tuple(notes)).with_not_covered(
        *not_covered
    )
    out["guarantee"] = guarantee.to_dict()
    out["covered"] = guarantee.covered
    out["summary"] = guarantee.describe()
    if save_models is not None:
        from privmtl.federated.saved import save_models as _save

        out["models_dir"] = str(
            _save(
                save_models,
                result,
                out,
                model=model,
                dataset=ds,
                data={
                    "data": data,
                    "data_path": _absolute_data_path(data, data_path),
                    **(table if data == "table" else {}),
                    **({"scaling": scaling} if data == "table" else {}),
                    "num_clients": num_clients,
                },
                personalized=tuned,
                factory=None if user_factory is None else user_factory.record(),
            )
        )
    return out


def evaluate_saved(
    models_dir: str | Path,
    *,
    data: str | None = None,
    data_path: str | Path | None = None,
    seed: int | None = None,
    client_column: str | None = None,
    label_column: str | None = None,
    feature_columns: Sequence[str] | None = None,
    scaling: str | None = None,
    model: str | None = None,
    trust_code: bool = False,
) -> dict[str, Any]:
    """Reload models saved by ``run_pmtl(save_models=...)`` and score them on the test split.

    The data set defaults to the one the run used (its name, absolute path, columns, scaling and
    seed, recorded in ``model.json``); the same data and split give exactly the run's
    ``test_accuracy``. A folder this user's privmtl saved (signed, :mod:`privmtl.trust`) is
    followed as it is: its recorded data path, and a user's model rebuilt from the factory source
    recorded in ``model.json`` (:func:`~privmtl.federated.saved.build_model`), so neither the
    working directory nor ``PYTHONPATH`` matters. For a folder someone else wrote, a user's model
    needs ``model`` (the factory named again, checked against the recorded SHA-256) or
    ``trust_code``, and a recorded data path outside the folder needs ``data_path``.
    """
    from privmtl.federated.algorithms import evaluate
    from privmtl.federated.saved import build_model, check_params, load_models
    from privmtl.trust import followed_data_path, is_signed

    meta, glob, pers = load_models(models_dir)
    where = str(Path(models_dir) / "model.json")
    saved = meta.get("data", {})
    sd = int(seed if seed is not None else saved.get("seed") or 0)
    # the model first: code this user did not allow is refused before any data is read
    net, notes = build_model(meta, seed=sd, where=where, trust_code=trust_code, factory=model)
    check_params(glob, net, where=where, key="files.global")
    if pers is not None:
        n_saved = len(meta["client_ids"])
        check_params(pers, net, where=where, key="files.personalized", clients=n_saved)
    name = data if data is not None else saved.get("data")
    path = followed_data_path(
        saved.get("data_path"),
        data_path,
        folder=Path(models_dir),
        signed=is_signed(meta),
        where=where,
    )
    given = {
        "client_column": client_column,
        "label_column": label_column,
        "feature_columns": None if feature_columns is None else list(feature_columns),
    }
    table: dict[str, Any] = {k: v if v is not None else saved.get(k) for k, v in given.items()}
    scale = scaling if scaling is not None else saved.get("scaling", "none")
    if name == "table":
        table["scaling"] = scale
    ds = load_federated(
        str(name), data_path=path, seed=sd, **table, num_clients=saved.get("num_clients")
    )
    if list(ds.client_ids) != list(meta["client_ids"]):
        raise DataFormatError(
            f"The data has other clients than the saved models ({ds.n_clients} vs "
            f"{len(meta['client_ids'])}); pass the --data the run used."
        )
    if (ds.n_features, ds.n_classes) != (meta["model"]["n_features"], meta["model"]["n_classes"]):
        raise DataFormatError(
            f"The data has {ds.n_features} features and {ds.n_classes} classes; the saved models "
            f"{meta['model']['n_features']} and {meta['model']['n_classes']}."
        )
    buffers = {n: b.detach() for n, b in net.named_buffers()}
    xs, ys = ds.split("test")
    personalized = meta["primary"] == "personalized" and pers is not None
    params = pers if personalized else glob
    assert params is not None
    acc = evaluate(net, params, buffers, xs, ys, personalized=personalized)
    guarantee = meta.get("guarantee")
    from privmtl.privacy.ledger import check_saved_ledger

    # a recorded path outside the folder is followed only for a folder this user signed (trust)
    record = meta.get("ledger") if is_signed(meta) else None
    checked = check_saved_ledger(record, guarantee, where=f"the saved models in {models_dir}")
    out = {
        "family": "pmtl",
        "method": meta.get("method"),
        "data": name,
        "data_path": None if path is None else str(path),
        "scaling": ds.scaling,
        "model": meta["model"]["name"],
        "models_dir": str(Path(models_dir).resolve()),
        "primary": meta["primary"],
        "test_accuracy": acc["accuracy"],
        "mean_client_accuracy": acc["mean_client_accuracy"],
        "n_test": acc["n"],
        "noise_source": meta.get("run", {}).get("noise_source"),
        "guarantee": guarantee,
        "covered": None if not isinstance(guarantee, dict) else guarantee.get("covered"),
        "summary": meta.get("summary"),
        "notes": notes,
        "ledger_checked": checked,
    }
    released = meta.get("method") not in NO_RELEASE_METHODS
    if pers is not None or released:
        shared = evaluate(net, glob, buffers, xs, ys, personalized=False)
        out["global_test_accuracy"] = shared["accuracy"]
        if released:
            # the released global model on every client's own test data, averaged over clients
            out["global_mean_client_accuracy"] = shared["mean_client_accuracy"]
            out["shared_params"] = meta.get("config", {}).get("shared_params")
    run = meta.get("run", {})
    for key in ("clients_per_final_model", "end_of_run"):  # recorded at training
        if key in run:
            out[key] = run[key]
    return out


def _result_dict(
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
    out, guarantee = _result_parts(
        result, method=method, model=model, data=data, sigma=sigma, q=q, m=m
    )
    guarantee = replace(guarantee, notes=guarantee.notes + tuple(notes))
    out["guarantee"] = guarantee.to_dict()
    out["covered"] = guarantee.covered
    out["summary"] = guarantee.describe()
    return out


def _result_parts(
    result: Any, *, method: str, model: str, data: str, sigma: float, q: int, m: int
) -> tuple[dict[str, Any], PrivacyGuarantee]:
    """The run's JSON result and its guarantee (the caller adds notes and what is not covered,
    then writes ``guarantee``, ``covered`` and ``summary``)."""
    cfg = result.config
    declared = method_class(method)
    released = declared.communicates
    eps = float(result.epsilon)
    z = noise_multiplier(sigma, q, cfg.clip) if cfg.clip else None
    private = sigma > 0 and released
    noise_source = result.noise_source if private else "none"
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
                notion="JDP (billboard)", relation=cfg.relation, sampling=cfg.sampling
            ),
            noise_source="none",
        )
    else:
        details: dict[str, Any] = {"noise_multiplier": z, "rounds": cfg.rounds, "rate": q / m}
        notes = _noise_notes(result.noise_source)
        if result.ledger is not None:
            # ε composes every release the ledger holds, which is not always one per round run
            releases = len(result.ledger.records)
            details.update(releases=releases, rounds_run=len(result.history))
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
        "global_test_accuracy": _global_accuracy(result),
        # the same model scored on every client's own test data, averaged over the clients
        # (None where nothing is released: the methods that train every client alone)
        "global_mean_client_accuracy": (
            _global_accuracy(result, "mean_client_accuracy") if released else None
        ),
        "seconds": float(result.seconds),
        "seconds_per_round": float(result.seconds_per_round),
        "epsilon_per_round": [None if e is None or not math.isfinite(e) else e for e in per_round],
        "released_dim": next(
            (h["released_dim"] for h in result.history if "released_dim" in h), None
        ),
        "noise_source": noise_source,
        "stopped_on_budget": bool(result.stopped_on_budget),
        "rounds_run": len(result.history),
    }
    return out, guarantee


#: The per-round curator quantities of ``curator_diagnostics`` (``diagnostics=True`` only):
#: JSON key -> key of the engine's round record.
CURATOR_DIAGNOSTICS = {
    "train_loss_per_round": "train_loss",
    "signal_norm_per_round": "signal_norm",
    "noise_norm_per_round": "noise_norm",
    "full_signal_norm_per_round": "full_signal_norm",
}


def _curator_diagnostics(result: Any) -> dict[str, list[Any]]:
    """The curator's per-round diagnostics: they read un-noised client updates (the signal norm is
    the norm of the un-noised mean; the noise norm, with the release, partly denoises it)."""
    out = {key: [h.get(rec) for h in result.history] for key, rec in CURATOR_DIAGNOSTICS.items()}
    if result.config.subspace_dim is None:
        del out["full_signal_norm_per_round"]
    return out


def _noise_notes(noise_source: str) -> tuple[str, ...]:
    if noise_source == "seeded":
        return (
            "seeded noise (--reproducible-noise): anyone who knows the seed can regenerate and "
            "subtract it; for research simulation only, it protects nobody",
        )
    return ()


def _global_accuracy(result: Any, key: str = "accuracy") -> float | None:
    acc = result.accuracies.get("test", {}).get("global")
    return None if not isinstance(acc, dict) else float(acc[key])


def _epochs_grid(epochs: int | Sequence[int]) -> list[int]:
    values = [epochs] if isinstance(epochs, int) else list(epochs)
    if not values or any(isinstance(e, bool) or not isinstance(e, int) or e < 1 for e in values):
        raise InvalidParameterError(
            "The 'finetune_epochs' parameter must be an int >= 1 or a non-empty sequence of "
            f"them; got {epochs!r}."
        )
    return values


def _finetune_from_billboard(
    result: Any,
    ds: FederatedDataset,
    net: torch.nn.Module,
    epochs: Sequence[int],
    lrs: Sequence[float],
    batch_size: int,
    seed: int,
    select: str,
) -> dict[str, Any]:
    """Every client fine-tunes from the billboard: ``train_local`` started at the global model."""
    import copy

    from privmtl.federated.local import train_local

    start = copy.deepcopy(net)
    start.load_state_dict({**start.state_dict(), **result.global_params})
    tuned = train_local(
        ds, start, epochs=epochs, lrs=lrs, batch_size=batch_size, select=select, seed=seed
    )
    sel = tuned.extra["local_selection"]
    test = tuned.accuracies["test"]["personalized"]
    return {
        "finetune_selection": {
            "select": sel["select"],
            "grid": sel["grid"],
            "grid_axes": ["epochs", "lr"],
            "choice_counts": np.bincount(sel["choice"], minlength=len(sel["grid"])).tolist(),
            "grid_test_accuracy": sel["grid_test_accuracy"],
            "note": "every client fine-tuned from the billboard on its own data; "
            + (
                "each client chose (epochs, lr) on its own validation split: no privacy cost"
                if select == "client"
                else "one (epochs, lr) chosen on the pooled validation accuracy of all clients "
                "(not covered by the guarantee)"
            ),
        },
        "finetune": "vanilla",
        "finetune_start": "global",
        "pre_finetune_test_accuracy": float(result.test_accuracy),
        "test_accuracy": float(test["accuracy"]),
        "mean_client_accuracy": float(test["mean_client_accuracy"]),
        "val_accuracy": float(tuned.accuracies["val"]["personalized"]["accuracy"]),
        "finetune_note": "local fine-tuning is post-processing of the billboard: no privacy cost",
        "_params": tuned.personalized_params,
    }


def _finetune_auto(
    result: Any,
    ds: FederatedDataset,
    net: torch.nn.Module,
    out: dict[str, Any],
    batch_size: int,
    seed: int,
) -> dict[str, Any]:
    """``finetune="auto"`` (:data:`AUTO_FINETUNE_EPOCHS`): every client chooses on its own
    validation split among the billboard fine-tuned on its data (where it carries signal), its own
    local training and its trained model (:func:`~privmtl.federated.finish.finish_clients`)."""
    from privmtl.federated.algorithms import evaluate

    sigma, clip, dim = float(out["noise_std"] or 0.0), out["clip"], int(out["released_dim"] or 0)
    rounds = int(out.get("rounds_run") or out["rounds"])
    plan = auto_plan(out["method"], out["shared_params"], sigma, clip, dim, rounds)
    trained = stack_trained(result.personalized_params, result.global_params, ds.n_clients)
    fin = finish_clients(
        "auto", ds, net, trained, result.global_params, batch_size=batch_size, seed=seed,
        lr=float(out["lr"]), lam=float(out["lam"] or 0.0), plan=plan,
    )  # fmt: skip
    assert fin.choice is not None
    buffers = {n: b.detach() for n, b in net.named_buffers()}
    acc = {}
    for split in ("val", "test"):
        xs, ys = ds.split(split)
        acc[split] = evaluate(net, fin.params, buffers, xs, ys, personalized=True)
    counts = np.bincount(fin.choice, minlength=len(plan.names))
    return {
        "finetune": "auto",
        "finetune_auto": auto_info(plan, counts.tolist(), fin.grids),
        "pre_finetune_test_accuracy": out["test_accuracy"],
        "test_accuracy": float(acc["test"]["accuracy"]),
        "mean_client_accuracy": float(acc["test"]["mean_client_accuracy"]),
        "val_accuracy": float(acc["val"]["accuracy"]),
        "_params": fin.params,
    }


def _finetune(
    result: Any,
    ds: FederatedDataset,
    net: torch.nn.Module,
    method: str,
    epochs: int,
    lr: float,
    batch_size: int,
    lam: float,
    seed: int,
    grid: tuple[list[float], list[float]] | None = None,
) -> dict[str, Any]:
    from privmtl.federated.finetune_selection import finetune_select

    start = "personalized" if result.personalized_params is not None else "global"
    extra: dict[str, Any] = {}
    if grid is not None:
        params, acc, sel = finetune_select(
            result,
            ds,
            net,
            method=method,
            lrs=grid[0],
            lams=grid[1],
            start=start,
            epochs=epochs,
            batch_size=batch_size,
            seed=seed,
        )
        extra["finetune_selection"] = {
            "select": sel["select"],
            "grid": sel["grid"],
            "choice_counts": [sel["choice"].count(g) for g in range(len(sel["grid"]))],
            "note": "each client chose (lr, lam) on its own validation split: no privacy cost",
        }
    else:
        from privmtl.federated.algorithms import evaluate

        fin = finish_clients(
            method, ds, net,
            stack_trained(result.personalized_params, result.global_params, ds.n_clients),
            result.global_params, batch_size=batch_size, seed=seed, lr=lr, lam=lam, start=start,
            epochs=epochs,
        )  # fmt: skip
        params = fin.params
        buffers = {n: b.detach() for n, b in net.named_buffers()}
        acc = {
            split: evaluate(net, params, buffers, *ds.split(split), personalized=True)
            for split in ("val", "test")
        }
    return {
        **extra,
        "finetune": method,
        "finetune_start": start,
        "pre_finetune_test_accuracy": float(result.test_accuracy),
        "test_accuracy": float(acc["test"]["accuracy"]),
        "mean_client_accuracy": float(acc["test"]["mean_client_accuracy"]),
        "val_accuracy": float(acc.get("val", {}).get("accuracy", float("nan"))),
        "finetune_note": "local fine-tuning is post-processing of the billboard: no privacy cost",
        "_params": params,
    }
