r"""The mediation audit: every client's outputs depend on the others only through recorded releases.

Client-level joint DP rests on one structural fact (the billboard lemma): the outputs *for*
client ``j`` — its model, its numbers, the files about it — are a function of client ``j``'s own
data and of the privatized releases, nothing else. This module tests that fact on the real code,
output path by output path:

1. **Run A** on a data set ``D``, with an audit tape recording every release
   (:func:`~privmtl.audit.tape.release_tape`, injected around the release mechanisms).
2. **Run B** on ``D'``, where one client's (task's) data is replaced, with the tape *replaying*
   A's releases: each release computes everything it would, then emits A's value instead of its
   own. Sampling, client training, fine-tuning, selection, evaluation and saving run unchanged,
   with the same seeds.
3. **Compare** every other client's outputs: model tensors (bit for bit), per-client numbers,
   the rows of saved model files, every column of the per-client rows (``clients.csv``,
   :mod:`privmtl.per_client`) and the JSON keys (population summaries and timings excepted,
   see :data:`POPULATION_KEYS`). A difference is a path from the replaced client to another
   client's output that no release and no ledger entry accounts for.

A passing check does not prove the property for every neighbour: it shows that the neighbour
used leaves no trace (:func:`~privmtl.audit.mediation_paths.make_tables`: the replaced client has ten times the rows of the
others and gets random labels and rescaled features, or random labels only, so that it sways any
pooled choice; for MP-MTL a rank-one task with the largest possible Lipschitz constant). A
failing check is a proof of a leak outside the releases. Lists of length ``m`` in a JSON output
are read as per-client lists (the audit's grids and round counts avoid that length).

**Mutants** (:data:`MUTANTS`) re-introduce known leaks by monkeypatching the real code inside the
audit: pooled selection (``train_local``/``finetune_select`` with ``select="pooled"``), an
MP-MTL step size from every task's Lipschitz constant, and an un-noised diagnostic (the signal
norm of the clipped mean) in what the clients receive. Each must make at least one check that
passes without it fail (the mutant is *caught*).

Output paths that need the command line (``privmtl pmtl`` and ``privmtl mpmtl`` with their
``--save-models`` files) are run through a ``run_command`` callable that the CLI passes in (this
module sits below the CLI); without it those checks are skipped.

The tape also replays a :class:`~privmtl.privacy.selection.ClientVote`'s noisy counts (MP-MTL
low-rank's floor vote and PMTL's end-of-run vote, ``--finetune-select vote``, are such releases). Not covered: the DP-MTRL and DP-AGGR baselines (their output perturbation does not go through
:func:`~privmtl.audit.tape.release_tape`, so it cannot be replayed) and the sweeps' selection.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privmtl.audit.mediation_paths import (
    MUTANTS,
    NUM_CLIENTS,
    REPLACED,
    CheckSpec,
    Workspace,
    check_specs,
    make_tables,
)
from privmtl.audit.tape import ReleaseTape, release_tape

__all__ = [
    "DIAGNOSTIC_KEYS",
    "MUTANTS",
    "POPULATION_KEYS",
    "CheckSpec",
    "check_specs",
    "make_tables",
    "run_mediation_audit",
]

RunCommand = Callable[[list[str]], dict[str, Any]]

#: JSON keys allowed to differ between the two runs: summaries over the whole population
#: (pooled accuracies and losses, their values per grid point, the histogram of the clients' own
#: choices: each includes the replaced client's own outputs, and no other client receives it),
#: wall-clock times, and the file's signature (:mod:`privmtl.trust`: a MAC under this user's key of
#: the file's other fields, so it differs exactly when one of the keys above does). Everything
#: else must be equal.
POPULATION_KEYS = frozenset(
    {
        "test_accuracy",
        "mean_client_accuracy",
        "val_accuracy",
        "global_test_accuracy",
        "global_mean_client_accuracy",
        "pre_finetune_test_accuracy",
        "grid_val_accuracy",
        "grid_test_accuracy",
        "trained_val_accuracy",
        "choice_counts",
        "clients_per_choice",
        "clients_per_final_model",
        "end_of_run",
        "accuracy",
        "loss",
        "n",
        "nmse",
        "seconds",
        "seconds_per_round",
        "data_seconds",
        "baseline_seconds",
        "phases",
        "created",
        "timestamp",
        "signature",
        "files_sha256",
        "local_test_accuracy",
        "local_mean_client_accuracy",
        "gain_over_local",
        "gain_interval",
        "stl_nmse",
        "gain_over_stl",
        "val_accuracy_per_round",
    }
)

#: Curator diagnostics computed from un-noised messages (opt-in, not in the default JSON). The
#: per-path checks leave them to the check ``pmtl JSON: no un-noised curator diagnostics
#: (--finetune none)``.
DIAGNOSTIC_KEYS = frozenset(
    {
        "signal_norm_per_round",
        "full_signal_norm_per_round",
        "noise_norm_per_round",
        "train_loss_per_round",
        "curator_diagnostics",
    }
)


#: Number of clients (tasks) of the audit's data sets and the replaced one.
# ----------------------------------------------------------------------------------- compare
@dataclass
class _Diff:
    where: list[str]
    max_abs: float

    def add(self, where: str, diff: float) -> None:
        self.where.append(where)
        if math.isfinite(diff):
            self.max_abs = max(self.max_abs, diff)
        else:
            self.max_abs = math.inf


def _compare_rows(
    a: dict[str, Any], b: dict[str, Any], ids: Sequence[str], skip: str, label: str, out: _Diff
) -> None:
    """Stacked ``(m, ...)`` tensors: every row but the replaced client's must be bit-identical."""
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            out.add(f"{label}:{name} (missing in one run)", math.inf)
            continue
        ta, tb = torch.as_tensor(a[name]), torch.as_tensor(b[name])
        if ta.shape != tb.shape:
            out.add(f"{label}:{name} shape {tuple(ta.shape)} vs {tuple(tb.shape)}", math.inf)
            continue
        for row, cid in enumerate(ids):
            if cid == skip:
                continue
            if not torch.equal(ta[row], tb[row]):
                diff = float((ta[row].double() - tb[row].double()).abs().max())
                out.add(f"{label}:{name}[{cid}]", diff)


