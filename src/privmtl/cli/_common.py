"""Helpers shared by the CLI commands: error handling, JSON output (file I/O: :mod:`privmtl.io`)."""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path
from typing import Any

import click

from privmtl import _timing, _validation
from privmtl._progress import VERBOSE, get_verbosity, set_verbosity, summarize_warnings
from privmtl._progress import progress as _progress
from privmtl.exceptions import PrivmtlError, PrivmtlWarning
from privmtl.experiments.sweep import DEFAULT_VOTE_SHARE
from privmtl.io import atomic_output_dir, to_jsonable, write_json_atomic
from privmtl.locking import LOCK_NAME, is_stale_temporary

__all__ = [
    "atomic_output_dir",
    "check_save_dir",
    "echo_final_models",
    "echo_json",
    "name_options_in_errors",
    "number_list",
    "on_abort",
    "privacy_label",
    "progress",
    "row_for",
    "run_cli",
    "spread",
    "startup_seconds",
    "to_jsonable",
    "vote_share_option",
    "write_json_atomic",
]

_default_showwarning = warnings.showwarning

_abort_hint: list[str] = []
"""What the running command told :func:`on_abort` to say after Ctrl-C (last one wins)."""


def on_abort(hint: str) -> None:
    """Tell the user ``hint`` (how to continue) if the running command is interrupted (Ctrl-C)."""
    _abort_hint[:] = [hint]


_program_start: list[float] = []
"""The process's start on :data:`privmtl._timing.clock`, while :func:`run_cli` runs the program."""


def startup_seconds() -> float | None:
    """The seconds from the start of the process to now when the running command is the program
    (``privmtl ...``, ``python -m privmtl``), else ``None`` (a command called from Python, as the
    tests do, is not its process's start)."""
    return _timing.clock() - _program_start[0] if _program_start else None


def run_cli(group: click.Group, argv: list[str], *, program: bool = False) -> int:
    """Run ``group`` and turn user errors into one line on stderr with exit code 2.

    Numerical warnings (``RuntimeWarning``: NumPy overflow, a diverging fit) are collected and
    summed up in one line at the end; ``--verbose`` prints each distinct one instead. ``program``:
    ``argv`` is the process's own command line, so a run's time counts from the process's start
    (:func:`startup_seconds`).
    """
    age = _timing.process_seconds() if program else None
    _program_start[:] = [] if age is None else [_timing.clock() - age]

    level = get_verbosity()  # --quiet/--verbose hold for this run only
    _abort_hint.clear()
    numerical: list[tuple[str, str]] = []
    seen: set[tuple[str, str, int]] = set()

    def show(
        message: Any, category: Any, filename: str, lineno: int, *args: Any, **kw: Any
    ) -> None:
        if issubclass(category, PrivmtlWarning):
            click.echo(f"privmtl: warning: {_one_line(str(message))}", err=True)
        elif issubclass(category, RuntimeWarning):
            if get_verbosity() < VERBOSE:
                numerical.append((category.__name__, str(message)))
            elif (str(message), filename, lineno) not in seen:
                seen.add((str(message), filename, lineno))
                _default_showwarning(message, category, filename, lineno, *args, **kw)
        else:
            _default_showwarning(message, category, filename, lineno, *args, **kw)

    with warnings.catch_warnings():
        warnings.simplefilter("always", RuntimeWarning)  # counted, then summed up below
        warnings.simplefilter("once", PrivmtlWarning)  # repeated runs (sweeps): say it once
        warnings.showwarning = show
        try:
            return _run(group, argv)
        finally:
            line = summarize_warnings(numerical)
            if line is not None:
                click.echo(f"privmtl: warning: {line}", err=True)
            set_verbosity(level)
            _program_start.clear()


# click >= 8.2 raises this for a group called without arguments (click 8.1 prints the help itself)
_NO_ARGS_IS_HELP: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())


