"""Grader: builds one chapter from the exercise tree (chapters/), runs its tests and writes a
Gradescope-style results.json with a score per version.

    python tools/grade.py --chapter 01_formats
    python tools/grade.py --chapter 01_formats --out /autograder/results/results.json --seed 7
    python tools/grade.py --chapter 00_roofline --bench      # also time the versions (GPU only)

Steps, each printed as it runs:

1. configure and build the chapter's GoogleTest binary with that chapter taken from chapters/
   (`cmake -DLKW_EXERCISES=<chapter> -DLKW_BUILD_PYTHON=OFF`, architectures from --archs);
2. write fresh golden data with the Python reference (`python -m lkw.golden`, seed printed and
   settable with --seed);
3. run the tests, one process per version: a kernel that faults leaves the CUDA context broken
   for the rest of its process, so one student bug must not fail the versions after it;
4. check the SASS facts of this very build (`lkw_sass_check`, the chapter's lines only): no GPU
   needed, so a version whose machine code breaks a promise (a 16-byte load that became 4-byte
   loads, a spill, a missing shuffle) shows it even on a laptop. Feedback, never points;
5. score each (op, version) from its golden tests: GoogleTest names them
   `Suite.Test/<op>__<version>[__<case>]`. A version earns
   --points-per-version x (golden tests passed) / (golden tests of the version), where the golden
   tests are every test of the version except the argument-validation ones (`*Validation*`):
   the golden cases on the GPU (Golden.MatchesReference and the chapter's own versioned tests,
   e.g. 04's FusedVsChain) and the host-built ones (01's HostBits). A skipped golden test (no
   GPU, or an older GPU than the version needs) counts as not passed, so a TODO stub never
   scores because its GPU tests could not run here. Argument-validation tests pass for a TODO
   stub (the checks come before the kernel), so they carry no score: they are reported, like the
   chapter's host checks and the SASS facts, as feedback (max_score 0). Mutants (mutant_*: the
   tests must catch each planted bug), peers (cublas, cuda_memcpy) and ablations are reported
   with max_score 0 too; any entry whose tests were skipped says so and is never "passed";
6. with --bench and a GPU: build the Python extension from the same tree and time every version
   with tools/bench.py (LKW_BUILD_DIR=<build-dir>, so it times the student's kernels); report
   "% of bound" per version and shape (max_score 0, plus a leaderboard). Correctness and speed
   never mix in the score.

Without a GPU the report says so in its second line (correctness needs an sm_80+ GPU): every
version then scores only its host-built golden tests (chapter 01's bit functions), and the
feedback entries (host checks, argument validation, SASS facts per version) are what differs
between a correct solution and a planted bug.

The exit status is 0 whenever grading ran, whatever the score, and 1 when the build or the tooling
failed (the reason is printed, and results.json still says it, with a score of 0).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GRADED_VERSION = re.compile(r"^v(\d+)_[a-z0-9_]+$")
NO_DEVICE_LINE = "LKW: no CUDA device"
MAX_FAILURES_SHOWN = 5
MAX_MESSAGE_CHARS = 1500
TAIL_CHARS = 4000


class ToolFailure(Exception):
    """The build or the grading tooling failed; the message says which step and why."""


# ---------------------------------------------------------------------------------------------
# Test names and outcomes


def version_of(test_name: str) -> tuple[str, str] | None:
    """(op, version) of `Suite.Test/<op>__<version>[__<case>]`, or None for a test of no version."""
    test = test_name.split(".", 1)[-1]
    if "/" not in test:
        return None
    parts = test.rsplit("/", 1)[1].split("__")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        return None
    return parts[0], parts[1]


def kind_of(version: str) -> str:
    if version.startswith("mutant_"):
        return "mutant"
    if version.startswith("ablation_"):  # a version with one knob off: tested, never graded
        return "ablation"
    return "version" if GRADED_VERSION.match(version) else "peer"


@dataclass
class Outcome:
    name: str  # Suite.Test/param, as GoogleTest prints it
    status: str  # "passed" | "failed" | "skipped"
    message: str = ""  # failure text, or the skip reason
    seconds: float = 0.0


@dataclass
class ConsoleTest:
    status: str | None  # None while the test never finished (its process died during it)
    text: str


CONSOLE_END = {"OK": "passed", "FAILED": "failed", "SKIPPED": "skipped"}


def parse_console(text: str) -> dict[str, ConsoleTest]:
    """Each test's console output between `[ RUN      ]` and its `[ OK | FAILED | SKIPPED ]`."""
    tests: dict[str, ConsoleTest] = {}
    current: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        end = re.match(r"^\[\s*(OK|FAILED|SKIPPED)\s*\] (\S+?),?(\s|$)", line)
        if line.startswith("[ RUN      ] "):
            current, lines = line[13:].strip(), []
        elif current and end and end.group(2) == current:
            tests[current] = ConsoleTest(CONSOLE_END[end.group(1)], "\n".join(lines))
            current = None
        elif current:
            lines.append(line)
    if current:
        tests[current] = ConsoleTest(None, "\n".join(lines))
    return tests


