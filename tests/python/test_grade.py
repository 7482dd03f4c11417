"""Tests of tools/grade.py without CMake or CUDA: name parsing, scoring of a synthetic GoogleTest
report (passes, failures, skips, all-skipped versions, peers and mutants; validation tests carry
no points), the no-GPU feedback (host checks, SASS facts per version), the results.json shape,
the bench entries, and the per-version test runs against a fake GoogleTest binary."""

import json
import os
import stat
import sys
from pathlib import Path

import pytest
import tool_module

REPO = Path(__file__).resolve().parents[2]

grade = tool_module.load("grade")

NO_GPU = "no CUDA device on this machine: GPU test skipped"
NEEDS_SM90 = "device is sm_80, version needs sm_90"


def _case(suite, name, outcome="passed", failure="", seconds="0.001s"):
    """One testcase stanza as GoogleTest 1.12 writes it."""
    test = {
        "name": name,
        "file": "tests/cpp/golden_main.cu",
        "line": 100,
        "status": "RUN",
        "result": "SKIPPED" if outcome == "skipped" else "COMPLETED",
        "timestamp": "2025-01-01T00:00:00Z",
        "time": seconds,
        "classname": suite,
    }
    if outcome == "failed":
        test["failures"] = [{"failure": failure, "type": ""}]
    return test


def _report(cases):
    suites = {}
    for case in cases:
        suites.setdefault(case["classname"], []).append(case)
    return {
        "tests": len(cases),
        "name": "AllTests",
        "testsuites": [{"name": s, "tests": len(t), "testsuite": t} for s, t in suites.items()],
    }


REPORT = _report(
    [
        _case("Chapter/Golden", "MatchesReference/copy__v0_scalar__small"),
        _case("Chapter/Golden", "MatchesReference/copy__v0_scalar__tail_7"),
        _case("Chapter/Validation", "RefusesBadArguments/copy__v0_scalar__small"),
        _case("Chapter/Golden", "MatchesReference/copy__v1_vec16__small"),
        _case(
            "Chapter/Golden",
            "MatchesReference/copy__v1_vec16__tail_7",
            "failed",
            "tests/cpp/golden_main.cu:112\ncopy v1 on tail_7: 3 of 7 elements differ",
        ),
        _case("Chapter/Golden", "MatchesReference/copy__v2_inflight__small", "skipped"),
        _case("Chapter/Golden", "MatchesReference/copy__v2_inflight__tail_7", "skipped"),
        _case("Chapter/Validation", "RefusesBadArguments/copy__v3_async__small"),
        _case("Chapter/Golden", "MatchesReference/copy__v3_async__small", "skipped"),
        _case("Chapter/Golden", "MatchesReference/copy__v3_async__tail_7", "skipped"),
        _case("Chapter/Golden", "MatchesReference/copy__cuda_memcpy__small"),
        _case("Chapter/Golden", "MatchesReference/copy__cuda_memcpy__tail_7", "failed", "x"),
        _case("Chapter/Mutant", "IsCaught/copy__mutant_drops_last"),
        _case("Chapter/Mutant", "IsCaught/copy__mutant_no_tail", "failed", "not caught"),
        _case(
            "Chapter/HostBits",
            "MatchesReference/f32_to_bf16__v0_software_bits__f32_to_bf16_special",
        ),
        _case("HostGoldenData", "IsPresentAndCoversEveryOp"),
    ]
)


def _console_skip(name, reason):
    return (
        f"[ RUN      ] {name}\n"
        f"tests/cpp/golden_main.cu:103: Skipped\n{reason}\n\n"
        f"[  SKIPPED ] {name} (0 ms)\n"
    )


CONSOLE = grade.parse_console(
    _console_skip("Chapter/Golden.MatchesReference/copy__v2_inflight__small", NO_GPU)
    + _console_skip("Chapter/Golden.MatchesReference/copy__v2_inflight__tail_7", NO_GPU)
    + _console_skip("Chapter/Golden.MatchesReference/copy__v3_async__small", NEEDS_SM90)
    + _console_skip("Chapter/Golden.MatchesReference/copy__v3_async__tail_7", NO_GPU)
)


@pytest.fixture
def entries():
    outcomes = grade.parse_gtest_report(REPORT, CONSOLE)
    return {
        e["name"]: e
        for e in grade.grade_entries(outcomes, 10.0, ["v0_scalar", "v1_vec16", "v4_missing"])
    }


@pytest.mark.parametrize(
    "name, expected",
    [
        ("Chapter/Golden.MatchesReference/copy__v0_scalar__small", ("copy", "v0_scalar")),
        ("Chapter/Validation.RefusesBadArguments/copy__v1_vec16", ("copy", "v1_vec16")),
        ("Chapter/Mutant.IsCaught/copy__mutant_no_tail", ("copy", "mutant_no_tail")),
        (
            "Chapter/HostBits.MatchesReference/f32_to_bf16__v0_software_bits__f32_to_bf16_special",
            ("f32_to_bf16", "v0_software_bits"),
        ),
        ("HostGoldenData.IsPresentAndCoversEveryOp", None),
        ("Chapter/HostBits.Exhaustive/f32_to_bf16", None),
        ("(outside any test)", None),
    ],
)
def test_version_of(name, expected):
    assert grade.version_of(name) == expected


