r"""Fixed task relationships: mean-regularized MTL within given client clusters (PMTL paper, remark
after Corollary 2; Evgeniou et al. 2005).

The clients are partitioned into fixed clusters :math:`G_1, \dots, G_K` (given, public, not learned
from the data). Each cluster runs PMTL (Algorithm 1, :func:`privmtl.federated.engine.train`) on its
own clients only, with its **own billboard** :math:`\tilde w_c^t` (the noisy mean of its clipped
updates), i.e. client :math:`k\in G_c` solves
:math:`l_k(w) + \frac{\lambda}{2}\lVert w - \tilde w_c\rVert^2`: the mean-regularized objective
:math:`\sum_c \sum_{k\in G_c}[\,l_k(w_k) + \frac{\lambda}{2}\lVert w_k - \bar w_c\rVert^2]` with the
fixed block-diagonal relationship :math:`\Omega` of the clusters.

Guarantee (parallel composition). Cluster ``c`` has :math:`m_c` clients and samples
:math:`q_c` of them per round (``sampling`` of the config; :math:`q_c = m_c` for ``"all"``,
otherwise ``round(q·m_c/m)`` clipped to ``[1, m_c]`` unless given) and releases with noise std
:math:`\sigma_c` on its mean, i.e. multiplier :math:`z_c = \sigma_c q_c/\gamma`; its own ledger
(same accountant, relation and δ for all clusters) gives :math:`(\varepsilon_c, \delta)` for the
sequence :math:`\tilde w_c^{1..T}`. A client of cluster ``c`` influences only cluster ``c``'s
releases: the other clusters' billboards are computed from other clients' data with *independent*
noise (every cluster has its own seed, :func:`cluster_seed`), so their joint distribution is the
same under both neighbouring inputs. Hence the collection of all billboards is
:math:`(\max_c \varepsilon_c, \delta)`-DP with respect to any one client, and the personalized
models — post-processing by each client of its own data and its cluster's billboard — are
:math:`(\max_c \varepsilon_c, \delta)`-billboard private, hence JDP. This needs the partition to be
fixed independently of the data (it is an input) and, under add/remove, the membership of the added
client to be public.

Noise: with ``target_epsilon=None`` every cluster uses the config's ``(σ, γ)`` (smaller clusters
then have smaller :math:`z_c` and larger :math:`\varepsilon_c`; the max is what is reported);
with ``target_epsilon`` every cluster's σ is calibrated to meet it with its own
:math:`(m_c, q_c)`, so every :math:`\varepsilon_c \le` target.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from privmtl._validation import check_int
from privmtl.data.federated import FederatedDataset
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import Params
from privmtl.federated.baselines import config_for_epsilon
from privmtl.federated.config import TrainConfig, TrainResult, check_inputs, resolve_config
from privmtl.federated.engine import train
from privmtl.federated.methods import method_class
from privmtl.federated.scoring import evaluate
from privmtl.federated.spec import default_lam
from privmtl.privacy.calibration import noise_multiplier

__all__ = ["ClusteredTrainResult", "cluster_seed", "parse_clusters", "train_clusters"]


def cluster_seed(seed: int, cluster: int) -> int:
    """The seed of cluster ``cluster``'s run: distinct, independent streams for every cluster."""
    state = np.random.SeedSequence([int(seed), 7, int(cluster)]).generate_state(1, np.uint32)
    return int(state[0])


def parse_clusters(clusters: Sequence[Any], num_clients: int) -> list[np.ndarray]:
    """Validate a partition of ``range(num_clients)``.

    ``clusters`` is either a label per client (a flat sequence of ``num_clients`` ints; clusters
    are ordered by label) or a sequence of index lists. Returns the sorted index array of each
    cluster. Every client must be in exactly one non-empty cluster.
    """
    items = list(clusters)
    if items and all(isinstance(c, int | np.integer) for c in items):
        if len(items) != num_clients:
            raise InvalidParameterError(
                f"The 'clusters' labels must have one entry per client ({num_clients}); "
                f"got {len(items)}."
            )
        labels = np.asarray(items, dtype=np.int64)
        groups = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    else:
        groups = [np.sort(np.asarray(list(g), dtype=np.int64).reshape(-1)) for g in items]
    if not groups or any(len(g) == 0 for g in groups):
        raise InvalidParameterError("The 'clusters' parameter must give non-empty clusters.")
    flat = np.concatenate(groups)
    if flat.min() < 0 or flat.max() >= num_clients:
        raise InvalidParameterError(
            f"The 'clusters' parameter must hold client indices in [0, {num_clients})."
        )
    counts = np.bincount(flat, minlength=num_clients)
    if np.any(counts != 1):
        bad = np.flatnonzero(counts != 1)[:5].tolist()
        raise InvalidParameterError(
            "The 'clusters' parameter must be a partition: every client in exactly one cluster; "
            f"clients {bad} are in {counts[bad].tolist()} clusters."
        )
    return groups


