"""The README is a short front door, and every relative link in it and in docs/ leads somewhere:
to a file that exists and, where the link names a heading, to a heading of that file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The Markdown outside fenced code blocks (their `#` lines are no headings)."""
    return FENCE.sub("", text)


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the file's headings: lower case, punctuation dropped, spaces as
    hyphens, a repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", prose(path.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


def relative_links(path: Path) -> list[str]:
    return [link for link in LINK.findall(prose(path.read_text()))
            if not re.match(r"[a-z]+:", link)]


def test_the_readme_is_at_most_250_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move the rest to docs/"


def test_the_readme_links_every_docs_page():
    linked = {(README.parent / link.partition("#")[0]).resolve() for link in relative_links(README)}
    unlinked = [page.name for page in PAGES[1:] if page.resolve() not in linked]
    assert not unlinked, f"README.md's contents list lacks {unlinked}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_heading(page):
    broken = []
    for link in relative_links(page):
        target, _, anchor = link.partition("#")
        resolved = (page.parent / target).resolve() if target else page
        if not resolved.exists():
            broken.append(f"{link}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{link}: no such heading in {resolved.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_names_a_tracker_number(page):
    """The docs say what the code does, not which ticket asked for it; upstream pull requests
    (`vLLM PR #60220`) are sources and stay."""
    found = TRACKER_NUMBER.findall(page.read_text())
    assert not found, f"{page.relative_to(ROOT)} names {found}"


TRACKER_NUMBER = re.compile(r"\bissue[- ]?\d+|(?<!PR )(?<!request )#\d+\b", re.I)
SOURCES = [p for top in ("mlamem", "kernels", "scripts", "benchmarks", "tests", "scenarios", ".ci")
           for p in sorted((ROOT / top).rglob("*"))
           if p.is_file() and p.suffix in {".py", ".toml", ".sh", ".json", ""} and "fixtures" not in p.parts]


def test_no_source_names_a_tracker_number():
    """The code, scripts, benchmarks, tests and scenarios name no ticket either (fixtures are
    recorded output and stay as they were made)."""
    found = [f"{p.relative_to(ROOT)}:{n}" for p in SOURCES
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             if TRACKER_NUMBER.search(line)]
    assert SOURCES and not found, f"tracker numbers at {found}"


def test_the_tracker_check_tells_a_ticket_from_an_upstream_pull_request():
    """The pattern can fail: a ticket is found, an upstream pull request is a source."""
    ticket = 26  # spelled apart, so this file passes its own check
    found = TRACKER_NUMBER.findall(f"see issue {ticket} and #{ticket + 1}")
    assert found == [f"issue {ticket}", f"#{ticket + 1}"]
    assert not TRACKER_NUMBER.findall("vLLM PR #60220, pull request #6117, colour #1f77b4")


def test_the_link_check_finds_a_broken_link_and_heading(tmp_path):
    """The checks above can fail: a missing file and a missing heading are both caught."""
    (tmp_path / "other.md").write_text("# A heading\n\n```\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md#a-heading) [b](missing.md) [c](other.md#not-a-heading)\n"
                    "[d](https://example.com/x.md)\n```\n[e](in-code.md)\n```\n")
    assert relative_links(page) == ["other.md#a-heading", "missing.md", "other.md#not-a-heading"]
    assert anchors(tmp_path / "other.md") == {"a-heading"}
