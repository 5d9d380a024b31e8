"""The Flower ServerApp and ClientApp of PMTL (Flower's Message API; needs ``privmtl[flower]``).

Messages (all ``RecordDict`` contents):

``query`` (server → every node)
    reply: ``ConfigRecord "node"`` with ``describe`` (a JSON string: the node's clients by global
    index and id, the population size, the data's shape) and ``ArrayRecord "init"`` (the model's
    initial parameters, the same on every node since every node builds the model from the run's
    seed); or, from a node that cannot serve the run (its copy of a user's model factory is not
    the announced code, its partition is invalid, its data does not load), ``ConfigRecord
    "node"`` with ``error``: one line the ServerApp fails the run with.
``train`` (server → nodes serving this round's sampled clients)
    ``ArrayRecord "billboard"`` and ``ConfigRecord "round"`` (round index, round key, the node's
    sampled clients, the TrainConfig as JSON); reply: ``ArrayRecord "messages"`` (stacked
    ``(K, ...)`` client messages in the order asked) and ``ConfigRecord "losses"``. Up to
    :data:`PACKED_BYTES`, the billboard travels as bytes in ``"round"`` (key ``billboard``) and
    the messages in ``"losses"`` (key ``messages``), which saves Flower a request per array.
``train.secagg`` (server → every node, four times per round, with ``--secagg``)
    ``ConfigRecord "secagg"``: one SecAgg+ stage (:mod:`privmtl.flower.secagg`); the collect
    stage also carries the ``train`` records and runs the client step, and the node answers with
    its masked, quantized sum of clipped client messages instead of the messages.
``evaluate`` (server → every node)
    ``ArrayRecord "billboard"`` and ``ConfigRecord "finish"`` (the public settings of the
    clients' end of the run, :meth:`~privmtl.flower.server_run.ServerRun.finish_settings`: each node
    fine-tunes or lets its clients choose, on their own data, as ``run_pmtl`` does); reply:
    ``ArrayRecord "score_arrays"`` (per-client correct counts and sizes of the trained, the final
    and the global model on val and test, the clients' indices, ids and choices: one array each)
    and ``ConfigRecord "scores"`` (the rest, as JSON). With ``save-models`` also
    ``ConfigRecord "save"`` (the run's token): the node writes its clients' final models to its
    own storage (:meth:`~privmtl.flower._core.NodeClients.save_models`); they are not sent.

Node configuration: ``partition-id``, ``num-partitions``, ``state-dir`` (the node's own storage
for the personalized models) and, optionally, ``model-dir`` and ``method-dir`` (where this machine
keeps the file of a user's ``--model`` factory and ``--method``, :mod:`privmtl.flower.factory`). Run configuration:
:data:`privmtl.flower._core.RUN_DEFAULTS`; the ServerApp keeps its ledger, checkpoint and result in
``<work-dir>/server`` (``work-dir`` empty: a new :func:`~privmtl.flower.run_info.default_work_dir` on
the machine running it).

The ServerApp's loop is ``_discover`` (which node serves which clients), then
``_train_round`` until the run is finished or its budget stops it, then ``_evaluate``.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from privmtl._timing import PMTL_PHASES, PhaseTimer
from privmtl.checkpoint import write_atomic
from privmtl.exceptions import InvalidParameterError, PrivmtlError
from privmtl.federated.config import TrainConfig
from privmtl.flower import secagg
from privmtl.flower._core import (
    MODELS_FILE,
    SERVER_DIR,
    default_work_dir,
    finish_timeout,
    from_bytes,
    run_options,
    to_bytes,
)
from privmtl.flower._waits import send_and_receive, shorten_object_waits
from privmtl.flower.discovery import (
    QUERY_WAIT_SECONDS,
    NodeLoader,
    data_fingerprint,
    discover,
    discovery_timeout,
    refusal_line,
)
from privmtl.flower.factory import check_shapes, load_checked, load_checked_method
from privmtl.flower.node_clients import NodeClients, load_node
from privmtl.flower.secagg import (
    SecAggParams,
    SecAggServer,
    SecureAggregationError,
    dequantize_sum,
    describe,
    grid_exchange,
    unflatten,
)
from privmtl.flower.server_run import ServerRun
from privmtl.per_client import write_rows

__all__ = ["check_refusals", "client_app", "describe_node", "server_app"]

server_app = ServerApp()
client_app = ClientApp()

_NODES: dict[tuple[Any, ...], NodeLoader[NodeClients]] = {}


def _arrays(params: dict[str, torch.Tensor]) -> ArrayRecord:
    return ArrayRecord(torch_state_dict={n: p.detach().contiguous() for n, p in params.items()})


def _params(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return {n: torch.as_tensor(p) for n, p in record.to_torch_state_dict().items()}


PACKED_BYTES = 4 << 20
"""A round's billboard and the nodes' stacked messages up to this size travel as bytes inside the
round's ``ConfigRecord`` (:func:`_pack`) instead of an ``ArrayRecord``: Flower moves every array of
a message as an object of its own (one request per object, each hop), so one record instead of
``2 + len(arrays)`` objects cuts a round's requests; larger ones keep Flower's ``ArrayRecord``, whose
arrays it sends in chunks."""


def _pack(params: dict[str, torch.Tensor]) -> bytes | None:
    """``params`` as bytes for a ``ConfigRecord`` when small enough (:data:`PACKED_BYTES`)."""
    if sum(p.numel() * p.element_size() for p in params.values()) > PACKED_BYTES:
        return None
    return to_bytes({n: p.detach().contiguous() for n, p in params.items()})


def _unpack(record: Any) -> dict[str, torch.Tensor]:
    return {n: torch.as_tensor(p) for n, p in from_bytes(bytes(record)).items()}


_STATE = "privmtl-personal"
_SEP = "\x1f"


def _restore(node: NodeClients, context: Context) -> None:
    """A node without storage: take the personalized models from Context.state when this run
    already holds them (a node with storage keeps them on its disk, written per round)."""
    if node.state_dir is not None or _STATE not in context.state.array_records:
        return
    personal: dict[str, dict[str, torch.Tensor]] = {}
    for key, p in _params(context.state.array_records[_STATE]).items():
        cid, name = key.split(_SEP, 1)
        personal.setdefault(cid, {})[name] = p
    cids = [cid for cid in personal if cid not in node.personal]
    if cids:
        rows = [node.personal.pos[cid] for cid in cids]
        models = {n: torch.stack([personal[cid][n] for cid in cids]) for n in node.init}
        node.personal.put(rows, models)


def _loader(context: Context) -> tuple[NodeLoader[NodeClients], int]:
    """This node's clients, loading (in a thread) or loaded, kept for the life of the process
    (and their models on disk); and the node's partition."""
    opts = run_options(dict(context.run_config))
    nc = context.node_config
    pid, parts = int(nc.get("partition-id", 0)), int(nc.get("num-partitions", 1))
    state_dir = str(nc.get("state-dir", "")) or None
    model_dir = str(nc.get("model-dir", "")) or None  # this machine's copy of a user's factory
    method_dir = str(nc.get("method-dir", "")) or None  # and of a user's method
    key = (
        opts["data"], opts["data-path"], opts["model"], opts["model-dir"], opts["model-sha256"],
        opts["method"], opts["method-dir"], opts["method-sha256"], opts["device"],
        opts["seed"], pid, parts, state_dir, model_dir, method_dir,
    )  # fmt: skip
    loader = _NODES.get(key)
    if loader is None or loader.failed:  # a failed load (a refusal, an error): load again
        loader = NodeLoader(
            lambda report: load_node(
                opts, pid, parts, state_dir, model_dir, method_dir, report=report
            ),
            name=f"privmtl-node-{pid}-load",
        )
        _NODES[key] = loader
    return loader, pid


