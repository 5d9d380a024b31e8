"""What a round's two largest parts would cost with another synthetic stream and other kernels.

``python benchmarks/round_alternatives.py [--rounds T] [--repeats R]`` times, in isolation and in
CPU microseconds per sampled client (one thread; ``T`` rounds, default 30, of the acceptance
workload's 200 clients of 10 000: ``privmtl pmtl --data synthetic --model logreg
--clients-per-round 200``, Ditto's two trainings of one local epoch, batch 10):

* **taking a round's training rows**: the synthetic federation's draw as it is
  (``SyntheticFederation.take``: every sampled client drawn whole, float64 normals, then its
  permutation splits train / validation / test), and draws of a stream that would change the
  data: only the training rows (validation and test drawn after them from the same stream, so
  a round draws none of them), float64 or float32 normals, numpy's or torch's generator;
* **the two local trainings**: the batched loop as it is (``local_sgd_batched`` twice, with the
  logistic step that repeats autograd's kernels bit for bit), one training alone (what the
  second costs), and the same loop with a step of the same mathematics and other kernels
  (``logsumexp`` and the product ``grad^T x``, whose gradients differ in the last bits), and
  the engine's ``local_sgd_sets`` (Ditto's two sets of a client as one model).
  ``--training-only`` times the trainings alone.

Each variant runs ``R`` times (default 3), alternating; the median is printed. None of these
alternatives is in ``src``: they estimate what using the allowance "the synthetic stream may
change" (and other kernels) would give. Results: ``benchmarks/results/round_speed.md``.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from privmtl.data.streamed import SyntheticFederation
from privmtl.experiments.pmtl import make_model
from privmtl.federated.algorithms import draw_round_plan, pack_plan
from privmtl.federated.client import ProxStep, local_sgd_batched, local_sgd_sets
from privmtl.federated.config import TrainConfig
from privmtl.federated.gradients import make_step_fn
from privmtl.federated.trainer import Trainer

M, PER_ROUND = 10_000, 200


def _rounds(n_rounds: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [np.sort(rng.choice(M, PER_ROUND, replace=False)) for _ in range(n_rounds)]


# ---------------------------------------------------------------------------- data streams
def _take_today(ds: SyntheticFederation, ks: np.ndarray) -> None:
    ds.take(ks, "train")


def _train_only(dtype: type, ds: SyntheticFederation, ks: np.ndarray) -> None:
    """A stream whose first draws after the client's model are its training rows: no
    validation or test row and no permutation drawn in a round (numpy's PCG64 per client,
    seeded as today)."""
    law = ds.law
    c, d, tau = law.n_classes, law.n_features, law.heterogeneity
    n_train = ds.sizes("train")[ks]
    total = int(n_train.sum())
    x = np.empty((total, d), dtype=dtype)
    y = np.empty(total, dtype=np.int64)
    w0, b0 = law.w0.astype(dtype), law.b0.astype(dtype)
    at = 0
    for rng, n in zip(law.client_rngs(ks), n_train.tolist(), strict=True):
        wk = rng.standard_normal((c, d), dtype=dtype)
        wk *= tau
        wk += w0
        bk = rng.standard_normal(c, dtype=dtype)
        bk *= tau
        bk += b0
        vk = rng.standard_normal(d, dtype=dtype)
        vk *= law.feature_spread
        vk += rng.normal(0.0, law.feature_shift)
        xk = x[at : at + n]
        rng.standard_normal(out=xk, dtype=dtype)
        xk += vk
        logits = xk @ wk.T
        logits += bk
        y[at : at + n] = logits.argmax(axis=1)
        at += n


def _train_only_torch(ds: SyntheticFederation, ks: np.ndarray) -> None:
    """The same stream with torch's CPU generator (one per client, seeded from ``(seed, k)``),
    float32, vectorised across the round's clients: per client only its generator's seed, two
    ``randn`` calls (its model, bias and feature mean; its training features, into the round's
    stacked rows) and its labels' product (``addmm``); the models' shift, the features' mean and
    the argmax once for the round."""
    law = ds.law
    c, d, tau = law.n_classes, law.n_features, law.heterogeneity
    n_train = ds.sizes("train")[ks]
    total, k = int(n_train.sum()), len(ks)
    head = c * d + c + d
    params = torch.empty(k, head)
    x = torch.empty(total, d)
    logits = torch.empty(total, c)
    gen = torch.Generator()
    bounds = np.concatenate([[0], np.cumsum(n_train)]).tolist()
    for j, key in enumerate(ks.tolist()):
        gen.manual_seed((law.entropy << 32) + key)
        torch.randn(head, generator=gen, out=params[j])
        torch.randn(bounds[j + 1] - bounds[j], d, generator=gen, out=x[bounds[j] : bounds[j + 1]])
    w = params[:, : c * d].view(k, c, d).mul_(tau).add_(torch.from_numpy(law.w0).float())
    bias = params[:, c * d : c * d + c].mul_(tau).add_(torch.from_numpy(law.b0).float())
    mean = params[:, c * d + c :].mul_(law.feature_spread)
    x += mean.repeat_interleave(torch.from_numpy(n_train), 0)
    for j in range(k):
        rows = slice(bounds[j], bounds[j + 1])
        torch.addmm(bias[j], x[rows], w[j].T, out=logits[rows])
    logits.argmax(1)


# ---------------------------------------------------------------------------- trainings
def _other_kernels_step(
    params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, w: torch.Tensor
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The logistic step's gradients and losses by ``logsumexp`` and ``grad^T x``: the same
    mathematics as the engine's step, not the same bits."""
    weight, bias = params["linear.weight"], params["linear.bias"]
    logits = torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))
    lse = torch.logsumexp(logits, -1, keepdim=True)
    at = y.unsqueeze(-1)
    losses = ((lse.squeeze(-1) - logits.gather(-1, at).squeeze(-1)) * w).sum(1)
    grad = torch.exp(logits - lse).mul_(w.unsqueeze(-1))
    grad.scatter_add_(-1, at, (-w).unsqueeze(-1))
    return {"linear.weight": torch.bmm(grad.transpose(1, 2), x), "linear.bias": grad.sum(1)}, losses