#: Sizes a run's command line names, checked against the machine's memory before the command's
#: module (and the numerical libraries it imports) is loaded, so that a run that cannot fit is
#: refused at once: the commands that take them, and option -> (parameter, bytes each, what).
#: The run checks the same bounds again where it allocates (:func:`privmtl._validation.check_memory`).
UPFRONT_COMMANDS = (("pmtl",), ("pmtl-sweep",), ("flower", "local"))
UPFRONT_SIZES = {"--num-clients": ("num_clients", "clients"), "--rounds": ("rounds", "rounds")}


def check_sizes_upfront(argv: list[str]) -> None:
    """Refuse (click's usage error, one line) a ``--num-clients`` or ``--rounds`` of a run
    command whose memory exceeds the machine's; a value that is not an integer is left to the
    command's own parsing."""
    command = next((c for c in UPFRONT_COMMANDS if tuple(argv[: len(c)]) == c), None)
    if command is None:
        return
    args = argv[len(command) :]
    for i, arg in enumerate(args):
        option, eq, value = arg.partition("=")
        if option not in UPFRONT_SIZES:
            continue
        given = value if eq else (args[i + 1] if i + 1 < len(args) else "")
        try:
            count = int(given)
        except ValueError:
            continue
        name, what = UPFRONT_SIZES[option]
        each = _validation.CLIENT_BYTES if name == "num_clients" else _validation.ROUND_BYTES
        try:
            _validation.check_memory(name, count, each, what)
        except PrivmtlError as exc:
            raise click.BadParameter(str(exc), param_hint=f"'{option}'") from None


def _run(group: click.Group, argv: list[str]) -> int:
    try:
        check_sizes_upfront(argv)
        # Without standalone mode click returns the code of a command's ``Exit(code)``.
        code = group.main(args=argv, prog_name="privmtl", standalone_mode=False)
    except click.exceptions.Exit as exc:  # --help, --version
        return int(exc.exit_code or 0)
    except _NO_ARGS_IS_HELP as exc:  # bare `privmtl` (or `privmtl flower`): usage, exit 0
        ctx = getattr(exc, "ctx", None)
        click.echo(ctx.get_help() if ctx is not None else exc.format_message())
        return 0
    except click.exceptions.Abort:  # Ctrl-C
        hint = f"; {_abort_hint[0]}" if _abort_hint else ""
        click.echo(f"privmtl: aborted{hint}", err=True)
        return 130
    except click.ClickException as exc:  # usage errors: bad option values, missing options
        click.echo(f"privmtl: error: {_one_line(exc.format_message())}", err=True)
        return 2
    except PrivmtlError as exc:  # invalid parameters, malformed data, budget refusals
        click.echo(f"privmtl: error: {_one_line(cli_terms(str(exc)))}", err=True)
        return 2
    except OSError as exc:
        # a path the system refused (missing, not allowed, a name too long, a directory, ...):
        # the user's input; an OSError naming no file (a socket, a device) is not, and stays a
        # traceback
        if exc.filename is None:
            raise
        click.echo(f"privmtl: error: {_one_line(str(exc))}", err=True)
        return 2
    return code if isinstance(code, int) and not isinstance(code, bool) else 0


_PYTHON_AND_FLAG = re.compile(r"\b\w+=(?:True|False|None|'[^']*'|\"[^\"]*\"|[\w.]+) \((--[\w-]+)\)")
"""A library message's advice in both languages, e.g. ``resume=True (--resume)``."""


def cli_terms(message: str) -> str:
    """``message`` as a command-line user reads it: advice the library gives in both languages
    (``pass resume=True (--resume)``) keeps the flag only (``pass --resume``)."""
    return _PYTHON_AND_FLAG.sub(r"\1", message)


_PARAMETER_ERROR = re.compile(r"The '(\w+)' parameter ")
"""How :mod:`privmtl._validation` messages name the parameter they refuse."""

_GIVEN_SOURCES = (
    click.core.ParameterSource.COMMANDLINE,
    click.core.ParameterSource.ENVIRONMENT,
    click.core.ParameterSource.DEFAULT_MAP,
)