def _node(context: Context) -> NodeClients:
    """This node's clients (waiting for them if they are still loading)."""
    node = _loader(context)[0].result()
    assert node is not None
    return node


def describe_node(context: Context, wait: float | None = None) -> RecordDict:
    """The reply to ``query``: the node's clients and initial model, or why it cannot serve, or
    (still loading after ``wait`` seconds; None: wait until loaded) what it is doing."""
    loader, pid = _loader(context)
    try:
        node = loader.result(wait)
    except PrivmtlError as exc:  # a user's error: one line the ServerApp fails the run with
        return RecordDict({"node": ConfigRecord({"error": str(exc)})})
    except Exception as exc:  # one line too, naming the node and what it was doing
        line = f"SuperNode partition-id={pid} failed while {loader.stage}: {type(exc).__name__}: "
        return RecordDict({"node": ConfigRecord({"error": line + " ".join(str(exc).split())})})
    if node is None:
        return RecordDict({"node": ConfigRecord({"loading": json.dumps(loader.progress(pid))})})
    return RecordDict(
        {
            "node": ConfigRecord({"describe": json.dumps(node.describe())}),
            "init": _arrays(node.init),
        }
    )


@client_app.query()
def query(msg: Message, context: Context) -> Message:
    return Message(describe_node(context, QUERY_WAIT_SECONDS), reply_to=msg)


