"""``privmtl flower``: PMTL on Flower's Deployment Engine (needs ``pip install 'privmtl[flower]'``).

Flower itself (``flwr``) is imported only by the processes a run starts (the SuperLink, the
SuperNodes and their apps), never by this command: the rest of the CLI, and this command's checks of
its options, work without the extra installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from privmtl._device import check_device
from privmtl._progress import QUIET, get_verbosity
from privmtl._validation import CLIENT_BYTES, check_int, check_memory
from privmtl.cli._common import (
    check_save_dir,
    on_abort,
    startup_seconds,
)
from privmtl.cli._data_options import pmtl_data_kwargs, pmtl_data_options
from privmtl.cli._spec_options import (
    check_config_code,
    config_option,
    given_settings,
    pop_run_spec,
    spec_options,
    trust_code_option,
)
from privmtl.cli.flower_run import report_local
from privmtl.cli.pmtl import _device_option, check_model_option
from privmtl.data.registry import dataset_names, datasets_help
from privmtl.federated.options import OPTIONS
from privmtl.federated.spec import EXECUTION, SPEC
from privmtl.federated.user_model import is_factory_spec
from privmtl.flower import _core, launcher
from privmtl.flower._core import NONE, check_options, default_work_dir, run_options
from privmtl.flower.factory import announce
from privmtl.flower.secagg import check_secagg_options
from privmtl.io import check_writable_dir
from privmtl.per_client import check_rows_path
from privmtl.trust import check_signing_key

__all__ = ["flower"]


def spec_run_config(settings: dict[str, Any], given: set[str]) -> dict[str, Any]:
    """The run configuration of the run spec's ``settings`` that were ``given``.

    A setting is passed under its name with hyphens (``clients_per_round`` →
    ``clients-per-round``), ``shared_params`` as comma-separated names, ``delta="paper"`` as
    ``paper-delta = true``; a setting left at its default is not passed (the Flower run's default
    is the spec's). A setting the Flower apps do not read (no key in
    :data:`~privmtl.flower._core.RUN_DEFAULTS`) is refused unless it is what they run anyway, so
    that no option is silently ignored.
    """
    known: dict[str, Any] = _core.RUN_DEFAULTS
    fixed: dict[str, Any] = getattr(_core, "FLOWER_FIXED", {})
    out: dict[str, Any] = {}
    for name, value in settings.items():
        key = name.replace("_", "-")
        if name not in given or value is None:
            continue
        if name == "delta" and value == "paper" and "paper-delta" in known:
            out["paper-delta"] = True  # the run configuration's flag for the paper's δ
            continue
        if key not in known:
            runs = fixed.get(name, getattr(SPEC, name))
            if value != runs:
                has = "the spec's default" if runs is None else f"{name}={runs!r}"
                raise click.BadParameter(
                    f"privmtl flower local does not take {name}={value!r}; a Flower run has {has}",
                    param_hint="--" + key,
                )
        out[key] = ",".join(value) if isinstance(value, tuple) else value
    return out


@click.group()
def flower() -> None:
    """PMTL on Flower's Deployment Engine (SuperLink + SuperNodes; extra: privmtl[flower])."""


