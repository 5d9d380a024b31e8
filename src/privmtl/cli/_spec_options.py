"""The options of a federated run, declared once from the run spec.

``privmtl pmtl`` and ``privmtl flower local`` take one option per field of
:class:`~privmtl.federated.spec.RunSpec`, built here by :func:`spec_options` from the spec
itself: the flag is the field's name (``--clients-per-round``), the choices and the checked range
come from the spec's constraint table (:attr:`RunSpec._parameter_constraints`), the default shown is
the spec's (:data:`~privmtl.federated.spec.SPEC`) and the help text is written once, in
:data:`SPEC_HELP`. Two fields have flags of their own: ``delta`` (``--delta`` and
``--paper-delta``) and ``noise_source`` (``--reproducible-noise/--secure-noise``).

``--config FILE`` (:func:`config_option`) starts a run from a saved spec: a JSON file holding a
run spec (``RunSpec.to_dict()``), a result of ``privmtl pmtl --json`` / ``privmtl flower local
--json`` (its ``config``) or a ``model.json`` of ``--save-models`` (its ``run.config``). The file's
settings become the options' values, so an option given on the command line wins over the file.
A model factory or a user's method (code) named only by the file is loaded if this user's privmtl
signed the file, or with ``--trust-code`` (:func:`check_config_code`); a data path the file records
is followed when it is signed or the path lies in the file's folder, otherwise ``--data-path`` is
needed. A result of a user's method names the method's file (``method_source``), which a rerun
loads again. The file is read with :func:`privmtl.io.read_json` (one line for any bad file).

:func:`pop_run_spec` turns the parsed options back into the spec's settings by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from numbers import Integral
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from privmtl._validation import Interval, Options, validate_params
from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.federated.methods import RUN_METHODS
from privmtl.federated.spec import SPEC, RunSpec
from privmtl.federated.user_model import is_factory_spec
from privmtl.io import read_json
from privmtl.trust import is_signed, untrusted_code

__all__ = [
    "SPEC_FIELDS",
    "SPEC_HELP",
    "check_config_code",
    "config_option",
    "given_settings",
    "pop_run_spec",
    "spec_option",
    "spec_options",
    "trust_code_option",
]

F = TypeVar("F", bound=Callable[..., Any])

SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(RunSpec))
"""The settings of a run, in the spec's order (the options' order in ``--help``)."""

SPEC_HELP: dict[str, str] = {
    "method": "pmtl, or a baseline: fedavg, fedprox, local (each client trains alone in the "
    "rounds), joint-dp, pp-sgd, or local-all (every client trains alone and chooses its epochs "
    "and lr on its own validation split), fedrep; or your own method: PATH.py:NAME or "
    "MODULE:NAME naming a privmtl.federated.methods.Method subclass (examples/own_method.py; "
    "the result records the file's SHA-256 under method_source).",
    "server_update": "Client message: ditto = the change of a copy of w~ trained on the same "
    "minibatches without the pull (Ditto, Li et al. 2021: FedAvg's billboard; twice the local "
    "work), offset = w_k^new - w~ (the authors' code; stable under partial participation), or "
    "delta = w_k^new - w_k^old (Algorithm 1 as printed; can diverge when q < m, and warns).",
    "clip": "γ: client update clip.",
    "clients_per_round": "Clients sampled per round (default: min(20, m); a larger explicit "
    "value is an error).",
    "lam": "λ (mean-regularization / FedProx μ). Default: chosen on FEMNIST validation "
    "accuracy, 0.001 for private PMTL runs, 1 without noise, 0.01 for FedProx.",
    "personal_init": "pmtl: a client's model starts from the billboard at its first "
    "participation, and clients never sampled are scored with the billboard (what they would "
    "download; post-processing, same guarantee), or from the initial model. auto: the billboard "
    "when the noise norm of one release (sigma * sqrt(released dim)) is at most the clip, else "
    "the initial model; the JSON key personal_init reports the choice.",
    "lr": "Local SGD step size.",
    "batch_size": "Local minibatch size.",
    "rounds": "Communication rounds T.",
    "local_steps": "E local SGD steps (default: 1 local epoch).",
    "local_epochs": "Local epochs per round (instead of --local-steps; default 1).",
    "epsilon": "Target ε: σ is calibrated (absent with --noise-std absent: non-private).",
    "noise_std": "σ on the mean update (instead of --epsilon).",
    "delta": "δ. Default: min(1e-5, 1/(100·m)) on every data set (below 1/m, as DP practice "
    "asks). δ >= 1/m warns; δ >= 1 is refused.",
    "sampling": "Client sampling: Poisson (rate q/m), a fixed-size draw, all (needs q = m; "
    "chosen by itself when q = m), or cyclic groups (--groups).",
    "groups": "b: with --sampling cyclic, client k belongs to the public group k mod b and round "
    "t takes group t mod b (each client in ceil(T/b) rounds, accounted without amplification; "
    "clients per round = ceil(m/b)).",
    "noise_mechanism": "Noise of the rounds: independent (fresh every round) or banded "
    "(banded matrix-factorization noise correlated across rounds; needs --sampling all or "
    "cyclic, and --reproducible-noise to resume; the whole run is one ledger event).",
    "accountant": "Privacy accountant: Rényi DP or privacy loss distributions.",
    "relation": "Neighbouring relation of the guarantee: add or remove one client, or replace one.",
    "finetune": "Local fine-tuning after training. auto: every client (sampled or not) keeps, of "
    "its trained model, the billboard fine-tuned on its own data (3 or 10 epochs at step 0.01 or "
    "0.1; only where the whole model is shared and the noise of the T releases, "
    "sigma*sqrt(k*T), is at most T*clip) and its own local training (--method local-all's "
    "grid), the one with the most correct predictions on its own validation split (ties: the "
    "fine-tuned billboard where sigma*sqrt(k*T) <= T*clip/2, else local training): no pooled "
    "data, no privacy cost. none: no fine-tuning; vanilla/mr/skl/ewc: fine-tuning rules.",
    "noise_source": "Draw the server noise from a generator seeded by --seed (research "
    "simulation only: anyone who knows the seed can subtract it), or securely from OS entropy.",
    "seed": "Seed of the data split, the model's start, the sampling plan and (with "
    "--reproducible-noise) the noise.",
    "server_optimizer": "Apply momentum (DP-FedAvgM) or Adam (DP-FedAdam) to each released "
    "noisy mean (post-processing: no privacy cost).",
    "server_lr": "Server step size.",
    "server_momentum": "Server β (Adam: β1).",
    "shared_params": "Comma-separated parameter names or module prefixes shared through the "
    "billboard (pmtl; fedrep: the representation); the rest stays personal. Default: all "
    "(fedrep: every parameter but the last layer's).",
    "head_epochs": "fedrep: local epochs of a client's head training per round (representation "
    "frozen) and at the end on the last released representation.",
    "subspace_dim": "Release the clipped mean in a public random subspace of this many "
    "coordinates, fresh every round (noise only there; same sensitivity and ε). Default: all "
    "coordinates.",
    "adaptive_clip_quantile": "Adaptive clipping (Andrew et al. 2021): move the clip (starting "
    "at --clip) towards this quantile of the update norms with a noisy count released with the "
    "mean (accounted jointly: with --epsilon the mean gets slightly more noise).",
    "adaptive_clip_lr": "Clip step size η_C.",
    "adaptive_clip_noise": "σ_b: noise std of the count of unclipped updates (default "
    "clients-per-round / 20).",
}
"""The help text of every setting's option (one text per setting, for every command)."""