def _train(content: RecordDict, context: Context) -> tuple[NodeClients, dict, dict, list[float]]:
    """Run the client step of the node's clients named in a train message."""
    node = _node(context)
    record = content.config_records["round"]
    spec = json.loads(str(record["json"]))
    config = TrainConfig(**spec["config"])
    if "billboard" in record:  # packed with the round's settings (_pack)
        board = _unpack(record["billboard"])
    else:
        board = _params(content.array_records["billboard"])
    _restore(node, context)
    clients = [int(k) for k in spec["clients"]]
    msgs, losses = node.train(clients, board, int(spec["round"]), config, key=spec.get("key"))
    if node.state_dir is None:  # without storage, the models live in Context.state
        context.state[_STATE] = _arrays(
            {f"{cid}{_SEP}{n}": p for cid, ps in node.personal.items() for n, p in ps.items()}
        )
    return node, spec, msgs, losses


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    _, _, msgs, losses = _train(msg.content, context)
    ls = json.dumps([float(v) for v in losses])
    packed = _pack(msgs)
    if packed is not None:  # one record: the stacked messages as bytes and the losses
        content = RecordDict({"losses": ConfigRecord({"json": ls, "messages": packed})})
    else:
        content = RecordDict({"messages": _arrays(msgs), "losses": ConfigRecord({"json": ls})})
    return Message(content, reply_to=msg)


@client_app.train("secagg")
def train_secagg(msg: Message, context: Context) -> Message:
    """One SecAgg+ stage; the collect stage runs the client step (:mod:`privmtl.flower.secagg`)."""

    def vector(m: Message) -> Any:
        node, spec, msgs, _ = _train(m.content, context)
        return secagg.node_vector(msgs, spec, node.partition_id)

    return secagg.client_message(msg, context, vector)


@client_app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    node = _node(context)
    _restore(node, context)
    records = msg.content.config_records
    if "vote" in records:  # the clients' vote: this node's summed shares, nothing else
        shares = node.vote_shares(
            _params(msg.content.array_records["billboard"]),
            json.loads(str(records["vote"]["json"])),
        )
        content = RecordDict({"shares": ConfigRecord({"json": json.dumps(shares)})})
        return Message(content, reply_to=msg)
    finish = json.loads(str(records["finish"]["json"])) if "finish" in records else None
    scores = node.evaluate(_params(msg.content.array_records["billboard"]), finish)
    if "save" in records:  # the clients' final models stay in the node's own storage
        node.save_models(str(records["save"]["token"]))
    arrays, rest = _split_scores(scores)
    content = RecordDict(
        {"scores": ConfigRecord({"json": json.dumps(rest)}), "score_arrays": arrays}
    )
    return Message(content, reply_to=msg)


def _split_scores(scores: dict[str, Any]) -> tuple[ArrayRecord, dict[str, Any]]:
    """A node's scores as the reply carries them: every per-client list (counts, sizes, client
    indices and ids, choices) as one array of an ``ArrayRecord``, the rest (grids, seconds, the
    baseline's part) as JSON. The ServerApp then holds numpy arrays, not Python lists of its
    clients' numbers (:func:`_joined_scores`). Whole numbers (the counts and sizes, the indices)
    travel as 32-bit integers and ASCII ids as bytes, which :func:`_joined_scores` reads back
    exactly: the reply is no larger than its JSON was."""
    arrays: dict[str, Array] = {}
    rest: dict[str, Any] = {}
    for key, value in scores.items():
        if not isinstance(value, list) or not (
            key in _SCORE_KINDS or key.endswith(_SCORE_SUFFIXES)
        ):
            rest[key] = value
        elif key == "client_ids":
            ids = np.asarray(value, dtype=np.str_)
            ascii_ids = all(str(v).isascii() for v in value)
            arrays[key] = Array(np.char.encode(ids, "ascii") if ascii_ids else ids)
        else:
            arr = np.asarray(value, dtype=_SCORE_KINDS.get(key, np.float64))
            small = not arr.size or (np.abs(arr).max() < 2**31 and np.all(arr == np.rint(arr)))
            arrays[key] = Array(arr.astype(np.int32) if small else arr)
    return ArrayRecord(arrays), rest


