r"""The settings of a federated run and their product defaults, defined once.

:class:`RunSpec` holds the algorithm and privacy options of one run of the PMTL family — the
method, the client message, the clip, the clients per round, λ, the personal start, the step size,
the batch size, the rounds, the sampler, the accountant, the neighbouring relation, the local
fine-tuning, where the noise comes from and δ — with the defaults every entry point uses:
:func:`~privmtl.experiments.pmtl.run_pmtl`, ``privmtl pmtl``, ``privmtl pmtl-sweep`` and
``privmtl flower local`` (and the Flower apps' run configuration) read them from here. Its
constraints are declared once, in :attr:`RunSpec._parameter_constraints`, and checked when the
object is built.

Some defaults depend on the data or on the calibrated noise; :func:`resolve_defaults` is the one
function that fills them in:

* ``clients_per_round``: :func:`default_clients_per_round`, ``min(20, m)`` (an explicit value above
  ``m`` is an error; ``method="local-all"`` trains every client);
* ``lam``: :func:`default_lam` (λ chosen on FEMNIST validation accuracy: 0.001 for private runs, 1
  without noise, FedProx's μ = 0.01);
* ``delta``: :func:`pmtl_delta`, min(1e-5, 1/(100 m)) (below 1/m, as DP practice asks), or the
  PMTL paper's 1/m with ``delta="paper"``;
* ``sampling``: ``"all"`` when every client takes part in every round (``q = m``);
* ``personal_init``: ``"auto"`` becomes ``"billboard"`` or ``"model"`` by
  :func:`resolve_personal_init` once the noise of one release is known.

The resolved spec is what a run reports under ``config`` in its JSON result
(:meth:`RunSpec.to_dict`). The engine's low-level :class:`~privmtl.federated.config.TrainConfig`
keeps its own neutral defaults; a run builds it from a resolved spec with
:func:`~privmtl.federated.config.train_config`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from numbers import Integral, Real
from pathlib import Path
from typing import Any, ClassVar

from privmtl._device import DEFAULT_DEVICE
from privmtl._validation import (
    ROUND_BYTES,
    Interval,
    Options,
    check_choice,
    check_int,
    check_memory,
    validate_params,
)
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.methods import RUN_METHODS, MethodName, method_class
from privmtl.federated.methods.base import DEFAULT_LAM_NONPRIVATE, DEFAULT_LAM_PRIVATE
from privmtl.federated.methods.fedavg import DEFAULT_FEDPROX_MU
from privmtl.privacy.delta import check_delta, pmtl_paper_delta, user_data_delta
from privmtl.privacy.guarantee import DEFAULT_ACCOUNTANT, DEFAULT_RELATION, RELATIONS
from privmtl.privacy.matrix_factorization import NOISE_MECHANISMS
from privmtl.privacy.release import billboard_carries_signal
from privmtl.privacy.sampling import cyclic_group_size

__all__ = [
    "DEFAULT_CLIENTS_PER_ROUND",
    "DEFAULT_FEDPROX_MU",
    "DEFAULT_HEAD_EPOCHS",
    "DEFAULT_LAM_NONPRIVATE",
    "DEFAULT_LAM_PRIVATE",
    "EXECUTION",
    "FINETUNE_CHOICES",
    "FINETUNE_METHODS",
    "PERSONAL_INITS",
    "RUN_METHODS",
    "SERVER_UPDATES",
    "SPEC",
    "Execution",
    "RunSpec",
    "check_param_names",
    "check_participation",
    "check_resume",
    "default_clients_per_round",
    "default_lam",
    "pmtl_delta",
    "resolve_clients_per_round",
    "resolve_defaults",
    "resolve_personal_init",
]

SERVER_UPDATES = ("ditto", "offset", "delta")
"""The client messages (:class:`~privmtl.federated.config.TrainConfig`'s ``server_update``)."""
PERSONAL_INITS = ("auto", "model", "billboard")
FINETUNE_METHODS = ("vanilla", "mr", "skl", "ewc")
"""The local fine-tuning methods of :func:`~privmtl.federated.end_of_run.finetune.finetune`."""
#: ``fedrep``: local epochs of head training per round (the representation frozen) and at the end.
DEFAULT_HEAD_EPOCHS = 5
"""Where a client's persistent model starts (``personal_init``)."""
FINETUNE_CHOICES = ("auto", "none", *FINETUNE_METHODS)
"""The values of the ``finetune`` setting (local fine-tuning after training): ``auto`` (each
client's choice on its own validation split, :data:`~privmtl.federated.end_of_run.finish.AUTO_FINETUNE_EPOCHS`),
``none``, or one of :func:`~privmtl.federated.end_of_run.finetune.finetune`'s methods
(:data:`FINETUNE_METHODS`)."""
_SAMPLINGS = ("poisson", "fixed", "all", "cyclic")
_ACCOUNTANTS = ("rdp", "pld")
_NOISE_SOURCES = ("secure", "seeded")
_SERVER_OPTIMIZERS = ("none", "momentum", "adam")


#: Clients sampled per round when none is given: this many, or all m clients when there are fewer.
DEFAULT_CLIENTS_PER_ROUND = 20


def default_clients_per_round(m: int) -> int:
    """``min(DEFAULT_CLIENTS_PER_ROUND, m)``: the default never exceeds the population."""
    return min(DEFAULT_CLIENTS_PER_ROUND, int(m))


def check_participation(sampling: str, groups: int, noise_mechanism: str) -> None:
    """Refuse a ``groups`` or ``noise_mechanism`` the ``sampling`` cannot go with.

    ``groups`` (an integer >= 1) other than 1 needs ``sampling="cyclic"``;
    ``noise_mechanism="banded"`` needs ``sampling`` ``"all"`` or ``"cyclic"`` (the participation
    patterns its sensitivity is computed for)."""
    check_int("groups", groups, low=1)
    check_choice("noise_mechanism", noise_mechanism, NOISE_MECHANISMS)
    if groups != 1 and sampling != "cyclic":
        raise InvalidParameterError(
            "The 'groups' parameter applies to sampling='cyclic' only; got "
            f"groups={groups!r} with sampling={sampling!r}."
        )
    if noise_mechanism == "banded" and sampling not in ("all", "cyclic"):
        raise InvalidParameterError(
            "The 'noise_mechanism' parameter 'banded' needs the 'sampling' parameter 'all' or "
            f"'cyclic' (a participation pattern it can account exactly); got sampling={sampling!r}."
        )


def check_resume(resume: bool, noise_mechanism: str, noise_source: str) -> None:
    """Refuse to resume a run with secure banded noise: its next rounds' noise depends on the
    past rounds' noise, which only a seeded run checkpoints (secure noise is never written
    down)."""
    if resume and noise_mechanism == "banded" and noise_source != "seeded":
        raise InvalidParameterError(
            "The 'resume' parameter needs noise_source='seeded' (--reproducible-noise) with "
            "noise_mechanism='banded' (banded noise depends on the past rounds' noise, which "
            f"secure noise never writes down); got noise_source={noise_source!r}."
        )


def check_vote_mechanism(finetune_select: str, noise_mechanism: str) -> None:
    """Refuse an end-of-run vote in a banded run: banded noise charges the whole run as one event
    before its first round, so no share of the budget is left to reserve for the vote."""
    if finetune_select == "vote" and noise_mechanism == "banded":
        raise InvalidParameterError(
            "noise_mechanism='banded' charges the whole run as one event and cannot reserve a "
            "share for an end-of-run vote; use another 'finetune_select'; got "
            "finetune_select='vote'."
        )


def resolve_clients_per_round(
    clients_per_round: int | None,
    m: int,
    *,
    sampling: str,
    every_client: bool = False,
    groups: int = 1,
) -> int:
    """``q`` of a run on ``m`` clients: the one place clients per round is resolved.

    ``m`` when every client takes part (``every_client``: ``local-all`` and ``workshop``, where
    the setting does not apply, or ``sampling="all"``, where an explicit other value is an
    error); :func:`default_clients_per_round` (``min(20, m)``) when None; an explicit value above
    ``m`` is an error (it is never clamped: ``q`` sets the sampling rate the guarantee is
    accounted with). ``run_pmtl``, the sweep (per data set), the engine, the baselines and
    Flower's ServerApp all call it.
    """
    m = int(m)
    if every_client:
        return m
    if sampling == "cyclic":  # the largest of the groups: ceil(m / groups)
        q = cyclic_group_size(m, groups)
        if clients_per_round is not None and int(clients_per_round) != q:
            raise InvalidParameterError(
                "The 'clients_per_round' parameter must equal the largest group's size "
                f"ceil(m / groups) = {q} with sampling='cyclic' (m={m}, groups={groups}); got "
                f"{clients_per_round}."
            )
        return q
    if sampling == "all":  # every client in every round: the q accounted is m
        if clients_per_round is not None and int(clients_per_round) != m:
            raise InvalidParameterError(
                "The 'clients_per_round' parameter must equal the number of clients "
                f"m={m} with sampling='all' (every client takes part in every round); got "
                f"{clients_per_round}."
            )
        return m
    if clients_per_round is None:
        return default_clients_per_round(m)
    q = int(clients_per_round)
    if q > m:
        raise InvalidParameterError(
            f"The 'clients_per_round' parameter must be at most the number of clients m={m} "
            f"of the data; got {q}."
        )
    return q


def check_param_names(shared_params: Any) -> tuple[str, ...]:
    """``shared_params`` as a tuple, after refusing anything but a sequence of non-empty names."""
    if isinstance(shared_params, str) or not all(isinstance(n, str) and n for n in shared_params):
        raise InvalidParameterError(
            "The 'shared_params' parameter must be a sequence of parameter names; got "
            f"{shared_params!r}."
        )
    return tuple(shared_params)


def default_lam(method: str, *, private: bool) -> float:
    """The λ used when none is given: the method's
    (:meth:`~privmtl.federated.methods.base.Method.default_lam`: :data:`DEFAULT_LAM_PRIVATE` for
    a private run, :data:`DEFAULT_LAM_NONPRIVATE` without noise, :data:`DEFAULT_FEDPROX_MU` for
    FedProx)."""
    return float(method_class(method).default_lam(private=private))


def pmtl_delta(delta: float | str | None, m: int) -> tuple[float, tuple[str, ...]]:
    """δ of a run with ``m`` clients and the notes it needs.

    None: :func:`~privmtl.privacy.delta.user_data_delta`, min(1e-5, 1/(100 m)); ``"paper"``: the
    PMTL paper's 1/m (with a note: a guarantee at δ ≥ 1/m allows revealing one client's data);
    a float: checked (:func:`~privmtl.privacy.delta.check_delta`, δ ≥ 1/m warns).
    """
    if delta is None:
        return user_data_delta(m), ()
    if isinstance(delta, str):
        Options(("paper",)).check("delta", delta)
        return pmtl_paper_delta(m), (
            f"delta = 1/m = {pmtl_paper_delta(m):.3g}: the PMTL paper's delta (--paper-delta), "
            "for reproductions; a guarantee at delta >= 1/m allows revealing one client's data "
            "outright",
        )
    return check_delta(delta, m), ()


def resolve_personal_init(
    personal_init: str, noise_std: float, clip: float | None, released_dim: int
) -> str:
    """``"auto"`` → ``"billboard"`` when the noise norm of one release is at most the clip
    (:func:`~privmtl.privacy.release.billboard_carries_signal`), else ``"model"``; any other
    value is returned as given."""
    if personal_init != "auto":
        return personal_init
    return "billboard" if billboard_carries_signal(noise_std, clip, released_dim) else "model"


@dataclass(frozen=True)
class RunSpec:
    """The algorithm and privacy settings of one federated run, with the product's defaults.

    Built once per run and checked against :attr:`_parameter_constraints` (an
    :class:`~privmtl.exceptions.InvalidParameterError` names the parameter, the constraint and
    the value). ``None`` marks a data-dependent default that :func:`resolve_defaults` fills in.

    Parameters
    ----------
    method : str, default "pmtl"
        One of :data:`RUN_METHODS`.
    server_update : {"ditto", "offset", "delta"}, default "ditto"
        The client message: Ditto's (the billboard follows FedAvg's and the personalized models are
        pulled towards it), the authors' code's ``w_k^new - w~``, or Algorithm 1's
        ``w_k^new - w_k^old`` as printed (can diverge when ``q < m``).
    clip : float, default 0.5
        γ, the clip of every client message.
    clients_per_round : int or None, default None
        ``q``; None: :func:`default_clients_per_round` (``min(20, m)``).
    lam : float or None, default None
        λ (FedProx's μ); None: :func:`default_lam` (depends on whether the run is private).
    personal_init : {"auto", "model", "billboard"}, default "auto"
        Where a client's persistent model starts (:func:`resolve_personal_init`).
    lr : float, default 0.1
        Local SGD step size.
    batch_size : int, default 10
        Local minibatch size.
    rounds : int, default 100
        Communication rounds ``T``.
    local_steps, local_epochs : int or None
        Local work per round (at most one; neither: one local epoch).
    epsilon : float or None
        Target ε (σ is calibrated to it); at most one of ``epsilon`` and ``noise_std``; neither:
        no noise (not private).
    noise_std : float or None
        σ of the noise on the released mean.
    delta : float, "paper" or None, default None
        δ; None: min(1e-5, 1/(100 m)); ``"paper"``: 1/m (:func:`pmtl_delta`).
    sampling : {"poisson", "fixed", "all", "cyclic"}, default "poisson"
        Client sampling (``"all"`` when ``q = m``); ``"cyclic"``: ``groups`` public groups
        (client ``k`` in group ``k mod b``), group ``t mod b`` in round ``t``.
    groups : int, default 1
        ``b``, the groups of ``sampling="cyclic"`` (in [1, m]; 1 only with other samplings).
    noise_mechanism : {"independent", "banded"}, default "independent"
        Fresh noise every round, or banded matrix-factorization noise over the run
        (:mod:`privmtl.privacy.matrix_factorization`; needs ``sampling`` "all" or "cyclic").
    accountant : {"rdp", "pld"}, default "rdp"
    relation : {"add-remove", "replace-one"}, default "add-remove"
    finetune : str, default "auto"
        One of :data:`FINETUNE_CHOICES`.
    noise_source : {"secure", "seeded"}, default "secure"
        OS entropy, or a generator seeded from ``seed`` (research simulation only).
    seed : int, default 0
    server_optimizer : {"none", "momentum", "adam"}, default "none"
    server_lr : float, default 1.0
    server_momentum : float, default 0.9
    head_epochs : int, default :data:`~privmtl.federated.config.DEFAULT_HEAD_EPOCHS`
        fedrep: local epochs of head training per round and at the end.
    shared_params : tuple of str or None
        Partial sharing (pmtl) or fedrep's representation; None: every parameter is shared
        (fedrep: every parameter but the last layer's).
    subspace_dim : int or None
        Random-subspace releases of this many coordinates; None: all coordinates.
    adaptive_clip_quantile : float or None
        Adaptive clipping's target quantile; None: fixed clip.
    adaptive_clip_lr : float, default 0.2
    adaptive_clip_noise : float or None
        σ_b of adaptive clipping's count (None: ``q/20``).
    """

    method: str = "pmtl"
    server_update: str = "ditto"
    clip: float = 0.5
    clients_per_round: int | None = None
    lam: float | None = None
    personal_init: str = "auto"
    lr: float = 0.1
    batch_size: int = 10
    rounds: int = 100
    local_steps: int | None = None
    local_epochs: int | None = None
    epsilon: float | None = None
    noise_std: float | None = None
    delta: float | str | None = None
    sampling: str = "poisson"
    groups: int = 1
    noise_mechanism: str = "independent"
    accountant: str = DEFAULT_ACCOUNTANT
    relation: str = DEFAULT_RELATION
    finetune: str = "auto"
    noise_source: str = "secure"
    seed: int = 0
    server_optimizer: str = "none"
    server_lr: float = 1.0
    server_momentum: float = 0.9
    head_epochs: int = DEFAULT_HEAD_EPOCHS
    shared_params: tuple[str, ...] | None = None
    subspace_dim: int | None = None
    adaptive_clip_quantile: float | None = None
    adaptive_clip_lr: float = 0.2
    adaptive_clip_noise: float | None = None

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "method": MethodName(),
        "server_update": Options(SERVER_UPDATES),
        "clip": Interval(Real, 0.0, None, closed="neither"),
        "clients_per_round": [None, Interval(Integral, 1, None)],
        "lam": [None, Interval(Real, 0.0, None)],
        "personal_init": Options(PERSONAL_INITS),
        "lr": Interval(Real, 0.0, None, closed="neither"),
        "batch_size": Interval(Integral, 1, None),
        "rounds": Interval(Integral, 1, None),
        "local_steps": [None, Interval(Integral, 1, None)],
        "local_epochs": [None, Interval(Integral, 1, None)],
        "epsilon": [None, Interval(Real, 0.0, None, closed="neither")],
        "noise_std": [None, Interval(Real, 0.0, None)],
        "delta": [None, Options(("paper",)), Interval(Real, 0.0, 1.0, closed="neither")],
        "sampling": Options(_SAMPLINGS),
        "groups": Interval(Integral, 1, None),
        "noise_mechanism": Options(NOISE_MECHANISMS),
        "accountant": Options(_ACCOUNTANTS),
        "relation": Options(RELATIONS),
        "finetune": Options(FINETUNE_CHOICES),
        "noise_source": Options(_NOISE_SOURCES),
        "seed": Interval(Integral, 0, None),
        "server_optimizer": Options(_SERVER_OPTIMIZERS),
        "server_lr": Interval(Real, 0.0, None, closed="neither"),
        "server_momentum": Interval(Real, 0.0, 1.0, closed="left"),
        "head_epochs": Interval(Integral, 1, None),
        "subspace_dim": [None, Interval(Integral, 1, None)],
        "adaptive_clip_quantile": [None, Interval(Real, 0.0, 1.0, closed="neither")],
        "adaptive_clip_lr": Interval(Real, 0.0, None, closed="neither"),
        "adaptive_clip_noise": [None, Interval(Real, 0.0, None, closed="neither")],
    }
    """The declared constraint of every checked setting (a list: any of these; None admits
    None); ``shared_params`` is checked separately (a tuple of names)."""

    def __post_init__(self) -> None:
        if self.epsilon is not None and self.noise_std is not None:
            raise InvalidParameterError(
                "Give at most one of 'epsilon' and 'noise_std'; got "
                f"epsilon={self.epsilon!r}, noise_std={self.noise_std!r}."
            )
        if self.local_steps is not None and self.local_epochs is not None:
            raise InvalidParameterError(
                "Set at most one of 'local_steps' and 'local_epochs'; got "
                f"local_steps={self.local_steps!r}, local_epochs={self.local_epochs!r}."
            )
        for name, value in validate_params(self).items():
            object.__setattr__(self, name, value)
        check_memory("rounds", self.rounds, ROUND_BYTES, "rounds")
        check_participation(self.sampling, self.groups, self.noise_mechanism)
        if self.shared_params is not None:
            object.__setattr__(self, "shared_params", check_param_names(self.shared_params))

    @property
    def private(self) -> bool:
        """True when the run asks for noise: an ε target, or σ > 0 (what :func:`default_lam`
        reads)."""
        return self.epsilon is not None or bool(self.noise_std)

    def replace(self, **changes: Any) -> RunSpec:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The settings by name (JSON-ready: ``shared_params`` as a list)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if out["shared_params"] is not None:
            out["shared_params"] = list(out["shared_params"])
        return out