def _compare_whole(a: dict[str, Any], b: dict[str, Any], label: str, out: _Diff) -> None:
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            out.add(f"{label}:{name} (missing in one run)", math.inf)
            continue
        ta, tb = torch.as_tensor(a[name]), torch.as_tensor(b[name])
        if ta.shape != tb.shape or not torch.equal(ta, tb):
            diff = (
                float((ta.double() - tb.double()).abs().max()) if ta.shape == tb.shape else math.inf
            )
            out.add(f"{label}:{name}", diff)


def _compare_json(
    a: Any, b: Any, path: str, ids: Sequence[str], skip: str, ignore: frozenset[str], out: _Diff
) -> None:
    """Recursive JSON comparison; per-client lists (length m) and dicts keyed by client id skip
    the replaced client; keys in ``ignore`` are not compared."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key in ignore or key == skip:
                continue
            if key not in a or key not in b:
                out.add(f"{path}.{key} (missing in one run)", math.inf)
                continue
            _compare_json(a[key], b[key], f"{path}.{key}", ids, skip, ignore, out)
        return
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.add(f"{path} (length {len(a)} vs {len(b)})", math.inf)
            return
        per_client = len(a) == len(ids)
        for j, (x, y) in enumerate(zip(a, b, strict=True)):
            if per_client and ids[j] == skip:
                continue
            _compare_json(x, y, f"{path}[{ids[j] if per_client else j}]", ids, skip, ignore, out)
        return
    if a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b):
        return
    if isinstance(a, int | float) and isinstance(b, int | float):
        out.add(path, abs(float(a) - float(b)))
    else:
        out.add(path, math.inf)


def _verdict(name: str, diff: _Diff, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    ok = not diff.where
    detail = (
        "every other client's outputs bit-identical"
        if ok
        else f"differs: {', '.join(diff.where[:4])}" + (" ..." if len(diff.where) > 4 else "")
    )
    clients = sorted(
        {
            part.split("]")[0]
            for where in diff.where
            for part in where.split("[")[1:]
            if part.split("]")[0].startswith("c")
        }
    )
    out: dict[str, Any] = {
        "name": name,
        "ok": ok,
        "detail": detail,
        "differences": len(diff.where),
        "clients_differing": clients,
        "max_abs_diff": 0.0 if ok else diff.max_abs,
    }
    out.update(extra or {})
    return out


# ----------------------------------------------------------------------------------- runners
Inject = Callable[[], contextlib.AbstractContextManager[Any]]
"""A mutant's context manager (:data:`MUTANTS`), or none."""


