"""Signatures (privmtl.trust) and when ``build_model`` runs a saved factory's code."""

from __future__ import annotations

import hashlib
import stat
import sys

import pytest

from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.federated.saved import build_model
from privmtl.trust import (
    check_signing_key,
    config_dir,
    folder_file,
    followed_data_path,
    is_signed,
    sign,
    user_key,
)

SOURCE = "from torch import nn\n\ndef make(d, c):\n    return nn.Linear(d, c)\n"


@pytest.fixture
def key_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cfg"
    monkeypatch.setenv("PRIVMTL_CONFIG_DIR", str(folder))
    return folder


def test_config_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("PRIVMTL_CONFIG_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "x"))
    assert config_dir() == tmp_path / "a"
    monkeypatch.delenv("PRIVMTL_CONFIG_DIR")
    assert config_dir() == tmp_path / "x" / "privmtl"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert config_dir() == tmp_path / "home" / ".config" / "privmtl"


def test_the_key_is_made_once_with_mode_0600(key_dir):
    assert user_key(create=False) is None and not key_dir.exists()
    key = user_key()
    assert key is not None and len(key) == 32
    path = key_dir / "signing.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert user_key() == key and sorted(p.name for p in key_dir.iterdir()) == ["signing.key"]


def test_a_signature_covers_every_field_and_only_this_key(key_dir, monkeypatch, tmp_path):
    doc = sign({"b": [1, 2.5, None], "a": {"x": "é"}, "t": (1, 2)})
    assert doc["t"] == [1, 2] and is_signed(doc)
    assert not is_signed({**doc, "a": {"x": "e"}})
    assert not is_signed({**doc, "extra": 1})
    assert not is_signed({k: v for k, v in doc.items() if k != "signature"})
    assert not is_signed({**doc, "signature": "hmac-sha256:" + "0" * 64})
    assert not is_signed([doc])
    monkeypatch.setenv("PRIVMTL_CONFIG_DIR", str(tmp_path / "other"))
    assert not is_signed(doc)  # another user's key
    assert not (tmp_path / "other").exists()  # checking creates no key


@pytest.mark.parametrize("name", ["/etc/passwd", "../x.pt", "a/../../x.pt", "", 3, None])
def test_folder_file_refuses_names_leaving_the_folder(tmp_path, name):
    folder = tmp_path / "m"
    folder.mkdir()
    with pytest.raises(DataFormatError, match=r"files\.global"):
        folder_file(folder, name, where="model.json", key="files.global")


def test_folder_file_refuses_a_link_out_and_accepts_a_plain_name(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (tmp_path / "out.pt").write_bytes(b"x")
    (folder / "link.pt").symlink_to(tmp_path / "out.pt")
    with pytest.raises(DataFormatError):
        folder_file(folder, "link.pt", where="model.json", key="files.global")
    assert folder_file(folder, "g.pt", where="w", key="k") == folder / "g.pt"


def test_a_recorded_data_path_is_followed_only_for_a_signed_folder(tmp_path):
    kw = {"folder": tmp_path, "where": "m.json"}
    assert followed_data_path("/data/x.csv", None, signed=True, **kw) == "/data/x.csv"
    assert followed_data_path("/data/x.csv", "mine.csv", signed=False, **kw) == "mine.csv"
    assert followed_data_path(None, None, signed=False, **kw) is None
    inside = str(tmp_path / "x.csv")
    assert followed_data_path(inside, None, signed=False, **kw) == inside
    with pytest.raises(DataFormatError, match="--data-path"):
        followed_data_path("/data/x.csv", None, signed=False, **kw)


def _meta(record, name="m:make"):
    return {"model": {"name": name, "n_features": 3, "n_classes": 2, "factory": record}}


def _record(source=SOURCE, **kw):
    return {"spec": "m:make", "factory": "make", "module": None, "path": None,
            "source": source,
            "sha256": None if source is None else hashlib.sha256(source.encode()).hexdigest(),
            **kw}  # fmt: skip


def test_build_model_runs_recorded_code_only_when_signed_or_trusted(key_dir, tmp_path):
    marker = tmp_path / "ran"
    source = f"open({str(marker)!r}, 'w').close()\n" + SOURCE
    meta = _meta(_record(source))
    with pytest.raises(DataFormatError, match="did not sign"):
        build_model(meta)
    assert not marker.exists()
    net, _ = build_model(meta, trust_code=True)
    assert marker.exists() and tuple(net.weight.shape) == (2, 3)
    marker.unlink()
    net, _ = build_model(sign(meta))
    assert marker.exists()


def test_build_model_with_the_factory_named_again(key_dir, tmp_path):
    (tmp_path / "m.py").write_text(SOURCE)
    meta = _meta(_record())
    net, _ = build_model(meta, factory=f"{tmp_path / 'm.py'}:make")
    assert tuple(net.weight.shape) == (2, 3)
    (tmp_path / "other.py").write_text(SOURCE + "# other\n")
    with pytest.raises(InvalidParameterError, match="sha256"):
        build_model(meta, factory=f"{tmp_path / 'other.py'}:make")
    with pytest.raises(InvalidParameterError, match="logreg"):
        build_model({"model": {"name": "logreg", "n_features": 3, "n_classes": 2}}, factory="a:b")


def test_an_installed_module_is_imported_from_the_installation_only(key_dir, tmp_path, monkeypatch):
    record = _record(None, spec="torch.nn:Linear", factory="Linear", module="torch.nn")
    with pytest.raises(DataFormatError, match="did not sign"):  # unsigned: nothing imported
        build_model(_meta(record, "torch.nn:Linear"))
    for meta, kw in ((sign(_meta(record, "torch.nn:Linear")), {}),
                     (_meta(record, "torch.nn:Linear"), {"trust_code": True})):  # fmt: skip
        net, _ = build_model(meta, **kw)
        assert tuple(net.weight.shape) == (2, 3)
    # a module of that kind in the working directory is neither imported nor trusted
    marker = tmp_path / "ran"
    (tmp_path / "localmod.py").write_text(f"open({str(marker)!r}, 'w').close()\n" + SOURCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -m privmtl` puts the cwd first
    record = _record(None, spec="localmod:make", module="localmod")
    for meta in (_meta(record, "localmod:make"), sign(_meta(record, "localmod:make"))):
        with pytest.raises(DataFormatError, match="did not sign"):
            build_model(meta, trust_code=True)
    assert not marker.exists() and "localmod" not in sys.modules
    # a built-in function of an installed module is not a factory
    record = _record(None, spec="os:kill", factory="kill", module="os")
    with pytest.raises(DataFormatError, match="did not sign"):
        build_model(_meta(record, "os:kill"), trust_code=True)


def test_a_legacy_factory_name_loads_only_with_trust_code(key_dir, tmp_path, monkeypatch):
    (tmp_path / "m.py").write_text(SOURCE)
    meta = {"model": {"name": f"{tmp_path / 'm.py'}:make", "n_features": 3, "n_classes": 2}}
    for m in (meta, sign(meta)):
        with pytest.raises(DataFormatError, match="did not sign"):
            build_model(m)
    net, notes = build_model(meta, trust_code=True)
    assert tuple(net.weight.shape) == (2, 3) and "no factory source" in notes[0]


@pytest.mark.parametrize(
    "module, factory",
    [("this", "x"), ("venv.__main__", "x"), ("os", "spawnv"), ("privmtl_marker_mod", "make")],
)
def test_an_unsigned_record_imports_no_module_at_all(key_dir, tmp_path, monkeypatch, capsys,
                                                     module, factory):  # fmt: skip
    """An unsigned record naming any module (the standard library's included: importing runs
    it) is refused before anything is imported: no output, no marker file, no new module."""
    marker = tmp_path / "imported"
    site = tmp_path / "site"
    site.mkdir()
    (site / "privmtl_marker_mod.py").write_text(f"open({str(marker)!r}, 'w').close()\n" + SOURCE)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr("privmtl.federated.user_model._installed", lambda path: True)
    monkeypatch.delitem(sys.modules, "this", raising=False)
    monkeypatch.delitem(sys.modules, "venv.__main__", raising=False)
    monkeypatch.setattr("os.spawnv", lambda *a: marker.touch())  # called: the marker appears
    before = module in sys.modules
    spec = f"{module}:{factory}"
    record = _record(None, spec=spec, factory=factory, module=module)
    for meta in (_meta(record, spec), _meta(None, spec), {**_meta(record, spec), "signature": 1}):
        if meta["model"]["factory"] is None:
            del meta["model"]["factory"]
        with pytest.raises(DataFormatError, match="did not sign"):
            build_model(meta)
    assert capsys.readouterr().out == "" and not marker.exists()
    assert (module in sys.modules) == before


def test_a_signed_record_of_an_installed_module_still_imports_from_the_installation(
    key_dir, tmp_path, monkeypatch
):
    """The user's own folder may name a module of the installation (signed): it is imported."""
    marker = tmp_path / "imported"
    site = tmp_path / "site"
    site.mkdir()
    (site / "privmtl_marker_mod2.py").write_text(f"open({str(marker)!r}, 'w').close()\n" + SOURCE)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr("privmtl.federated.user_model._installed", lambda path: True)
    monkeypatch.delitem(sys.modules, "privmtl_marker_mod2", raising=False)
    record = _record(None, spec="privmtl_marker_mod2:make", module="privmtl_marker_mod2")
    net, _ = build_model(sign(_meta(record, "privmtl_marker_mod2:make")))
    assert marker.exists() and tuple(net.weight.shape) == (2, 3)


def test_only_privmtls_models_are_built_without_a_factory(key_dir):
    for name in ("cnn", "logreg"):
        meta = {"model": {"name": name, "n_features": 784, "n_classes": 3}}
        net, _ = build_model(meta)
        assert isinstance(net, __import__("torch").nn.Module)
    with pytest.raises(DataFormatError, match="unknown model 'this'"):
        build_model({"model": {"name": "this", "n_features": 3, "n_classes": 2}})


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o660])
def test_a_key_others_may_read_or_write_is_refused_naming_chmod(key_dir, mode):
    key = user_key()
    path = key_dir / "signing.key"
    path.chmod(mode)
    for call in (lambda: user_key(), check_signing_key, lambda: is_signed(sign({"a": 1}))):
        with pytest.raises(InvalidParameterError, match="chmod 600") as err:
            call()
        assert "\n" not in str(err.value) and str(path) in str(err.value)
    path.chmod(0o600)
    assert user_key() == key


def test_a_key_of_another_owner_or_not_a_file_is_refused(key_dir, tmp_path):
    import os

    user_key()
    path = key_dir / "signing.key"
    if os.getuid() == 0:  # root can give the file away: another user's key
        os.chown(path, 4242, -1)
        with pytest.raises(InvalidParameterError, match="another user"):
            check_signing_key()
    path.unlink()
    path.mkdir()
    with pytest.raises(InvalidParameterError, match="not a regular file"):
        check_signing_key()
    path.rmdir()
    path.write_text("zz\n")
    path.chmod(0o600)
    with pytest.raises(InvalidParameterError, match="32 hex bytes"):
        check_signing_key()


def test_check_signing_key_creates_the_key_or_names_the_folder(key_dir, tmp_path, monkeypatch):
    check_signing_key()
    assert stat.S_IMODE((key_dir / "signing.key").stat().st_mode) == 0o600
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("PRIVMTL_CONFIG_DIR", str(tmp_path / "file" / "privmtl"))
    with pytest.raises(InvalidParameterError, match="cannot create the signing key"):
        check_signing_key()
