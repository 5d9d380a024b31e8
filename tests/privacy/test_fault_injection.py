"""Kill points × ledger damage × a second writer: no command reports an ε below the releases made.

Every scenario runs the real command line on a small synthetic logistic-regression run. The
oracle ε is computed independently of privmtl's ledger, from the number of releases that
actually happened, the run's noise multiplier and rate, and dp-accounting's RDP accountant.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from dp_accounting import dp_event as dpe
from engine_defaults import old_config

from privmtl.checkpoint import CheckpointError
from privmtl.cli import main
from privmtl.privacy.accounting import make_accountant

FAULT = Path(__file__).with_name("fault_run.py")
ROUNDS = 5
PMTL = ["pmtl", "--data", "synthetic", "--num-clients", "6", "--model", "logreg",
        "--rounds", str(ROUNDS), "--epsilon", "2", "--finetune", "none", "--quiet",
        "--json"]  # fmt: skip
MPMTL = ["mpmtl", "--data", "synthetic-lowrank", "--method", "lowrank", "--epsilon", "2",
         "--iterations", "4", "--tune", "none", "--quiet", "--json"]  # fmt: skip


def oracle(n_releases: int, z: float, rate: float, delta: float) -> float:
    """ε of ``n_releases`` Gaussian releases of noise multiplier ``z`` (Poisson-sampled at
    ``rate`` when below 1), composed by the run's accountant (RDP, add-remove), not by a ledger."""
    if n_releases == 0:
        return 0.0
    event: dpe.DpEvent = dpe.GaussianDpEvent(z)
    if rate < 1.0:
        event = dpe.PoissonSampledDpEvent(rate, event)
    acc = make_accountant("rdp", "add-remove")
    acc.compose(dpe.SelfComposedDpEvent(event, n_releases))
    return float(acc.get_epsilon(delta))


def _cli(capsys, args):
    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _ok(capsys, args):
    code, out, err = _cli(capsys, args)
    assert code == 0, err
    return json.loads(out)


def _refused(capsys, args, *words):
    code, out, err = _cli(capsys, args)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("privmtl: error: "), err
    assert "Traceback" not in err and out == ""
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def _fault(point, k, args, *, wait=True):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(FAULT), point, str(k), *args]
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    return subprocess.run(cmd, capture_output=True, timeout=300, env=env)


