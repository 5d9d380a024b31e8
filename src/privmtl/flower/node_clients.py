"""A SuperNode's half of the PMTL protocol: the clients it serves (:class:`NodeClients`).

A node holds its clients' data (a synthetic node its lazy partition of the population,
:meth:`~privmtl.data.streamed.SyntheticFederation.partition`: a round draws its sampled clients
only, the end of run and the scoring a block at a time; other data cached once as contiguous
tensors that a fresh ClientApp maps, :func:`load_node`, :func:`node_dataset`) and their
personalized models
(:class:`~privmtl.flower.node_state.NodeState`: a round writes its sampled clients' rows only),
runs the method's client step for the clients a round samples, counts their end-of-run vote
(:meth:`NodeClients.vote_shares`) and finishes and scores them as
:func:`~privmtl.federated.finish.finish_clients` does in process. The ServerApp's half is
:class:`privmtl.flower.server_run.ServerRun`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privmtl._device import resolve_device
from privmtl.checkpoint import write_atomic
from privmtl.data.federated import FederatedDataset
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import (
    LOCAL_TRAINING_STREAM,
    Params,
    RoundPlan,
    draw_round_plan,
)
from privmtl.federated.baseline import baseline_sample
from privmtl.federated.blocks import END_OF_RUN_BLOCK, client_blocks
from privmtl.federated.client import UpdateRule, local_sgd_batched
from privmtl.federated.config import TrainConfig
from privmtl.federated.engine import make_step_fn
from privmtl.federated.finish import auto_plan, finish_clients, resolve_local_solver
from privmtl.federated.local import train_local
from privmtl.federated.methods import Method, TrainFn, get_method, method_class
from privmtl.federated.models import make_model
from privmtl.federated.scoring import BlockScores, block_rows, client_scores
from privmtl.federated.store import ClientStore
from privmtl.flower._core import (
    MODELS_FILE,
    NONE,
    PERSONAL_DIR,
    given,
    partition,
    to_bytes,
)
from privmtl.flower.factory import load_checked, load_checked_method
from privmtl.flower.node_data import (
    STREAMED_DATA,
    data_sha256_of,
    is_lazy,
    node_dataset,
    node_partition,
    population,
    table_options,
)
from privmtl.flower.node_finish import finish_and_score
from privmtl.flower.node_state import NodeState
from privmtl.flower.vote import node_vote_shares, node_voters

__all__ = ["NodeClients", "data_sha256_of", "load_node", "node_dataset"]


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
        The node's own storage: ``personal/`` holds the personalized models of its clients
        (:class:`~privmtl.flower.node_state.NodeState`: a row per client, a round writes only
        its sampled clients' rows). None keeps them in memory only.
    """

    def __init__(
        self,
        dataset: FederatedDataset,
        model: torch.nn.Module,
        *,
        partition_id: int,
        num_partitions: int,
        state_dir: str | Path | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        clients = partition(dataset.n_clients, partition_id, num_partitions)
        full_offsets = dataset.offsets("train")
        lazy = node_partition(dataset, clients)
        self._setup(
            dataset.subset(clients.tolist()) if lazy is None else lazy,
            model,
            clients=clients,
            full_offsets=full_offsets,
            partition_id=partition_id,
            num_partitions=num_partitions,
            state_dir=state_dir,
            device=device,
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
        device: str | torch.device = "cpu",
        data_sha256: str | None = None,
    ) -> NodeClients:
        """A node from its own clients' data only (``full_offsets``: the population's sizes;
        ``data_sha256``: the data's fingerprint when known, e.g. from the node's cache)."""
        self = cls.__new__(cls)
        self._setup(
            local,
            model,
            clients=clients,
            full_offsets=full_offsets,
            partition_id=partition_id,
            num_partitions=num_partitions,
            state_dir=state_dir,
            device=device,
            data_sha256=data_sha256,
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
        device: str | torch.device = "cpu",
        data_sha256: str | None = None,
    ) -> None:
        self.m = len(full_offsets) - 1
        self.clients = np.asarray(clients, dtype=np.int64)
        self.partition_id, self.num_partitions = partition_id, num_partitions
        self.local = local
        self.client_ids = list(local.client_ids)
        self.full_offsets = np.asarray(full_offsets, dtype=np.int64)
        self.model = model
        self.init = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.buffers = {n: b.detach() for n, b in model.named_buffers()}
        self.dtype = next(iter(self.init.values())).dtype
        # where each client's training rows begin in the node's stacked data (no data read)
        self.offsets = np.concatenate([[0], np.cumsum(local.sizes("train"))]).astype(np.int64)
        self.pos = {int(k): j for j, k in enumerate(self.clients)}
        self.step_fn = make_step_fn(model, self.buffers)
        # where the rounds' client step runs (the end of the run stays on the CPU)
        self.device = torch.device(device)
        self._device_step: Any = None
        # the fingerprint of this node's data: a resumed run must see the same
        self.data_sha256 = data_sha256 or data_sha256_of(local)
        self.state_dir = None if state_dir is None else Path(state_dir)
        # the clients' personalized models: rows on disk, written O(sampled clients) per round
        self.personal = NodeState(
            self.client_ids,
            self.init,
            None if self.state_dir is None else self.state_dir / PERSONAL_DIR,
        )
        # the models this node's clients keep at the end of the run (set by evaluate)
        self.final: Params | None = None
        self.finetuned = False

    @property
    def rounds_trained(self) -> int:
        return self.personal.rounds_trained

    @property
    def last_key(self) -> str | None:
        """The round trained last (its key): a server resumed from a checkpoint may ask for that
        round again, which then starts from the same models."""
        return self.personal.last_key

    def data_state(self) -> dict[str, Any]:
        """This node's data as contiguous tensors (cached in the node's storage by the
        ClientApp, which maps them: :func:`node_dataset`)."""
        out: dict[str, Any] = {
            "clients": torch.from_numpy(self.clients),
            "full_offsets": torch.from_numpy(self.full_offsets),
            "client_ids": self.client_ids,
            "n_classes": int(self.local.n_classes),
            "feature_shape": [int(v) for v in self.local.feature_shape],
            "name": str(self.local.name),
            "scaling": str(self.local.scaling),
            "sha256": self.data_sha256,
        }
        for split in ("train", "val", "test"):
            x, y, offsets = self.local.concat(split)
            out[f"{split}_x"], out[f"{split}_y"] = x.contiguous(), y.contiguous()
            out[f"{split}_offsets"] = torch.from_numpy(offsets)
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "clients": [int(k) for k in self.clients],
            "client_ids": self.client_ids,
            "num_clients": self.m,
            "n_features": int(self.local.n_features),
            "n_classes": int(self.local.n_classes),
            "continued": len(self.personal),
            "partition": int(self.partition_id),
            "scaling": str(self.local.scaling),
            "data_sha256": self.data_sha256,
            "device": str(self.device),
        }

    def model_of(self, k: int) -> Params:
        j = self.pos[k]
        return self.personal.row(j) if self.personal.written([j])[0] else self.init

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
            self.personal.undo()
        if not clients:
            self.personal.write_round(key, [], None)
            return {n: p.new_zeros((0, *p.shape)) for n, p in billboard.items()}, []
        method = get_method(config.method, config)
        for k in clients:
            if k not in self.pos:
                raise InvalidParameterError(
                    f"Client {k} is not served by node partition {self.partition_id}."
                )
        rows = [self.pos[k] for k in clients]
        dev = self.device
        board = billboard if dev.type == "cpu" else {n: p.to(dev) for n, p in billboard.items()}
        state = self._store(method, rows, dev)
        sel = torch.arange(len(clients), device=dev)
        starts, anchor = method.starts(board, sel, state)
        train = self._train_fn(clients, round_index, config, on_device=True)
        done = method.client_update(board, list(board), starts, anchor, train)
        method.keep(state, sel, done.kept)
        self.personal.rounds_trained += 1
        if "personal" in state:  # the clients keep their models: only their rows are written
            kept = {n: p.cpu() for n, p in state.gather("personal", sel).items()}
            full = {
                n: kept.get(n, self.init[n].expand(len(rows), *self.init[n].shape))
                for n in self.init
            }
            self.personal.write_round(key, rows, full)
        else:
            self.personal.write_round(key, [], None)
        messages = {n: p.cpu() for n, p in done.messages.items()}
        return messages, [float(v) for v in done.losses]

    def _store(
        self, method: Method, rows: list[int], device: torch.device | None = None
    ) -> ClientStore:
        """The stored state of the node's clients at ``rows`` (store rows ``0 .. len(rows)-1``)
        for ``method``: the models this node keeps written, every other client at the initial
        model; on ``device`` (default: the CPU)."""
        dev = torch.device("cpu") if device is None else device
        init = self.init if dev.type == "cpu" else {n: p.to(dev) for n, p in self.init.items()}
        store = method.initial_state(init, len(rows))
        if "personal" in store:
            had = np.flatnonzero(self.personal.written(rows))
            if len(had):
                models = self.personal.gather([rows[j] for j in had])
                values = {n: models[n].to(dev) for n in store.names("personal")}
                index = torch.from_numpy(had.astype(np.int64)).to(dev)
                store.scatter("personal", index, values)
        return store

    def _step_on(self, device: torch.device) -> Any:
        """The client step on ``device`` (a copy of the model moved there once, kept)."""
        if device.type == "cpu":
            return self.step_fn
        if self._device_step is None:
            import copy

            net = copy.deepcopy(self.model).to(device)
            buffers = {n: b.detach() for n, b in net.named_buffers()}
            self._device_step = make_step_fn(net, buffers)
        return self._device_step

    def _rows(
        self, clients: list[int], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """The training rows of this node's ``clients`` (population indices), stacked on
        ``device``, and where each one's rows begin: only these clients are drawn or read
        (:meth:`~privmtl.data.federated.FederatedDataset.take`, as the in-process engine takes a
        round's sampled clients)."""
        x, y, offsets = self.local.take([self.pos[k] for k in clients], "train")
        return x.to(device, self.dtype), y.to(device), offsets[:-1]

    def _train_fn(
        self, clients: list[int], round_index: int, config: TrainConfig, on_device: bool = False
    ) -> TrainFn:
        """Local SGD of this node's ``clients`` in round ``round_index``
        (:class:`~privmtl.federated.methods.base.TrainFn`): the minibatches the in-process engine
        draws for them (the round's plan, or another ``stream`` / number of ``epochs``); on the
        node's :attr:`device` with ``on_device``, else on the CPU. The clients' rows are taken
        when first trained on, and dropped with the function."""
        dev = self.device if on_device else torch.device("cpu")
        held: list[tuple[torch.Tensor, torch.Tensor, np.ndarray]] = []

        def train(
            starts: Params,
            rule: UpdateRule,
            *,
            stream: int | None = None,
            epochs: int | None = None,
        ) -> tuple[Params, list[float]]:
            if not held:
                held.append(self._rows(clients, dev))
            x, y, begins = held[0]
            return local_sgd_batched(
                self._step_on(dev),
                starts,
                rule,
                x,
                y,
                self._plan(clients, round_index, config, begins, stream=stream, epochs=epochs),
                config.batch_size,
            )

        return train

    def _plan(
        self,
        clients: list[int],
        round_index: int,
        config: TrainConfig,
        starts: np.ndarray,
        *,
        stream: int | None = None,
        epochs: int | None = None,
    ) -> RoundPlan:
        """The minibatches of ``clients`` in round ``round_index`` as rows of their stacked
        data (the ``j``-th client's beginning at ``starts[j]``): each client's draws are those of
        the in-process engine (the population's offsets)."""
        if epochs is not None:
            config = dataclasses.replace(config, local_epochs=epochs, local_steps=None)
        return draw_round_plan(
            clients, self.full_offsets, round_index, config,
            stream=LOCAL_TRAINING_STREAM if stream is None else stream, starts=starts,
        )  # fmt: skip

    def save(self) -> None:
        """Nothing to do: every round's models are written when the round is trained."""

    def global_model(self, billboard: Params) -> Params:
        """The released global model: the billboard, and the initial values of the parameters
        that are not shared (partial sharing), as the in-process engine reports it."""
        return {n: billboard[n] if n in billboard else p for n, p in self.init.items()}

    def trained(
        self, billboard: Params, personal_init: str = "model", config: TrainConfig | None = None
    ) -> Params:
        """The trained models of this node's clients, stacked in the order of ``clients``.

        With the run's ``config`` they are the method's end of run
        (:meth:`~privmtl.federated.methods.base.Method.outputs`, :meth:`outputs`: FedRep's final
        heads). Without it, or for a method whose clients keep no model, a client never sampled
        holds what it would start from: the billboard (the global model) with
        ``personal_init="billboard"``, else the initial model.
        """
        if config is not None:
            personal, _ = self.outputs(billboard, config)
            if personal is not None:
                return personal
        never = self.global_model(billboard) if personal_init == "billboard" else self.init
        rows = list(range(len(self.client_ids)))
        out = self.personal.gather(rows)
        fresh = torch.from_numpy(~self.personal.written(rows))
        for n, p in out.items():
            p[fresh] = never[n].to(p.dtype)
        return out

    def outputs(
        self, billboard: Params, config: TrainConfig, round: int = 0
    ) -> tuple[Params | None, Params]:
        """The method's end of run for this node's clients: ``(their models or None, the global
        model)``, from :meth:`~privmtl.federated.methods.base.Method.outputs` as the in-process
        engine calls it, with this node's clients' stored models and a local training function
        over all of them (round 0; the method picks the stream and the epochs: FedRep's final
        heads come from the minibatches the in-process engine draws for the same clients).
        """
        method = get_method(config.method, config)
        state = self._store(method, list(range(len(self.client_ids))))
        return method.outputs(
            billboard,
            state,
            personal_init={n: p for n, p in self.init.items() if n not in billboard},
            names=list(self.init),
            round=round,
            train_all=self._train_fn(self.clients.tolist(), 0, config),
        )

    def _finish_start(self, billboard: Params, finish: dict[str, Any]) -> tuple[Params, Params]:
        """The global model and the models the clients' end of run starts from."""
        glob_model = self.global_model(billboard)
        method = str(finish.get("method", "pmtl"))
        config = TrainConfig(**finish["config"]) if "config" in finish else None
        if method_class(method).personalized:
            personal = self.trained(
                billboard, str(finish.get("personal_init", "model")), config=config
            )
        else:  # a global-model method: every client's trained model is the billboard
            personal = {
                n: p.unsqueeze(0).expand((len(self.clients), *p.shape))
                for n, p in glob_model.items()
            }
        return glob_model, personal

    def _voters(self, finish: dict[str, Any]) -> np.ndarray:
        """The positions of this node's clients that vote (the population's coins)."""
        return node_voters(
            int(finish.get("num_clients", self.m)), self.clients,
            str(finish.get("noise_source", "secure")), int(finish["seed"]),
        )  # fmt: skip

    def vote_shares(self, billboard: Params, finish: dict[str, Any]) -> list[float]:
        """This node's clients' vote shares summed over them, one per candidate of
        :func:`~privmtl.federated.finish.vote_candidates` (the ServerApp sums the nodes' and
        releases the vote, :meth:`ServerRun.elect`)."""
        glob_model, personal = self._finish_start(billboard, finish)
        plan = auto_plan(
            str(finish.get("method", "pmtl")), finish["shared_params"],
            float(finish["noise_std"]), finish["clip"], int(finish["released_dim"]),
            int(finish["rounds"]),
        )  # fmt: skip
        voters = self._voters(finish)
        self.model.train()

        def call(vote: Any) -> Any:
            return finish_clients(
                "auto", self._end_data(), self.model, personal, glob_model,
                batch_size=int(finish["batch_size"]), seed=int(finish["seed"]),
                lr=float(finish["lr"]), lam=float(finish["lam"]), plan=plan,
                start=str(finish.get("start", "personalized")),
                client_index=self.clients.tolist(), local_solver="ridge", select="vote",
                vote=vote, voters=voters, block=END_OF_RUN_BLOCK,
            )  # fmt: skip

        return [float(v) for v in node_vote_shares(call)]

    def evaluate(
        self, billboard: Params, finish: dict[str, Any] | None = None
    ) -> dict[str, list[float]]:
        """Per-client correct counts and sizes of the personalized and the global model.

        ``finish`` (the run's public end-of-run settings: ``finetune``, ``personal_init``, the
        run's ``config`` and what :func:`~privmtl.federated.finish.finish_clients` and
        :func:`~privmtl.federated.finish.auto_plan` read) makes every client of the node run the
        method's end of the run (:meth:`outputs`) and its fine-tuning on its own data; then ``{split}_final`` holds the counts of the models
        the clients keep, ``choice`` the candidate each chose (``finetune="auto"``) and
        ``grids`` the candidates' public grids.
        """
        finish = finish or {}
        glob_model, personal = self._finish_start(billboard, finish)
        final = None
        out: dict[str, Any] = {}
        finetune = str(finish.get("finetune", "none"))
        self.finetuned = finetune != "none"
        scored: dict[str, Any] | None = None
        sink_seconds = 0.0
        if finetune != "none":
            self.model.train()
            plan = None
            if finetune == "auto":
                plan = auto_plan(
                    str(finish.get("method", "pmtl")), finish["shared_params"],
                    float(finish["noise_std"]),
                    finish["clip"], int(finish["released_dim"]), int(finish["rounds"]),
                )  # fmt: skip
            winner = finish.get("winner") if finetune == "auto" else None
            vote: dict[str, Any] = {}
            if winner is not None:  # the clients' vote elected one candidate for all
                voters = self._voters(finish)
                vote = {"select": "vote", "winner": str(winner), "voters": voters}
                out["voters"] = len(voters)
            options = dict(
                finetune=finetune, batch_size=int(finish["batch_size"]), seed=int(finish["seed"]),
                lr=float(finish["lr"]), lam=float(finish["lam"]), plan=plan,
                start=str(finish.get("start", "personalized")), client_index=self.clients.tolist(),
                local_solver=resolve_local_solver("auto", self.model, vote_held=bool(vote)),
                block=END_OF_RUN_BLOCK, **vote,
            )  # fmt: skip

            done, final, scored, sink_seconds = finish_and_score(
                self, options, personal, glob_model
            )  # (the pass trains the model as run_pmtl does: train mode)
            if done.choice is not None:
                out["choice"] = [int(v) for v in done.choice]
            out["grids"] = done.grids
        scoring = time.perf_counter()
        out.update(self._scores(personal, glob_model, final) if scored is None else scored)
        self.final = personal if final is None else final
        if finish.get("baseline"):  # the clients' training alone, beside their final models
            t0 = time.perf_counter()
            held = finish.get("winner") is not None
            out["baseline"] = self.baseline_scores(finish, vote_held=held)
            out["baseline_seconds"] = time.perf_counter() - t0
        out["score_seconds"] = time.perf_counter() - scoring + sink_seconds
        return out

    def _end_data(self) -> FederatedDataset:
        """The data :func:`~privmtl.federated.finish.finish_clients` finishes this node's
        clients on: a lazy partition is drawn a block at a time there (its own blocks when it
        holds more than one; drawn now, as one block, when it holds fewer), never kept whole."""
        if is_lazy(self.local) and len(self.clients) <= END_OF_RUN_BLOCK:
            return self.local.subset(range(len(self.clients)))
        return self.local

    def _pieces(self) -> Any:
        """This node's clients a block at a time: ``(positions, their data)``; a data set held
        in memory in one piece, a lazy partition in blocks of
        :data:`~privmtl.federated.blocks.END_OF_RUN_BLOCK` drawn one after the other."""
        n = len(self.clients)
        if not is_lazy(self.local):
            yield np.arange(n), self.local
            return
        for pos in client_blocks(n, END_OF_RUN_BLOCK):
            yield pos, self.local.subset(pos.tolist())

    def _scores(self, personal: Params, glob_model: Params, final: Params | None) -> dict[str, Any]:
        """Per-client correct counts on the validation and test splits of the personalized,
        global and (where computed) final models, and the splits' sizes, scored a block of
        clients at a time (:meth:`_pieces`)."""
        got: dict[str, list[float]] = {}
        for pos, piece in self._pieces():
            whole = len(pos) == len(self.clients)
            own = None if final is None or whole else block_rows(final, pos)
            self._score_block(pos, piece, personal, glob_model, final if whole else own, got, whole)
        return self._score_result(got)

    def _score_block(
        self,
        pos: np.ndarray,
        piece: FederatedDataset,
        personal: Params,
        glob_model: Params,
        final: Params | None,
        got: dict[str, list[float]],
        whole: bool,
    ) -> None:
        """Add to ``got`` the correct counts of the clients at ``pos`` (their data ``piece``)
        on the validation and test splits of their personalized, the global and their final
        models (``final``: the block's own rows, or None), and the splits' sizes."""
        for split in ("val", "test"):
            xs, ys = piece.split(split)
            xs = [x.to(self.dtype) for x in xs]
            got.setdefault(f"{split}_n", []).extend(float(y.shape[0]) for y in ys)
            for name in ("personal", "global", "final"):
                if name == "global":
                    own = {
                        n: p.unsqueeze(0).expand(len(ys), *p.shape) for n, p in glob_model.items()
                    }
                elif name == "final":
                    if final is None:
                        continue
                    own = final
                else:
                    own = personal if whole else block_rows(personal, pos)
                correct, _ = client_scores(self.model, own, self.buffers, xs, ys)
                got.setdefault(f"{split}_{name}", []).extend(float(v) for v in correct)

    def _score_result(self, got: dict[str, list[float]]) -> dict[str, Any]:
        got["train_n"] = [float(v) for v in self.local.sizes("train")]
        return {
            **got,
            "client_ids": list(self.client_ids),
            "clients": [int(k) for k in self.clients],
        }

    def baseline_scores(self, finish: dict[str, Any], *, vote_held: bool) -> dict[str, list[float]]:
        """This node's part of the run's baseline
        (:func:`~privmtl.federated.baseline.local_scores`): for its clients among the
        population's :func:`~privmtl.federated.baseline.baseline_sample`, their correct test
        predictions of the final and of the local model (each client's own training, solved as
        ``run_pmtl`` solves it) and their test examples, in population order."""
        assert self.final is not None
        seed = int(finish["seed"])
        sample = baseline_sample(int(finish.get("num_clients", self.m)), seed)
        mine = np.flatnonzero(np.isin(self.clients, sample))
        if not len(mine):
            return {"clients": [], "final": [], "local": [], "n": []}
        solver = resolve_local_solver("auto", self.model, vote_held=vote_held)
        book = BlockScores(self.model, self.buffers, ("test",))
        if is_lazy(self.local):  # drawn a block at a time
            blocks = [mine[at] for at in client_blocks(len(mine), END_OF_RUN_BLOCK)]
        else:
            blocks = [mine]
        for pos in blocks:
            everyone = len(pos) == len(self.clients)
            part = (
                self.local
                if everyone and not is_lazy(self.local)
                else self.local.subset(pos.tolist())
            )
            alone = train_local(
                part, self.model, batch_size=int(finish["batch_size"]), seed=seed,
                select="client", client_index=self.clients[pos].tolist(), solver=solver,
                scores=False,
            )  # fmt: skip
            assert alone.personalized_params is not None
            with torch.no_grad():
                own = self.final if everyone else block_rows(self.final, pos)
                book.add("final", own, True, part)
                local = {k: v.cpu() for k, v in alone.personalized_params.items()}
                book.add("local", local, True, part)
        final_c, n = book.per_client("test", "final")
        local_c, _ = book.per_client("test", "local")
        return {
            "clients": [int(k) for k in self.clients[mine]],
            "final": [float(v) for v in final_c],
            "local": [float(v) for v in local_c],
            "n": [float(v) for v in n],
            "solver": solver,  # type: ignore[dict-item]
        }

    def save_models(self, token: str) -> Path | None:
        """Write the final models of this node's clients (as :meth:`evaluate` scored them) to
        ``state_dir/MODELS_FILE``, tagged with the run's ``token``; None without storage.

        They are per-client outputs: they stay in the node's own storage (on its own machine in a
        real deployment) and are never sent to the ServerApp.
        """
        if self.state_dir is None or self.final is None:
            return None
        data = {
            "token": token,
            "clients": torch.from_numpy(self.clients),
            "client_ids": list(self.client_ids),
            "finetuned": self.finetuned,
            "n_classes": int(self.local.n_classes),
            "feature_shape": [int(v) for v in self.local.feature_shape],
            "models": {n: p.detach().contiguous().clone() for n, p in self.final.items()},
        }
        self.state_dir.mkdir(parents=True, exist_ok=True)
        path = self.state_dir / MODELS_FILE
        write_atomic(path, to_bytes(data))
        return path


def load_node(
    opts: dict[str, Any],
    pid: int,
    parts: int,
    state_dir: str | None,
    model_dir: str | None = None,
    method_dir: str | None = None,
    *,
    device: str | None = None,
    report: Callable[[str], None] | None = None,
) -> NodeClients:
    """Build the node's clients.

    A synthetic node (:data:`STREAMED_DATA`) builds the population without drawing it (the
    clients' sizes) and keeps its own clients as a lazy partition
    (:meth:`~privmtl.data.streamed.SyntheticFederation.partition`): nothing is drawn or cached
    here, a round draws its sampled clients and the end of run a block at a time. Any other
    node reads its own clients once and caches them as tensors in the node's storage, so that
    a later process maps them instead (:func:`node_dataset`). A user's model
    factory is loaded from this machine's ``model_dir`` (default: the run configuration's
    ``model-dir``) and refused unless its file is the code the run announces
    (:func:`privmtl.flower.factory.load_checked`); a user's method likewise from ``method_dir``
    (:func:`privmtl.flower.factory.load_checked_method`). ``device`` (default: the run
    configuration's ``device``) is where the rounds' client step runs; one that is not available
    on this machine is refused in one line naming the node. ``report(stage)`` is told what the
    node is doing (:class:`~privmtl.flower.discovery.NodeLoader`).
    """
    import hashlib

    say = report or (lambda stage: None)
    who = f"SuperNode partition {pid}"
    say("checking the run's code and device")
    where = str(opts.get("device", "cpu")) if device is None else device
    try:
        dev = resolve_device(where, name="device")
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"{who}: {exc}") from None
    user = load_checked(opts, who, model_dir)
    load_checked_method(opts, who, method_dir)  # a user's method: this machine's copy, checked

    seed = int(opts["seed"])
    num = given({"num-clients": NONE, **opts}, "num-clients")
    table = json.dumps(table_options(opts), sort_keys=True)
    ident = json.dumps([opts["data"], opts["data-path"], seed, pid, parts, num, table])
    cache = None
    streamed = str(opts["data"]) in STREAMED_DATA
    if state_dir is not None and not streamed:
        digest = hashlib.sha256(ident.encode()).hexdigest()[:16]
        cache = Path(state_dir) / f"data-{digest}-v3.pt"
    if cache is not None and cache.exists():
        say("mapping its cached data")
        d = torch.load(cache, weights_only=True, mmap=True)  # mapped, not read
        local = node_dataset(d)
        net = make_model(str(opts["model"]), local, seed, factory=user)
        say("opening its clients' stored models")
        return NodeClients.from_parts(
            local,
            net,
            clients=d["clients"].numpy(),
            full_offsets=d["full_offsets"].numpy(),
            partition_id=pid,
            num_partitions=parts,
            state_dir=state_dir,
            device=dev,
            data_sha256=str(d["sha256"]),
        )
    say(f"loading the population's {opts['data']} data")
    ds = population(
        str(opts["data"]), str(opts["data-path"]), seed, None if num is None else int(num), table
    )
    net = make_model(str(opts["model"]), ds, seed, factory=user)
    if streamed:
        say("keeping its clients (drawn when a round or the end of run needs them)")
    else:
        say(f"drawing its {len(partition(ds.n_clients, pid, parts))} clients' data")
    node = NodeClients(
        ds, net, partition_id=pid, num_partitions=parts, state_dir=state_dir, device=dev
    )
    if cache is not None and not is_lazy(node.local):
        say("caching its data")
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache, to_bytes(node.data_state()))
    return node
