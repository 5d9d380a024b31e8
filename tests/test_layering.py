"""Layers import downward only, the CLI defines no experiment, constants have one home."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import privmtl

SRC = Path(privmtl.__file__).parent


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        yield path.relative_to(SRC), ast.parse(path.read_text())


def _imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def test_only_the_cli_imports_the_cli():
    offenders = [
        str(rel)
        for rel, tree in _modules()
        # ``python -m privmtl`` (__main__.py) is the command itself: the top of the layers
        if rel.parts[0] not in ("cli", "__main__.py")
        and any(m.startswith("privmtl.cli") for m in _imports(tree))
    ]
    assert offenders == []


def test_cli_defines_no_experiment():
    runners = [
        f"{rel}:{node.name}"
        for rel, tree in _modules()
        if rel.parts[0] == "cli"
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and node.name.startswith("run_")
        and node.name != "run_cli"
    ]
    assert runners == []


def test_relations_declared_once():
    homes = [
        str(rel)
        for rel, tree in _modules()
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "RELATIONS" for t in node.targets)
    ]
    assert homes == ["privacy/guarantee.py"]


#: The two privacy defaults, and the one module that spells them (the rest import them).
_PRIVACY_DEFAULTS = {"accountant": "rdp", "relation": "add-remove"}
_PRIVACY_DEFAULTS_HOME = Path("privacy/guarantee.py")


def _holder(name):
    """The privacy setting a name holds (``accountant``, ``ACCOUNTANT``, ``DEFAULT_RELATION``,
    the option ``--relation``), or None (``_BRACKET_ACCOUNTANT``, ``ACCOUNTANTS``: other things)."""
    if not isinstance(name, str):
        return None
    n = name.lower().lstrip("-_").removeprefix("default_")
    return n if n in _PRIVACY_DEFAULTS else None


def _carried(node, wanted):
    """Whether ``node`` yields the literal ``wanted`` as a value: a comparison or a tuple, list or
    set of choices only names it."""
    if isinstance(node, ast.Constant):
        return node.value == wanted
    if isinstance(node, ast.Compare | ast.Tuple | ast.List | ast.Set):
        return False
    return any(_carried(child, wanted) for child in ast.iter_child_nodes(node))


def _literal_privacy_defaults(tree):
    """Lines where an ``accountant``/``relation`` takes the string ``"rdp"``/``"add-remove"`` as
    its default or value: a parameter's default, a keyword argument, a variable or constant
    holding it (``ACCOUNTANT = "rdp"``, ``accountant = next(..., "rdp")``), a dict's entry (a
    table of option defaults), a ``.get``/``.pop``/``.setdefault`` fallback, or an option's
    ``default=`` (``click.option("--accountant", default=...)``, ``add_argument``)."""

    def literal(name, value):
        key = _holder(name)
        return key is not None and _carried(value, _PRIVACY_DEFAULTS[key])

    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = list(
                zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True)
            )
            pairs += [
                (arg, d)
                for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
                if d is not None
            ]
            yield from (node.lineno for arg, d in pairs if literal(arg.arg, d))
        elif isinstance(node, ast.keyword) and node.arg and literal(node.arg, node.value):
            yield node.value.lineno
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id if isinstance(t, ast.Name) else getattr(t, "attr", None) for t in targets]
            if any(literal(name, node.value) for name in names):
                yield node.lineno
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and literal(key.value, value):
                    yield value.lineno
        elif isinstance(node, ast.Call):
            args = node.args
            names = [x.value for x in args if isinstance(x, ast.Constant)]
            fallback = isinstance(node.func, ast.Attribute) and node.func.attr in (
                "get", "pop", "setdefault"
            )  # fmt: skip
            if fallback and len(args) == 2 and isinstance(args[0], ast.Constant):
                if literal(args[0].value, args[1]):
                    yield node.lineno
            options = [n for n in names if isinstance(n, str) and n.startswith("--")]
            for kw in node.keywords:
                if kw.arg == "default" and any(literal(o, kw.value) for o in options):
                    yield node.lineno


def test_accountant_and_relation_defaults_have_one_home():
    """``DEFAULT_ACCOUNTANT`` and ``DEFAULT_RELATION`` (privacy/guarantee.py) are the only
    spellings of the two defaults: every signature, spec field, option and call imports them
    (every module of the package is read; the CLI options and Flower's run-config keys are
    generated from the spec, whose fields import them)."""
    found, home = [], []
    for rel, tree in _modules():
        lines = [f"{rel}:{line}" for line in _literal_privacy_defaults(tree)]
        (home if rel == _PRIVACY_DEFAULTS_HOME else found).extend(lines)
    assert found == []
    assert len(home) <= 2, home  # DEFAULT_ACCOUNTANT and DEFAULT_RELATION, at most once each


@pytest.mark.parametrize(
    "code",
    [
        'def f(accountant="rdp"): ...',
        'def f(*, relation="add-remove"): ...',
        'f(accountant="rdp")',
        'ACCOUNTANT = "rdp"',
        'DEFAULT_RELATION: str = "add-remove"',
        'accountant = next((c for c in cs), "rdp")',
        'self.relation = relation or "add-remove"',
        'RUN_DEFAULTS = {"accountant": "rdp"}',
        'opts.get("relation", "add-remove")',
        'click.option("--accountant", type=str, default="rdp")',
    ],
)
def test_a_literal_privacy_default_is_found(code):
    assert list(_literal_privacy_defaults(ast.parse(code))) == [1]


@pytest.mark.parametrize(
    "code",
    [
        'if accountant == "rdp": ...',
        'ACCOUNTANTS = ("rdp", "pld")',
        'click.option("--accountant", type=click.Choice(["rdp", "pld"]))',
        '_BRACKET_ACCOUNTANT = "rdp"',  # a fixed choice, not the default
        'rel = "add-remove"',
        "accountant = DEFAULT_ACCOUNTANT",
    ],
)
def test_a_use_of_the_names_is_no_default(code):
    assert list(_literal_privacy_defaults(ast.parse(code))) == []


def test_cli_and_flower_privacy_defaults_are_the_homes():
    """Every command's ``--accountant``/``--relation`` with a default, and Flower's run-config
    keys, default to the two constants."""
    import click

    from privmtl.cli import cli
    from privmtl.flower._core import RUN_DEFAULTS
    from privmtl.privacy.guarantee import DEFAULT_ACCOUNTANT, DEFAULT_RELATION

    homes = {"accountant": DEFAULT_ACCOUNTANT, "relation": DEFAULT_RELATION}
    ctx = click.Context(cli)

    def commands(cmd, path):
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                yield from commands(cmd.get_command(ctx, name), [*path, name])
        else:
            yield " ".join(path), cmd

    seen = {}
    for path, cmd in commands(cli, []):
        for param in cmd.params:
            if param.name in homes and isinstance(param.default, str):
                seen[f"{path} --{param.name}"] = param.default == homes[param.name]
    assert {"pmtl --accountant", "pmtl --relation", "mpmtl --accountant"} <= set(seen)
    assert {"flower local --accountant", "account --relation"} <= set(seen)
    assert all(seen.values()), seen
    assert {k: RUN_DEFAULTS[k] for k in homes} == homes


def _compared_strings(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_compared_strings(e) for e in node.elts))
    return set()


def test_method_names_are_compared_in_few_places_outside_the_methods_package():
    """A Compare counts when one side is a method name or a ``server_update`` value (a string
    constant or a tuple of them) and the other side's source mentions ``method``,
    ``server_update``, ``spec.name`` or ``message``; the methods package is where they belong."""
    from privmtl.federated.methods import BUILTIN_METHODS
    from privmtl.federated.spec import SERVER_UPDATES

    names = set(BUILTIN_METHODS) | set(SERVER_UPDATES)
    hits = []
    for rel, tree in _modules():
        if rel.parts[:2] == ("federated", "methods"):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            for i, side in enumerate(sides):
                if not _compared_strings(side) & names:
                    continue
                others = " ".join(ast.unparse(s) for j, s in enumerate(sides) if j != i)
                if any(w in others for w in ("method", "server_update", "spec.name", "message")):
                    hits.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
                    break
    assert len(hits) <= 8, hits


def _module_name(rel):
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["privmtl", *parts])


def test_no_import_cycle_in_the_package():
    """Module-level imports between privmtl's modules form no cycle (imports inside functions and
    under ``TYPE_CHECKING`` are not module-level)."""
    modules = {_module_name(rel): tree for rel, tree in _modules()}
    graph: dict[str, set[str]] = {}
    for name, tree in modules.items():
        deps: set[str] = set()
        for node in tree.body:
            found = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            deps.update(m for m in found if m in modules and m != name)
        graph[name] = deps
    state: dict[str, int] = {}
    cycles = []

    def visit(node, path):
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep) :], dep] if dep in path else [node, dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


class _WithoutTypeChecking(ast.NodeTransformer):
    def visit_If(self, node):
        if "TYPE_CHECKING" in ast.unparse(node.test):
            return None
        return self.generic_visit(node)


def _circles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_inside_a_package_counting_deferred_imports():
    """Imports deferred into functions count too (they hide a circle, they do not break it):
    inside a package, no module imports, at any depth, one that imports it back."""
    modules = {_module_name(rel): _WithoutTypeChecking().visit(tree) for rel, tree in _modules()}
    graph: dict[str, set[str]] = {}
    for name, tree in modules.items():
        package = name.split(".")[1] if name.count(".") else name
        deps = set()
        for node in ast.walk(tree):
            found = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            deps.update(
                m for m in found
                if m in modules and m != name and m.split(".")[1:2] == [package]
            )  # fmt: skip
        graph[name] = deps
    assert [sorted(c) for c in _circles(graph)] == []


#: package → (imports of privmtl modules deferred into functions, why they are deferred). The
#: counts may only shrink: a package whose count falls below its entry fails the test until the
#: entry is lowered (or removed at zero). A circle is never a reason.
DEFERRED_IMPORTS: dict[str, tuple[int, str]] = {
    "data": (
        1,
        "privmtl.data's module __getattr__ serves FederatedDataset, load_leaf and "
        "make_synthetic_federated from privmtl.data.federated, torch-backed, when first asked "
        "for: importing any data module runs the package's __init__, and privmtl.data.registry, "
        "the table of data sets the CLI reads at start-up, loads no torch "
        "(tests/data/test_registry.py); the registry names its torch-backed loaders by "
        "'module:function' instead of importing them",
    ),
    "flower": (
        2,
        "privmtl.flower.deploy is the module of `privmtl flower local`'s waiting process "
        "(privmtl.cli.flower_run), which loads neither torch, SciPy nor Flower while the "
        "SuperNodes compute: with --save-models it assembles the models folder "
        "(privmtl.flower.saved: torch) once they stopped; privmtl.flower.node, which it "
        "imports, loads the apps (Flower, an optional dependency, and torch) when its ClientApp "
        "executor starts",
    ),
}


def _deferred_imports(tree):
    """Imports of privmtl modules inside a function (at any depth; not under TYPE_CHECKING)."""
    found = 0

    def visit(node, depth):
        nonlocal found
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if depth and isinstance(node, ast.ImportFrom) and (node.module or "").startswith("privmtl"):
            found += 1
        elif depth and isinstance(node, ast.Import):
            found += any(a.name.startswith("privmtl") for a in node.names)
        inner = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for child in ast.iter_child_nodes(node):
            visit(child, depth + inner)

    visit(tree, 0)
    return found


def test_imports_are_deferred_only_where_a_dependency_or_the_start_up_needs_it():
    """An import deferred into a function hides the layer it crosses; it stays only where an
    optional or heavy dependency would otherwise load early (the allow-list, which may only
    shrink)."""
    counts: dict[str, int] = {}
    for rel, tree in _modules():
        package = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        counts[package] = counts.get(package, 0) + _deferred_imports(tree)
    counts = {k: v for k, v in counts.items() if v}
    assert counts == {k: n for k, (n, _) in DEFERRED_IMPORTS.items()}


def _imported_names(tree):
    """(module, name) of every ``from MODULE import NAME`` and (module, "") of ``import MODULE``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield from ((node.module, a.name) for a in node.names)
        elif isinstance(node, ast.Import):
            yield from ((a.name, "") for a in node.names)