def _ledger_lines(d):
    return (Path(d) / "ledger.jsonl").read_bytes().splitlines(keepends=True)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A seeded run checkpointed every round, run to the end, and its JSON result."""
    d = tmp_path_factory.mktemp("finished") / "ckpt"
    code = main([*PMTL, "--reproducible-noise", "--checkpoint-dir", str(d)])
    assert code == 0
    return d


def _copy(src, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".privmtl.lock"))
    return dst


def _expected(out, n):
    g = out["guarantee"]
    return oracle(n, out["noise_multiplier"], g["details"]["rate"], out["delta"])


# ----------------------------------------------------------------------------- ledger damage
def _delete(lines):
    return None


def _empty(lines):
    return b""


def _truncate_mid_line(lines, k=3):  # cut inside release k's line (the header is line 0)
    return b"".join(lines[: k + 1]) + lines[k + 1][: len(lines[k + 1]) // 2]


def _remove_line(lines, k=2):
    return b"".join(lines[: k + 1] + lines[k + 2 :])


def _remove_last(lines):  # the last release (the closing line after it stays)
    return b"".join(lines[:-2] + lines[-1:])


def _duplicate_line(lines, k=2):
    return b"".join(lines[: k + 2] + lines[k + 1 :])


def _scale_noise(lines):
    out = [lines[0]]
    for line in lines[1:]:
        rec = json.loads(line)
        if "event" in rec:  # not the closing line
            rec["event"]["noise_multiplier"] *= 10
        out.append((json.dumps(rec, sort_keys=True) + "\n").encode())
    return b"".join(out)


def _scale_noise_and_epsilon(lines):
    """A consistent forgery: every event and every stated ε rewritten to a smaller ε."""
    from privmtl.privacy.accounting import event_from_dict
    from privmtl.privacy.ledger import PrivacyLedger

    header = json.loads(lines[0])
    led = PrivacyLedger(delta=header["delta"], accountant=header["accountant"])
    out = [lines[0]]
    for line in lines[1:]:
        rec = json.loads(line)
        if "event" in rec:  # a release
            rec["event"]["noise_multiplier"] *= 10
        rec["epsilon"] = (
            led.record(event_from_dict(rec["event"])) if "event" in rec else led.epsilon()
        )
        out.append((json.dumps(rec, sort_keys=True) + "\n").encode())
    return b"".join(out)


DAMAGE = {
    "deleted": _delete,
    "emptied": _empty,
    "truncated-mid-line": _truncate_mid_line,
    "line-removed": _remove_line,
    "last-line-removed": _remove_last,
    "line-duplicated": _duplicate_line,
    "noise-multiplier-edited": _scale_noise,
    "consistent-forgery": _scale_noise_and_epsilon,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_ledger_refused_by_resume_and_by_privmtl_ledger(capsys, tmp_path, finished, damage):
    d = _copy(finished, tmp_path)
    new = DAMAGE[damage](_ledger_lines(d))
    if new is None:
        (d / "ledger.jsonl").unlink()
    else:
        (d / "ledger.jsonl").write_bytes(new)
    line = _refused(capsys, [*PMTL, "--reproducible-noise", "--checkpoint-dir", str(d), "--resume"])
    assert "ledger" in line
    if damage == "deleted":
        assert not (d / "ledger.jsonl").exists()  # refused before anything was written
        assert main(["ledger", str(d)]) == 2
    else:
        _refused(capsys, ["ledger", str(d), "--json"], "ledger")
        _refused(capsys, ["ledger", str(d / "ledger.jsonl")], "ledger")


def test_privmtl_ledger_recomputes_a_lone_file(capsys, tmp_path, finished):
    """Without a checkpoint beside it, an edited event or a line without one is still refused."""
    lines = _ledger_lines(finished)
    led = tmp_path / "ledger.jsonl"
    led.write_bytes(_scale_noise(lines))
    _refused(capsys, ["ledger", str(led)], "epsilon", "altered")
    rec = json.loads(lines[1])
    del rec["event"]
    led.write_bytes(lines[0] + (json.dumps(rec) + "\n").encode())
    _refused(capsys, ["ledger", str(led)], "no 'event'")
    led.write_bytes(lines[0] + b"[1, 2]\n")
    _refused(capsys, ["ledger", str(led)], "line 2")
    led.write_bytes(lines[0] + b"{not json\n" + lines[1])
    _refused(capsys, ["ledger", str(led)], "line 2")
    led.write_bytes(b"".join(lines))
    out = _ok(capsys, ["ledger", str(led), "--json"])
    assert out["releases"] == ROUNDS


def test_a_manifest_without_its_ledger_digest_is_refused(capsys, tmp_path, finished):
    """A manifest of this user's (signed) without the digest of its ledger."""
    from privmtl.trust import sign

    d = _copy(finished, tmp_path)
    manifest = json.loads((d / "manifest.json").read_text())
    for edit in (None, {"releases": 0, "sha256": None}):  # dropped, or set to 'saw nothing'
        manifest["ledger"] = edit
        (d / "manifest.json").write_text(json.dumps(sign(manifest)))
        args = [*PMTL, "--reproducible-noise", "--checkpoint-dir", str(d), "--resume"]
        if edit is None:
            _refused(capsys, args, "records no ledger digest")
            _refused(capsys, ["ledger", str(d)], "records no ledger digest")
        else:  # the ledger holds more than the checkpoint saw: its ε is still all of them
            out = _ok(capsys, args)
            assert out["epsilon"] >= _expected(out, ROUNDS) * (1 - 1e-9)


