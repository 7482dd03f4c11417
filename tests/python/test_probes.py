"""The probe records in results/h200/probes/ hang together: each file is in the index, each probe a
page or source cites exists, each record says on its first lines the GPU, the date and the commit
it was built on, and each patch is a unified diff that `git apply` can read."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBES = REPO / "results" / "h200" / "probes"
INDEX = PROBES / "README.md"


def probe_files() -> list[Path]:
    return sorted(p for p in PROBES.iterdir() if p.is_file() and p.name != "README.md")


def test_every_probe_file_is_in_the_index():
    index = INDEX.read_text()
    missing = [p.name for p in probe_files() if f"`{p.name}`" not in index]
    assert not missing, f"not named in {INDEX.relative_to(REPO)}: {missing}"


def test_every_cited_probe_exists():
    cited = {}
    sources = [REPO / "README.md", *(REPO / "book" / "docs").glob("*.md"), INDEX]
    for folder in ("solutions", "tools", "reference", "notebooks"):
        sources += [p for p in (REPO / folder).rglob("*") if p.suffix in {".cu", ".cuh", ".py", ".md", ".sh"}]
    for source in sources:
        for name in re.findall(r"probes/([A-Za-z0-9_]+\.(?:txt|patch|cu))", source.read_text()):
            cited.setdefault(name, source.relative_to(REPO))
    for name in re.findall(r"`([A-Za-z0-9_]+\.(?:txt|patch|cu))`", INDEX.read_text()):
        cited.setdefault(name, INDEX.relative_to(REPO))
    assert cited, "no probe cited anywhere: the pattern no longer matches"
    absent = {name: str(where) for name, where in cited.items() if not (PROBES / name).exists()}
    assert not absent, f"cited but not in {PROBES.relative_to(REPO)}: {absent}"


def test_every_record_names_its_gpu_date_and_commit():
    for record in (p for p in probe_files() if p.suffix == ".txt"):
        head = "\n".join(record.read_text().splitlines()[:40])
        assert "H200" in head, f"{record.name}: no GPU named in its first 40 lines"
        assert re.search(r"\b20\d\d-\d\d-\d\d", head), f"{record.name}: no date in its first 40 lines"
        # "commit 1909229", "commits 4542b8f", "committed in 4dae405", "on top of 3797f86": a hash named as one
        assert re.search(r"\b(?:commits?|committed in|on top of) [0-9a-f]{7,40}\b", head, re.I), (
            f"{record.name}: no commit in its first 40 lines"
        )


def test_every_patch_is_a_unified_diff():
    for patch in (p for p in probe_files() if p.suffix == ".patch"):
        text = patch.read_text()
        assert re.search(r"^--- (a/\S+|/dev/null)$", text, re.M), f"{patch.name}: no '--- a/' line"
        assert re.search(r"^\+\+\+ b/\S+$", text, re.M), f"{patch.name}: no '+++ b/' line"
        assert re.search(r"^@@ -\d+(,\d+)? \+\d+(,\d+)? @@", text, re.M), f"{patch.name}: no hunk"
