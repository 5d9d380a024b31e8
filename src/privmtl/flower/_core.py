"""The PMTL protocol split into a server side and a node side, independent of the transport.

:class:`NodeClients` is what one SuperNode runs: it holds the data of its clients (a partition
of the population chosen by ``partition-id``/``num-partitions``), their persistent personalized
models, and runs the one client step of :mod:`privmtl.federated.client` (PMTL's mean-regularized
local SGD from the client's own model, with the minibatch plan of
:func:`~privmtl.federated.algorithms.draw_round_plan`).

:class:`ServerRun` is what the ServerApp runs: PMTL's :class:`~privmtl.federated.protocol.Curator`
(sampling, clip → mean over the fixed ``q`` → noise → write-ahead ledger → billboard) built exactly
as the in-process :class:`~privmtl.federated.protocol.Trainer` builds it, so a seeded run releases
the same billboards. The server never sees a personalized model: it receives the clients' messages
(``w - w̃``) and per-client evaluation counts.

The Flower apps (:mod:`privmtl.flower.apps`) only move these objects' inputs and outputs as
``ArrayRecord``/``ConfigRecord`` messages.
"""

from __future__ import annotations

import functools
import io
import json
import math
import secrets
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privmtl.checkpoint import has_checkpoint, load_checkpoint, save_checkpoint, write_atomic
from privmtl.data.federated import FederatedDataset
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import Params, client_scores, draw_round_plan
from privmtl.federated.client import ProxStep, local_sgd_batched
from privmtl.federated.config import TrainConfig, TrainResult
from privmtl.federated.protocol import Curator, method_spec
from privmtl.federated.spec import SPEC, RunSpec, resolve_defaults, train_config
from privmtl.flower.secagg import SECAGG_DEFAULTS
from privmtl.privacy.ledger import PrivacyLedger
from privmtl.privacy.noise import make_noise_source
from privmtl.privacy.release import GaussianMeanRelease
from privmtl.privacy.sampling import make_sampler

__all__ = [
    "FLOWER_FIXED",
    "RUN_DEFAULTS",
    "SERVER_DIR",
    "NodeClients",
    "ServerRun",
    "check_options",
    "default_work_dir",
    "from_bytes",
    "load_node",
    "make_config",
    "partition",
    "run_options",
    "run_spec",
    "to_bytes",
]

# run-config keys (pyproject [tool.flwr.app.config]) -> run_pmtl/RunSpec meaning; the algorithm
# and privacy defaults are the run spec's (privmtl.federated.spec.SPEC), as run_pmtl's
RUN_DEFAULTS: dict[str, Any] = {
    "data": "synthetic",
    "data-path": "",
    "num-clients": 0,  # synthetic only; 0: the generator's default m
    "model": "logreg",
    "rounds": SPEC.rounds,
    "clients-per-round": 0,  # 0: the spec's default, min(20, m)
    "epsilon": -1.0,  # < 0: not given
    "noise-std": -1.0,  # < 0: not given
    "clip": SPEC.clip,
    "lam": -1.0,  # < 0: the spec's default (default_lam: 0.001 when private, else 1)
    "lr": SPEC.lr,
    "batch-size": SPEC.batch_size,
    "local-steps": 0,  # 0: one local epoch
    "seed": SPEC.seed,
    "sampling": SPEC.sampling,
    "accountant": SPEC.accountant,
    "relation": SPEC.relation,
    "server-update": SPEC.server_update,
    "noise-source": SPEC.noise_source,
    "paper-delta": False,  # True: the PMTL paper's delta = 1/m (reproductions); else DP practice
    "num-supernodes": 1,
    "work-dir": "",  # "": default_work_dir() of the machine running the ServerApp
    "on-missing": "fail",  # "fail" | "proceed"
    "round-timeout": 120.0,
    **SECAGG_DEFAULTS,
    "budget-epsilon": -1.0,  # <= 0: no budget
    "checkpoint-every": 1,
    "resume": False,
}

SERVER_DIR = "server"
"""The ServerApp's storage inside the work directory (ledger, checkpoint, billboards, result)."""