def test_kind_of():
    names = ("v2_lop3_magic", "cublas", "cuda_memcpy", "mutant_x", "ablation_v7_no_pdl")
    assert [grade.kind_of(v) for v in names] == ["version", "peer", "peer", "mutant", "ablation"]


def test_report_outcomes_and_skip_reasons():
    outcomes = {o.name: o for o in grade.parse_gtest_report(REPORT, CONSOLE)}
    assert len(outcomes) == 16
    v1_tail = outcomes["Chapter/Golden.MatchesReference/copy__v1_vec16__tail_7"]
    assert v1_tail.status == "failed" and "3 of 7 elements differ" in v1_tail.message
    v3_small = outcomes["Chapter/Golden.MatchesReference/copy__v3_async__small"]
    assert (v3_small.status, v3_small.message) == ("skipped", NEEDS_SM90)
    assert outcomes["HostGoldenData.IsPresentAndCoversEveryOp"].status == "passed"
    assert outcomes["HostGoldenData.IsPresentAndCoversEveryOp"].seconds == pytest.approx(0.001)


def test_newer_googletest_skip_message_is_used():
    case = _case("S", "T/op__v0_a", "skipped")
    case["skipped"] = [{"message": "reason from the report"}]
    (outcome,) = grade.parse_gtest_report(_report([case]), {})
    assert outcome.message == "reason from the report"


def test_disabled_tests_are_left_out():
    case = _case("S", "DISABLED_T/op__v0_a")
    case["status"], case["result"] = "NOTRUN", "SUPPRESSED"
    assert grade.parse_gtest_report(_report([case]), {}) == []


def test_all_passed_version_scores_full(entries):
    e = entries["copy/v0_scalar"]
    assert (e["score"], e["max_score"], e["status"]) == (10.0, 10.0, "passed")
    assert e["output"].startswith("Golden tests: 2 of 2 tests passed, 0 failed, 0 skipped")
    assert "Argument validation (feedback, no points): 1 of 1 passed." in e["output"]


def test_failures_score_the_passed_fraction_and_show_the_message(entries):
    e = entries["copy/v1_vec16"]
    assert (e["score"], e["status"]) == (5.0, "failed")
    assert "FAILED Chapter/Golden.MatchesReference/copy__v1_vec16__tail_7" in e["output"]
    assert "3 of 7 elements differ" in e["output"]


def test_all_skipped_version_scores_zero(entries):
    e = entries["copy/v2_inflight"]
    assert (e["score"], e["max_score"], e["status"]) == (0.0, 10.0, "failed")
    assert "Not checked on this machine" in e["output"]
    assert f"2 tests skipped: {NO_GPU}" in e["output"]


def test_validation_tests_carry_no_points(entries):
    # Host validation passes for a TODO stub: with its golden tests skipped, v3 scores nothing.
    e = entries["copy/v3_async"]
    assert (e["score"], e["status"]) == (0.0, "failed")
    assert f"1 test skipped: {NEEDS_SM90}" in e["output"]
    assert f"1 test skipped: {NO_GPU}" in e["output"]
    assert "Not checked on this machine" in e["output"]
    checks = entries["argument validation (feedback, not graded)"]
    assert (checks["score"], checks["max_score"], checks["status"]) == (0, 0, "passed")
    assert checks["output"].startswith("2 of 2 tests passed")


def test_some_skipped_golden_tests_count_as_not_passed():
    outcomes = [
        grade.Outcome("Chapter/Golden.MatchesReference/copy__v3_async__a", "passed"),
        grade.Outcome("Chapter/Golden.MatchesReference/copy__v3_async__b", "skipped", NO_GPU),
        grade.Outcome("Chapter/Validation.RefusesBadArguments/copy__v3_async__a", "passed"),
    ]
    (e, checks) = grade.grade_entries(outcomes, 1.0, [])
    assert (e["score"], e["status"]) == (0.5, "failed")
    assert "count as not passed" in e["output"]
    assert checks["name"] == "argument validation (feedback, not graded)"


def test_version_with_only_validation_tests_scores_zero():
    outcomes = [grade.Outcome("Chapter/Validation.RefusesBadArguments/copy__v0_a__c", "passed")]
    e = grade.grade_entries(outcomes, 1.0, [])[0]
    assert (e["name"], e["score"], e["max_score"], e["status"]) == ("copy/v0_a", 0, 1.0, "failed")
    assert "No golden test of this version ran" in e["output"]


