"""Check and prepare a PMTL run on Flower, then deploy it: :func:`run_local` starts a SuperLink and
N SuperNodes on loopback and returns the run's result; :func:`launch_request` prepares the same
deployment for ``privmtl flower local``'s waiting process (:mod:`privmtl.flower.deploy`, which
loads no numerical library).

Every process is started in its own process group (each SuperNode runs its ClientApp process
as a child, see :mod:`privmtl.flower.node`) and the whole group is terminated, then killed after
a bounded wait, on success, on failure and on Ctrl-C. All traffic stays on ``127.0.0.1`` with
insecure (plain HTTP) transport: for a real deployment across machines use TLS and node
authentication (docs/flower.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from privmtl import _timing
from privmtl.exceptions import InvalidParameterError
from privmtl.flower._core import run_options
from privmtl.flower.deploy import (
    FlowerRunError,
    app_run_config,
    check_work_dir,
    run_prepared,
    run_request,
    supernode_command,
    toml_value,
    with_launch,
    write_app_dir,
)
from privmtl.flower.factory import announce
from privmtl.flower.run_info import default_work_dir
from privmtl.locking import hold_directory

__all__ = [
    "FlowerRunError",
    "app_config",
    "check_work_dir",
    "launch_request",
    "run_local",
    "run_request",
    "write_app",
]


def app_config(run_config: dict[str, Any]) -> dict[str, str]:
    """The Flower app's run configuration: every key of ``run_config`` with the Flower run's
    defaults of what was not given (RunSpec names accepted, None as "not given"), as TOML
    values."""
    return {k: toml_value(v) for k, v in run_options(run_config).items()}


def write_app(
    directory: Path, run_config: dict[str, Any], *, config: dict[str, str] | None = None
) -> Path:
    """Write the Flower app directory (a ``pyproject.toml`` naming privmtl's apps) of
    ``run_config``; ``config``: its :func:`app_config`, when computed already."""
    return write_app_dir(directory, app_config(run_config) if config is None else config)


def run_local(
    *,
    num_supernodes: int,
    run_config: dict[str, Any],
    state_dir: str | Path | None = None,
    work_dir: str | Path | None = None,
    timeout: float = 900.0,
    progress: Callable[[str], None] | None = None,
    on_started: Callable[[list[int]], None] | None = None,
    node_configs: Sequence[dict[str, Any]] | None = None,
    save_models: str | Path | None = None,
) -> dict[str, Any]:
    """Run PMTL on a SuperLink and ``num_supernodes`` SuperNodes started on loopback.

    Parameters
    ----------
    num_supernodes : int
        SuperNodes to start; node ``i`` serves partition ``i`` of the clients.
    run_config : dict
        Run configuration (keys of :data:`privmtl.flower._core.RUN_DEFAULTS`). A user's model
        factory (``model`` ``MODULE:FACTORY`` / ``PATH.py:FACTORY``) is loaded here first and
        resolves against ``model-dir`` (default: the working directory), which the apps are given
        with the SHA-256 of its file (:func:`privmtl.flower.factory.announce`): every SuperNode
        and the ServerApp load their own copy and refuse another version.
    state_dir : path, optional
        Root of the nodes' own storage (``node-<i>/personal/``); default ``work_dir/nodes``.
    work_dir : path, optional
        The run's durable directory (default: a new
        :func:`~privmtl.flower.run_info.default_work_dir`; it is never deleted). ``server/``: the
        write-ahead ledger ``ledger.jsonl``, the checkpoint, ``run.json``, ``billboards.pt`` and
        ``result.json``; ``nodes/node-<i>/``: each SuperNode's storage (personalized models, data
        cache); ``logs/<time>/``: every process's output; ``app/`` and ``flwr-home/``: the Flower
        app and CLI configuration. A second run in the same directory continues the personalized
        models and the ledger; ``resume`` in ``run_config`` continues a run that did not finish.
    timeout : float
        Seconds the whole run may take.
    progress : callable, optional
        Receives each progress line of the ServerApp.
    on_started : callable, optional
        Receives the SuperNodes' process ids once they run (tests kill one through it).
    node_configs : sequence of dict, optional
        More node configuration of SuperNode ``i`` (``node_configs[i]``), e.g. ``model-dir``:
        where that node's copy of a user's model factory is.
    save_models : path, optional
        Write the run's models folder here, as ``privmtl pmtl --save-models`` does
        (:func:`privmtl.flower.saved.collect_models`): the ServerApp keeps the released global
        model and each SuperNode its own clients' final models in its own storage, and this
        process assembles them once the run finished (every node's storage is on this machine).

    Returns
    -------
    dict
        The JSON result of ``privmtl pmtl`` plus ``engine: "flower-deployment"`` and
        ``work_dir`` (and ``models_dir`` with ``save_models``).
    """
    if int(num_supernodes) < 1:
        raise InvalidParameterError(
            f"The 'num_supernodes' parameter must be >= 1; got {num_supernodes!r}."
        )
    started = _timing.clock()
    run_config = announce(run_config)  # a factory that does not load: refused before any process
    work = (default_work_dir() if work_dir is None else Path(work_dir)).absolute()
    # one launcher per work directory for the whole run (the ServerApp locks work/server)
    # and one writer of the models folder, from the run's start to its assembly
    with hold_directory(work, name="work_dir"), hold_directory(save_models, name="save_models"):
        check_work_dir(work, resume=bool(run_config.get("resume", False)))
        cfg = app_run_config(run_config, num_supernodes, work, save_models)
        out = run_prepared(
            work,
            num_supernodes,
            run_config,
            state_dir,
            timeout,
            progress,
            on_started,
            node_configs,
            save_models,
            {"app": app_config(cfg), "supernode": supernode_command()},
        )
    return with_launch(out, _timing.clock() - started)


def launch_request(
    *,
    num_supernodes: int,
    run_config: dict[str, Any],
    work_dir: str | Path,
    timeout: float = 900.0,
    save_models: str | Path | None = None,
) -> dict[str, Any]:
    """What :func:`~privmtl.flower.deploy.run_request` needs to run :func:`run_local`'s deployment, as JSON values,
    computed here (where the run's options were checked, with PyTorch and Flower loaded): the
    announced run configuration, the Flower app's configuration (:func:`app_config`) and the
    SuperNode command. ``privmtl flower local`` computes it, then replaces its process with
    one that imports neither (``python -m privmtl.cli.flower_run``): the process that waits
    for the deployment holds no numerical library while the SuperNodes compute."""
    if int(num_supernodes) < 1:
        raise InvalidParameterError(
            f"The 'num_supernodes' parameter must be >= 1; got {num_supernodes!r}."
        )
    run_config = announce(run_config)
    work = Path(work_dir).absolute()
    cfg = app_run_config(run_config, num_supernodes, work, save_models)
    return {
        "num_supernodes": int(num_supernodes),
        "run_config": run_config,
        "work_dir": str(work),
        "timeout": float(timeout),
        "save_models": None if save_models is None else str(save_models),
        "app": app_config(cfg),
        "supernode": supernode_command(),
    }