def run_options(run_config: dict[str, Any]) -> dict[str, Any]:
    """The run configuration with every key present (defaults filled in)."""
    out = dict(RUN_DEFAULTS)
    out.update({k: v for k, v in run_config.items() if k in RUN_DEFAULTS})
    return out


def default_work_dir() -> Path:
    """A new durable work directory for a run: ``$XDG_STATE_HOME/privmtl/flower/run-<time>-<id>``.

    ``$XDG_STATE_HOME`` defaults to ``~/.local/state``: the ledger of a private run is a record of
    what was released and is never put in a temporary directory.
    """
    import os
    import secrets

    root = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return root / "privmtl" / "flower" / f"run-{stamp}-{secrets.token_hex(3)}"


def check_options(run_config: dict[str, Any], num_supernodes: int) -> None:
    """Refuse invalid run options before any process starts (InvalidParameterError)."""
    from privmtl._validation import check_choice, check_int, check_real

    check_int("num_supernodes", num_supernodes, low=1)
    check_int("rounds", run_config["rounds"], low=1)
    if run_config["clients-per-round"] != 0:  # 0: the spec's default
        check_int("clients_per_round", run_config["clients-per-round"], low=1)
    check_int("seed", run_config["seed"], low=0)
    num = int(run_config.get("num-clients", 0))
    if num:
        check_int("num_clients", num, low=num_supernodes)
        if run_config.get("data") != "synthetic":
            raise InvalidParameterError(
                "The 'num_clients' parameter applies to --data synthetic only; got data="
                f"{run_config.get('data')!r}."
            )
    check_real("clip", run_config["clip"], low=0.0, closed="neither")
    eps, std = float(run_config["epsilon"]), float(run_config["noise-std"])
    if eps != -1.0:
        check_real("epsilon", eps, low=0.0, closed="neither")
    if std != -1.0:
        check_real("noise_std", std, low=0.0)
    check_real("round_timeout", run_config["round-timeout"], low=0.0, closed="neither")
    check_int("checkpoint_every", run_config["checkpoint-every"], low=1)
    budget = float(run_config["budget-epsilon"])
    if budget != -1.0:
        check_real("budget_epsilon", budget, low=0.0, closed="neither")
    check_choice("on_missing", run_config["on-missing"], ("fail", "proceed"))


FLOWER_FIXED: dict[str, Any] = {"method": "pmtl", "personal_init": "model", "finetune": "none"}
"""Settings of the run spec that a Flower run does not take as options: it runs PMTL, its clients
start from the initial model, and it does not fine-tune (what its ``config`` reports)."""


def run_spec(opts: dict[str, Any], m: int) -> RunSpec:
    """The resolved :class:`~privmtl.federated.spec.RunSpec` of a run with ``m`` clients.

    The run configuration's "not given" values (``-1``; 0 clients per round) are the spec's
    defaults, resolved by :func:`~privmtl.federated.spec.resolve_defaults` as ``run_pmtl``
    resolves them; an explicit ``clients-per-round`` above ``m`` is read as ``m``.
    """
    eps, std, lam = float(opts["epsilon"]), float(opts["noise-std"]), float(opts["lam"])
    if eps >= 0 and std >= 0:
        raise InvalidParameterError(
            f"Give at most one of 'epsilon' and 'noise_std'; got epsilon={eps}, noise_std={std}."
        )
    q, steps = int(opts["clients-per-round"]), int(opts["local-steps"])
    spec = RunSpec(
        **FLOWER_FIXED,
        rounds=int(opts["rounds"]),
        clients_per_round=min(q, m) if q > 0 else None,
        local_steps=steps if steps > 0 else None,
        batch_size=int(opts["batch-size"]),
        lr=float(opts["lr"]),
        lam=lam if lam >= 0 else None,
        clip=float(opts["clip"]),
        epsilon=eps if eps >= 0 else None,
        noise_std=std if std >= 0 else None,
        delta="paper" if bool(opts["paper-delta"]) else None,
        sampling=str(opts["sampling"]),
        seed=int(opts["seed"]),
        accountant=str(opts["accountant"]),
        relation=str(opts["relation"]),
        server_update=str(opts["server-update"]),
        noise_source=str(opts["noise-source"]),
    )
    return resolve_defaults(spec, m)


