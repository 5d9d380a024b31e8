"""The ``privmtl`` command line.

Every sub-command prints a human summary by default and exactly one JSON object on stdout with
``--json``. Invalid input exits with code 2 and a one-line ``privmtl: error: ...`` on stderr, without
a traceback and without leaving partial output files behind.
"""

from __future__ import annotations

import sys

import click

from privmtl import __version__
from privmtl.cli._common import run_cli
from privmtl.cli.account import account
from privmtl.cli.audit import audit
from privmtl.cli.demo import demo
from privmtl.cli.evaluate import evaluate
from privmtl.cli.ledger import ledger
from privmtl.cli.mpmtl import mpmtl, mpmtl_sweep
from privmtl.cli.pmtl import pmtl, pmtl_sweep

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="privmtl")
def cli() -> None:
    """Private multi-task learning with computed, recorded and checked privacy guarantees.

    \b
    Families:
      mpmtl        model-protected linear MTL (MP-MTL; Liang et al.) and baselines
      pmtl         private personalized federated learning (PMTL; Hu, Wu, Smith) and baselines
    Tools:
      account      (ε, δ) of a client-level Gaussian mechanism, or σ for a target ε
      demo         the quick tour: an MP-MTL ε sweep and a short PMTL run on built-in data
      ledger       re-account a run's durable privacy ledger (ε per release, rdp and pld)
      evaluate     reload models saved with --save-models and score them
      audit        empirical ε lower bound of a mechanism (canaries through the real code)
    """


cli.add_command(account)
cli.add_command(mpmtl)
cli.add_command(mpmtl_sweep)
cli.add_command(pmtl)
cli.add_command(pmtl_sweep)
cli.add_command(demo)
cli.add_command(ledger)
cli.add_command(evaluate)
cli.add_command(audit)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``privmtl`` script; returns the process exit code."""
    return run_cli(cli, sys.argv[1:] if argv is None else argv)
