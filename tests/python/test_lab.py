"""Tests of tools/lab.sh without building anything: argument handling, the chapter list, the
architecture read from a fake nvidia-smi, and the commands it would run (--dry-run): the CMake
options, re-configuring only when they change, and what each action runs. Most tests run a copy
of the script in a fake repository, so neither the real build-lab/ nor .venv matters."""

import os
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "tools" / "lab.sh"


def _write_exe(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def fake_repo(tmp_path):
    """A repository with tools/lab.sh, two chapters and a folder of solved headers only (as a
    hand-out carries for a chapter another one includes), and a .venv python."""
    repo = tmp_path / "repo"
    (repo / "tools").mkdir(parents=True)
    shutil.copy(LAB, repo / "tools" / "lab.sh")
    for chapter in ("02_int4_dequant", "04_rmsnorm"):
        (repo / "chapters" / chapter).mkdir(parents=True)
        (repo / "chapters" / chapter / "v0_x.cu").write_text("// v0\n")
    (repo / "chapters" / "03_dynamic_quant").mkdir()
    (repo / "chapters" / "03_dynamic_quant" / "quant_math.cuh").write_text("#pragma once\n")
    _write_exe(repo / ".venv" / "bin" / "python", "#!/bin/sh\nexit 0\n")
    return repo


def _bin_with_smi(tmp_path: Path, caps: str | None) -> Path:
    """A folder holding a fake nvidia-smi: prints `caps` (one compute capability a line), or,
    with None, fails the way it does on a machine without a driver."""
    bin_dir = tmp_path / "bin"
    if caps is None:
        body = "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n"
    else:
        body = f"#!/bin/sh\nprintf '%s\\n' {' '.join(repr(c) for c in caps.split())}\n"
    _write_exe(bin_dir / "nvidia-smi", body)
    return bin_dir


def lab(repo: Path, tmp_path: Path, *args: str, caps: str | None = None, env=None):
    """Runs <repo>/tools/lab.sh with a fake nvidia-smi first on PATH."""
    bin_dir = _bin_with_smi(tmp_path, caps)
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("LKW_")}
    run_env["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"
    run_env.update(env or {})
    return subprocess.run(
        ["bash", str(repo / "tools" / "lab.sh"), *args],
        check=False,
        capture_output=True,
        text=True,
        env=run_env,
        timeout=60,
    )


def commands(done) -> list[str]:
    """The commands --dry-run printed (`+ ...` lines)."""
    return [line[2:] for line in done.stdout.splitlines() if line.startswith("+ ")]


def _cmake_configure(done) -> str | None:
    found = [c for c in commands(done) if c.startswith("cmake -S ")]
    return found[0] if found else None


def _archs(done) -> str:
    """CMAKE_CUDA_ARCHITECTURES of the configure command, as the shell would pass it."""
    words = shlex.split(_cmake_configure(done))
    return next(w.split("=", 1)[1] for w in words if w.startswith("-DCMAKE_CUDA_ARCHITECTURES="))


# ---------------------------------------------------------------------------------------------
# Arguments


def test_no_arguments_prints_usage_with_the_chapters(fake_repo, tmp_path):
    done = lab(fake_repo, tmp_path)
    assert done.returncode == 2
    assert "name a chapter" in done.stderr
    assert "usage: tools/lab.sh CHAPTER [build|test|grade|bench]" in done.stderr
    # A folder with headers only is not a chapter one can work on.
    assert "chapters: 02_int4_dequant 04_rmsnorm\n" in done.stderr


def test_help_exits_zero(fake_repo, tmp_path):
    done = lab(fake_repo, tmp_path, "--help")
    assert done.returncode == 0
    assert "chapters: 02_int4_dequant 04_rmsnorm" in done.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["99_nothing"], "no chapter '99_nothing' in chapters/"),
        (["03_dynamic_quant"], "no chapter '03_dynamic_quant' in chapters/"),
        (["0"], "'0' names several chapters: 02_int4_dequant 04_rmsnorm"),
        (["04", "compile"], "unknown action 'compile' (one of: build test grade bench)"),
        (["--dry-run", "--seed"], "the first argument must be a chapter, not '--seed'"),
    ],
)
def test_usage_errors_say_what_is_wrong_and_list_the_chapters(fake_repo, tmp_path, args, message):
    done = lab(fake_repo, tmp_path, *args)
    assert done.returncode == 2, done.stdout
    first = done.stderr.splitlines()[0]
    assert first == f"lab: {message}"
    assert "chapters: 02_int4_dequant 04_rmsnorm" in done.stderr
    assert not commands(done)


