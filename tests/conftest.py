"""Shared fixtures: locating ../shared/data (skipped with a clear reason when absent), and a
private privmtl configuration folder (the signing key) for every test."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# helper modules shared by test files (engine_defaults.py): importable under --import-mode=importlib
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _shared_data_dir() -> Path:
    env = os.environ.get("PRIVMTL_SHARED_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    path = _shared_data_dir()
    if not path.is_dir():
        pytest.skip(f"shared data folder not found at {path} (set PRIVMTL_SHARED_DATA)")
    return path


@pytest.fixture(scope="session")
def school_path(shared_data_dir: Path) -> Path:
    path = shared_data_dir / "school" / "school.mat"
    if not path.is_file():
        pytest.skip(f"School data not found at {path}")
    return path


@pytest.fixture(scope="session")
def femnist_dir(shared_data_dir: Path) -> Path:
    path = shared_data_dir / "femnist-leaf"
    if not (path / "train").is_dir():
        pytest.skip(f"LEAF FEMNIST data not found at {path}")
    return path


@pytest.fixture(scope="session", autouse=True)
def privmtl_config_dir(tmp_path_factory):
    """A private PRIVMTL_CONFIG_DIR (signing key) for the whole session: no test touches ~/.config.

    Session-scoped so that module- and session-scoped fixtures that save models use it too; a test
    that needs another user's key sets the variable itself (``monkeypatch.setenv``).
    """
    folder = tmp_path_factory.mktemp("privmtl-config")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PRIVMTL_CONFIG_DIR", str(folder))
        yield folder


@pytest.fixture(autouse=True)
def _default_verbosity():
    """Every test starts at the default verbosity: the CLI's ``--quiet`` / ``--verbose`` set a
    process-wide level, which an in-process CLI test would otherwise leave to the next test."""
    from privmtl._progress import NORMAL, set_verbosity

    set_verbosity(NORMAL)
