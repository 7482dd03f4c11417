"""The README's chapter table is generated from the version registry, and its commands name files
that exist.

The block between `<!-- chapters:begin -->` and `<!-- chapters:end -->` is what `table()` makes
from the registry (`lkw._ext.versions()`, the same data as `tools/bench.py --list`): one row per
chapter, what it is (the title of its book page) and its teaching versions in order, then its
registered peers. After adding a chapter or a version, regenerate it:

    .venv/bin/python tests/python/test_readme.py --write
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
BOOK = REPO / "book" / "docs"
BEGIN, END = "<!-- chapters:begin -->", "<!-- chapters:end -->"
REGENERATE = ".venv/bin/python tests/python/test_readme.py --write"

if str(REPO / "reference") not in sys.path:
    sys.path.insert(0, str(REPO / "reference"))


def _version_key(vid: str) -> tuple[int, str]:
    number = re.match(r"v(\d+)_", vid)
    return (int(number.group(1)) if number else 1 << 30, vid)


def _what(chapter: str) -> str:
    """The title of the chapter's book page without its number: "Roofline: measuring the ceilings"."""
    page = BOOK / f"{chapter}.md"
    if not page.is_file():
        return "—"
    title = page.read_text().splitlines()[0].lstrip("# ").strip()
    return title.split("·", 1)[-1].strip()


def chapters_of(versions: list[dict]) -> dict[str, dict[str, list[str]]]:
    """{chapter: {"versions": [ids in teaching order], "peers": [ids]}} from the registry's entries;
    mutants (deliberately wrong kernels) and ablation entries (a version with one knob off) are not
    part of the path."""
    out: dict[str, dict[str, list[str]]] = {}
    for v in versions:
        entry = out.setdefault(v["chapter"], {"versions": [], "peers": []})
        kind = {"version": "versions", "peer": "peers"}.get(v["kind"])
        if kind and v["id"] not in entry[kind]:
            entry[kind].append(v["id"])
    for entry in out.values():
        entry["versions"].sort(key=_version_key)
    return dict(sorted(out.items()))


def table(versions: list[dict]) -> str:
    """The README's chapter table (the text between the markers, without them)."""
    lines = [
        "| chapter | what | teaching versions, in order |",
        "| --- | --- | --- |",
    ]
    for chapter, entry in chapters_of(versions).items():
        number, name = chapter.split("_", 1)
        link = f"[{number} `{name}`](book/docs/{chapter}.md)" if (BOOK / f"{chapter}.md").is_file() \
            else f"{number} `{name}`"
        path = " → ".join(f"`{v}`" for v in entry["versions"]) or "—"
        if entry["peers"]:
            path += "; peers " + ", ".join(f"`{p}`" for p in entry["peers"])
        lines.append(f"| {link} | {_what(chapter)} | {path} |")
    return "\n".join(lines)


def block(text: str) -> str:
    if BEGIN not in text or END not in text:
        raise ValueError(f"README.md has no {BEGIN} … {END} block")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def write(versions: list[dict]) -> None:
    text = README.read_text()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    README.write_text(f"{head}{BEGIN}\n{table(versions)}\n{END}{tail}")


def solution_chapters() -> list[str]:
    return sorted(p.name for p in (REPO / "solutions").glob("[0-9][0-9]_*") if p.is_dir())


# ---- the tests ----------------------------------------------------------------------------------


def _registry():
    import pytest

    try:
        from lkw import _ext
    except ImportError as e:
        pytest.skip(f"the extension lkw._ext is not built (tools/setup.sh builds it into build/): {e}")
    versions = _ext.versions()
    built = {v["chapter"] for v in versions}
    missing = [c for c in solution_chapters() if c not in built]
    if missing:
        pytest.skip(f"the extension was built for some chapters only (LKW_ONLY): {', '.join(missing)} "
                    "not in its registry")
    return versions


def test_chapter_table_is_generated_from_the_registry():
    versions = _registry()
    assert block(README.read_text()) == table(versions), (
        f"README.md's chapter table differs from the registry: run `{REGENERATE}`"
    )


def test_every_chapter_has_a_teaching_path():
    for chapter, entry in chapters_of(_registry()).items():
        assert entry["versions"] and entry["versions"][0].startswith("v0_"), (
            f"{chapter}: the teaching path does not start at a v0_ version: {entry['versions']}"
        )


def test_roadmap_names_only_chapters_not_yet_written():
    roadmap = next((line for line in README.read_text().splitlines() if line.startswith("Roadmap")), None)
    assert roadmap, "README.md has no Roadmap line"
    written = {c.split("_", 1)[0] for c in solution_chapters()}
    for number, name in re.findall(r"(\d\d) `([a-z0-9_]+)`", roadmap):
        assert number not in written, f"the roadmap names {number} {name}, which is written"


def test_commands_name_files_that_exist():
    text = README.read_text()
    for path in sorted(set(re.findall(r"\b((?:tools|book|notebooks|autograder)/[\w./-]*\w)", text))):
        if "NN_" not in path:  # NN_topic: a placeholder for any chapter
            assert (REPO / path).exists(), f"README.md names {path}, which does not exist"


def test_commands_work_without_activating_the_venv():
    # Bare `python tools/...` fails outside the venv (issue 43): the venv's Python is named.
    text = README.read_text()
    assert not re.search(r"(?<![\w/.])python tools/", text), "a bare `python tools/...` in README.md"
    assert "source .venv" not in text and "bin/activate" not in text, "README.md activates the venv"


if __name__ == "__main__":
    from lkw import _ext

    if sys.argv[1:] == ["--write"]:
        write(_ext.versions())
        print("README.md: chapter table rewritten from the registry")
    else:
        print(table(_ext.versions()))