SPEC = RunSpec()
"""The product defaults (every setting at its default, before resolution)."""


@dataclass(frozen=True)
class Execution:
    """How a run executes, not what it computes: the same settings give the same result.

    The one definition of these defaults (``run_pmtl``'s keywords of the same names, the options
    of ``privmtl pmtl``, and :class:`~privmtl.federated.config.TrainConfig`'s ``threads``,
    ``device`` and ``progress``).

    Parameters
    ----------
    threads : int, default 2
        Torch threads during training (and blocks of clients the end of run computes at once).
    device : str, default "auto"
        Where the in-process engine computes (:func:`privmtl._device.resolve_device`).
    show_progress : bool, default True
        Report progress on stderr.
    sequential : bool, default False
        Train the sampled clients one after another (the per-client reference loop) instead of
        vectorised together (same math, same random draws).
    checkpoint_dir : path or None
        Where the run checkpoints (None: no checkpoint).
    checkpoint_every : int, default 1
        Rounds between checkpoints.
    resume : bool, default False
        Continue the run saved in ``checkpoint_dir``.
    save_models : path or None
        Where the trained models are written (None: not saved).
    eval_every : int, default 0
        Every this many rounds, record the validation accuracy of the method's model
        (``val_accuracy_per_round``; 0: never).
    """

    threads: int = 2
    device: str = DEFAULT_DEVICE
    show_progress: bool = True
    sequential: bool = False
    checkpoint_dir: str | Path | None = None
    checkpoint_every: int = 1
    resume: bool = False
    save_models: str | Path | None = None
    eval_every: int = 0


