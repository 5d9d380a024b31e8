"""privmtl.io: append-only run logs survive a torn last line; writable-folder check; temporaries
carry a name only privmtl writes and the next lock removes those a killed write left."""

import json
import signal
import subprocess
import sys

import pytest

from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.io import (
    append_jsonl,
    atomic_output_dir,
    check_writable_dir,
    load_jsonl,
    write_atomic_with,
    write_json_atomic,
)
from privmtl.locking import LOCK_NAME, hold_directory, is_stale_temporary


def test_torn_last_line_is_dropped_and_appending_continues(tmp_path):
    log = tmp_path / "runs.jsonl"
    append_jsonl(log, {"a": 1})
    append_jsonl(log, {"a": float("nan")})
    with log.open("ab") as fh:
        fh.write(b'{"a": 3, "b"')  # killed mid-write
    assert load_jsonl(log) == [{"a": 1}, {"a": None}]
    append_jsonl(log, {"a": 4})
    assert load_jsonl(log) == [{"a": 1}, {"a": None}, {"a": 4}]


def test_malformed_complete_line_names_the_line(tmp_path):
    log = tmp_path / "runs.jsonl"
    log.write_text('{"a": 1}\nnot json\n')
    with pytest.raises(DataFormatError, match="line 2"):
        load_jsonl(log)


def test_write_json_atomic_round_trip(tmp_path):
    path = tmp_path / "sub" / "x.json"
    write_json_atomic(path, {"x": [1.5, float("inf")]})
    assert json.loads(path.read_text()) == {"x": [1.5, None]}
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]


def test_check_writable_dir(tmp_path):
    assert not check_writable_dir(tmp_path / "new" / "dir", name="out").exists()
    assert check_writable_dir(tmp_path / "new" / "dir", name="out", create=True).is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(InvalidParameterError, match=r"'out'.*file"):
        check_writable_dir(tmp_path / "file", name="out")
    with pytest.raises(InvalidParameterError, match="writable"):
        check_writable_dir(tmp_path / "file" / "sub", name="out")  # unwritable even for root


def test_temporaries_carry_a_name_only_privmtl_writes(tmp_path):
    seen = []

    def write(fh):
        seen.extend(p.name for p in tmp_path.iterdir())
        fh.write(b"data")

    write_atomic_with(tmp_path / "model.json", write)
    assert (
        len(seen) == 1 and seen[0].startswith(".privmtl-model.json.") and seen[0].endswith(".tmp")
    )
    assert is_stale_temporary(seen[0])
    assert [p.name for p in tmp_path.iterdir()] == ["model.json"]
    with pytest.raises(RuntimeError):  # a failed write leaves nothing behind
        write_atomic_with(tmp_path / "other.json", lambda fh: (_ for _ in ()).throw(RuntimeError))
    assert [p.name for p in tmp_path.iterdir()] == ["model.json"]
    with atomic_output_dir(tmp_path / "out") as staging:
        assert staging.name.startswith(".privmtl-out.") and staging.name.endswith(".tmp")
        (staging / "result.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json", "out"]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["result.json"]


def test_the_temporary_of_a_killed_write_is_removed_by_the_next_lock(tmp_path):
    code = (
        "import os, signal, sys; from pathlib import Path; from privmtl.io import write_atomic_with; "
        "write_atomic_with(Path(sys.argv[1]) / 'state.pt', "
        "lambda fh: (fh.write(b'torn'), fh.flush(), os.kill(os.getpid(), signal.SIGKILL)))"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=False)
    assert proc.returncode == -signal.SIGKILL
    (left,) = (p.name for p in tmp_path.iterdir())
    assert left.startswith(".privmtl-state.pt.") and left.endswith(".tmp")
    (tmp_path / ".state.pt.abc.tmp").write_bytes(b"another tool's")  # not privmtl's: kept
    with hold_directory(tmp_path, name="checkpoint_dir"):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".state.pt.abc.tmp", LOCK_NAME])