@pytest.mark.parametrize(
    "name, validation, host",
    [
        ("Chapter/Validation.RefusesBadArguments/copy__v0_a__c", True, False),
        ("HostValidation.RefusesBeforeLaunching", True, True),
        ("Chapter/Golden.MatchesReference/copy__v0_a__c", False, False),
        ("Chapter/HostBits.MatchesReference/f32_to_bf16__v0_b__c", False, True),
        ("HostGoldenData.IsPresentAndCoversEveryOp", False, True),
        ("DependentLaunch.V6ChainReadsThePreviousKernelsOutput", False, False),
    ],
)
def test_roles_of_tests(name, validation, host):
    assert (grade.is_validation(name), grade.is_host_check(name)) == (validation, host)


def test_host_test_of_another_op_is_its_own_entry(entries):
    assert entries["f32_to_bf16/v0_software_bits"]["score"] == 10.0


def test_peers_mutants_and_host_checks_are_not_graded(entries):
    peer = entries["copy/cuda_memcpy (peer, not graded)"]
    caught = entries["copy/mutant_drops_last (mutant, not graded)"]
    missed = entries["copy/mutant_no_tail (mutant, not graded)"]
    checks = entries["host checks (feedback, not graded)"]
    assert all(e["max_score"] == 0 and e["score"] == 0 for e in (peer, caught, missed, checks))
    assert (peer["status"], caught["status"], missed["status"]) == ("failed", "passed", "failed")
    assert checks["status"] == "passed" and "1 of 1 tests passed" in checks["output"]
    assert "chapter checks (not graded)" not in entries  # no GPU test of no version here


def test_a_mutant_whose_tests_were_skipped_is_not_passed():
    outcomes = [
        grade.Outcome("Chapter/Mutant.IsCaught/copy__mutant_x", "skipped", NO_GPU),
        grade.Outcome("Chapter/Validation.RefusesBadArguments/copy__mutant_x__c", "passed"),
        grade.Outcome("DependentLaunch.V6Chain", "skipped", NO_GPU),
    ]
    mutant, gpu_checks = grade.grade_entries(outcomes, 1.0, [])
    assert mutant["name"] == "copy/mutant_x (mutant, not graded)"
    assert mutant["status"] == "failed" and "1 test skipped" in mutant["output"]
    assert "not a pass" in mutant["output"]
    assert gpu_checks["name"] == "chapter checks (not graded)"
    assert gpu_checks["status"] == "failed"
    assert gpu_checks["output"].startswith("SKIPPED, not checked on this machine")
    text = grade.summary_text("00_x", [mutant, gpu_checks], [], has_gpu=False)
    assert "skipped copy/mutant_x (mutant, not graded)" in " ".join(text.split())
    assert "passed" not in text.replace("tests passed", "")


def test_expected_version_without_tests_scores_zero(entries):
    e = entries["v4_missing"]
    assert (e["score"], e["max_score"], e["status"]) == (0.0, 10.0, "failed")
    assert "No test of v4_missing ran" in e["output"]


def test_entry_order_puts_graded_versions_first():
    outcomes = grade.parse_gtest_report(REPORT, CONSOLE)
    names = [e["name"] for e in grade.grade_entries(outcomes, 1.0, [])]
    assert names[:5] == [
        "copy/v0_scalar",
        "copy/v1_vec16",
        "copy/v2_inflight",
        "copy/v3_async",
        "f32_to_bf16/v0_software_bits",
    ]
    assert names[-2:] == [
        "argument validation (feedback, not graded)",
        "host checks (feedback, not graded)",
    ]


def _assert_gradescope_shape(document):
    assert set(document) >= {"score", "max_score", "execution_time", "output", "tests"}
    assert isinstance(document["output"], str)
    for test in document["tests"]:
        assert set(test) == {"name", "score", "max_score", "status", "output", "visibility"}
        assert test["status"] in ("passed", "failed")
        assert test["visibility"] == "visible"
        assert 0 <= test["score"] <= test["max_score"] or test["max_score"] == 0 == test["score"]
    for row in document.get("leaderboard", []):
        assert set(row) <= {"name", "value", "order"} and isinstance(row["value"], (int, float))
    json.loads(json.dumps(document))


def test_results_document_sums_only_graded_entries(entries):
    document = grade.results_document(list(entries.values()), "summary", 1.234, [])
    _assert_gradescope_shape(document)
    assert document["max_score"] == 60.0  # six graded entries of 10 points
    assert document["score"] == pytest.approx(10 + 5 + 0 + 0 + 10 + 0, abs=1e-3)
    assert document["execution_time"] == 1.23
    assert "leaderboard" not in document


def test_summary_lists_graded_scores_and_the_feedback(entries):
    text = grade.summary_text("00_x", list(entries.values()), ["a note"])
    lines = text.splitlines()
    assert lines[0] == "Chapter 00_x from chapters/00_x: 25.00 / 60 points"
    assert "copy/v1_vec16" in text
    assert "  FAILED  copy/cuda_memcpy (peer, not graded)" in lines
    assert "  ok      host checks (feedback, not graded)" in lines
    assert grade.NO_GPU_SUMMARY not in text
    assert text.endswith("a note")


