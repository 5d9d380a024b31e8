"""``privmtl mpmtl`` (one method, one ε) and ``privmtl mpmtl-sweep`` (ε sweep, table and plot)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click

from privmtl._timing import describe_phases, with_startup
from privmtl.cli._common import (
    abort_hint_for_checkpoint,
    check_save_dir,
    echo_json,
    number_list,
    on_abort,
    privacy_label,
    progress,
    row_for,
    spread,
    startup_seconds,
    vote_share_option,
)
from privmtl.cli._data_options import mpmtl_data_kwargs, mpmtl_data_options
from privmtl.cli._output_files import (
    check_output_files,
    report_option,
    rows_for_report,
    write_run_report,
)
from privmtl.data.registry import dataset_names, datasets_help
from privmtl.experiments.mpmtl import (
    METHODS,
    TUNE_MODES,
    run_mpmtl,
)
from privmtl.experiments.mpmtl_sweep import (
    DEFAULT_SELECT,
    DEFAULT_SWEEP_EPSILONS,
    DEFAULT_SWEEP_METHODS,
    DEFAULT_SWEEP_TUNE,
    SWEEP_TUNE_MODES,
    run_mpmtl_sweep,
)
from privmtl.gain import gain_verdict
from privmtl.io import check_writable_dir
from privmtl.linear.eigen_floor import FLOOR_GRID, FLOOR_VOTE, POWER_AUTO, VOTE_SHARE
from privmtl.linear.methods import is_method_spec
from privmtl.linear.selection import FINAL_STEPS
from privmtl.linear.spec import DEFAULT_ITERATIONS, NOISES, SPEC
from privmtl.privacy.accounting import TIGHT_ACCOUNTANTS
from privmtl.privacy.guarantee import RELATIONS
from privmtl.privacy.selection import SELECTION_METHODS
from privmtl.trust import check_signing_key

__all__ = ["mpmtl", "mpmtl_sweep"]

_data_opt = click.option(
    "--data",
    type=click.Choice(list(dataset_names("mpmtl"))),
    required=True,
    help=datasets_help("mpmtl"),
)
_noise_opt = click.option(
    "--noise",
    type=click.Choice(list(NOISES)),
    default=SPEC.noise,
    show_default=True,
    help="Covariance mechanism: gaussian (correct, default) or wishart (published; reported with "
    "its real delta).",
)


_final_opt = click.option(
    "--final-step",
    type=click.Choice(list(FINAL_STEPS)),
    default=SPEC.final_step,
    show_default=True,
    help="MP-MTL low-rank/group-sparse output rule: the paper's projected models, the local "
    "variational refit against the last release (auto: the refit; with --tune pooled, CV "
    "chooses between both).",
)


class _FloorType(click.ParamType):
    """``--eigen-floor``: ``vote`` or a number >= 0 (checked against the spec's constraint)."""

    name = "vote|FLOAT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == FLOOR_VOTE or isinstance(value, float | int):
            return value
        try:
            number = float(value)
        except ValueError:
            self.fail(f"{value!r} is neither 'vote' nor a number.", param, ctx)
        if not (math.isfinite(number) and number >= 0):
            self.fail(
                f"The 'eigen_floor' parameter must be 'vote' or a real number in [0, inf); got "
                f"{value}.",
                param,
                ctx,
            )
        return number


_floor_opt = click.option(
    "--eigen-floor",
    type=_FloorType(),
    default=SPEC.eigen_floor,
    show_default=True,
    help="Low-rank refit: floor of the eigenvalue cut, in multiples of the estimation-noise edge "
    "K^2(sqrt(m)+sqrt(d))^2/d. vote: the tasks choose it from {"
    + ", ".join(f"{g:g}" for g in FLOOR_GRID)
    + "} by a recorded noisy vote that takes "
    + f"{VOTE_SHARE:g}"
    + " of the budget (epsilon stays the target), held only where a floor can change the cut "
    "and the vote can carry signal; a number fixes it (0: the privacy cut 2*sigma*sqrt(d) "
    "alone, the behaviour before the vote).",
)


class _PowerType(click.ParamType):
    """``--refit-power``: ``auto`` or a number > 0."""

    name = "auto|FLOAT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == POWER_AUTO or isinstance(value, float | int):
            return value
        try:
            number = float(value)
        except ValueError:
            self.fail(f"{value!r} is neither 'auto' nor a number.", param, ctx)
        if not (math.isfinite(number) and number > 0):
            self.fail(
                f"The 'refit_power' parameter must be 'auto' or a real number in (0, inf); got "
                f"{value}.",
                param,
                ctx,
            )
        return number


_power_opt = click.option(
    "--refit-power",
    type=_PowerType(),
    default=SPEC.refit_power,
    show_default=True,
    help="Low-rank refit: power p of its metric D ~ (released eigenvalues)^p. 0.5: the trace "
    "norm's variational step; 1: the Gaussian prior the release describes. auto: 1 where the "
    "release's noise norm 2*sigma*sqrt(d) is at most half the estimation-noise edge "
    "K^2(sqrt(m)+sqrt(d))^2/d, else 0.5 (public quantities, nothing spent).",
)

_reproducible_opt = click.option(
    "--reproducible-noise",
    is_flag=True,
    help="Draw the privacy noise from --seed (seeded, reproducible: research simulation only — "
    "anyone who knows the seed can subtract it). Default: secure noise from OS entropy.",
)


def _human(out: dict[str, Any]) -> None:
    metric = "nmse" if "nmse" in out else "auc"
    click.echo(
        f"{out['method']} on {out['data']} (m={out['n_tasks']}, d={out['n_features']}, "
        f"seed={out['seed']}): {metric} = {out[metric]:.4f}"
    )
    if "gain_over_stl" in out:
        low, high = out["gain_interval"]
        better = "lower" if metric == "nmse" else "higher"
        click.echo(
            f"every task alone (per-task ridge): {metric} = {out['stl_' + metric]:.4f} ({better} "
            f"is better); gain {out['gain_over_stl']:+.4f} [{low:+.4f}, {high:+.4f}]: "
            + gain_verdict(low, high, alone="each task alone")
        )
    click.echo(f"time: {describe_phases(out)}")
    click.echo(f"privacy: {out['summary']}")
    for note in out["guarantee"]["notes"]:
        click.echo(f"note: {note}")
    click.echo(f"tuning ({out['tune']}): {out['tuning_note']}")
    click.echo(f"covered by the guarantee: {'yes' if out['covered'] else 'NO'}")
    click.echo(f"noise source: {out['noise_source']}")
    floor = out.get("eigen_floor")
    if floor is not None:
        click.echo(
            f"eigen floor: {floor['floor']:g} x edge {floor['edge']:.4g} -> cut "
            f"{floor['cut']:.4g} ({floor['mode']}: {floor['reason']})"
        )
    if out.get("refit_power") is not None:
        click.echo(f"refit metric: D ~ (released eigenvalues)^{out['refit_power']:g}")
    if out.get("stopped_on_budget"):
        click.echo(
            f"stopped on budget after {out.get('iterations_run')} iterations: "
            f"epsilon spent {out['epsilon']:.4g} <= {out.get('budget_epsilon')}"
        )
    for key in ("ledger", "models_dir", "per_client_file", "report"):
        if out.get(key):
            click.echo(f"{key.replace('_', ' ')}: {out[key]}")


class _LinearMethodType(click.ParamType):
    """``--method``: one of the linear methods, or ``PATH.py:NAME`` / ``MODULE:NAME``."""

    name = "method"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "[" + "|".join(METHODS) + "|PATH.py:NAME|MODULE:NAME]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value in METHODS or is_method_spec(value):
            return value
        self.fail(
            f"{value!r} is not one of {', '.join(METHODS)}, nor PATH.py:NAME or MODULE:NAME.",
            param,
            ctx,
        )


@click.command()
@_data_opt
@mpmtl_data_options()
@click.option(
    "--method",
    type=_LinearMethodType(),
    required=True,
    help="A method, or your own: PATH.py:NAME / MODULE:NAME naming a LinearMethod subclass "
    "(its code runs; the result records the file's SHA-256 under method_source).",
)
@_noise_opt
@click.option("--epsilon", type=float, help="Privacy budget ε (absent: non-private).")
@click.option(
    "--delta",
    type=float,
    help="δ. Default: min(1e-5, 1/(100·m)) on every data set (below 1/m, DP practice). "
    "δ >= 1/m warns; δ >= 1 is refused.",
)
@click.option(
    "--paper-delta",
    is_flag=True,
    help="Use the MP-MTL paper's δ = 1/(m·log m) (paper reproductions; above 1/(100·m)).",
)
@click.option(
    "--iterations",
    type=int,
    help="T: covariance releases / proximal-gradient iterations (default: the method's, "
    + ", ".join(f"{t} for {m}" for m, t in DEFAULT_ITERATIONS.items())
    + "; searched with --tune pooled).",
)
@click.option("--seed", type=int, default=SPEC.seed, show_default=True)
@click.option(
    "--tune",
    "tune",
    type=click.Choice(list(TUNE_MODES)),
    default=SPEC.tune,
    show_default=True,
    help="Hyper-parameters. covered: single-task baselines choose per task on their own samples, "
    "private methods use public defaults, non-private ones (ε = ∞) k-fold CV over all tasks; "
    "pooled: the paper's k-fold CV over every task's data for every method (private results then "
    "say covered: false); none: the estimators' defaults.",
)
@click.option(
    "--no-tune",
    "no_tune",
    is_flag=True,
    help="Same as --tune none.",
)
@click.option(
    "--relation",
    type=click.Choice(list(RELATIONS)),
    default=SPEC.relation,
    show_default=True,
)
@click.option(
    "--accountant",
    type=click.Choice(list(TIGHT_ACCOUNTANTS)),
    default=SPEC.accountant,
    show_default=True,
)
@_final_opt
@_reproducible_opt
@click.option(
    "--budget-epsilon",
    type=float,
    help="Stop before the covariance release that would take epsilon above this budget, keep "
    "the model reached (MP-MTL methods).",
)
@click.option(
    "--checkpoint-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Save the run's state atomically here and keep its durable privacy ledger in "
    "DIR/ledger.jsonl (MP-MTL methods).",
)
@click.option(
    "--checkpoint-every",
    type=click.IntRange(min=1),
    default=SPEC.checkpoint_every,
    show_default=True,
    help="Iterations between checkpoints.",
)
@click.option("--resume", is_flag=True, help="Continue the run checkpointed in --checkpoint-dir.")
@click.option(
    "--save-models",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the fitted W (coef.npy) and model.json here (see privmtl evaluate; a new or "
    "empty folder, see --overwrite).",
)
@click.option(
    "--overwrite", is_flag=True, help="Let --save-models write into a folder that is not empty."
)
@click.option(
    "--per-client",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write one row per task here (.csv or .parquet): its sizes, its test nMSE (AUC), the "
    "same of the task alone and the gain (also clients.csv in --save-models).",
)
@report_option
@_floor_opt
@_power_opt
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def mpmtl(
    data: str,
    method: str,
    noise: str,
    epsilon: float | None,
    delta: float | None,
    paper_delta: bool,
    iterations: int | None,
    seed: int,
    tune: str,
    no_tune: bool,
    relation: str,
    accountant: str,
    final_step: str,
    reproducible_noise: bool,
    budget_epsilon: float | None,
    checkpoint_dir: Path | None,
    checkpoint_every: int,
    resume: bool,
    save_models: Path | None,
    overwrite: bool,
    eigen_floor: float | str,
    refit_power: float | str,
    as_json: bool,
    per_client: Path | None,
    report: Path | None,
    **data_opts: Any,
) -> None:
    """Model-protected linear MTL (MP-MTL) and its baselines: one method at one ε.

    A user's table (--data table) gets each task's features standardized with its own training
    split's statistics and a 70/30 split by default; --data school keeps the MP-MTL paper's
    protocol (unit-norm rows, 30% training).
    """
    if paper_delta and delta is not None:
        raise click.BadParameter(
            "--paper-delta and --delta are exclusive; got both.", param_hint="--paper-delta"
        )
    check_save_dir(save_models, overwrite=overwrite)
    table = mpmtl_data_kwargs(data_opts, data)
    for name, folder in (("save_models", save_models), ("checkpoint_dir", checkpoint_dir)):
        if folder is not None:  # checked before any computation
            check_writable_dir(folder, name=name)
    if save_models is not None:  # model.json is signed: a bad key stops the run before it starts
        check_signing_key()
    files = {"per_client": per_client, "report": report, "save_models": save_models}
    report = check_output_files(files)
    abort_hint_for_checkpoint(checkpoint_dir)
    startup = startup_seconds()  # before the run's own clock starts
    with rows_for_report(files, report) as rows_file:
        out = _run(files, rows_file, report, dict(
            data=data, **table, method=method, noise=noise, epsilon=epsilon,
            delta="paper" if paper_delta else delta, iterations=iterations, seed=seed,
            tune="none" if no_tune else tune, relation=relation, accountant=accountant,
            final_step=final_step,
            noise_source="seeded" if reproducible_noise else SPEC.noise_source,
            budget_epsilon=budget_epsilon, checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every, resume=resume, save_models=save_models,
            eigen_floor=eigen_floor, refit_power=refit_power,
        ))  # fmt: skip
    if per_client is None:  # a temporary file for the report only
        out.pop("per_client_file", None)
    if startup is not None:
        with_startup(out, startup)
    echo_json(out) if as_json else _human(out)


def _run(
    files: dict[str, Any], rows_file: Path | None, report: Path | None, kw: dict[str, Any]
) -> dict[str, Any]:
    """``run_mpmtl`` with the command's per-client file and its report, when asked for."""
    out = run_mpmtl(**kw, per_client=files["per_client"])
    if report is not None:
        out["report"] = str(write_run_report(report, out, rows_file))
    return out


@click.command("mpmtl-sweep")
@_data_opt
@mpmtl_data_options()
@click.option(
    "--methods",
    default=",".join(DEFAULT_SWEEP_METHODS),
    show_default=True,
    help="Comma-separated methods; private ones are swept over ε, others drawn as reference lines.",
)
@click.option(
    "--epsilons", default=",".join(f"{e:g}" for e in DEFAULT_SWEEP_EPSILONS), show_default=True
)
@click.option("--seeds", default="0", show_default=True, help="Comma-separated seeds.")
@_noise_opt
@click.option("--iterations", type=int, help="T for every method (default: tuned).")
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes for the (method, ε, seed) runs; results do not depend on it.",
)
@click.option(
    "--select",
    type=click.Choice(list(SELECTION_METHODS)),
    default=DEFAULT_SELECT,
    show_default=True,
    help="How hyper-parameters are chosen: a noisy vote of the tasks, each on its own validation "
    "part, over a small public grid (recorded; the target ε is split between the candidates and "
    "the vote, so a row is charged its target; candidates whose release could not carry signal "
    "never run; the low-rank and group-sparse grids are the estimator's defaults alone, run on "
    "the whole training split); each task's own choice; or k-fold CV over every task's data as "
    "in the paper (NOT covered by the guarantee; rows say so).",
)
@vote_share_option
@click.option(
    "--tune",
    "tune_mode",
    type=click.Choice(list(SWEEP_TUNE_MODES)),
    default=DEFAULT_SWEEP_TUNE,
    show_default=True,
    help="With --select pooled: k-fold CV for every (method, ε, seed), or once per (method, "
    "seed) at the middle ε and reused. 'none': no selection at all (the estimators' defaults).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("privmtl-results"),
    show_default=True,
)
@_final_opt
@_floor_opt
@_reproducible_opt
@click.option("--json", "as_json", is_flag=True)
def mpmtl_sweep(
    data: str,
    methods: str,
    epsilons: str,
    seeds: str,
    noise: str,
    iterations: int | None,
    jobs: int,
    select: str,
    vote_share: float,
    tune_mode: str,
    out_dir: Path,
    final_step: str,
    eigen_floor: float | str,
    reproducible_noise: bool,
    as_json: bool,
    **data_opts: Any,
) -> None:
    """ε sweep of MP-MTL methods: writes a CSV/JSON table and a trade-off PNG (paper Figs. 6, 9)."""
    table = mpmtl_data_kwargs(data_opts, data)
    method_list = [m.strip() for m in methods.split(",") if m.strip()]
    if not method_list:
        raise click.BadParameter(
            f"must name at least one method; got {methods!r}", param_hint="--methods"
        )
    for m in method_list:
        if m not in METHODS:
            raise click.BadParameter(
                f"unknown method {m!r}; choose from {', '.join(METHODS)}", param_hint="--methods"
            )
    eps = number_list(epsilons, "--epsilons", low=0, open_low=True)
    seed_list = number_list(seeds, "--seeds", integer=True, low=0)
    on_abort(f"finished runs are kept in {out_dir / 'runs.jsonl'}: the same command continues")

    res = run_mpmtl_sweep(
        data=data,
        **table,
        methods=method_list,
        epsilons=eps,
        seeds=seed_list,
        noise=noise,
        tune_mode=tune_mode,
        select=select,
        vote_share=vote_share,
        out_dir=out_dir,
        iterations=iterations,
        final_step=final_step,
        eigen_floor=eigen_floor,
        n_jobs=jobs,
        noise_source="seeded" if reproducible_noise else SPEC.noise_source,
        progress=lambda jobs, n: progress(jobs, desc="mpmtl sweep", enabled=not as_json, total=n),
    )
    if as_json:
        echo_json(res)
        return
    rows = json.loads((out_dir / "mpmtl_sweep.json").read_text())["rows"]
    metric = "nMSE" if rows[0]["metric"] == "nmse" else "aAUC"
    for row in res["summary"]:
        eps_txt = "—" if row["target_epsilon"] is None else f"{row['target_epsilon']:g}"
        guarantee = privacy_label(row_for(rows, row))
        tot = "  NOT COVERED (pooled selection)" if not row["covered"] else ""
        if row["target_epsilon"] is not None and row["covered"]:
            tot = "  (ε incl. selection)"
        click.echo(
            f"{row['method']:>14}  ε={eps_txt:>6}  {metric} {row['mean']:.4f}{spread(row)}  "
            f"[{guarantee}]{tot}"
        )
    if res["runs_reused"]:
        click.echo(
            f"reused {res['runs_reused']} finished run(s) from {out_dir / 'runs.jsonl'}; "
            f"computed {res['runs_computed']}"
        )
    click.echo("wrote: " + ", ".join(res["files"]))