_PAPER_DELTA_HELP = (
    "δ = 1/m, the PMTL paper's, for reproductions of its experiments (instead of --delta; a "
    "guarantee at δ >= 1/m allows revealing one client's data outright)."
)
_EXCLUSIVE = (("epsilon", "noise_std"), ("local_steps", "local_epochs"))
"""Settings of which a run takes at most one: the command line's replaces the file's."""
_GIVEN = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT, ParameterSource.DEFAULT_MAP)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


class _Checked(click.ParamType):
    """A number checked against a constraint of the spec's table when the option is parsed.

    The message names the option, the parameter, the constraint and the value (``Invalid value
    for '--lr': The 'lr' parameter must be a real number in (0, inf); got 0.0.``).
    """

    def __init__(self, field: str, interval: Interval) -> None:
        self.field, self.interval = field, interval
        self.base = click.INT if interval.kind is Integral else click.FLOAT
        self.name = self.base.name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = self.base.convert(value, param, ctx)
        try:
            return validate_params(_One(self.field, number), {self.field: self.interval})[
                self.field
            ]
        except InvalidParameterError as exc:
            self.fail(str(exc), param, ctx)


class _One:
    """One named value, as :func:`~privmtl._validation.validate_params` reads it."""

    def __init__(self, name: str, value: Any) -> None:
        setattr(self, name, value)