def test_summary_without_gpu_says_correctness_needs_one_in_its_second_line(entries):
    text = grade.summary_text("00_x", list(entries.values()), [], has_gpu=False)
    lines = text.splitlines()
    assert lines[1] == grade.NO_GPU_SUMMARY
    assert "sm_80+ GPU" in lines[1] and len(lines[1]) <= 120
    assert grade.NO_GPU_BLIND_SPOT in text
    assert all(len(line) <= 120 for line in lines)


def test_parse_console_statuses_and_a_test_cut_short():
    text = (
        "LKW: chapter 00_x\n"
        "[ RUN      ] S.A/op__v0_a\nhello\n[       OK ] S.A/op__v0_a (1 ms)\n"
        "[ RUN      ] S.B/op__v0_a__c\nboom\n"
        "[  FAILED  ] S.B/op__v0_a__c, where GetParam() = 72-byte object <00> (2 ms)\n"
        "[ RUN      ] S.C/op__v0_a__d\nlast words\n"
    )
    tests = grade.parse_console(text)
    assert tests["S.A/op__v0_a"] == grade.ConsoleTest("passed", "hello")
    assert tests["S.B/op__v0_a__c"] == grade.ConsoleTest("failed", "boom")
    assert tests["S.C/op__v0_a__d"] == grade.ConsoleTest(None, "last words")


def test_outcomes_of_a_crashed_process():
    console = grade.parse_console(
        "[ RUN      ] S.A/op__v1_b\n[       OK ] S.A/op__v1_b (1 ms)\n"
        "[ RUN      ] S.B/op__v1_b__c\nlaunching\n"
    )
    names = ["S.A/op__v1_b", "S.B/op__v1_b__c", "S.C/op__v1_b__d"]
    why = grade.process_ending(-11, 60)
    assert why == "the test process was killed by SIGSEGV"
    a, b, c = grade.outcomes_without_report(names, console, why)
    assert a.status == "passed"
    assert b.status == "failed" and "SIGSEGV during this test" in b.message
    assert "launching" in b.message
    assert c.status == "failed" and c.message.startswith("not run:")
    assert "timed out after 60 s" in grade.process_ending(None, 60)


def test_parse_test_list_and_groups():
    listing = (
        "LKW: chapter 00_x, golden data /tmp/g/00_x\n"
        "LKW: no CUDA device, every GPU test skipped\n"
        "Chapter/Golden.\n"
        "  MatchesReference/copy__v0_scalar__small  # GetParam() = 72-byte object <00>\n"
        "  MatchesReference/copy__v1_vec16__small  # GetParam() = 72-byte object <00>\n"
        "HostGoldenData.\n"
        "  IsPresentAndCoversEveryOp\n"
    )
    names = grade.parse_test_list(listing)
    assert names == [
        "Chapter/Golden.MatchesReference/copy__v0_scalar__small",
        "Chapter/Golden.MatchesReference/copy__v1_vec16__small",
        "HostGoldenData.IsPresentAndCoversEveryOp",
    ]
    groups = grade.group_by_version(names)
    assert sorted(groups) == ["", "v0_scalar", "v1_vec16"]
    assert grade.gtest_filter("v0_scalar", groups["v0_scalar"]) == (
        "*/*__v0_scalar__*:*/*__v0_scalar"
    )
    assert grade.gtest_filter("", groups[""]) == "HostGoldenData.IsPresentAndCoversEveryOp"


def test_bench_entries_and_leaderboard():
    rows = [
        {"op": "copy", "version": "v2_inflight", "time_us": 101.5, "gbps": 4321.0,
         "pct_ceiling": 96.4, "correct": True, "shape": "n=67108864"},
        {"op": "copy", "version": "v1_vec16", "time_us": 99.0, "gbps": 4400.0,
         "pct_ceiling": 98.0, "correct": False},
        {"op": "copy", "version": "cuda_memcpy", "time_us": 100.0, "gbps": 4380.0,
         "pct_ceiling": 100.0, "correct": True},
        {"op": "copy", "version": "v0_scalar", "time_us": None, "gbps": None,
         "pct_ceiling": None, "correct": True},
    ]  # fmt: skip
    entries, leaderboard = grade.bench_entries(rows)
    names = [e["name"] for e in entries]
    assert names == [
        "copy/v2_inflight [n=67108864]: 96% of bound (speed, not graded)",
        "copy/v1_vec16: 98% of bound (speed, not graded)",
        "copy/cuda_memcpy: 100% of bound (speed, not graded)",
        "copy/v0_scalar: no bound (speed, not graded)",
    ]
    assert entries[0]["output"] == "101.50 us, 4321.0 GB/s, output verified"
    assert entries[1]["status"] == "failed" and "WRONG" in entries[1]["output"]
    assert all(e["max_score"] == 0 for e in entries)
    assert leaderboard == [
        {"name": "copy/v2_inflight [n=67108864] % of bound", "value": 96.4, "order": "desc"}
    ]
    _assert_gradescope_shape(grade.results_document(entries, "", 0.0, leaderboard))


