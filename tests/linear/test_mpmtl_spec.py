"""MP-MTL settings have one home: :class:`privmtl.linear.spec.MPMTLSpec`.

Every default of a setting of the family is the spec's, at every entry point: the ``privmtl
mpmtl`` / ``mpmtl-sweep`` options, :func:`run_mpmtl` and :func:`run_mpmtl_sweep`'s keywords and
the estimators' ``__init__`` (None there means "the spec's"); the signatures refer to the spec
instead of restating a value; ``--help`` shows the defaults; the constraint table names the
parameter, the constraint and the value.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import textwrap

import click
import numpy as np
import pytest

from privmtl.cli.mpmtl import mpmtl as mpmtl_command
from privmtl.cli.mpmtl import mpmtl_sweep as mpmtl_sweep_command
from privmtl.exceptions import InvalidParameterError
from privmtl.experiments.mpmtl import run_mpmtl
from privmtl.experiments.mpmtl_sweep import run_mpmtl_sweep
from privmtl.linear.methods import BUILTIN_LINEAR_METHODS
from privmtl.linear.options import MPMTLExecution, MPMTLPrivacy, MPMTLRefit
from privmtl.linear.selection import METHOD_ESTIMATORS, estimator_class
from privmtl.linear.spec import (
    DEFAULT_ITERATIONS,
    SPEC,
    MPMTLSpec,
    default_iterations,
    resolve_defaults,
    spec_constraints,
)

FIELDS = [f.name for f in dataclasses.fields(MPMTLSpec)]

#: Spec settings that an option of ``privmtl mpmtl`` carries under another form: the option, and
#: the spec value its default stands for.
_FLAG_FORMS = {
    "noise_source": ("reproducible_noise", lambda flag: "seeded" if flag else SPEC.noise_source),
}
#: Settings the CLI does not expose (library only), each with the reason.
_NOT_ON_THE_CLI = {"n_splits": "the folds of the pooled search; a library keyword"}
#: Estimator parameters whose None means "the spec's value" (resolved at fit time).
_NONE_MEANS_SPEC = {"accountant", "delta", "epsilon", "budget_epsilon"}


#: What click holds as the default of an option given none (None, or a sentinel in click >= 8.3).
_NO_DEFAULT = click.Option(["--probe"]).default


def _cli_defaults(command: click.Command) -> dict[str, object]:
    ctx = click.Context(command, info_name=command.name)
    out = {}
    for p in command.params:
        if p.name:
            default = p.get_default(ctx)
            out[p.name] = None if default is _NO_DEFAULT else default
    return out


def _signature_defaults(fn) -> dict[str, object]:
    return {
        name: p.default
        for name, p in inspect.signature(fn).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def test_every_setting_reaches_run_mpmtl_with_the_specs_default():
    """run_mpmtl's keywords are the fields of its three parts: a setting's default is the
    spec's own, defined nowhere else."""
    from privmtl.linear.options import MPMTL_PARAMETERS

    assert {n for n, part in MPMTL_PARAMETERS.items() if part is MPMTLSpec} == set(FIELDS)
    assert list(inspect.signature(run_mpmtl).parameters) == ["spec", "settings"]


@pytest.mark.parametrize("command", [mpmtl_command, mpmtl_sweep_command], ids=lambda c: c.name)
def test_cli_option_defaults_are_the_specs(command):
    defaults = _cli_defaults(command)
    checked = 0
    for name in FIELDS:
        if name in _FLAG_FORMS:
            option, meaning = _FLAG_FORMS[name]
            assert meaning(defaults[option]) == getattr(SPEC, name), name
            checked += 1
        elif name in defaults:
            if name == "method":  # privmtl mpmtl asks for it
                assert defaults[name] is None
                assert next(p for p in command.params if p.name == name).required
            else:
                assert defaults[name] == getattr(SPEC, name), name
            checked += 1
        elif command is mpmtl_command:
            assert name in _NOT_ON_THE_CLI, f"privmtl mpmtl has no option for {name!r}"
    assert checked >= 4


def test_sweep_keyword_defaults_are_the_specs():
    defaults = _signature_defaults(run_mpmtl_sweep)
    shared = [n for n in FIELDS if n in defaults]
    assert {"noise", "iterations", "n_splits", "final_step", "noise_source"} <= set(shared)
    for name in shared:
        if defaults[name] is not inspect.Parameter.empty:  # noise: the sweep asks for it
            assert defaults[name] == getattr(SPEC, name), name


