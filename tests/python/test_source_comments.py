"""Source comments say why, never log measurements: no times, dates or commit hashes in the kernel
trees (the measured figures live in results/ and the book). A bound's derivation may name a time
next to the bandwidth it comes from ("117 MB, 28 µs at 4.17 TB/s")."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIME = re.compile(r"\b[0-9][0-9.]* ?(us|µs)\b")
DATE = re.compile(r"\b20[0-9]{2}-[0-9]{2}-[0-9]{2}\b")
COMMIT = re.compile(r"\bcommits? [0-9a-f]{7,40}\b")
SOURCES = (".cu", ".cuh", ".h", ".hpp", ".cc", ".cpp")


def _files():
    for top in ("solutions", "chapters", "common"):
        yield from (p for p in sorted((REPO / top).rglob("*")) if p.suffix in SOURCES)


def test_no_measurement_logs_in_kernel_sources():
    logs = []
    for path in _files():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "//" not in line and "/*" not in line and not line.lstrip().startswith("*"):
                continue
            bound = "TB/s" in line or "GB/s" in line
            if (TIME.search(line) and not bound) or DATE.search(line) or COMMIT.search(line):
                logs.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:120]}")
    assert not logs, "measurement logs in source comments:\n" + "\n".join(logs[:20])


def test_the_check_sees_a_log():
    assert TIME.search("// 31.2 µs back to back") and DATE.search("// (H200, 2026-12-03)")
    assert COMMIT.search("// the bench of commit cca4c62") and not TIME.search("// 64 useful bytes")


# Chapters of several op families, each with its own lesson path: their files are named
# vN_<family>_what_changed.cu (one version numbering for the chapter, as the grader orders it).
FAMILIES = {"05_elementwise": ("act", "rope", "qk", "cache", "qkv"), "09_moe": ("align", "topk", "grouped", "sum")}
# Chapter 07's two ops are one teaching path; a version's family is the op it registers (the
# natural layout's w4a16_gemm or the repacked w4a16r_gemm).
OP_FAMILIES = {"07_w4a16_gemm": (("kW4a16rGemm", "w4a16r_gemm"), ("kW4a16Gemm", "w4a16_gemm"))}


def _family(chapter: Path, name: str) -> str:
    if chapter.name in OP_FAMILIES:
        text = (chapter / name).read_text(encoding="utf-8")
        return next(op for marker, op in OP_FAMILIES[chapter.name] if marker in text)
    return name.split("_")[1] if chapter.name in FAMILIES else chapter.name


def test_an_op_family_is_at_most_eight_lesson_versions():
    for chapter in sorted((REPO / "solutions").glob("[0-9][0-9]_*")):
        versions = [p.name for p in chapter.glob("v*.cu") if re.match(r"v\d+_", p.name)]
        families: dict[str, list[str]] = {}
        for name in versions:
            family = _family(chapter, name)
            assert chapter.name not in FAMILIES or family in FAMILIES[chapter.name], (
                f"{chapter.name}/{name}: not one of the families {FAMILIES[chapter.name]}")
            families.setdefault(family, []).append(name)
        for family, names in families.items():
            assert len(names) <= 8, f"{chapter.name}: {len(names)} version files of {family}"


def _header_lines(path: Path) -> int:
    header = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("//"):
            break
        header += 1
    return header


def test_chapter_06_files_stay_readable():
    for path in sorted((REPO / "solutions" / "06_int4_gemv").iterdir()):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= 400, f"{path.name}: {lines} lines"


def test_every_version_header_is_at_most_fifteen_lines():
    """What changed, why, what to expect: a version's header is short in every chapter."""
    versions = sorted((REPO / "solutions").glob("[0-9][0-9]_*/v[0-9]*_*.cu"))
    assert len(versions) > 40
    long = [f"{p.relative_to(REPO)}: {n}" for p in versions if (n := _header_lines(p)) > 15]
    assert not long, "headers over 15 lines:\n" + "\n".join(long)
