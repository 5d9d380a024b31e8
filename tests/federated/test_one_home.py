"""Every default of a federated run has one home, the run spec (privmtl.federated.spec.SPEC).

The test enumerates the places a default could be written again — TrainConfig's fields,
run_pmtl's and the sweep's keywords, the CLI's options, Flower's run configuration, and any
function or dataclass of the PMTL family with a parameter named like a setting — and checks that
each either equals the spec's default or is "not given" (None, or Flower's declared encoding), so
that changing a default in the spec changes it everywhere. The clients per round, δ and the target
ε have one resolver each, which every transport calls.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import click
import pytest

import privmtl
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.config import TrainConfig, resolve_config
from privmtl.federated.spec import (
    SPEC,
    RunSpec,
    default_clients_per_round,
    resolve_clients_per_round,
)

SPEC_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunSpec)}

#: TrainConfig fields whose default encodes the spec's "not given" differently, and why.
ENGINE_ENCODINGS = {"noise_std": 0.0}  # the engine's "no noise": RunSpec's None becomes 0

#: Parameters named like a setting whose literal default is not that setting's default.
NOT_A_SETTING = {
    # the result's record of where the noise came from, not the run's setting
    ("federated/config.py", "TrainResult.noise_source"),
    # a curator's own stream seed, always given by its callers
    ("federated/curator.py", "__init__.seed"),
    # a node's final models: the resolved personal_init of the run is always passed
    ("flower/_core.py", "trained.personal_init"),
    # the fine-tuning method of a call, not the run's method
    ("federated/finetune.py", "finetune.method"),
    ("federated/finetune_selection.py", "finetune_select.method"),
}

SRC = Path(privmtl.__file__).parent
#: The modules of the PMTL family (MP-MTL and the privacy primitives have their own defaults).
FAMILY = [
    *sorted((SRC / "federated").glob("*.py")),
    *sorted((SRC / "flower").glob("*.py")),
    SRC / "experiments" / "pmtl.py",
    SRC / "experiments" / "pmtl_sweep.py",
    SRC / "experiments" / "accounting.py",
]


def _unset(value: object) -> bool:
    """True for "no default declared": None, or click's sentinel for an option without one."""
    return value is None or type(value).__name__ == "Sentinel"


def test_train_config_takes_the_spec_defaults():
    engine = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    shared = sorted(set(engine) & set(SPEC_DEFAULTS))
    assert len(shared) >= 25  # every algorithm and privacy setting but the finetune choice
    for name in shared:
        expected = ENGINE_ENCODINGS.get(name, SPEC_DEFAULTS[name])
        assert engine[name] in (expected, None), name
    # the data-dependent ones are resolved, not defaulted
    assert engine["clients_per_round"] is None and engine["lam"] is None
    assert engine["delta"] is None and engine["epsilon"] is None


def test_run_pmtl_and_the_sweep_keywords_are_none_or_the_spec():
    from privmtl.experiments.pmtl import run_pmtl
    from privmtl.experiments.pmtl_sweep import run_pmtl_sweep

    for fn in (run_pmtl, run_pmtl_sweep):
        params = inspect.signature(fn).parameters
        checked = [n for n in params if n in SPEC_DEFAULTS]
        assert checked, fn.__name__
        for name in checked:
            default = params[name].default
            if default is inspect.Parameter.empty:
                continue
            assert default is None or default == SPEC_DEFAULTS[name], (fn.__name__, name)


def test_cli_options_default_to_the_spec():
    from privmtl.cli import cli

    ctx = click.Context(cli)
    commands = [cli.get_command(ctx, "pmtl"), cli.get_command(ctx, "pmtl-sweep")]
    flower = cli.get_command(ctx, "flower")
    assert isinstance(flower, click.Group)
    commands.append(flower.get_command(ctx, "local"))
    commands.append(cli.get_command(ctx, "account"))
    seen = 0
    for cmd in commands:
        assert cmd is not None
        for p in cmd.params:
            if p.name not in SPEC_DEFAULTS:
                continue
            seen += 1
            if _unset(SPEC_DEFAULTS[p.name]):
                assert _unset(p.default), (cmd.name, p.name, p.default)
            else:
                assert _unset(p.default) or p.default == SPEC_DEFAULTS[p.name], (cmd.name, p.name)
    assert seen >= 60


def test_flower_run_defaults_are_the_spec_or_not_given():
    from privmtl.flower._core import NOT_GIVEN, RUN_DEFAULTS

    for name, default in SPEC_DEFAULTS.items():
        key = name.replace("_", "-")
        assert key in RUN_DEFAULTS, name
        expected = NOT_GIVEN[name] if default is None else default
        assert RUN_DEFAULTS[key] == expected, name


