"""Sphinx configuration of the privmtl documentation (build: ``sphinx-build -W -b html docs DIR``)."""

from __future__ import annotations

import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

project = "privmtl"
author = "privmtl developers"
copyright = "privmtl developers"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "_generated/results/*.md", "_generated/research/*.md"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header", "myst.xref_missing"]

# API reference: every public module, found by walking the package (new modules appear by
# themselves). Optional dependencies are mocked so that their modules are documented too.
autosummary_generate = True
autosummary_imported_members = False
autodoc_mock_imports = ["flwr"]
# ignore-module-all: a package's page documents what it defines, not what it re-exports from its
# modules (each object has one home, so cross-references are unambiguous).
autodoc_default_options = {"members": True, "show-inheritance": True, "ignore-module-all": True}
autodoc_typehints = "none"
autoclass_content = "class"
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_preprocess_types = False
nitpicky = False

html_theme = "alabaster"
html_title = "privmtl"


def _results_page(src: Path, generated: str, page: str, intro: list[str]) -> None:
    """Write ``page`` including every table of ``src`` (*.md) and its plots (*.png), copied to
    ``_generated/<generated>``."""
    dst = HERE / "_generated" / generated
    dst.mkdir(parents=True, exist_ok=True)
    names = sorted(p.name for p in src.glob("*.md") if p.name != "README.md")
    for pattern in ("*.md", "*.png"):
        for path in src.glob(pattern):
            shutil.copy2(path, dst / path.name)
    lines = [*intro, ""]
    shown: set[str] = set()
    for name in names:
        stem = name[: -len(".md")]
        text = (src / name).read_text()
        lines += [
            f"```{{include}} _generated/{generated}/{name}",
            ":heading-offset: 1",
            ":relative-images:",
            "```",
            "",
        ]
        shown |= {p.name for p in src.glob("*.png") if p.name in text}
        png = src / f"{stem}.png"
        if png.exists() and png.name not in shown:
            lines += [f"![{stem}](_generated/{generated}/{png.name})", ""]
            shown.add(png.name)
    for png in sorted(src.glob("*.png")):
        if png.name not in shown:
            lines += [f"## {png.stem}", "", f"![{png.stem}](_generated/{generated}/{png.name})", ""]
    text = "\n".join(lines)
    out = HERE / page
    if not out.exists() or out.read_text() != text:
        out.write_text(text)


def _copy_results(app: object) -> None:
    """The benchmark results page (benchmarks/results) and the research results page
    (research/results), with their tables and plots copied next to the pages."""
    _results_page(
        ROOT / "benchmarks" / "results",
        "results",
        "benchmarks.md",
        [
            "# Benchmark results",
            "",
            "The committed results of the maintained scripts in `benchmarks/` "
            "(`benchmarks/README.md` lists them), included as they are written "
            "(tables in Markdown, plots in PNG). Every table states its ε, δ, neighbouring "
            "relation, sampling, accountant and noise source; re-run a script to regenerate its "
            "file. One-off studies are on the {doc}`research page <research>`.",
        ],
    )
    _results_page(
        ROOT / "research" / "results",
        "research",
        "research.md",
        [
            "# Research results",
            "",
            "The kept results of the one-off studies in `research/` (`research/README.md`): "
            "measured once with the code of their time, not maintained and no part of the "
            "product. A rerun with today's defaults may differ; the "
            "{doc}`benchmark results <benchmarks>` are the maintained numbers.",
        ],
    )


def _cli_page(app: object) -> None:
    """The CLI reference (``cli.md``), generated from every command's ``--help``."""
    import sys

    sys.path.insert(0, str(HERE))
    try:
        from _gen_cli import write_cli_page
    finally:
        sys.path.remove(str(HERE))
    write_cli_page(HERE / "cli.md")


def _skip_member(
    app: object, what: str, name: str, obj: object, skip: bool, options: object
) -> bool:
    """Skip scikit-learn's generated metadata-routing methods (their docstrings are sklearn's)."""
    if name == "get_metadata_routing" or (name.startswith("set_") and name.endswith("_request")):
        return True
    return skip


def _clean_stubs(app: object) -> None:
    """Drop the API stubs of a previous build, so a removed module leaves no stale page."""
    shutil.rmtree(HERE / "_autosummary", ignore_errors=True)


def setup(app: object) -> None:
    app.connect("builder-inited", _clean_stubs, priority=100)  # type: ignore[attr-defined]
    app.connect("builder-inited", _copy_results)  # type: ignore[attr-defined]
    app.connect("builder-inited", _cli_page)  # type: ignore[attr-defined]
    app.connect("autodoc-skip-member", _skip_member)  # type: ignore[attr-defined]
