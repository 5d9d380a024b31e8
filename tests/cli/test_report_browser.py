"""The three kinds of report, opened in a real browser: headless Chromium draws their plots.

Slow (a browser start per page); skipped where Chromium is not installed (CI installs Debian's
``chromium`` package).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from privmtl.cli import main

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1200,1600",
)  # fmt: skip


def screenshot(page: Path, png: Path) -> np.ndarray:
    """The page as Chromium draws it: an (h, w, channels) array of pixels."""
    from PIL import Image

    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
             page.resolve().as_uri()],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
    return np.asarray(Image.open(png).convert("RGB"), dtype=np.float64)


def plotted(pixels: np.ndarray) -> int:
    """Pixels of the plots' own colours (the lines' blue, the bars' green, red and grey)."""
    r, g, b = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    blue = (b > 200) & (r < 80) & (g > 80) & (g < 140)
    green = (g > 100) & (r < 40) & (b < 80)
    red = (r > 150) & (g < 40) & (b < 60)
    return int((blue | green | red).sum())


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    d = tmp_path_factory.mktemp("reports")
    run = ["--reproducible-noise", "--seed", "0", "--quiet"]
    pmtl = ["pmtl", "--data", "synthetic", "--num-clients", "40", "--rounds", "8", "--epsilon",
            "2", "--eval-every", "1", "--finetune", "none", "--threads", "1", *run]  # fmt: skip
    assert main([*pmtl, "--save-models", str(d / "models"), "--json"]) == 0
    mp = ["mpmtl", "--data", "synthetic-lowrank", "--method", "lowrank", "--epsilon", "1",
          "--no-tune", *run]  # fmt: skip
    assert main([*mp, "--report", str(d / "mpmtl.html")]) == 0
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main([*pmtl, "--json"]) == 0
    (d / "result.json").write_text(buffer.getvalue())  # a result without per-client rows
    return d


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian package: chromium)")
def test_the_three_kinds_of_report_render_their_plots(reports):
    d = reports
    rounds = json.loads((d / "result.json").read_text())["rounds_run"]
    assert main(["report", str(d / "models"), "-o", str(d / "folder.html")]) == 0
    assert main(["report", str(d / "result.json"), "-o", str(d / "result.html")]) == 0
    for name, series, bars in (
        ("folder", rounds, True), ("result", rounds, False), ("mpmtl", 0, True),
    ):  # fmt: skip
        page = (d / f"{name}.html").read_text()
        points = re.findall(r"<polyline class='series-epsilon'[^>]*points='([^']*)'", page)
        assert [len(p.split()) for p in points] == ([series] if series else [])
        assert ("class='bar-gain'" in page) is bars
        pixels = screenshot(d / f"{name}.html", d / f"{name}.png")
        assert pixels.std() > 10  # not a blank page
        assert plotted(pixels) > 2000, name  # the plots are drawn (without them: < 1000)
