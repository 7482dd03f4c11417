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

The skeleton compiles, and its tests fail until the reader fills in the TODOs; the check mode
proves that the checked-in chapters/ is exactly what this tool makes from solutions/.

Run from anywhere (standard library only, so a plain python3 works):

    python3 tools/exercises.py                       # regenerate chapters/, removing stale files
    python3 tools/exercises.py --check               # exit 1 and list the drift if out of sync
    python3 tools/exercises.py --chapter 01_formats  # only one chapter (either mode)

Marker mistakes (unbalanced or nested markers, a STUB outside a region, an empty region, a
misspelled marker, a hint longer than 3 TODO lines) stop the tool with `file:line: what is wrong`
and exit status 2.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
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
    out = [generated_header(origin)]
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
            out.extend(region.todo(origin))
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
    return "".join(out)


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


def expected_files(root: Path, chapter: str | None = None) -> dict[str, bytes]:
    """What chapters/ must hold: {path relative to chapters/: content}."""
    solutions = root / "solutions"
    chapters = [chapter] if chapter else chapter_names(solutions)
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


def actual_files(root: Path, chapter: str | None = None) -> dict[str, bytes]:
    """What chapters/ holds now (every file, so that strays are found too)."""
    chapters = root / "chapters"
    folder = chapters / chapter if chapter else chapters
    if not folder.is_dir():
        return {}
    return {
        p.relative_to(chapters).as_posix(): p.read_bytes()
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


def write_files(root: Path, expected: dict[str, bytes], drift: Drift, chapter: str | None) -> None:
    """Brings chapters/ in line with expected: writes missing and changed files, removes stale
    ones and the folders they leave empty."""
    chapters = root / "chapters"
    for path in drift.missing + drift.changed:
        target = chapters / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(expected[path])
    for path in drift.stale:
        (chapters / path).unlink()
    scope = chapters / chapter if chapter else chapters
    if scope.is_dir():
        for folder in sorted((p for p in scope.rglob("*") if p.is_dir()), reverse=True):
            if not any(folder.iterdir()):
                folder.rmdir()
        if chapter and not any(scope.iterdir()):
            scope.rmdir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="report drift instead of writing")
    parser.add_argument("--chapter", help="only this chapter, e.g. 01_formats")
    parser.add_argument(
        "--root", type=Path, default=REPO, help="repository root (default: this one)"
    )
    args = parser.parse_args(argv)
    root = args.root.resolve()

    if args.chapter is not None:
        known = set(chapter_names(root / "solutions")) | set(chapter_names(root / "chapters"))
        if args.chapter not in known:
            print(
                f"exercises: no chapter {args.chapter} in solutions/ or chapters/", file=sys.stderr
            )
            return 2
    try:
        expected = expected_files(root, args.chapter)
    except MarkerError as e:
        print(f"exercises: {e}", file=sys.stderr)
        return 2
    actual = actual_files(root, args.chapter)
    drift = find_drift(expected, actual)
    scope = f"chapters/{args.chapter}" if args.chapter else "chapters/"

    if args.check:
        if drift:
            print(
                f"exercises: {scope} is out of sync with solutions/:\n"
                f"{describe_drift(drift, expected, actual)}\n"
                "Regenerate it with: python3 tools/exercises.py"
                + (f" --chapter {args.chapter}" if args.chapter else ""),
                file=sys.stderr,
            )
            return 1
        print(f"exercises: {scope} is in sync with solutions/ ({len(expected)} files)")
        return 0

    write_files(root, expected, drift, args.chapter)
    print(
        f"exercises: {scope}: {len(expected)} files, {len(drift.missing)} written new,"
        f" {len(drift.changed)} updated, {len(drift.stale)} stale removed"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