_SCORE_KINDS: dict[str, Any] = {"clients": np.int64, "choice": np.int64, "client_ids": np.str_}
_SCORE_SUFFIXES = ("_n", "_personal", "_global", "_final")


def _joined_scores(reply: RecordDict) -> dict[str, Any]:
    """A node's scores from its reply (:func:`_split_scores`): the per-client arrays as numpy
    arrays (float64 counts and sizes, int64 indices, str ids) beside the JSON's keys."""
    scores = json.loads(str(reply.config_records["scores"]["json"]))
    if "score_arrays" not in reply.array_records:
        return scores
    for key, item in reply.array_records["score_arrays"].items():
        arr = item.numpy()
        if key == "client_ids":
            scores[key] = np.char.decode(arr, "ascii") if arr.dtype.kind == "S" else arr
        else:
            scores[key] = arr.astype(_SCORE_KINDS.get(key, np.float64))
    return scores


def _ask(grid: Grid, kind: str, contents: dict[int, RecordDict], timeout: float) -> dict:
    """Send one message per node and collect the answers that came back without error.

    Returns after every node answered, or after ``timeout`` seconds with the answers so far (a
    node that died or hangs cannot hold the run longer than that).
    """
    msgs = [
        Message(content, dst_node_id=nid, message_type=kind) for nid, content in contents.items()
    ]
    out = {}
    for reply in send_and_receive(grid, msgs, timeout):
        if not reply.has_error():
            out[reply.metadata.src_node_id] = reply.content
    return out


def _wait_nodes(grid: Grid, n: int, timeout: float) -> list[int]:
    end = time.monotonic() + timeout
    while True:
        ids = sorted(grid.get_node_ids())
        if len(ids) >= n or time.monotonic() > end:
            if len(ids) < n:
                raise RuntimeError(f"only {len(ids)} of {n} SuperNodes connected in {timeout}s")
            return ids
        time.sleep(0.5)


@dataclass
class _Federation:
    """The SuperNodes of the run and the clients each one serves."""

    nodes: list[int]
    owner: dict[int, int]  # client (global index) -> node id
    num_clients: int
    init: dict[str, torch.Tensor]
    data_shape: tuple[int, int]  # (n_features, n_classes) of the nodes' data
    scaling: str = "none"  # the clients' feature scaling (a table's), as the nodes describe it
    data_sha256: str = ""  # the nodes' data fingerprint (data_fingerprint of their own hashes)
    devices: tuple[str, ...] = ()  # where each node runs its clients' step


def _discover(grid: Grid, opts: dict[str, Any], timeout: float) -> _Federation:
    """Wait for the SuperNodes and ask each which clients it serves (and the initial model),
    as long as each is still loading within ``timeout`` seconds (:func:`discover`)."""
    nodes = _wait_nodes(grid, int(opts["num-supernodes"]), timeout)
    answer = float(opts["round-timeout"])
    replies: dict[int, RecordDict] = {}

    def ask(pending: list[int]) -> dict[int, Any]:
        got = _ask(grid, "query", {nid: RecordDict() for nid in pending}, answer)
        replies.update(got)
        return {nid: c.config_records["node"] for nid, c in got.items()}

    derived = not float(opts.get("discovery-timeout", 0.0) or 0.0) > 0
    infos = discover(ask, nodes, timeout, answer_timeout=answer, derived=derived)
    owner: dict[int, int] = {}
    m = None
    init = None
    shape = (0, 0)
    for nid, info in infos.items():
        m = int(info["num_clients"])
        shape = (int(info["n_features"]), int(info["n_classes"]))
        for k in info["clients"]:
            owner[int(k)] = nid
        init = _params(replies[nid].array_records["init"])
    assert m is not None and init is not None
    if sorted(owner) != list(range(m)):
        raise RuntimeError(
            f"the nodes serve {len(owner)} distinct clients of {m}: check each node's "
            "partition-id and num-partitions"
        )
    return _Federation(
        nodes, owner, m, init, shape, str(info.get("scaling", "none")),
        data_fingerprint(infos), tuple(str(i.get("device", "cpu")) for i in infos.values()),
    )  # fmt: skip


