"""privmtl.locking: one writer per directory, re-entrant in a process, stale temporaries removed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from privmtl.exceptions import PrivmtlWarning
from privmtl.locking import LOCK_NAME, DirectoryLock, DirectoryLockedError, hold_directory

HOLD = (
    "import sys, time; from privmtl.locking import DirectoryLock; "
    "DirectoryLock.acquire(sys.argv[1], name='checkpoint_dir'); print('held', flush=True); "
    "time.sleep(60)"
)


def test_another_process_is_refused_naming_the_holder_until_it_ends(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        with pytest.raises(DirectoryLockedError, match=rf"'checkpoint_dir' .*pid {holder.pid}"):
            DirectoryLock.acquire(tmp_path, name="checkpoint_dir")
    finally:
        holder.kill()
        holder.wait()
    with hold_directory(tmp_path, name="checkpoint_dir"):  # the OS released the killed holder's
        assert f"pid {os.getpid()}" in (tmp_path / LOCK_NAME).read_text()


def test_reentrant_in_one_process_and_stale_temporaries_removed(tmp_path):
    (tmp_path / ".state-00000003.pt.x1.tmp").write_bytes(b"torn")
    (tmp_path / "keep.tmp").write_bytes(b"not ours")  # not a write_atomic temporary
    outer = DirectoryLock.acquire(tmp_path, name="save_models")
    assert not (tmp_path / ".state-00000003.pt.x1.tmp").exists()
    assert (tmp_path / "keep.tmp").exists()
    inner = DirectoryLock.acquire(tmp_path, name="save_models")
    inner.release()
    inner.release()  # a second release of one hold is a no-op
    assert tmp_path.resolve() in DirectoryLock._held
    outer.release()
    assert tmp_path.resolve() not in DirectoryLock._held


def test_without_fcntl_import_works_and_locking_warns(tmp_path, monkeypatch):
    code = "import sys; sys.modules['fcntl'] = None; import privmtl.locking as l; " \
        "print(l.locking_supported())"  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)
    assert out.stdout.strip() == b"False"
    import privmtl.locking as locking

    monkeypatch.setattr(locking, "fcntl", None)
    with pytest.warns(PrivmtlWarning, match="not protected against a second process"):
        lock = DirectoryLock.acquire(tmp_path / "d", name="work_dir")
    lock.release()


def test_a_directory_created_for_the_lock_and_left_empty_is_removed(tmp_path):
    new = tmp_path / "ck"
    with hold_directory(new, name="checkpoint_dir"):
        assert (new / LOCK_NAME).exists()
    assert not new.exists()  # a refusal after the lock leaves nothing behind
    with hold_directory(new, name="checkpoint_dir"):
        (new / "state.json").write_text("{}")
    assert sorted(p.name for p in new.iterdir()) == [LOCK_NAME, "state.json"]  # kept: written to
    old = tmp_path / "given"
    old.mkdir()
    with hold_directory(old, name="save_models"):
        pass
    assert old.is_dir()  # the user's own folder stays, even empty


def test_a_cli_run_refused_after_taking_the_lock_leaves_no_folder(tmp_path, capsys):
    from privmtl.cli import main

    ck = tmp_path / "ck"
    args = ["pmtl", "--data", "synthetic", "--num-clients", "10", "--clients-per-round", "50"]
    assert main([*args, "--rounds", "1", "--checkpoint-dir", str(ck)]) == 2
    assert "'clients_per_round'" in capsys.readouterr().err
    assert not ck.exists()
