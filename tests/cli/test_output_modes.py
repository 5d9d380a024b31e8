"""Every method in every output mode; the output flags before and after the command."""

from __future__ import annotations

import json

import pytest

from privmtl.cli import main
from privmtl.experiments.pmtl import FL_METHODS

TINY = ["--data", "synthetic", "--num-clients", "8", "--rounds", "2", "--clients-per-round", "4"]
TINY += ["--model", "logreg", "--reproducible-noise", "--finetune", "none"]


def _args(method: str) -> list[str]:
    private = method not in ("local", "local-all")
    # fedrep needs a representation: a one-layer logreg shares its weight, the bias is the head
    rep = ["--shared-params", "linear.weight"] if method == "fedrep" else []
    return ["pmtl", *TINY, "--method", method, *rep, *(["--epsilon", "5"] if private else [])]


@pytest.mark.parametrize("method", FL_METHODS)
@pytest.mark.parametrize("as_json", [False, True], ids=["human", "json"])
def test_every_pmtl_method_in_every_output_mode(capsys, method, as_json):
    rc = main(_args(method) + (["--json"] if as_json else []))
    out, err = capsys.readouterr()
    assert rc == 0, err
    if as_json:
        payload = json.loads(out)  # exactly one JSON object
        assert payload["method"] == method
    else:
        assert out.startswith(f"{method} (logreg) on synthetic")
        assert "privacy: " in out and "None" not in out
        assert "noise source: " in out


def test_bare_privmtl_prints_usage_and_exits_0(capsys):
    assert main([]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.startswith("Usage: privmtl")
    assert len(out.splitlines()) >= 5
    assert "pmtl-sweep" in out


@pytest.mark.parametrize(
    "argv", [["flower", "local", "--quiet", "--help"], ["--quiet", "flower", "local", "--help"]]
)
def test_flower_takes_the_output_flags(capsys, argv):
    assert main(argv) == 0
    assert "Usage: privmtl flower local" in capsys.readouterr().out


def test_every_command_takes_the_output_flags():
    import click

    from privmtl.cli import _LAZY_COMMANDS, cli

    ctx = click.Context(cli)
    for name in _LAZY_COMMANDS:
        command = cli.get_command(ctx, name)
        assert command is not None
        commands = [command]
        if isinstance(command, click.Group):
            commands += list(command.commands.values())
        for cmd in commands:
            opts = {o for p in cmd.params for o in getattr(p, "opts", ())}
            assert {"--quiet", "--verbose", "--json"} <= opts, (name, cmd.name)


ACCOUNT = ["--clip", "1", "--num-clients", "100", "--clients-per-round", "10", "--rounds", "5"]
ACCOUNT += ["--delta", "1e-5", "--noise-std", "1"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--json", "account", *ACCOUNT],
        ["account", *ACCOUNT, "--json"],
        ["--quiet", "--json", "account", *ACCOUNT],
        ["-q", "account", *ACCOUNT, "--json", "--verbose"],
    ],
)
def test_json_before_or_after_the_command(capsys, argv):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["noise_std"] == 1.0


def test_quiet_before_the_command_silences_progress(capsys):
    assert main(["--quiet", *_args("fedavg")]) == 0
    assert "pmtl:" not in capsys.readouterr().err
    assert main(["--json", *_args("fedavg")]) == 0
    json.loads(capsys.readouterr().out)
    assert main(_args("fedavg")) == 0  # the flags of one call do not leak into the next
    out = capsys.readouterr().out
    assert out.startswith("fedavg (logreg)")