def check_refusals(described: dict[int, RecordDict], num_nodes: int) -> None:
    """Fail the run with the first refusal of a node's ``query`` reply (:func:`describe_node`).

    Raises
    ------
    InvalidParameterError
        A node refused: its line, and how many of the nodes refused.
    """
    line = refusal_line({n: c.config_records["node"] for n, c in described.items()}, num_nodes)
    if line is not None:
        raise InvalidParameterError(line)


def _train_round(
    grid: Grid, run: ServerRun, fed: _Federation, opts: dict[str, Any], timeout: float
) -> None:
    """One round: sample, ask the nodes of the sampled clients for their messages, release.

    A node that does not answer in ``timeout`` seconds (or that the SuperLink reports offline)
    fails the run before the release (``on-missing=fail``) or is left out of the sum, which keeps
    the fixed divisor q (``on-missing=proceed``).
    """
    t = run.curator.round
    t0 = time.perf_counter()
    sampled = run.curator.sample_round()
    per_node: dict[int, list[int]] = {}
    for k in sampled:
        per_node.setdefault(fed.owner[int(k)], []).append(int(k))
    online = set(grid.get_node_ids())
    packed = _pack(run.curator.billboard)  # the billboard inside the round's record, if small
    board = None if packed is not None else _arrays(run.curator.billboard)
    spec = {"round": t, "key": run.round_key(), "config": _config_fields(run.config)}

    def round_content(ks: list[int]) -> RecordDict:
        text = json.dumps({**spec, "clients": ks})
        if packed is not None:
            return RecordDict({"round": ConfigRecord({"json": text, "billboard": packed})})
        assert board is not None
        return RecordDict({"billboard": board, "round": ConfigRecord({"json": text})})

    contents = {nid: round_content(ks) for nid, ks in per_node.items() if nid in online}
    replies = _ask(grid, "train", contents, timeout) if contents else {}
    messages: dict[int, dict[str, torch.Tensor]] = {}
    losses: dict[int, float] = {}
    for nid, content in replies.items():
        got = content.config_records["losses"]
        if "messages" in got:  # packed (_pack)
            stacked = _unpack(got["messages"])
        else:
            stacked = _params(content.array_records["messages"])
        ls = json.loads(str(got["json"]))
        for j, k in enumerate(per_node[nid]):
            messages[k] = {n: p[j] for n, p in stacked.items()}
            losses[k] = float(ls[j])
    missing = sorted(set(per_node) - set(replies))
    if missing and opts["on-missing"] == "fail":
        raise RuntimeError(
            f"round {t + 1}/{run.config.rounds}: {len(missing)} node(s) did not answer within "
            f"{timeout:g} s or went offline; nothing "
            "was released in this round (on-missing=fail)"
        )
    run.release(sampled, messages, losses, time.perf_counter() - t0)


