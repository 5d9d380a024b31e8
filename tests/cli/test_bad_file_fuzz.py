"""Seeded fuzz of the files privmtl reads back: every bad file ends as one line.

A tiny real run (synthetic data, a saved folder and a checkpoint directory) is made once; each case
copies it, damages one file and calls the CLI in-process:

- ``model.json`` of a saved folder (``privmtl evaluate``),
- a ``--config`` file (the run's JSON result, or its ``model.json``),
- a checkpoint's ``manifest.json`` (``--resume`` and ``privmtl ledger DIR``),
- a ledger ``ledger.jsonl`` (``privmtl ledger FILE`` and ``--resume``),
- Flower's ``server/run.json`` (``privmtl flower local --work-dir``).

The damage: truncation, byte flips, NUL and non-UTF-8 bytes, deep nesting, values of the wrong
JSON type, huge and negative counts, sampling rates outside (0, 1], NaN and infinities, long
names, and special files (a FIFO, which must not block the reader, a link to ``/dev/null``, a
directory, a dangling or looping link). Each case must exit 2 with exactly one line
``privmtl: error: ...`` on stderr, no traceback and no new file; or, where the damage is harmless,
reach the work (training, scoring, a Flower launch: stopped there by a stand-in), and then a
changed signed file must not pass as signed. A case's id names the format, the damage and the
seed; its failure message repeats them with the exception.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from privmtl import trust
from privmtl.cli import main

SEEDS = 6  # seeded draws per (format, damage) of the drawn kinds
RUN = ["--data", "synthetic", "--num-clients", "6", "--rounds", "2", "--clients-per-round", "3",
       "--noise-std", "1", "--quiet"]  # fmt: skip

# ----------------------------------------------------------------------------- damage


class Reached(Exception):
    """Raised by the stand-ins of the work that follows reading: the file was accepted."""


def _paths(doc, prefix=()):
    """Every path (tuple of keys/indices) of a parsed JSON document, the root included."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _replace(doc, path, value):
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return doc


def _numbers(doc):
    return [p for p in _paths(doc) if isinstance(_get(doc, p), (int, float))
            and not isinstance(_get(doc, p), bool)]  # fmt: skip


def _get(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def _dumps(doc) -> bytes:
    return json.dumps(doc, indent=1).encode()


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


class Damage:
    """The damages: each takes the file's bytes and a Generator and returns new bytes; JSON
    Lines (a ledger) are damaged on one of their lines for the value-level kinds."""

    @staticmethod
    def truncate(data, rng, lines):
        return data[: int(rng.integers(0, len(data)))]

    @staticmethod
    def flip(data, rng, lines):
        buf = bytearray(data)
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(0, len(buf)))
            buf[i] ^= 1 << int(rng.integers(0, 8))
        return bytes(buf)

    @staticmethod
    def nul(data, rng, lines):
        i = int(rng.integers(0, len(data)))
        return data[:i] + b"\x00" + data[i:]

    @staticmethod
    def non_utf8(data, rng, lines):
        i = int(rng.integers(0, len(data)))
        bad = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80", b"\xfe\xff"][int(rng.integers(0, 5))]
        return data[:i] + bad + data[i + int(rng.integers(0, 2)) :]

    @staticmethod
    def bom(data, rng, lines):
        return b"\xef\xbb\xbf" + data

    @staticmethod
    def deep(data, rng, lines):
        depth = int(rng.choice([1_000, 100_000, 200_000]))
        return _value(data, rng, lines, lambda doc, r: _deep(depth), raw=True)

    @staticmethod
    def wrong_type(data, rng, lines):
        choices = [[], {}, "x", 0, -1, None, True, 1.5, [[]], {"": {}}]

        def pick(doc, r):
            return choices[int(r.integers(0, len(choices)))]

        return _value(data, rng, lines, pick)

    @staticmethod
    def count(data, rng, lines):
        choices = [10**12, 2**63, -1, -(2**63), 0, 10**400, 1e308, -1e-300]

        def pick(doc, r):
            return choices[int(r.integers(0, len(choices)))]

        return _value(data, rng, lines, pick, numbers=True)

    @staticmethod
    def rate(data, rng, lines):
        choices = [7.0, 0.0, -0.5, 1.5, 1e-320, 2.0]

        def pick(doc, r):
            return choices[int(r.integers(0, len(choices)))]

        return _value(data, rng, lines, pick, numbers=True, prefer="sampling_probability")

    @staticmethod
    def nan(data, rng, lines):
        choices = [float("nan"), float("inf"), float("-inf")]

        def pick(doc, r):
            return choices[int(r.integers(0, len(choices)))]

        return _value(data, rng, lines, pick, numbers=True)

    @staticmethod
    def long_string(data, rng, lines):
        n = int(rng.choice([300, 5_000, 1_000_000]))

        def pick(doc, r):
            return "a" * n

        return _value(data, rng, lines, pick, strings=True)

    @staticmethod
    def whole(data, rng, lines):
        return [b"[]", b"0", b'"x"', b"null", b"", b"{}", b"\n\n", b"[{}]", b"true", b"1e999"][
            int(rng.integers(0, 10))
        ]


