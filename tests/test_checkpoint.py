import pytest
import torch

from privmtl.checkpoint import CheckpointError, has_checkpoint, load_checkpoint, save_checkpoint

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
    manifest = (tmp_path / "manifest.json").read_text().replace('"version": 2', '"version": 99')
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
