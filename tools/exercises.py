"""Exercise generator: writes chapters/ (the student skeletons) from solutions/ (the single source).

Every file under solutions/NN_topic/ is copied to chapters/NN_topic/, except that each solution
region in a C++/CUDA source is replaced by a short TODO that says what to write and roughly how
many lines it takes:

    solutions/01_formats/formats_bits.cuh:
      // BEGIN SOLUTION: round to nearest even.
      const uint32_t lsb = (x >> 16) & 1;
      return uint16_t((x + 0x7FFF + lsb) >> 16);
      // STUB: return 0;
      // END SOLUTION

    chapters/01_formats/formats_bits.cuh:
      // TODO(exercise): round to nearest even. (about 2 lines)
      return 0;

The hint (the text after `BEGIN SOLUTION:`) may go on over the lines right below the marker,
each written `//   more hint` (three spaces after the slashes) at the marker's indentation, so
that the source too keeps to 100 columns. The TODO is the hint wrapped into lines of at most
100 characters (continuation lines `//   ...` at the same indentation), ending in the line
count; a hint that needs more than 3 such lines is an error: a TODO is a hint, not the solution.

A `// STUB: <code>` line inside a region is a comment in the solution and becomes real code (at the
same indentation) in the exercise, so that the skeleton still compiles, e.g. a function that must
return a value. The line count is that of the region's non-blank, non-STUB lines. Markers may also
be written as /* ... */ comments; each stands alone on its line. Every other line and every other
file (peers, mutants, headers without regions) is copied verbatim. Each generated C++/CUDA file
starts with one comment line naming its source, so nobody edits the copy by mistake.

The skeleton compiles, and its tests fail until the reader fills in the TODOs.

Run from anywhere (standard library only, so a plain python3 works):

    python3 tools/exercises.py                       # regenerate chapters/, removing stale files
    python3 tools/exercises.py --chapter 01_formats  # only these chapters (any mode; repeatable)
    python3 tools/exercises.py --check               # test the generator (below)
    python3 tools/exercises.py --check --strict      # CI: also fail if chapters/ is out of sync
    python3 tools/exercises.py --export DIR --chapter 04_rmsnorm   # a student hand-out

Regeneration never overwrites a learner's work silently: a file it would rewrite whose TODO
region no longer holds its generated TODO (solved, or code written under it, or its STUB
replaced), or a file it would remove that it did not write, stops it with `chapters/F:LINE`
and exit status 1; --force overwrites. A hint changed in solutions/ is not an edit.

--check tests the generator, not chapters/: it generates twice, writes the result into a
temporary directory and reads it back byte-identically, and no solution marker may survive.
A learner's edits of chapters/ are reported as a note; --strict makes any drift an error.

--export DIR writes a standalone student repository (DIR must be empty, or --force): the chosen
chapters as exercises (chapter 00, the ceiling that 06 also links, always), the headers of other
chapters that they include given solved (markers dropped; listed in DIR/README.md) unless that
chapter is exported too, common/, reference/, the chapters' tests (tests/cpp, the Python tests
of the references and the grader), the learner's tools (lab.sh, grade.py, ...), CMakeLists.txt,
requirements.txt, the chapters' notebooks, book pages and results, and no solutions/. In a tree
without solutions/ this tool refuses to run (exit 2), so it never empties a hand-out.

Marker mistakes (unbalanced or nested markers, a STUB outside a region, an empty region, a
misspelled marker, a hint longer than 3 TODO lines) stop the tool with `file:line: what is wrong`
and exit status 2.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHAPTER_NAME = re.compile(r"^\d\d_[a-z0-9_]+$")
SOURCE_SUFFIXES = {".cu", ".cuh", ".h", ".hpp", ".cc", ".cpp"}

# A marker is a whole line: indentation, a // or /* comment, the keyword, optional */.
BEGIN_MARKER = re.compile(
    r"^(?P<indent>[ \t]*)(?://|/\*)[ \t]*BEGIN SOLUTION"
    r"(?::[ \t]*(?P<hint>.*?))?[ \t]*(?:\*/)?[ \t]*$"
)
END_MARKER = re.compile(r"^[ \t]*(?://|/\*)[ \t]*END SOLUTION[ \t]*(?:\*/)?[ \t]*$")
STUB_LINE = re.compile(r"^(?P<indent>[ \t]*)//[ \t]*STUB:[ \t]?(?P<code>.*?)[ \t]*$")
# A hint goes on over the comment lines right below its BEGIN marker written `//   more hint`.
HINT_CONTINUATION = re.compile(r"^(?P<indent>[ \t]*)//   [ \t]*(?P<text>\S.*?)[ \t]*$")
# Anything that looks like a marker but did not parse as one is an error, not silently copied.
MARKER_LIKE = re.compile(r"(//|/\*).*\b(BEGIN[ _]SOLUTION|END[ _]SOLUTION)|^[ \t]*//[ \t]*STUB\b")


# A TODO is at most TODO_LINES lines of at most TODO_WIDTH characters, indentation included.
TODO_WIDTH = 100
TODO_LINES = 3


class MarkerError(Exception):
    """A malformed solution region, reported as `file:line: message`."""


def wrap_todo(indent: str, hint: str, suffix: str, width: int = TODO_WIDTH) -> list[str]:
    """`// TODO(exercise): hint suffix` wrapped at word boundaries into lines of at most width
    characters, continuation lines starting `//   ` at the same indentation. The suffix (the line
    count) stays whole; a single word longer than a line gets a line of its own."""
    lines = [f"{indent}// TODO(exercise):"]
    words_on_line = 0
    for word in [*hint.split(), suffix]:
        if words_on_line and len(lines[-1]) + 1 + len(word) > width:
            lines.append(f"{indent}//  ")
            words_on_line = 0
        lines[-1] += " " + word
        words_on_line += 1
    return lines


@dataclass
class Region:
    line: int  # line number of its BEGIN marker
    indent: str
    hint: str
    newline: str
    code_lines: int = 0
    stub_lines: list[str] = field(default_factory=list)

    def todo(self, origin: str) -> list[str]:
        hint = self.hint or "write this part"
        plural = "" if self.code_lines == 1 else "s"
        lines = wrap_todo(self.indent, hint, f"(about {self.code_lines} line{plural})")
        if len(lines) > TODO_LINES or max(map(len, lines)) > TODO_WIDTH:
            raise MarkerError(
                f"{origin}:{self.line}: hint too long for a TODO of at most {TODO_LINES} lines of"
                f" {TODO_WIDTH} characters (it makes {len(lines)}, the longest"
                f" {max(map(len, lines))}): shorten it"
            )
        return [line + self.newline for line in lines] + self.stub_lines


def generated_header(origin: str) -> str:
    return f"// Generated by tools/exercises.py from {origin}: do not edit by hand.\n"


def exercise_text(text: str, origin: str) -> str:
    """The exercise version of one source file's text; origin (e.g. solutions/00_x/v0.cu) names
    the file in the header line and in error messages."""
    return exercise_text_and_spans(text, origin)[0]


def exercise_text_and_spans(text: str, origin: str) -> tuple[str, list[tuple[int, int]]]:
    """The exercise text and, for each region, the [start, end) 0-based line span of its TODO
    block there (the TODO lines and the STUB lines)."""
    out = [generated_header(origin)]
    spans: list[tuple[int, int]] = []
    region: Region | None = None
    in_hint = False  # the lines so far since BEGIN all continued its hint
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        body = line.rstrip("\r\n")
        newline = line[len(body) :] or "\n"
        where = f"{origin}:{number}"
        begin = BEGIN_MARKER.match(body)
        stub = STUB_LINE.match(body)
        more = HINT_CONTINUATION.match(body) if in_hint else None
        in_hint = False
        if begin:
            if region:
                raise MarkerError(
                    f"{where}: BEGIN SOLUTION inside the region opened at line {region.line}"
                    " (regions do not nest)"
                )
            region = Region(number, begin["indent"], begin["hint"] or "", newline)
            in_hint = True
        elif END_MARKER.match(body):
            if not region:
                raise MarkerError(f"{where}: END SOLUTION without a BEGIN SOLUTION before it")
            if region.code_lines == 0:
                raise MarkerError(
                    f"{origin}:{region.line}: solution region has no code lines to hide"
                )
            block = region.todo(origin)
            spans.append((len(out), len(out) + len(block)))
            out.extend(block)
            region = None
        elif stub:
            if not region:
                raise MarkerError(f"{where}: STUB line outside a solution region")
            if not stub["code"]:
                raise MarkerError(f"{where}: STUB line with no code after 'STUB:'")
            region.stub_lines.append(stub["indent"] + stub["code"] + newline)
        elif MARKER_LIKE.search(body):
            raise MarkerError(
                f"{where}: malformed marker (write '// BEGIN SOLUTION: hint', '// END SOLUTION'"
                f" or '// STUB: code' alone on a line): {body.strip()}"
            )
        elif more and more["indent"] == region.indent:
            region.hint = f"{region.hint} {more['text']}".strip()
            in_hint = True
        elif region:
            region.code_lines += bool(body.strip())
        else:
            out.append(line)
    if region:
        raise MarkerError(f"{origin}:{region.line}: BEGIN SOLUTION is never closed by END SOLUTION")
    return "".join(out), spans


def chapter_names(tree: Path) -> list[str]:
    if not tree.is_dir():
        return []
    return sorted(p.name for p in tree.iterdir() if p.is_dir() and CHAPTER_NAME.match(p.name))


def _files_under(folder: Path) -> list[Path]:
    """Every file below folder, skipping hidden files and Python caches."""
    if not folder.is_dir():
        return []
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and not any(
            part.startswith(".") or part == "__pycache__" for part in p.relative_to(folder).parts
        )
    )


def _chapter_list(chapter: str | list[str] | None, tree: Path) -> list[str]:
    if not chapter:
        return chapter_names(tree)
    return [chapter] if isinstance(chapter, str) else list(chapter)


def expected_files(root: Path, chapter: str | list[str] | None = None) -> dict[str, bytes]:
    """What chapters/ must hold: {path relative to chapters/: content}."""
    solutions = root / "solutions"
    chapters = _chapter_list(chapter, solutions)
    expected = {}
    for name in chapters:
        for path in _files_under(solutions / name):
            relative = path.relative_to(solutions).as_posix()
            data = path.read_bytes()
            if path.suffix in SOURCE_SUFFIXES:
                origin = f"solutions/{relative}"
                data = exercise_text(data.decode("utf-8"), origin).encode("utf-8")
            expected[relative] = data
    return expected


def actual_files(root: Path, chapter: str | list[str] | None = None) -> dict[str, bytes]:
    """What chapters/ holds now (every file, so that strays are found too)."""
    chapters = root / "chapters"
    folders = [chapters / c for c in _chapter_list(chapter, chapters)] if chapter else [chapters]
    return {
        p.relative_to(chapters).as_posix(): p.read_bytes()
        for folder in folders
        if folder.is_dir()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@dataclass
class Drift:
    missing: list[str]  # generated but absent from chapters/
    stale: list[str]  # in chapters/ but not generated from anything
    changed: list[str]  # present in both with different content

    def __bool__(self) -> bool:
        return bool(self.missing or self.stale or self.changed)


def find_drift(expected: dict[str, bytes], actual: dict[str, bytes]) -> Drift:
    return Drift(
        missing=sorted(set(expected) - set(actual)),
        stale=sorted(set(actual) - set(expected)),
        changed=sorted(p for p in set(expected) & set(actual) if expected[p] != actual[p]),
    )


def describe_drift(
    drift: Drift, expected: dict[str, bytes], actual: dict[str, bytes], diff_lines: int = 12
) -> str:
    """A readable summary: each file's state, with the first lines of each content diff."""
    lines = []
    for path in drift.missing:
        lines.append(f"  missing   chapters/{path}")
    for path in drift.stale:
        lines.append(f"  stale     chapters/{path} (no source in solutions/)")
    for path in drift.changed:
        lines.append(f"  differs   chapters/{path}")
        diff = difflib.unified_diff(
            actual[path].decode("utf-8", "replace").splitlines(),
            expected[path].decode("utf-8", "replace").splitlines(),
            f"chapters/{path} (checked in)",
            f"chapters/{path} (generated)",
            lineterm="",
        )
        shown = list(diff)
        lines.extend("      " + d for d in shown[:diff_lines])
        if len(shown) > diff_lines:
            lines.append(f"      ... {len(shown) - diff_lines} more diff lines")
    return "\n".join(lines)