def _evaluate(
    grid: Grid, run: ServerRun, fed: _Federation, opts: dict[str, Any], timeout: float
) -> list[dict[str, list[float]]]:
    """Every node runs its clients' end of the run (fine-tuning, their choice) and scores their
    models and the final billboard."""
    board = _arrays(run.curator.billboard)
    online = set(grid.get_node_ids())
    asked = [nid for nid in fed.nodes if nid in online]
    if run.vote is not None:  # the clients' vote first: the nodes' summed shares, released here
        settings = ConfigRecord({"json": json.dumps(run.finish_settings())})
        ask = {nid: RecordDict({"billboard": board, "vote": settings}) for nid in asked}
        got = _ask(grid, "evaluate", ask, timeout)
        if len(got) < len(fed.nodes) and (opts["on-missing"] == "fail" or not got):
            raise RuntimeError(f"only {len(got)} of {len(fed.nodes)} nodes counted the vote")
        shares = sum(
            np.asarray(json.loads(str(got[nid].config_records["shares"]["json"])))
            for nid in fed.nodes
            if nid in got
        )
        run.elect(np.asarray(shares, dtype=np.float64))
    finish = ConfigRecord({"json": json.dumps(run.finish_settings())})
    records: dict[str, Any] = {"billboard": board, "finish": finish}
    if opts["save-models"]:
        records["save"] = ConfigRecord({"token": run.token})
    contents = {nid: RecordDict(records) for nid in asked}
    evals = _ask(grid, "evaluate", contents, timeout)
    if len(evals) < len(fed.nodes) and (opts["on-missing"] == "fail" or not evals):
        raise RuntimeError(f"only {len(evals)} of {len(fed.nodes)} nodes answered the evaluation")
    return [_joined_scores(evals[nid]) for nid in fed.nodes if nid in evals]


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    opts = run_options(dict(context.run_config))
    shorten_object_waits()
    work = Path(str(opts["work-dir"])) if opts["work-dir"] else default_work_dir()
    out_dir = work / SERVER_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    timeout = float(opts["round-timeout"])
    started = time.perf_counter()
    timer = PhaseTimer(PMTL_PHASES)  # the ServerApp's share of the run's phases
    try:
        # this machine's copy of a user's factory is the announced code, or the run stops here
        user = load_checked(opts, "the ServerApp")
        load_checked_method(opts, "the ServerApp")  # and of a user's method
        with timer.phase("data"):  # the nodes load their clients and describe them
            fed = _discover(grid, opts, discovery_timeout(opts))
        if user is not None:  # the ServerApp builds the model the nodes report
            info = fed.data_shape
            check_shapes(user, info[0], info[1], fed.init)
        print(
            f"privmtl-flower {len(fed.nodes)} SuperNodes serve {fed.num_clients} clients "
            f"({time.perf_counter() - started:.1f} s)",
            flush=True,
        )
        with timer.phase("setup"):
            run = ServerRun(
                opts, fed.init, fed.num_clients, server_dir=out_dir, data_sha256=fed.data_sha256
            )
            run.data_scaling, run.node_devices = fed.scaling, list(fed.devices)
            if run.curator.round:
                print(f"privmtl-flower resumed at round {run.curator.round}", flush=True)
            secure = _secagg_setup(opts, run) if opts["secagg"] else None
        while not run.finished and not run.stop_on_budget():
            with timer.phase("rounds"):
                if secure is None:
                    _train_round(grid, run, fed, opts, timeout)
                else:
                    _secure_round(grid, run, fed, secure)
            _progress(run)
        if run.stopped_on_budget:
            print(
                f"privmtl-flower stopped on budget before round {run.curator.round + 1}: "
                f"epsilon {run.epsilon:.4g} <= {run.budget}",
                flush=True,
            )
        with timer.phase("saving"):
            torch.save(run.billboards, out_dir / "billboards.pt")
        with timer.phase("end_of_run"):  # the vote, the nodes' end of run and their scoring
            largest = max(Counter(fed.owner.values()).values(), default=0)  # node ids are large
            scores = _evaluate(grid, run, fed, opts, finish_timeout(opts, largest))
        # the nodes score in parallel: the slowest node's scoring is the run's
        timer.carve(
            "end_of_run", "scoring", max(float(str(e.get("score_seconds", 0.0))) for e in scores)
        )
        result = run.result_dict(scores, started)
        result["nodes_evaluated"] = len(scores)
        if opts["per-client"]:  # one row per client, from the nodes' scores
            with timer.phase("saving"):
                rows = run.client_rows(scores, result)
                result["per_client_file"] = str(write_rows(str(opts["per-client"]), rows))
        bounds = [h["secagg_error_bound"] for h in run.history if "secagg_error_bound" in h]
        result["secure_aggregation"] = (
            None if secure is None else _secagg_describe(secure, len(fed.nodes), bounds)
        )
        if opts["save-models"]:  # the released global model (no personalized model)
            with timer.phase("saving"):
                write_atomic(out_dir / MODELS_FILE, to_bytes(run.models_state()))
        run.finish()  # before the result: the launcher stops every process once it sees it
        timer.record(result)  # seconds and phases of the ServerApp (the launcher adds its own)
        _write(out_dir / "result.json", json.dumps(result))
    except Exception as exc:  # the launcher reports it
        _write(out_dir / "error.txt", f"{type(exc).__name__}: {exc}")
        raise


