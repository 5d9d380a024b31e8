"""Write the CLI reference page (``cli.md``) from the ``--help`` of every ``privmtl`` command.

The page is generated at every documentation build (``conf.py`` calls :func:`write_cli_page`), so
it always shows the options of the installed code. Each command's help is what ``privmtl ...
--help`` prints, produced by invoking the real click command in process.
"""

from __future__ import annotations

from pathlib import Path

import click
from click.testing import CliRunner

#: Width of the rendered help text, in characters (the CLI's own ``max_content_width``).
HELP_WIDTH = 100


def _commands(group: click.Group, path: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Every command path under ``group`` (groups first, then their sub-commands), sorted."""
    ctx = click.Context(group, info_name=" ".join(("privmtl", *path)))
    found: list[tuple[str, ...]] = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None:
            continue
        found.append((*path, name))
        if isinstance(command, click.Group):
            found += _commands(command, (*path, name))
    return found


def _help(cli: click.Group, path: tuple[str, ...]) -> str:
    """What ``privmtl PATH --help`` prints."""
    result = CliRunner().invoke(
        cli, [*path, "--help"], prog_name="privmtl", terminal_width=HELP_WIDTH
    )
    if result.exit_code != 0:
        raise RuntimeError(
            f"`privmtl {' '.join(path)} --help` exited {result.exit_code}: {result.output}"
        )
    return result.output.rstrip()


def render() -> str:
    """The Markdown of the CLI reference page."""
    from privmtl.cli import cli

    lines = [
        "# Command-line reference",
        "",
        "Generated from the commands themselves at every documentation build: each section is "
        "what `privmtl ... --help` prints. Every command takes `--quiet`, `--verbose` and "
        "`--json` before or after its name; invalid input exits with code 2 and one line "
        "naming the option.",
        "",
    ]
    paths: list[tuple[str, ...]] = [(), *_commands(cli, ())]
    for path in paths:
        title = " ".join(("privmtl", *path))
        lines += [f"## `{title}`", "", "```text", _help(cli, path), "```", ""]
    return "\n".join(lines)


def write_cli_page(out: Path) -> None:
    """Write the page to ``out`` unless it already holds the same text (no needless rebuild)."""
    text = render()
    if not out.exists() or out.read_text() != text:
        out.write_text(text)


if __name__ == "__main__":
    write_cli_page(Path(__file__).resolve().parent / "cli.md")
