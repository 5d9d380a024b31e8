"""The models folder of a Flower run: ``privmtl flower local --save-models DIR``.

A run with the run-config key ``save-models`` leaves its end-of-run models where they belong:

``<work-dir>/server/final-models.pt`` (:data:`~privmtl.flower._core.MODELS_FILE`)
    The ServerApp's released global model (the billboard; what every node received), the run's
    token and its resolved configuration (:meth:`~privmtl.flower.server_run.ServerRun.models_state`).
``<state-dir of node i>/final-models.pt``
    SuperNode ``i``'s clients' final models (personalized, fine-tuned at the end of the run when
    the run fine-tunes), tagged with the run's token
    (:meth:`~privmtl.flower._core.NodeClients.save_models`). They are per-client outputs and are
    never sent to the ServerApp.

:func:`collect_models` assembles them into the models folder of ``privmtl pmtl --save-models``
(:func:`privmtl.federated.saved.save_models`: ``global.pt``, ``personalized.pt``, ``model.json``
signed with this user's key, written atomically with ``model.json`` last), which ``privmtl
evaluate DIR`` reloads. On ``flower local`` every node's storage is a folder of the same machine
and of the same user, who already holds every client's data: assembling reveals nothing new to
anyone. In a deployment across machines each node's file stays on that node (its clients'
models must not leave it); the folder of the ServerApp's machine then holds the global model only.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from privmtl.data.registry import absolute_data_path
from privmtl.exceptions import DataFormatError
from privmtl.federated.config import TrainConfig
from privmtl.federated.saved import save_models
from privmtl.federated.user_model import is_factory_spec
from privmtl.flower._core import MODELS_FILE, SERVER_DIR, from_bytes, run_options
from privmtl.flower.factory import load_checked

__all__ = ["collect_models"]


def _read(path: Path, who: str, token: str | None) -> dict[str, Any]:
    if not path.is_file():
        raise DataFormatError(
            f"No models of {who} at {path}: the node did not answer the end of the run (its "
            "clients' models were not saved); nothing was written to --save-models."
        )
    data = from_bytes(path.read_bytes())
    if token is not None and data.get("token") != token:
        raise DataFormatError(
            f"{path} ({who}) holds the models of another run (token {data.get('token')!r}, this "
            f"run {token!r}); nothing was written to --save-models."
        )
    return dict(data)


def collect_models(
    directory: str | os.PathLike[str],
    *,
    work_dir: str | os.PathLike[str],
    result: dict[str, Any],
    run_config: dict[str, Any],
    node_dirs: list[Path],
) -> Path:
    """Write the models folder of a finished Flower run to ``directory``; returns it.

    Parameters
    ----------
    directory : path
        The models folder (:func:`privmtl.federated.saved.save_models` writes it).
    work_dir : path
        The run's work directory (the ServerApp's ``server/`` in it).
    result : dict
        The run's JSON result (its guarantee, accuracies and settings go into ``model.json``).
    run_config : dict
        The run configuration as announced (a user's factory: ``model-dir`` and
        ``model-sha256``, whose source ``model.json`` records).
    node_dirs : list of path
        Each SuperNode's storage, in partition order.

    Raises
    ------
    DataFormatError
        A node's or the ServerApp's models file is missing or belongs to another run (one line;
        nothing is written).
    """
    server = _read(Path(work_dir) / SERVER_DIR / MODELS_FILE, "the ServerApp", None)
    token = str(server["token"])
    shards = [
        _read(Path(d) / MODELS_FILE, f"SuperNode {i}", token) for i, d in enumerate(node_dirs)
    ]
    m = int(result["num_clients"])
    index = torch.cat([s["clients"] for s in shards]).tolist()
    if sorted(index) != list(range(m)):
        raise DataFormatError(
            f"The nodes' models files hold {len(index)} clients, not each of the run's {m} once; "
            "nothing was written to --save-models."
        )
    order = torch.argsort(torch.tensor(index))
    client_ids = [cid for s in shards for cid in s["client_ids"]]
    stacked = {n: torch.cat([s["models"][n] for s in shards])[order] for n in shards[0]["models"]}
    config = TrainConfig(**json.loads(str(server["config"])))
    primary = str(server["primary"])
    finetuned = bool(shards[0]["finetuned"])
    # as run_pmtl saves them: the personalized models of a personalized method, the fine-tuned
    # models of any method, none for a global method that does not fine-tune
    trained = stacked if primary == "personalized" and not finetuned else None
    train = SimpleNamespace(
        config=config,
        client_ids=[client_ids[int(j)] for j in order],
        global_params=server["global"],
        personalized_params=trained,
        primary=primary,
    )
    shape = [int(v) for v in shards[0]["feature_shape"]]
    dataset = SimpleNamespace(
        n_features=math.prod(shape), n_classes=int(shards[0]["n_classes"]), feature_shape=shape
    )
    opts = run_options(run_config)
    data, path = str(opts["data"]), str(opts["data-path"]) or None
    model = str(opts["model"])
    user = load_checked(opts, "privmtl flower local") if is_factory_spec(model) else None
    return save_models(
        directory,
        train,
        result,
        model=model,
        dataset=dataset,
        data={
            "data": data,
            "data_path": absolute_data_path("pmtl", data, path),
            "num_clients": None if opts["num-clients"] in ("", None) else int(opts["num-clients"]),
        },
        personalized=stacked if finetuned else None,
        factory=None if user is None else user.record(),
    )
