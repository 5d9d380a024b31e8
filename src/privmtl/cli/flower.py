"""``privmtl flower``: PMTL on Flower's Deployment Engine (needs ``pip install 'privmtl[flower]'``).

The Flower modules are imported only when a sub-command runs, so the rest of the CLI works without
the extra installed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import click

from privmtl.cli._common import echo_json, on_abort
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.spec import SERVER_UPDATES, SPEC
from privmtl.io import check_writable_dir

__all__ = ["flower"]


@click.group()
def flower() -> None:
    """PMTL on Flower's Deployment Engine (SuperLink + SuperNodes; extra: privmtl[flower])."""


@flower.command("local")
@click.option(
    "--num-supernodes", type=int, default=3, show_default=True, help="SuperNodes to start."
)
@click.option("--data", type=click.Choice(["synthetic", "femnist-leaf"]), required=True)
@click.option("--data-path", type=click.Path(file_okay=False), help="LEAF FEMNIST directory.")
@click.option("--num-clients", type=int, help="--data synthetic: number of clients m (default 50).")
@click.option("--model", type=click.Choice(["logreg", "cnn"]), required=True)
@click.option("--rounds", type=int, default=SPEC.rounds, show_default=True)
@click.option(
    "--clients-per-round",
    type=click.IntRange(min=1),
    help="Clients sampled per round (default: min(20, m), as privmtl pmtl's).",
)
@click.option(
    "--epsilon",
    type=float,
    help="Target ε of the whole run (σ calibrated to it; in a continued --work-dir the ε "
    "reported also composes the earlier runs' releases).",
)
@click.option("--noise-std", type=float, help="σ on the mean update (instead of --epsilon).")
@click.option(
    "--clip", type=float, default=SPEC.clip, show_default=True, help="γ: client update clip."
)
@click.option(
    "--lam",
    type=click.FloatRange(min=0.0),
    help="λ (mean regularization). Default: as privmtl pmtl's, 0.001 for private runs, 1 "
    "without noise.",
)
@click.option("--lr", type=float, default=SPEC.lr, show_default=True)
@click.option("--batch-size", type=int, default=SPEC.batch_size, show_default=True)
@click.option("--local-steps", type=int, help="E local SGD steps (default: 1 local epoch).")
@click.option(
    "--server-update",
    type=click.Choice(list(SERVER_UPDATES)),
    default=SPEC.server_update,
    show_default=True,
    help="PMTL client message: Ditto's trained copy of w~ minus w~ (as privmtl pmtl's), the "
    "authors' code's w_new - w~, or Algorithm 1's w_new - w_old (can diverge when q < m).",
)
@click.option(
    "--paper-delta",
    is_flag=True,
    help="δ = 1/m, the PMTL paper's (reproductions). Default: min(1e-5, 1/(100·m)), below 1/m.",
)
@click.option("--seed", type=int, default=SPEC.seed, show_default=True)
@click.option(
    "--reproducible-noise",
    is_flag=True,
    help="Draw the server noise from a generator seeded by --seed (research simulation only: "
    "anyone who knows the seed can subtract it). Default: secure noise from OS entropy.",
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
    default=1,
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
@click.option("--timeout", type=float, default=900.0, show_default=True, help="Whole run, seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def local(**kw: Any) -> None:
    """Run PMTL on a SuperLink and N SuperNodes started on 127.0.0.1 (insecure loopback only).

    Everything the run writes stays in --work-dir (the privacy ledger first of all); every
    process started is stopped at the end, also on failure and on Ctrl-C.
    """
    if importlib.util.find_spec("flwr") is None:
        raise click.ClickException("privmtl flower needs Flower: pip install 'privmtl[flower]'")
    if kw["epsilon"] is not None and kw["noise_std"] is not None:
        raise InvalidParameterError(
            "Give at most one of --epsilon and --noise-std; got "
            f"epsilon={kw['epsilon']}, noise_std={kw['noise_std']}."
        )
    # checked here: the run config encodes "not given" as -1
    for name, low in (("epsilon", "> 0"), ("budget_epsilon", "> 0"), ("noise_std", ">= 0")):
        v = kw[name]
        if v is not None and not (v > 0 if low == "> 0" else v >= 0):
            raise click.BadParameter(
                f"must be {low}; got {v}", param_hint="--" + name.replace("_", "-")
            )
    if kw["resume"] and kw["work_dir"] is None:
        raise click.BadParameter("needs --work-dir", param_hint="--resume")
    if kw["timeout"] <= 0:
        raise click.BadParameter(f"must be > 0; got {kw['timeout']}", param_hint="--timeout")
    if kw["work_dir"] is not None:
        check_writable_dir(kw["work_dir"], name="work_dir")
    from privmtl._progress import QUIET, get_verbosity
    from privmtl.flower._core import default_work_dir
    from privmtl.flower.launcher import check_work_dir, run_local

    as_json = kw["as_json"]
    run_config: dict[str, Any] = {
        "data": kw["data"],
        "data-path": kw["data_path"] or "",
        "num-clients": kw["num_clients"] or 0,
        "model": kw["model"],
        "rounds": kw["rounds"],
        "clients-per-round": kw["clients_per_round"] or 0,  # 0: the spec's default
        "epsilon": -1.0 if kw["epsilon"] is None else float(kw["epsilon"]),
        "noise-std": -1.0 if kw["noise_std"] is None else float(kw["noise_std"]),
        "clip": kw["clip"],
        "lam": -1.0 if kw["lam"] is None else float(kw["lam"]),
        "lr": kw["lr"],
        "batch-size": kw["batch_size"],
        "local-steps": kw["local_steps"] or 0,
        "server-update": kw["server_update"],
        "seed": kw["seed"],
        "noise-source": "seeded" if kw["reproducible_noise"] else "secure",
        "paper-delta": bool(kw["paper_delta"]),
        "on-missing": kw["on_missing"],
        "round-timeout": kw["round_timeout"],
        "secagg": kw["secagg"],
        "secagg-num-shares": kw["secagg_num_shares"],
        "secagg-threshold": kw["secagg_threshold"],
        "secagg-quantization-range": kw["secagg_quantization_range"],
        "secagg-modulus-range": kw["secagg_modulus_range"],
        "budget-epsilon": -1.0 if kw["budget_epsilon"] is None else float(kw["budget_epsilon"]),
        "checkpoint-every": kw["checkpoint_every"],
        "resume": bool(kw["resume"]),
    }
    from privmtl.flower._core import check_options
    from privmtl.flower.secagg import check_secagg_options

    check_options(run_config, kw["num_supernodes"])
    check_secagg_options(run_config, kw["num_supernodes"])
    work = kw["work_dir"] if kw["work_dir"] is not None else default_work_dir()
    check_work_dir(work, resume=kw["resume"])
    click.echo(f"privmtl: work directory {work} (ledger: server/ledger.jsonl)", err=True)
    on_abort(f"continue the run with the same command and --work-dir {work} --resume")
    out = run_local(
        num_supernodes=kw["num_supernodes"],
        run_config=run_config,
        work_dir=work,
        timeout=kw["timeout"],
        progress=None if get_verbosity() == QUIET else (lambda line: click.echo(line, err=True)),
    )
    if as_json:
        echo_json(out)
        return
    click.echo(
        f"pmtl ({out['model']}) on {out['data']} via {out['engine']}: m={out['num_clients']}, "
        f"q={out['clients_per_round']}, T={out['rounds']}, σ={out['noise_std']:.4g}"
    )
    click.echo(
        f"test accuracy (pooled) = {out['test_accuracy']:.4f}; mean client accuracy = "
        f"{out['mean_client_accuracy']:.4f}"
    )
    click.echo(f"privacy: {out['summary']}")
    if out.get("secure_aggregation"):
        sa = out["secure_aggregation"]
        click.echo(
            f"secure aggregation: {sa['protocol']}, {sa['clipping']} clipping, max quantization "
            f"error {sa['max_quantization_error']:.3g} per coordinate"
        )
    if out.get("stopped_on_budget"):
        click.echo(
            f"stopped on budget after {out['rounds_run']} of {out['rounds']} rounds "
            f"(ε spent {out['epsilon']:.4g})"
        )
    click.echo(f"work directory: {out['work_dir']}")