def write_files(
    root: Path, expected: dict[str, bytes], drift: Drift, chapter: str | list[str] | None
) -> None:
    """Brings chapters/ in line with expected: writes missing and changed files, removes stale
    ones and the folders they leave empty."""
    chapters = root / "chapters"
    for path in drift.missing + drift.changed:
        target = chapters / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(expected[path])
    for path in drift.stale:
        (chapters / path).unlink()
    scopes = [chapters / c for c in _chapter_list(chapter, chapters)] if chapter else [chapters]
    for scope in scopes:
        if scope.is_dir():
            for folder in sorted((p for p in scope.rglob("*") if p.is_dir()), reverse=True):
                if not any(folder.iterdir()):
                    folder.rmdir()
            if chapter and not any(scope.iterdir()):
                scope.rmdir()


# ---------------------------------------------------------------------------------------------
# A learner's edits: regeneration does not overwrite a TODO region that no longer holds its TODO

TODO_LINE = re.compile(r"^[ \t]*//[ \t]*TODO\(exercise\):")
TODO_MORE = re.compile(r"^[ \t]*//   ")


def _is_todo_comment(line: str) -> bool:
    return bool(TODO_LINE.match(line) or TODO_MORE.match(line))


def edited_regions(current: str, generated: str, spans: list[tuple[int, int]]) -> list[int]:
    """1-based lines of `current` (a file of chapters/ as it is now) where a TODO block of the
    freshly `generated` text ([start, end) line spans) no longer holds its TODO. The two texts
    are aligned line by line; a block is edited when its lines are not all there unchanged, or
    lines were added inside it or right after it, unless what stands there instead is just a
    generated TODO with another hint or line count (a change in solutions/, not a learner's)."""
    old, new = current.splitlines(), generated.splitlines()
    opcodes = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    found = []
    for start, end in spans:
        touching = [
            op
            for op in opcodes
            if op[0] != "equal"
            and (
                (op[3] < end and op[4] > start)  # replaces or drops lines of the block
                or (op[3] == op[4] and start < op[3] <= end)  # adds lines inside or right after
            )
        ]
        if not touching:
            continue
        there = [line for op in touching for line in old[op[1] : op[2]]]
        stubs = [line for line in new[start:end] if not _is_todo_comment(line)]
        code_there = [line for line in there if not _is_todo_comment(line)]
        if there and TODO_LINE.match(there[0]) and code_there in ([], stubs):
            continue  # the hint (or the line count) changed in solutions/
        found.append(min(op[1] for op in touching) + 1)
    return found