def _value(data, rng, lines, pick, *, numbers=False, strings=False, prefer=None, raw=False):
    """Replace one value of the JSON document (of one line of a JSON Lines file) by
    ``pick(doc, rng)``; ``raw``: the value is JSON text spliced in as it is."""
    text = data.decode()
    rows = text.splitlines() if lines else [text]
    row = int(rng.integers(0, len(rows)))
    doc = json.loads(rows[row])
    if numbers:
        paths = _numbers(doc)
        if prefer is not None:
            paths = [p for p in paths if p and p[-1] == prefer] or paths
    elif strings:
        paths = [p for p in _paths(doc) if isinstance(_get(doc, p), str)]
    else:
        paths = _paths(doc)
    paths = paths or [()]
    path = paths[int(rng.integers(0, len(paths)))]
    value = pick(doc, rng)
    if raw:
        marker = "__privmtl_fuzz__"
        new = json.dumps(_replace(doc, path, marker)).replace(json.dumps(marker), value)
    else:
        new = json.dumps(_replace(doc, path, value))
    rows[row] = new
    return ("\n".join(rows) + "\n").encode() if lines else new.encode()


DRAWN = [name for name in vars(Damage) if not name.startswith("_")]
SPECIAL = ["fifo", "devnull", "directory", "dangling", "loop", "long_name"]

# ----------------------------------------------------------------------------- the run


@pytest.fixture(scope="module")
def valid_run(tmp_path_factory):
    """A tiny real run: its saved folder, checkpoint directory, JSON result and Flower work
    directory (``server/run.json`` as the ServerApp writes it at the end of a run)."""
    from types import SimpleNamespace

    from privmtl.flower.server_run import ServerRun

    root = tmp_path_factory.mktemp("fuzz-run")
    with contextlib.redirect_stdout(open(root / "result.json", "w")):
        code = main(["pmtl", *RUN, "--save-models", str(root / "models"),
                     "--checkpoint-dir", str(root / "ckpt"), "--json"])  # fmt: skip
    assert code == 0
    (root / "flower" / "server").mkdir(parents=True)
    ServerRun._write_info(
        SimpleNamespace(server_dir=root / "flower" / "server", run_index=0, token="ab12"),  # type: ignore[arg-type]
        finished=True,
    )
    return root


# format (and the command reading it) -> (the file damaged, relative to the run; JSON Lines?)
FORMATS = {
    "model.json": ("models/model.json", False),
    "config": ("result.json", False),
    "config-model.json": ("models/model.json", False),
    "manifest-resume": ("ckpt/manifest.json", False),
    "manifest-ledger": ("ckpt/manifest.json", False),
    "ledger-file": ("ckpt/ledger.jsonl", True),
    "ledger-resume": ("ckpt/ledger.jsonl", True),
    "run.json": ("flower/server/run.json", False),
}


def _command(fmt: str, target: Path, ckpt: Path, work: Path) -> list[str]:
    """The command reading ``target`` (the checkpoint directory ``ckpt``, the Flower work
    directory ``work``)."""
    if fmt == "model.json":
        return ["evaluate", str(target.parent), "--quiet"]
    if fmt in ("config", "config-model.json"):
        return ["pmtl", "--config", str(target), "--quiet"]
    if fmt in ("manifest-resume", "ledger-resume"):
        return ["pmtl", *RUN, "--checkpoint-dir", str(ckpt), "--resume"]
    if fmt == "manifest-ledger":
        return ["ledger", str(ckpt), "--accountant", "rdp", "--quiet"]
    if fmt == "ledger-file":
        return ["ledger", str(target), "--accountant", "rdp", "--quiet"]
    assert fmt == "run.json"
    return ["flower", "local", "--work-dir", str(work), "--data", "synthetic",
            "--num-clients", "6", "--rounds", "2", "--quiet"]  # fmt: skip


def _cases():
    out = []
    for fmt in FORMATS:
        out += [(fmt, damage, seed) for damage in DRAWN for seed in range(SEEDS)]
        out += [(fmt, special, 0) for special in SPECIAL]
    return out


CASES = _cases()