def test_undamaged_ledger_resumes_to_the_oracle(capsys, tmp_path, finished):
    d = _copy(finished, tmp_path)
    out = _ok(capsys, [*PMTL, "--reproducible-noise", "--checkpoint-dir", str(d), "--resume"])
    assert out["epsilon"] == pytest.approx(_expected(out, ROUNDS), rel=1e-6)
    assert out["guarantee"]["details"]["releases"] == ROUNDS
    assert _ok(capsys, ["ledger", str(d), "--json"])["releases"] == ROUNDS


# ----------------------------------------------------------------------------- kill points
@pytest.mark.parametrize(
    ("point", "noise", "made"),
    [
        # seeded: the repeated release is the recorded one (not charged twice)
        ("mid-append", "--reproducible-noise", ROUNDS),
        # secure: the release recorded before the kill and its fresh repeat are both charged
        ("recorded", "--secure-noise", ROUNDS + 1),
        ("checkpointed", "--secure-noise", ROUNDS),
    ],
)
def test_killed_run_resumes_without_lowering_epsilon(capsys, tmp_path, point, noise, made):
    d = tmp_path / "ckpt"
    k = 2
    args = [*PMTL, noise, "--checkpoint-dir", str(d)]
    proc = _fault(point, k, args)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    if point == "mid-append":
        assert not (d / "ledger.jsonl").read_bytes().endswith(b"\n")  # the torn last line
    (d / ".privmtl-manifest.json.x.tmp").write_bytes(b"left by a killed write")
    out = _ok(capsys, [*args, "--resume", "--save-models", str(tmp_path / "m")])
    assert not (d / ".privmtl-manifest.json.x.tmp").exists()  # removed under the lock
    expected = _expected(out, made)
    assert out["epsilon"] >= expected * (1 - 1e-9)
    assert out["epsilon"] == pytest.approx(expected, rel=1e-6)
    details = out["guarantee"]["details"]
    assert details["releases"] == made and details["rounds_run"] == ROUNDS
    assert (made != ROUNDS) == any("releases for" in n for n in out["guarantee"]["notes"])
    led = _ok(capsys, ["ledger", str(d), "--json"])
    assert led["releases"] == made and led["epsilon"] == pytest.approx(out["epsilon"], rel=1e-9)
    if point == "checkpointed":  # privmtl evaluate checks the ledger the saved models name
        assert _ok(capsys, ["evaluate", str(tmp_path / "m"), "--json"])["ledger_checked"]
        lines = _ledger_lines(d)
        (d / "ledger.jsonl").write_bytes(_scale_noise_and_epsilon(lines))
        _refused(capsys, ["evaluate", str(tmp_path / "m"), "--json"], "SHA-256")
        (d / "ledger.jsonl").unlink()  # no ledger at hand: nothing to check, and it says so
        assert not _ok(capsys, ["evaluate", str(tmp_path / "m"), "--json"])["ledger_checked"]


def test_mpmtl_resume_refuses_a_cut_or_emptied_ledger(capsys, tmp_path):
    d = tmp_path / "ckpt"
    args = [*MPMTL, "--reproducible-noise", "--checkpoint-dir", str(d)]
    full = _ok(capsys, [*args, "--save-models", str(tmp_path / "m")])
    assert full["guarantee"]["details"]["releases"] == 4
    assert _ok(capsys, ["evaluate", str(tmp_path / "m"), "--json"])["ledger_checked"]
    lines = _ledger_lines(d)
    (d / "ledger.jsonl").write_bytes(b"".join(lines[:-2]))  # the last release and closing line
    _refused(capsys, ["evaluate", str(tmp_path / "m")], "holds 3 releases", "saw 4")
    _refused(capsys, [*args, "--resume"], "holds 3 releases", "saw 4")
    (d / "ledger.jsonl").write_bytes(b"")
    _refused(capsys, [*args, "--resume"], "missing or empty")
    (d / "ledger.jsonl").write_bytes(b"".join(lines))
    again = _ok(capsys, [*args, "--resume"])
    assert again["epsilon"] == pytest.approx(full["epsilon"], rel=1e-12)