def protected_edits(root: Path, expected: dict[str, bytes], drift: Drift) -> list[str]:
    """`chapters/<file>:<line>: ...` for each TODO region that a learner edited in a file that
    regeneration would overwrite, and for each file it would remove that it did not write."""
    found = []
    chapters, solutions = root / "chapters", root / "solutions"
    for path in drift.changed:
        source = solutions / path
        if source.suffix not in SOURCE_SUFFIXES or not source.is_file():
            continue
        generated, spans = exercise_text_and_spans(
            source.read_text(encoding="utf-8"), f"solutions/{path}"
        )
        current = (chapters / path).read_bytes().decode("utf-8", "replace")
        for line in edited_regions(current, generated, spans):
            found.append(f"chapters/{path}:{line}: a TODO region edited here (solved?)")
    for path in drift.stale:
        head = (chapters / path).read_bytes()[:100].decode("utf-8", "replace")
        if not head.startswith("// Generated by tools/exercises.py"):
            found.append(f"chapters/{path}:1: not written by this tool (a file of yours?)")
    return found


# ---------------------------------------------------------------------------------------------
# The check: the generator, run into a temporary directory


def check_generator(root: Path, chapters: list[str] | None) -> tuple[dict[str, bytes], list[str]]:
    """Generates twice, writes the result into a temporary directory and reads it back: the
    files must come back byte-identical, both runs must agree, every chapter of solutions/ must
    give files, and no solution marker may survive into a generated file. Returns the files
    and the problems (empty: the generator works). Raises MarkerError."""
    problems = []
    first = expected_files(root, chapters)
    second = expected_files(root, chapters)
    if first != second:
        problems.append("two runs of the generator disagree (it is not deterministic)")
    with tempfile.TemporaryDirectory(prefix="lkw_exercises_") as tmp:
        write_files(Path(tmp), first, find_drift(first, {}), None)
        back = actual_files(Path(tmp))
    drift = find_drift(first, back)
    if drift:
        problems.append(
            "written into a temporary directory, the files do not come back byte-identical:\n"
            + describe_drift(drift, first, back)
        )
    for chapter in chapters or chapter_names(root / "solutions"):
        if not any(path.startswith(f"{chapter}/") for path in first):
            problems.append(f"solutions/{chapter} gives no file")
    for path, data in first.items():
        if Path(path).suffix in SOURCE_SUFFIXES:
            for number, line in enumerate(data.decode("utf-8").splitlines(), start=1):
                if MARKER_LIKE.search(line):
                    problems.append(f"chapters/{path}:{number}: a solution marker survived")
    return first, problems