def skip_reason(console_text: str) -> str:
    """GoogleTest prints `file:line: Skipped` and then the GTEST_SKIP message."""
    lines = console_text.splitlines()
    for i, line in enumerate(lines):
        if line.rstrip().endswith(": Skipped") and i + 1 < len(lines) and lines[i + 1].strip():
            return lines[i + 1].strip()
    return "no reason given"


def parse_gtest_report(report: dict, console: dict[str, ConsoleTest]) -> list[Outcome]:
    """Outcomes from a GoogleTest JSON report (--gtest_output=json); the console output supplies
    the skip reasons, which the report does not carry."""
    outcomes = []
    for suite in report.get("testsuites", []):
        for test in suite.get("testsuite", []):
            if test.get("status", "RUN") != "RUN":
                continue  # DISABLED_ or filtered out
            name = f"{test.get('classname', '')}.{test.get('name', '')}".strip(".")
            name = name or "(outside any test)"
            seconds = float(str(test.get("time", "0s")).rstrip("s") or 0)
            failures = [f.get("failure", "") for f in test.get("failures", [])]
            if test.get("result", "").upper() == "SKIPPED":
                skipped = test.get("skipped") or [{}]
                reason = skipped[0].get("message") or skip_reason(
                    console.get(name, ConsoleTest(None, "")).text
                )
                outcomes.append(Outcome(name, "skipped", reason, seconds))
            elif failures:
                outcomes.append(Outcome(name, "failed", "\n".join(failures), seconds))
            else:
                outcomes.append(Outcome(name, "passed", "", seconds))
    return outcomes


def outcomes_without_report(
    names: list[str], console: dict[str, ConsoleTest], why: str
) -> list[Outcome]:
    """When a test process dies before writing its report: the tests it finished keep their console
    status; the one running fails with `why`; the ones after it fail as not run."""
    outcomes = []
    for name in names:
        seen = console.get(name)
        if seen and seen.status == "skipped":
            outcomes.append(Outcome(name, "skipped", skip_reason(seen.text)))
        elif seen and seen.status:
            outcomes.append(Outcome(name, seen.status, seen.text))
        elif seen:
            outcomes.append(
                Outcome(name, "failed", f"{why} during this test:\n{seen.text[-TAIL_CHARS:]}")
            )
        else:
            outcomes.append(Outcome(name, "failed", f"not run: {why} before this test started"))
    return outcomes


def parse_test_list(text: str) -> list[str]:
    """Full test names from `--gtest_list_tests` (suite lines end with '.', tests are indented)."""
    names, suite = [], None
    for line in text.splitlines():
        if not line.strip():
            continue
        first = line.split()[0]
        if line.startswith("  "):
            if suite:
                names.append(suite + first)
        else:
            suite = first if first.endswith(".") else None
    return names


# ---------------------------------------------------------------------------------------------
# Running the test binary, one process per version


def group_by_version(names: list[str]) -> dict[str, list[str]]:
    """{version id or "" for tests of no version: test names}."""
    groups: dict[str, list[str]] = {}
    for name in names:
        found = version_of(name)
        groups.setdefault(found[1] if found else "", []).append(name)
    return groups


def gtest_filter(version: str, names: list[str]) -> str:
    # Patterns, not name lists: a chapter's names for one version may exceed an argument's length.
    return f"*/*__{version}__*:*/*__{version}" if version else ":".join(names)