EXECUTION = Execution()
"""Every execution option at its default."""


def resolve_defaults(
    spec: RunSpec,
    num_clients: int,
    *,
    noise_std: float | None = None,
    released_dim: int | None = None,
) -> RunSpec:
    """``spec`` with every data-dependent default of a run on ``num_clients`` clients filled in.

    ``clients_per_round`` (:func:`default_clients_per_round`; ``m`` for ``local-all`` and for
    ``sampling="all"``, where an explicit other value is an error; an explicit value above ``m`` is
    an error), ``lam`` (:func:`default_lam`), ``delta``
    (:func:`pmtl_delta`) and ``sampling`` (``"all"`` when ``q = m``). With the calibrated
    ``noise_std`` of the release and its ``released_dim``, ``personal_init="auto"`` is resolved
    too (:func:`resolve_personal_init`); without them it stays ``"auto"``.
    """
    m = int(num_clients)
    q = resolve_clients_per_round(
        spec.clients_per_round,
        m,
        sampling=spec.sampling,
        every_client=method_class(spec.method).every_client,  # clients_per_round does not apply
        groups=spec.groups,
    )
    lam = default_lam(spec.method, private=spec.private) if spec.lam is None else spec.lam
    delta, _ = pmtl_delta(spec.delta, m)
    personal_init = spec.personal_init
    if noise_std is not None and released_dim is not None:
        personal_init = resolve_personal_init(personal_init, noise_std, spec.clip, released_dim)
    return spec.replace(
        clients_per_round=q,
        lam=lam,
        delta=delta,
        sampling="all" if q == m else spec.sampling,
        groups=1 if q == m else spec.groups,
        personal_init=personal_init,
    )