def make_config(opts: dict[str, Any], m: int) -> tuple[TrainConfig, float]:
    """The :class:`TrainConfig` of a run with ``m`` clients, as ``run_pmtl`` builds it.

    Returns the config (``noise_std`` calibrated to ``epsilon`` when one is given) and the
    noise standard deviation of the released mean.
    """
    resolved = run_spec(opts, m)
    config = train_config(resolved, batched=True, progress=False, threads=1)
    if resolved.epsilon is not None:
        from privmtl.federated.baselines import config_for_epsilon

        config = config_for_epsilon(config, m, resolved.epsilon)
    return config, float(config.noise_std)


def partition(m: int, partition_id: int, num_partitions: int) -> np.ndarray:
    """The clients (global indices) that node ``partition_id`` of ``num_partitions`` serves."""
    if not 0 <= partition_id < num_partitions:
        raise InvalidParameterError(
            "The 'partition-id' node config must be in [0, num-partitions); got "
            f"partition-id={partition_id}, num-partitions={num_partitions}."
        )
    if num_partitions > m:
        raise InvalidParameterError(
            f"The 'num-partitions' node config must be <= the number of clients ({m}); "
            f"got {num_partitions}."
        )
    return np.array_split(np.arange(m), num_partitions)[partition_id]


def to_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def from_bytes(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True)


