"""``privmtl account``: ε of the PMTL server mechanism for a σ, or σ for a target ε."""

from __future__ import annotations

import click

from privmtl.cli._common import echo_json
from privmtl.experiments.accounting import account_rounds
from privmtl.federated.spec import NOISE_MECHANISMS, SPEC
from privmtl.privacy.guarantee import RELATIONS, SAMPLINGS

__all__ = ["account"]


@click.command()
@click.option("--noise-std", type=float, help="σ: std of the noise added to the mean update.")
@click.option("--target-epsilon", type=float, help="Solve for the σ that meets this ε.")
@click.option("--clip", type=float, required=True, help="γ: ℓ2 bound on each client update.")
@click.option("--num-clients", type=int, required=True, help="m: number of clients.")
@click.option(
    "--clients-per-round",
    type=int,
    help="q: clients per round (required, except with --sampling cyclic: ceil(m / groups)).",
)
@click.option("--rounds", type=int, required=True, help="T: communication rounds.")
@click.option("--delta", type=float, required=True, help="δ of the guarantee.")
@click.option(
    "--accountant",
    type=click.Choice(["rdp", "pld", "paper"]),
    default=SPEC.accountant,
    show_default=True,
    help="rdp/pld: dp-accounting; paper: PMTL Thm 1 (q = m) or the reference code's RDP (q < m).",
)
@click.option(
    "--sampling",
    type=click.Choice([s for s in SAMPLINGS if s in ("poisson", "fixed", "cyclic")]),
    default=SPEC.sampling,
    show_default=True,
    help="Client sampling performed (and accounted); cyclic: --groups public groups in turn.",
)
@click.option(
    "--groups",
    type=int,
    default=SPEC.groups,
    show_default=True,
    help="The groups of --sampling cyclic (client k in group k mod groups).",
)
@click.option(
    "--noise-mechanism",
    type=click.Choice(list(NOISE_MECHANISMS)),
    default=SPEC.noise_mechanism,
    show_default=True,
    help="banded: matrix-factorization noise, the whole run one Gaussian mechanism (needs "
    "--sampling cyclic or --clients-per-round m).",
)
@click.option(
    "--relation",
    type=click.Choice(list(RELATIONS)),
    default=SPEC.relation,
    show_default=True,
    help="Neighbouring relation: one whole client added/removed, or replaced.",
)
@click.option("--per-round", is_flag=True, help="Also report ε after every round.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def account(
    noise_std: float | None,
    target_epsilon: float | None,
    clip: float,
    num_clients: int,
    clients_per_round: int | None,
    rounds: int,
    delta: float,
    accountant: str,
    sampling: str,
    relation: str,
    groups: int,
    noise_mechanism: str,
    per_round: bool,
    as_json: bool,
) -> None:
    """Client-level (ε, δ) of T rounds of 'mean of q clipped updates + N(0, σ²I)'."""
    out = account_rounds(
        clip=clip,
        num_clients=num_clients,
        clients_per_round=clients_per_round,
        rounds=rounds,
        delta=delta,
        noise_std=noise_std,
        target_epsilon=target_epsilon,
        accountant=accountant,
        sampling=sampling,
        relation=relation,
        per_round=per_round,
        groups=groups,
        noise_mechanism=noise_mechanism,
    )
    if as_json:
        echo_json(out)
        return
    click.echo(out["summary"])
    click.echo(
        f"noise std σ = {out['noise_std']:.6g} on the mean update; noise multiplier "
        f"z = σ·q/γ = {out['noise_multiplier']:.6g}"
    )
    for note in out["guarantee"]["notes"]:
        click.echo(f"note: {note}")
