"""The "your own model and table" tutorial runs as written, from an empty directory, as a user.

``docs/tutorial_own_data.sh`` is the tutorial's commands; this runs it in a fresh directory with
the interpreter running the tests, no ``PYTHONPATH`` but the package's own folder, and without the
working directory on the import path (``PYTHONSAFEPATH``, as the installed ``privmtl`` script
runs), so ``--model mymodels:make_mlp`` must be found by privmtl's own rule.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import privmtl

SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "tutorial_own_data.sh"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_tutorial_runs_from_an_empty_directory(tmp_path):
    assert SCRIPT.is_file()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(
        PYTHONPATH=str(Path(privmtl.__file__).resolve().parents[1]),  # the package only
        PYTHONSAFEPATH="1",  # the working directory is not on the import path
        PRIVMTL=f"{sys.executable} -m privmtl",
        PYTHON=sys.executable,
        OMP_NUM_THREADS="1",
    )
    work = tmp_path / "empty"
    work.mkdir()
    done = subprocess.run(["bash", str(SCRIPT)], cwd=work, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "tutorial: all steps ran as documented" in done.stdout
    assert (work / "out1" / "model.json").is_file() and (work / "mp1" / "coef.npy").is_file()