# ---------------------------------------------------------------------------------------------
# The student hand-out (--export DIR)

INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"(?P<path>[^"]+)"', re.MULTILINE)
EXPORT_TOOLS = (
    "lab.sh",
    "grade.py",
    "exercises.py",
    "sass_check.cu",
    "setup.sh",
    "bench.py",
    "device_check.sh",
)
EXPORT_TOP = ("CMakeLists.txt", "requirements.txt", "ruff.toml", ".clang-format", ".gitignore")
# Python tests a student can run: the references, the golden data, the grader (no solutions/).
EXPORT_PY_TESTS = ("conftest.py", "tool_module.py", "test_golden.py", "test_grade.py")
ALWAYS_EXPORTED = "00_roofline"  # the copy ceiling every chapter measures against; 06 links it


def solved_text(text: str, origin: str) -> str:
    """A solution file as given solved in a hand-out: the code of its regions kept, the marker,
    hint and STUB lines dropped, one header line saying so."""
    exercise_text(text, origin)  # the same marker errors as generating it
    out = [f"// Given solved by tools/exercises.py --export from {origin}: not an exercise here.\n"]
    in_hint = False
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        begin = BEGIN_MARKER.match(body)
        more = HINT_CONTINUATION.match(body) if in_hint else None
        in_hint = bool(begin) or (bool(more) and in_hint)
        if begin or more or END_MARKER.match(body) or STUB_LINE.match(body):
            continue
        out.append(line)
    return "".join(out)