# ----------------------------------------------------------------------------- second writer
def test_a_second_writer_is_refused_naming_the_holder(capsys, tmp_path):
    d = tmp_path / "ckpt"
    args = [*PMTL, "--reproducible-noise", "--checkpoint-dir", str(d)]
    holder = _fault("hold", 1, args, wait=False)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == b"HOLDING", holder.stderr.read().decode()
        before = (d / "ledger.jsonl").read_bytes()
        line = _refused(capsys, [*args, "--resume"], "in use by another privmtl process")
        assert f"pid {holder.pid}" in line
        _refused(capsys, args, f"pid {holder.pid}")  # a fresh run into the same directory
        _refused(capsys, [*MPMTL, "--checkpoint-dir", str(d)], f"pid {holder.pid}")
        assert (d / "ledger.jsonl").read_bytes() == before  # nothing appended by the refused
    finally:
        holder.kill()
        holder.wait()
    # the OS released the killed holder's lock: the directory resumes, ε of the 5 releases
    out = _ok(capsys, [*args, "--resume"])
    assert out["epsilon"] == pytest.approx(_expected(out, ROUNDS), rel=1e-6)


def test_save_models_folder_is_locked_and_stale_temporaries_do_not_count(capsys, tmp_path):
    from privmtl.locking import hold_directory

    m = tmp_path / "models"
    m.mkdir()
    (m / ".privmtl-global.pt.abc.tmp").write_bytes(b"partial")
    holder = subprocess.Popen(
        [sys.executable, "-c", "from privmtl.locking import DirectoryLock as L; import time; "
         f"L.acquire({str(m)!r}, name='save_models'); print('ok', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"ok"
        _refused(capsys, [*MPMTL, "--save-models", str(m)], "save_models", f"pid {holder.pid}")
    finally:
        holder.kill()
        holder.wait()
    out = _ok(capsys, [*MPMTL, "--save-models", str(m)])  # the lock and the .tmp are not models
    assert out["models_dir"] and not (m / ".privmtl-global.pt.abc.tmp").exists()
    with hold_directory(m, name="save_models"):  # re-entrant within one process
        with hold_directory(m, name="save_models"):
            pass


# ----------------------------------------------------------------------------- data by content
def test_resume_refuses_other_data_with_the_same_ids_and_row_counts(tmp_path):
    from privmtl.data.federated import make_synthetic_federated
    from privmtl.federated.models import MultinomialLogReg
    from privmtl.federated.protocol import Trainer

    ds = make_synthetic_federated(n_clients=4, random_state=0)
    cfg = old_config(rounds=2, noise_std=0.5, clients_per_round=2, progress=False)
    net = MultinomialLogReg(ds.n_features, ds.n_classes, random_state=0)
    Trainer(ds, net, cfg, noise_source="seeded", checkpoint_dir=tmp_path).run()
    other = make_synthetic_federated(n_clients=4, random_state=0)
    other.train_x[1] = other.train_x[1] + torch.from_numpy(
        np.full(tuple(other.train_x[1].shape), 1e-3, dtype=np.float32)
    )
    assert other.client_ids == ds.client_ids
    assert list(other.sizes("train")) == list(ds.sizes("train"))
    with pytest.raises(CheckpointError, match="data_sha256"):
        Trainer(other, net, cfg, noise_source="seeded", checkpoint_dir=tmp_path, resume=True)
    Trainer(ds, net, cfg, noise_source="seeded", checkpoint_dir=tmp_path, resume=True)


# ----------------------------------------------------------------------------- forged directories
def _resign_free_manifest(d, **changes):
    """The manifest rewritten as a forger would: ``changes`` applied, everything else kept."""
    manifest = json.loads((d / "manifest.json").read_text())
    manifest.update(changes)
    (d / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))


def _digest(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def test_a_cut_ledger_with_a_consistent_manifest_is_refused(capsys, tmp_path, finished):
    """The ledger cut to 2 releases and the cut file's digest written into the manifest."""
    d = _copy(finished, tmp_path)
    cut = b"".join(_ledger_lines(d)[:3])
    (d / "ledger.jsonl").write_bytes(cut)
    _resign_free_manifest(d, ledger={"releases": 2, "sha256": _digest(cut)})
    resume = [*PMTL, "--reproducible-noise", "--checkpoint-dir", str(d), "--resume"]
    _refused(capsys, resume, "manifest", "not signed")
    _refused(capsys, ["ledger", str(d)], "manifest", "not signed")
    (d / "manifest.json").unlink()  # the ledger alone: its ε is that of 2 releases, as a bound
    code, out, _ = _cli(capsys, ["ledger", str(d)])
    assert code == 0 and "incomplete: no closing line" in out and "at least 2 releases" in out


def test_a_forged_ledger_and_state_with_a_consistent_manifest_are_refused(
    capsys, tmp_path, finished
):
    """σ ×10 with every stated ε recomputed, and the state file edited, each with the manifest
    rewritten to match: refused by --resume and by privmtl ledger, with or without a manifest."""
    d = _copy(finished, tmp_path)
    truth = _ok(capsys, ["ledger", str(d), "--json"])["epsilon"]
    forged = _scale_noise_and_epsilon(_ledger_lines(d))
    (d / "ledger.jsonl").write_bytes(forged)
    n = ROUNDS
    body = b"".join(forged.splitlines(keepends=True)[: n + 1])
    _resign_free_manifest(d, ledger={"releases": n, "sha256": _digest(body)})
    resume = [*PMTL, "--reproducible-noise", "--checkpoint-dir", str(d), "--resume"]
    _refused(capsys, resume, "not signed")
    _refused(capsys, ["ledger", str(d)], "not signed")
    (d / "manifest.json").unlink()
    _refused(capsys, ["ledger", str(d)], "not authenticated", "line 2")
    _refused(capsys, ["ledger", str(d / "ledger.jsonl"), "--json"], "not authenticated")
    # read anyway on request: labelled, never silently
    code, out, _ = _cli(capsys, ["ledger", str(d), "--unauthenticated"])
    assert code == 0 and "not authenticated: line 2" in out
    assert _ok(capsys, ["ledger", str(d), "--unauthenticated", "--json"])["epsilon"] < truth

    d = _copy(finished, tmp_path / "state")
    (state_file,) = d.glob("state-*.pt")
    state = torch.load(state_file, weights_only=True)
    torch.save(state, state_file)  # rewritten: another file with the same content
    _resign_free_manifest(d, state_sha256=_digest(state_file.read_bytes()), step=1)
    _refused(
        capsys, [*PMTL, "--reproducible-noise", "--checkpoint-dir", str(d), "--resume"], "signed"
    )


def test_a_ledger_cut_by_one_byte_or_without_its_closing_line(capsys, tmp_path, finished):
    lines = _ledger_lines(finished)
    truth = _ok(capsys, ["ledger", str(finished), "--json"])
    assert truth["complete"] and truth["authenticated"] and truth["releases"] == ROUNDS
    led = tmp_path / "ledger.jsonl"
    led.write_bytes(b"".join(lines[:-1])[:-1])  # no closing line, the last newline cut
    out = _ok(capsys, ["ledger", str(led), "--json"])
    assert out["releases"] == ROUNDS and out["epsilon"] == pytest.approx(truth["epsilon"])
    assert not out["complete"] and "newline" in out["incomplete"]
    code, text, _ = _cli(capsys, ["ledger", str(led)])
    assert code == 0 and "incomplete: its last line has no newline" in text
    led.write_bytes(b"".join(lines[:-1]))  # the closing line removed: the same ε, incomplete
    out = _ok(capsys, ["ledger", str(led), "--json"])
    assert out["releases"] == ROUNDS and not out["complete"]
    assert out["epsilon"] == pytest.approx(truth["epsilon"])
    led.write_bytes(b"".join(lines[:-1])[:-5])  # torn inside the last release: a lower bound
    code, text, _ = _cli(capsys, ["ledger", str(led)])
    assert code == 0 and f"at least {ROUNDS - 1} releases" in text and "torn" in text


def _mac_line(prev_mac, row):
    from privmtl.privacy.ledger import _chain_mac
    from privmtl.trust import user_key

    row = dict(row)
    row["mac"] = _chain_mac(user_key(create=False), prev_mac, row)
    return row["mac"], (json.dumps(row, sort_keys=True) + "\n").encode()


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda e: e.update(type="self_composed", count=-1, event=dict(e)), "count"),
        (lambda e: e.update(type="self_composed", count=10**12, event=dict(e)), "count"),
        (lambda e: e.update(type="poisson", sampling_probability=7, event=dict(e)), "[0, 1]"),
        (lambda e: e.update(noise_multiplier=float("nan")), "noise_multiplier"),
        (lambda e: e.update(type="self_composed", count=True, event=dict(e)), "count"),
    ],
)
def test_an_event_out_of_bounds_is_refused_in_one_line(capsys, tmp_path, finished, edit, words):
    """Even with a valid MAC (this user's key): what an event may state is bounded."""
    lines = _ledger_lines(finished)
    header = json.loads(lines[0])
    prev, out = _mac_line("", header)
    rec = json.loads(lines[1])
    edit(rec["event"])
    _, line = _mac_line(prev, {k: v for k, v in rec.items() if k != "epsilon"})
    led = tmp_path / "ledger.jsonl"
    led.write_bytes(out + line)
    _refused(capsys, ["ledger", str(led)], "unreadable event", words)