def _stand_ins(monkeypatch, fmt: str) -> None:
    """The work after reading is replaced by :class:`Reached`: scoring, training (for a resumed
    run: once its checkpoint, manifest and ledger are checked), launching Flower."""
    from privmtl.federated.trainer import Trainer

    def reached(*args, **kwargs):
        raise Reached

    original = Trainer._open_checkpoint

    def opened(self, resume):
        original(self, resume)
        raise Reached

    monkeypatch.setattr("privmtl.experiments.pmtl_saved._score_saved", reached)
    if fmt.endswith("-resume"):
        monkeypatch.setattr(Trainer, "_open_checkpoint", opened)
    else:
        monkeypatch.setattr("privmtl.experiments.pmtl._train", reached)
    monkeypatch.setattr("privmtl.flower.launcher.run_local", reached)


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def _special(kind: str, target: Path, tmp: Path) -> Path:
    """Make ``target`` a special file; returns the path the command is given for it (which
    differs only for a long name)."""
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "devnull":
        target.symlink_to("/dev/null")
    elif kind == "directory":
        target.mkdir()
    elif kind == "dangling":
        target.symlink_to(tmp / "nowhere")
    elif kind == "loop":
        target.symlink_to(target)
    return target


def _unblock(fifo: Path, stop: threading.Event, blocked: list[bool]) -> None:
    """After a while, open the FIFO for writing and close it, so that a reader blocked on it
    gets end-of-file and the test fails instead of hanging."""
    if stop.wait(2.0):
        return
    with contextlib.suppress(OSError):
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        blocked.append(True)
        os.close(fd)


@pytest.mark.parametrize(
    ("fmt", "damage", "seed"), CASES, ids=[f"{f}-{d}-{s}" for f, d, s in CASES]
)
def test_a_bad_file_is_one_line(fmt, damage, seed, valid_run, monkeypatch, tmp_path, capsys):
    _stand_ins(monkeypatch, fmt)
    run = tmp_path / "run"
    shutil.copytree(valid_run, run, symlinks=True)
    rel, lines = FORMATS[fmt]
    target = run / rel
    original = target.read_bytes()
    rng = np.random.default_rng(
        [seed, DRAWN.index(damage) if damage in DRAWN else 99, list(FORMATS).index(fmt)]
    )
    where = f"format {fmt}, damage {damage}, seed {seed}"
    if damage in DRAWN:
        try:
            damaged = getattr(Damage, damage)(original, rng, lines)
        except (ValueError, UnicodeDecodeError):  # nothing of that kind in the file
            pytest.skip(f"{where}: nothing to damage")
        target.write_bytes(damaged)
    elif damage == "long_name":  # a name above NAME_MAX, given or recorded
        ckpt, work = run / "ckpt", run / "flower"
        if fmt in ("config", "config-model.json", "ledger-file"):
            target = target.parent / ("x" * 300 + target.suffix)
        elif fmt == "model.json":
            doc = json.loads(original)
            doc["files"]["global"] = "g" * 300 + ".pt"
            target.write_text(json.dumps(doc))
        elif fmt in ("manifest-resume", "manifest-ledger"):
            doc = json.loads(original)
            doc["state_file"] = "s" * 300 + ".pt"
            target.write_text(json.dumps(doc))
        elif fmt == "ledger-resume":
            ckpt = run / ("d" * 300)
        else:
            work = run / ("d" * 300)
    else:
        _special(damage, target, tmp_path)
    if damage != "long_name":
        ckpt, work = run / "ckpt", run / "flower"
    args = _command(fmt, target, ckpt, work)
    before = _files(run)
    stop, blocked = threading.Event(), []
    watchdog = None
    if damage == "fifo":
        watchdog = threading.Thread(target=_unblock, args=(target, stop, blocked), daemon=True)
        watchdog.start()
    try:
        code = main(args)
    except Reached:
        code = "reached"
    except SystemExit as exc:
        code = exc.code
    except Exception as exc:  # any other exception is the failure reported
        pytest.fail(f"{where}: {type(exc).__name__}: {str(exc)[:300]}")
    finally:
        stop.set()
        if watchdog is not None:
            watchdog.join()
    err = capsys.readouterr().err
    assert not blocked, f"{where}: the reader blocked on a FIFO"
    assert "Traceback" not in err, f"{where}: a traceback:\n{err[-2000:]}"
    if code == "reached" or code == 0:
        if damage in DRAWN and fmt in ("model.json", "config-model.json"):
            _not_signed_if_changed(original, target.read_bytes(), where)
        return
    lines_out = err.splitlines()
    assert code == 2, f"{where}: exit code {code!r}; stderr:\n{err[-2000:]}"
    assert len(lines_out) == 1 and lines_out[0].startswith("privmtl: error:"), (
        f"{where}: not one error line:\n{err[-2000:]}"
    )
    assert _files(run) == before, f"{where}: files left: {sorted(_files(run) - before)}"


def _not_signed_if_changed(original: bytes, damaged: bytes, where: str) -> None:
    """A changed signed document must not pass as signed."""
    try:
        doc = json.loads(damaged)
    except ValueError:
        return
    if doc == json.loads(original):
        return
    assert not trust.is_signed(doc), f"{where}: a changed model.json passes as signed"
