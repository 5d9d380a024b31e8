"""``privmtl flower``: PMTL on Flower's Deployment Engine (needs ``pip install 'privmtl[flower]'``).

The Flower modules are imported only when a sub-command runs, so the rest of the CLI works without
the extra installed.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import click

from privmtl.cli._common import echo_json
from privmtl.exceptions import InvalidParameterError

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
@click.option("--model", type=click.Choice(["logreg", "cnn"]), required=True)
@click.option("--rounds", type=int, default=3, show_default=True)
@click.option("--clients-per-round", type=int, default=6, show_default=True)
@click.option("--epsilon", type=float, help="Target ε of the whole run (σ calibrated to it).")
@click.option("--noise-std", type=float, help="σ on the mean update (instead of --epsilon).")
@click.option("--clip", type=float, default=0.5, show_default=True, help="γ: client update clip.")
@click.option("--lam", type=float, default=0.1, show_default=True)
@click.option("--lr", type=float, default=0.1, show_default=True)
@click.option("--batch-size", type=int, default=10, show_default=True)
@click.option("--local-steps", type=int, help="E local SGD steps (default: 1 local epoch).")
@click.option(
    "--server-update",
    type=click.Choice(["delta", "offset"]),
    default="delta",
    show_default=True,
    help="PMTL client message: Algorithm 1's w_new - w_old, or the authors' code's w_new - w~.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--reproducible-noise",
    is_flag=True,
    help="Draw the server noise from a generator seeded by --seed (research simulation only: "
    "anyone who knows the seed can subtract it). Default: secure noise from OS entropy.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    help="Root of the nodes' own storage of personalized models (node-<i>/); reuse it to continue "
    "the same personalized models. Default: a fresh temporary directory.",
)
@click.option(
    "--on-missing",
    type=click.Choice(["fail", "drop"]),
    default="fail",
    show_default=True,
    help="A node that does not answer a round: fail the run before the release, or release "
    "without its clients (the mean keeps the fixed divisor q).",
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
@click.option("--round-timeout", type=float, default=120.0, show_default=True)
@click.option("--timeout", type=float, default=900.0, show_default=True, help="Whole run, seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def local(**kw: Any) -> None:
    """Run PMTL on a SuperLink and N SuperNodes started on 127.0.0.1 (insecure loopback only)."""
    if importlib.util.find_spec("flwr") is None:
        raise click.ClickException("privmtl flower needs Flower: pip install 'privmtl[flower]'")
    if kw["epsilon"] is not None and kw["noise_std"] is not None:
        raise InvalidParameterError(
            "Give at most one of --epsilon and --noise-std; got "
            f"epsilon={kw['epsilon']}, noise_std={kw['noise_std']}."
        )
    from privmtl.flower.launcher import run_local

    as_json = kw["as_json"]
    run_config: dict[str, Any] = {
        "data": kw["data"],
        "data-path": kw["data_path"] or "",
        "model": kw["model"],
        "rounds": kw["rounds"],
        "clients-per-round": kw["clients_per_round"],
        "epsilon": -1.0 if kw["epsilon"] is None else float(kw["epsilon"]),
        "noise-std": -1.0 if kw["noise_std"] is None else float(kw["noise_std"]),
        "clip": kw["clip"],
        "lam": kw["lam"],
        "lr": kw["lr"],
        "batch-size": kw["batch_size"],
        "local-steps": kw["local_steps"] or 0,
        "server-update": kw["server_update"],
        "seed": kw["seed"],
        "noise-source": "seeded" if kw["reproducible_noise"] else "secure",
        "on-missing": kw["on_missing"],
        "round-timeout": kw["round_timeout"],
        "secagg": kw["secagg"],
        "secagg-num-shares": kw["secagg_num_shares"],
        "secagg-threshold": kw["secagg_threshold"],
        "secagg-quantization-range": kw["secagg_quantization_range"],
        "secagg-modulus-range": kw["secagg_modulus_range"],
    }
    from privmtl.flower._core import check_options
    from privmtl.flower.secagg import check_secagg_options

    check_options(run_config, kw["num_supernodes"])
    check_secagg_options(run_config, kw["num_supernodes"])
    out = run_local(
        num_supernodes=kw["num_supernodes"],
        run_config=run_config,
        state_dir=kw["state_dir"],
        timeout=kw["timeout"],
        progress=lambda line: click.echo(line, err=True),
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
