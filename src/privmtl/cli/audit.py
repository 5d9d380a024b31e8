"""``privmtl audit``: an empirical lower bound on ε of one mechanism, through its real code."""

from __future__ import annotations

import click

from privmtl.audit.experiments import AUDIT_MECHANISMS, MUTATIONS, run_audit
from privmtl.cli._common import echo_json

__all__ = ["audit"]


@click.command()
@click.option(
    "--mechanism",
    type=click.Choice(list(AUDIT_MECHANISMS)),
    required=True,
    help="wishart / gaussian-covariance / nonprivate-mtl: one MP-MTL covariance release; "
    "pmtl-gaussian: one PMTL server release; pmtl-run: a whole PMTL training run with canaries.",
)
@click.option(
    "--epsilon", type=float, required=True, help="Claimed ε (the mechanism is planned for it)."
)
@click.option("--delta", type=float, default=1e-5, show_default=True, help="Claimed δ.")
@click.option(
    "--trials",
    type=int,
    default=None,
    help="Releases (half per neighbour), or canaries for pmtl-run [default: per mechanism].",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Public seed of the inputs.")
@click.option(
    "--confidence", type=float, default=0.95, show_default=True, help="Confidence of the bound."
)
@click.option(
    "--mutation",
    type=click.Choice(list(MUTATIONS)),
    default="none",
    show_default=True,
    help="Audit a deliberately broken build: noise std / 4, clipping skipped, or noise seeded "
    "from the public seed (the auditor removes it).",
)
@click.option(
    "--reproducible-noise",
    is_flag=True,
    help="Audit the seeded noise source (simulation) instead of secure noise.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def audit(
    mechanism: str,
    epsilon: float,
    delta: float,
    trials: int | None,
    seed: int,
    confidence: float,
    mutation: str,
    reproducible_noise: bool,
    as_json: bool,
) -> None:
    """Lower-bound ε of a mechanism by distinguishing neighbouring inputs from its releases.

    Worst-case canaries (a client update or task model at the clip norm vs nothing) are released
    through the library's own code; a lower bound above the claimed ε (violation) proves, at the
    stated confidence, that the claim is false. A bound below it does not prove the claim.
    """
    out = run_audit(
        mechanism,
        epsilon=epsilon,
        delta=delta,
        trials=trials,
        seed=seed,
        confidence=confidence,
        mutation=mutation,
        noise="seeded" if reproducible_noise else "secure",
    )
    if as_json:
        echo_json(out)
        return
    verdict = "VIOLATION" if out["violation"] else "no violation found"
    click.echo(
        f"{mechanism}: claimed ({out['claimed_epsilon']:g}, {out['claimed_delta']:g})-DP "
        f"[{out['relation']}]; empirical ε ≥ {out['epsilon_lower_bound']:.3f} with "
        f"{out['confidence']:.0%} confidence from {out['trials']} trials "
        f"({out['seconds']:.1f} s): {verdict}"
    )
    click.echo(f"canary: {out['canary']}")
    click.echo(f"score: {out['score']}; analysis: {out['analysis']}")
    click.echo(f"noise source: {out['noise_source']}; mutation: {out['mutation']}")
    if "note" in out:
        click.echo(f"note: {out['note']}")
