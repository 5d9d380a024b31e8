"""Flower's private internals live behind privmtl.flower._flwr_compat: the version check, the
fallbacks it takes (with one warning naming the version), and that no other module of
privmtl.flower imports a private Flower module."""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import tomllib

import privmtl

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'privmtl[flower]')")

from privmtl.flower import _flwr_compat, _waits, node
from privmtl.flower.secagg import (
    COLLECT,
    UNMASK,
    SecAggParams,
    SecAggServer,
    dumps,
    loads,
    node_stage,
)

FLOWER = Path(privmtl.__file__).parent / "flower"
PYPROJECT = Path(privmtl.__file__).parents[2] / "pyproject.toml"
#: Flower's documented public API (what privmtl.flower may import outside _flwr_compat)
PUBLIC = {"flwr", "flwr.app", "flwr.clientapp", "flwr.serverapp"}
LOADERS = (_flwr_compat.runtime, _flwr_compat.object_pulls, _flwr_compat.secagg_primitives)


@pytest.fixture
def fresh_compat():
    """Each loader runs again (and may warn again) in the test, and again after it."""
    for loader in LOADERS:
        loader.cache_clear()
    yield
    for loader in LOADERS:
        loader.cache_clear()


def _recorded(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = call()
    return out, [str(w.message) for w in caught]


def test_the_range_is_the_one_pyproject_pins():
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    (pin,) = [r for r in extras["flower"] if r.startswith("flwr")]
    low, high = re.fullmatch(r"flwr>=([\d.]+),<([\d.]+)", pin).groups()
    assert _flwr_compat.FLWR_RANGE == (low, high)


@pytest.mark.parametrize(
    ("version", "inside"),
    [("1.41", True), ("1.42.0", True), ("1.99.3rc1", True), ("1.40.9", False), ("2.0.0", False),
     ("0.9", False), ("dev", False), (None, False)],
)  # fmt: skip
def test_version_check(version, inside):
    assert _flwr_compat.version_supported(version) is inside


def test_the_installed_flower_takes_the_fast_paths_without_a_warning(fresh_compat):
    assert _flwr_compat.version_supported(_flwr_compat.flwr_version())
    (fl, po, sa), messages = _recorded(lambda: tuple(f() for f in LOADERS))
    assert messages == []
    assert fl is not None and po is not None and sa.source == "flwr"
    assert node.supported()


def test_outside_the_range_every_group_falls_back_with_one_warning_each(fresh_compat, monkeypatch):
    from flwr.supercore.inflatable import inflatable_utils as iu

    monkeypatch.setattr(_flwr_compat, "flwr_version", lambda: "2.3.0")
    for fn in (iu.pull_objects, iu.pull_and_inflate_object_from_tree):
        monkeypatch.setattr(fn, "__kwdefaults__", dict(fn.__kwdefaults__))
    before = [
        dict(fn.__kwdefaults__) for fn in (iu.pull_objects, iu.pull_and_inflate_object_from_tree)
    ]

    def everything():
        return (
            node.supported(),
            node.supported(),  # asked twice, warned once
            _flwr_compat.shorten_supernode_polling(0.01),
            _waits.shorten_object_waits(0.01, 0.1),
            _flwr_compat.secagg_primitives().source,
        )

    out, messages = _recorded(everything)
    assert out == (False, False, False, None, "public")
    assert len(messages) == 3  # runtime, object pulls, SecAgg+ primitives
    assert all("flwr 2.3.0" in m and "1.41 <= flwr < 2" in m for m in messages)
    assert any("flower-supernode" in m for m in messages)
    after = [
        dict(fn.__kwdefaults__) for fn in (iu.pull_objects, iu.pull_and_inflate_object_from_tree)
    ]
    assert after == before  # Flower's own waits kept


def test_a_failed_import_inside_the_range_falls_back_naming_the_module(fresh_compat, monkeypatch):
    real = _flwr_compat.importlib.import_module

    def import_module(name, *args):
        if name == "flwr.supercore.runtime":
            raise ImportError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(_flwr_compat.importlib, "import_module", import_module)
    supported, messages = _recorded(node.supported)
    assert supported is False
    (message,) = messages
    assert "flwr.supercore.runtime.RuntimeHttpClient" in message
    assert f"flwr {_flwr_compat.flwr_version()}" in message


def test_the_supernode_outside_the_range_is_plain_flower_supernode(fresh_compat, monkeypatch):
    calls = []

    def execvp(*args):
        calls.append(args)
        raise SystemExit(0)  # stands in for the process image execvp replaces

    monkeypatch.setattr(_flwr_compat, "flwr_version", lambda: "3.0")
    monkeypatch.setattr(node.os, "execvp", execvp)
    monkeypatch.setattr(node, "executor_thread", lambda *a, **k: pytest.fail("no executor"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(SystemExit):
            node.run_supernode(["--insecure"])
    assert calls == [("flower-supernode", ["flower-supernode", "--insecure"])]


def test_the_public_secagg_primitives_interoperate_with_flowers(fresh_compat):
    flwr_side = _flwr_compat.secagg_primitives()
    public = _flwr_compat._public_secagg_primitives()
    assert flwr_side.source == "flwr" and public.source == "public"
    sk_a, pk_a = flwr_side.key_pair()
    sk_b, pk_b = public.key_pair()
    key = flwr_side.shared_key(sk_a, pk_b)
    assert public.shared_key(sk_b, pk_a) == key and len(key) == 44  # urlsafe base64 of 32 bytes
    assert public.decrypt(key, flwr_side.encrypt(key, b"seed share")) == b"seed share"
    assert flwr_side.decrypt(key, public.encrypt(key, b"sk share")) == b"sk share"
    secret = bytes(range(40))
    for make, combine in ((flwr_side, public), (public, flwr_side)):
        shares = make.create_shares(secret, 3, 5)
        assert combine.combine_shares([shares[4], shares[0], shares[2]]) == secret


def test_a_secagg_round_on_the_fallback_primitives_sums_exactly(fresh_compat, monkeypatch):
    monkeypatch.setattr(_flwr_compat, "flwr_version", lambda: "2.0")
    params = SecAggParams(clip=0.5, dim=6, quantization_range=2**12, modulus_range=2**16)
    rng = np.random.default_rng(0)
    vectors = {nid: rng.integers(0, 3 * params.quantization_range, 6) for nid in (1, 2, 3, 4)}
    states: dict[int, dict] = {nid: {} for nid in vectors}

    def exchange(stage, payloads):  # node 3 drops after sharing its keys
        out = {}
        for nid, payload in payloads.items():
            if nid == 3 and stage in (COLLECT, UNMASK):
                continue
            reply, states[nid] = node_stage(
                loads(dumps(payload)), states[nid], nid, lambda n=nid: vectors[n]
            )
            out[nid] = loads(dumps(reply))
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _flwr_compat.secagg_primitives().source == "public"
        res = SecAggServer(params).run(list(vectors), exchange)
    want = sum(v for nid, v in vectors.items() if nid != 3) % params.modulus_range
    assert res.dropped == [3] and np.array_equal(res.total, want)


def _flwr_imports(tree):
    """(line, module) of every import of a flwr module, ``importlib.import_module("flwr...")`` too."""
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            names = [n.module]
        elif isinstance(n, ast.Import):
            names = [a.name for a in n.names]
        elif (
            isinstance(n, ast.Call)
            and getattr(n.func, "attr", getattr(n.func, "id", None)) == "import_module"
            and n.args
            and isinstance(n.args[0], ast.Constant)
        ):
            names = [str(n.args[0].value)]
        else:
            continue
        yield from ((n.lineno, m) for m in names if m == "flwr" or m.startswith("flwr."))


def test_only_flwr_compat_imports_private_flower_modules():
    offenders = [
        f"{path.name}:{line}: {module}"
        for path in sorted(FLOWER.glob("*.py"))
        if path.name != "_flwr_compat.py"
        for line, module in _flwr_imports(ast.parse(path.read_text()))
        if module not in PUBLIC
    ]
    assert offenders == []
    # the check sees every form of import
    probe = "from flwr.proto import x\nimport flwr.cli.install\nimportlib.import_module('flwr.supernode')"
    assert [m for _, m in _flwr_imports(ast.parse(probe))] == [
        "flwr.proto",
        "flwr.cli.install",
        "flwr.supernode",
    ]
    apps = {m for _, m in _flwr_imports(ast.parse((FLOWER / "apps.py").read_text()))}
    assert apps and apps <= PUBLIC