def _constraint(name: str) -> Interval | Options | None:
    """The field's own constraint in the spec's table (None: no number or choice to check)."""
    declared = RunSpec._parameter_constraints.get(name)
    alternatives = declared if isinstance(declared, list) else [declared]
    numbers = [c for c in alternatives if isinstance(c, Interval)]
    if numbers:  # delta: its numbers are --delta, its "paper" is --paper-delta
        return numbers[0]
    choices = [c for c in alternatives if isinstance(c, Options)]
    return choices[0] if choices else None


class _MethodType(click.ParamType):
    """``--method``: one of the run methods, or ``PATH.py:NAME`` / ``MODULE:NAME``."""

    name = "method"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "[" + "|".join(RUN_METHODS) + "|PATH.py:NAME|MODULE:NAME]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value in RUN_METHODS or (isinstance(value, str) and is_factory_spec(value)):
            return value
        self.fail(
            f"{value!r} is not one of {', '.join(RUN_METHODS)}, nor PATH.py:NAME or MODULE:NAME.",
            param,
            ctx,
        )


def spec_option(name: str, *, help: str | None = None, default: bool = True) -> Callable[[F], F]:
    """The option of setting ``name`` of :class:`~privmtl.federated.spec.RunSpec`.

    ``help`` replaces :data:`SPEC_HELP`'s text (a command whose option means something narrower,
    e.g. the sweep's); ``default=False`` declares no default (the command supplies it).
    """
    text = SPEC_HELP[name] if help is None else help
    spec_default = getattr(SPEC, name)
    if name == "noise_source":
        return click.option(
            "--reproducible-noise/--secure-noise",
            "reproducible_noise",
            default=spec_default == "seeded",
            help=text,
        )
    constraint = _constraint(name)
    kind: Any = None
    if name == "method":
        kind = _MethodType()
    elif isinstance(constraint, Options):
        kind = click.Choice([str(v) for v in constraint.values])
    elif isinstance(constraint, Interval):
        kind = _Checked(name, constraint)
    extra: dict[str, Any] = {}
    if default and spec_default is not None:
        extra = {"default": spec_default, "show_default": True}
    return click.option(_flag(name), name, type=kind, help=text, **extra)


def spec_options(*, help: dict[str, str] | None = None) -> Callable[[F], F]:
    """Every setting of :class:`~privmtl.federated.spec.RunSpec` as an option, in the spec's
    order, plus ``--paper-delta`` after ``--delta``; ``help`` adds a command's own sentence to a
    setting's text."""
    more = help or {}
    options: list[Callable[[F], F]] = []
    for name in SPEC_FIELDS:
        text = SPEC_HELP[name] + (" " + more[name] if name in more else "")
        options.append(spec_option(name, help=text))
        if name == "delta":
            options.append(click.option("--paper-delta", is_flag=True, help=_PAPER_DELTA_HELP))

    def decorate(f: F) -> F:
        for opt in reversed(options):
            f = opt(f)
        return f

    return decorate