def _twice(
    run: Callable[[bool], Any], inject: Inject = contextlib.nullcontext
) -> tuple[Any, Any, int]:
    """``run(replaced)`` on D with a recording tape, then on D' replaying it.

    The tape wraps the release mechanisms first, the mutant (``inject``) over it: the tape sits
    where a release leaves the mechanism, and whatever a mutant adds afterwards is outside it.
    """
    tape = ReleaseTape("record")
    with release_tape(tape), inject():
        a = run(False)
    with release_tape(tape.replay()) as replay, inject():
        b = run(True)
    if replay.position != len(tape.values):
        raise RuntimeError(
            f"the replayed run made {replay.position} releases, the recorded one "
            f"{len(tape.values)} (a choice outside the releases changed how many are made)"
        )
    return a, b, len(tape.values)


def _cli_outputs(
    ctx: Workspace, spec: CheckSpec, run_command: RunCommand, replaced: bool
) -> dict[str, Any]:
    # Both runs read the same path and save to the same directory (loaded into memory, then
    # emptied before the next run), so the paths echoed in the JSON and model.json agree.
    data, models = ctx.root / "data.csv", ctx.root / "models"
    shutil.copyfile(ctx.table(replaced, spec.neighbour, spec.command), data)
    if models.exists():
        shutil.rmtree(models)
    args = (
        _mpmtl_args(ctx, spec, data, models)
        if spec.command == "mpmtl"
        else [
            "pmtl",
            "--data",
            "table",
            "--data-path",
            str(data),
            "--client-column",
            "client",
            "--label-column",
            "label",
            "--model",
            "logreg",
            "--rounds",
            "3",
            "--clients-per-round",
            "5",
            *(() if "--noise-std" in spec.args else ("--epsilon", "2")),
            "--reproducible-noise",
            "--seed",
            str(ctx.seed),
            "--threads",
            "1",
            "--save-models",
            str(models),
            *spec.args,
        ]
    )
    out = run_command(args)
    files: dict[str, Any] = {}
    for f in sorted(models.glob("*")):
        if f.suffix == ".pt":
            files[f.name] = torch.load(f, map_location="cpu", weights_only=True)
        elif f.suffix == ".npy":  # MP-MTL: column i is task i's model
            files[f.name] = {"coef": torch.from_numpy(np.ascontiguousarray(np.load(f).T))}
        elif f.suffix == ".json":
            files[f.name] = json.loads(f.read_text())
        elif f.suffix == ".csv":  # per-client rows, in the clients' order: a per-client list
            with f.open(newline="") as fh:
                files[f.name] = list(csv.DictReader(fh))
    return {"json": out, "files": files}


def _mpmtl_args(ctx: Workspace, spec: CheckSpec, data: Path, models: Path) -> list[str]:
    return [
        "mpmtl",
        "--data",
        "table",
        "--data-path",
        str(data),
        "--epsilon",
        "2",
        "--reproducible-noise",
        "--seed",
        str(ctx.seed),
        "--save-models",
        str(models),
        *spec.args,
    ]


def _check_cli(
    ctx: Workspace, spec: CheckSpec, run_command: RunCommand, inject: Inject
) -> dict[str, Any]:
    a, b, releases = _twice(lambda replaced: _cli_outputs(ctx, spec, run_command, replaced), inject)
    ids = [str(c) for c in a["files"].get("model.json", {}).get("client_ids", [])]
    if not ids:
        ids = [f"c{k}" for k in range(NUM_CLIENTS)]
    skip = f"c{REPLACED}"
    diff = _Diff([], 0.0)
    ignore = POPULATION_KEYS if spec.json_diagnostics else POPULATION_KEYS | DIAGNOSTIC_KEYS
    names = set(a["files"]) | set(b["files"])
    if spec.files_only:
        names = set(spec.files_only)
    else:
        _compare_json(a["json"], b["json"], "json", ids, skip, ignore, diff)
    for name in sorted(names):
        fa, fb = a["files"].get(name), b["files"].get(name)
        if fa is None or fb is None:
            diff.add(f"{name} (missing in one run)", math.inf)
        elif name in ("personalized.pt", "coef.npy"):
            _compare_rows(fa, fb, ids, skip, name, diff)
        elif name.endswith(".pt"):
            _compare_whole(fa, fb, name, diff)
        elif name.endswith(".csv"):  # every column of a row is the client's own output
            _compare_json(fa, fb, name, ids, skip, frozenset(), diff)
        else:
            _compare_json(fa, fb, name, ids, skip, ignore, diff)
    extra = {"releases": releases, "files": sorted(names)}
    return _verdict(spec.name, diff, extra)