def name_options_in_errors(command: click.Command) -> None:
    """Make ``command`` name the option behind a refused parameter, as click's own errors do.

    The library checks its parameters by their Python names (``The 'epsilon' parameter must
    be ...``). When such an error names a parameter the user gave as one of ``command``'s options,
    it is re-raised as that option's usage error (``Invalid value for '--epsilon': The 'epsilon'
    parameter must be ...``), so the user sees which flag to change. Errors about parameters the
    command line did not give (derived values, other options' names) pass unchanged.
    """
    original = command.invoke

    def invoke(ctx: click.Context) -> Any:
        try:
            return original(ctx)
        except PrivmtlError as exc:
            match = _PARAMETER_ERROR.match(str(exc))
            option = next(
                (
                    p
                    for p in ctx.command.params
                    if match is not None
                    and isinstance(p, click.Option)
                    and p.name == match.group(1)
                    and ctx.get_parameter_source(p.name) in _GIVEN_SOURCES
                ),
                None,
            )
            if option is None:
                raise
            flag = next((o for o in option.opts if o.startswith("--")), option.opts[0])
            raise click.BadParameter(str(exc), ctx=ctx, param_hint=f"'{flag}'") from exc

    command.invoke = invoke  # type: ignore[method-assign]


def number_list(
    text: str, flag: str, *, integer: bool = False, low: float | None = None, open_low: bool = False
) -> list[Any]:
    """The comma-separated numbers of option ``flag`` (a grid of a sweep, a list of seeds).

    At least one number; each finite, at least ``low`` (above it with ``open_low``) and, with
    ``integer``, a whole number (returned as ``int``: ``2.5`` is refused, never rounded).
    Anything else is a usage error naming ``flag``, the rule and the text given.
    """
    rule = "integers" if integer else "numbers"
    if low is not None:
        rule += f" {'>' if open_low else '>='} {low:g}"
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    ok = bool(values) and all(
        math.isfinite(v)
        and (not integer or v == int(v))
        and (low is None or (v > low if open_low else v >= low))
        for v in values
    )
    if not ok:
        raise click.BadParameter(
            f"must be one or more comma-separated finite {rule}; got {text!r}", param_hint=flag
        )
    return [int(v) for v in values] if integer else values


def check_save_dir(path: Any, *, overwrite: bool, flag: str = "--save-models") -> None:
    """Refuse (usage error, before any computation) a non-empty ``path`` unless ``overwrite``.

    A folder of saved models is what ``privmtl evaluate`` and the model's guarantee refer to:
    writing a second run into it silently would mix or replace the first run's files. privmtl's
    lock file ``.privmtl.lock`` and its temporary files left by a killed write
    (``.privmtl-*.tmp``, :mod:`privmtl.locking`) do not count; other tools' files do.
    """
    if path is None or overwrite:
        return
    folder = Path(path)
    if folder.is_dir():
        # the lock file and the temporaries of a killed write are not models (the run that
        # takes the folder's lock removes the latter)
        entries = sorted(
            p.name
            for p in folder.iterdir()
            if p.name != LOCK_NAME and not is_stale_temporary(p.name)
        )
        if entries:
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise click.BadParameter(
                f"{str(folder)!r} is not empty ({shown}); choose a new or empty folder, or pass "
                "--overwrite to replace the models in it",
                param_hint=flag,
            )


def abort_hint_for_checkpoint(checkpoint_dir: Any, *, option: str = "--checkpoint-dir") -> None:
    """Register what Ctrl-C should say: resume from ``checkpoint_dir``, or how to make it resumable."""
    if checkpoint_dir is not None:
        on_abort(
            f"the run is checkpointed in {checkpoint_dir}: run the same command with --resume "
            "to continue it"
        )
    else:
        on_abort(f"no checkpoint was kept; {option} DIR makes a run resumable (--resume)")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def echo_json(payload: dict[str, Any]) -> None:
    """Print exactly one JSON object on stdout."""
    click.echo(json.dumps(to_jsonable(payload), indent=None, sort_keys=False))