def pop_run_spec(ctx: click.Context, kw: dict[str, Any]) -> dict[str, Any]:
    """Pop the run spec's options from ``kw``; return the settings by the spec's names.

    ``--paper-delta`` becomes ``delta="paper"``, ``--reproducible-noise`` ``noise_source``,
    ``--shared-params`` a tuple of names. Of two settings a run takes at most one of
    (``epsilon``/``noise_std``, ``local_steps``/``local_epochs``, ``delta``/``--paper-delta``),
    one given on the command line replaces the other's value from ``--config``. The settings are
    checked together (:class:`~privmtl.federated.spec.RunSpec`) before they are returned.
    """

    def source(name: str) -> Any:
        return ctx.get_parameter_source(name)

    out = {name: kw.pop(name) for name in SPEC_FIELDS if name in kw}
    out["noise_source"] = "seeded" if kw.pop("reproducible_noise") else "secure"
    paper = kw.pop("paper_delta")
    for a, b in (*_EXCLUSIVE, ("delta", "paper_delta")):
        for mine, other in ((a, b), (b, a)):
            if (
                source(mine) == ParameterSource.COMMANDLINE
                and source(other) == ParameterSource.DEFAULT_MAP
            ):
                if other == "paper_delta":
                    paper = False
                else:
                    out[other] = None
    if paper:
        if out["delta"] is not None:
            raise click.BadParameter(
                "give --delta or --paper-delta, not both", param_hint="--delta"
            )
        out["delta"] = "paper"
    if out["shared_params"] is not None:
        out["shared_params"] = tuple(
            v.strip() for v in str(out["shared_params"]).split(",") if v.strip()
        )
    RunSpec(**out)  # every setting checked, and the pairs that exclude each other
    return out


def given_settings(ctx: click.Context) -> set[str]:
    """The settings given on the command line or by ``--config`` (not left at the default)."""
    sources = {
        name: ctx.get_parameter_source(name)
        for name in (*SPEC_FIELDS, "reproducible_noise", "paper_delta")
    }
    out = {name for name, s in sources.items() if s in _GIVEN}
    if "reproducible_noise" in out:
        out.add("noise_source")
    if "paper_delta" in out:
        out.add("delta")
    return out - {"reproducible_noise", "paper_delta"}


def _own_method(spec: dict[str, Any], source: Any) -> dict[str, Any]:
    """``spec`` with a user's method named by the file it was loaded from.

    A run of a user's method records the method's registered name in its spec and where it came
    from in ``method_source``; rerunning it loads that file again (``PATH.py:NAME`` /
    ``MODULE:NAME``, :func:`check_config_code` decides whether it may)."""
    if (
        isinstance(source, dict)
        and isinstance(source.get("spec"), str)
        and is_factory_spec(source["spec"])
        and spec.get("method") == source.get("name")
    ):
        return {**spec, "method": source["spec"]}
    return spec


