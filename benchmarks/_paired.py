"""Pairing a benchmark with another engine: a commit's ``src`` extracted, and a worker run of
the calling script with that ``src`` first on the path, one thread. Imports nothing of privmtl,
so a worker loads only the engine it is given."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def extract_src(commit: str, into: Path) -> Path:
    """``commit``'s ``src`` folder (``git archive``) extracted under ``into``; returns its path."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "src"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def run_worker(script: str, src: Path, args: list[str]) -> dict[str, Any]:
    """``python script --worker *args`` with ``src`` as ``PYTHONPATH`` and one torch / BLAS
    thread; returns the JSON object of its last printed line."""
    env = {
        **os.environ,
        "PYTHONPATH": str(src),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    cmd = [sys.executable, script, "--worker", *args]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]