def _literal_defaults(path: Path):
    """(qualified name, parameter, value) of every literal non-None default in ``path``."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            pos = a.posonlyargs + a.args
            defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
            pairs = [
                *zip(pos, defaults, strict=True),
                *zip(a.kwonlyargs, a.kw_defaults, strict=True),
            ]
            for arg, d in pairs:
                if isinstance(d, ast.Constant) and d.value is not None:
                    yield node.name, arg.arg, d.value
        elif isinstance(node, ast.ClassDef):
            for st in node.body:
                if (
                    isinstance(st, ast.AnnAssign)
                    and isinstance(st.target, ast.Name)
                    and isinstance(st.value, ast.Constant)
                    and st.value.value is not None
                ):
                    yield node.name, st.target.id, st.value.value


def test_no_setting_default_is_written_twice():
    """Outside the spec, no module of the family writes a setting's default as a literal."""
    twice = []
    for path in FAMILY:
        rel = path.relative_to(SRC).as_posix()
        if rel == "federated/spec.py":
            continue
        for owner, name, value in _literal_defaults(path):
            if name not in SPEC_DEFAULTS or (rel, f"{owner}.{name}") in NOT_A_SETTING:
                continue
            if (owner, name) == ("TrainConfig", "noise_std") and value == ENGINE_ENCODINGS[name]:
                continue
            twice.append(f"{rel}:{owner}({name}={value!r})")
    assert twice == []


# ------------------------------------------------------------------ one resolver per default
@pytest.mark.parametrize(
    ("given", "m", "sampling", "expected"),
    [
        (None, 50, "poisson", 20),
        (None, 7, "poisson", 7),
        (5, 50, "fixed", 5),
        (None, 9, "all", 9),
        (9, 9, "all", 9),
    ],
)
def test_clients_per_round_has_one_resolver(given, m, sampling, expected):
    assert resolve_clients_per_round(given, m, sampling=sampling) == expected
    cfg, _ = resolve_config(TrainConfig(clients_per_round=given, sampling=sampling), m)
    assert cfg.clients_per_round == expected
    if given is None and sampling != "all":
        assert expected == default_clients_per_round(m)


def test_clients_per_round_above_m_is_an_error_everywhere():
    from privmtl.flower._core import make_config, run_options

    with pytest.raises(InvalidParameterError, match=r"'clients_per_round'.*m=5.*got 6"):
        resolve_clients_per_round(6, 5, sampling="poisson")
    with pytest.raises(InvalidParameterError, match=r"'clients_per_round'.*m=5.*got 6"):
        resolve_config(TrainConfig(clients_per_round=6), 5)
    with pytest.raises(InvalidParameterError, match=r"'clients_per_round'.*m=5.*got 6"):
        make_config(run_options({"clients-per-round": 6}), 5)  # Flower no longer clamps
    with pytest.raises(InvalidParameterError, match=r"sampling='all'.*got 3"):
        resolve_config(TrainConfig(clients_per_round=3, sampling="all"), 5)


def test_delta_and_lambda_are_resolved_by_the_spec():
    cfg, cal = resolve_config(TrainConfig(), 40)
    assert cal is None and cfg.noise_std == 0.0
    assert cfg.delta == min(1e-5, 1 / 4000) and cfg.lam == 1.0  # not private: λ = 1
    private, _ = resolve_config(TrainConfig(noise_std=0.1), 40)
    assert private.lam == 0.001
    assert not hasattr(TrainConfig, "delta_for")  # the one δ resolver is the spec's


def test_product_defaults_are_the_spec_and_unchanged():
    cfg = TrainConfig()
    assert (cfg.clip, cfg.server_update, cfg.personal_init) == (0.5, "ditto", "auto")
    assert SPEC.clip == 0.5 and SPEC.server_update == "ditto" and SPEC.personal_init == "auto"


def test_a_target_is_calibrated_once_and_only_for_the_mean_release():
    cfg, cal = resolve_config(TrainConfig(rounds=5, epsilon=2.0), 30)
    assert cal is not None and cfg.noise_std == cal.noise_std and cfg.epsilon == 2.0
    assert cfg.lam == 0.001  # a target makes the run private: the private λ
    again, none = resolve_config(cfg, 30)
    assert again == cfg and none is None  # resolving a resolved config changes nothing
    with pytest.raises(InvalidParameterError, match=r"method='workshop'.*'noise_std'"):
        resolve_config(TrainConfig(method="workshop", ball=1.0, epsilon=2.0), 30)
