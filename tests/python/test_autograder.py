"""The autograder kit (autograder/) without CUDA, CMake or Docker: run_autograder and setup.sh run
against a fake submission in a temporary /autograder-like tree, with the grader replaced by a stub
(LKW_GRADE_CMD) that records how it was called and what the chapter held. Checked: the exercise
files land in chapters/NN_topic/ and nothing else does, the ignored files are listed, every
results.json validates against Gradescope's schema, and every failure still leaves one with
score 0 and the reason."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / "autograder"
RUN = KIT / "run_autograder"
SETUP = KIT / "setup.sh"
CHAPTER = "04_rmsnorm"
VISIBILITIES = {"visible", "hidden", "after_due_date", "after_published"}

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

# The fake chapter: three exercise files (a TODO each) and two that are not the student's work.
HANDOUT = {
    "rmsnorm.cuh": "// shared helpers\n// TODO(exercise): the warp sum. (about 3 lines)\n",
    "v0_scalar.cu": "// v0\n// TODO(exercise): one thread per row. (about 5 lines)\n",
    "v1_block_tree.cu": "// v1\n// TODO(exercise): the tree. (about 6 lines)\n",
    "mutants.cu": "// planted bugs: not the student's to change\n",
    "v2_warp_shuffle.cu": "// v2: solved in the hand-out, no TODO\n",
}

# A stand-in for tools/grade.py: records its arguments, the chapter's files and its working
# directory, then behaves as STUB_MODE says.
STUB = r"""
import json, os, sys
args = sys.argv[1:]
opt = lambda name: args[args.index(name) + 1] if name in args else None
chapter = opt("--chapter")
chapter_dir = os.path.join(os.environ["LKW_SOURCE"], "chapters", chapter or "none")
files = {}
if os.path.isdir(chapter_dir):
    for f in sorted(os.listdir(chapter_dir)):
        files[f] = open(os.path.join(chapter_dir, f)).read()
calls = os.environ["STUB_CALLS"]
with open(calls, "a") as log:
    log.write(json.dumps({"args": args, "cwd": os.getcwd(), "files": files}) + "\n")
mode = os.environ.get("STUB_MODE", "ok")
print("stub grader: building chapter", chapter)
if mode == "crash":
    print("Traceback (most recent call last): boom", file=sys.stderr)
    sys.exit(3)
out = opt("--out")
if mode == "garbage":
    open(out, "w").write("{not json")
    sys.exit(0)
if mode == "bad_schema":
    open(out, "w").write(json.dumps({"score": 1, "tests": [{"name": "x", "status": "ok"}]}))
    sys.exit(0)
entry = lambda name, score, status: {"name": name, "score": score, "max_score": 1.0,
                                      "status": status, "output": "stub", "visibility": "visible"}
build_failed = mode == "build_failed"
tests = [entry("rmsnorm/v0_scalar", 0.0 if build_failed else 1.0,
               "failed" if build_failed else "passed"),
         entry("rmsnorm/v1_block_tree", 0.0, "failed")]
doc = {"score": sum(t["score"] for t in tests), "max_score": 2.0, "output": "stub summary",
       "visibility": "visible", "execution_time": 0.1, "tests": tests}