@dataclass
class ClusteredTrainResult(TrainResult):
    """:class:`TrainResult` of :func:`train_clusters`, in the original client order.

    Extra attributes
    ----------------
    cluster_of : ndarray of int
        Cluster index of every client.
    cluster_params : dict of str to Tensor
        The final billboards stacked ``(K, *shape)``.
    cluster_results : list of TrainResult
        The per-cluster runs (client indices local to the cluster).

    ``global_params[name][k]`` is the billboard of client ``k``'s cluster (stacked ``(m, ...)``),
    and ``accuracies[split]["global"]`` evaluates every client with its own cluster's billboard.
    """

    cluster_of: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    cluster_params: dict[str, torch.Tensor] = field(default_factory=dict)
    cluster_results: list[TrainResult] = field(default_factory=list)

    def client_params(self, k: int) -> dict[str, torch.Tensor]:
        """Client ``k``'s model: its personalized model, or its cluster's billboard."""
        src = self.personalized_params
        if src is None:
            src = self.global_params
        return {n: p[k] for n, p in src.items()}


def _cluster_sizes(
    config: TrainConfig, groups: list[np.ndarray], m: int, clients_per_cluster: Any
) -> list[int]:
    sizes = [len(g) for g in groups]
    if config.sampling == "all":
        return sizes
    if clients_per_cluster is not None:
        qs = list(clients_per_cluster)
        if len(qs) != len(groups):
            raise InvalidParameterError(
                f"The 'clients_per_cluster' parameter needs one entry per cluster ({len(groups)}); "
                f"got {len(qs)}."
            )
        return [
            check_int(f"clients_per_cluster[{c}]", q, low=1, high=s)
            for c, (q, s) in enumerate(zip(qs, sizes, strict=True))
        ]
    q = int(config.clients_per_round or m)
    return [min(s, max(1, round(q * s / m))) for s in sizes]


def train_clusters(
    dataset: FederatedDataset,
    model: nn.Module,
    config: TrainConfig | None,
    clusters: Sequence[Any],
    *,
    target_epsilon: float | None = None,
    clients_per_cluster: Sequence[int] | None = None,
) -> ClusteredTrainResult:
    r"""Mean-regularized MTL per fixed cluster, one private billboard per cluster (module doc).

    Parameters
    ----------
    dataset : FederatedDataset
    model : nn.Module
        Architecture and initial parameters (the same for every cluster).
    config : TrainConfig or None
        The PMTL configuration of every cluster; ``clients_per_round`` is split over clusters in
        proportion to their sizes (see module doc), ``seed`` is turned into one independent seed
        per cluster (:func:`cluster_seed`), δ resolved for ``m`` = all clients
        (:func:`~privmtl.federated.config.resolve_config`)
        for every cluster.
    clusters : sequence
        The partition: one label per client, or one list of client indices per cluster.
    target_epsilon : float, optional
        Calibrate each cluster's σ to this ε (:func:`~privmtl.federated.baselines.config_for_epsilon`
        with the cluster's :math:`m_c, q_c`); default: the config's ``noise_std`` everywhere.
    clients_per_cluster : sequence of int, optional
        :math:`q_c` per cluster (ignored for ``sampling="all"``).

    Returns
    -------
    ClusteredTrainResult
        ``epsilon`` = :math:`\max_c \varepsilon_c` (parallel composition), ``history[t]["epsilon"]``
        the max over clusters after round ``t``; ``ledger`` the ledger of the cluster attaining
        the max; ``extra["clusters"]`` lists every cluster's clients, :math:`m_c, q_c, \sigma_c,
        z_c`, seed and :math:`\varepsilon_c` (with its ledger as a dict).
    """
    config = TrainConfig() if config is None else config
    check_inputs(dataset)
    m = dataset.n_clients
    # q, λ and δ of all m clients, as in one run; each cluster's σ is calibrated below
    target = config.epsilon if target_epsilon is None else target_epsilon
    private = target is not None or config.noise_std > 0
    lam = default_lam(config.method, private=private) if config.lam is None else config.lam
    config = resolve_config(dataclasses.replace(config, epsilon=None, lam=lam), m)[0]
    groups = parse_clusters(clusters, m)
    qs = _cluster_sizes(config, groups, m, clients_per_cluster)
    delta = float(config.delta or 0.0)

    results: list[TrainResult] = []
    info: list[dict[str, Any]] = []
    for c, (idx, q_c) in enumerate(zip(groups, qs, strict=True)):
        cfg = dataclasses.replace(
            config, clients_per_round=q_c, seed=cluster_seed(config.seed, c), delta=delta
        )
        if target is not None and method_class(config.method).communicates:
            cfg = config_for_epsilon(cfg, len(idx), target)
        res = train(dataset.subset(idx.tolist()), model, cfg)
        results.append(res)
        z_c = (
            noise_multiplier(cfg.noise_std, q_c, cfg.clip) if cfg.is_private and cfg.clip else None
        )
        info.append(
            {
                "clients": idx.tolist(),
                "num_clients": len(idx),
                "clients_per_round": q_c,
                "noise_std": cfg.noise_std,
                "noise_multiplier": z_c,
                "seed": cfg.seed,
                "epsilon": res.epsilon,
                "ledger": res.ledger.to_dict() if res.ledger is not None else None,
            }
        )

    cluster_of, cluster_params, per_client_board, personal = _client_models(results, groups, m)

    buffers = {n: b.detach() for n, b in model.named_buffers()}
    accuracies: dict[str, dict[str, dict[str, float]]] = {}
    for split in ("val", "test"):
        xs, ys = dataset.split(split)
        accuracies[split] = {
            "global": evaluate(model, per_client_board, buffers, xs, ys, personalized=True)
        }
        if personal is not None:
            accuracies[split]["personalized"] = evaluate(
                model, personal, buffers, xs, ys, personalized=True
            )

    eps = [r.epsilon for r in results]
    worst = int(np.argmax(eps))
    history = _merge_histories(results, groups)
    return ClusteredTrainResult(
        config=config,
        client_ids=list(dataset.client_ids),
        personalized_params=personal,
        global_params=per_client_board,
        history=history,
        accuracies=accuracies,
        primary=results[0].primary,
        epsilon=float(max(eps)),
        delta=delta,
        ledger=results[worst].ledger,
        seconds=float(sum(r.seconds for r in results)),
        seconds_per_round=float(sum(r.seconds_per_round for r in results)),
        extra={
            "method": "clusters",
            "composition": "parallel: epsilon = max over clusters (disjoint clients, "
            "independent noise, same delta)",
            "n_clusters": len(groups),
            "clusters": info,
        },
        cluster_of=cluster_of,
        cluster_params=cluster_params,
        cluster_results=results,
    )


