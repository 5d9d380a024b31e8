"""A path the system refuses (a name too long, ...) ends as one line; an OSError naming no path
is not the user's input and stays a traceback."""

from __future__ import annotations

import errno

import click
import pytest

from privmtl.cli import main
from privmtl.cli._common import run_cli

LONG = "a" * 300  # above NAME_MAX (255) of every common file system


def _one_error_line(capsys, args):
    code = main(args)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("privmtl: error:") and "File name too long" in lines[0], err
    return lines[0]


def test_a_data_path_with_a_name_too_long_is_one_line(capsys, tmp_path):
    path = tmp_path / f"{LONG}.csv"
    line = _one_error_line(
        capsys,
        ["pmtl", "--data", "table", "--data-path", str(path), "--client-column", "c",
         "--label-column", "y", "--rounds", "1"],
    )  # fmt: skip
    assert LONG in line


def test_a_checkpoint_dir_with_a_name_too_long_is_one_line(capsys, tmp_path):
    _one_error_line(
        capsys,
        ["pmtl", "--data", "synthetic", "--num-clients", "5", "--rounds", "1",
         "--checkpoint-dir", str(tmp_path / LONG)],
    )  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_an_os_error_naming_no_file_is_not_hidden():
    @click.group()
    def group():
        pass

    @group.command()
    def boom():
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(OSError, match="Input/output error"):
        run_cli(group, ["boom"])