def chapter_includes(root: Path, chapter: str) -> list[str]:
    """The files of other chapters ("NN_topic/file") that a chapter's sources and its tests
    include, and what those include in turn, as paths relative to solutions/."""
    solutions = root / "solutions"
    pending = [*_files_under(solutions / chapter), *_files_under(root / "tests/cpp" / chapter)]
    seen: set[Path] = set()
    found: list[str] = []
    while pending:
        path = pending.pop()
        if path in seen or path.suffix not in SOURCE_SUFFIXES:
            continue
        seen.add(path)
        for match in INCLUDE.finditer(path.read_text(encoding="utf-8", errors="replace")):
            name = match["path"]
            target = solutions / name
            if CHAPTER_NAME.match(name.split("/")[0]) and target.is_file():
                if name.split("/")[0] != chapter and name not in found:
                    found.append(name)
                pending.append(target)
            elif path.is_relative_to(solutions) and (path.parent / name).is_file():
                local = (path.parent / name).resolve()  # "dequant.cuh" beside an included header
                relative = local.relative_to(solutions.resolve()).as_posix()
                if relative.split("/")[0] != chapter and relative not in found:
                    found.append(relative)
                pending.append(local)
    return sorted(found)


def export_plan(root: Path, chosen: list[str]) -> tuple[dict[str, bytes], dict[str, list[str]]]:
    """{path in the hand-out: content} and {solved header: the chapters that include it}."""
    chapters = sorted({ALWAYS_EXPORTED, *chosen} & set(chapter_names(root / "solutions")))
    files = {f"chapters/{p}": data for p, data in expected_files(root, chapters).items()}
    solved: dict[str, list[str]] = {}
    for chapter in chapters:
        for name in chapter_includes(root, chapter):
            if name.split("/")[0] not in chapters:  # an exported chapter's own (TODO) copy wins
                solved.setdefault(name, []).append(chapter)
    for name in solved:
        text = (root / "solutions" / name).read_text(encoding="utf-8")
        files[f"chapters/{name}"] = solved_text(text, f"solutions/{name}").encode("utf-8")

    def tree(folder: str) -> None:
        for path in _files_under(root / folder):
            if path.suffix != ".pyc":
                files[path.relative_to(root).as_posix()] = path.read_bytes()

    def file(relative: str) -> None:
        if (root / relative).is_file():
            files[relative] = (root / relative).read_bytes()

    tree("common")
    tree("reference")
    for name in EXPORT_TOP:
        file(name)
    for name in EXPORT_TOOLS:
        file(f"tools/{name}")
    if "06_int4_gemv" in chapters:
        file("tools/gemv_probe.cu")  # chapter 06's weight-stream probe (CMake builds it with 06)
    for path in (root / "tests/cpp").glob("*"):
        if path.is_file():
            file(path.relative_to(root).as_posix())
    for name in EXPORT_PY_TESTS:
        file(f"tests/python/{name}")
    for path in (root / "tests/python").glob("test_*_reference.py"):
        file(path.relative_to(root).as_posix())
    if "01_formats" in chapters:
        file("tests/python/test_grade_chapter.py")  # grades chapters/01_formats (needs nvcc)
    for chapter in chapters:
        tree(f"tests/cpp/{chapter}")
        file(f"notebooks/{chapter}.ipynb")
        file(f"notebooks/{chapter}.py")
        file(f"book/docs/{chapter}.md")
        notes = f"book/docs/lab_notes_{chapter[:2]}.md"  # the appendix the chapter's page links to
        if (root / notes).is_file():
            file(notes)
        for path in (root / "results").rglob(f"*{chapter}*"):
            if path.is_file():
                file(path.relative_to(root).as_posix())
    files["README.md"] = handout_readme(chapters, chosen, solved, root).encode("utf-8")
    return files, solved


