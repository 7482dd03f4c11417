"""The book builds with `mkdocs build --strict`, with its tables generated from results/.

Two builds: one against a results folder holding recorded (example) runs of chapters 00 and 02,
one against an empty folder. The tables must show the recorded numbers, and a chapter without a
file must say "no measurement recorded yet" instead of numbers; both builds must be warning-free.
The instruction-mix table of chapter 02 comes from the build (results/sass/mix.json), not from a
GPU run, so it must show the committed counts in both builds.
"""

import html as html_lib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from lkw import results

pytest.importorskip("mkdocs", reason="mkdocs is installed by tools/setup.sh")

REPO = Path(__file__).resolve().parents[2]
BOOK = REPO / "book"


def write_results(root: Path, chapter: str, data: dict) -> None:
    path = root / results.GPU / f"{chapter}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def build(site: Path, results_dir: Path) -> Path:
    env = {**os.environ, "LKW_RESULTS_DIR": str(results_dir), "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(BOOK / "mkdocs.yml")]
    proc = subprocess.run(cmd + ["-d", str(site)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return site


def page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text()


def table_rows(html: str) -> list[list[str]]:
    """Every table row of a page as the plain text of its cells."""
    rows = []
    for tr in re.findall(r"<tr>(.*?)</tr>", html, re.S):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)
        rows.append([html_lib.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in cells])
    return [r for r in rows if r]


@pytest.fixture(scope="module")
def recorded():
    return results.example("00_roofline")


@pytest.fixture(scope="module")
def recorded_02():
    return results.example("02_int4_dequant")


@pytest.fixture(scope="module")
def measured_site(tmp_path_factory, recorded, recorded_02):
    root = tmp_path_factory.mktemp("results")
    write_results(root, "00_roofline", recorded)  # 01_formats deliberately has no file
    write_results(root, "02_int4_dequant", recorded_02)
    return build(tmp_path_factory.mktemp("site"), root)


@pytest.fixture(scope="module")
def empty_site(tmp_path_factory):
    return build(tmp_path_factory.mktemp("site"), tmp_path_factory.mktemp("no_results"))


def test_every_page_is_built(measured_site):
    for name in ["", "00_roofline", "01_formats", "02_int4_dequant", "03_dynamic_quant", "04_rmsnorm",
                 "05_elementwise", "06_int4_gemv"]:
        assert (measured_site / name / "index.html").is_file(), f"page {name or 'index'} missing"


def test_recorded_run_becomes_the_table(measured_site, recorded):
    html = page(measured_site, "00_roofline")
    assert "lkw:results" not in html and "lkw:ridge" not in html, "a marker was left in the page"
    for field in ("gpu", "commit", "date"):
        assert recorded[field] in html, f"the run's {field} is not named above the table"
    assert f"copy ceiling {recorded['ceiling_gbps']:.1f} GB/s" in html
    for row in recorded["rows"]:
        assert f"<code>{row['version']}" in html, f"row {row['name']} missing"
        rate = f"{row['tflops']:.1f} TFLOP/s" if row["tflops"] else f"{row['gbps']:.0f} GB/s"
        assert rate in html, f"row {row['name']}: {rate} not in the table"
    flop_per_byte, _ = results.ridge_point(recorded)
    assert f"{flop_per_byte:.0f} FLOP/byte" in html, "the ridge point of the run is missing"
    assert results.NO_MEASUREMENT not in html


def test_chapter_without_results_says_so(measured_site):
    html = page(measured_site, "01_formats")
    assert f"{results.NO_MEASUREMENT} for 01_formats" in html
    assert "copy ceiling" not in html and "GB/s</td>" not in html, "numbers without a measurement"


def test_book_builds_before_any_measurement(empty_site):
    for chapter in ["00_roofline", "01_formats", "02_int4_dequant", "03_dynamic_quant", "04_rmsnorm",
                    "05_elementwise", "06_int4_gemv"]:
        html = page(empty_site, chapter)
        assert f"{results.NO_MEASUREMENT} for {chapter}" in html
        assert "Measured on" not in html and "GB/s</td>" not in html


def test_chapter_02_recorded_run_becomes_the_table(measured_site, recorded_02):
    html = page(measured_site, "02_int4_dequant")
    assert "lkw:results" not in html and "lkw:sass_mix" not in html, "a marker was left in the page"
    for field in ("gpu", "commit", "date"):
        assert recorded_02[field] in html, f"the run's {field} is not named above the table"
    rows = table_rows(html)
    for row in recorded_02["rows"]:
        key = [row["op"], row["version"], row["summary"], row["shape"]]
        cells = next((c for c in rows if c[:4] == key), None)
        assert cells, f"row {row['name']} at {row['shape']} missing"
        assert cells[5] == f"{row['gbps']:.0f} GB/s", f"row {row['name']}: wrong rate {cells[5]}"
    assert f"{results.NO_MEASUREMENT} for 02_int4_dequant" not in html


@pytest.mark.parametrize("site", ["measured_site", "empty_site"])
def test_instruction_mix_table_shows_the_committed_counts(site, request):
    """The sass_mix marker becomes a table of the real counts of results/sass/mix.json for sm_90a:
    every version of the chapter, the chosen opcodes (0 where absent) and the total."""
    mix = json.loads((REPO / "results" / "sass" / "mix.json").read_text())
    expected = {
        name.split("/", 1)[1]: counts
        for name, counts in mix[results.SASS_ARCH].items()
        if name.startswith("02_int4_dequant/")
    }
    assert len(expected) >= 10, "mix.json has (almost) no chapter 02 versions"
    html = page(request.getfixturevalue(site), "02_int4_dequant")
    assert "lkw:sass_mix" not in html
    opcodes = results.MIX_OPCODES["02_int4_dequant"]
    shown = {r[0]: r[1:] for r in table_rows(html) if r[0] in expected}
    assert set(shown) == set(expected), f"not in the mix table: {set(expected) - set(shown)}"
    for name, counts in expected.items():
        want = [str(counts.get(op, 0)) for op in opcodes] + [str(sum(counts.values()))]
        assert shown[name] == want, f"{name}: table {shown[name]}, mix.json {want}"
    text = html_lib.unescape(re.sub(r"<[^>]+>", "", html))
    for words in (results.SASS_ARCH, results.SASS_TOOLKIT, "cuobjdump", "whole kernel"):
        assert words in text, f"the mix table does not say {words!r}"


def test_missing_instruction_mix_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("LKW_SASS_MIX", str(tmp_path / "no_mix.json"))
    table = results.sass_mix_markdown("02_int4_dequant")
    assert table.startswith(results.NO_MIX) and "lkw_sass_check --mix" in table
    (tmp_path / "other.json").write_text(json.dumps({"sm_80": {}}))
    monkeypatch.setenv("LKW_SASS_MIX", str(tmp_path / "other.json"))
    assert results.sass_mix_markdown("02_int4_dequant").startswith(results.NO_MIX)


def test_suspect_and_failed_rows_are_marked(tmp_path, monkeypatch, recorded):
    data = json.loads(json.dumps(recorded))
    # Above the ceiling with no DRAM measurement that settles it: L2 hits or a wrong byte model.
    data["rows"][0].update(pct_ceiling=104.0, dram_ratio=None)
    data["rows"][1].update(correct=False, time_us=None, gbps=None, check="element 7: got 0, want 3")
    write_results(tmp_path, "00_roofline", data)
    monkeypatch.setenv("LKW_RESULTS_DIR", str(tmp_path))
    table = results.markdown_table("00_roofline")
    assert "104.0 ⚠" in table and "the data sat in L2 or the byte model is wrong" in table
    assert "FAILED CHECK copy/v1_vec16" in table and "element 7" in table


def test_rows_above_the_ceiling_with_dram_bytes_matching_the_model_are_explained(
    tmp_path, monkeypatch, recorded
):
    data = json.loads(json.dumps(recorded))
    data["rows"][0].update(pct_ceiling=101.0, dram_ratio=0.99)  # DRAM saw the model's bytes
    data["rows"][1].update(pct_ceiling=101.0, dram_ratio=0.90)  # 10% short: still suspect
    write_results(tmp_path, "00_roofline", data)
    monkeypatch.setenv("LKW_RESULTS_DIR", str(tmp_path))
    table = results.markdown_table("00_roofline")
    assert "101.0 †" in table and "not served from L2" in table.replace("\n", " ")
    assert "101.0 ⚠" in table


def test_every_chapter_page_is_at_most_30_kb():
    # A chapter is read in one sitting: the problem, its bound, each step, the results, the
    # exercises. Research records go to an appendix page (lab_notes_NN.md).
    docs = Path(__file__).resolve().parents[2] / "book" / "docs"
    pages = sorted(docs.glob("[0-9][0-9]_*.md")) + sorted(docs.glob("lab_notes_*.md"))
    assert len(pages) > 10
    for page in pages:  # an appendix too: one table row an experiment, not a second chapter
        assert page.stat().st_size <= 30 * 1024, f"{page.name}: {page.stat().st_size} bytes"