def _ditto_sharing_rows(starts, anchor, x_all, y_all, packed, cfg):  # type: ignore[no-untyped-def]
    """Ditto's two trainings with other kernels and the minibatch rows shared: the personal
    model and the billboard's copy of a client held as one ``(2C, d)`` model, so that one
    ``baddbmm`` gives both sets' logits and one ``bmm`` (``grad^T x``) both gradients, each
    row read once (no doubled gather); the pull applies to the first ``C`` rows."""
    lr, lam = cfg.lr, float(cfg.lam or 0.0)
    w, b = starts["linear.weight"], starts["linear.bias"]
    c = w.shape[1]
    order = torch.from_numpy(packed.order)
    state_w = torch.cat([w, w], 1).index_select(0, order)  # (K, 2C, d)
    state_b = torch.cat([b, b], 1).index_select(0, order)
    anchor_w, anchor_b = anchor["linear.weight"], anchor["linear.bias"]
    rows = torch.from_numpy(packed.rows)
    weights = torch.from_numpy(packed.weights).float()
    flat = rows.reshape(-1)
    x_rows = x_all.index_select(0, flat).view(*rows.shape, -1)
    y_rows = y_all.index_select(0, flat).view(rows.shape)
    bounds = packed.bounds.tolist()
    for a, e in itertools.pairwise(bounds):
        n = e - a
        sw, sb = state_w[:n], state_b[:n]
        x, y, wt = x_rows[a:e], y_rows[a:e], weights[a:e]
        logits = torch.baddbmm(sb.unsqueeze(1), x, sw.transpose(1, 2)).view(n, -1, 2, c)
        lse = torch.logsumexp(logits, -1, keepdim=True)
        at = y.view(n, -1, 1, 1).expand(n, -1, 2, 1)
        grad = torch.exp(logits - lse).mul_(wt.view(n, -1, 1, 1))
        grad.scatter_add_(-1, at, (-wt).view(n, -1, 1, 1).expand(n, -1, 2, 1))
        grad = grad.view(n, -1, 2 * c)
        gw = torch.bmm(grad.transpose(1, 2), x)
        gb = grad.sum(1)
        gw[:, :c].add_(sw[:, :c] - anchor_w, alpha=lam)
        gb[:, :c].add_(sb[:, :c] - anchor_b, alpha=lam)
        sw.add_(gw, alpha=-lr)
        sb.add_(gb, alpha=-lr)
    back = torch.from_numpy(np.argsort(packed.order))
    return state_w.index_select(0, back), state_b.index_select(0, back)


