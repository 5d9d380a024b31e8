"""The in-process backend: :class:`Trainer` drives any method object round by round.

All clients' data sit in one process; the sampled clients of a round train together in the
batched engine (:func:`~privmtl.federated.client.local_sgd_batched`, work-balanced groups on
threads), and the run is steppable, checkpointable and resumable.

The engine computes on ``config.device`` (:func:`~privmtl._device.resolve_device`): the model,
the training data, the billboard and the clients' stored rows live there. Client sampling stays
numpy on the CPU, the release's noise is drawn on the CPU by the noise source and moved to the
device (:meth:`~privmtl.privacy.noise.NoiseSource.normal_like`), the ledger is the same, and
checkpoints hold CPU tensors (a run checkpointed on a GPU resumes on a CPU).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from privmtl._device import one_blas_thread, resolve_device, to_device
from privmtl._progress import Progress
from privmtl._validation import check_choice, check_int, check_real
from privmtl.checkpoint import has_checkpoint, load_checkpoint, save_checkpoint
from privmtl.data.federated import FederatedDataset
from privmtl.data.synthetic_federated import client_id_list
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import (
    LOCAL_TRAINING_STREAM,
    PackedPlan,
    Params,
    RoundPlan,
    draw_round_plan,
    pack_plan,
    partition_plan,
)
from privmtl.federated.backend import (
    RoundRecord,
    budget_stops,
    fingerprint_base,
    make_curator,
    new_ledger,
    round_record,
    run_result,
    setup_run,
)
from privmtl.federated.client import (
    UpdateRule,
    local_sgd_batched,
    local_sgd_reference,
    local_sgd_sets,
)
from privmtl.federated.client_models import ClientModels
from privmtl.federated.config import (
    CLIENT_CHUNK,
    ResolvedRun,
    TrainConfig,
    TrainResult,
    check_inputs,
    resolve,
)
from privmtl.federated.gradients import make_step_fn, tape_free
from privmtl.federated.methods import Method, TrainFn
from privmtl.federated.scoring import evaluate_dataset
from privmtl.federated.spec import EXECUTION
from privmtl.federated.store import ClientStore
from privmtl.locking import DirectoryLock
from privmtl.privacy.ledger import PrivacyLedger, warn_budget_stop
from privmtl.privacy.noise import make_noise_source
from privmtl.privacy.sampling import ClientSampler

__all__ = ["MessageHook", "Trainer"]

MessageHook = Callable[[int, np.ndarray, Params], Params]


@dataclasses.dataclass(frozen=True)
class RoundData:
    """The training rows of a round's clients, stacked (``x``, ``y``), the ``j``-th client's
    beginning at row ``starts[j]``."""

    x: torch.Tensor
    y: torch.Tensor
    starts: np.ndarray


def _refuse_running_buffers(model: nn.Module) -> None:
    for name, mod in model.named_modules():
        batch_norm = isinstance(mod, nn.modules.batchnorm._BatchNorm)
        running = isinstance(mod, nn.modules.instancenorm._InstanceNorm) and mod.track_running_stats
        if batch_norm or running:
            raise InvalidParameterError(
                f"The 'model' parameter has a {type(mod).__name__} ({name or 'root'}): it "
                "normalizes with statistics of the minibatch or keeps running statistics, which "
                "would mix examples across the padded minibatches of the batched engine and "
                "clients' data in shared buffers. Use LayerNorm or GroupNorm instead."
            )


class Trainer:
    r"""The in-process driver of every federated method: steppable, checkpointable, resumable.

    Parameters
    ----------
    dataset : FederatedDataset
        One client per task; training uses ``train``, evaluation ``val`` and ``test``.
    model : torch.nn.Module
        Architecture and initial parameters (copied: the module itself is never modified).
        Modules whose buffers change in training (BatchNorm with running statistics) are refused.
    config : TrainConfig, optional
    noise_source : {"secure", "seeded"}, optional
        Default ``config.noise_source``. ``"seeded"`` is for research simulation only.
    sampler : ClientSampler, optional
        Default ``make_sampler(config.sampling, m, q)``.
    ledger : PrivacyLedger, optional
        Default: a new ledger (``config.accountant``, ``config.relation``, the resolved δ and
        the target ``config.epsilon``), durable at ``checkpoint_dir/ledger.jsonl`` when a checkpoint directory is
        given.
    checkpoint_dir : path, optional
        Where the run's state is saved atomically every ``checkpoint_every`` rounds and at the end.
    checkpoint_every : int, default 1
    resume : bool, default False
        Continue the run checkpointed in ``checkpoint_dir`` (refused if it is from another
        configuration). Without ``resume`` a directory that already holds a checkpoint is refused.
    budget_epsilon : float, optional
        Stop before the release that would take ε above it (default ``config.budget``).
    on_budget : {"stop", "raise"}, default "stop"
        Stop cleanly (``result().stopped_on_budget``) or raise :class:`PrivacyBudgetError`.
    message_hook : callable, optional
        ``hook(round, sampled, messages) -> messages``: sees (and may replace) the clients'
        messages before the curator clips them — for audits with adversarial canary clients.
    initial_state : dict, optional
        Client states to start from instead of the model's parameters (e.g. PP-SGD's ``θ``:
        ``{"theta": {name: (m, ...)}}``).
    score_at_end : bool, default True
        Whether :meth:`result` scores the models on every client's validation and test data.
        False leaves the scores NaN for a caller that scores them itself (``privmtl pmtl``'s
        end of run scores them while it finishes each block of clients).

    Examples
    --------
    >>> trainer = Trainer(dataset, model, TrainConfig(rounds=10), noise_source="seeded")
    >>> for rec in trainer:                     # doctest: +SKIP
    ...     print(rec.round, rec.epsilon)
    >>> result = trainer.result()               # doctest: +SKIP
    """

    def __init__(
        self,
        dataset: FederatedDataset,
        model: nn.Module,
        config: TrainConfig | ResolvedRun | None = None,
        *,
        noise_source: str | None = None,
        sampler: ClientSampler | None = None,
        ledger: PrivacyLedger | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_every: int = EXECUTION.checkpoint_every,
        resume: bool = False,
        budget_epsilon: float | None = None,
        on_budget: str = "stop",
        message_hook: MessageHook | None = None,
        initial_state: dict[str, Any] | None = None,
        method: Method | type[Method] | str | None = None,
        score_at_end: bool = True,
    ) -> None:
        config = TrainConfig() if config is None else config
        check_inputs(dataset, model)
        _refuse_running_buffers(model)
        # q, λ, δ and σ of a target ε, once: a ResolvedRun is used as it is
        run = (
            config
            if isinstance(config, ResolvedRun)
            else resolve(config, dataset.n_clients, sampler=sampler)
        )
        config = run.config
        self.device = resolve_device(config.device)
        self.dataset, self.config = dataset, config
        self.model = copy.deepcopy(model).to(self.device)
        m = dataset.n_clients
        self.m = m
        self.noise_source = check_choice(
            "noise_source", noise_source or config.noise_source, ("secure", "seeded")
        )
        self.checkpoint_every = check_int("checkpoint_every", checkpoint_every, low=1)
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.on_budget = check_choice("on_budget", on_budget, ("stop", "raise"))
        budget = config.budget if budget_epsilon is None else budget_epsilon
        if budget is not None:
            budget = check_real("budget_epsilon", budget, low=0.0, closed="neither")
        self.budget = budget
        self.message_hook = message_hook
        self.score_at_end = bool(score_at_end)

        init = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        if not init:
            raise InvalidParameterError("The 'model' parameter must have at least one parameter.")
        self.buffers = {n: b.detach() for n, b in self.model.named_buffers()}
        # every client's training rows by offset; a round reads its sampled clients' rows only
        self.offsets = dataset.offsets("train")
        self._dtype = next(iter(init.values())).dtype

        # ---- the release of this method, the billboard and the curator
        setup = setup_run(run, m, init, sampler=sampler, method=method)
        self.spec = self.method = spec = setup.spec
        config, q = setup.config, setup.q
        self.delta = float(config.delta or 0.0)  # resolved by setup_run
        self.config, self.q, self.shared = config, q, setup.shared
        self._personal_init = setup.personal_init
        init = setup.init
        mech = setup.release
        if spec.communicates and mech.private:
            if ledger is None:
                ledger = self._make_ledger()
            ledger.epsilon_if(mech.event())  # fail fast on an unsupported combination
        if budget is not None and ledger is not None:
            ledger.budget = budget
        self.ledger = ledger if spec.communicates and mech.private else None
        noise = make_noise_source(self.noise_source, config.seed)
        self.curator = make_curator(setup, noise=noise, ledger=self.ledger)
        self.clients: ClientStore = spec.initial_state(init, m, initial_state).to(self.device)
        self.names = list(init)
        self.history: list[dict[str, Any]] = []
        self.epsilon = 0.0 if not spec.communicates else (math.inf if self.ledger is None else 0.0)
        self.stopped_on_budget = False
        self._train_seconds = 0.0
        self._data_sha256: str | None = None
        self._step_fn: Any = None
        self._last_packed: tuple[RoundPlan, PackedPlan] | None = None
        self._local = threading.local()
        if self.checkpoint_dir is not None:
            self._open_checkpoint(resume)

    # ---------------------------------------------------------------------------- setup
    def _make_ledger(self, path: Path | None = None) -> PrivacyLedger:
        return new_ledger(self.config, self.delta, self.budget, path)

    def fingerprint_config(self) -> dict[str, Any]:
        """What a checkpoint must match: results-relevant config, data, model and noise source."""
        sizes = self.dataset.sizes("train").tolist()
        ids = hashlib.sha256("\n".join(self.dataset.client_ids).encode()).hexdigest()
        if self._data_sha256 is None:  # the data never changes during a run: hashed once
            self._data_sha256 = self.dataset.content_sha256()
        return {
            **fingerprint_base(self.config, self.noise_source, self.m),
            "client_ids_sha256": ids,
            "train_sizes_sha256": hashlib.sha256(str(sizes).encode()).hexdigest(),
            "data_sha256": self._data_sha256,
            "model": {n: list(p.shape) for n, p in self.model.named_parameters()},
        }

    def _open_checkpoint(self, resume: bool) -> None:
        assert self.checkpoint_dir is not None
        d = self.checkpoint_dir
        # one writer per directory, for as long as this trainer lives (released with it, or by
        # the OS when the process ends)
        lock = DirectoryLock.acquire(d, name="checkpoint_dir")
        weakref.finalize(self, lock.release)
        exists = has_checkpoint(d)
        if exists and not resume:
            raise InvalidParameterError(
                f"The checkpoint directory {d} already holds a run; pass resume=True (--resume) "
                "to continue it, or choose an empty directory."
            )
        state, manifest = None, None
        if exists:
            state, manifest = load_checkpoint(
                d, kind="pmtl-family", config=self.fingerprint_config()
            )
        if self.ledger is not None:
            if not exists and not resume and (d / "ledger.jsonl").exists():
                # killed before its first checkpoint: the spent budget is in the ledger
                raise InvalidParameterError(
                    f"{d} holds the privacy ledger of a run killed before its first checkpoint; "
                    "pass resume=True (--resume) to restart it from round 0 with that ledger."
                )
            if self.ledger.records:
                raise InvalidParameterError(
                    "Give either a ledger or a checkpoint directory, not a ledger with releases."
                )
            # the ledger must continue the one the checkpoint saw (deleted, cut or edited: refused)
            durable = new_ledger(
                self.config,
                self.delta,
                self.ledger.budget,
                d / "ledger.jsonl",
                seen=None if manifest is None else (manifest.get("ledger") or {}),
                seen_by=f"the checkpoint of round {manifest['step']} in {d}" if manifest else "",
            )
            self.ledger = self.curator.ledger = durable
        if state is not None:
            self.load_state_dict(state)
            if self.ledger is not None:
                # the ε reached is the ledger's, of every release it holds (a release recorded
                # after the checkpoint may have left); a seeded replay of it reports the same ε
                self.epsilon = self.ledger.epsilon()

    # ---------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Curator and client states, history and the ε reached (no secret noise state); CPU
        tensors whatever the device, so that a checkpoint resumes on any device."""
        return {
            "curator": to_device(self.curator.state_dict(), "cpu"),
            "clients": self.clients.state_dict(),
            "history": json.dumps(self.history),
            "epsilon": self.epsilon,
            "stopped_on_budget": self.stopped_on_budget,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        curator = dict(state["curator"])  # the noise generator's state stays on the CPU
        for key in ("billboard", "server_optimizer"):
            if key in curator:
                curator[key] = to_device(curator[key], self.device)
        self.curator.load_state_dict(curator)
        clients = state["clients"]
        if "format" not in clients:  # a checkpoint of the stacked states of every client
            dense = {k: v for k, v in clients.items() if k != "joined"}
            joined = clients.get("joined", {}).get("mask")
            old = (
                ClientStore.from_dense(dense, written=joined) if dense else ClientStore(self.m, {})
            )
            clients = old.state_dict()
        self.clients.load_state_dict(clients)
        self.history = json.loads(state["history"])
        self.epsilon = float(state["epsilon"])
        if self.ledger is not None and self.history and self.noise_source == "secure":
            self.epsilon = self.ledger.epsilon()  # every release is charged, repeats included

    def save(self) -> None:
        """Save a checkpoint now (atomic; the ledger file is already up to date)."""
        if self.checkpoint_dir is None:
            raise InvalidParameterError("save() needs a checkpoint_dir.")
        save_checkpoint(
            self.checkpoint_dir,
            kind="pmtl-family",
            config=self.fingerprint_config(),
            state=self.state_dict(),
            step=self.round,
            noise_source=self.noise_source,
            ledger=None if self.ledger is None else self.ledger.seen(),
        )

    @property
    def round(self) -> int:
        return self.curator.round

    @property
    def finished(self) -> bool:
        return self.round >= self.config.rounds or self.stopped_on_budget

    # ---------------------------------------------------------------------------- one round
    def _thread_step_fn(self) -> Any:
        fn = getattr(self._local, "step_fn", None)
        if fn is None:  # functional_call swaps a module's parameters: one module per thread
            model = (
                self.model
                if threading.current_thread() is threading.main_thread()
                else copy.deepcopy(self.model)
            )
            fn = make_step_fn(model, self.buffers, self.config.vectorize)
            self._local.step_fn = fn
        return fn

    def _round_data(self, clients: np.ndarray) -> RoundData:
        """The training rows of ``clients`` on the device, and where each client's rows begin."""
        x, y, offsets = self.dataset.take(clients, "train")
        return RoundData(x.to(self.device, self._dtype), y.to(self.device), offsets[:-1])

    def _train_clients(
        self,
        starts: Params,
        rule: UpdateRule,
        plan: RoundPlan,
        pool: Any,
        data: RoundData,
    ) -> tuple[Params, list[float]]:
        cfg = self.config
        k = len(plan)
        if not cfg.batched:
            return local_sgd_reference(
                self.model, self.buffers, starts, rule, data.x, data.y, plan.lists()
            )

        def train_group(pos: np.ndarray) -> tuple[Params, list[float]]:
            idx = torch.from_numpy(pos).to(self.device)
            return local_sgd_batched(
                self._thread_step_fn(),
                {n: p.index_select(0, idx) for n, p in starts.items()},
                rule,
                data.x,
                data.y,
                [plan[j] for j in pos],
                cfg.batch_size,
            )

        if self._one_pass(pool, k):  # the round in one pass
            return local_sgd_batched(
                self._thread_step_fn(), starts, rule, data.x, data.y,
                self._packed(plan), cfg.batch_size,
            )  # fmt: skip
        per_chunk = self._client_chunk()
        if pool is not None:  # groups of equal work, one per thread at a time
            groups = partition_plan(plan, cfg.threads, per_chunk)
            results = list(pool.map(train_group, groups))
        else:
            chunk = per_chunk or max(k, 1)
            groups = [np.arange(c, min(c + chunk, k)) for c in range(0, k, chunk)]
            results = [train_group(g) for g in groups]
        order = np.argsort(np.concatenate(groups), kind="stable")
        at = torch.from_numpy(order).to(self.device)
        losses: list[float] = [v for _, ls in results for v in ls]
        news = {n: torch.cat([w[n] for w, _ in results]).index_select(0, at) for n in starts}
        return news, [losses[int(i)] for i in order]

    def _one_pass(self, pool: Any, k: int) -> bool:
        """Whether a round of ``k`` clients trains in one batched pass (no threads, no chunks)."""
        per_chunk = self._client_chunk()
        return self.config.batched and pool is None and (per_chunk is None or per_chunk >= k)

    def _packed(self, plan: RoundPlan) -> PackedPlan:
        """``pack_plan(plan)``, packed once for the methods that train twice on one plan."""
        held = self._last_packed
        if held is None or held[0] is not plan:
            held = (plan, pack_plan(plan, self.config.batch_size))
            self._last_packed = held
        return held[1]

    def _client_chunk(self) -> int | None:
        """The configuration's ``client_chunk``, ``"auto"`` resolved for this model."""
        chunk = self.config.client_chunk
        if chunk == "auto":
            return None if tape_free(self.model, self.config.vectorize) else CLIENT_CHUNK
        return None if chunk is None else int(chunk)

    def _train_fn(
        self,
        sampled: np.ndarray,
        round_index: int,
        plan: RoundPlan | None,
        pool: Any,
        data: RoundData | None = None,
    ) -> TrainFn:
        """The backend's local training of the clients ``sampled`` in round ``round_index``
        (:class:`~privmtl.federated.methods.base.TrainFn`): the round's ``plan``, or the
        minibatches of another stream / number of epochs. ``data``: the clients' training rows
        (:meth:`_round_data`; read when first needed if not given)."""
        cfg = self.config
        held: list[RoundData] = [] if data is None else [data]

        def rows() -> RoundData:
            if not held:
                held.append(self._round_data(sampled))
            return held[0]

        def train_one(
            starts: Params,
            rule: UpdateRule,
            *,
            stream: int | None = None,
            epochs: int | None = None,
        ) -> tuple[Params, list[float]]:
            if plan is not None and stream is None and epochs is None:
                return self._train_clients(starts, rule, plan, pool, rows())
            c = (
                cfg
                if epochs is None
                else dataclasses.replace(cfg, local_epochs=epochs, local_steps=None)
            )
            got = rows()
            own = draw_round_plan(
                sampled, self.offsets, round_index, c,
                stream=LOCAL_TRAINING_STREAM if stream is None else stream, starts=got.starts,
            )  # fmt: skip
            return self._train_clients(starts, rule, own, pool, got)

        def sets(runs: Sequence[tuple[Params, UpdateRule]]) -> list[tuple[Params, list[float]]]:
            # several state sets of the round's clients on the round's plan: in one loop when
            # the round trains in one pass (local_sgd_sets), else one training after the other
            if plan is None or not self._one_pass(pool, len(plan)):
                return [train_one(s, rule) for s, rule in runs]
            got = rows()
            return local_sgd_sets(
                self._thread_step_fn(), runs, got.x, got.y, self._packed(plan), cfg.batch_size
            )

        # ``train_one`` itself would be in a cycle through its ``sets`` attribute (``sets``
        # calls it), keeping the round's rows alive until the garbage collector's next full
        # pass (every round's, inherited by the end of run's forked workers): the attribute
        # sits on a partial of it instead
        train = functools.partial(train_one)
        train.sets = sets  # type: ignore[attr-defined]  # read by methods.base.train_sets
        return train

    def step(self, pool: Any = None) -> RoundRecord | None:
        """Run one round; None when the run is finished or stops on its budget."""
        if self.finished:
            return None
        if budget_stops(self.curator, self.budget):
            if self.on_budget == "raise":
                assert self.ledger is not None
                self.ledger.check(self.curator.event())
            if not self.stopped_on_budget:
                warn_budget_stop(
                    self.round, self.config.rounds, "rounds", float(self.epsilon),
                    float(self.budget or 0.0), "result().stopped_on_budget",
                )  # fmt: skip
            self.stopped_on_budget = True
            return None
        t0, c0 = time.perf_counter(), time.process_time()
        t, spec = self.round, self.spec
        sampled = self.curator.sample_round()
        data = self._round_data(sampled)
        plan = draw_round_plan(sampled, self.offsets, t, self.config, starts=data.starts)
        losses: list[float] = []
        out = None
        template = spec.message_template(self.curator.billboard)
        messages = {n: p.new_zeros((0, *p.shape)) for n, p in template.items()}
        if len(sampled):
            sel = torch.from_numpy(sampled).to(self.device)
            starts, anchor = spec.starts(self.curator.billboard, sel, self.clients)
            done = spec.client_update(
                self.curator.billboard,
                self.shared,
                starts,
                anchor,
                self._train_fn(sampled, t, plan, pool, data),
            )
            spec.keep(self.clients, sel, done.kept)
            messages, losses = done.messages, done.losses
        if self.message_hook is not None:
            messages = self.message_hook(t, sampled, messages)
        if spec.communicates:
            out = self.curator.release(messages, rows=sampled)
            if self.ledger is not None:
                self.epsilon = out.epsilon
        else:
            self.curator.round += 1  # local training: a round without a release
        z = self.curator.release_mechanism.noise_multiplier if spec.communicates else None
        rec = round_record(
            t,
            sampled,
            losses,
            out,
            z,
            self.epsilon,
            time.perf_counter() - t0,
            cpu_seconds=time.process_time() - c0,
        )
        if self.config.eval_every and (t + 1) % self.config.eval_every == 0:
            ev = self._evaluate(("val",))["val"]
            main = ev["personalized" if self.spec.personalized else "global"]
            rec["val_accuracy"] = main["accuracy"]
            rec["val_mean_client_accuracy"] = main["mean_client_accuracy"]
        self.history.append(rec)
        if self.checkpoint_dir is not None and (
            self.round % self.checkpoint_every == 0 or self.round == self.config.rounds
        ):
            self.save()
        return RoundRecord(t, sampled, self.curator.billboard, self.epsilon, rec)

    # ---------------------------------------------------------------------------- loop
    def __iter__(self) -> Iterator[RoundRecord]:
        """Run the remaining rounds, yielding one :class:`RoundRecord` per round."""
        cfg = self.config
        old_threads = torch.get_num_threads()
        pool = None
        # a tape-free step (logistic regression) is a few tiny operations: one thread is fastest
        threads = 1 if cfg.batched and tape_free(self.model, cfg.vectorize) else cfg.threads
        # groups on CPU threads: a GPU runs one chunk after another (threads would only contend)
        if cfg.parallel_chunks and cfg.batched and threads > 1 and self.device.type == "cpu":
            from concurrent.futures import ThreadPoolExecutor

            torch.set_num_threads(1)
            pool = ThreadPoolExecutor(
                max_workers=threads, initializer=torch.set_num_threads, initargs=(1,)
            )
        else:
            torch.set_num_threads(threads)
        self.model.train()
        bar = Progress(
            total=cfg.rounds,
            initial=self.round,
            desc=self.spec.name,
            enabled=cfg.progress,
            unit="round",
        )
        try:
            with one_blas_thread():  # the rounds' numpy products (drawing a client) are small
                while True:
                    t0 = time.perf_counter()
                    rec = self.step(pool)
                    if rec is None:
                        break
                    self._train_seconds += time.perf_counter() - t0
                    # only released quantities on the progress line: the training loss of the
                    # sampled clients is a curator diagnostic (``run_pmtl(diagnostics=True)``)
                    bar.update(1, eps=f"{rec.epsilon:.3g}")
                    yield rec
        finally:
            bar.close()
            if pool is not None:
                pool.shutdown()
            torch.set_num_threads(old_threads)

    def run(self) -> TrainResult:
        """Run every remaining round and return :meth:`result`."""
        for _ in self:
            pass
        if self.checkpoint_dir is not None and self.history:
            self.save()
        if self.ledger is not None:
            self.ledger.close()  # the run's releases are all on record (its closing line)
        return self.result()

    # ---------------------------------------------------------------------------- output
    def _outputs(self) -> tuple[Params | None, Params]:
        all_clients = np.arange(self.m)
        return self.spec.outputs(
            self.curator.billboard,
            self.clients,
            personal_init=self._personal_init,
            names=self.names,
            round=self.round,
            train_all=self._train_fn(all_clients, 0, None, None),
        )

    def _evaluate(
        self,
        splits: tuple[str, ...] = ("val", "test"),
        outputs: tuple[Params | None, Params] | None = None,
    ) -> dict[str, dict[str, dict[str, float]]]:
        """``{split: {"personalized" / "global": evaluate(...)}}``, in one pass over the clients."""
        personal, glob = self._outputs() if outputs is None else outputs
        models: dict[str, tuple[Params, bool]] = {}
        if personal is not None and self.spec.personalized:
            models["personalized"] = (personal, True)
        if self.spec.communicates:
            models["global"] = (glob, False)
        return evaluate_dataset(self.model, models, self.buffers, self.dataset, splits)

    def result(self) -> TrainResult:
        """The :class:`TrainResult` of the rounds run so far (evaluates on val and test, on the
        device); its models are CPU tensors."""
        outputs = self._outputs()  # the m clients' models once, for both splits and the result
        accuracies = (
            self._evaluate(("val", "test"), outputs)
            if self.score_at_end
            else self._unscored(outputs)
        )
        personal, glob = outputs[0], to_device(outputs[1], "cpu")
        if not isinstance(personal, ClientModels):  # a store's models are read by rows, on the CPU
            personal = to_device(personal, "cpu")
        return run_result(
            self.config,
            self.history,
            accuracies,
            personalized=personal if self.spec.personalized else None,
            global_params=glob,
            primary="personalized" if self.spec.personalized else "global",
            epsilon=self.epsilon,
            delta=self.delta,
            ledger=self.ledger,
            noise_source=self.noise_source,
            stopped_on_budget=self.stopped_on_budget,
            client_ids=client_id_list(self.dataset.client_ids),
            extra=self._extra(),
        )

    def _unscored(
        self, outputs: tuple[Params | None, Params]
    ) -> dict[str, dict[str, dict[str, float]]]:
        """The accuracies' keys with NaN scores (``score_at_end=False``: the caller scores the
        models, e.g. while it finishes the clients block by block)."""
        nan = {"accuracy": math.nan, "mean_client_accuracy": math.nan, "loss": math.nan, "n": 0}
        names = ["personalized"] if outputs[0] is not None and self.spec.personalized else []
        names += ["global"] if self.spec.communicates else []
        return {split: {name: dict(nan) for name in names} for split in ("val", "test")}

    def _extra(self) -> dict[str, Any]:
        return self.spec.extra(self.shared, self.names)