def process_ending(returncode: int | None, timeout_s: float) -> str:
    if returncode is None:
        return f"the test process timed out after {timeout_s:g} s"
    if returncode < 0:
        try:
            return f"the test process was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"the test process was killed by signal {-returncode}"
    return f"the test process exited with status {returncode} without writing its report"


@dataclass
class TestRun:
    outcomes: list[Outcome]
    has_gpu: bool
    console: str  # every process's output, for the grader's log


def run_tests(
    exe: Path, golden_dir: Path, work_dir: Path, seed: int | None, timeout_s: float
) -> TestRun:
    env = dict(os.environ, LKW_GOLDEN_DIR=str(golden_dir))
    if seed is not None:
        env["LKW_SEED"] = str(seed)
    try:
        listing = subprocess.run(
            [str(exe), "--gtest_list_tests"],
            check=False,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolFailure(f"cannot list the tests of {exe}: {e}") from e
    names = parse_test_list(listing.stdout) if listing.returncode == 0 else []
    if not names:
        raise ToolFailure(
            f"{exe.name} --gtest_list_tests listed no tests (status {listing.returncode}):\n"
            + (listing.stdout + listing.stderr)[-TAIL_CHARS:]
        )
    work_dir.mkdir(parents=True, exist_ok=True)
    outcomes, logs, has_gpu = [], [], True
    for version, group in sorted(group_by_version(names).items()):
        report_path = work_dir / f"gtest_{version or 'no_version'}.json"
        report_path.unlink(missing_ok=True)
        command = [
            str(exe),
            f"--gtest_filter={gtest_filter(version, group)}",
            f"--gtest_output=json:{report_path}",
        ]
        try:
            done = subprocess.run(
                command,
                check=False,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
            )
            returncode, raw = done.returncode, done.stdout
        except subprocess.TimeoutExpired as e:
            returncode, raw = None, e.stdout or b""
        text = raw.decode("utf-8", "replace")
        logs.append(f"$ {' '.join(command)}\n{text}")
        has_gpu &= NO_DEVICE_LINE not in text
        console = parse_console(text)
        try:
            report = json.loads(report_path.read_text())
            found = parse_gtest_report(report, console)
        except (OSError, ValueError):
            found = outcomes_without_report(group, console, process_ending(returncode, timeout_s))
        wanted = set(group)
        found = [o for o in found if o.name in wanted or o.name == "(outside any test)"]
        reported = {o.name for o in found}
        found += [Outcome(n, "failed", "listed but never run") for n in group if n not in reported]
        outcomes.extend(found)
    return TestRun(outcomes, has_gpu, "\n".join(logs))


# ---------------------------------------------------------------------------------------------
# Scoring


def _suite_and_test(test_name: str) -> tuple[str, str]:
    """("Validation", "RefusesBadArguments") of `Chapter/Validation.RefusesBadArguments/p`."""
    suite, _, test = test_name.partition(".")
    return suite.split("/")[-1], test.split("/")[0]


def is_validation(test_name: str) -> bool:
    """An argument-validation test (`Chapter/Validation.RefusesBadArguments/...`,
    `HostValidation.*`): it passes for a TODO stub, so it is feedback, never points."""
    return any("Validation" in part for part in _suite_and_test(test_name))


def is_host_check(test_name: str) -> bool:
    """A chapter test that runs without a GPU: its suite's name starts with Host."""
    return _suite_and_test(test_name)[0].startswith("Host")


def _entry(name: str, score: float, max_score: float, passed: bool, output: str) -> dict:
    return {
        "name": name,
        "score": round(score, 4),
        "max_score": max_score,
        "status": "passed" if passed else "failed",
        "output": output,
        "visibility": "visible",
    }


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + " [...]"


def describe(outcomes: list[Outcome]) -> str:
    """The tally, the first failures with their messages, and the skips grouped by reason."""
    count = Counter(o.status for o in outcomes)
    seconds = sum(o.seconds for o in outcomes)
    lines = [
        (
            f"{count['passed']} of {len(outcomes)} tests passed, {count['failed']} failed,"
            f" {count['skipped']} skipped ({seconds:.2f} s)."
        )
    ]
    failed = [o for o in outcomes if o.status == "failed"]
    for o in failed[:MAX_FAILURES_SHOWN]:
        lines.append(f"FAILED {o.name}\n{_clip(o.message)}")
    if len(failed) > MAX_FAILURES_SHOWN:
        lines.append(f"... and {len(failed) - MAX_FAILURES_SHOWN} more failed tests.")
    for reason, n in Counter(o.message for o in outcomes if o.status == "skipped").most_common():
        lines.append(f"{n} test{'s' * (n != 1)} skipped: {reason}")
    return "\n".join(lines)


def all_passed(outcomes: list[Outcome]) -> bool:
    """Passed means run and passed: a skipped test is never a pass."""
    return bool(outcomes) and all(o.status == "passed" for o in outcomes)


def version_entry(
    op: str, version: str, outcomes: list[Outcome], points: float, validation: list[Outcome]
) -> dict:
    """points x passed golden tests / golden tests; the validation tests are only mentioned."""
    golden = [o for o in outcomes if not is_validation(o.name)]
    count = Counter(o.status for o in golden)
    total = len(golden)
    score = points * count["passed"] / total if total else 0.0
    if not total:
        text = (
            "No golden test of this version ran, so it scores 0: does the golden data have a case"
            " for its op? (see 'host checks')"
        )
    else:
        text = "Golden tests: " + describe(golden)
        if count["skipped"] == total:
            text = (
                "Not checked on this machine: every golden test of this version was skipped, so"
                " it scores 0 here. Grade it on a machine that can run it (an sm_80+ GPU).\n" + text
            )
        elif count["skipped"]:
            text += "\nSkipped tests count as not passed: grade on a machine that can run them."
    if validation:
        v_count = Counter(o.status for o in validation)
        text += (
            f"\nArgument validation (feedback, no points): {v_count['passed']} of"
            f" {len(validation)} passed"
            + (" (see 'argument validation')" if v_count["failed"] else "")
            + "."
        )
    return _entry(f"{op}/{version}", score, points, all_passed(golden), text)


def ungraded_entry(version: str, points: float, reason: str) -> dict:
    return _entry(version, 0.0, points, False, reason)


def informational_entry(label: str, outcomes: list[Outcome]) -> dict:
    """max_score 0; "passed" only when every test ran and passed: skipped is not passed, and an
    entry with skips and no failure says SKIPPED first (the summary shows it as skipped)."""
    text = describe(outcomes)
    count = Counter(o.status for o in outcomes)
    if outcomes and count["skipped"] == len(outcomes):
        text = "SKIPPED, not checked on this machine (not a pass).\n" + text
    elif count["skipped"] and not count["failed"]:
        text = (
            f"SKIPPED in part: {count['skipped']} of {len(outcomes)} tests could not run on this"
            " machine (not a pass).\n" + text
        )
    elif count["skipped"]:
        text += "\nSome tests were skipped: this entry is not a pass until they run."
    return _entry(label, 0.0, 0.0, all_passed(outcomes), text)


def _order(op: str, version: str) -> tuple:
    graded = GRADED_VERSION.match(version)
    rank = {"version": 0, "ablation": 1, "peer": 2, "mutant": 3}[kind_of(version)]
    return (rank, op, int(graded.group(1)) if graded else 0, version)


# ---------------------------------------------------------------------------------------------
# SASS facts (no GPU needed): lkw_sass_check prints `ok|FAIL <arch> <chapter/op/version> <promise>`

SASS_LINE = re.compile(
    r"^(?P<status>ok|FAIL)\s+(?P<arch>sm_\w+)\s+(?P<name>[^\s/]+/[^\s/]+/\S+)\s*(?P<text>.*)$"
)
SASS_TALLY = re.compile(r"^\d+ passed, \d+ failed$")


@dataclass
class SassFact:
    ok: bool
    arch: str
    chapter: str
    op: str
    version: str
    text: str  # the promise, and after ': ' what is wrong when it failed


@dataclass
class SassReport:
    facts: list[SassFact]
    problems: list[str]  # lines about the whole check (no cuobjdump, no SASS for an arch, ...)
    error: str = ""  # the check could not run at all (the reason)


def parse_sass_check(text: str, chapter: str) -> SassReport:
    """The chapter's facts from lkw_sass_check's output; lines of other chapters are dropped,
    lines about the check itself (FAIL without a version) are kept as problems."""
    facts, problems = [], []
    for line in text.splitlines():
        line = line.rstrip()
        found = SASS_LINE.match(line)
        if found:
            parts = found["name"].split("/")
            if parts[0] != chapter or len(parts) != 3:
                continue
            facts.append(
                SassFact(found["status"] == "ok", found["arch"], *parts, found["text"].strip())
            )
        elif line.strip() and not SASS_TALLY.match(line.strip()):
            problems.append(line.strip())
    return SassReport(facts, problems)


def sass_entries(report: SassReport | None) -> list[dict]:
    """One feedback entry per (op, version) with SASS facts, each arch's verdict per promise."""
    if report is None:
        return []
    if report.error or (not report.facts and report.problems):
        reason = report.error or "\n".join(report.problems)
        return [_entry("SASS facts (feedback, not graded)", 0, 0, False, "Not checked: " + reason)]
    by_version: dict[tuple[str, str], list[SassFact]] = {}
    for fact in report.facts:
        by_version.setdefault((fact.op, fact.version), []).append(fact)
    entries = []
    for op, version in sorted(by_version, key=lambda key: _order(*key)):
        facts = by_version[(op, version)]
        bad = [f for f in facts if not f.ok]
        lines = [
            (
                f"{len(facts) - len(bad)} of {len(facts)} SASS facts hold (read from this build's"
                " machine code, no GPU needed)."
            )
        ]
        lines += [f"{'ok  ' if f.ok else 'FAIL'} {f.arch:<6} {f.text}" for f in facts]
        if report.problems:
            lines.append("The check itself reported: " + "; ".join(report.problems))
        kind = kind_of(version)
        label = f"{op}/{version}: SASS facts" + (f" ({kind})" if kind != "version" else "")
        entries.append(_entry(f"{label} (feedback, not graded)", 0, 0, not bad, "\n".join(lines)))
    return entries


def grade_entries(
    outcomes: list[Outcome],
    points: float,
    expected_versions: list[str],
    sass: SassReport | None = None,
) -> list[dict]:
    """One Gradescope test per graded (op, version), scored from its golden tests; then, with
    max_score 0: ablations, peers and mutants, the SASS facts per version, the argument
    validation, the host checks and the chapter's GPU checks of no version. An expected version
    that no test ran scores 0 with the reason."""
    by_version: dict[tuple[str, str], list[Outcome]] = {}
    no_version = []
    for o in outcomes:
        found = version_of(o.name)
        if found:
            by_version.setdefault(found, []).append(o)
        else:
            no_version.append(o)
    entries, validation, informational = [], [], []
    for op, version in sorted(by_version, key=lambda key: _order(*key)):
        tests = by_version[(op, version)]
        kind = kind_of(version)
        checks = [o for o in tests if is_validation(o.name)]
        if kind == "version":
            validation += checks
            entries.append(version_entry(op, version, tests, points, checks))
        else:
            informational.append(informational_entry(f"{op}/{version} ({kind}, not graded)", tests))
    seen = {version for _, version in by_version}
    for version in expected_versions:
        if version not in seen:
            entries.append(
                ungraded_entry(
                    version,
                    points,
                    f"No test of {version} ran: is the version registered under this id, and does"
                    " the golden data have a case for its op? (see 'host checks')",
                )
            )
    entries += informational
    entries += sass_entries(sass)
    if validation:
        entries.append(
            informational_entry("argument validation (feedback, not graded)", validation)
        )
    host = [o for o in no_version if is_host_check(o.name)]
    gpu = [o for o in no_version if not is_host_check(o.name)]
    if host:
        entries.append(informational_entry("host checks (feedback, not graded)", host))
    if gpu:
        entries.append(informational_entry("chapter checks (not graded)", gpu))
    return entries


def expected_versions(chapter_dir: Path) -> list[str]:
    """Version ids from the file names (one file per version, named by its id)."""
    stems = [p.stem for p in chapter_dir.glob("v*.cu") if GRADED_VERSION.match(p.stem)]
    return sorted(stems, key=lambda v: _order("", v))


def bench_entries(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """Informational "<op>/<version>: NN% of bound" entries and a leaderboard of the graded
    versions that were verified correct."""
    entries, leaderboard = [], []
    for row in rows:
        op, version = row.get("op", "?"), row.get("version", "?")
        label = f"{op}/{version}" + (f" [{row['shape']}]" if row.get("shape") else "")
        pct, correct = row.get("pct_ceiling"), bool(row.get("correct"))
        bound = f"{pct:.0f}% of bound" if isinstance(pct, (int, float)) else "no bound"
        parts = [
            f"{row['time_us']:.2f} us" if isinstance(row.get("time_us"), (int, float)) else None,
            f"{row['gbps']:.1f} GB/s" if isinstance(row.get("gbps"), (int, float)) else None,
            "output verified" if correct else "output WRONG: the time does not count",
        ]
        output = ", ".join(p for p in parts if p)
        entries.append(_entry(f"{label}: {bound} (speed, not graded)", 0.0, 0.0, correct, output))
        if correct and kind_of(version) == "version" and isinstance(pct, (int, float)):
            leaderboard.append(
                {"name": f"{label} % of bound", "value": round(pct, 1), "order": "desc"}
            )
    return entries, leaderboard


def results_document(
    entries: list[dict], summary: str, seconds: float, leaderboard: list[dict]
) -> dict:
    graded = [e for e in entries if e["max_score"] > 0]
    document = {
        "score": round(sum(e["score"] for e in graded), 4),
        "max_score": round(sum(e["max_score"] for e in graded), 4),
        "execution_time": round(seconds, 2),
        "output": summary,
        "visibility": "visible",
        "tests": entries,
    }
    if leaderboard:
        document["leaderboard"] = leaderboard
    return document


NO_GPU_SUMMARY = (
    "Correctness needs an sm_80+ GPU: none here, so the GPU tests were skipped and score 0."
)
NO_GPU_BLIND_SPOT = (
    "Not visible without a GPU: whether any kernel's output is right (a race, a missing barrier,\n"
    "wrong shuffle offsets or indices pass every check above). Grade on an sm_80+ GPU for that."
)


def summary_text(chapter: str, entries: list[dict], notes: list[str], has_gpu: bool = True) -> str:
    """The score, the no-GPU line, the graded versions, then a line per kind of feedback."""
    graded = [e for e in entries if e["max_score"] > 0]
    score = sum(e["score"] for e in graded)
    total = sum(e["max_score"] for e in graded)
    lines = [f"Chapter {chapter} from chapters/{chapter}: {score:.2f} / {total:g} points"]
    if not has_gpu:
        lines.append(NO_GPU_SUMMARY)
    lines += [f"  {e['score']:6.2f} / {e['max_score']:g}  {e['name']}" for e in graded]
    feedback = [e for e in entries if e["max_score"] == 0]
    sass = [e for e in feedback if ": SASS facts" in e["name"]]
    others = [e for e in feedback if e not in sass]
    if feedback:
        lines.append("Feedback, not graded:")
    for e in others:
        skipped = e["output"].startswith("SKIPPED")
        verdict = "skipped" if skipped else ("ok" if e["status"] == "passed" else "FAILED")
        lines.append(f"  {verdict:<7} {e['name']}")
    if sass:
        broken = [e["name"].split(": SASS facts")[0] for e in sass if e["status"] == "failed"]
        lines.append(
            f"  SASS facts: {len(sass) - len(broken)} of {len(sass)} versions keep every promise"
            + ("; broken:" if broken else "")
        )
        lines += textwrap.wrap(
            ", ".join(broken), 96, initial_indent="    ", subsequent_indent="    "
        )
    if not has_gpu:
        lines.append(NO_GPU_BLIND_SPOT)
    return "\n".join(lines + notes)


# ---------------------------------------------------------------------------------------------
# The steps


def run_step(label: str, command: list[str], env: dict | None = None, check: bool = True) -> str:
    print(f"grade: {label}: {' '.join(command)}", flush=True)
    done = subprocess.run(
        command,
        check=False,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if check and done.returncode != 0:
        raise ToolFailure(
            f"{label} failed (status {done.returncode}):\n{done.stdout[-TAIL_CHARS:]}"
        )
    return done.stdout


def find_cuobjdump() -> str | None:
    """cuobjdump for the SASS facts: $LKW_CUOBJDUMP, PATH, the CUDA toolkit, else the venv's
    PyPI copy (nvidia-cuda-cuobjdump, which tools/setup.sh installs)."""
    candidates = [os.environ.get("LKW_CUOBJDUMP", ""), shutil.which("cuobjdump") or ""]
    candidates.append(str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin/cuobjdump"))
    candidates += sorted(
        str(p) for p in REPO.glob(".venv/lib/python*/site-packages/nvidia/*/bin/cuobjdump")
    )
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def configure(chapter: str, build: Path, archs: str, python_extension: bool) -> None:
    """CMake with the chapter taken from chapters/ and only that chapter built (with the chapters
    it links, CMakeLists.txt): $LKW_ONLY overrides the list, LKW_ONLY= (empty) builds every chapter."""
    if not (REPO / "chapters" / chapter).is_dir():
        raise ToolFailure(f"no chapters/{chapter}: generate it with python3 tools/exercises.py")
    command = ["cmake", "-S", str(REPO), "-B", str(build), "-G", "Ninja"]
    command += [f"-DLKW_EXERCISES={chapter}", f"-DCMAKE_CUDA_ARCHITECTURES={archs}"]
    command += [f"-DLKW_ONLY={os.environ.get('LKW_ONLY', chapter)}"]
    cuobjdump = find_cuobjdump()
    if cuobjdump:
        command += [f"-DLKW_CUOBJDUMP={cuobjdump}"]
    run_step("configure", command + [f"-DLKW_BUILD_PYTHON={'ON' if python_extension else 'OFF'}"])


def build_tests(chapter: str, build: Path, archs: str) -> Path:
    configure(chapter, build, archs, python_extension=False)
    run_step("build", ["cmake", "--build", str(build), "--target", f"test_{chapter}"])
    return build / f"test_{chapter}"


def cmake_cache_value(build: Path, key: str) -> str:
    try:
        text = (build / "CMakeCache.txt").read_text(errors="replace")
    except OSError:
        return ""
    found = re.search(rf"^{re.escape(key)}:[A-Z]+=(.*)$", text, re.MULTILINE)
    return found.group(1).strip() if found else ""


def check_sass(chapter: str, build: Path, timeout_s: float) -> SassReport:
    """Builds lkw_sass_check from the same build (it links the kernels the tests ran) and keeps
    the chapter's lines. Never fails the grading: a problem becomes the report's error."""
    try:
        run_step("build SASS check", ["cmake", "--build", str(build), "--target", "lkw_sass_check"])
    except ToolFailure as failure:
        return SassReport([], [], f"lkw_sass_check did not build: {failure}")
    exe = build / "lkw_sass_check"
    cuobjdump = cmake_cache_value(build, "LKW_CUOBJDUMP")
    path = os.environ.get("PATH", "")
    if cuobjdump and "NOTFOUND" not in cuobjdump:  # nvdisasm sits beside cuobjdump
        path = os.pathsep.join([str(Path(cuobjdump).parent), path])
    print(f"grade: SASS facts: {exe}", flush=True)
    try:
        done = subprocess.run(
            [str(exe)],
            check=False,
            env=dict(os.environ, PATH=path),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return SassReport([], [], f"lkw_sass_check did not run: {e}")
    (build / "grade").mkdir(parents=True, exist_ok=True)
    (build / "grade" / "sass_check.log").write_text(done.stdout)
    return parse_sass_check(done.stdout, chapter)


def write_golden(chapter: str, golden_dir: Path, seed: int | None) -> str:
    """Writes the golden data; returns the generator's line that names the seed."""
    paths = [str(REPO / "reference"), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    command = [sys.executable, "-m", "lkw.golden", "--out", str(golden_dir), "--chapter", chapter]
    if seed is not None:
        command += ["--seed", str(seed)]
    log = run_step("golden data", command, env)
    return next((line.strip() for line in log.splitlines() if "seed" in line.lower()), "")


def run_bench(chapter: str, build: Path, archs: str) -> list[dict]:
    """Times this build's versions: the bench reaches kernels through the Python extension, so
    that is built here too (from the same tree) and found through LKW_BUILD_DIR. The bench exits
    non-zero when a version is wrong, which is a result, not a failure: its JSON is what counts."""
    configure(chapter, build, archs, python_extension=True)
    run_step("build extension", ["cmake", "--build", str(build), "--target", "_ext"])
    out_json = build / "grade" / "bench.json"
    out_json.unlink(missing_ok=True)
    command = [sys.executable, str(REPO / "tools" / "bench.py"), "--chapter", chapter]
    log = run_step(
        "bench",
        command + ["--json", str(out_json)],
        dict(os.environ, LKW_BUILD_DIR=str(build)),
        check=False,
    )
    if not out_json.exists():
        raise ToolFailure(f"the bench wrote no results:\n{log[-TAIL_CHARS:]}")
    data = json.loads(out_json.read_text())
    return data["rows"] if isinstance(data, dict) else data


def grade(args: argparse.Namespace) -> tuple[dict, int]:
    """Every step; returns the results document and the exit status."""
    start = time.monotonic()
    chapter, build, points = args.chapter, args.build_dir, args.points_per_version
    versions = expected_versions(REPO / "chapters" / chapter)
    notes: list[str] = []
    try:
        exe = build_tests(chapter, build, args.archs)
        notes.append(write_golden(chapter, build / "golden", args.seed))
        print(f"grade: running {exe.name}, one process per version", flush=True)
        run = run_tests(exe, build / "golden", build / "grade", args.seed, args.timeout)
        (build / "grade" / "console.log").write_text(run.console)
    except ToolFailure as failure:
        print(f"grade: {failure}", file=sys.stderr)
        reason = "Not graded: the build or the tooling failed (see 'build and tooling')."
        entries = [_entry("build and tooling", 0.0, 0.0, False, str(failure))]
        entries += [ungraded_entry(v, points, reason) for v in versions]
        summary = summary_text(chapter, entries, [f"Grading did not run: {failure}"])
        return results_document(entries, summary, time.monotonic() - start, []), 1

    sass = None
    if getattr(args, "sass", True):
        sass = check_sass(chapter, build, args.timeout)
    else:
        notes.append("SASS facts: not checked (--no-sass).")
    entries = grade_entries(run.outcomes, points, versions, sass)
    leaderboard: list[dict] = []
    status = 0
    if not args.bench:
        notes.append("Speed: not measured (pass --bench on a GPU machine).")
    elif not run.has_gpu:
        notes.append("Speed: skipped, no CUDA device on this machine.")
    else:
        try:
            speed, leaderboard = bench_entries(run_bench(chapter, build, args.archs))
            entries += speed
            notes.append("Speed: see the '% of bound' entries (not part of the score).")
        except (ToolFailure, OSError, ValueError, KeyError) as failure:
            print(f"grade: bench: {failure}", file=sys.stderr)
            entries.append(
                _entry("speed (not graded)", 0, 0, False, f"The bench failed: {failure}")
            )
            status = 1
    summary = summary_text(chapter, entries, [n for n in notes if n], run.has_gpu)
    return results_document(entries, summary, time.monotonic() - start, leaderboard), status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chapter", required=True, help="e.g. 01_formats")
    parser.add_argument("--build-dir", type=Path, help="default: build-grade-<chapter> in the repo")
    parser.add_argument("--out", type=Path, help="results JSON (default: <build-dir>/results.json)")
    parser.add_argument("--seed", type=int, help="golden-data seed (default: the generator's own)")
    parser.add_argument("--archs", default="80;89;90a", help="CMAKE_CUDA_ARCHITECTURES")
    parser.add_argument("--points-per-version", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per test process")
    parser.add_argument("--bench", action="store_true", help="also time the versions (needs a GPU)")
    parser.add_argument(
        "--no-sass",
        dest="sass",
        action="store_false",
        help="skip the SASS facts (feedback that needs no GPU)",
    )
    args = parser.parse_args(argv)
    args.build_dir = (args.build_dir or REPO / f"build-grade-{args.chapter}").resolve()
    out = args.out or args.build_dir / "results.json"

    document, status = grade(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(document["output"])
    print(f"grade: results written to {out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
