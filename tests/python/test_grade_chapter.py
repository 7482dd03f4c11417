"""The real grader on a real exercise tree: chapter 01 built from chapters/ (one arch, to keep it
quick). Without a GPU only the host tests can pass, which is enough to tell the versions apart:
the host-graded v0 bit functions are TODO stubs in chapters/, so they must score below full
marks, while the report itself must be a complete Gradescope-style document."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to build the exercise tree")
def test_grader_writes_a_valid_report_for_chapter_01(tmp_path):
    out = tmp_path / "results.json"
    cmd = [sys.executable, str(REPO / "tools" / "grade.py"), "--chapter", "01_formats",
           "--archs", "80", "--build-dir", str(tmp_path / "build"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {"score", "tests", "output"} <= report.keys()
    entries = {t["name"]: t for t in report["tests"]}
    for t in report["tests"]:
        assert {"name", "score", "max_score", "status", "output"} <= t.keys()
        assert 0 <= t["score"] <= t["max_score"]
    ops = ["f32_to_bf16", "f32_to_e4m3", "f32_to_e5m2", "e4m3_to_bf16", "e5m2_to_bf16"]
    for op in ops:  # formats_bits.cuh's TODO regions: host-tested, so visibly failing
        entry = entries[f"{op}/v0_software_bits"]
        assert entry["score"] < entry["max_score"], entry
    assert report["score"] < sum(t["max_score"] for t in report["tests"])