# ---------------------------------------------------------------------------------------------
# SASS facts: lkw_sass_check's output, filtered to the chapter, one feedback entry per version

SASS_OUTPUT = """\
ok   sm_80  00_roofline/copy/v1_vec16                16-byte accesses
ok   sm_80  04_rmsnorm/rmsnorm/v0_scalar             2-byte loads, a row per thread: no barrier
ok   sm_80  04_rmsnorm/rmsnorm/v2_warp_shuffle       shuffle reduction; pairs of BF16 (4-byte loads)
ok   sm_90a 04_rmsnorm/rmsnorm/v2_warp_shuffle       shuffle reduction; pairs of BF16 (4-byte loads)
ok   sm_90a 04_rmsnorm/fused_add_rmsnorm_int8/v5_fused_add_quant 16-byte loads; no local memory
ok   sm_90a 04_rmsnorm/fused_add_rmsnorm/chain_unfused the add kernel moves 16-byte vectors
ok   sm_90a 04_rmsnorm/rmsnorm/mutant_no_barrier     barriers
12 passed, 0 failed
"""
PLANTED = SASS_OUTPUT.replace(
    "ok   sm_90a 04_rmsnorm/rmsnorm/v2_warp_shuffle       shuffle reduction; pairs of BF16 (4-byte loads)",
    "FAIL sm_90a 04_rmsnorm/rmsnorm/v2_warp_shuffle       shuffle reduction; pairs of BF16"
    " (4-byte loads): lacks SHFL.BFLY, has LDG.E.U16",
)
FAKE_SASS = grade.parse_sass_check(
    "ok   sm_90a 00_roofline/copy/v0_scalar 4-byte accesses only\n"
    "FAIL sm_90a 00_roofline/copy/v1_vec16 16-byte accesses: lacks LDG.E.128\n",
    "00_roofline",
)


def test_parse_sass_check_keeps_the_chapters_facts():
    report = grade.parse_sass_check(SASS_OUTPUT, "04_rmsnorm")
    assert report.problems == [] and report.error == ""
    assert [(f.arch, f.op, f.version) for f in report.facts][:3] == [
        ("sm_80", "rmsnorm", "v0_scalar"),
        ("sm_80", "rmsnorm", "v2_warp_shuffle"),
        ("sm_90a", "rmsnorm", "v2_warp_shuffle"),
    ]
    assert len(report.facts) == 6  # chapter 00's line is left out
    long_name = report.facts[3]
    assert (long_name.op, long_name.version) == ("fused_add_rmsnorm_int8", "v5_fused_add_quant")
    assert long_name.text == "16-byte loads; no local memory"
    failed = grade.parse_sass_check(PLANTED, "04_rmsnorm").facts[2]
    assert not failed.ok and failed.text.endswith("lacks SHFL.BFLY, has LDG.E.U16")


def test_sass_entries_one_per_version_graded_first():
    entries = grade.sass_entries(grade.parse_sass_check(SASS_OUTPUT, "04_rmsnorm"))
    assert [e["name"] for e in entries] == [
        "fused_add_rmsnorm_int8/v5_fused_add_quant: SASS facts (feedback, not graded)",
        "rmsnorm/v0_scalar: SASS facts (feedback, not graded)",
        "rmsnorm/v2_warp_shuffle: SASS facts (feedback, not graded)",
        "fused_add_rmsnorm/chain_unfused: SASS facts (peer) (feedback, not graded)",
        "rmsnorm/mutant_no_barrier: SASS facts (mutant) (feedback, not graded)",
    ]
    v2 = entries[2]
    assert (v2["score"], v2["max_score"], v2["status"]) == (0, 0, "passed")
    assert v2["output"].splitlines()[1:] == [
        "ok   sm_80  shuffle reduction; pairs of BF16 (4-byte loads)",
        "ok   sm_90a shuffle reduction; pairs of BF16 (4-byte loads)",
    ]


@pytest.mark.parametrize(
    "output, reason",
    [
        ("FAIL: cuobjdump was not found at configure time (install nvidia-cuda-cuobjdump)\n",
         "cuobjdump was not found"),
        ("FAIL sm_90a: cuobjdump found no SASS in this binary\n0 passed, 1 failed\n",
         "found no SASS"),
    ],
)  # fmt: skip
def test_a_sass_check_that_cannot_run_is_one_failed_entry_with_the_reason(output, reason):
    (entry,) = grade.sass_entries(grade.parse_sass_check(output, "04_rmsnorm"))
    assert entry["name"] == "SASS facts (feedback, not graded)"
    assert entry["status"] == "failed" and entry["max_score"] == 0
    assert entry["output"].startswith("Not checked: ") and reason in entry["output"]
    (built,) = grade.sass_entries(grade.SassReport([], [], "lkw_sass_check did not build: x"))
    assert "did not build" in built["output"]
    assert grade.sass_entries(None) == []