@flower.command("local")
@config_option()
@trust_code_option()
@click.option(
    "--num-supernodes", type=int, default=3, show_default=True, help="SuperNodes to start."
)
@click.option(
    "--data",
    type=click.Choice(list(dataset_names("pmtl", flower=True))),
    required=True,
    help=datasets_help("pmtl", flower=True),
)
@pmtl_data_options()
@click.option("--num-clients", type=int, help="--data synthetic: number of clients m (default 50).")
@click.option(
    "--model",
    default=OPTIONS.model,
    show_default=True,
    metavar="[cnn|logreg|MODULE:FACTORY|PATH.py:FACTORY]",
    help="As for privmtl pmtl: cnn, logreg, or your own factory (MODULE:FACTORY, a module in the "
    "working directory or an installed one; PATH.py:FACTORY, a file), resolved against the "
    "directory this command runs in. No code is sent: the ServerApp and every SuperNode load "
    "their own copy and refuse to run one whose SHA-256 differs from this one's.",
)
@spec_options(
    help={
        "epsilon": "In a continued --work-dir the ε reported also composes the earlier runs' "
        "releases."
    }
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="The run's durable directory: server/ (write-ahead privacy ledger ledger.jsonl, "
    "checkpoint, billboards.pt, result.json), nodes/node-<i>/ (each SuperNode's personalized "
    "models), logs/. Run again with the same directory to continue the personalized models (the "
    "ledger continues too: ε composes every release the clients took part in). Default: a new "
    "directory under $XDG_STATE_HOME/privmtl/flower (~/.local/state/...), printed on stderr; "
    "it is never deleted.",
)
@click.option(
    "--budget-epsilon",
    type=float,
    help="Stop before the release that would take the ledger's ε above this budget "
    "(stopped_on_budget: true).",
)
@click.option(
    "--checkpoint-every",
    type=int,
    default=EXECUTION.checkpoint_every,
    show_default=True,
    help="Rounds between checkpoints of the ServerApp (in WORK_DIR/server).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue the run in --work-dir that did not finish (killed, failed, interrupted) from "
    "its checkpoint; seeded replays are not charged twice.",
)
@click.option(
    "--on-missing",
    type=click.Choice(["fail", "proceed"]),
    default="fail",
    show_default=True,
    help="A node that does not answer a round within --round-timeout: fail the run before the "
    "release (resume later with --resume), or proceed without its clients (the mean keeps the "
    "fixed divisor q).",
)
@click.option(
    "--round-timeout",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds to wait for the nodes' answers in a round (and for the SuperNodes to connect).",
)
@click.option(
    "--secagg",
    is_flag=True,
    help="Secure aggregation (SecAgg+ among all SuperNodes, >= 3): clients clip and quantize, "
    "the server sees only the sum and adds the noise (same accounting).",
)
@click.option(
    "--secagg-num-shares",
    type=int,
    default=0,
    show_default=True,
    help="SecAgg+ shares per secret (neighbours per node); 0: every node.",
)
@click.option(
    "--secagg-threshold",
    type=int,
    default=0,
    show_default=True,
    help="SecAgg+ reconstruction threshold; 0: a majority of the shares.",
)
@click.option(
    "--secagg-quantization-range",
    type=int,
    default=2**22,
    show_default=True,
    help="SecAgg+ quantization range R (one step is 2*clip/R).",
)
@click.option(
    "--secagg-modulus-range",
    type=int,
    default=2**32,
    show_default=True,
    help="SecAgg+ modulus (a power of two <= 2**32).",
)
@click.option(
    "--save-models",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the trained models (PyTorch state dicts) and model.json with the guarantee here, "
    "as privmtl pmtl --save-models (a new or empty folder; see --overwrite); privmtl evaluate "
    "reloads it. The ServerApp keeps the released global model, each SuperNode its own clients' "
    "final models; this command assembles them once the run finished (all on this machine).",
)
@click.option(
    "--overwrite", is_flag=True, help="Let --save-models write into a folder that is not empty."
)
@click.option("--timeout", type=float, default=900.0, show_default=True, help="Whole run, seconds.")
@click.option(
    "--per-client",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write one row per client here (.csv or .parquet): its sizes, the model it kept, its "
    "test accuracy, its local-only accuracy and the gain (the rows privmtl pmtl writes).",
)
@_device_option(
    "Where every SuperNode runs its clients' step (as privmtl pmtl's --device; a node without "
    "that device refuses the run in one line)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def local(**kw: Any) -> None:
    """Run PMTL on a SuperLink and N SuperNodes started on 127.0.0.1 (insecure loopback only).

    Everything the run writes stays in --work-dir (the privacy ledger first of all); every
    process started is stopped at the end, also on failure and on Ctrl-C.
    """
    ctx = click.get_current_context()
    trust = kw.pop("trust_code")
    check_config_code(ctx, kw["model"], trust_code=trust)
    if kw.get("method") is not None:  # a user's method is code too: the same trust rules
        check_config_code(ctx, str(kw["method"]), trust_code=trust, param="method")
    check_model_option(kw["model"])
    check_device(kw["device"])  # its name here; whether a node has it, on that node
    settings = pop_run_spec(click.get_current_context(), kw)
    budget = kw["budget_epsilon"]
    if budget is not None and not budget > 0:
        raise click.BadParameter(f"must be > 0; got {budget}", param_hint="--budget-epsilon")
    if kw["resume"] and kw["work_dir"] is None:
        raise click.BadParameter("needs --work-dir", param_hint="--resume")
    if kw["timeout"] <= 0:
        raise click.BadParameter(f"must be > 0; got {kw['timeout']}", param_hint="--timeout")
    check_save_dir(kw["save_models"], overwrite=kw.pop("overwrite"))
    for name in ("save_models", "work_dir"):
        if kw[name] is not None:  # checked before any process starts
            check_writable_dir(kw[name], name=name)
    if kw["per_client"] is not None:
        check_rows_path(kw["per_client"])
    if kw["num_clients"] is not None:  # the ServerApp's population, before any process starts
        check_memory(
            "num_clients",
            check_int("num_clients", kw["num_clients"], low=1),
            CLIENT_BYTES,
            "clients",
        )
    as_json = kw["as_json"]
    run_config = _run_config(kw, settings, budget)
    # a user's factory or method: loaded here (refused in one line before any process starts);
    # the apps get this directory and its file's SHA-256, and load their own copy
    run_config = announce(run_config, cwd=Path.cwd())
    full = run_options(run_config)  # with the Flower run's defaults of what was not given
    check_options(full, kw["num_supernodes"])
    check_secagg_options(full, kw["num_supernodes"])
    work = kw["work_dir"] if kw["work_dir"] is not None else default_work_dir()
    launcher.check_work_dir(work, resume=kw["resume"])
    # a result naming code (a model or a method) is signed, so that this user's --config FILE can
    # load it again; the saved models always are: a bad key stops the run before it starts
    code = is_factory_spec(str(kw["model"])) or is_factory_spec(str(settings.get("method")))
    if kw["save_models"] is not None or (as_json and code):
        check_signing_key()
    if importlib.util.find_spec("flwr") is None:  # after the checks: bad input says what is bad
        raise click.ClickException("privmtl flower needs Flower: pip install 'privmtl[flower]'")
    click.echo(f"privmtl: work directory {work} (ledger: server/ledger.jsonl)", err=True)
    on_abort(f"continue the run with the same command and --work-dir {work} --resume")
    startup = startup_seconds()  # before the launcher's clock starts
    quiet = get_verbosity() == QUIET
    if startup is not None and os.name == "posix":  # the program: wait without torch
        request = launcher.launch_request(
            num_supernodes=kw["num_supernodes"], run_config=run_config, work_dir=work,
            timeout=kw["timeout"], save_models=kw["save_models"],
        )  # fmt: skip
        request["output"] = {"as_json": as_json, "code": code, "quiet": quiet}
        exec_launcher(request)
    out = launcher.run_local(
        num_supernodes=kw["num_supernodes"],
        run_config=run_config,
        work_dir=work,
        timeout=kw["timeout"],
        progress=None if quiet else (lambda line: click.echo(line, err=True)),
        save_models=kw["save_models"],
    )
    code = code or is_factory_spec(str(out.get("model")))
    report_local(out, as_json=as_json, code=code, startup=startup)


def exec_launcher(request: dict[str, Any]) -> None:
    """Replace this process with ``python -m privmtl.cli.flower_run REQUEST``: the same process
    (its id, its start time, its output streams and its parent) waits for the deployment
    without PyTorch, SciPy or Flower (:mod:`privmtl.cli.flower_run`)."""
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [sys.executable, "-m", "privmtl.cli.flower_run", json.dumps(request)]
    os.execv(sys.executable, argv)


def _run_config(
    kw: dict[str, Any], settings: dict[str, Any], budget: float | None
) -> dict[str, Any]:
    """The Flower run configuration of ``privmtl flower local``'s options (the run spec's
    settings encoded by :func:`spec_run_config`, None as :data:`NONE`)."""
    table = pmtl_data_kwargs(kw, kw["data"])
    if kw["data"] == "table":  # every SuperNode reads the file from this absolute path
        table["data_path"] = Path(table["data_path"]).absolute()
    return {
        "data": kw["data"],
        "data-path": str(table["data_path"] or ""),
        **(
            {
                "client-column": table["client_column"],
                "label-column": table["label_column"],
                "feature-columns": ",".join(table["feature_columns"] or ()),
                "scaling": table["scaling"],
            }
            if kw["data"] == "table"
            else {}
        ),
        "num-clients": NONE if kw["num_clients"] is None else kw["num_clients"],
        "model": kw["model"],
        **spec_run_config(settings, given_settings(click.get_current_context())),
        "on-missing": kw["on_missing"],
        "round-timeout": kw["round_timeout"],
        "secagg": kw["secagg"],
        "secagg-num-shares": kw["secagg_num_shares"],
        "secagg-threshold": kw["secagg_threshold"],
        "secagg-quantization-range": kw["secagg_quantization_range"],
        "secagg-modulus-range": kw["secagg_modulus_range"],
        "budget-epsilon": NONE if budget is None else float(budget),
        "checkpoint-every": kw["checkpoint_every"],
        "resume": bool(kw["resume"]),
        "per-client": "" if kw["per_client"] is None else str(Path(kw["per_client"]).absolute()),
        "device": kw["device"],
    }
