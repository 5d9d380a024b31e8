"""The sub-commands are loaded through one table (``privmtl.cli._LAZY_COMMANDS``): each command's
module is imported when the command is resolved, and imports what it uses at its top."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import click

import privmtl.cli
from privmtl.cli import _LAZY_COMMANDS, cli, main

CLI_DIR = Path(privmtl.cli.__file__).parent


def test_the_table_names_each_command_by_module_and_attribute():
    ctx = click.Context(cli)
    for name, target in _LAZY_COMMANDS.items():
        module, sep, attr = target.partition(":")
        assert sep == ":" and module.startswith("privmtl.cli.") and attr, target
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command), target
        assert command.name == name, (name, command.name)
        assert cli.get_command(ctx, name) is command


def test_the_help_listing_names_exactly_the_tables_commands(capsys):
    """`privmtl --help` lists the commands from the group's docstring, without importing them:
    the listing and the table name the same commands, each once."""
    assert main(["--help"]) == 0
    page = capsys.readouterr().out
    listing = page.split("Families:", 1)[1].split("Options:", 1)[0]
    listed = re.findall(r"^ {4}(\w[\w-]*) {2,}\S", listing, flags=re.MULTILINE)
    assert sorted(listed) == sorted(_LAZY_COMMANDS)


def test_help_imports_no_command_module_nor_the_numerical_libraries():
    code = (
        "import contextlib, io, sys\n"
        "from privmtl.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    rc = main(['--help'])\n"
        "assert rc == 0 and 'pmtl-sweep' in out.getvalue(), out.getvalue()\n"
        "heavy = ('torch', 'scipy', 'dp_accounting', 'sklearn', 'pandas', 'flwr')\n"
        "print(sorted(m for m in sys.modules if m in heavy or m.startswith('privmtl.cli.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["['privmtl.cli._common']"], done.stderr


def _deferred(tree: ast.AST) -> list[str]:
    """Imports inside a function (at any depth), as written."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found += [
                f"{node.name}: {ast.unparse(inner)}"
                for inner in ast.walk(node)
                if isinstance(inner, ast.Import | ast.ImportFrom)
            ]
    return found


def test_the_command_modules_import_at_their_top():
    """The table is the CLI's one deferred import: no function of ``privmtl.cli`` imports."""
    found = {
        path.name: _deferred(ast.parse(path.read_text())) for path in sorted(CLI_DIR.glob("*.py"))
    }
    assert {k: v for k, v in found.items() if v} == {}
