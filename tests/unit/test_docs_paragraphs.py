"""Docs people read: the pages under docs/ and the README are written in paragraphs of a few
lines, with lists, tables and examples for the rest (issue 43 step 7). A paragraph here is a
run of non-blank lines outside code blocks, tables, lists, headings and admonitions, as the
site shows it (a list with no blank line above it is more of the paragraph); a page that
grows a wall of text fails, naming where it starts."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MOST_LINES = 8
# pages not split yet, with their longest paragraph now: it may not grow, and the figure is
# lowered (the page dropped once within MOST_LINES) as they are split
NOT_YET_SPLIT: dict[str, int] = {}
# generated from the settings (docs/reference/generate.py), checked by test_reference_docs
GENERATED = {"docs/reference/cli.md", "docs/reference/configuration.md"}

_FENCE = re.compile(r"^\s*(```|~~~)")
_LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s")
_NOT_PROSE = re.compile(r"^\s*(\||#|!!!|\?\?\?|<|\$\$)")


def pages() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in found if str(p.relative_to(ROOT)) not in GENERATED]


def paragraphs(text: str) -> list[tuple[int, int]]:
    """(first line, number of lines) of every paragraph of a Markdown page, as the site shows
    it. A list runs from its first item to the first line after a blank line that is neither
    indented nor an item (its items' continuation lines are the list's); an indented run
    after a blank line is the list's inside one, else a code block."""
    found: list[tuple[int, int]] = []
    start = length = 0
    kind = ""  # of the run the line belongs to: "" (none yet), "prose", "list", "code"
    fenced = list_open = False
    for number, line in enumerate(text.splitlines(), start=1):
        kind = _kind(line, kind, fenced, list_open)
        if _FENCE.match(line):
            fenced = not fenced
        if kind == "list":
            list_open = True
        elif kind == "prose" or _NOT_PROSE.match(line):
            list_open = False
        if kind == "prose":
            start, length = (start, length + 1) if length else (number, 1)
        elif length:
            found.append((start, length))
            length = 0
    if length:
        found.append((start, length))
    return found


def _kind(line: str, run: str, fenced: bool, list_open: bool) -> str:
    """What `line` is, given the run it follows ("": a blank line or the page's start)."""
    if fenced or _FENCE.match(line) or not line.strip():
        return ""
    if _LIST_ITEM.match(line):
        # Python-Markdown starts a list only after a blank line: an item right under a
        # paragraph's line is shown as more of that paragraph
        return "prose" if run == "prose" else "list"
    if line[:1].isspace() and not run and list_open:
        return "list"
    if line.startswith(("    ", "\t")) and not run:
        return "code"
    if run in ("list", "code"):
        return run
    return "" if _NOT_PROSE.match(line) else "prose"


def longest(page: Path) -> tuple[int, int]:
    """(lines, first line) of the page's longest paragraph; (0, 0) for a page without any."""
    return max(((n, first) for first, n in paragraphs(page.read_text())), default=(0, 0))


def test_no_docs_paragraph_is_a_wall_of_text() -> None:
    long = {}
    for page in pages():
        name = str(page.relative_to(ROOT))
        lines, first = longest(page)
        if lines > NOT_YET_SPLIT.get(name, MOST_LINES):
            long[f"{name}:{first}"] = lines
    assert not long, (
        f"paragraphs over {MOST_LINES} lines (page:first line -> lines); split them, or "
        f"make a list or a table of them: {long}"
    )


def test_a_page_split_since_is_held_to_what_it_reached() -> None:
    loose = {
        name: (cap, longest(ROOT / name)[0])
        for name, cap in NOT_YET_SPLIT.items()
        if longest(ROOT / name)[0] < cap
    }
    assert not loose, (
        f"lower these in NOT_YET_SPLIT (page -> (figure, longest paragraph now)), and drop a "
        f"page within {MOST_LINES}: {loose}"
    )


def test_a_paragraph_ends_at_a_list_a_table_a_code_block_or_a_blank_line() -> None:
    page = "\n".join(
        [
            "one",  # 1
            "two",
            "",
            "- an item",  # 4
            "  its continuation",
            "",
            "    the list's: indented after a blank line inside it",
            "",
            "after the list",  # 9
            "",
            "| a | table |",
            "```",
            "code",
            "```",
            "three",  # 15
            "# heading",
            "four",  # 17
            "five",
            "",
            "    indented after prose and a blank line: code",
            "    more code",
            "",
            "six",  # 23
            "- not a list: no blank line above it",
            "  so the paragraph goes on",
        ]
    )
    assert paragraphs(page) == [(1, 2), (9, 1), (15, 1), (17, 2), (23, 3)]