def _client_models(
    results: list[TrainResult], groups: list[np.ndarray], m: int
) -> tuple[np.ndarray, Params, Params, Params | None]:
    """The clusters' runs as models of the ``m`` clients: every client's cluster, the clusters'
    billboards stacked, every client's cluster billboard and (when every cluster has them) every
    client's personalized model."""
    cluster_of = np.empty(m, dtype=np.int64)
    for c, idx in enumerate(groups):
        cluster_of[idx] = c
    names = list(results[0].global_params)
    cluster_params = {n: torch.stack([r.global_params[n] for r in results]) for n in names}
    of = torch.from_numpy(cluster_of)
    per_client_board = {n: p.index_select(0, of) for n, p in cluster_params.items()}
    personal: Params | None = None
    if all(r.personalized_params is not None for r in results):
        first = results[0].personalized_params
        assert first is not None
        personal = {n: torch.empty((m, *p.shape[1:]), dtype=p.dtype) for n, p in first.items()}
        for idx, r in zip(groups, results, strict=True):
            assert r.personalized_params is not None
            for n in personal:
                personal[n][torch.from_numpy(idx)] = r.personalized_params[n]
    return cluster_of, cluster_params, per_client_board, personal


def _merge_histories(results: list[TrainResult], groups: list[np.ndarray]) -> list[dict[str, Any]]:
    out = []
    for t in range(max((len(r.history) for r in results), default=0)):
        recs = [r.history[t] for r in results]
        sampled = sorted(
            int(g[k]) for g, rec in zip(groups, recs, strict=True) for k in rec["sampled"]
        )
        n = np.array([rec["n_sampled"] for rec in recs], dtype=float)
        loss = np.array([rec["train_loss"] for rec in recs], dtype=float)
        ok = (n > 0) & np.isfinite(loss)
        clipped = np.array([rec["clipped_fraction"] for rec in recs], dtype=float)
        out.append(
            {
                "round": t,
                "sampled": sampled,
                "n_sampled": len(sampled),
                "train_loss": float((n[ok] * loss[ok]).sum() / n[ok].sum())
                if ok.any()
                else math.nan,
                "update_norms": [v for rec in recs for v in rec["update_norms"]],
                "clipped_fraction": float((n * clipped).sum() / n.sum()) if n.sum() else 0.0,
                "noise_multiplier": [rec["noise_multiplier"] for rec in recs],
                "epsilon": float(max(rec["epsilon"] for rec in recs)),
                "epsilon_per_cluster": [rec["epsilon"] for rec in recs],
                "seconds": float(sum(rec["seconds"] for rec in recs)),
            }
        )
    return out