@pytest.mark.parametrize(
    "name", ["04_rmsnorm", "04", "04_rms", "chapters/04_rmsnorm/", "./04_rmsnorm"]
)
def test_a_chapter_is_named_by_a_unique_prefix_or_its_path(fake_repo, tmp_path, name):
    done = lab(fake_repo, tmp_path, name, "build", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "-DLKW_ONLY=04_rmsnorm" in _cmake_configure(done)


# ---------------------------------------------------------------------------------------------
# Architecture


@pytest.mark.parametrize(
    "caps, archs",
    [
        ("9.0", "90a"),
        ("8.0", "80"),
        ("8.9", "89"),
        ("8.6 8.6", "86"),  # two GPUs of one kind: one architecture
        ("8.0 9.0", "80;90a"),
        ("12.0", "120"),
    ],
)
def test_the_architecture_is_the_gpus(fake_repo, tmp_path, caps, archs):
    done = lab(fake_repo, tmp_path, "04", "build", "--dry-run", caps=caps)
    assert done.returncode == 0, done.stderr
    assert _archs(done) == archs
    assert "this machine's GPU" in done.stdout


def test_without_a_gpu_it_builds_for_90a_and_says_why(fake_repo, tmp_path):
    done = lab(fake_repo, tmp_path, "04", "build", "--dry-run", caps=None)
    assert done.returncode == 0, done.stderr
    assert _archs(done) == "90a"
    assert "no GPU found" in done.stdout and "sm_80+" in done.stdout


def test_a_gpu_older_than_sm80_builds_for_80_with_a_note(fake_repo, tmp_path):
    done = lab(fake_repo, tmp_path, "04", "build", "--dry-run", caps="7.5")
    assert _archs(done) == "80"
    assert "need sm_80 or newer" in done.stdout


def test_lkw_archs_overrides_the_gpu(fake_repo, tmp_path):
    done = lab(fake_repo, tmp_path, "04", "build", "-n", caps="9.0", env={"LKW_ARCHS": "80;89"})
    assert _archs(done) == "80;89"
    assert "(LKW_ARCHS)" in done.stdout


# ---------------------------------------------------------------------------------------------
# The CMake options and the commands of each action


def test_first_build_configures_only_that_chapter_with_ninja(fake_repo, tmp_path):
    done = lab(fake_repo, tmp_path, "04", "build", "--dry-run")
    build = fake_repo / "build-lab"
    configure = (
        f"cmake -S {fake_repo} -B {build} -G Ninja -Wno-dev -DCMAKE_CUDA_ARCHITECTURES=90a"
        " -DLKW_ONLY=04_rmsnorm -DLKW_EXERCISES=04_rmsnorm -DLKW_BUILD_PYTHON=OFF"
    )
    assert commands(done) == [configure, f"cmake --build {build}"]
    assert "configuring (a new build directory)" in done.stdout
    assert not build.exists()  # a dry run creates nothing


def _configured(repo: Path, **values: str) -> Path:
    """A build directory as CMake leaves it, with these cache values."""
    build = repo / "build-lab"
    build.mkdir(exist_ok=True)
    (build / "build.ninja").write_text("# ninja\n")
    cache = {
        "CMAKE_GENERATOR:INTERNAL": "Ninja",
        "CMAKE_CUDA_ARCHITECTURES:STRING": "90a",
        "LKW_ONLY:STRING": "04_rmsnorm",
        "LKW_EXERCISES:STRING": "04_rmsnorm",
        "LKW_BUILD_PYTHON:BOOL": "OFF",
    }
    for key, value in values.items():
        cache[next(k for k in cache if k.startswith(key + ":"))] = value
    (build / "CMakeCache.txt").write_text(
        "# This is the CMakeCache file.\n" + "".join(f"{k}={v}\n" for k, v in cache.items())
    )
    return build


def test_a_configured_build_directory_is_not_configured_again(fake_repo, tmp_path):
    _configured(fake_repo)
    done = lab(fake_repo, tmp_path, "04", "build", "--dry-run")
    assert _cmake_configure(done) is None
    assert commands(done) == [f"cmake --build {fake_repo / 'build-lab'}"]


@pytest.mark.parametrize(
    "cache, args, reason",
    [
        (
            {"CMAKE_CUDA_ARCHITECTURES": "80"},
            ["04"],
            "CMAKE_CUDA_ARCHITECTURES was '80', now '90a'",
        ),
        ({}, ["02"], "LKW_ONLY was '04_rmsnorm', now '02_int4_dequant'"),
        ({}, ["04", "bench"], "LKW_BUILD_PYTHON was 'OFF', now 'ON'"),
        ({"LKW_BUILD_PYTHON": "ON"}, ["04", "grade"], "LKW_BUILD_PYTHON was 'ON', now 'OFF'"),
        ({"CMAKE_GENERATOR": "Unix Makefiles"}, ["04"], "a new build directory"),
    ],
)
def test_a_changed_option_configures_again_and_says_which(fake_repo, tmp_path, cache, args, reason):
    _configured(fake_repo, **cache)
    done = lab(fake_repo, tmp_path, *args, "--dry-run")
    assert f"lab: configuring ({reason})" in done.stdout
    assert _cmake_configure(done) is not None


def test_test_runs_the_chapters_ctest_tests(fake_repo, tmp_path):
    build = _configured(fake_repo)
    done = lab(fake_repo, tmp_path, "04", "--dry-run", "-V")  # `test` is the default action
    assert commands(done) == [
        f"cmake --build {build}",
        f"ctest --test-dir {build} --output-on-failure -R '^(04_rmsnorm\\.(host|gpu)|sass)$' -V",
    ]
    assert "no GPU here: the 04_rmsnorm.gpu tests will be reported as skipped" in done.stdout


def test_grade_runs_grade_py_on_the_same_build_and_architecture(fake_repo, tmp_path):
    build = _configured(fake_repo, CMAKE_CUDA_ARCHITECTURES="80")
    done = lab(fake_repo, tmp_path, "04", "grade", "--dry-run", "--seed", "7", caps="8.0")
    python = fake_repo / ".venv" / "bin" / "python"
    assert commands(done) == [
        f"cmake --build {build} --target test_04_rmsnorm lkw_sass_check",
        "export LKW_ONLY=04_rmsnorm",
        f"{python} tools/grade.py --chapter 04_rmsnorm --build-dir {build} --archs 80 --seed 7",
    ]


def test_bench_builds_the_extension_and_points_the_bench_at_it(fake_repo, tmp_path):
    done = lab(fake_repo, tmp_path, "04", "bench", "--dry-run", caps="9.0")
    build = fake_repo / "build-lab"
    assert "-DLKW_BUILD_PYTHON=ON" in _cmake_configure(done)
    assert commands(done)[1:] == [
        f"cmake --build {build}",
        f"export LKW_BUILD_DIR={build}",
        f"{fake_repo / '.venv' / 'bin' / 'python'} tools/bench.py --chapter 04_rmsnorm",
    ]


def test_build_directory_and_jobs_from_the_environment(fake_repo, tmp_path):
    env = {"LKW_LAB_BUILD_DIR": str(tmp_path / "elsewhere"), "LKW_JOBS": "1"}
    done = lab(fake_repo, tmp_path, "04", "build", "--dry-run", env=env)
    assert f"-B {tmp_path / 'elsewhere'} " in _cmake_configure(done)
    assert commands(done)[-1] == f"cmake --build {tmp_path / 'elsewhere'} -j 1"


def test_a_missing_venv_is_created_by_setup_sh(fake_repo, tmp_path):
    shutil.rmtree(fake_repo / ".venv")
    done = lab(fake_repo, tmp_path, "04", "build", "--dry-run")
    assert "no .venv yet" in done.stdout
    assert commands(done)[0] == "tools/setup.sh --venv"


# ---------------------------------------------------------------------------------------------
# The real repository


def test_the_real_script_lists_the_real_chapters(tmp_path):
    done = lab(REPO, tmp_path, "--help")
    assert done.returncode == 0
    listed = done.stdout.split("chapters: ", 1)[1].split("\n", 1)[0].split()
    have = sorted(p.parent.name for p in (REPO / "chapters").glob("[0-9][0-9]_*/*.cu"))
    assert listed == sorted(set(have))


def test_the_real_script_dry_run_uses_its_own_repository(tmp_path):
    env = {"LKW_LAB_BUILD_DIR": str(tmp_path / "build-lab")}
    done = lab(REPO, tmp_path, "04_rmsnorm", "grade", "--dry-run", env=env)
    assert done.returncode == 0, done.stderr
    assert f"cmake -S {REPO} -B {tmp_path / 'build-lab'} -G Ninja" in _cmake_configure(done)
    assert commands(done)[-1].endswith(
        f"tools/grade.py --chapter 04_rmsnorm --build-dir {tmp_path / 'build-lab'} --archs 90a"
    )


def test_setup_sh_rejects_an_unknown_flag_before_doing_anything():
    done = subprocess.run(
        ["bash", str(REPO / "tools" / "setup.sh"), "--bogus"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "usage: tools/setup.sh [--venv]" in done.stderr