def progress(iterable: Any, *, desc: str, enabled: bool, total: int | None = None) -> Any:
    """Report finished runs on stderr: a bar on a terminal, a line per run in logs and pipes."""
    return _progress(iterable, desc=desc, total=total, enabled=enabled, unit="run", every=1)


def spread(row: dict[str, Any]) -> str:
    """' ± std (n seeds)' of a summary row, or ' (1 seed)': one run has no spread to show."""
    n = int(row.get("n", 1))
    return f" ± {row['std']:.4f} ({n} seeds)" if n > 1 else " (1 seed)"


def privacy_label(row: dict[str, Any]) -> str:
    """The full guarantee of one result row, for a printed table.

    Private rows: ε, δ, neighbouring relation, sampling, accountant and noise source; rows that add
    no noise say so ("non-private", or ε = 0 when nothing leaves a task or client).
    """
    g = row.get("guarantee") or {}

    def get(key: str) -> Any:
        return row[key] if row.get(key) is not None else g.get(key)

    eps = get("epsilon")
    if g.get("private") is False or eps is None or eps == float("inf"):
        return "non-private (no noise)"
    if eps == 0:
        return "ε=0: nothing shared (no noise)"
    return (
        f"ε={eps:.3g}, δ={get('delta'):.2g}, {get('relation')}, sampling {get('sampling')}, "
        f"{get('accountant')}, noise {get('noise_source')}"
    )


def row_for(rows: list[dict[str, Any]], summary_row: dict[str, Any]) -> dict[str, Any]:
    """The first result row of a summary row's (method, target ε) group (its guarantee)."""
    key = (summary_row["method"], summary_row.get("target_epsilon"))
    return next(
        (r for r in rows if (r["method"], r.get("target_epsilon")) == key), dict(summary_row)
    )


#: ``--vote-share`` of both sweeps: the share of a point's ε that the client (task) vote spends.
vote_share_option = click.option(
    "--vote-share",
    type=click.FloatRange(min=0.0, max=1.0, min_open=True),
    default=DEFAULT_VOTE_SHARE,
    show_default=True,
    help="With --select vote: the vote alone is (share × ε, δ)-DP.",
)


def echo_run_privacy(out: dict[str, Any]) -> None:
    """Print a federated run's privacy lines: its guarantee's summary, where its noise came
    from, where a budget stopped it, and the folder of its models (``privmtl pmtl`` and
    ``privmtl flower local`` alike)."""
    click.echo(f"privacy: {out['summary']}")
    noisy = bool(out.get("noise_std"))
    click.echo(f"noise source: {out.get('noise_source') if noisy else 'none (no noise added)'}")
    if out.get("stopped_on_budget"):
        click.echo(
            f"stopped on budget after {out['rounds_run']} of {out['rounds']} rounds "
            f"(ε spent {out['epsilon']:.4g})"
        )
    if out.get("models_dir"):
        click.echo(f"models: {out['models_dir']}")


def echo_final_models(out: dict[str, Any], *, recorded: bool = False) -> None:
    """Print which model the clients ended the run with and what the shared model alone scores.

    ``out`` is a run's result (or :func:`~privmtl.experiments.pmtl.evaluate_saved`'s): its
    ``end_of_run`` (``recorded``: read back from the saved run) and the released global model's
    ``global_test_accuracy`` / ``global_mean_client_accuracy``, printed where it has a global
    model (methods that release nothing have none).
    """
    if out.get("end_of_run"):
        when = "end of run (recorded at training)" if recorded else "end of run"
        click.echo(f"{when}: {out['end_of_run']}")
    pooled, mean = out.get("global_test_accuracy"), out.get("global_mean_client_accuracy")
    if pooled is None or mean is None:
        return
    partial = (
        " (its shared layers; the others at their initial values)"
        if out.get("shared_params")
        else ""
    )
    click.echo(
        f"shared model alone (the released global model{partial}, scored on each client's own "
        f"test data): test accuracy (pooled) = {pooled:.4f}; mean client accuracy = {mean:.4f}"
    )
