"""The README is a short tour, the documentation pages do not narrate their own history, and the
CLI reference is generated from the commands."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

#: Most lines the README may have: a tour, with everything else on the documentation pages.
README_MAX_LINES = 150

#: The tracker's word, spelt in parts so that this file's own pattern is no reference.
_TRACKER_WORD = "iss" + "ue"

#: A reference to the project's issue tracker: the word, then a number (with or without "#").
#: No word boundary in front, so that it finds everything ``grep -iE "<word> ?#?[0-9]"`` finds.
ISSUE_REFERENCE = re.compile(_TRACKER_WORD + r"s?\s*#?\d+", re.IGNORECASE)


def _generated_pages() -> set[str]:
    """Pages the build writes (listed in docs/.gitignore): not committed, not checked here."""
    ignore = DOCS / ".gitignore"
    return {line.strip().rstrip("/") for line in ignore.read_text().splitlines() if line.strip()}


def _written_pages() -> list[Path]:
    generated = _generated_pages()
    pages = sorted(DOCS.glob("*.md")) + sorted(DOCS.glob("*.rst"))
    return [README, *(p for p in pages if p.name not in generated)]


def test_readme_is_a_short_tour():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it at most {README_MAX_LINES} and move "
        "reference material to a page under docs/"
    )


def test_readme_keeps_the_install_and_test_commands():
    # .ci/run installs and tests as the README says; these are the commands users copy.
    text = README.read_text()
    assert "pip install -c constraints-cpu.txt -e . && privmtl demo" in text
    assert 'pip install -c constraints-cpu.txt -e ".[test]" && pytest' in text
    # CI runs that command as written (no extra installed before it), then the Flower tests
    ci = (ROOT / ".ci" / "run").read_text()
    install = ci.index('pip install --quiet -c constraints-cpu.txt -e ".[test]"\n')
    first_pytest = ci.index("python -m pytest -q\n")
    assert install < first_pytest
    assert "flower" not in ci[install:first_pytest], (
        "an extra is installed before the README's test"
    )


def test_readme_links_point_at_existing_files():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if "://" not in link]
    assert local, "the README links to no documentation page"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_written_pages_are_found():
    names = {p.name for p in _written_pages()}
    assert {"README.md", "index.md", "privacy-model.md", "results.md", "flower.md"} <= names
    assert "cli.md" not in names  # generated at build time


@pytest.mark.parametrize("page", _written_pages(), ids=lambda p: p.name)
def test_no_page_mentions_an_issue_number(page):
    hits = [
        f"{page.name}:{number}: {line.strip()}"
        for number, line in enumerate(page.read_text().splitlines(), start=1)
        if ISSUE_REFERENCE.search(line)
    ]
    assert not hits, "pages describe the software, not how it was built:\n" + "\n".join(hits)


#: What the documentation build writes or copies into docs/: not scanned there, but at its source.
_DOCS_BUILD_OUTPUT = ("_build", "_generated", "_autosummary")

#: The results pages of the documentation include every table of these folders (docs/conf.py
#: copies their ``*.md`` into docs/_generated), so they are part of the documentation.
_RESULTS_COPIED_INTO_DOCS = ("benchmarks/results", "research/results")


def _code_files() -> list[Path]:
    """Every text file of the product: the package, its tests, examples and CI, the documentation
    folder (its sources, not its build output), the maintained benchmark scripts and their README,
    and the result tables the documentation build copies. The research scripts keep their notes."""
    suffixes = (".py", ".sh", ".md", ".rst", ".toml", "")
    generated = _generated_pages()
    files = [
        p
        for folder in ("src", "tests", "examples", ".ci", "docs")
        for p in (ROOT / folder).rglob("*")
        if p.is_file()
        and p.suffix in suffixes
        and "__pycache__" not in p.parts
        and not (folder == "docs" and set(p.relative_to(DOCS).parts) & set(_DOCS_BUILD_OUTPUT))
        and not (folder == "docs" and p.parent == DOCS and p.name in generated)
    ]
    files += [p for p in (ROOT / "benchmarks").glob("*") if p.is_file() and p.suffix in suffixes]
    files += [p for folder in _RESULTS_COPIED_INTO_DOCS for p in (ROOT / folder).glob("*.md")]
    return sorted({README, *files})


def test_the_scan_covers_what_the_docs_show():
    scanned = {p.relative_to(ROOT).as_posix() for p in _code_files()}
    assert {"README.md", "docs/conf.py", "docs/index.md", "benchmarks/README.md"} <= scanned
    assert "benchmarks/pmtl_population.py" in scanned
    assert "benchmarks/results/pmtl_population.md" in scanned
    assert "tests/test_docs.py" in scanned
    assert any(name.startswith("src/privmtl/") for name in scanned)
    assert any(name.startswith("research/results/") for name in scanned)
    assert not any(name.startswith("docs/_generated/") for name in scanned)


def test_no_source_test_or_script_mentions_an_issue_number():
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _code_files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1)
        if ISSUE_REFERENCE.search(line)
    ]
    assert not hits, "the code describes the software, not how it was built:\n" + "\n".join(hits)


def test_issue_pattern_catches_what_it_should():
    word = _TRACKER_WORD  # spelt apart: this file is scanned too
    assert ISSUE_REFERENCE.search(f"the paths {word} 21's other items make mediated")
    assert ISSUE_REFERENCE.search(f"({word.title()} #10)")
    assert ISSUE_REFERENCE.search(f"({word}#10)")
    assert ISSUE_REFERENCE.search(f"before {word}s 24 and 32")
    assert not ISSUE_REFERENCE.search("an issue with 3 clients")
    assert not ISSUE_REFERENCE.search(ISSUE_REFERENCE.pattern), "the pattern names itself"


def test_cli_reference_is_generated_from_every_command():
    spec = importlib.util.spec_from_file_location("_gen_cli", DOCS / "_gen_cli.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    page = gen.render()
    from privmtl.cli import _LAZY_COMMANDS

    for name in _LAZY_COMMANDS:
        assert f"## `privmtl {name}`" in page, name
    assert "## `privmtl flower local`" in page
    assert "## `privmtl audit mediation`" in page
    # the sections are the commands' own --help, options included
    pmtl = page.split("## `privmtl pmtl`", 1)[1].split("\n## ", 1)[0]
    assert "Usage: privmtl pmtl [OPTIONS]" in pmtl
    assert "--epsilon" in pmtl and "--reproducible-noise" in pmtl
