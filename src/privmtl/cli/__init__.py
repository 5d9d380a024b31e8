"""The ``privmtl`` command line.

Every sub-command prints a human summary by default and exactly one JSON object on stdout with
``--json``. Invalid input exits with code 2 and a one-line ``privmtl: error: ...`` on stderr, without
a traceback and without leaving partial output files behind.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from privmtl import __version__
from privmtl._progress import QUIET, VERBOSE, get_verbosity, set_verbosity
from privmtl.cli._common import name_options_in_errors, run_cli

__all__ = ["cli", "main"]

#: The sub-commands, each by ``"module:attribute"`` of its click command: the one place where the
#: CLI defers an import. A command's module is imported when the command is resolved (run, or its
#: own --help), never when the group is built, so `privmtl --help` and the up-front checks
#: (:func:`~privmtl.cli._common.check_sizes_upfront`) load neither PyTorch, SciPy nor the
#: accountant. The command modules import everything they use at their top. The listing in
#: `privmtl --help` is the group's docstring below (it names exactly these commands).
_LAZY_COMMANDS = {
    "account": "privmtl.cli.account:account",
    "flower": "privmtl.cli.flower:flower",
    "mpmtl": "privmtl.cli.mpmtl:mpmtl",
    "mpmtl-sweep": "privmtl.cli.mpmtl:mpmtl_sweep",
    "pmtl": "privmtl.cli.pmtl:pmtl",
    "pmtl-sweep": "privmtl.cli.pmtl:pmtl_sweep",
    "demo": "privmtl.cli.demo:demo",
    "ledger": "privmtl.cli.ledger:ledger",
    "evaluate": "privmtl.cli.evaluate:evaluate",
    "report": "privmtl.cli.report:report",
    "audit": "privmtl.cli.audit:audit",
}


class _LazyGroup(click.Group):
    """A click group that imports a sub-command's module only when that command is resolved
    (click's lazy loading of sub-commands): ``lazy`` maps a name to ``"module:attribute"``."""

    def __init__(self, *args: Any, lazy: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = dict(lazy)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        _add_output_options(cmd)
        super().add_command(cmd, name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self._lazy:
            module, _, attr = self._lazy[cmd_name].partition(":")
            command = getattr(importlib.import_module(module), attr)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # The docstring lists the commands; importing them all to print it would defeat laziness.
        return None


_JSON_KEY = "privmtl.json"
"""``ctx.meta`` key: ``--json`` was given before the sub-command (``ctx.meta`` is shared)."""


def _set_verbosity(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        set_verbosity(QUIET if param.name in ("_quiet", "quiet") else VERBOSE)
    return value


def _set_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        ctx.meta[_JSON_KEY] = True
    return value


def _own_flag(callback: Any, kind: str) -> Any:
    """Wrap the callback of a command's own ``--quiet``/``--json`` so the group's flag counts too."""

    def merged(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if callback is not None:
            value = callback(ctx, param, value)
        if kind == "json":
            return bool(value) or bool(ctx.meta.get(_JSON_KEY))
        if value:
            set_verbosity(QUIET)
        return bool(value) or get_verbosity() == QUIET

    return merged


def _add_output_options(command: click.Command) -> None:
    """Give ``command`` (and, for a group, each of its commands) the output options.

    ``--quiet`` and ``--verbose`` set the process-wide verbosity; ``--json`` is added where the
    command lacks it only if it is a group (sub-commands print their own JSON). A command's own
    ``--quiet``/``--json`` also turn on when the flag was given before the sub-command.
    """
    if isinstance(command, click.Group):
        original = command.add_command

        def add_command(cmd: click.Command, name: str | None = None) -> None:
            _add_output_options(cmd)
            original(cmd, name)

        command.add_command = add_command  # type: ignore[method-assign]
        for sub in command.commands.values():
            _add_output_options(sub)
    if getattr(command, "_privmtl_output_options", False):
        return
    command._privmtl_output_options = True  # type: ignore[attr-defined]
    name_options_in_errors(command)
    by_flag = {opt: p for p in command.params for opt in getattr(p, "opts", ())}
    for flag, name, text in (
        ("--quiet", "_quiet", "No progress output."),
        ("--verbose", "_verbose", "A progress line per step in logs; warnings in full."),
    ):
        if flag not in by_flag:
            command.params.append(
                click.Option(
                    [flag, name],
                    is_flag=True,
                    expose_value=False,
                    is_eager=True,
                    callback=_set_verbosity,
                    help=text,
                )
            )
    own_quiet = by_flag.get("--quiet")
    if own_quiet is not None and own_quiet.expose_value:
        own_quiet.callback = _own_flag(own_quiet.callback, "quiet")
    own_json = by_flag.get("--json")
    if own_json is not None:
        own_json.callback = _own_flag(own_json.callback, "json")
    elif isinstance(command, click.Group):
        command.params.append(
            click.Option(
                ["--json", "_json"],
                is_flag=True,
                expose_value=False,
                callback=_set_json,
                help="Print one JSON object (also accepted after the command).",
            )
        )


@click.group(
    cls=_LazyGroup,
    lazy=_LAZY_COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="privmtl")
@click.option(
    "-q",
    "--quiet",
    "_quiet",
    is_flag=True,
    expose_value=False,
    callback=_set_verbosity,
    help="No progress output (also accepted after the command).",
)
@click.option(
    "-v",
    "--verbose",
    "_verbose",
    is_flag=True,
    expose_value=False,
    callback=_set_verbosity,
    help="A progress line per step in logs; warnings in full (also after the command).",
)
@click.option(
    "--json",
    "_json",
    is_flag=True,
    expose_value=False,
    callback=_set_json,
    help="Print one JSON object on stdout (also accepted after the command).",
)
def cli() -> None:
    """Private multi-task learning with computed, recorded and checked privacy guarantees.

    \b
    Families:
      mpmtl        model-protected linear MTL (MP-MTL; Liang et al.) and baselines
      mpmtl-sweep  an ε sweep of mpmtl methods: CSV/JSON table and plots
      pmtl         private personalized federated learning (PMTL; Hu, Wu, Smith) and baselines
      pmtl-sweep   an ε sweep of pmtl methods: CSV/JSON table and plots
    Tools:
      account      (ε, δ) of a client-level Gaussian mechanism, or σ for a target ε
      demo         the quick tour: an MP-MTL ε sweep and a short PMTL run on built-in data
      ledger       re-account a run's durable privacy ledger (ε per release, rdp and pld)
      evaluate     reload models saved with --save-models and score them
      report       one self-contained HTML page of a result or a saved folder
      audit        empirical ε lower bound of a mechanism (canaries through the real code);
                   audit mediation: every output depends on others only through releases
      flower       PMTL on Flower's Deployment Engine (extra: privmtl[flower])
    """


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``privmtl`` script; returns the process exit code."""
    if argv is None:  # the process's own command line: its time counts from the process's start
        return run_cli(cli, sys.argv[1:], program=True)
    return run_cli(cli, argv)
