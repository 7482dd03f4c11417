"""The real grader on a real exercise tree: chapter 01 built from chapters/ (one arch, one chapter,
to keep it quick). Without a GPU only the host tests can pass, which is enough to tell the
versions apart: the host-graded v0 bit functions are TODO stubs in chapters/, so they must score
below full marks; argument validation, which a stub passes, must score nothing; the SASS facts
of each version must be there as feedback; the report must be a complete Gradescope document."""

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
    cmd = [
        sys.executable,
        str(REPO / "tools" / "grade.py"),
        "--chapter",
        "01_formats",
        "--archs",
        "90a",
        "--build-dir",
        str(tmp_path / "build"),
        "--out",
        str(out),
    ]
    env = {**os.environ, "LKW_ONLY": "01_formats"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
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
    assert entries["argument validation (feedback, not graded)"]["max_score"] == 0
    sass = [t for t in report["tests"] if ": SASS facts" in t["name"]]
    assert sass and all(t["max_score"] == 0 for t in sass)
    assert any(t["status"] == "failed" for t in sass)  # the v2 stubs make no 16-byte loads
    for t in report["tests"]:
        if "mutant" in t["name"] and t["output"].startswith("SKIPPED"):
            assert t["status"] == "failed"  # a skipped check is never presented as passed
    if "no CUDA device" in proc.stdout:
        assert report["output"].splitlines()[1].startswith("Correctness needs an sm_80+ GPU")
        assert report["score"] <= 1.0  # only bf16_to_f32's given bit function, host-tested
