"""``privmtl pmtl`` (one federated run) and ``privmtl pmtl-sweep`` (ε sweep with selection)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from privmtl._device import resolve_device
from privmtl._timing import describe_phases, with_startup
from privmtl.cli._common import (
    abort_hint_for_checkpoint,
    atomic_output_dir,
    check_save_dir,
    echo_final_models,
    echo_json,
    echo_run_privacy,
    number_list,
    on_abort,
    privacy_label,
    progress,
    row_for,
    spread,
    startup_seconds,
    to_jsonable,
    vote_share_option,
)
from privmtl.cli._data_options import pmtl_data_kwargs, pmtl_data_options
from privmtl.cli._output_files import (
    check_output_files,
    report_option,
    rows_for_report,
    write_run_report,
)
from privmtl.cli._spec_options import (
    check_config_code,
    config_option,
    pop_run_spec,
    spec_option,
    spec_options,
    trust_code_option,
)
from privmtl.data.registry import dataset_names, datasets_help
from privmtl.exceptions import InvalidParameterError
from privmtl.experiments.pmtl import (
    FINETUNE_STARTS,
    FL_METHODS,
    FL_MODELS,
    run_pmtl,
)
from privmtl.experiments.pmtl_sweep import PMTL_SWEEP_FILES, run_pmtl_sweep, write_pmtl_sweep
from privmtl.experiments.runlog import RunLog
from privmtl.federated.baseline import describe_gain
from privmtl.federated.end_of_run.finish import FINETUNE_SELECT_CHOICES, FINETUNE_VOTE_SHARE
from privmtl.federated.end_of_run.local import LOCAL_SELECT, LOCAL_SOLVER_CHOICES
from privmtl.federated.options import OPTIONS
from privmtl.federated.spec import EXECUTION, check_resume, check_vote_mechanism
from privmtl.federated.user_model import is_factory_spec
from privmtl.io import check_writable_dir
from privmtl.privacy.selection import SELECTION_METHODS, VOTE_SIGNAL
from privmtl.trust import check_signing_key, sign

__all__ = ["pmtl", "pmtl_sweep"]


MODEL_HELP = (
    "cnn (FEMNIST's 1x28x28 images), logreg, or your own model: MODULE:FACTORY (a module in the "
    "working directory, e.g. mymodels:make_mlp for ./mymodels.py, or an installed one) or "
    "PATH.py:FACTORY (a file), called as FACTORY(n_features, n_classes) and returning a "
    "torch.nn.Module that maps (batch, n_features) floats to (batch, n_classes) logits; checked "
    "by one forward pass before training. --save-models records the factory's source."
)


def check_model_option(model: str) -> None:
    """``--model``: a built-in name or ``MODULE:FACTORY`` / ``PATH.py:FACTORY``."""
    if model not in FL_MODELS and ":" not in model:
        raise click.BadParameter(
            f"must be one of {', '.join(FL_MODELS)}, MODULE:FACTORY or PATH.py:FACTORY; "
            f"got {model!r}",
            param_hint="--model",
        )


def _finetune_label(out: dict[str, Any]) -> str:
    auto = out.get("finetune_auto")
    if auto is not None:
        counts = ", ".join(f"{n} {c}" for n, c in auto["clients_per_candidate"].items())
        return f"  [auto, each client's choice on its own validation split: {counts}]"
    return f"  [after {out['finetune']} fine-tuning]" if out.get("finetune") else ""


def _fmt(value: Any, spec: str) -> str:
    """``value`` formatted with ``spec``; "—" for a quantity the method does not have (None)."""
    return "—" if value is None else format(value, spec)


def _human(out: dict[str, Any]) -> None:
    click.echo(
        f"{out['method']} ({out['model']}) on {out['data']}: m={out['num_clients']}, "
        f"q={out['clients_per_round']}, T={out['rounds']}, γ={_fmt(out['clip'], 'g')}, "
        f"σ={_fmt(out['noise_std'], '.4g')}"
    )
    click.echo(
        f"test accuracy (pooled) = {_fmt(out['test_accuracy'], '.4f')}; mean client accuracy = "
        f"{_fmt(out['mean_client_accuracy'], '.4f')}" + _finetune_label(out)
    )
    gain = describe_gain(out)
    if gain is not None:
        click.echo(gain)
    echo_final_models(out)
    click.echo(f"time: {describe_phases(out, per_round=out.get('seconds_per_round'))}")
    echo_run_privacy(out)
    for key, words in (("per_client_file", "per-client rows"), ("report", "report")):
        if out.get(key):
            click.echo(f"{words}: {out[key]}")
    for note in out["guarantee"]["notes"]:
        click.echo(f"note: {note}")


def _device_option(help: str) -> Any:
    """``--device`` (:mod:`privmtl._device`): one declaration for the commands that run the engine."""
    return click.option(
        "--device",
        default=EXECUTION.device,
        show_default=True,
        metavar="[auto|cpu|cuda|cuda:N]",
        help=help,
    )


@click.command()
@config_option()
@trust_code_option()
@click.option(
    "--data",
    type=click.Choice(list(dataset_names("pmtl"))),
    required=True,
    help=datasets_help("pmtl"),
)
@pmtl_data_options()
@click.option(
    "--model",
    default=OPTIONS.model,
    show_default=True,
    metavar="[cnn|logreg|MODULE:FACTORY|PATH.py:FACTORY]",
    help=MODEL_HELP,
)
@click.option(
    "--num-clients",
    type=click.IntRange(min=1),
    help="--data synthetic: number of clients m of the synthetic federation (default 50). Other "
    "generator parameters at their documented defaults (make_synthetic_federated): d = 60 "
    "features, C = 10 classes, LEAF's examples per client min(5 + floor(LogNormal(3, 2)), 1000), "
    "client models W_0 + tau A_k (tau = 0.5), isotropic features with client means "
    "N(beta_k 1, 0.5^2 I), beta_k ~ N(0, 0.5^2) (feature shift), noise-free labels. "
    "--method local-all trains every client alone (each client chooses epochs and lr on its "
    "own validation split).",
)
@spec_options()
@click.option(
    "--finetune-lrs",
    help="Comma-separated fine-tuning step sizes: every client picks one (and one of "
    "--finetune-lams) on its own validation split; default: --lr only, no choice.",
)
@click.option(
    "--finetune-lams",
    help="Comma-separated penalty weights λ for mr/skl/ewc fine-tuning (see --finetune-lrs).",
)
@click.option(
    "--finetune-start",
    type=click.Choice(list(FINETUNE_STARTS)),
    default=OPTIONS.finetune_start,
    show_default=True,
    help="auto: fine-tune each client's personalized model (the global model for global "
    "methods); billboard: every client starts from the released global model (vanilla only; "
    "the same grid and selection as --method local-all, which starts from the initial model).",
)
@click.option(
    "--finetune-epochs",
    default=str(OPTIONS.finetune_epochs),
    show_default=True,
    help="Local fine-tuning epochs; a comma-separated grid with --finetune-start billboard.",
)
@click.option(
    "--finetune-select",
    type=click.Choice([*FINETUNE_SELECT_CHOICES, *LOCAL_SELECT[1:]]),
    default=OPTIONS.finetune_select,
    show_default=True,
    help="auto: vote where one can be held (--finetune auto, --model logreg, a private run with "
    "--epsilon, independent noise), else client; client: each client picks its grid point (--finetune auto: "
    "its model) on its own validation split; vote (--finetune auto): one candidate for all, "
    "elected by the clients' noisy vote on their own validation splits, with "
    f"{FINETUNE_VOTE_SHARE:g} of --epsilon reserved for it and recorded in the ledger (held only "
    f"where its noise std is at most m/{VOTE_SIGNAL:g}, else the per-client choice; JSON: "
    "finetune_auto.vote); pooled: one grid point for all, on the pooled validation accuracy of "
    "every client (needs --finetune-start billboard; NOT covered by the guarantee, the JSON says "
    "covered: false).",
)
@click.option(
    "--local-select",
    type=click.Choice(list(LOCAL_SELECT)),
    default=OPTIONS.local_select,
    show_default=True,
    help="--method local-all: client = each client picks (epochs, lr) on its own validation "
    "split; pooled = one setting for all on the pooled validation accuracy of every client "
    "(NOT covered by the guarantee, the JSON says covered: false).",
)
@click.option(
    "--local-solver",
    type=click.Choice(list(LOCAL_SOLVER_CHOICES)),
    default=OPTIONS.local_solver,
    show_default=True,
    help="How local training (--method local-all, and --finetune auto's local and fine-tuned "
    "billboard candidates) is solved: sgd = the grid of minibatch-SGD runs; adam = the local "
    "candidate's grid with Adam's steps (15 and 20 epochs at 0.003, and at least 8 steps per "
    "epoch: a client with few examples trains more epochs; the billboard is still "
    "fine-tuned by SGD); ridge = (--model logreg only) every client's cross-entropy with an L2 "
    "penalty towards the start model, solved for many clients at once: several times faster, "
    "one candidate of each kind; auto = ridge for --model logreg when the end of run holds a "
    "vote, sgd for another logreg, adam for a network (sgd with --local-patience).",
)
@click.option(
    "--local-patience",
    type=click.IntRange(min=1),
    default=None,
    help="With --local-solver sgd: every SGD run of local training (--method local-all, "
    "--finetune auto's candidates) stops once its correct predictions on the client's own "
    "validation split have not improved for this many epochs (default: all epochs).",
)
@click.option(
    "--diagnostics",
    is_flag=True,
    help="Add curator_diagnostics to the result: per-round training loss and norms of the "
    "un-noised mean and of the noise. They read un-noised client updates: the result is "
    "labelled NOT covered by the guarantee.",
)
@click.option(
    "--checkpoint-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Save the run's state here atomically (and its write-ahead privacy ledger, "
    "ledger.jsonl); see --resume.",
)
@click.option(
    "--checkpoint-every",
    type=int,
    default=EXECUTION.checkpoint_every,
    show_default=True,
    help="Rounds between checkpoints.",
)
@click.option("--resume", is_flag=True, help="Continue the run saved in --checkpoint-dir.")
@click.option(
    "--budget-epsilon",
    type=float,
    help="Stop before the release that would take ε above this budget (keeps the models).",
)
@click.option(
    "--save-models",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the trained models (PyTorch state dicts) and model.json with the guarantee here "
    "(a new or empty folder; see --overwrite).",
)
@click.option(
    "--overwrite", is_flag=True, help="Let --save-models write into a folder that is not empty."
)
@click.option(
    "--per-client",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write one row per client here (.csv or .parquet): its sizes, the model it kept, its "
    "test accuracy, its local-only accuracy and the gain (also clients.csv in --save-models).",
)
@report_option
@click.option(
    "--eval-every",
    type=click.IntRange(min=0),
    default=EXECUTION.eval_every,
    show_default=True,
    help="Record the validation accuracy every N rounds (the report's accuracy curve; 0: none).",
)
@click.option(
    "--sequential", is_flag=True, help="Per-client reference loop instead of batched training."
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=EXECUTION.threads,
    show_default=True,
    help="Torch threads during training (logistic regression trains on one, its fastest), and "
    "blocks of clients the end of run computes at once (in forked worker processes on Linux; "
    "changes the speed, not the result).",
)
@_device_option(
    "Where training, the end of run and scoring compute: auto is CUDA where available, else the "
    "CPU; cuda without CUDA exits 2. The noise is still drawn on the CPU from the OS."
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def pmtl(**kw: Any) -> None:
    """Private personalized federated learning (PMTL) and its baselines: one run."""
    as_json = kw.pop("as_json")
    quiet = kw.pop("quiet")
    ctx = click.get_current_context()
    kw.update(pop_run_spec(ctx, kw))
    try:  # before anything is written (the checkpoint directory's lock)
        check_resume(kw["resume"], kw["noise_mechanism"], kw["noise_source"])
    except InvalidParameterError as exc:
        raise click.BadParameter(str(exc), param_hint="--resume") from None
    try:
        check_vote_mechanism(kw["finetune_select"], kw["noise_mechanism"])
    except InvalidParameterError as exc:
        raise click.BadParameter(str(exc), param_hint="--finetune-select") from None
    check_model_option(kw["model"])
    trust = kw.pop("trust_code")
    check_config_code(ctx, kw["model"], trust_code=trust)
    if kw.get("method") is not None:  # a user's method is code too: the same trust rules
        check_config_code(ctx, str(kw["method"]), trust_code=trust, param="method")
    kw.update(pmtl_data_kwargs(kw, kw["data"]))
    check_save_dir(kw["save_models"], overwrite=kw.pop("overwrite"))
    for name in ("save_models", "checkpoint_dir"):
        if kw[name] is not None:  # checked before any computation
            check_writable_dir(kw[name], name=name)
    report = check_output_files(kw)
    if kw["resume"] and kw["checkpoint_dir"] is None:
        raise click.BadParameter("needs --checkpoint-dir", param_hint="--resume")
    if kw["checkpoint_every"] < 1:
        raise click.BadParameter(
            f"must be >= 1; got {kw['checkpoint_every']}", param_hint="--checkpoint-every"
        )
    if kw["budget_epsilon"] is not None and not kw["budget_epsilon"] > 0:
        raise click.BadParameter(
            f"must be > 0; got {kw['budget_epsilon']}", param_hint="--budget-epsilon"
        )
    epochs = number_list(kw["finetune_epochs"], "--finetune-epochs", integer=True, low=1)
    kw["finetune_epochs"] = epochs if len(epochs) > 1 else epochs[0]
    for name, positive in (("finetune_lrs", True), ("finetune_lams", False)):
        if kw[name] is not None:
            flag = "--" + name.replace("_", "-")
            kw[name] = number_list(kw[name], flag, low=0, open_low=positive)
    names_code = is_factory_spec(str(kw["model"])) or is_factory_spec(str(kw.get("method")))
    if kw["save_models"] is not None or (as_json and names_code):
        check_signing_key()  # what the run signs: a bad key stops it before the first round
    abort_hint_for_checkpoint(kw["checkpoint_dir"])
    startup = startup_seconds()  # before the run's own clock starts
    asked_rows = kw["per_client"]
    with rows_for_report(kw, report) as rows_file:
        out = run_pmtl(**kw, show_progress=not quiet and not as_json)
        if startup is not None:
            with_startup(out, startup)
        if report is not None:
            out["report"] = str(write_run_report(report, out, rows_file))
    if asked_rows is None:  # a temporary file for the report only
        out.pop("per_client_file", None)
    if not as_json:
        _human(out)
    elif names_code:  # names code (a model or a method): signed for this user's --config
        echo_json(sign(to_jsonable(out)))
    else:
        echo_json(out)


@click.command("pmtl-sweep")
@click.option(
    "--data",
    type=click.Choice(list(dataset_names("pmtl"))),
    default=OPTIONS.data,
    show_default=True,
    help=datasets_help("pmtl"),
)
@pmtl_data_options()
@click.option(
    "--model",
    default=OPTIONS.model,
    show_default=True,
    metavar="[cnn|logreg|MODULE:FACTORY|PATH.py:FACTORY]",
    help=MODEL_HELP,
)
@click.option("--methods", default="pmtl,fedavg,local", show_default=True)
@click.option("--epsilons", default="0.5,1,2,4", show_default=True)
@click.option("--seeds", default="0", show_default=True)
@click.option("--clips", default="0.2,0.5,1", show_default=True, help="γ grid.")
@click.option("--rounds-grid", default="50,100", show_default=True, help="T grid.")
@spec_option("clients_per_round")
@click.option(
    "--lams",
    help="λ grid (pmtl's mean regularizer, fedprox's μ). Default: the λ of privmtl pmtl, "
    "0.001 for private runs, 1 without noise, 0.01 for FedProx.",
)
@spec_option("lr")
@spec_option("local_steps")
@spec_option("server_update")
@spec_option("finetune", help="Local fine-tuning of every candidate run, as privmtl pmtl's.")
@_device_option("Where every run computes (as privmtl pmtl's --device).")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("privmtl-results"),
    show_default=True,
)
@spec_option(
    "noise_source",
    help="Seed the server noise from each run's seed (research simulation only), or draw it "
    "securely from OS entropy.",
)
@click.option(
    "--select",
    type=click.Choice(list(SELECTION_METHODS)),
    default="vote",
    show_default=True,
    help="How (γ, T, λ) is chosen per ε: a noisy client vote on each client's own validation "
    "split (recorded; ε composes every candidate run and the vote), each client's own choice, "
    "or the pooled validation accuracy (NOT covered by the guarantee; rows say so).",
)
@vote_share_option
@click.option("--json", "as_json", is_flag=True)
def pmtl_sweep(**kw: Any) -> None:
    """ε sweep: per ε choose (γ, T, λ) (default: client vote), report test accuracy; CSV/JSON + plots.

    Every finished run (and every vote) is appended to OUT/runs.jsonl; re-running the sweep into
    the same --out reuses those of the same configuration (an interrupted sweep resumes).
    """
    check_model_option(kw["model"])
    resolve_device(kw["device"])  # before the output folder is touched
    table = pmtl_data_kwargs(kw, kw["data"])
    methods = [m.strip() for m in kw["methods"].split(",") if m.strip()]
    if not methods:
        raise click.BadParameter(
            f"must name at least one method; got {kw['methods']!r}", param_hint="--methods"
        )
    for m in methods:
        if m not in FL_METHODS:
            raise click.BadParameter(f"unknown method {m!r}", param_hint="--methods")
    eps = number_list(kw["epsilons"], "--epsilons", low=0, open_low=True)
    seeds = number_list(kw["seeds"], "--seeds", integer=True, low=0)
    clips = number_list(kw["clips"], "--clips", low=0, open_low=True)
    rounds_grid = number_list(kw["rounds_grid"], "--rounds-grid", integer=True, low=1)
    lams = None if kw["lams"] is None else number_list(kw["lams"], "--lams", low=0)
    log = RunLog(kw["out_dir"], outputs=PMTL_SWEEP_FILES)
    reused_before = log.reused
    on_abort(f"finished runs are kept in {log.path}: the same command continues the sweep")
    res = run_pmtl_sweep(
        data=kw["data"],
        **table,
        model=kw["model"],
        methods=methods,
        epsilons=eps,
        seeds=seeds,
        clips=clips,
        rounds_grid=rounds_grid,
        clients_per_round=kw["clients_per_round"],
        lam=lams,
        lr=kw["lr"],
        local_steps=kw["local_steps"],
        finetune=kw["finetune"],
        server_update=kw["server_update"],
        progress=lambda jobs, n: progress(
            jobs, desc="pmtl sweep", enabled=not kw["as_json"], total=n
        ),
        noise_source="seeded" if kw["reproducible_noise"] else "secure",
        log=log,
        select=kw["select"],
        vote_share=kw["vote_share"],
        device=kw["device"],
    )
    out_dir: Path = kw["out_dir"]
    with atomic_output_dir(out_dir) as tmp:
        written = write_pmtl_sweep(
            res, tmp, title=f"PMTL vs global models on {kw['data']} ({kw['model']})"
        )
    files = [str(out_dir / p.name) for p in written] + [str(log.path)]
    runs = {"runs_reused": log.reused - reused_before, "runs_computed": log.computed}
    sel = {"select": res["select"], "vote_share": res["vote_share"], "covered": res["covered"]}
    if kw["as_json"]:
        echo_json({"summary": res["summary"], "files": files, **sel, **runs})
        return
    for row in res["summary"]:
        e = "—" if row["target_epsilon"] is None else f"{row['target_epsilon']:g}"
        guarantee = privacy_label(row_for(res["rows"], row))
        tot = "  NOT COVERED (pooled selection)" if not row["covered"] else ""
        if row["target_epsilon"] is not None and row["covered"]:
            tot = "  (ε incl. selection)"
        click.echo(
            f"{row['method']:>22}  ε={e:>5}  test acc {row['mean']:.4f}{spread(row)}  "
            f"[{guarantee}]{tot}"
        )
    if runs["runs_reused"]:
        click.echo(f"reused {runs['runs_reused']} finished run(s) from {log.path}")
    click.echo("wrote: " + ", ".join(files))
