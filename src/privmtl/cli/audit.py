"""``privmtl audit``: an empirical lower bound on ε of one mechanism, through its real code;
``privmtl audit mediation``: every client's outputs depend on the others only through releases."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import click

from privmtl.audit import mediation as mediation_audit
from privmtl.audit.experiments import AUDIT_MECHANISMS, MUTATIONS, run_audit
from privmtl.cli import cli
from privmtl.cli._common import echo_json

__all__ = ["audit"]


@click.group(invoke_without_command=True)
@click.option(
    "--mechanism",
    type=click.Choice(list(AUDIT_MECHANISMS)),
    default=None,
    help="wishart / gaussian-covariance / nonprivate-mtl: one MP-MTL covariance release; "
    "pmtl-gaussian: one PMTL server release; pmtl-run: a whole PMTL training run with canaries.",
)
@click.option(
    "--epsilon",
    type=float,
    default=None,
    help="Claimed ε (the mechanism is planned for it). Required with --mechanism.",
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
@click.pass_context
def audit(
    ctx: click.Context,
    mechanism: str | None,
    epsilon: float | None,
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

    \b
    Sub-command:
      mediation  every client's outputs depend on the others only through recorded releases
    """
    if ctx.invoked_subcommand is not None:
        return
    if mechanism is None or epsilon is None:
        missing = "--mechanism" if mechanism is None else "--epsilon"
        raise click.UsageError(
            f"Missing option '{missing}' (or a sub-command: privmtl audit mediation)."
        )
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


def _run_command(argv: list[str]) -> dict[str, Any]:
    """Run one ``privmtl`` command in process with ``--json --quiet``; return its JSON object."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        cli.main(args=[*argv, "--json", "--quiet"], prog_name="privmtl", standalone_mode=False)
    lines = [line for line in buffer.getvalue().splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"privmtl {' '.join(argv)} printed no JSON object")
    out: dict[str, Any] = json.loads(lines[-1])
    return out


@audit.command()
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of data and runs.")
@click.option("--no-mutants", is_flag=True, help="Run the checks only.")
@click.option(
    "--only",
    multiple=True,
    help="Run only the checks whose name contains this text (repeatable).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def mediation(seed: int, no_mutants: bool, only: tuple[str, ...], as_json: bool) -> None:
    """Prove on the real code that every output is mediated by recorded releases.

    Every output path runs twice, on a small federation and on the same one with client c0's
    data replaced, the second run replaying the first run's releases; every other client's
    models, numbers and saved files must be bit-identical. Mutants that re-introduce known leaks
    (pooled selection, an MP-MTL step size from all tasks, an un-noised diagnostic) must each
    make a check fail. Exit code 0 only when every check holds and every mutant is caught.
    """
    out = mediation_audit.run_mediation_audit(
        _run_command, seed=seed, mutants=not no_mutants, only=list(only) or None
    )
    if as_json:
        echo_json(out)
    else:
        for check in out["checks"]:
            mark = "ok  " if check["ok"] else "FAIL"
            fix = f" [{check['mediated_by']}]" if check.get("mediated_by") else ""
            click.echo(f"{mark} {check['name']}: {check['detail']}{fix}")
        for mutant in out["mutant_results"]:
            mark = "caught" if mutant["caught"] else "MISSED"
            click.echo(f"{mark} mutant {mutant['name']}: {', '.join(mutant['failed_checks'])}")
        click.echo(
            f"{sum(bool(c['ok']) for c in out['checks'])}/{len(out['checks'])} checks hold, "
            f"{out['mutants_caught']}/{out['mutants']} mutants caught ({out['seconds']:.0f} s)"
        )
    if not out["ok"]:
        raise click.exceptions.Exit(1)