@pytest.mark.parametrize("method", list(METHOD_ESTIMATORS))
def test_estimator_defaults_are_the_specs(method):
    """Every estimator parameter named like a setting defaults to the spec's value (or None,
    meaning the spec's); ``iterations`` to the method's (``default_iterations``)."""
    params = inspect.signature(estimator_class(method).__init__).parameters
    for name in set(FIELDS) & set(params):
        default = params[name].default
        if name == "iterations":
            assert default == default_iterations(method), method
        elif default is None and name in _NONE_MEANS_SPEC:
            continue
        else:
            assert default == getattr(SPEC, name), (method, name)
    if "iterations" in params:
        assert method in DEFAULT_ITERATIONS
    # the settings the estimator takes in a grouped parameter (privacy, refit, execution)
    for group in getattr(estimator_class(method), "_param_groups", {}).values():
        for field in dataclasses.fields(group):
            if field.name not in FIELDS or (
                field.default is None and field.name in _NONE_MEANS_SPEC
            ):
                continue
            assert field.default == getattr(SPEC, field.name), (method, group.__name__, field.name)


def _default_sources(fn) -> dict[str, str]:
    """The source text of every keyword default of ``fn`` (``def`` unwrapped, decorators too)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(fn))))
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    return {
        a.arg: ast.unparse(d)
        for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)
        if d is not None
    }


def _functions():
    yield "run_mpmtl", run_mpmtl
    yield "run_mpmtl_sweep", run_mpmtl_sweep
    for module, name in sorted(set(METHOD_ESTIMATORS.values())):
        cls = getattr(importlib.import_module(module), name)
        if "__init__" in vars(cls):
            yield name, cls.__init__


@pytest.mark.parametrize(("where", "fn"), [pytest.param(w, f, id=w) for w, f in _functions()])
def test_signatures_refer_to_the_spec_instead_of_restating_a_value(where, fn):
    """A setting's default is written ``SPEC.<name>`` (or the method's
    declared ``default_iterations``), never a literal copy; a literal None is allowed where None
    means "the spec's" or the spec's default is None itself."""
    for name, source in _default_sources(fn).items():
        if name not in FIELDS:
            continue
        if source == "None" and (name in _NONE_MEANS_SPEC or getattr(SPEC, name) is None):
            continue
        allowed = {f"SPEC.{name}"} | (
            {f"{c.__name__}.default_iterations" for c in BUILTIN_LINEAR_METHODS.values()}
            if name == "iterations"
            else set()
        )
        assert source.replace('"', "'") in allowed, f"{where}: {name} = {source}"