def test_a_planted_bug_gets_a_different_report_without_a_gpu():
    """Chapter 04's v2 with 4-byte loads and no shuffle (a planted bug) against a correct v2, both
    on a machine without a GPU: the same score (every golden test skipped), different feedback."""
    outcomes = [
        grade.Outcome(f"Chapter/Golden.MatchesReference/rmsnorm__v2_warp_shuffle__{c}", "skipped",
                      NO_GPU)
        for c in ("t1_d4096", "t5_d203")
    ] + [grade.Outcome("HostRowRoutine.ThreadsHoldTheRowInWholeWarps", "passed")]  # fmt: skip
    reports = {}
    for label, sass in (("correct", SASS_OUTPUT), ("planted", PLANTED)):
        entries = grade.grade_entries(
            outcomes, 1.0, ["v2_warp_shuffle"], grade.parse_sass_check(sass, "04_rmsnorm")
        )
        reports[label] = (entries, grade.summary_text("04_rmsnorm", entries, [], has_gpu=False))
    (correct, correct_text), (planted, planted_text) = reports["correct"], reports["planted"]
    assert [e["score"] for e in correct] == [e["score"] for e in planted]
    assert correct_text != planted_text
    assert "broken:\n    rmsnorm/v2_warp_shuffle" in planted_text
    assert "SASS facts: 5 of 5 versions keep every promise" in correct_text
    v2 = "rmsnorm/v2_warp_shuffle: SASS facts (feedback, not graded)"
    assert next(e for e in correct if e["name"] == v2)["status"] == "passed"
    bad = next(e for e in planted if e["name"] == v2)
    assert bad["status"] == "failed" and "lacks SHFL.BFLY" in bad["output"]
    for entries in (correct, planted):
        _assert_gradescope_shape(grade.results_document(entries, "", 0.0, []))


def test_cmake_cache_value(tmp_path):
    (tmp_path / "CMakeCache.txt").write_text(
        "LKW_CUOBJDUMP:FILEPATH=/v/bin/cuobjdump\nLKW_ONLY:STRING=01_formats\n"
    )
    assert grade.cmake_cache_value(tmp_path, "LKW_CUOBJDUMP") == "/v/bin/cuobjdump"
    assert grade.cmake_cache_value(tmp_path, "NOPE") == ""
    assert grade.cmake_cache_value(tmp_path / "none", "LKW_ONLY") == ""


# ---------------------------------------------------------------------------------------------
# A fake GoogleTest binary: lists its tests, honours --gtest_filter and --gtest_output=json, and
# dies by SIGABRT inside the test named in crash_in (as a host crash in student code would).

FAKE_GTEST = r"""
import fnmatch, json, os, sys
config = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "config.json")))
args = dict(a.split("=", 1) if "=" in a else (a, "") for a in sys.argv[1:])
if not config["gpu"]:
    print("LKW: no CUDA device, every GPU test skipped")
if "--gtest_list_tests" in args:
    for suite, names in config["suites"].items():
        print(suite + ".")
        for name in names:
            print("  " + name + "  # GetParam() = 8-byte object <00>")
    sys.exit(0)
patterns = args.get("--gtest_filter", "*").split(":")
cases = {}
for suite, names in config["suites"].items():
    for name in names:
        full = suite + "." + name
        if not any(fnmatch.fnmatchcase(full, p) for p in patterns):
            continue
        print("[ RUN      ] " + full, flush=True)
        if full == config["crash_in"]:
            os.abort()
        case = {"name": name, "status": "RUN", "time": "0.002s", "classname": suite}
        if "Golden" in suite and not config["gpu"]:
            case["result"] = "SKIPPED"
            print("golden_main.cu:103: Skipped\nno CUDA device on this machine: GPU test skipped")
            print("[  SKIPPED ] " + full + " (0 ms)")
        elif full in config["failing"]:
            case["result"] = "COMPLETED"
            case["failures"] = [{"failure": "golden_main.cu:112\nwrong values", "type": ""}]
            print("[  FAILED  ] " + full + " (0 ms)")
        else:
            case["result"] = "COMPLETED"
            print("[       OK ] " + full + " (0 ms)")
        cases.setdefault(suite, []).append(case)
path = args["--gtest_output"][len("json:"):]
suites = [{"name": s, "testsuite": c} for s, c in cases.items()]
json.dump({"testsuites": suites}, open(path, "w"))
sys.exit(1 if any("failures" in c for cs in cases.values() for c in cs) else 0)
"""