def progress_line(run: ServerRun) -> str:
    """The last round's progress line; ε comes with its full guarantee, or "non-private".

    It states nothing computed from un-noised client messages (the sampled clients' training loss
    is a curator diagnostic, not a release), so it is covered by the run's guarantee."""
    h = run.history[-1]
    cfg = run.config
    if run.ledger is None:
        privacy = "non-private (no noise)"
    else:
        privacy = (
            f"epsilon {h['epsilon']:.4g} (delta {run.delta:.2g}, {cfg.relation}, sampling "
            f"{cfg.sampling}, {cfg.accountant}, noise {run.noise_source})"
        )
    return (
        f"privmtl-flower round {len(run.history)}/{cfg.rounds}: sampled "
        f"{h['n_sampled']}, answered {len(h['answered'])}, "
        f"{privacy} ({h['seconds']:.1f} s)"
    )


def _progress(run: ServerRun) -> None:
    print(progress_line(run), flush=True)


def _secagg_setup(opts: dict[str, Any], run: ServerRun) -> Any:
    params = SecAggParams(
        clip=float(opts["clip"]),
        dim=sum(int(p.numel()) for p in run.curator.billboard.values()),
        quantization_range=int(opts["secagg-quantization-range"]),
        modulus_range=int(opts["secagg-modulus-range"]),
    )
    return SecAggServer(
        params,
        num_shares=int(opts["secagg-num-shares"]),
        threshold=int(opts["secagg-threshold"]),
    )


def _secagg_describe(server: Any, num_nodes: int, bounds: list[float]) -> dict[str, Any]:
    return describe(server.params, server, num_nodes, bounds)


def _secure_round(grid: Grid, run: ServerRun, fed: _Federation, server: Any) -> None:
    """One round under SecAgg+: every node takes part, the curator gets only the sum.

    The round's documented quantization error bound goes into its history
    (``secagg_error_bound``).
    """
    t0 = time.perf_counter()
    t = run.curator.round
    nodes, owner = fed.nodes, fed.owner
    key = run.round_key()
    sampled = run.curator.sample_round()
    per_node: dict[int, list[int]] = {}
    for k in sampled:
        per_node.setdefault(owner[int(k)], []).append(int(k))
    board = _arrays(run.curator.billboard)
    config = _config_fields(run.config)
    params = server.params
    if len(sampled) > params.max_clients:
        raise SecureAggregationError(
            f"round {t}: {len(sampled)} sampled clients exceed the {params.max_clients} one "
            "SecAgg+ sum can hold; nothing was released"
        )
    template = run.curator.billboard
    spec = {
        "config": config,
        "names": list(template),
        "secagg": {
            "clip": params.clip,
            "dim": params.dim,
            "quantization_range": params.quantization_range,
            "modulus_range": params.modulus_range,
        },
    }
    collect = {
        nid: {
            "billboard": board,
            "round": ConfigRecord(
                {
                    "json": json.dumps(
                        {**spec, "round": t, "key": key, "clients": per_node.get(nid, [])}
                    )
                }
            ),
        }
        for nid in nodes
    }
    timeout = float(run.opts["round-timeout"])
    res = server.run(nodes, grid_exchange(grid, collect, timeout), round_index=t)
    lost = [nid for nid in res.dropped if per_node.get(nid)]
    if lost and run.opts["on-missing"] == "fail":
        raise RuntimeError(
            f"round {t}: {len(lost)} node(s) with sampled clients dropped out of SecAgg+; "
            "nothing was released (on-missing=fail)"
        )
    included = set(res.included)
    answered = [int(k) for k in sampled if owner[int(k)] in included]
    flat = dequantize_sum(res.total, len(answered), params)
    total = {n: p.to(template[n].dtype) for n, p in unflatten(flat, template).items()}
    bound = params.error_bound(len(answered), run.q)
    run.release(
        sampled,
        {},
        {},
        time.perf_counter() - t0,
        secure=(total, answered),
        extra={
            "secagg_nodes": len(res.included),
            "secagg_dropped_nodes": len(res.dropped),
            "secagg_error_bound": bound,
        },
    )


def _config_fields(config: Any) -> dict[str, Any]:
    from dataclasses import fields

    return {f.name: getattr(config, f.name) for f in fields(config)}


def _write(path: Path, text: str) -> None:
    write_atomic(path, text.encode())
