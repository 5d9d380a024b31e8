"""``privmtl flower local``'s launcher process: ``python -m privmtl.cli.flower_run REQUEST``.

``privmtl flower local`` checks its options and computes the run's request
(:func:`privmtl.flower.launcher.launch_request`) with PyTorch and Flower loaded, then replaces
its own process with this module (:func:`privmtl.cli.flower.exec_launcher`): the process that
starts the SuperLink and the SuperNodes and waits for the run imports neither, so it holds the
memory of an interpreter, not that of a node. Once the deployment has stopped it prints the
result as the command does (:func:`privmtl.cli.flower.report_local`), with the same errors
(one line, exit code 2) and the same hint on Ctrl-C (exit code 130).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from privmtl import _timing
from privmtl.cli._common import (
    cli_terms,
    echo_final_models,
    echo_json,
    echo_run_privacy,
    to_jsonable,
)
from privmtl.exceptions import PrivmtlError
from privmtl.flower import deploy
from privmtl.gain import describe_gain
from privmtl.trust import sign

__all__ = ["main", "report_local"]


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def main(argv: list[str] | None = None) -> int:
    """Run the request (the one argument, JSON) and print its result; the exit code."""
    startup = _timing.process_seconds()  # since the command started (the process before exec)
    args = sys.argv[1:] if argv is None else argv
    request: dict[str, Any] = json.loads(args[0])
    output = dict(request.pop("output", {}))
    work = request["work_dir"]
    try:
        out = deploy.run_request(request, progress=None if output.get("quiet") else _say)
    except KeyboardInterrupt:
        _say(
            "privmtl: aborted; continue the run with the same command and "
            f"--work-dir {work} --resume"
        )
        return 130
    except PrivmtlError as exc:
        _say(f"privmtl: error: {_one_line(cli_terms(str(exc)))}")
        return 2
    except OSError as exc:
        if exc.filename is None:
            raise
        _say(f"privmtl: error: {_one_line(str(exc))}")
        return 2
    report_local(
        out, as_json=bool(output.get("as_json")), code=bool(output.get("code")), startup=startup
    )
    return 0


def report_local(out: dict[str, Any], *, as_json: bool, code: bool, startup: float | None) -> None:
    """Print a finished ``privmtl flower local`` run: its JSON (signed when it names code,
    ``code``, or carries a method's source) or its human lines; ``startup``: the seconds its
    process spent before the launch (added to its ``phases`` and ``seconds``)."""
    if startup is not None and "phases" in out:  # seconds: the command's wall time
        _timing.with_startup(out, startup)
    if as_json:
        echo_json(sign(to_jsonable(out)) if code or "method_source" in out else out)
        return
    _human(out)


def _human(out: dict[str, Any]) -> None:
    """The human lines of a finished ``privmtl flower local`` run."""
    click.echo(
        f"{out['method']} ({out['model']}) on {out['data']} via {out['engine']}: "
        f"m={out['num_clients']}, "
        f"q={out['clients_per_round']}, T={out['rounds']}, σ={out['noise_std']:.4g}"
    )
    click.echo(
        f"test accuracy (pooled) = {out['test_accuracy']:.4f}; mean client accuracy = "
        f"{out['mean_client_accuracy']:.4f}"
    )
    gain = describe_gain(out)
    if gain is not None:
        click.echo(gain)
    echo_final_models(out)
    if out.get("secure_aggregation"):
        sa = out["secure_aggregation"]
        click.echo(
            f"secure aggregation: {sa['protocol']}, {sa['clipping']} clipping, max quantization "
            f"error {sa['max_quantization_error']:.3g} per coordinate"
        )
    echo_run_privacy(out)
    click.echo(f"work directory: {out['work_dir']}")


if __name__ == "__main__":
    sys.exit(main())
