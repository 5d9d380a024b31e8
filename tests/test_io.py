"""privmtl.io: append-only run logs survive a torn last line; writable-folder check."""

import json

import pytest

from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.io import append_jsonl, check_writable_dir, load_jsonl, write_json_atomic


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