# Nothing is pending: data, models and the result assembly (``privmtl.federated.report``) live
# below ``experiments``. The set may only shrink.
_PENDING_EXPERIMENTS_IMPORTS: set[tuple[str, str, str]] = set()


def test_flower_and_federated_import_nothing_from_experiments():
    found = {
        (str(rel), module, name)
        for rel, tree in _modules()
        if rel.parts[0] in ("flower", "federated")
        for module, name in _imported_names(tree)
        if module == "privmtl.experiments" or module.startswith("privmtl.experiments.")
    }
    assert found <= _PENDING_EXPERIMENTS_IMPORTS, sorted(found - _PENDING_EXPERIMENTS_IMPORTS)


def test_flower_reads_its_data_from_the_registry():
    # the nodes load their clients' data (privmtl.flower.node_data)
    node = ast.parse((SRC / "flower" / "node_data.py").read_text())
    assert ("privmtl.data.registry", "load_federated") in set(_imported_names(node))


def test_data_imports_no_layer_above_it():
    above = ("privmtl.linear", "privmtl.federated", "privmtl.experiments", "privmtl.flower")
    offenders = [
        f"{rel}: {module}"
        for rel, tree in _modules()
        if rel.parts[0] == "data"
        for module in _imports(tree)
        if module.startswith(above)
    ]
    assert offenders == []