class NodeClients:
    """The clients one SuperNode serves: data, persistent personalized models, client step.

    Parameters
    ----------
    dataset : FederatedDataset
        The whole population as every node loads it (same data and seed); the node keeps only
        ``partition(m, partition_id, num_partitions)``.
    model : torch.nn.Module
        Architecture and initial parameters (``make_model`` with the run's seed: every node and
        the in-process engine start from the same parameters).
    partition_id, num_partitions : int
    state_dir : path or None
        The node's own storage: ``personal.pt`` holds the personalized models of its clients by
        client id (written atomically after every round). None keeps them in memory only.
    """

    def __init__(
        self,
        dataset: FederatedDataset,
        model: torch.nn.Module,
        *,
        partition_id: int,
        num_partitions: int,
        state_dir: str | Path | None = None,
    ) -> None:
        clients = partition(dataset.n_clients, partition_id, num_partitions)
        _, _, full_offsets = dataset.concat("train")
        self._setup(
            dataset.subset(clients.tolist()),
            model,
            clients=clients,
            full_offsets=full_offsets,
            partition_id=partition_id,
            num_partitions=num_partitions,
            state_dir=state_dir,
        )

    @classmethod
    def from_parts(
        cls,
        local: FederatedDataset,
        model: torch.nn.Module,
        *,
        clients: np.ndarray,
        full_offsets: np.ndarray,
        partition_id: int,
        num_partitions: int,
        state_dir: str | Path | None = None,
    ) -> NodeClients:
        """A node from its own clients' data only (``full_offsets``: the population's sizes)."""
        self = cls.__new__(cls)
        self._setup(
            local,
            model,
            clients=clients,
            full_offsets=full_offsets,
            partition_id=partition_id,
            num_partitions=num_partitions,
            state_dir=state_dir,
        )
        return self

    def _setup(
        self,
        local: FederatedDataset,
        model: torch.nn.Module,
        *,
        clients: np.ndarray,
        full_offsets: np.ndarray,
        partition_id: int,
        num_partitions: int,
        state_dir: str | Path | None,
    ) -> None:
        from privmtl.federated.engine import make_step_fn

        self.m = len(full_offsets) - 1
        self.clients = np.asarray(clients, dtype=np.int64)
        self.partition_id, self.num_partitions = partition_id, num_partitions
        self.local = local
        self.client_ids = list(local.client_ids)
        self.full_offsets = np.asarray(full_offsets, dtype=np.int64)
        self.model = model
        self.init = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.buffers = {n: b.detach() for n, b in model.named_buffers()}
        x, y, offsets = local.concat("train")
        self.x_all = x.to(next(iter(self.init.values())).dtype)
        self.y_all, self.offsets = y, offsets
        self.pos = {int(k): j for j, k in enumerate(self.clients)}
        self.step_fn = make_step_fn(model, self.buffers)
        self.state_dir = None if state_dir is None else Path(state_dir)
        self.personal: dict[str, Params] = {}
        self.rounds_trained = 0
        # the round trained last (its key) and its clients' models before it: a server resumed
        # from a checkpoint may ask for that round again, which then starts from the same models
        self.last_key: str | None = None
        self.before: dict[str, Params | None] = {}
        if self.state_dir is not None and (self.state_dir / "personal.pt").exists():
            saved = from_bytes((self.state_dir / "personal.pt").read_bytes())
            self.personal = {cid: saved["models"][cid] for cid in saved["models"]}
            self.rounds_trained = int(saved.get("rounds_trained", 0))
            self.last_key = saved.get("last_key") or None
            self.before = dict.fromkeys(saved.get("fresh", []))
            self.before.update(saved.get("before", {}))

    def data_state(self) -> dict[str, Any]:
        """This node's data as tensors (cached in the node's storage by the ClientApp)."""
        return {
            "clients": torch.from_numpy(self.clients),
            "full_offsets": torch.from_numpy(self.full_offsets),
            "client_ids": self.client_ids,
            "n_classes": int(self.local.n_classes),
            "feature_shape": [int(v) for v in self.local.feature_shape],
            "name": str(self.local.name),
            **{
                f"{split}_{a}": getattr(self.local, f"{split}_{a}")
                for split in ("train", "val", "test")
                for a in "xy"
            },
        }

    def describe(self) -> dict[str, Any]:
        return {
            "clients": [int(k) for k in self.clients],
            "client_ids": self.client_ids,
            "num_clients": self.m,
            "continued": sum(cid in self.personal for cid in self.client_ids),
        }

    def model_of(self, k: int) -> Params:
        cid = self.client_ids[self.pos[k]]
        return self.personal.get(cid, self.init)

    def train(
        self,
        clients: list[int],
        billboard: Params,
        round_index: int,
        config: TrainConfig,
        key: str | None = None,
    ) -> tuple[Params, list[float]]:
        """One PMTL client step for each of ``clients``; returns their stacked messages.

        ``key`` names the round (the server's run token and round index). Asked again for the
        round it trained last (a server resumed from a checkpoint taken before that round's
        release), the node first puts back its clients' models from before that round, so the
        repeated round starts where the first attempt did.
        """
        if key is not None and key == self.last_key:
            for cid, prev in self.before.items():
                if prev is None:
                    self.personal.pop(cid, None)
                else:
                    self.personal[cid] = prev
            if self.before:
                self.rounds_trained -= 1
        self.last_key = key
        self.before = {}
        if not clients:
            self.save()
            return {n: p.new_zeros((0, *p.shape)) for n, p in billboard.items()}, []
        spec = method_spec(config)
        plan = []
        for k in clients:
            if k not in self.pos:
                raise InvalidParameterError(
                    f"Client {k} is not served by node partition {self.partition_id}."
                )
            (steps,) = draw_round_plan([k], self.full_offsets, round_index, config)
            shift = int(self.offsets[self.pos[k]]) - int(self.full_offsets[k])
            plan.append([s + shift for s in steps])
        starts = {n: torch.stack([self.model_of(k)[n] for k in clients]) for n in self.init}
        rule = ProxStep(lr=config.lr, anchor=billboard, weight=spec.prox_weight)
        news, losses = local_sgd_batched(
            self.step_fn, starts, rule, self.x_all, self.y_all, plan, config.batch_size
        )
        for j, k in enumerate(clients):
            cid = self.client_ids[self.pos[k]]
            self.before[cid] = self.personal.get(cid)
            self.personal[cid] = {n: news[n][j].clone() for n in news}
        self.rounds_trained += 1
        self.save()
        if spec.message == "ditto":  # a copy of the billboard, same minibatches, no pull
            copies = {n: billboard[n].unsqueeze(0).expand_as(starts[n]).clone() for n in self.init}
            trained, _ = local_sgd_batched(
                self.step_fn, copies, ProxStep(lr=config.lr), self.x_all, self.y_all, plan,
                config.batch_size,
            )  # fmt: skip
            msgs = {n: trained[n] - billboard[n] for n in self.init}
        elif spec.message == "offset":
            msgs = {n: news[n] - billboard[n] for n in self.init}
        else:
            msgs = {n: news[n] - starts[n] for n in self.init}
        return msgs, [float(v) for v in losses]

    def save(self) -> None:
        """Write the personalized models to the node's storage (atomic replace)."""
        if self.state_dir is None:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        data = {
            "models": self.personal,
            "rounds_trained": self.rounds_trained,
            "last_key": self.last_key or "",
            "before": {cid: p for cid, p in self.before.items() if p is not None},
            "fresh": [cid for cid, p in self.before.items() if p is None],
        }
        write_atomic(self.state_dir / "personal.pt", to_bytes(data))

    def evaluate(self, billboard: Params) -> dict[str, list[float]]:
        """Per-client correct counts and sizes of the personalized and the global model."""
        personal = {
            n: torch.stack([self.model_of(int(k))[n] for k in self.clients]) for n in self.init
        }
        out: dict[str, list[float]] = {}
        for split in ("val", "test"):
            xs, ys = self.local.split(split)
            xs = [x.to(self.x_all.dtype) for x in xs]
            counts = [float(y.shape[0]) for y in ys]
            self.model.eval()
            pc, _ = client_scores(self.model, personal, self.buffers, xs, ys)
            glob = {n: p.unsqueeze(0).expand(len(ys), *p.shape) for n, p in billboard.items()}
            gc, _ = client_scores(self.model, glob, self.buffers, xs, ys)
            out[f"{split}_n"] = counts
            out[f"{split}_personal"] = [float(v) for v in pc]
            out[f"{split}_global"] = [float(v) for v in gc]
        return out