def test_a_deeply_nested_or_non_utf8_ledger_line_is_one_line(capsys, tmp_path, finished):
    lines = _ledger_lines(finished)
    led = tmp_path / "ledger.jsonl"
    for bad in (b"[" * 200_000 + b"]" * 200_000, b'{"a": "\xff\xfe"}'):
        led.write_bytes(lines[0] + bad + b"\n")
        _refused(capsys, ["ledger", str(led)], "line 2")


def test_a_special_file_as_the_ledger_is_one_line(capsys, tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "ledger.jsonl").symlink_to(os.devnull)
    args = [*PMTL, "--secure-noise", "--checkpoint-dir", str(d), "--resume"]
    _refused(capsys, args, "ledger", "regular file")
    (d / "manifest.json").write_bytes(b"\xff\xfe[]")  # and a manifest that is not UTF-8
    _refused(capsys, args, "manifest")
    _refused(capsys, ["ledger", str(d)], "manifest")
    (d / "manifest.json").write_bytes(b"[]")
    _refused(capsys, args, "manifest")
    _refused(capsys, ["ledger", str(d)], "manifest")


VOTE = ["pmtl", "--data", "synthetic", "--num-clients", "100", "--model", "logreg",
        "--rounds", "3", "--epsilon", "8", "--finetune", "auto", "--finetune-select", "vote",
        "--quiet", "--json", "--reproducible-noise"]  # fmt: skip


def test_a_seeded_resume_after_the_vote_does_not_record_it_again(capsys, tmp_path):
    """Killed right after the end-of-run vote is on record: the seeded resume replays it."""
    from privmtl.federated.end_of_run.finish import FINETUNE_VOTE_ID
    from privmtl.privacy.ledger import read_ledger

    whole = _ok(capsys, [*VOTE, "--checkpoint-dir", str(tmp_path / "whole")])
    assert whole["finetune_auto"]["vote"]["held"]
    d = tmp_path / "ckpt"
    proc = _fault("recorded", 3, [*VOTE, "--checkpoint-dir", str(d)])  # release 3: the vote
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    out = _ok(capsys, [*VOTE, "--checkpoint-dir", str(d), "--resume"])
    _, entries = read_ledger(d / "ledger.jsonl")
    assert [e["release_id"] for e in entries].count(FINETUNE_VOTE_ID) == 1
    assert len(entries) == 4
    assert out["epsilon"] == pytest.approx(whole["epsilon"], rel=1e-12)
    assert out["finetune_auto"]["vote"]["winner"] == whole["finetune_auto"]["vote"]["winner"]
