import hashlib
import json

import pytest
import torch

from privmtl.checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    has_checkpoint,
    ledger_seen,
    load_checkpoint,
    save_checkpoint,
)

CONFIG = {"method": "pmtl", "rounds": 5, "lam": 0.01}


def _state():
    return {"billboard": {"w": torch.arange(6.0).view(2, 3)}, "round": 3, "rng": [1, 2]}


def test_round_trip(tmp_path):
    assert not has_checkpoint(tmp_path)
    save_checkpoint(
        tmp_path, kind="pmtl", config=CONFIG, state=_state(), step=3, noise_source="seeded"
    )
    assert has_checkpoint(tmp_path)
    state, manifest = load_checkpoint(tmp_path, kind="pmtl", config=dict(CONFIG))
    assert torch.equal(state["billboard"]["w"], _state()["billboard"]["w"])
    assert state["round"] == 3 and manifest["step"] == 3 and manifest["noise_source"] == "seeded"


def test_refuses_another_configuration_naming_the_key(tmp_path):
    save_checkpoint(
        tmp_path, kind="pmtl", config=CONFIG, state=_state(), step=1, noise_source="seeded"
    )
    with pytest.raises(CheckpointError, match=r"lam: 0\.01 \(checkpoint\) vs 0\.1 \(now\)"):
        load_checkpoint(tmp_path, kind="pmtl", config={**CONFIG, "lam": 0.1})
    with pytest.raises(CheckpointError, match="'pmtl' run, not 'mpmtl'"):
        load_checkpoint(tmp_path, kind="mpmtl", config=CONFIG)


def test_refuses_a_corrupt_state_and_another_version(tmp_path):
    save_checkpoint(
        tmp_path, kind="pmtl", config=CONFIG, state=_state(), step=1, noise_source="seeded"
    )
    (state_file,) = tmp_path.glob("state-*.pt")
    data = bytearray(state_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state_file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(tmp_path, kind="pmtl", config=CONFIG)
    save_checkpoint(
        tmp_path, kind="pmtl", config=CONFIG, state=_state(), step=1, noise_source="seeded"
    )
    manifest = (
        (tmp_path / "manifest.json")
        .read_text()
        .replace(f'"version": {FORMAT_VERSION}', '"version": 99')
    )
    (tmp_path / "manifest.json").write_text(manifest)
    with pytest.raises(CheckpointError, match="format version 99"):
        load_checkpoint(tmp_path, kind="pmtl", config=CONFIG)


def test_a_kill_between_state_and_manifest_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    import privmtl.checkpoint as ck

    save_checkpoint(
        tmp_path, kind="pmtl", config=CONFIG, state=_state(), step=1, noise_source="seeded"
    )
    real = ck.write_atomic

    def die_after_state(path, data):
        real(path, data)
        if path.name.startswith("state-"):
            raise KeyboardInterrupt  # stands for a kill after the new state file, before the manifest

    monkeypatch.setattr(ck, "write_atomic", die_after_state)
    new = _state()
    new["round"] = 2
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(
            tmp_path, kind="pmtl", config=CONFIG, state=new, step=2, noise_source="seeded"
        )
    state, manifest = load_checkpoint(tmp_path, kind="pmtl", config=CONFIG)
    assert manifest["step"] == 1 and state["round"] == 3


def _edit_manifest(tmp_path, **changes):
    """Rewrite manifest.json with ``changes``, keeping everything else (its signature too)."""
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest.update(changes)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))


def test_a_consistently_edited_manifest_and_state_are_refused(tmp_path):
    """Another state written with its length and hash into the manifest: not this user's."""
    save_checkpoint(
        tmp_path, kind="pmtl", config=CONFIG, state=_state(), step=3, noise_source="seeded",
        ledger={"releases": 3, "sha256": "a" * 64},
    )  # fmt: skip
    (state_file,) = tmp_path.glob("state-*.pt")
    forged = {**_state(), "round": 1}
    torch.save(forged, state_file)
    _edit_manifest(tmp_path, state_sha256=hashlib.sha256(state_file.read_bytes()).hexdigest())
    with pytest.raises(CheckpointError, match="not signed by this user's key"):
        load_checkpoint(tmp_path, kind="pmtl", config=CONFIG)
    _edit_manifest(tmp_path, signature=None)  # the signature removed
    with pytest.raises(CheckpointError, match="not signed by this user's key"):
        load_checkpoint(tmp_path, kind="pmtl", config=CONFIG)
    with pytest.raises(CheckpointError, match="not signed by this user's key"):
        ledger_seen(tmp_path)


def test_a_ledger_digest_rewritten_in_the_manifest_is_refused(tmp_path):
    save_checkpoint(
        tmp_path, kind="pmtl", config=CONFIG, state=_state(), step=3, noise_source="seeded",
        ledger={"releases": 6, "sha256": "a" * 64},
    )  # fmt: skip
    assert ledger_seen(tmp_path) == {"releases": 6, "sha256": "a" * 64}
    _edit_manifest(tmp_path, ledger={"releases": 2, "sha256": "b" * 64})
    with pytest.raises(CheckpointError, match="not signed"):
        ledger_seen(tmp_path)


def test_a_state_file_outside_the_directory_is_refused(tmp_path):
    d = tmp_path / "ck"
    save_checkpoint(d, kind="pmtl", config=CONFIG, state=_state(), step=3, noise_source="seeded")
    manifest = json.loads((d / "manifest.json").read_text())
    outside = tmp_path / "elsewhere.pt"
    outside.write_bytes((d / manifest["state_file"]).read_bytes())  # its hash matches
    import privmtl.trust as trust

    for name in (str(outside), "../elsewhere.pt"):
        signed = trust.sign({**manifest, "state_file": name})  # even signed: kept in the folder
        (d / "manifest.json").write_text(json.dumps(signed))
        with pytest.raises(CheckpointError, match="must name a file inside"):
            load_checkpoint(d, kind="pmtl", config=CONFIG)


@pytest.mark.parametrize(
    "content",
    [b"[]", b"\xff\xfe{}", b"[" * 200_000 + b"]" * 200_000, b"{}", b'"x"', b"{not json"],
)
def test_an_unreadable_manifest_is_refused_in_one_line(tmp_path, content):
    save_checkpoint(tmp_path, kind="pmtl", config=CONFIG, state=_state(), step=1, noise_source="s")
    (tmp_path / "manifest.json").write_bytes(content)
    for call in (
        lambda: load_checkpoint(tmp_path, kind="pmtl", config=CONFIG),
        lambda: ledger_seen(tmp_path),
    ):
        with pytest.raises(CheckpointError) as info:
            call()
        assert "\n" not in str(info.value) and len(str(info.value)) < 400
