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
    ("federated/train_result.py", "TrainResult.noise_source"),
    # a curator's own stream seed, always given by its callers
    ("federated/curator.py", "__init__.seed"),
    # a node's final models: the resolved personal_init of the run is always passed
    ("flower/node_clients.py", "trained.personal_init"),
    # the fine-tuning method of a call, not the run's method
    ("federated/end_of_run/finetune.py", "finetune.method"),
    ("federated/end_of_run/finetune_selection.py", "finetune_select.method"),
    # the workshop's own fine-tuning epochs of its direct API (run_pmtl passes the run's)
    ("federated/workshop.py", "train_workshop.finetune_epochs"),
}

SRC = Path(privmtl.__file__).parent
#: The modules of the PMTL family (MP-MTL and the privacy primitives have their own defaults).
FAMILY = [
    *sorted((SRC / "federated").glob("*.py")),
    *sorted((SRC / "federated" / "end_of_run").glob("*.py")),
    *sorted((SRC / "flower").glob("*.py")),
    SRC / "experiments" / "pmtl.py",
    SRC / "experiments" / "pmtl_steps.py",
    SRC / "experiments" / "pmtl_saved.py",
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


def test_the_sweep_keywords_are_none_or_the_spec():
    from privmtl.experiments.pmtl_sweep import run_pmtl_sweep

    params = inspect.signature(run_pmtl_sweep).parameters
    checked = [n for n in params if n in SPEC_DEFAULTS]
    assert checked
    for name in checked:
        default = params[name].default
        if default is inspect.Parameter.empty:
            continue
        assert default is None or default == SPEC_DEFAULTS[name], name


def test_run_pmtl_keywords_are_the_fields_of_the_three_parts():
    """``run_pmtl(spec=None, /, **settings)``: at most 25 parameters, every keyword a field of
    exactly one typed part (its default defined there only), an unknown one refused by name."""
    from privmtl.experiments.pmtl import run_pmtl
    from privmtl.federated.options import PMTL_PARAMETERS, RunOptions
    from privmtl.federated.spec import Execution

    assert len(inspect.signature(run_pmtl).parameters) <= 25
    parts = (RunSpec, Execution, RunOptions)
    homes: dict[str, list[str]] = {}
    for part in parts:
        for f in dataclasses.fields(part):
            homes.setdefault(f.name, []).append(part.__name__)
    assert {n: h for n, h in homes.items() if len(h) != 1} == {}
    assert {n: c.__name__ for n, c in PMTL_PARAMETERS.items()} == {
        n: h[0] for n, h in homes.items()
    }
    assert len(PMTL_PARAMETERS) >= 55  # every keyword run_pmtl took before it took parts
    with pytest.raises(InvalidParameterError, match=r"Invalid parameter 'roundz' for run_pmtl"):
        run_pmtl(data="synthetic", roundz=3)


def test_run_pmtl_from_a_spec_equals_run_pmtl_from_its_keywords():
    """``run_pmtl(spec, **settings)``: the spec's settings, the keywords replacing them."""
    from privmtl.experiments.pmtl import run_pmtl

    small = {"data": "synthetic", "num_clients": 8, "model": "logreg", "show_progress": False,
             "threads": 1, "baseline": False, "finetune": "none"}  # fmt: skip
    spec = SPEC.replace(rounds=2, epsilon=1.0, noise_source="seeded", clients_per_round=3, seed=4)
    by_spec = run_pmtl(spec, **small, seed=1)
    by_keywords = run_pmtl(**{**spec.to_dict(), **small, "seed": 1})
    timings = ("seconds", "seconds_per_round", "data_seconds", "phases")
    assert by_spec["config"]["seed"] == 1 and by_spec["config"]["epsilon"] == 1.0
    assert {k: v for k, v in by_spec.items() if k not in timings} == {
        k: v for k, v in by_keywords.items() if k not in timings
    }
    with pytest.raises(InvalidParameterError, match=r"'spec' parameter of run_pmtl"):
        run_pmtl({"rounds": 2})  # type: ignore[arg-type]


def _part_defaults():
    from privmtl.federated.options import RunOptions
    from privmtl.federated.spec import Execution

    return {f.name: f.default for part in (Execution, RunOptions) for f in dataclasses.fields(part)}


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


def test_cli_options_of_the_other_parts_default_to_their_part():
    """The options of ``privmtl pmtl``, ``pmtl-sweep`` and ``flower local`` named like a field of
    :class:`Execution` or :class:`RunOptions` take that field's default (or declare none)."""
    from privmtl.cli import cli

    parts = _part_defaults()
    ctx = click.Context(cli)
    flower = cli.get_command(ctx, "flower")
    assert isinstance(flower, click.Group)
    commands = [
        cli.get_command(ctx, "pmtl"),
        cli.get_command(ctx, "pmtl-sweep"),
        flower.get_command(ctx, "local"),
    ]
    seen = 0
    for cmd in commands:
        assert cmd is not None
        for p in cmd.params:
            if p.name not in parts or p.name == "save_models":  # flower: a folder, not a flag
                continue
            seen += 1
            default, expected = p.default, parts[p.name]
            if _unset(expected) or _unset(default) or (p.is_flag and default is False):
                assert _unset(default) or default is False or default == expected, p.name
                continue
            assert default == expected or default == str(expected), (cmd.name, p.name, default)
    assert seen >= 20


def test_flower_keys_of_the_other_parts_are_their_defaults_encoded():
    from privmtl.flower._core import NONE, RUN_DEFAULTS

    parts = _part_defaults()
    keys = [k for k in RUN_DEFAULTS if k.replace("-", "_") in parts]
    assert len(keys) >= 6
    for key in keys:
        name = key.replace("-", "_")
        if name == "save_models":  # a flag on Flower: each machine saves in its own storage
            assert RUN_DEFAULTS[key] is False
            continue
        expected = NONE if parts[name] is None else parts[name]
        assert RUN_DEFAULTS[key] == expected, key


def _option_name(call: ast.Call) -> str | None:
    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    plain = [f for f in flags if not f.startswith("-")]
    if plain:
        return plain[0]
    long = [f for f in flags if f.startswith("--")]
    return long[0][2:].split("/")[0].replace("-", "_") if long else None


def test_the_cli_writes_no_default_of_a_run_parameter():
    """No ``click.option`` of the run commands spells a run parameter's default as a literal:
    each refers to its part's field (``OPTIONS.model``, ``EXECUTION.threads``, ``SPEC...``)."""
    from privmtl.federated.options import PMTL_PARAMETERS

    literal = []
    for name in ("pmtl.py", "flower.py", "_spec_options.py"):
        tree = ast.parse((SRC / "cli" / name).read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "option"):
                continue
            option = _option_name(node)
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            if option in PMTL_PARAMETERS and isinstance(default, ast.Constant):
                if default.value is not None:
                    literal.append(f"cli/{name}:{node.lineno} {option}={default.value!r}")
    assert literal == []


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
    """Outside the spec and the options (the parts' homes), no module of the family writes a
    setting's default as a literal, nor an execution option's or a run option's default again."""
    parts = _part_defaults()
    twice = []
    for path in FAMILY:
        rel = path.relative_to(SRC).as_posix()
        if rel in ("federated/spec.py", "federated/options.py"):
            continue
        for owner, name, value in _literal_defaults(path):
            if name in parts and (rel, f"{owner}.{name}") not in NOT_A_SETTING:
                if value == parts[name] and not isinstance(value, bool | type(None)):
                    twice.append(f"{rel}:{owner}({name}={value!r})")
                elif isinstance(value, bool) and value is parts[name] and value:
                    twice.append(f"{rel}:{owner}({name}={value!r})")
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


def test_a_target_is_resolved_once_and_only_for_the_mean_release():
    cfg, target = resolve_config(TrainConfig(rounds=5, epsilon=2.0), 30)
    assert target is not None and target.epsilon == 2.0 and target.delta == cfg.delta
    assert cfg.noise_std == 0.0  # the release calibrates σ to the target, not the resolution
    assert cfg.lam == 0.001  # a target makes the run private: the private λ
    again, same = resolve_config(cfg, 30)
    assert again == cfg and same == target  # resolving a resolved config changes nothing
    with pytest.raises(InvalidParameterError, match=r"method='workshop'.*'noise_std'"):
        resolve_config(TrainConfig(method="workshop", ball=1.0, epsilon=2.0), 30)