@pytest.mark.parametrize("group", [MPMTLPrivacy, MPMTLRefit, MPMTLExecution])
def test_the_groups_refer_to_the_spec_instead_of_restating_a_value(group):
    """The grouped parameters' fields named like a setting default to ``SPEC.<name>`` (or None
    where None means the spec's), never a literal copy."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(group)))
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))
    checked = 0
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        name, source = stmt.target.id, ast.unparse(stmt.value) if stmt.value else ""
        if name not in FIELDS or (source == "None" and name in _NONE_MEANS_SPEC):
            continue
        assert source == f"SPEC.{name}", f"{group.__name__}: {name} = {source}"
        checked += 1
    assert checked >= 1


def _help_records(command: click.Command) -> tuple[str, dict[str, str]]:
    ctx = click.Context(command, info_name=command.name)
    text = " ".join(command.get_help(ctx).split())
    records = {}
    for p in command.params:
        record = p.get_help_record(ctx)
        if record is not None and p.name:
            records[p.name] = " ".join(record[1].split())
    return text, records


def test_mpmtl_help_shows_the_specs_defaults(capsys):
    from privmtl.cli import main

    assert main(["mpmtl", "--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    _, records = _help_records(mpmtl_command)
    for name in FIELDS:
        value = getattr(SPEC, name)
        if name == "method":  # privmtl mpmtl asks for it
            assert "[required]" in records[name]
            continue
        if name not in records or value is None:
            continue
        assert f"[default: {value}" in records[name], name
        assert records[name] in shown, name
    # the defaults that are not a single value, and the flag form of the noise source
    for method, t in DEFAULT_ITERATIONS.items():
        assert f"{t} for {method}" in records["iterations"]
    assert "min(1e-5, 1/(100·m))" in records["delta"]
    assert "secure" in records["reproducible_noise"]


# ---------------------------------------------------------------- the spec itself
@pytest.mark.parametrize(
    ("changes", "name", "shown"),
    [
        ({"epsilon": -1.0}, "epsilon", "-1.0"),
        ({"delta": 1.5}, "delta", "1.5"),
        ({"delta": "papers"}, "delta", "'papers'"),
        ({"iterations": 0}, "iterations", "0"),
        ({"noise": "laplace"}, "noise", "'laplace'"),
        ({"method": "nope"}, "method", "'nope'"),
        ({"tune": "always"}, "tune", "'always'"),
        ({"accountant": "prv"}, "accountant", "'prv'"),
        ({"checkpoint_every": 0}, "checkpoint_every", "0"),
        ({"seed": -1}, "seed", "-1"),
        ({"n_splits": 1}, "n_splits", "1"),
    ],
)
def test_bad_settings_name_parameter_constraint_and_value(changes, name, shown):
    with pytest.raises(InvalidParameterError) as err:
        MPMTLSpec(**changes)
    message = str(err.value)
    assert f"The '{name}' parameter must be" in message and message.endswith(f"got {shown}.")


def test_epsilon_is_for_the_private_methods_only():
    with pytest.raises(InvalidParameterError, match=r"'epsilon'.*stl-l2"):
        MPMTLSpec(method="stl-l2", epsilon=1.0)
    assert MPMTLSpec(method="dp-aggr", epsilon=1.0).private
    assert not SPEC.private


def test_resolve_defaults_fills_in_delta_from_the_number_of_tasks():
    m = 139
    assert resolve_defaults(SPEC, m).delta == pytest.approx(min(1e-5, 1 / (100 * m)))
    assert resolve_defaults(SPEC.replace(delta="paper"), m).delta == pytest.approx(
        1 / (m * np.log(m))
    )
    assert resolve_defaults(SPEC.replace(delta=1e-6), m).delta == 1e-6
    # the only change is delta; iterations stays the method's to choose
    assert resolve_defaults(SPEC, m).replace(delta=None) == SPEC
    with pytest.raises(InvalidParameterError, match=r"'delta'.*2 tasks"):
        resolve_defaults(SPEC.replace(delta="paper"), 1)


def test_to_dict_round_trips():
    spec = MPMTLSpec(method="groupsparse", epsilon=2, delta="paper", iterations=3, seed=4)
    assert MPMTLSpec(**spec.to_dict()) == spec
    assert spec.to_dict()["epsilon"] == 2.0 and isinstance(spec.epsilon, float)


def test_estimators_check_shared_settings_with_the_specs_constraints():
    from privmtl.linear.dp_baselines import DPMTRL
    from privmtl.linear.mpmtl import MPMTLLowRank, MPMTLLowRankSparse

    for cls in (MPMTLLowRank, MPMTLLowRankSparse):
        for name in ("epsilon", "delta", "noise", "noise_source"):
            assert cls._parameter_constraints[name] == MPMTLSpec._parameter_constraints[name]
    # the grouped settings: their group declares the spec's constraint
    for group, name in (
        (MPMTLPrivacy, "relation"),
        (MPMTLPrivacy, "budget_epsilon"),
        (MPMTLRefit, "eigen_floor"),
        (MPMTLRefit, "refit_power"),
        (MPMTLExecution, "checkpoint_every"),
    ):
        assert group._parameter_constraints[name] == MPMTLSpec._parameter_constraints[name]
    assert (
        DPMTRL._parameter_constraints["iterations"]
        == spec_constraints("iterations", required=("iterations",))["iterations"]
    )
    rng = np.random.default_rng(0)
    Xs = [rng.standard_normal((12, 3)) for _ in range(4)]
    ys = [x @ np.ones(3) for x in Xs]
    with pytest.raises(InvalidParameterError, match=r"'accountant'.*got 'prv'"):
        MPMTLLowRank(privacy=MPMTLPrivacy(accountant="prv")).fit(Xs, ys)
    # accountant=None is the spec's accountant
    est = MPMTLLowRank(epsilon=1.0, noise_source="seeded", random_state=0).fit(Xs, ys)
    assert est.privacy_.accountant == SPEC.accountant
