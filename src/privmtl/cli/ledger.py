"""``privmtl ledger PATH``: re-account a run's durable privacy ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from privmtl.checkpoint import ledger_seen
from privmtl.cli._common import echo_json
from privmtl.exceptions import DataFormatError
from privmtl.privacy.ledger import reaccount

__all__ = ["ledger"]


@click.command()
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--accountant",
    type=click.Choice(["rdp", "pld"]),
    help="Accountant to compose the recorded events with (default: the run's own).",
)
@click.option("--delta", type=float, help="δ of the reported ε (default: the run's own).")
@click.option(
    "--unauthenticated",
    is_flag=True,
    help="Re-account a ledger whose lines do not all carry this user's MAC (written by an older "
    "privmtl or another user, or edited), labelled as such; refused without it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def ledger(
    path: Path, accountant: str | None, delta: float | None, unauthenticated: bool, as_json: bool
) -> None:
    """Re-account the releases recorded in PATH (a checkpoint directory or a ledger.jsonl file).

    Prints ε after every release. Without --accountant the JSON also gives the other tight
    accountant's ε (rdp and pld side by side). The file is checked first: every entry's stated
    ε, index and sampling must be what its events compose to, and beside a checkpoint
    (manifest.json) the file must hold, byte for byte, the releases the checkpoint saw. A ledger
    that fails either check is refused (exit 2, naming what differs), never re-accounted, and so
    is a ledger that is not authenticated by this user's key unless --unauthenticated is given.
    A ledger without the closing line of a finished run is reported incomplete (``complete:
    false``): its releases and ε are then lower bounds.
    """
    if delta is not None and not 0 < delta < 1:
        raise click.BadParameter(f"must be in (0, 1); got {delta}", param_hint="--delta")
    run_dir = path if path.is_dir() else path.parent
    check: dict[str, Any] = {
        "seen": ledger_seen(run_dir),
        "seen_by": f"the checkpoint in {run_dir}",
    }
    out: dict[str, Any] = reaccount(path, accountant=accountant, delta=delta, **check)
    if not out["authenticated"] and not unauthenticated:
        raise DataFormatError(
            f"the ledger {path} is not authenticated: {out['authentication']}; refusing to report "
            "its epsilon (pass --unauthenticated to re-account what it says anyway)."
        )
    if accountant is None:
        other = "pld" if out["accountant"] == "rdp" else "rdp"
        out[f"epsilon_{other}"] = reaccount(path, accountant=other, delta=delta, **check)["epsilon"]
    if as_json:
        echo_json(out)
        return
    click.echo(
        f"{out['releases']} releases ({', '.join(out['mechanisms'])}), {out['relation']}, "
        f"δ={out['delta']:.3g}"
    )
    for i, eps in enumerate(out["per_release"]):
        click.echo(f"  release {i}: ε = {eps:.6g}" if eps is not None else f"  release {i}: ε = ∞")
    click.echo(f"ε = {out['epsilon']} ({out['accountant']})")
    for key in ("epsilon_rdp", "epsilon_pld"):
        if key in out:
            click.echo(f"ε = {out[key]} ({key.split('_')[1]})")
    if not out["authenticated"]:
        click.echo(
            f"not authenticated: {out['authentication']}; the ε above is only what the file says"
        )
    if out["complete"]:
        click.echo("complete: closed by its run")
    else:
        click.echo(
            f"incomplete: {out['incomplete']}: at least {out['releases']} releases; "
            f"ε ≥ {out['epsilon']} ({out['accountant']})"
        )