def _accuracy(correct: np.ndarray, counts: np.ndarray) -> dict[str, float]:
    has = counts > 0
    return {
        "accuracy": float(correct.sum() / counts.sum()),
        "mean_client_accuracy": float(np.mean(correct[has] / counts[has])),
        "n": float(counts.sum()),
    }


class ServerRun:
    """The server side: PMTL's curator, built as the in-process Trainer builds it.

    Parameters
    ----------
    opts : dict
        The run options (:func:`run_options`); ``budget-epsilon``, ``checkpoint-every`` and
        ``resume`` act as ``budget_epsilon``, ``checkpoint_every`` and ``resume`` of the
        in-process :class:`~privmtl.federated.protocol.Trainer`.
    init : dict of str to Tensor
        The initial billboard (the model's initial parameters, reported by the nodes).
    num_clients : int
    ledger_path : path or None
        Where the ledger is written ahead of every release when there is no ``server_dir``.
    server_dir : path or None
        The server's durable storage. ``ledger.jsonl``: the write-ahead ledger of every release
        made from this directory — a later run continues it, since its clients continue their
        personalized models, so its ε composes every release they took part in. The checkpoint
        (``manifest.json``, ``state-*.pt``; :mod:`privmtl.checkpoint`) of the current run, saved
        before its first release and every ``checkpoint-every`` rounds. ``run.json``: the current
        run's index, token and whether it finished; a directory whose run did not finish is
        refused unless ``resume`` continues it.

    Notes
    -----
    A resumed run repeats the rounds after its checkpoint. With seeded noise a repeated release
    is the one the ledger holds (same id and event) and is not charged again; with secure noise
    it is a new release and is charged. The nodes keep their clients' models from before the round
    they trained last, so a repeated round starts from the same personalized models.
    """

    def __init__(
        self,
        opts: dict[str, Any],
        init: Params,
        num_clients: int,
        *,
        ledger_path: str | Path | None = None,
        server_dir: str | Path | None = None,
    ) -> None:
        m = num_clients
        self.opts, self.m = opts, m
        self.config, self.sigma = make_config(opts, m)
        cfg = self.config
        self.q = q = cfg.clients_per_round
        budget = float(opts["budget-epsilon"])
        self.budget = budget if budget > 0 else None
        self.checkpoint_every = int(opts["checkpoint-every"])
        self.server_dir = None if server_dir is None else Path(server_dir)
        if self.server_dir is not None:
            self.server_dir.mkdir(parents=True, exist_ok=True)
            ledger_path = self.server_dir / "ledger.jsonl"
        sampler = make_sampler(cfg.sampling, m, q)
        mech = GaussianMeanRelease(clip=cfg.clip, noise_std=cfg.noise_std, sampler=sampler)
        self.delta = cfg.delta_for(m)
        self.ledger: PrivacyLedger | None = None
        if mech.private:
            kw: dict[str, Any] = {
                "delta": self.delta,
                "accountant": cfg.accountant,
                "relation": cfg.relation,
                "budget": self.budget,
            }
            self.ledger = (
                PrivacyLedger(**kw)
                if ledger_path is None
                else PrivacyLedger.open(Path(ledger_path), **kw)
            )
            self.ledger.epsilon_if(mech.event())
        self.noise_source = cfg.noise_source
        self.curator = Curator(
            mech,
            init,
            noise=make_noise_source(cfg.noise_source, cfg.seed),
            ledger=self.ledger,
            update="add",
            seed=cfg.seed,
        )
        self.shapes = {n: [int(v) for v in p.shape] for n, p in init.items()}
        self.run_index = 0
        self.token = secrets.token_hex(8)
        self.stopped_on_budget = False
        self.history: list[dict[str, Any]] = []
        self.billboards: list[Params] = []
        if self.server_dir is not None:
            self._open(bool(opts["resume"]))

    # ------------------------------------------------------------------------- durable state
    @property
    def epsilon(self) -> float:
        """ε of everything the ledger holds (inf without a ledger: not private)."""
        return math.inf if self.ledger is None else self.ledger.epsilon()

    @property
    def finished(self) -> bool:
        return self.curator.round >= self.config.rounds or self.stopped_on_budget

    def round_key(self) -> str:
        """The name of the next round for the nodes (this run's token and the round index)."""
        return f"{self.token}:{self.curator.round}"

    def fingerprint_config(self) -> dict[str, Any]:
        """What a checkpoint must match to be resumed (as the Trainer's, plus data and run)."""
        from privmtl.federated.protocol import _EXECUTION_ONLY

        cfg = {k: v for k, v in self.config.to_dict().items() if k not in _EXECUTION_ONLY}
        cfg.pop("budget", None)  # a resumed run may be given another budget
        return {
            **cfg,
            "noise_source": self.noise_source,
            "num_clients": self.m,
            "data": str(self.opts["data"]),
            "data_path": str(self.opts["data-path"]),
            "model": str(self.opts["model"]),
            "shapes": self.shapes,
            "run": self.run_index,
            "token": self.token,
        }

    def _open(self, resume: bool) -> None:
        assert self.server_dir is not None
        d = self.server_dir
        info_path = d / "run.json"
        info = json.loads(info_path.read_text()) if info_path.exists() else None
        if info is not None and not info.get("finished") and not resume:
            raise InvalidParameterError(
                f"{d} holds run {info['run']}, which did not finish (it was killed, failed or "
                "interrupted); resume it (--resume) or use another work directory."
            )
        load = False
        if info is not None and resume:
            self.run_index, self.token = int(info["run"]), str(info["token"])
            if has_checkpoint(d):
                manifest = json.loads((d / "manifest.json").read_text())
                load = manifest.get("config", {}).get("token") == self.token
        elif info is not None:
            self.run_index = int(info["run"]) + 1
        self.curator.name = f"run{self.run_index}:" if self.run_index else ""
        if load:
            state, _ = load_checkpoint(d, kind="flower-pmtl", config=self.fingerprint_config())
            self.load_state_dict(state)
        self._write_info(finished=False)
        self.save()  # before the first release: a killed run always has a checkpoint

    def _write_info(self, *, finished: bool) -> None:
        assert self.server_dir is not None
        info = {"run": self.run_index, "token": self.token, "finished": finished}
        write_atomic(self.server_dir / "run.json", (json.dumps(info) + "\n").encode())

    def state_dict(self) -> dict[str, Any]:
        """Curator state, history and the released billboards (no personalized model)."""
        return {
            "curator": self.curator.state_dict(),
            "history": json.dumps(self.history),
            "billboards": self.billboards,
            "stopped_on_budget": self.stopped_on_budget,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.curator.load_state_dict(state["curator"])
        self.history = json.loads(state["history"])
        self.billboards = [{n: p.clone() for n, p in b.items()} for b in state["billboards"]]
        # a budget stop is decided again (the resumed run may have another budget)
        self.stopped_on_budget = False

    def save(self) -> None:
        """Checkpoint the run now (atomic; the ledger is already on disk)."""
        if self.server_dir is None:
            return
        save_checkpoint(
            self.server_dir,
            kind="flower-pmtl",
            config=self.fingerprint_config(),
            state=self.state_dict(),
            step=self.curator.round,
            noise_source=self.noise_source,
        )

    def stop_on_budget(self) -> bool:
        """True (and ``stopped_on_budget`` set) when the next release would exceed the budget."""
        if self.budget is not None and self.curator.would_exceed_budget():
            self.stopped_on_budget = True
        return self.stopped_on_budget

    def finish(self) -> None:
        """Save the final checkpoint and mark the run finished (once its result is computed)."""
        if self.server_dir is None:
            return
        self.save()
        self._write_info(finished=True)

    def release(
        self,
        sampled: np.ndarray,
        messages: dict[int, Params],
        losses: dict[int, float],
        seconds: float,
        *,
        secure: tuple[Params, list[int]] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Release the round from the messages of the clients that answered.

        A sampled client without a message contributes nothing to the sum (which is still divided
        by the fixed ``q``): the release has the sensitivity it is accounted for. With
        ``secure = (total, answered)`` the curator has only the sum of the answering clients'
        messages, clipped by the clients (secure aggregation, :mod:`privmtl.flower.secagg`).
        """
        t = self.curator.round
        if secure is not None:
            total, answered = secure
            out = self.curator.release_sum(total)
        else:
            answered = [int(k) for k in sampled if int(k) in messages]
            names = list(self.curator.billboard)
            stacked = {
                n: (
                    torch.stack([messages[k][n] for k in answered])
                    if answered
                    else self.curator.billboard[n].new_zeros((0, *self.curator.billboard[n].shape))
                )
                for n in names
            }
            out = self.curator.release(stacked, rows=np.asarray(answered, dtype=np.int64))
        ls = [losses[k] for k in answered if k in losses and not math.isnan(losses[k])]
        self.history.append(
            {
                "round": t,
                "sampled": [int(k) for k in sampled],
                "answered": answered,
                "n_sampled": len(sampled),
                "train_loss": float(np.mean(ls)) if ls else math.nan,
                "update_norms": [float(v) for v in out.norms],
                "clipped_fraction": (
                    float(np.mean(out.clipped))
                    if len(out.clipped)
                    else (math.nan if secure is not None else 0.0)
                ),
                "noise_multiplier": self.curator.release_mechanism.noise_multiplier,
                "epsilon": float(out.epsilon) if self.ledger is not None else math.inf,
                "seconds": seconds,
                **(extra or {}),
            }
        )
        self.billboards.append({n: p.clone() for n, p in self.curator.billboard.items()})
        r = self.curator.round
        if r % self.checkpoint_every == 0 or r == self.config.rounds:
            self.save()

    def result(self, evaluations: list[dict[str, list[float]]], started: float) -> TrainResult:
        """A :class:`TrainResult` (no personalized models: they stay on the nodes)."""
        acc: dict[str, dict[str, dict[str, float]]] = {}
        for split in ("val", "test"):
            n = np.concatenate([np.asarray(e[f"{split}_n"]) for e in evaluations])
            acc[split] = {
                kind: _accuracy(
                    np.concatenate([np.asarray(e[f"{split}_{key}"]) for e in evaluations]), n
                )
                for kind, key in (("personalized", "personal"), ("global", "global"))
            }
        secs = float(sum(h["seconds"] for h in self.history))
        return TrainResult(
            config=self.config,
            client_ids=[],
            personalized_params=None,
            global_params=self.curator.billboard,
            history=self.history,
            accuracies=acc,
            primary="personalized",
            epsilon=self.epsilon,
            delta=self.delta,
            ledger=self.ledger,
            seconds=secs,
            seconds_per_round=secs / max(len(self.history), 1),
            noise_source=self.noise_source,
            stopped_on_budget=self.stopped_on_budget,
            extra={"wall_seconds": time.perf_counter() - started},
        )

    def result_dict(self, evaluations: list[dict[str, list[float]]], started: float) -> dict:
        """The JSON of ``privmtl pmtl`` for this run, plus ``engine``."""
        from privmtl.experiments.pmtl import _result_dict

        res = self.result(evaluations, started)
        out = _result_dict(
            res,
            method="pmtl",
            model=str(self.opts["model"]),
            data=str(self.opts["data"]),
            sigma=self.sigma,
            q=self.q,
            m=self.m,
        )
        out["config"] = run_spec(self.opts, self.m).to_dict()
        out["clients_per_round_default"] = int(self.opts["clients-per-round"]) <= 0
        out["scaling"] = "none"  # the built-in data sets of a Flower run are not rescaled
        out["engine"] = "flower-deployment"
        out["on_missing"] = str(self.opts["on-missing"])
        out["clients_answered_per_round"] = [len(h["answered"]) for h in self.history]
        out["budget_epsilon"] = self.budget
        out["run_index"] = self.run_index
        out["ledger_releases"] = 0 if self.ledger is None else len(self.ledger.records)
        if self.server_dir is not None:
            out["server_dir"] = str(self.server_dir)
        return json.loads(json.dumps(out, default=float))


@functools.lru_cache(maxsize=2)
def _population(data: str, data_path: str, seed: int, num_clients: int | None) -> FederatedDataset:
    """The whole population, loaded once per process (a simulation's actor serves many nodes)."""
    from privmtl.experiments.pmtl import load_federated

    return load_federated(data, data_path=data_path or None, seed=seed, num_clients=num_clients)


def load_node(opts: dict[str, Any], pid: int, parts: int, state_dir: str | None) -> NodeClients:
    """Build the node's clients; their data is cached as tensors in the node's storage.

    Each message runs in a fresh ClientApp process: reading the node's own shard back is much
    cheaper than loading (or generating) the population again.
    """
    import hashlib

    from privmtl.experiments.pmtl import make_model

    seed = int(opts["seed"])
    num = int(opts.get("num-clients", 0)) or None
    ident = json.dumps([opts["data"], opts["data-path"], seed, pid, parts, num])
    cache = None
    if state_dir is not None:
        digest = hashlib.sha256(ident.encode()).hexdigest()[:16]
        cache = Path(state_dir) / f"data-{digest}.pt"
    if cache is not None and cache.exists():
        d = from_bytes(cache.read_bytes())
        local = FederatedDataset(
            client_ids=list(d["client_ids"]),
            n_classes=int(d["n_classes"]),
            feature_shape=tuple(d["feature_shape"]),
            name=str(d["name"]),
            **{f"{s}_{a}": list(d[f"{s}_{a}"]) for s in ("train", "val", "test") for a in "xy"},
        )
        net = make_model(str(opts["model"]), local, seed)
        return NodeClients.from_parts(
            local,
            net,
            clients=d["clients"].numpy(),
            full_offsets=d["full_offsets"].numpy(),
            partition_id=pid,
            num_partitions=parts,
            state_dir=state_dir,
        )
    ds = _population(str(opts["data"]), str(opts["data-path"]), seed, num)
    net = make_model(str(opts["model"]), ds, seed)
    node = NodeClients(ds, net, partition_id=pid, num_partitions=parts, state_dir=state_dir)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache, to_bytes(node.data_state()))
    return node