HANDOUT_README = """\
# LLM Kernel Workbook: student hand-out

Chapters: {chapters}.

Each `// TODO(exercise): ...` in `chapters/NN_topic/` is yours to write (the hint says what,
and about how many lines); the tests, the golden data (from the Python reference in
`reference/`) and the grader check it.

    tools/setup.sh --venv          # the Python environment (.venv), once
    tools/lab.sh {first} test      # build the chapter, run its tests
    tools/lab.sh {first} grade     # a score per version (tools/grade.py)

Correctness needs an sm_80+ GPU: without one the GPU tests skip and score nothing, and the
grader shows what it can check without one (host checks, the SASS facts of each version).
"""
CEILING_NOTE = """
`chapters/{name}` comes with every hand-out: it measures the copy ceiling the other chapters
compare against, and chapter 06 links its cuBLAS peer.
"""
SOLVED_NOTE = """
## These files are given solved

Headers of earlier chapters that these chapters include, copied from the solutions so that
they build; they are not part of your work here:

"""
SHARED_NOTE = """
## Chapters that use your earlier work

These includes read another chapter's exercise files: finish that chapter first.

"""


def has_regions(path: Path) -> bool:
    return any(BEGIN_MARKER.match(line) for line in path.read_text(encoding="utf-8").splitlines())


def handout_readme(
    chapters: list[str], chosen: list[str], solved: dict[str, list[str]], root: Path
) -> str:
    first = next((c for c in chosen if c != ALWAYS_EXPORTED), chapters[0])
    text = HANDOUT_README.format(chapters=", ".join(chapters), first=first)
    if ALWAYS_EXPORTED not in chosen:
        text += CEILING_NOTE.format(name=ALWAYS_EXPORTED)
    if solved:
        text += SOLVED_NOTE + "".join(
            f"- `chapters/{name}` (included by {', '.join(users)})\n"
            for name, users in sorted(solved.items())
        )
    shared = sorted(
        {
            f"- `chapters/{chapter}` includes `chapters/{name}`\n"
            for chapter in chapters
            for name in chapter_includes(root, chapter)
            if name.split("/")[0] in chapters and has_regions(root / "solutions" / name)
        }
    )
    if shared:
        text += SHARED_NOTE + "".join(shared)
    return (
        text
        + "\nWritten by `tools/exercises.py --export`; the solutions are not in this hand-out.\n"
    )


