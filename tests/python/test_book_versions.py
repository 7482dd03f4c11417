"""Each book chapter presents exactly the versions its solutions hold, in order.

A chapter's versions are the files solutions/<chapter>/v<N>_<name>.cu. Its page must give each a
heading (`## `vN_name`` or deeper) in the order of N and no heading for a version that does not
exist; where the text counts them ("in fourteen versions, `v0` to `v13`") the count and the last
version must match too. Plain text, no build needed.
"""

import re
from pathlib import Path

import pytest
import tool_module

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "book" / "docs"
NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
           "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
           "nineteen", "twenty"]


def chapters() -> list[str]:
    return sorted(p.stem for p in DOCS.glob("[0-9][0-9]_*.md") if (REPO / "solutions" / p.stem).is_dir())


def versions(chapter: str) -> list[str]:
    """The chapter's versions as the grader finds them, in order."""
    return tool_module.load("grade").expected_versions(REPO / "solutions" / chapter)


def test_every_chapter_with_solutions_is_checked():
    assert "06_int4_gemv" in chapters() and "00_roofline" in chapters()


@pytest.mark.parametrize("chapter", chapters())
def test_the_page_heads_each_version_once_in_order(chapter):
    text = (DOCS / f"{chapter}.md").read_text()
    headed = re.findall(r"^#{2,4} `(v\d+_\w+)`", text, re.M)
    assert headed == versions(chapter), f"{chapter}: headings {headed} against solutions {versions(chapter)}"


@pytest.mark.parametrize("chapter", chapters())
def test_a_stated_count_of_versions_matches(chapter):
    text = " ".join((DOCS / f"{chapter}.md").read_text().split())
    have = versions(chapter)
    for word, first, last in re.findall(r"\b(\w+) versions, `(v\d+)` to `(v\d+)`", text):
        assert word.lower() in NUMBERS, f"{chapter}: '{word} versions' is not a count"
        assert NUMBERS.index(word.lower()) == len(have), f"{chapter}: says {word} versions, has {len(have)}"
        assert (first, last) == (have[0].split("_")[0], have[-1].split("_")[0]), f"{chapter}: {first} to {last}"
