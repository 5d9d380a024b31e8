"""What the ServerApp runs: PMTL's curator with the in-process engine's ledger, checkpoint and
round record (:class:`ServerRun`), independent of the transport.

:class:`ServerRun` holds PMTL's :class:`~privmtl.federated.protocol.Curator` (sampling, clip →
mean over the fixed ``q`` → noise → write-ahead ledger → billboard) set up by
:func:`~privmtl.federated.protocol.setup_run` and :func:`~privmtl.federated.protocol.make_curator`
as the Trainer sets it up, with the Trainer's ledger, checkpoint fingerprint, budget stop and round
record, so a seeded run releases the same billboards. The server never sees a personalized model:
it receives the clients' messages and per-client evaluation counts (and, with ``finetune="auto"``,
each client's choice), and releases the clients' end-of-run vote from the nodes' summed shares
(:mod:`privmtl.flower.vote`). The run's options are :mod:`privmtl.flower._core`'s.
"""

from __future__ import annotations

import json
import math
import secrets
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privmtl.checkpoint import (
    has_checkpoint,
    ledger_seen,
    load_checkpoint,
    save_checkpoint,
    write_atomic,
)
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import Params
from privmtl.federated.backend import (
    budget_stops,
    fingerprint_base,
    make_curator,
    new_ledger,
    round_record,
    run_result,
    setup_run,
)
from privmtl.federated.baseline import local_keys
from privmtl.federated.config import TrainResult
from privmtl.federated.finish import (
    AUTO_NOTE,
    FINETUNE_NOTE,
    FINETUNE_VOTE_NOTE,
    auto_info,
    auto_plan,
    final_models_keys,
    vote_candidates,
)
from privmtl.federated.report import result_dict, scaling_note
from privmtl.federated.spec import RunSpec
from privmtl.flower._core import given, given_spec, make_run
from privmtl.flower.factory import checked_method
from privmtl.flower.run_info import read_run_info
from privmtl.flower.vote import elect, vote_plan
from privmtl.locking import DirectoryLock
from privmtl.per_client import pmtl_rows, ratio
from privmtl.privacy.ledger import PrivacyLedger
from privmtl.privacy.noise import make_noise_source