SUITES = {
    "Chapter/Golden": [
        "MatchesReference/copy__v0_scalar__small",
        "MatchesReference/copy__v1_vec16__small",
        "MatchesReference/copy__v1_vec16__tail",
        "MatchesReference/copy__v2_inflight__small",
        "MatchesReference/copy__cuda_memcpy__small",
    ],
    "Chapter/Validation": [
        "RefusesBadArguments/copy__v0_scalar__small",
        "RefusesBadArguments/copy__v1_vec16__small",
        "RefusesBadArguments/copy__v2_inflight__small",
    ],
    "Chapter/Mutant": ["IsCaught/copy__mutant_drops_last"],
    "HostGoldenData": ["IsPresentAndCoversEveryOp"],
}


def _fake_binary(folder, gpu, crash_in="", failing=()):
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "test_00_x"
    exe.write_text(f"#!{sys.executable}\n{FAKE_GTEST}")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    config = {"gpu": gpu, "suites": SUITES, "crash_in": crash_in, "failing": list(failing)}
    (folder / "config.json").write_text(json.dumps(config))
    return exe


def _by_version(outcomes):
    found = {}
    for o in outcomes:
        version = grade.version_of(o.name)
        found.setdefault(version[1] if version else "", []).append(o.status)
    return found


def test_run_tests_one_process_per_version_survives_a_crash(tmp_path):
    exe = _fake_binary(
        tmp_path / "build",
        gpu=True,
        crash_in="Chapter/Golden.MatchesReference/copy__v1_vec16__small",
        failing=["Chapter/Golden.MatchesReference/copy__v2_inflight__small"],
    )
    run = grade.run_tests(exe, tmp_path / "golden", tmp_path / "work", seed=7, timeout_s=60)
    assert run.has_gpu
    assert sorted(o.name for o in run.outcomes) == sorted(
        f"{suite}.{name}" for suite, names in SUITES.items() for name in names
    )
    statuses = _by_version(run.outcomes)
    assert statuses["v0_scalar"] == ["passed", "passed"]
    assert statuses["v1_vec16"] == ["failed", "failed", "failed"]  # crashed in its first test
    assert statuses["v2_inflight"] == ["failed", "passed"]
    assert statuses["cuda_memcpy"] == ["passed"] and statuses[""] == ["passed"]
    crashed = next(o for o in run.outcomes if o.name.endswith("copy__v1_vec16__small"))
    assert "killed by SIGABRT during this test" in crashed.message
    assert "$ " in run.console and "--gtest_filter=*/*__v0_scalar__*" in run.console


def test_run_tests_without_gpu(tmp_path):
    exe = _fake_binary(tmp_path / "build", gpu=False)
    run = grade.run_tests(exe, tmp_path / "golden", tmp_path / "work", seed=None, timeout_s=60)
    assert not run.has_gpu
    statuses = _by_version(run.outcomes)
    assert statuses["v0_scalar"] == ["skipped", "passed"]
    skipped = [o for o in run.outcomes if o.status == "skipped"]
    assert {o.message for o in skipped} == {NO_GPU}