def _document_spec(doc: Any, path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run spec in a JSON document and the data it ran on (``data``, ``model``, ...)."""
    if not isinstance(doc, dict):
        raise click.BadParameter(f"{path}: expected a JSON object", param_hint="--config")
    source = None
    if doc.get("format") == "privmtl-models":  # model.json: "config" is the engine's, "run" ours
        run, data, model = ({} if doc.get(k) is None else doc[k] for k in ("run", "data", "model"))
        for key, value in (("run", run), ("data", data), ("model", model)):
            if not isinstance(value, dict):
                raise click.BadParameter(
                    f"{path}: {key} must be an object; got {value!r}", param_hint="--config"
                )
        source = run.get("method_source")
        context = {
            "data": data.get("data"),
            "data_path": data.get("data_path"),
            "num_clients": data.get("num_clients"),
            "model": model.get("name"),
        }
        spec = run.get("config")
    elif isinstance(doc.get("config"), dict):  # a result of privmtl pmtl / flower local --json
        spec = doc["config"]
        source = doc.get("method_source")
        context = {k: doc.get(k) for k in ("data", "model")}
        if doc.get("data") == "synthetic":
            context["num_clients"] = doc.get("num_clients")
    else:
        spec, context = doc, {}
    if not isinstance(spec, dict):
        raise click.BadParameter(
            f"{path}: no run spec (a RunSpec object, or a result or model.json with 'config')",
            param_hint="--config",
        )
    return _own_method(spec, source), {k: v for k, v in context.items() if v is not None}


def _load_config(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """Read ``--config FILE``: its settings become the options' defaults (the command line wins)."""
    if value is None:
        return None
    try:
        doc = read_json(value)
    except DataFormatError as exc:
        raise click.BadParameter(str(exc).rstrip("."), param_hint="--config") from None
    spec, context = _document_spec(doc, Path(value))
    signed = is_signed(doc)
    ctx.meta[_CONFIG_KEY] = (Path(value), signed)
    recorded = context.get("data_path")
    if recorded is not None and not signed:  # followed only as privmtl evaluate follows it
        if _inside(recorded, Path(value).parent):
            context["data_path"] = str(Path(value).parent / recorded)
        else:
            del context["data_path"]
            ctx.meta[_DATA_PATH_KEY] = recorded
    unknown = sorted(set(spec) - set(SPEC_FIELDS))
    if unknown:
        raise click.BadParameter(
            f"{value}: unknown setting {unknown[0]!r} (settings: {', '.join(SPEC_FIELDS)})",
            param_hint="--config",
        )
    settings = dict(spec)
    if isinstance(settings.get("shared_params"), list):
        settings["shared_params"] = tuple(settings["shared_params"])
    try:
        RunSpec(**settings)
    except (InvalidParameterError, TypeError) as exc:
        raise click.BadParameter(f"{value}: {exc}", param_hint="--config") from None
    defaults: dict[str, Any] = {}
    for name, v in settings.items():
        if name == "noise_source":
            defaults["reproducible_noise"] = v == "seeded"
        elif name == "delta" and v == "paper":
            defaults["paper_delta"] = True
        elif name == "shared_params" and v is not None:
            defaults[name] = ",".join(v)
        elif v is not None:
            defaults[name] = v
    names = {p.name for p in ctx.command.params}
    defaults.update({k: v for k, v in context.items() if k in names})
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


_CONFIG_KEY = "privmtl.config"
"""``ctx.meta`` key: ``(path, signed by this user)`` of the ``--config`` file read."""

_DATA_PATH_KEY = "privmtl.config.data_path"
"""``ctx.meta`` key: the data path an unsigned ``--config`` file records and that is not followed."""


def _inside(recorded: Any, folder: Path) -> bool:
    """Whether the recorded data path lies inside ``folder`` (the file's folder)."""
    try:
        return isinstance(recorded, str) and (folder / recorded).resolve().is_relative_to(
            folder.resolve()
        )
    except (OSError, ValueError):
        return False


def check_config_code(
    ctx: click.Context, model: str, *, trust_code: bool, param: str = "model"
) -> None:
    """Refuse a model factory (or, with ``param="method"``, a user's method) that only a
    ``--config`` file this user did not sign names; and (``param="model"``) a data path such a
    file records outside its folder, unless ``--data-path`` is given.

    A factory is code: it runs when given by ``--model`` on the command line, named by a file
    this user's privmtl signed (a result or ``model.json``, :mod:`privmtl.trust`), or with
    ``--trust-code``; otherwise exit 2 in one line, before anything is imported. A recorded data
    path is followed as :func:`privmtl.trust.followed_data_path` follows an evaluated folder's.
    """
    seen = ctx.meta.get(_CONFIG_KEY)
    refused = ctx.meta.get(_DATA_PATH_KEY)
    if seen is not None and refused is not None and param == "model":
        if ctx.get_parameter_source("data_path") not in (
            ParameterSource.COMMANDLINE,
            ParameterSource.ENVIRONMENT,
        ):
            raise click.BadParameter(
                f"{seen[0]} is not signed by this user: its recorded data path {refused!r} is "
                "not followed; pass --data-path naming the data",
                param_hint="--config",
            )
    if seen is None or trust_code or not is_factory_spec(model):
        return
    path, signed = seen
    if ctx.get_parameter_source(param) == ParameterSource.DEFAULT_MAP and not signed:
        refusal = untrusted_code(str(path), model, kind=param)
        raise click.BadParameter(str(refusal), param_hint="--config")


def trust_code_option() -> Callable[[F], F]:
    """``--trust-code``: run a model factory named by a ``--config`` file nobody signed."""
    return click.option(
        "--trust-code",
        is_flag=True,
        help="Load the model factory named by --config FILE although this user's privmtl did not "
        "sign the file (results and model.json it writes are signed): only for files from "
        "someone you trust. --model on the command line needs no trust.",
    )


def config_option() -> Callable[[F], F]:
    """``--config FILE``: start from a saved run spec (a result, a model.json or a spec)."""
    return click.option(
        "--config",
        "config_file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        is_eager=True,
        expose_value=False,
        callback=_load_config,
        help="Start from a saved run: a JSON result of privmtl pmtl or privmtl flower local "
        "(its config), a model.json of --save-models or a run spec object. Its settings (and "
        "data, model and synthetic --num-clients where it records them) are the defaults; "
        "options given on the command line replace them.",
    )