def _training_inputs(n_rounds: int) -> list[tuple]:
    ds = SyntheticFederation(n_clients=M, random_state=0)
    model = make_model("logreg", ds, 0)
    cfg = TrainConfig(
        method="pmtl", rounds=n_rounds, clients_per_round=PER_ROUND, epsilon=1.0, clip=0.5,
        noise_source="seeded", seed=0, progress=False, threads=1,
    )  # fmt: skip
    trainer = Trainer(ds, model, cfg, score_at_end=False)
    inputs = []
    for t, ks in enumerate(_rounds(n_rounds)):
        data = trainer._round_data(ks)
        plan = draw_round_plan(ks, trainer.offsets, t, trainer.config, starts=data.starts)
        starts = {
            n: p.unsqueeze(0).repeat(len(ks), *(1,) * p.ndim)
            for n, p in trainer.curator.billboard.items()
        }
        anchor = {n: p.clone() for n, p in trainer.curator.billboard.items()}
        inputs.append((starts, anchor, data.x, data.y, pack_plan(plan, trainer.config.batch_size)))
    step = make_step_fn(model, {})
    return [(step, *i, trainer.config) for i in inputs]


def _train(which: str, inputs: list[tuple]) -> None:
    for step, starts, anchor, x, y, packed, cfg in inputs:
        pulled = ProxStep(lr=cfg.lr, anchor=anchor, weight=float(cfg.lam or 0.0))
        plain = ProxStep(lr=cfg.lr)
        copies = {n: p.clone() for n, p in starts.items()}
        fn = _other_kernels_step if which == "other kernels" else step
        sets = (
            [(starts, pulled)] if which == "one training" else [(starts, pulled), (copies, plain)]
        )
        if which == "the engine's two sets as one model (local_sgd_sets)":
            local_sgd_sets(fn, sets, x, y, packed, cfg.batch_size)
            continue
        if which == "other kernels, rows shared":
            _ditto_sharing_rows(starts, anchor, x, y, packed, cfg)
            continue
        for state, rule in sets:  # the engine's way: one training after the other
            local_sgd_batched(fn, state, rule, x, y, packed, cfg.batch_size)


def _time(fn: Callable[[], None]) -> float:
    c = time.process_time()
    fn()
    return time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--training-only", action="store_true", help="time the trainings only")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ds = SyntheticFederation(n_clients=M, random_state=0)
    rounds = _rounds(args.rounds)
    n = sum(len(r) for r in rounds)
    takes: dict[str, Callable[[SyntheticFederation, np.ndarray], None]] = {
        "today: whole clients, float64 (stage 1)": _take_today,
        "train rows only, float64": lambda d, k: _train_only(np.float64, d, k),
        "train rows only, float32": lambda d, k: _train_only(np.float32, d, k),
        "train rows only, float32, torch generator": _train_only_torch,
    }
    if args.training_only:
        takes = {}
    inputs = _training_inputs(args.rounds)
    trains = [
        "two trainings, one after the other", "one training",
        "other kernels", "other kernels, rows shared",
        "the engine's two sets as one model (local_sgd_sets)",
    ]  # fmt: skip
    got: dict[str, list[float]] = {k: [] for k in (*takes, *trains)}
    for _ in range(args.repeats):
        for name, take in takes.items():
            got[name].append(_time(lambda take=take: [take(ds, ks) for ks in rounds]))
        for name in trains:
            got[name].append(_time(lambda name=name: _train(name, inputs)))
    print(
        f"{n} sampled clients, {args.rounds} rounds; CPU us per sampled client (median of {args.repeats}):"
    )
    for name, v in got.items():
        print(f"  {name:45s} {1e6 * statistics.median(v) / n:7.1f}")


if __name__ == "__main__":
    main()
