"""The deployment module, which ``privmtl flower local``'s waiting process imports."""

from __future__ import annotations

import subprocess
import sys


def test_the_launcher_and_its_work_directory_load_no_numerical_library():
    """The process that waits for the SuperNodes imports the deployment module, the work directory's
    ``run.json`` reader and the SuperNode runner's module: none loads numpy, torch, SciPy or
    Flower."""
    code = (
        "import sys\n"
        "import privmtl.flower.deploy, privmtl.flower.run_info, privmtl.flower.node\n"
        "print([m for m in ('numpy', 'torch', 'scipy', 'flwr') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