def _check_api(ctx: Workspace, spec: CheckSpec, inject: Inject) -> dict[str, Any]:
    runner = spec.runner
    assert runner is not None
    a, b, releases = _twice(lambda replaced: runner(ctx, replaced), inject)
    ids, rows_a, nums_a, whole_a = a
    _, rows_b, nums_b, whole_b = b
    skip = f"c{REPLACED}"
    diff = _Diff([], 0.0)
    _compare_rows(rows_a, rows_b, ids, skip, "models", diff)
    _compare_json(nums_a, nums_b, "numbers", ids, skip, POPULATION_KEYS, diff)
    _compare_whole(whole_a, whole_b, "shared", diff)
    return _verdict(spec.name, diff, {"releases": releases})


# ----------------------------------------------------------------------------------- driver
def _run_check(
    ctx: Workspace,
    spec: CheckSpec,
    run_command: RunCommand | None,
    inject: Inject = contextlib.nullcontext,
) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        if spec.kind == "cli":
            if run_command is None:
                return {"name": spec.name, "ok": None, "detail": "skipped: needs the CLI"}
            out = _check_cli(ctx, spec, run_command, inject)
        else:
            out = _check_api(ctx, spec, inject)
    except Exception as exc:  # a path that breaks under replay is a failed check, not a crash
        out = {"name": spec.name, "ok": False, "detail": f"error: {type(exc).__name__}: {exc}"}
    if spec.mediated_by:
        out["mediated_by"] = spec.mediated_by
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out


def run_mediation_audit(
    run_command: RunCommand | None = None,
    *,
    seed: int = 0,
    mutants: bool = True,
    only: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Run every check (module docstring), then every mutant; returns the report.

    Parameters
    ----------
    run_command : callable, optional
        ``run_command(argv) -> dict``: runs one ``privmtl`` command in process and returns its
        JSON object (the CLI passes it). None skips the command-line checks.
    seed : int, default 0
        Seed of the data sets and of every run.
    mutants : bool, default True
        Also run the mutants.
    only : sequence of str, optional
        Run only the checks whose name contains one of these strings.

    Returns
    -------
    dict
        ``checks`` (``{"name", "ok", "detail", ...}`` each; ``ok`` is None for a skipped check;
        ``mediated_by`` on checks of paths that a default choice makes mediated), ``mutants``
        (number run), ``mutants_caught`` (a mutant is caught when a check that holds without it
        fails with it), ``mutant_results``, ``skipped`` and ``ok`` (every check that ran holds and
        every mutant is caught).
    """
    specs = check_specs()
    if only:
        specs = [s for s in specs if any(o in s.name for o in only)]
    t0 = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="privmtl-mediation-"))
    try:
        ctx = Workspace(root, seed)
        checks = [_run_check(ctx, s, run_command) for s in specs]
        results: list[dict[str, Any]] = []
        if mutants:
            passing = {c["name"] for c in checks if c["ok"]}
            for name, (what, inject) in MUTANTS.items():
                mutated = [
                    _run_check(ctx, s, run_command, inject) for s in specs if s.name in passing
                ]
                failed = [c["name"] for c in mutated if c["ok"] is False]
                results.append(
                    {"name": name, "injects": what, "caught": bool(failed), "failed_checks": failed}
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    caught = sum(bool(r["caught"]) for r in results)
    ran = [c for c in checks if c["ok"] is not None]  # None: skipped (no run_command)
    ok = bool(ran) and all(c["ok"] for c in ran) and caught == len(results)
    return {
        "checks": checks,
        "mutants": len(results),
        "mutants_caught": caught,
        "mutant_results": results,
        "ok": ok,
        "skipped": len(checks) - len(ran),
        "seconds": time.perf_counter() - t0,
        "replaced_client": f"c{REPLACED}",
        "num_clients": NUM_CLIENTS,
    }
