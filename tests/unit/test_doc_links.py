"""Every link between the project's own Markdown files resolves: the file exists in the checkout and the
``#anchor`` is a heading of it, slugged the way GitHub slugs headings (once
``docs/how-to/guard.md#coverage-measured``
pointed at no heading).

markdown-it-py parses the files (CommonMark and tables, as GitHub renders them), so a ``#`` or ``[x](y)``
inside a code block or code span is not taken for a link and reference-style links are resolved.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

ROOT = Path(__file__).resolve().parents[2]
# The records of runs and measurements (benchmarks/results/*.md) link into the docs too.
DOCS = sorted(
    [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "benchmarks").rglob("*.md")]
)
_MD = MarkdownIt("commonmark").enable("table")
_NOT_IN_SLUG = re.compile(r"[^\w\- ]")  # GitHub keeps letters, digits, _, - and spaces (then - for space)
_HTML_ANCHOR = re.compile(r"""<a\s+(?:name|id)=["']([^"']+)["']""")


def github_slug(heading: str, seen: Counter[str]) -> str:
    """The anchor GitHub gives ``heading``: lower case, punctuation dropped, spaces to ``-``; a repeated
    heading gets ``-1``, ``-2``, … in order."""
    base = _NOT_IN_SLUG.sub("", heading.strip().lower()).replace(" ", "-")
    slug = base if not seen[base] else f"{base}-{seen[base]}"
    seen[base] += 1
    return slug


def _text(inline: Token) -> str:
    return "".join(c.content for c in inline.children or () if c.type in ("text", "code_inline"))


@cache
def _parsed(path: Path) -> tuple[frozenset[str], tuple[str, ...]]:
    """(anchors, link targets) of one Markdown file."""
    tokens = _MD.parse(path.read_text(encoding="utf-8"))
    anchors: set[str] = set()
    links: list[str] = []
    seen: Counter[str] = Counter()
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            anchors.add(github_slug(_text(tokens[i + 1]), seen))
        for child in [tok, *(tok.children or ())]:
            if child.type in ("html_inline", "html_block"):
                anchors.update(_HTML_ANCHOR.findall(child.content))
            elif child.type == "link_open":
                links.append(str(child.attrs["href"]))
            elif child.type == "image":
                links.append(str(child.attrs["src"]))
    return frozenset(anchors), tuple(links)


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """Each link of ``path`` into the checkout at ``root`` that does not resolve, with why."""
    problems: list[str] = []
    for href in _parsed(path)[1]:
        parts = urlsplit(href)
        if parts.scheme or parts.netloc:
            continue  # the web: not this test's business
        target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
        if not target.is_relative_to(root):
            problems.append(f"{href}: outside the checkout (a maintainer who clones it has no {target})")
        elif not target.exists():
            problems.append(f"{href}: no such file")
        elif parts.fragment and target.suffix == ".md" and unquote(parts.fragment) not in _parsed(target)[0]:
            problems.append(f"{href}: no heading #{parts.fragment} in {target.relative_to(root)}")
    return problems


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_intra_repo_links_resolve(path: Path) -> None:
    """README.md, CONTRIBUTING.md and every page under docs/: every relative link names an existing file,
    every #anchor a heading."""
    assert broken_links(path) == []


def test_the_checker_finds_what_github_would_not(tmp_path: Path) -> None:
    """The checker itself: GitHub's slugs (punctuation, code spans, repeats), links inside code ignored,
    reference links followed, a missing heading, a missing file and a link out of the checkout reported."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "b.md").write_text('# B\n\n<a id="raw"></a>\n')
    doc = root / "README.md"
    doc.write_text(
        "# The `dupguard.alert/v1` payload (v1)\n\n## Cost\n\n## Cost\n\n"
        "[ok](#the-dupguardalertv1-payload-v1) [second](#cost-1) [gone](#coverage-measured)\n\n"
        "`[span](#nowhere)`\n\n    [indented](#nowhere)\n\n"
        "[b](docs/b.md#b) [raw](docs/b.md#raw) [ref][r] [missing](docs/c.md) [web](https://x.org/#y)\n\n"
        "[out](../elsewhere/notes.md)\n\n[r]: docs/b.md#nope\n"
    )
    ids = [github_slug(h, Counter()) for h in ("Why it works", "3.0.x: exact & overlap", "What's new?")]
    assert ids == ["why-it-works", "30x-exact--overlap", "whats-new"]
    problems = broken_links(doc, root)
    assert [p.split(":")[0] for p in problems] == [
        "#coverage-measured", "docs/b.md#nope", "docs/c.md", "../elsewhere/notes.md"
    ]  # fmt: skip
    assert "no heading #coverage-measured in README.md" in problems[0]
    assert "outside the checkout" in problems[3]
