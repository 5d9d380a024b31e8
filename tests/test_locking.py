"""privmtl.locking: one writer per directory, re-entrant in a process, stale temporaries removed,
no file but its own touched, a deleted or replaced lock file detected."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import privmtl.locking as locking
from privmtl.exceptions import PrivmtlWarning
from privmtl.locking import (
    LOCK_NAME,
    DirectoryLock,
    DirectoryLockedError,
    check_held,
    hold_directory,
    is_stale_temporary,
)

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
    (tmp_path / ".privmtl-state-00000003.pt.x1.tmp").write_bytes(b"torn")
    (tmp_path / "keep.tmp").write_bytes(b"not ours")  # not a write_atomic temporary
    outer = DirectoryLock.acquire(tmp_path, name="save_models")
    assert not (tmp_path / ".privmtl-state-00000003.pt.x1.tmp").exists()
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


# ------------------------------------------------------------------ only its own file is touched
FOREIGN = {
    ".lock": b"another tool's lock\n",
    ".foo.tmp": b"another tool's temporary",
    ".state-00000003.pt.x1.tmp": b"an old-style name privmtl no longer claims",
    ".privmtl-x": b"no .tmp suffix",
}


def _plant_foreign(directory):
    for name, data in FOREIGN.items():
        (directory / name).write_bytes(data)


def _assert_foreign_intact(directory):
    for name, data in FOREIGN.items():
        assert (directory / name).read_bytes() == data, name


def test_other_tools_files_survive_a_lock_taken_and_released_byte_for_byte(tmp_path):
    _plant_foreign(tmp_path)
    (tmp_path / ".privmtl-model.json.ab12.tmp").write_bytes(b"left by a killed privmtl write")
    with hold_directory(tmp_path, name="checkpoint_dir"):
        _assert_foreign_intact(tmp_path)
        assert not (tmp_path / ".privmtl-model.json.ab12.tmp").exists()  # privmtl's own: removed
    _assert_foreign_intact(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*FOREIGN, LOCK_NAME])
    assert is_stale_temporary(".privmtl-global.pt.k3j9.tmp")
    assert not any(is_stale_temporary(n) for n in [*FOREIGN, ".privmtl-.tmp", LOCK_NAME])


def test_other_tools_files_survive_a_cli_run_refused_after_taking_the_lock(tmp_path, capsys):
    from privmtl.cli import main

    _plant_foreign(tmp_path)
    args = ["pmtl", "--data", "synthetic", "--num-clients", "10", "--clients-per-round", "50"]
    assert main([*args, "--rounds", "1", "--checkpoint-dir", str(tmp_path)]) == 2
    assert "'clients_per_round'" in capsys.readouterr().err
    _assert_foreign_intact(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*FOREIGN, LOCK_NAME])


def test_other_tools_files_survive_a_refused_acquire(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        _plant_foreign(tmp_path)
        held = (tmp_path / LOCK_NAME).read_bytes()
        with pytest.raises(DirectoryLockedError, match=f"pid {holder.pid}"):
            DirectoryLock.acquire(tmp_path, name="checkpoint_dir")
        _assert_foreign_intact(tmp_path)
        assert (tmp_path / LOCK_NAME).read_bytes() == held  # the holder's description kept
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.skipif(not locking.locking_supported(), reason="no fcntl")
def test_a_symbolic_link_at_the_lock_path_is_refused_and_its_target_untouched(tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    for target in (victim, tmp_path / "missing"):  # an existing file, or one it would create
        d = tmp_path / f"d-{target.name}"
        d.mkdir()
        (d / LOCK_NAME).symlink_to(target)
        with pytest.raises(DirectoryLockedError, match="is a symbolic link") as err:
            DirectoryLock.acquire(d, name="checkpoint_dir")
        assert "\n" not in str(err.value)
        assert sorted(p.name for p in d.iterdir()) == [LOCK_NAME] and (d / LOCK_NAME).is_symlink()
    assert victim.read_bytes() == b"precious\n"
    assert not (tmp_path / "missing").exists()
    # the CLI: exit 2, one line, nothing written into the directory or through the link
    from privmtl.cli import main

    d = tmp_path / "d-victim"
    args = ["pmtl", "--data", "synthetic", "--num-clients", "10", "--rounds", "1"]
    assert main([*args, "--checkpoint-dir", str(d)]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and err_lines[0].startswith("privmtl: error: ")
    assert "symbolic link" in err_lines[0]
    assert victim.read_bytes() == b"precious\n"
    assert [p.name for p in d.iterdir()] == [LOCK_NAME]


@pytest.mark.skipif(not locking.locking_supported(), reason="no fcntl")
def test_a_lock_path_that_is_not_a_regular_file_of_its_own_is_refused(tmp_path):
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / LOCK_NAME)  # must not block the open
    with pytest.raises(DirectoryLockedError, match="not a regular file"):
        DirectoryLock.acquire(fifo, name="work_dir")
    folder = tmp_path / "folder"
    (folder / LOCK_NAME).mkdir(parents=True)
    with pytest.raises(DirectoryLockedError, match="not a regular file"):
        DirectoryLock.acquire(folder, name="work_dir")
    linked = tmp_path / "linked"
    linked.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    os.link(victim, linked / LOCK_NAME)  # a hard link: the same file as the victim
    with pytest.raises(DirectoryLockedError, match="2 hard links"):
        DirectoryLock.acquire(linked, name="work_dir")
    assert victim.read_bytes() == b"precious\n"
    assert not DirectoryLock._held


# ------------------------------------------------------------- a deleted or replaced lock file
@pytest.mark.skipif(not locking.locking_supported(), reason="no fcntl")
def test_a_deleted_or_replaced_lock_file_is_detected_by_verify_and_check_held(tmp_path):
    d = tmp_path / "ck"  # created by the run: its release removes it only if left holding its lock
    lock = DirectoryLock.acquire(d, name="checkpoint_dir")
    try:
        lock.verify()
        check_held(d)
        check_held(tmp_path)  # not held: not checked
        (d / LOCK_NAME).unlink()
        message = r"lock file .* was deleted or replaced while this run held it"
        with pytest.raises(DirectoryLockedError, match=message):
            lock.verify()
        with pytest.raises(DirectoryLockedError, match=message):
            check_held(d)
        (d / LOCK_NAME).write_bytes(b"another run's lock\n")  # replaced: a new inode
        with pytest.raises(DirectoryLockedError, match=message):
            check_held(d)
        with pytest.raises(DirectoryLockedError, match=message):  # re-entrant acquire too
            DirectoryLock.acquire(d, name="checkpoint_dir")
    finally:
        lock.release()
    assert (d / LOCK_NAME).read_bytes() == b"another run's lock\n"  # not ours: kept
    lock.verify()  # released: nothing to check


@pytest.mark.skipif(not locking.locking_supported(), reason="no fcntl")
def test_a_run_whose_lock_was_taken_stops_before_its_next_durable_write(tmp_path):
    """Run A holds D; someone deletes the lock file; run B takes a new lock on D: A's next ledger
    record, checkpoint or atomic write is refused (no release recorded twice)."""
    import dp_accounting

    from privmtl.checkpoint import save_checkpoint
    from privmtl.io import append_jsonl, write_atomic
    from privmtl.privacy.ledger import PrivacyLedger

    d = tmp_path / "ck"  # created by the run
    event = dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(1.1))
    second = None
    try:
        with hold_directory(d, name="checkpoint_dir"):
            ledger = PrivacyLedger(delta=1e-5, path=d / "ledger.jsonl")
            ledger.record(event, round=0, release_id="round:0")
            (d / LOCK_NAME).unlink()
            second = subprocess.Popen([sys.executable, "-c", HOLD, str(d)], stdout=subprocess.PIPE)
            assert second.stdout is not None and second.stdout.readline().strip() == b"held"
            before = (d / "ledger.jsonl").read_bytes()
            with pytest.raises(DirectoryLockedError, match="deleted or replaced"):
                ledger.record(event, round=1, release_id="round:1")
            assert (d / "ledger.jsonl").read_bytes() == before
            with pytest.raises(DirectoryLockedError, match="deleted or replaced"):
                save_checkpoint(
                    d, kind="pmtl", config={}, state={"round": 1}, step=1, noise_source="seeded"
                )
            with pytest.raises(DirectoryLockedError, match="deleted or replaced"):
                write_atomic(d / "model.json", b"{}")
            with pytest.raises(DirectoryLockedError, match="deleted or replaced"):
                append_jsonl(d / "runs.jsonl", {"a": 1})
            assert sorted(p.name for p in d.iterdir()) == [LOCK_NAME, "ledger.jsonl"]
            held_by_b = (d / LOCK_NAME).read_bytes()
            assert f"pid {second.pid}".encode() in held_by_b
        # A let go of its hold without deleting B's lock file (nor the folder B writes in)
        assert (d / LOCK_NAME).read_bytes() == held_by_b
        with pytest.raises(DirectoryLockedError, match=f"pid {second.pid}"):
            DirectoryLock.acquire(d, name="checkpoint_dir")
    finally:
        if second is not None:
            second.kill()
            second.wait()


@pytest.mark.skipif(not locking.locking_supported(), reason="no fcntl")
def test_a_lock_file_replaced_between_open_and_flock_is_retried_once_then_refused(
    tmp_path, monkeypatch
):
    real_flock = locking.fcntl.flock
    replaced = []

    def flock_after_replacing(fd, op):  # another process swaps the file in between
        if len(replaced) < limit:
            path = tmp_path / LOCK_NAME
            path.unlink()
            path.write_bytes(b"")
            replaced.append(path)
        return real_flock(fd, op)

    monkeypatch.setattr(locking.fcntl, "flock", flock_after_replacing)
    limit = 1
    with hold_directory(tmp_path, name="checkpoint_dir") as lock:
        assert lock is not None and len(replaced) == 1
        lock.verify()  # the retry holds the file the path names
        assert f"pid {os.getpid()}" in (tmp_path / LOCK_NAME).read_text()
    limit, replaced[:] = 2, []
    with pytest.raises(DirectoryLockedError, match="deleted or replaced while privmtl was taking"):
        DirectoryLock.acquire(tmp_path, name="checkpoint_dir")
    assert not DirectoryLock._held