def test_run_tests_fails_as_tooling_when_nothing_is_listed(tmp_path):
    exe = tmp_path / "test_empty"
    exe.write_text(f"#!{sys.executable}\nimport sys; sys.exit(3)\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(grade.ToolFailure, match="listed no tests"):
        grade.run_tests(exe, tmp_path, tmp_path / "work", seed=None, timeout_s=60)


def _args(tmp_path, **overrides):
    values = {
        "chapter": "00_roofline",
        "build_dir": tmp_path / "build",
        "out": None,
        "seed": 7,
        "archs": "90a",
        "points_per_version": 1.0,
        "timeout": 60.0,
        "bench": False,
        "sass": True,
    }
    values.update(overrides)
    return grade.argparse.Namespace(**values)


@pytest.fixture
def fake_steps(tmp_path, monkeypatch):
    """grade() with the build and golden steps replaced by the fake binary."""

    def configure(gpu):
        exe = _fake_binary(tmp_path / "build", gpu=gpu)
        monkeypatch.setattr(grade, "build_tests", lambda chapter, build, archs: exe)
        monkeypatch.setattr(grade, "write_golden", lambda chapter, golden, seed: f"seed {seed}")
        monkeypatch.setattr(grade, "check_sass", lambda chapter, build, timeout: FAKE_SASS)

    return configure


def test_grade_without_gpu_reports_skips_and_no_speed(tmp_path, fake_steps):
    fake_steps(gpu=False)
    document, status = grade.grade(_args(tmp_path, bench=True))
    assert status == 0
    _assert_gradescope_shape(document)
    names = [t["name"] for t in document["tests"]]
    assert names[:3] == ["copy/v0_scalar", "copy/v1_vec16", "copy/v2_inflight"]
    assert document["score"] == 0  # only validation ran: no points
    assert "seed 7" in document["output"]
    assert document["output"].splitlines()[1] == grade.NO_GPU_SUMMARY
    sass = next(t for t in document["tests"] if t["name"].startswith("copy/v1_vec16: SASS"))
    assert sass["status"] == "failed" and "lacks LDG.E.128" in sass["output"]
    broken = "SASS facts: 1 of 2 versions keep every promise; broken:\n    copy/v1_vec16\n"
    assert broken in document["output"]
    assert "Speed: skipped, no CUDA device" in document["output"]
    assert (tmp_path / "build" / "grade" / "console.log").exists()


def test_grade_with_gpu_and_bench(tmp_path, fake_steps, monkeypatch):
    fake_steps(gpu=True)
    rows = [{"op": "copy", "version": "v2_inflight", "time_us": 1.0, "gbps": 2.0,
             "pct_ceiling": 95.0, "correct": True}]  # fmt: skip
    monkeypatch.setattr(grade, "run_bench", lambda chapter, build, archs: rows)
    document, status = grade.grade(_args(tmp_path, bench=True))
    assert status == 0
    _assert_gradescope_shape(document)
    assert document["score"] == document["max_score"] == 3.0
    assert "copy/v2_inflight: 95% of bound (speed, not graded)" in [
        t["name"] for t in document["tests"]
    ]
    assert document["leaderboard"][0]["value"] == 95.0


def test_grade_bench_failure_is_a_tooling_failure(tmp_path, fake_steps, monkeypatch):
    fake_steps(gpu=True)

    def broken(chapter, build, archs):
        raise grade.ToolFailure("bench failed (status 2)")

    monkeypatch.setattr(grade, "run_bench", broken)
    document, status = grade.grade(_args(tmp_path, bench=True))
    assert status == 1
    assert document["score"] == 3.0  # correctness still reported
    assert document["tests"][-1]["name"] == "speed (not graded)"


def test_build_failure_writes_a_zero_report_and_exits_1(tmp_path, monkeypatch, capsys):
    def broken(chapter, build, archs):
        raise grade.ToolFailure("build failed (status 1):\nv0_scalar.cu(16): error: expected ';'")

    monkeypatch.setattr(grade, "build_tests", broken)
    out = tmp_path / "results" / "results.json"
    status = grade.main(
        ["--chapter", "00_roofline", "--build-dir", str(tmp_path), "--out", str(out)]
    )
    assert status == 1
    document = json.loads(out.read_text())
    _assert_gradescope_shape(document)
    assert document["score"] == 0
    assert document["max_score"] == 3.0  # v0_scalar, v1_vec16, v2_inflight from chapters/
    assert "expected ';'" in document["tests"][0]["output"]
    assert "Grading did not run" in document["output"]
    assert "expected ';'" in capsys.readouterr().err


def test_expected_versions_come_from_the_version_files(tmp_path):
    for name in ("v0_scalar.cu", "v10_late.cu", "v2_x.cu", "peers.cu", "mutants.cu", "x.cuh"):
        (tmp_path / name).write_text("")
    assert grade.expected_versions(tmp_path) == ["v0_scalar", "v2_x", "v10_late"]


@pytest.mark.skipif(os.name != "posix", reason="fake binary needs a shebang")
def test_timeout_is_reported(tmp_path):
    exe = tmp_path / "test_slow"
    exe.write_text(
        f"#!{sys.executable}\nimport sys, time\n"
        "if '--gtest_list_tests' in sys.argv:\n"
        "    print('S.'); print('  T/op__v0_a'); sys.exit(0)\n"
        "print('[ RUN      ] S.T/op__v0_a', flush=True); time.sleep(30)\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    run = grade.run_tests(exe, tmp_path, tmp_path / "work", seed=None, timeout_s=1)
    (outcome,) = run.outcomes
    assert outcome.status == "failed" and "timed out after 1 s during this test" in outcome.message


def test_run_bench_builds_the_extension_and_reads_the_json_even_when_a_version_is_wrong(
    tmp_path, monkeypatch
):
    steps = []

    def fake_step(label, command, env=None, check=True):
        steps.append((label, check, (env or {}).get("LKW_BUILD_DIR")))
        if label == "bench" and write_json:
            out = Path(command[command.index("--json") + 1])
            out.write_text(json.dumps({"rows": [{"op": "copy", "correct": False}]}))
        return "bench: 1 version WRONG"

    monkeypatch.setattr(grade, "configure", lambda *args, **kwargs: None)
    monkeypatch.setattr(grade, "run_step", fake_step)
    (tmp_path / "grade").mkdir()
    write_json = True
    assert grade.run_bench("00_x", tmp_path, "90a") == [{"op": "copy", "correct": False}]
    assert steps == [("build extension", True, None), ("bench", False, str(tmp_path))]
    write_json = False
    with pytest.raises(grade.ToolFailure, match="wrote no results"):
        grade.run_bench("00_x", tmp_path, "90a")