open(out, "w").write(json.dumps(doc))
sys.exit(1 if build_failed else 0)
"""


def schema_errors(doc) -> list[str]:
    """Gradescope's results.json as this kit promises it: top-level score and max_score, tests[]
    each with name, score, max_score, status passed/failed, output and visibility."""
    errors = []
    if not isinstance(doc, dict):
        return ["the document is not an object"]

    def number(value):
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    for key in ("score", "max_score"):
        if not number(doc.get(key)):
            errors.append(f"top-level {key} missing or not a number: {doc.get(key)!r}")
    if "output" in doc and not isinstance(doc["output"], str):
        errors.append("top-level output is not a string")
    if "visibility" in doc and doc["visibility"] not in VISIBILITIES:
        errors.append(f"top-level visibility {doc['visibility']!r}")
    tests = doc.get("tests")
    if not isinstance(tests, list) or not tests:
        return errors + ["tests missing, not a list, or empty"]
    for i, test in enumerate(tests):
        if not isinstance(test, dict):
            errors.append(f"tests[{i}] is not an object")
            continue
        for key in ("name", "output"):
            if not isinstance(test.get(key), str):
                errors.append(f"tests[{i}].{key} missing or not a string")
        for key in ("score", "max_score"):
            if not number(test.get(key)):
                errors.append(f"tests[{i}].{key} missing or not a number")
        score, top = test.get("score"), test.get("max_score")
        if number(score) and number(top) and not 0 <= score <= top + 1e-9:
            errors.append(f"tests[{i}].score {score} outside [0, max_score]")
        if test.get("status") not in ("passed", "failed"):
            errors.append(f"tests[{i}].status {test.get('status')!r} not passed/failed")
        if test.get("visibility") not in VISIBILITIES:
            errors.append(f"tests[{i}].visibility {test.get('visibility')!r}")
    if number(doc.get("max_score")) and all(number(t.get("max_score")) for t in tests):
        total = sum(t["max_score"] for t in tests if isinstance(t, dict))
        if abs(total - doc["max_score"]) > 1e-6:
            errors.append(f"max_score {doc['max_score']} != sum of the tests' {total}")
    return errors


def test_the_validator_catches_what_it_should():
    good = {
        "score": 1,
        "max_score": 2,
        "tests": [
            {
                "name": "a",
                "score": 1,
                "max_score": 2,
                "status": "passed",
                "output": "",
                "visibility": "visible",
            }
        ],
    }
    assert schema_errors(good) == []
    assert schema_errors({"score": 1, "tests": []})
    bad = json.loads(json.dumps(good))
    bad["tests"][0]["status"] = "skipped"
    bad["tests"][0]["visibility"] = "sometimes"
    del bad["tests"][0]["output"]
    assert len(schema_errors(bad)) == 3
    bad = json.loads(json.dumps(good))
    bad["tests"][0]["score"] = True
    assert schema_errors(bad)


class Tree:
    """A temporary /autograder: source/ (a fake workbook with one chapter and the kit's scripts),
    submission/, results/, and the stub grader."""

    def __init__(self, root: Path):
        self.root = root
        self.source = root / "source"
        self.submission = root / "submission"
        self.results = root / "results" / "results.json"
        self.chapter = self.source / "chapters" / CHAPTER
        self.chapter.mkdir(parents=True)
        (self.source / "chapters" / "01_formats").mkdir()
        for name, text in HANDOUT.items():
            (self.chapter / name).write_text(text)
        shutil.copytree(
            KIT,
            self.source / "autograder",
            ignore=shutil.ignore_patterns("chapter", "archs", "pristine"),
        )
        self.submission.mkdir()
        self.stub = root / "stub_grade.py"
        self.stub.write_text(STUB)
        self.calls = root / "calls.jsonl"

    def env(self, **extra) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LKW_", "STUB_"))}
        env.update(
            LKW_AUTOGRADER_ROOT=str(self.root),
            LKW_SOURCE=str(self.source),
            LKW_GRADE_CMD=f"{sys.executable} {self.stub}",
            LKW_GRADE_BUILD_DIR=str(self.root / "build"),
            LKW_HELPER_PYTHON=sys.executable,
            STUB_CALLS=str(self.calls),
        )
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def submit(self, files: dict[str, str]) -> None:
        for rel, text in files.items():
            path = self.submission / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    def setup(self, **extra) -> subprocess.CompletedProcess:
        env = self.env(**{"LKW_CHAPTER": CHAPTER, "LKW_ARCHS": "90a", "LKW_SETUP_VENV": 0, **extra})
        return subprocess.run(
            ["bash", str(self.source / "autograder" / "setup.sh")],
            env=env,
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def run(self, **extra) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(self.source / "autograder" / "run_autograder")],
            env=self.env(**extra),
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def report(self) -> dict:
        doc = json.loads(self.results.read_text())
        assert schema_errors(doc) == [], doc
        return doc

    def grader_calls(self) -> list[dict]:
        if not self.calls.exists():
            return []
        return [json.loads(line) for line in self.calls.read_text().splitlines()]


@pytest.fixture
def tree(tmp_path):
    t = Tree(tmp_path / "autograder")
    done = t.setup()
    assert done.returncode == 0, done.stdout + done.stderr
    t.calls.unlink()  # the warm-up grading (checked in its own test)
    return t


def _opt(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_setup_records_the_chapter_keeps_the_handout_and_warms_the_build(tmp_path):
    t = Tree(tmp_path / "autograder")
    done = t.setup()
    assert done.returncode == 0, done.stdout + done.stderr
    kit = t.source / "autograder"
    assert (kit / "chapter").read_text().strip() == CHAPTER
    assert (kit / "archs").read_text().strip() == "90a"
    pristine = kit / "pristine" / CHAPTER
    assert {p.name: p.read_text() for p in pristine.iterdir()} == HANDOUT
    (call,) = t.grader_calls()  # one warm-up grading, of the untouched hand-out
    assert _opt(call["args"], "--chapter") == CHAPTER
    assert _opt(call["args"], "--archs") == "90a"
    assert _opt(call["args"], "--build-dir") == str(t.root / "build")
    assert call["files"] == HANDOUT
    assert not t.results.exists()  # the warm-up is no student's result


def test_setup_fails_on_a_warm_up_that_fails_and_on_an_unknown_chapter(tmp_path):
    t = Tree(tmp_path / "autograder")
    assert t.setup(STUB_MODE="crash").returncode != 0
    assert t.setup(STUB_MODE="build_failed").returncode != 0
    done = t.setup(LKW_CHAPTER="99_nothing")
    assert done.returncode != 0 and "no chapter" in done.stderr


def test_submission_files_are_copied_into_the_chapter_and_others_ignored(tree):
    tree.submit(
        {
            "v0_scalar.cu": "// my v0\n",  # flat
            f"lkw/chapters/{CHAPTER}/v1_block_tree.cu": "// my v1\n",  # in a repository's tree
            f"lkw/chapters/{CHAPTER}/mutants.cu": "// trying to change the mutants\n",
            "v2_warp_shuffle.cu": "// no TODO in the hand-out: not an exercise file\n",
            "notes.txt": "hello\n",
            "v9_extra.cu": "// not in the chapter\n",
            "chapters/01_formats/formats.cuh": "// another chapter\n",
            "scratch/rmsnorm.cuh": "// not flat and not in the chapter's folder\n",
        }
    )
    done = tree.run()
    assert done.returncode == 0, done.stdout + done.stderr
    (call,) = tree.grader_calls()
    files = call["files"]
    assert files["v0_scalar.cu"] == "// my v0\n"
    assert files["v1_block_tree.cu"] == "// my v1\n"
    for untouched in ("rmsnorm.cuh", "mutants.cu", "v2_warp_shuffle.cu"):
        assert files[untouched] == HANDOUT[untouched]
    assert set(files) == set(HANDOUT)  # nothing added to the chapter
    assert not (tree.source / "chapters" / "01_formats" / "formats.cuh").exists()

    args = call["args"]
    assert _opt(args, "--chapter") == CHAPTER
    assert _opt(args, "--archs") == "90a"  # as set up, so the build stays incremental
    assert _opt(args, "--build-dir") == str(tree.root / "build")
    assert call["cwd"] == str(tree.source)

    report = tree.report()
    assert report["score"] == 1.0 and report["max_score"] == 2.0  # the grader's own numbers
    entry = report["tests"][0]
    assert entry["name"].startswith("submission files") and entry["max_score"] == 0
    text = entry["output"]
    assert f"v0_scalar.cu -> chapters/{CHAPTER}/v0_scalar.cu" in text
    assert f"lkw/chapters/{CHAPTER}/v1_block_tree.cu -> chapters/{CHAPTER}/v1_block_tree.cu" in text
    assert "Not submitted, graded as handed out: rmsnorm.cuh" in text
    for ignored in (
        "notes.txt",
        "v9_extra.cu",
        "v2_warp_shuffle.cu",
        f"lkw/chapters/{CHAPTER}/mutants.cu",
        "chapters/01_formats/formats.cuh",
        "scratch/rmsnorm.cuh",
    ):
        assert ignored in text.split("Ignored", 1)[1], ignored
    assert text in report["output"]
    assert not (tree.root / "results" / "grader-results.json").exists()


def test_a_submission_path_with_a_trailing_slash(tree):
    tree.submit({"v0_scalar.cu": "// mine\n"})
    assert tree.run(LKW_SUBMISSION=f"{tree.submission}//").returncode == 0
    (call,) = tree.grader_calls()
    assert call["files"]["v0_scalar.cu"] == "// mine\n"


def test_a_file_in_the_chapter_folder_wins_over_a_flat_one(tree):
    tree.submit({"v0_scalar.cu": "// flat\n", f"{CHAPTER}/v0_scalar.cu": "// in the folder\n"})
    assert tree.run().returncode == 0
    (call,) = tree.grader_calls()
    assert call["files"]["v0_scalar.cu"] == "// in the folder\n"
    assert "v0_scalar.cu (another v0_scalar.cu was used)" in tree.report()["tests"][0]["output"]


def test_the_previous_submission_does_not_outlive_its_run(tree):
    tree.submit({"v0_scalar.cu": "// student A\n"})
    assert tree.run().returncode == 0
    (tree.submission / "v0_scalar.cu").unlink()
    tree.submit({"v1_block_tree.cu": "// student B\n"})
    assert tree.run().returncode == 0
    first, second = tree.grader_calls()
    assert first["files"]["v0_scalar.cu"] == "// student A\n"
    assert second["files"]["v0_scalar.cu"] == HANDOUT["v0_scalar.cu"]
    assert second["files"]["v1_block_tree.cu"] == "// student B\n"


def test_the_chapter_comes_from_the_environment_first(tree):
    other = tree.source / "chapters" / "03_dynamic_quant"
    other.mkdir()
    (other / "v0_two_pass.cu").write_text("// TODO(exercise): two passes.\n")
    tree.submit({"v0_two_pass.cu": "// mine\n"})
    assert tree.run(LKW_CHAPTER="03_dynamic_quant").returncode == 0
    (call,) = tree.grader_calls()
    assert _opt(call["args"], "--chapter") == "03_dynamic_quant"
    assert call["files"]["v0_two_pass.cu"] == "// mine\n"


def test_grader_options_pass_through(tree):
    tree.submit({"v0_scalar.cu": "// mine\n"})
    done = tree.run(
        LKW_GRADE_SEED=7,
        LKW_POINTS_PER_VERSION=2.5,
        LKW_GRADE_ARGS="--bench",
        LKW_ARCHS="80",
        LKW_STDOUT_VISIBILITY="visible",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (call,) = tree.grader_calls()
    args = call["args"]
    assert _opt(args, "--seed") == "7"
    assert _opt(args, "--points-per-version") == "2.5"
    assert _opt(args, "--archs") == "80"
    assert "--bench" in args
    assert tree.report()["stdout_visibility"] == "visible"


def _assert_failed(tree, done, *phrases):
    assert done.returncode == 0, done.stdout + done.stderr  # the results stand
    report = tree.report()
    assert report["score"] == 0
    assert all(t["score"] == 0 for t in report["tests"])
    text = report["output"] + "\n".join(t["output"] for t in report["tests"])
    for phrase in phrases:
        assert phrase in text, (phrase, text)
    return report


def test_a_crashing_grader_still_leaves_a_valid_results_json(tree):
    tree.submit({"v0_scalar.cu": "// mine\n"})
    report = _assert_failed(
        tree,
        tree.run(STUB_MODE="crash"),
        "without writing results",
        "boom",
        "v0_scalar.cu -> chapters",
    )
    # The chapter's graded versions (files v<N>_*.cu) make max_score, one point each.
    assert report["max_score"] == 3.0
    assert report["tests"][0]["status"] == "failed"


@pytest.mark.parametrize("mode", ["garbage", "bad_schema"])
def test_unreadable_grader_results_are_replaced(tree, mode):
    tree.submit({"v0_scalar.cu": "// mine\n"})
    _assert_failed(tree, tree.run(STUB_MODE=mode), "grader")


def test_a_build_failure_keeps_the_graders_report(tree):
    tree.submit({"v0_scalar.cu": "// does not compile\n"})
    done = tree.run(STUB_MODE="build_failed")
    assert done.returncode == 0
    report = tree.report()
    assert report["score"] == 0 and report["max_score"] == 2.0
    assert report["tests"][1]["name"] == "rmsnorm/v0_scalar"


def test_a_grader_past_its_time_limit(tree, tmp_path):
    slow = tmp_path / "slow.py"
    slow.write_text("import time\ntime.sleep(30)\n")
    tree.submit({"v0_scalar.cu": "// mine\n"})
    done = tree.run(LKW_GRADE_CMD=f"{sys.executable} {slow}", LKW_GRADE_TIMEOUT=1)
    _assert_failed(tree, done, "time limit")


def test_no_exercise_file_in_the_submission(tree):
    tree.submit({"README.md": "I forgot\n", "v9_extra.cu": "//\n"})
    _assert_failed(
        tree,
        tree.run(),
        "no exercise file",
        "rmsnorm.cuh",
        "v0_scalar.cu",
        "README.md (not an exercise file",
    )
    assert tree.grader_calls() == []


def test_an_empty_or_missing_submission_folder(tree):
    _assert_failed(tree, tree.run(), "no exercise file")
    shutil.rmtree(tree.submission)
    _assert_failed(tree, tree.run(), "no submission folder")


def test_no_or_unknown_chapter(tree):
    (tree.source / "autograder" / "chapter").unlink()
    _assert_failed(tree, tree.run(), "no chapter to grade")
    _assert_failed(tree, tree.run(LKW_CHAPTER="../../etc"), "not in")
    _assert_failed(tree, tree.run(LKW_CHAPTER="05_missing"), "not in")
    assert tree.grader_calls() == []


def test_symlinks_and_includes_of_solutions_are_refused(tree):
    target = tree.root / "secret.cu"
    target.write_text("// somewhere else\n")
    (tree.submission / "v0_scalar.cu").symlink_to(target)
    tree.submit({"v1_block_tree.cu": "// ok\n"})
    assert tree.run().returncode == 0
    (call,) = tree.grader_calls()
    assert call["files"]["v0_scalar.cu"] == HANDOUT["v0_scalar.cu"]
    assert "v0_scalar.cu (not a plain file)" in tree.report()["output"]

    tree.submit({"v1_block_tree.cu": '#include "../../solutions/04_rmsnorm/v1_block_tree.cu"\n'})
    _assert_failed(tree, tree.run(), "solutions/")
    assert len(tree.grader_calls()) == 1


def test_scripts_parse_and_pass_shellcheck():
    for script in (RUN, SETUP):
        assert os.access(script, os.X_OK), f"{script} is not executable"
        done = subprocess.run(
            ["bash", "-n", str(script)], check=False, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    done = subprocess.run(
        ["shellcheck", "--severity=warning", str(RUN), str(SETUP)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout


def test_dockerfile_pins_a_cuda_13_base_and_runs_setup():
    text = (KIT / "Dockerfile").read_text()
    base = next(line for line in text.splitlines() if line.startswith("ARG CUDA_IMAGE="))
    image = base.split("=", 1)[1]
    assert image.startswith("nvidia/cuda:13.") and "-devel-ubuntu" in image, image
    assert "latest" not in image
    for needed in (
        "cmake",
        "ninja-build",
        "libgtest-dev",
        "python3-venv",
        "/autograder/source",
        "setup.sh",
        "/autograder/run_autograder",
    ):
        assert needed in text, needed
    ignore = (KIT / "Dockerfile.dockerignore").read_text().split()
    assert {".git", ".venv", "build"} <= set(ignore)


def test_readme_covers_the_gpu_runner_and_the_submission():
    text = (KIT / "README.md").read_text()
    for needed in (
        "docker build",
        "--gpus all",
        "/autograder/submission",
        "/autograder/results/results.json",
        "self-hosted",
        "without a GPU",
    ):
        assert needed in text, needed