__all__ = ["ServerRun", "read_run_info"]


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
    data_sha256 : str or None
        The fingerprint of the nodes' data (:func:`privmtl.flower.discovery.data_fingerprint` of
        the hashes each node computes of its own clients' data), recorded in the checkpoint: a
        resumed run whose nodes hold other data is refused.

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
        data_sha256: str | None = None,
    ) -> None:
        m = num_clients
        self.opts, self.m = opts, m
        # the fingerprint of the nodes' data (each node hashes its own): a resume must match it
        self.data_sha256 = data_sha256
        self.node_devices: list[str] = []  # set by the ServerApp from the nodes' descriptions
        # the clients' end-of-run vote where run_pmtl holds it: its event reserved in the budget
        self.vote = vote_plan(given_spec(opts), m, str(opts["model"]))
        self.vote_record: dict[str, Any] | None = None
        # the clients' feature scaling, as the nodes describe their data (a table's)
        self.data_scaling = "none"
        self.winner: str | None = None
        reserve = None if self.vote is None else self.vote.event()
        self.run = run = make_run(opts, m, reserve)  # resolved once
        self.spec: RunSpec = run.spec  # type: ignore[assignment]  # resolved from a RunSpec
        # the release, billboard, shared parameters and personal_init as the Trainer sets them up
        self.setup = setup = setup_run(run, m, init)  # the release calibrated to the target
        self.sigma = float(setup.config.noise_std)
        self.config = cfg = setup.config
        self.q = setup.q
        budget = given(opts, "budget-epsilon")
        self.budget = None if budget is None else float(budget)
        self.checkpoint_every = int(opts["checkpoint-every"])
        self.server_dir = None if server_dir is None else Path(server_dir)
        seen = None
        if self.server_dir is not None:
            # one writer per directory, for as long as this server lives (or its process)
            lock = DirectoryLock.acquire(self.server_dir, name="work_dir")
            weakref.finalize(self, lock.release)
            ledger_path = self.server_dir / "ledger.jsonl"
            seen = ledger_seen(self.server_dir)  # the ledger must continue what it saw
        mech = setup.release
        self.delta = float(cfg.delta or 0.0)  # resolved by setup_run
        self.ledger: PrivacyLedger | None = None
        if mech.private:
            self.ledger = new_ledger(
                cfg,
                self.delta,
                self.budget,
                None if ledger_path is None else Path(ledger_path),
                seen=seen,
                seen_by=f"the checkpoint in {self.server_dir}",
            )
            self.ledger.epsilon_if(mech.event())
        self.noise_source = cfg.noise_source
        self.curator = make_curator(
            setup, noise=make_noise_source(cfg.noise_source, cfg.seed), ledger=self.ledger
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
        return {
            **fingerprint_base(self.config, self.noise_source, self.m),
            "data": str(self.opts["data"]),
            "data_path": str(self.opts["data-path"]),
            "model": str(self.opts["model"]),
            # a user's factory or method: a resumed run must load the same code
            **({"model_sha256": sha} if (sha := str(self.opts.get("model-sha256") or "")) else {}),
            **({"method_sha256": h} if (h := str(self.opts.get("method-sha256") or "")) else {}),
            "shapes": self.shapes,
            **({"data_sha256": self.data_sha256} if self.data_sha256 else {}),
            "run": self.run_index,
            "token": self.token,
        }

    def _open(self, resume: bool) -> None:
        assert self.server_dir is not None
        d = self.server_dir
        info = read_run_info(d / "run.json")
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
            ledger=None if self.ledger is None else self.ledger.seen(),
        )

    def stop_on_budget(self) -> bool:
        """True (and ``stopped_on_budget`` set) when the next release would exceed the budget."""
        if budget_stops(self.curator, self.budget):
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
        rec = round_record(
            t,
            sampled,
            [losses[k] for k in answered if k in losses],
            out,
            self.curator.release_mechanism.noise_multiplier,
            float(out.epsilon) if self.ledger is not None else math.inf,
            seconds,
            answered=answered,
            **(extra or {}),
        )
        if secure is not None and not len(out.clipped):
            rec["clipped_fraction"] = math.nan  # the curator never sees a message (secagg)
        self.history.append(rec)
        self.billboards.append({n: p.clone() for n, p in self.curator.billboard.items()})
        r = self.curator.round
        if r % self.checkpoint_every == 0 or r == self.config.rounds:
            self.save()

    def result(self, evaluations: list[dict[str, list[float]]], started: float) -> TrainResult:
        """A :class:`TrainResult` (no personalized models: they stay on the nodes)."""
        personalized = self.setup.spec.personalized
        kinds = (("personalized", "personal"),) if personalized else ()
        acc: dict[str, dict[str, dict[str, float]]] = {}
        for split in ("val", "test"):
            n = np.concatenate([np.asarray(e[f"{split}_n"]) for e in evaluations])
            acc[split] = {
                kind: _accuracy(
                    np.concatenate([np.asarray(e[f"{split}_{key}"]) for e in evaluations]), n
                )
                for kind, key in (*kinds, ("global", "global"))
            }
        return run_result(
            self.config,
            self.history,
            acc,
            personalized=None,
            global_params=self.global_model(),
            primary="personalized" if personalized else "global",
            epsilon=self.epsilon,
            delta=self.delta,
            ledger=self.ledger,
            noise_source=self.noise_source,
            stopped_on_budget=self.stopped_on_budget,
            client_ids=[],
            extra={
                "wall_seconds": time.perf_counter() - started,
                # what the method reports beyond the common keys (FedRep's split), as the Trainer
                **self.setup.spec.extra(self.setup.shared, list(self.setup.init)),
            },
        )

    def global_model(self) -> Params:
        """The released global model: the billboard and, with partial sharing, the initial
        values of the parameters that are not shared (as the in-process engine reports it)."""
        board = self.curator.billboard
        return {n: board.get(n, p) for n, p in {**self.setup.init, **board}.items()}

    def models_state(self) -> dict[str, Any]:
        """What the ServerApp keeps for a models folder (``save-models``): the released global
        model (:meth:`global_model`), the run's token, the resolved :class:`TrainConfig` (JSON)
        and the model the method is evaluated with; never a personalized model."""
        personalized = self.setup.spec.personalized
        return {
            "token": self.token,
            "global": {n: p.detach().contiguous().clone() for n, p in self.global_model().items()},
            "config": json.dumps(self.config.to_dict(), default=float),
            "primary": "personalized" if personalized else "global",
        }

    def finish_settings(self) -> dict[str, Any]:
        """The public settings of every client's end of the run, sent to the nodes with the
        final billboard (:meth:`NodeClients.evaluate`): what ``run_pmtl`` passes to
        :func:`~privmtl.federated.finish.finish_clients` for the same run."""
        cfg = self.config
        dim = next((h["released_dim"] for h in self.history if "released_dim" in h), None)
        personalized = self.setup.spec.personalized
        return {
            "method": cfg.method,
            "finetune": self.spec.finetune,
            "start": "personalized" if personalized else "global",
            "personal_init": cfg.personal_init,
            "shared_params": None if cfg.shared_params is None else list(cfg.shared_params),
            "noise_std": float(self.sigma or 0.0),
            "clip": cfg.clip,
            "released_dim": int(dim or 0),
            "rounds": len(self.history) or cfg.rounds,
            "batch_size": cfg.batch_size,
            "seed": cfg.seed,
            "lr": cfg.lr,
            "lam": float(cfg.lam or 0.0),
            # the resolved TrainConfig: the method's end of run on the nodes (NodeClients.outputs)
            "config": cfg.to_dict(),
            # the vote: held (the nodes first count their clients' shares), then its winner
            "vote": self.vote is not None,
            "winner": self.winner,
            "num_clients": self.m,
            "noise_source": self.noise_source,
            "baseline": True,  # every run reports the clients' training alone beside its result
        }

    def client_rows(self, evaluations: list[dict[str, Any]], result: dict[str, Any]) -> Any:
        """The run's per-client rows (:func:`~privmtl.per_client.pmtl_rows`) from the nodes'
        evaluations (in partition order: the population's) and the run's ``result``."""
        # the nodes' evaluations in population order (they come in the order nodes answered)
        evaluations = sorted(
            evaluations, key=lambda e: int(e["clients"][0]) if len(e["clients"]) else 0
        )

        def cat(key: str) -> np.ndarray:
            return np.concatenate([np.asarray(e[key], dtype=np.float64) for e in evaluations])

        ids = [cid for e in evaluations for cid in e["client_ids"]]
        sizes = {s: cat(f"{s}_n").astype(np.int64) for s in ("train", "val", "test")}
        if all("test_final" in e for e in evaluations):
            correct = cat("test_final")
        elif self.setup.spec.personalized:
            correct = cat("test_personal")
        else:
            correct = cat("test_global")
        if all("choice" in e for e in evaluations):
            fin = self.finish_settings()
            plan = auto_plan(
                fin["method"], fin["shared_params"], fin["noise_std"], fin["clip"],
                fin["released_dim"], fin["rounds"],
            )  # fmt: skip
            choice = np.concatenate([np.asarray(e["choice"], dtype=np.int64) for e in evaluations])
            kept = [str(v) for v in np.asarray(plan.names, dtype=object)[choice]]
        else:
            (name,) = result["clients_per_final_model"]
            kept = [str(name)] * len(ids)
        local = None
        parts = [e["baseline"] for e in evaluations if e.get("baseline")]
        if parts:
            local = np.full(len(ids), np.nan)
            for p in parts:
                idx = np.asarray(p["clients"], dtype=np.int64)
                local[idx] = ratio(np.asarray(p["local"]), np.asarray(p["n"]))
        return pmtl_rows(ids, sizes, kept, correct, local)

    def baseline_keys(self, evaluations: list[dict[str, Any]]) -> dict[str, Any]:
        """The result's baseline keys (:func:`~privmtl.federated.baseline.local_keys`) from the
        nodes' parts (:meth:`NodeClients.baseline_scores`), in population order; ``{}`` where no
        node sent one."""
        parts = [e["baseline"] for e in evaluations if e.get("baseline")]
        if not parts:
            return {}
        cat = {
            k: np.concatenate([np.asarray(p[k], dtype=np.float64) for p in parts])
            for k in ("clients", "final", "local", "n")
        }
        order = np.argsort(cat["clients"], kind="stable")
        solver = next((str(p["solver"]) for p in parts if "solver" in p), "sgd")
        keys = local_keys(
            cat["final"][order], cat["local"][order], cat["n"][order], m=self.m, solver=solver
        )
        # the nodes train their clients alone in parallel: the slowest node's time
        keys["baseline_seconds"] = max(float(e.get("baseline_seconds", 0.0)) for e in evaluations)
        return keys

    def elect(self, shares: np.ndarray) -> str | None:
        """Release the clients' vote from the nodes' summed ``shares`` (the candidates of
        :func:`~privmtl.federated.finish.vote_candidates`) through the ledger, as ``run_pmtl``
        does; returns the winner (None: no room left in the budget, every client chooses)."""
        assert self.vote is not None
        fin = self.finish_settings()
        plan = auto_plan(
            fin["method"], fin["shared_params"], fin["noise_std"], fin["clip"],
            fin["released_dim"], fin["rounds"],
        )  # fmt: skip
        names = vote_candidates(plan, "ridge")
        won, self.vote_record, _ = elect(
            self.vote, shares, names, ledger=self.ledger, noise_source=self.noise_source,
            seed=int(self.config.seed), delta=self.delta, accountant=self.config.accountant,
        )  # fmt: skip
        if won is None:
            self.vote = None  # every client chooses on its own
        self.winner = None if won is None else names[won]
        return self.winner

    def _finish_part(
        self, evaluations: list[dict[str, Any]], pre_test_accuracy: float
    ) -> tuple[dict[str, Any], list[str]]:
        """The result keys of the clients' end of the run (as ``run_pmtl``'s) and its notes."""
        fin = self.finish_settings()
        if fin["finetune"] == "none":
            return {}, []
        acc = {}
        for split in ("val", "test"):
            n = np.concatenate([np.asarray(e[f"{split}_n"]) for e in evaluations])
            final = np.concatenate([np.asarray(e[f"{split}_final"]) for e in evaluations])
            acc[split] = _accuracy(final, n)
        part: dict[str, Any] = {"finetune": fin["finetune"]}
        notes: list[str] = []
        if fin["finetune"] == "auto":
            plan = auto_plan(
                fin["method"], fin["shared_params"], fin["noise_std"], fin["clip"],
                fin["released_dim"], fin["rounds"],
            )  # fmt: skip
            choice = np.concatenate([np.asarray(e["choice"], dtype=np.int64) for e in evaluations])
            counts = np.bincount(choice, minlength=len(plan.names)).tolist()
            grids: dict[str, Any] = next((e["grids"] for e in evaluations if e.get("grids")), {})
            held = self.winner is not None
            record = self.vote_record
            if record is not None and held:
                record = {**record, "voters": int(sum(e.get("voters", 0) for e in evaluations))}
            part["finetune_auto"] = auto_info(
                plan, counts, grids, "ridge" if held else "sgd", record
            )
            notes.append(FINETUNE_VOTE_NOTE if held else AUTO_NOTE)
        else:
            part["finetune_start"] = fin["start"]
        part.update(
            {
                "pre_finetune_test_accuracy": pre_test_accuracy,
                "test_accuracy": acc["test"]["accuracy"],
                "mean_client_accuracy": acc["test"]["mean_client_accuracy"],
                "val_accuracy": acc["val"]["accuracy"],
            }
        )
        if fin["finetune"] != "auto":
            part["finetune_note"] = FINETUNE_NOTE
        return part, notes

    def result_dict(self, evaluations: list[dict[str, Any]], started: float) -> dict:
        """The JSON of ``privmtl pmtl`` for this run, plus ``engine``."""
        res = self.result(evaluations, started)
        part, notes = self._finish_part(evaluations, float(res.test_accuracy))
        notes = [*scaling_note(self.data_scaling), *notes]
        out = result_dict(
            res,
            method=self.config.method,
            model=str(self.opts["model"]),
            data=str(self.opts["data"]),
            sigma=self.sigma,
            q=self.q,
            m=self.m,
            notes=notes,
        )
        out.update(part)
        out.update({k: res.extra[k] for k in self.setup.spec.result_keys if k in res.extra})
        out.update(
            final_models_keys(
                str(self.spec.finetune),
                self.m,
                auto=part.get("finetune_auto"),
                from_billboard=False,
                personalized=self.setup.spec.personalized,
            )
        )
        # the resolved settings (personal_init as the ServerApp resolved it), as run_pmtl's
        out["config"] = self.spec.replace(personal_init=self.config.personal_init).to_dict()
        out["clients_per_round_default"] = given(self.opts, "clients-per-round") is None
        out["scaling"] = self.data_scaling  # as the nodes describe their data
        out.update(self.baseline_keys(evaluations))
        out["engine"] = "flower-deployment"
        # where the nodes ran their clients' step, as they describe themselves (scoring: the CPU)
        out["device"] = ",".join(sorted(set(self.node_devices))) or "cpu"
        if self.data_sha256:
            out["data_sha256"] = self.data_sha256
        if self.opts.get("model-sha256"):  # the factory code every machine checked it ran
            out["model_sha256"] = str(self.opts["model-sha256"])

        _, source = checked_method(self.opts)
        if source is not None:  # a user's method: its file, as run_pmtl records it
            out["method_source"] = dict(source)
        out["on_missing"] = str(self.opts["on-missing"])
        out["clients_answered_per_round"] = [len(h["answered"]) for h in self.history]
        out["budget_epsilon"] = self.budget
        out["run_index"] = self.run_index
        out["ledger_releases"] = 0 if self.ledger is None else len(self.ledger.records)
        if self.server_dir is not None:
            out["server_dir"] = str(self.server_dir)
        return json.loads(json.dumps(out, default=float))
