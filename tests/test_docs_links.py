"""The documentation's links: every relative link resolves, and every page is reachable.

Checked for README.md, deploy/README.md and docs/**/*.md: a relative link names a file that exists
and, with ``#anchor``, a heading of that file under GitHub's slug rules; and every page under docs/
can be reached from README.md by following links.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.paths import REPO_ROOT

DOCS = REPO_ROOT / "docs"
README = REPO_ROOT / "README.md"

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...
HTML_TAG = re.compile(r"<[^>]+>")


def markdown_files() -> list[Path]:
    return [README, REPO_ROOT / "deploy" / "README.md", *sorted(DOCS.rglob("*.md"))]


def _prose_lines(text: str) -> Iterator[str]:
    """The lines outside fenced code blocks."""
    fence: str | None = None
    for line in text.splitlines():
        match = FENCE.match(line)
        if match:
            marker = match.group(1)
            if fence is None:
                fence = marker
            elif marker[0] == fence[0] and len(marker) >= len(fence):
                fence = None
            continue
        if fence is None:
            yield line


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text in lower case, every character but
    letters, digits, marks, ``_``, ``-`` and spaces dropped, each space a hyphen."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text
    text = HTML_TAG.sub("", text).strip().lower()
    kept = (c for c in text if c in "-_ " or unicodedata.category(c)[0] in "LNM")
    return "".join(kept).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in _prose_lines(path.read_text("utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(found)


def links(path: Path) -> list[str]:
    """The link targets of a Markdown file, code spans and fenced blocks left out."""
    targets = []
    for line in _prose_lines(path.read_text("utf-8")):
        prose = CODE_SPAN.sub("", line)
        targets += [m.group(1) for m in INLINE_LINK.finditer(prose)]
        definition = REFERENCE_DEFINITION.match(line)
        if definition:
            targets.append(definition.group(1))
    return targets


def _relative(path: Path, root: Path = REPO_ROOT) -> str:
    return path.relative_to(root).as_posix()


def problems_of(path: Path, root: Path = REPO_ROOT) -> list[str]:
    """Why the relative links of ``path`` (in the repository at ``root``) do not resolve: empty when
    they all do."""
    problems = []
    for target in links(path):
        if EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / unquote(file_part)).resolve() if file_part else path.resolve()
        if not linked.is_relative_to(root.resolve()):
            problems.append(f"{target}: outside the repository")
            continue
        if not linked.exists():
            problems.append(f"{target}: no such file")
            continue
        if anchor and linked.suffix == ".md" and unquote(anchor) not in anchors(linked):
            problems.append(f"{target}: no heading #{anchor} in {_relative(linked, root.resolve())}")
    return problems


def linked_pages(path: Path) -> set[Path]:
    pages = set()
    for target in links(path):
        file_part = target.partition("#")[0]
        if EXTERNAL.match(target) or not file_part:
            continue
        linked = (path.parent / unquote(file_part)).resolve()
        if linked.is_dir():
            linked = linked / "README.md"
        if linked.suffix == ".md" and linked.is_file():
            pages.add(linked)
    return pages


@pytest.mark.parametrize("path", markdown_files(), ids=_relative)
def test_every_relative_link_resolves(path: Path) -> None:
    assert problems_of(path) == []


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    reached = {README.resolve()}
    frontier = [README.resolve()]
    while frontier:
        for page in linked_pages(frontier.pop()) - reached:
            reached.add(page)
            frontier.append(page)
    unreached = [_relative(p) for p in sorted(DOCS.rglob("*.md")) if p.resolve() not in reached]
    assert unreached == []


# ---- the checker itself -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Two commands", "two-commands"),
        ("Request lifetime and `seq`", "request-lifetime-and-seq"),
        (
            "`ingest`: requests topic → vLLM render + generate → input topic",
            "ingest-requests-topic--vllm-render--generate--input-topic",
        ),
        ("The pipeline's two ends: `ingest` and `gateway`", "the-pipelines-two-ends-ingest-and-gateway"),
        ("Worker ≥ 50% of the pass-through: not met", "worker--50-of-the-pass-through-not-met"),
        ("A resume wakes the fetchers (`confluent`)", "a-resume-wakes-the-fetchers-confluent"),
        ("See [the layout](layout.md) of `max_model_len`", "see-the-layout-of-max_model_len"),
        ("Überblick, 概要", "überblick-概要"),
    ],
)
def test_github_slugs(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug


def test_the_checker_finds_a_broken_file_a_broken_anchor_and_skips_code(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "state.md").write_text("# State\n\n## Keys\n", "utf-8")
    page = docs / "probe.md"
    page.write_text(
        "# Probe\n\n## A heading\n\n## A heading\n\n"
        "[ok](#a-heading) [ok](#a-heading-1) [ok](state.md#keys) [ok](https://example.com/x.md)\n"
        "[missing file](nowhere.md) [missing anchor](state.md#nowhere) [bad](#nowhere)\n"
        "[outside](../../elsewhere.md)\n"
        "`[in code](also-nowhere.md)`\n\n```md\n[in a fence](fenced-nowhere.md)\n```\n",
        "utf-8",
    )
    assert problems_of(page, tmp_path) == [
        "nowhere.md: no such file",
        "state.md#nowhere: no heading #nowhere in docs/state.md",
        "#nowhere: no heading #nowhere in docs/probe.md",
        "../../elsewhere.md: outside the repository",
    ]