def export(root: Path, out: Path, chosen: list[str], force: bool) -> int:
    if out.exists() and any(out.iterdir()) and not force:
        print(f"exercises: {out} is not empty (pass --force to write into it)", file=sys.stderr)
        return 1
    if out.resolve() == root.resolve() or root.resolve().is_relative_to(out.resolve()):
        print(f"exercises: {out} would overwrite the workbook itself", file=sys.stderr)
        return 2
    files, solved = export_plan(root, chosen)
    for relative, data in files.items():
        target = out / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        source = root / relative
        if source.is_file() and os.access(source, os.X_OK):
            target.chmod(target.stat().st_mode | 0o111)
    print(
        f"exercises: hand-out in {out}: {len(files)} files, chapters"
        f" {', '.join(sorted({ALWAYS_EXPORTED, *chosen}))}; {len(solved)} solved header(s) of"
        " other chapters (listed in its README.md); no solutions/"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="test the generator (solutions/ into a temporary directory); chapters/ is not judged",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="with --check: also fail when the checked-in chapters/ differs (CI's sync check)",
    )
    parser.add_argument(
        "--force", action="store_true", help="overwrite edited TODO regions / a non-empty DIR"
    )
    parser.add_argument(
        "--chapter",
        "--chapters",
        dest="chapters",
        action="extend",
        nargs="+",
        help="only these chapters, e.g. 01_formats (repeatable)",
    )
    parser.add_argument("--export", type=Path, metavar="DIR", help="write a student hand-out")
    parser.add_argument(
        "--root", type=Path, default=REPO, help="repository root (default: this one)"
    )
    args = parser.parse_args(argv)
    root = args.root.resolve()
    chosen = list(dict.fromkeys(args.chapters or []))

    if not (root / "solutions").is_dir():
        print(
            "exercises: no solutions/ here (a student hand-out?): nothing to generate from",
            file=sys.stderr,
        )
        return 2
    known = set(chapter_names(root / "solutions")) | set(chapter_names(root / "chapters"))
    for chapter in chosen:
        if chapter not in known:
            print(f"exercises: no chapter {chapter} in solutions/ or chapters/", file=sys.stderr)
            return 2
    scope = "chapters/" + (",".join(chosen) if chosen else "")
    try:
        if args.export:
            return export(
                root, args.export, chosen or chapter_names(root / "solutions"), args.force
            )
        if args.check:
            expected, problems = check_generator(root, chosen or None)
        else:
            expected, problems = expected_files(root, chosen or None), []
    except MarkerError as e:
        print(f"exercises: {e}", file=sys.stderr)
        return 2
    actual = actual_files(root, chosen or None)
    drift = find_drift(expected, actual)
    hint = "python3 tools/exercises.py" + "".join(f" --chapter {c}" for c in chosen)

    if args.check:
        if problems:
            print(
                "exercises: the generator is broken:\n  " + "\n  ".join(problems), file=sys.stderr
            )
            return 1
        print(
            f"exercises: solutions/ -> {scope} regenerates byte-identically ({len(expected)} files,"
            " in a temporary directory)"
        )
        if drift and args.strict:
            print(
                f"exercises: {scope} is out of sync with solutions/:\n"
                f"{describe_drift(drift, expected, actual)}\nRegenerate it with: {hint}",
                file=sys.stderr,
            )
            return 1
        if drift:
            print(
                f"exercises: note: {scope} differs from the generated exercises in"
                f" {len(drift.missing) + len(drift.stale) + len(drift.changed)} files (edits of"
                " yours are fine; --check --strict fails on it)"
            )
        elif args.strict:
            print(f"exercises: {scope} is in sync with solutions/ ({len(expected)} files)")
        return 0

    edits = [] if args.force else protected_edits(root, expected, drift)
    if edits:
        print(
            "exercises: not regenerating: these would be overwritten or removed:\n  "
            + "\n  ".join(edits)
            + f"\nKeep your work elsewhere, or overwrite it with: {hint} --force",
            file=sys.stderr,
        )
        return 1
    write_files(root, expected, drift, chosen or None)
    print(
        f"exercises: {scope}: {len(expected)} files, {len(drift.missing)} written new,"
        f" {len(drift.changed)} updated, {len(drift.stale)} stale removed"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
