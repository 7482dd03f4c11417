"""The book builds with `mkdocs build --strict`, with its tables generated from results/.

Two builds: one against a results folder holding a recorded (example) run of chapter 00 only,
one against an empty folder. The tables must show the recorded numbers, and a chapter without a
file must say "no measurement recorded yet" instead of numbers; both builds must be warning-free.
"""

import json
import os
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


@pytest.fixture(scope="module")
def recorded():
    return results.example("00_roofline")


@pytest.fixture(scope="module")
def measured_site(tmp_path_factory, recorded):
    root = tmp_path_factory.mktemp("results")
    write_results(root, "00_roofline", recorded)  # 01_formats deliberately has no file
    return build(tmp_path_factory.mktemp("site"), root)


@pytest.fixture(scope="module")
def empty_site(tmp_path_factory):
    return build(tmp_path_factory.mktemp("site"), tmp_path_factory.mktemp("no_results"))


def test_every_page_is_built(measured_site):
    for name in ["", "00_roofline", "01_formats"]:
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
    for chapter in ["00_roofline", "01_formats"]:
        html = page(empty_site, chapter)
        assert f"{results.NO_MEASUREMENT} for {chapter}" in html
        assert "Measured on" not in html and "GB/s</td>" not in html


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
