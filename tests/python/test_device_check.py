"""tools/device_check.sh's sanitize stage on a fake GPU machine: stand-ins for nvidia-smi,
compute-sanitizer and a chapter's gtest binary (one of whose tests never returns, as a kernel
whose cluster barrier a serializing sanitizer never completes). The stage must name the hung test,
fail, and still sanitize the tests after it, without running the ones that passed again."""
import os
import shutil
import stat
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A gtest binary in miniature: --gtest_list_tests, and --gtest_filter with gtest's syntax
# (positive patterns, then '-' and negative ones, ':'-separated, shell-style globs).
FAKE_TEST = r"""#!/usr/bin/env bash
set -f  # the patterns are gtest's, not the shell's file names
tests="${FAKE_TESTS:-Golden.a Golden.b Golden.hang Golden.c Host.h}"
filter="*"
for arg in "$@"; do
  case "$arg" in
    --gtest_list_tests) for t in $tests; do echo "$t"; done; exit 0 ;;
    --gtest_filter=*) filter="${arg#--gtest_filter=}" ;;
  esac
done
pos="${filter%%-*}"; neg=""; [[ "$filter" == *-* ]] && neg="${filter#*-}"
[ -z "$pos" ] && pos="*"
matches() { local IFS=:; for p in $2; do [[ "$1" == $p ]] && return 0; done; return 1; }
n=0
for t in $tests; do
  matches "$t" "$pos" || continue
  [ -n "$neg" ] && matches "$t" "$neg" && continue
  echo "[ RUN      ] $t"
  [ "$t" = Golden.hang ] && exec sleep 60
  echo "[       OK ] $t (1 ms)"
  n=$((n + 1))
done
echo "[==========] $n tests from 1 test suite ran. (5 ms total)"
"""

FAKE_SANITIZER = r"""#!/usr/bin/env bash
while [ $# -gt 0 ]; do
  case "$1" in --tool|--error-exitcode) shift 2 ;; --*) shift ;; *) break ;; esac
done
exec "$@"
"""


def _executable(path: Path, text: str):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _fake_repo(root: Path) -> Path:
    """A repo with tools/device_check.sh and chapter 99_fake, and bin/ beside it with a stand-in
    nvidia-smi; returns the repo."""
    repo = root / "repo"
    (repo / "tools").mkdir(parents=True)
    shutil.copy(REPO / "tools" / "device_check.sh", repo / "tools")
    (repo / "solutions" / "99_fake").mkdir(parents=True)
    (root / "bin").mkdir()
    _executable(root / "bin" / "nvidia-smi", "#!/bin/sh\necho 'name, driver'\n")
    return repo


def _device_check(root: Path, stages: str, timeout: int = 60, **env: str | None) -> subprocess.CompletedProcess:
    """tools/device_check.sh STAGES in root's fake repo, root/bin first on PATH, OUT=root/out; an
    env value of None removes that variable."""
    full = dict(os.environ, PATH=f"{root / 'bin'}:{os.environ['PATH']}", OUT=str(root / "out"))
    for name, value in env.items():
        if value is None:
            full.pop(name, None)
        else:
            full[name] = value
    return subprocess.run(["bash", str(root / "repo" / "tools" / "device_check.sh"), *stages.split()],
                          cwd=root / "repo", env=full, capture_output=True, text=True, timeout=timeout)


def _fake_machine(tmp_path: Path, **env) -> subprocess.CompletedProcess:
    """device_check.sh's sanitize stage in a fake repo with chapter 99_fake, on the stand-ins."""
    repo = _fake_repo(tmp_path)
    (repo / "build" / "golden" / "99_fake").mkdir(parents=True)
    (repo / "build" / "golden" / "99_fake" / "manifest.txt").write_text("")
    _executable(repo / "build" / "test_99_fake", FAKE_TEST)
    _executable(tmp_path / "bin" / "compute-sanitizer", FAKE_SANITIZER)
    return _device_check(tmp_path, "sanitize", timeout=120, **env)


def test_a_hung_test_is_named_and_the_sanitizer_resumes_past_it(tmp_path):
    out = _fake_machine(tmp_path, LKW_SANITIZE_TIMEOUT="3")
    assert out.returncode != 0, out.stdout
    for tool in ("memcheck", "racecheck"):
        assert f"{tool} hung in: Golden.hang" in out.stdout, out.stdout
        assert f"{tool} ran 3 tests of build/test_99_fake" in out.stdout, out.stdout
        log = (tmp_path / "out" / f"sanitize_{tool}_99_fake.log").read_text()
        assert log.count("[ RUN      ] Golden.a") == 1  # passed before the hang: not run again
        assert log.count("[ RUN      ] Golden.hang") == 1  # resumed without it
        assert "[       OK ] Golden.c" in log  # the test after the hang was sanitized
        assert "Host.h" not in log  # the default filter leaves host tests out


# The racecheck probe's stand-in: exits as racecheck would on its mode (9: hazards reported).
FAKE_PROBE = r"""#!/usr/bin/env bash
case "$1" in 0) exit "${PROBE_CORRECT_RC:-9}" ;; 2) exit "${PROBE_RACY_RC:-9}" ;; esac
exit 2
"""


def _fake_fp8_machine(tmp_path: Path, **env) -> subprocess.CompletedProcess:
    """The sanitize stage on a chapter 08 of six tests (blockwise v5, rowwise v5, blockwise v4,
    blockwise v6, its GEMV-only ablation, blockwise v7) with the racecheck probe's stand-in built."""
    repo = _fake_repo(tmp_path)
    (repo / "solutions" / "08_fp8_gemm").mkdir()
    shutil.rmtree(repo / "solutions" / "99_fake")
    (repo / "build" / "golden" / "08_fp8_gemm").mkdir(parents=True)
    (repo / "build" / "golden" / "08_fp8_gemm" / "manifest.txt").write_text("")
    _executable(repo / "build" / "test_08_fp8_gemm", FAKE_TEST)
    _executable(repo / "build" / "lkw_racecheck_probe", FAKE_PROBE)
    _executable(tmp_path / "bin" / "compute-sanitizer", FAKE_SANITIZER)
    tests = ("Golden.fp8_gemm_blockwise__v5_tuned__a Golden.fp8_gemm__v5_tuned__b "
             "Golden.fp8_gemm_blockwise__v4_blockwise__c Golden.fp8_gemm_blockwise__v6_small_m__d "
             "Golden.fp8_gemm_blockwise__ablation_v6_gemv_only__e Golden.fp8_gemm_blockwise__v7_swap_ab__f")
    return _device_check(tmp_path, "sanitize", timeout=120, FAKE_TESTS=tests, **env)


def test_racecheck_leaves_blockwise_v5_to_memcheck_only_where_it_flags_a_correct_ring(tmp_path):
    """Where racecheck flags the probe's correct mbarrier ring, chapter 08's blockwise v5 tests are
    memchecked but not racechecked (and the stage says so); where it does not, they are
    racechecked too; a probe whose real race goes unflagged fails the stage."""
    blind = _fake_fp8_machine(tmp_path / "blind")
    assert blind.returncode == 0, blind.stdout
    assert "blockwise v5 and v7 (08) are left to memcheck" in blind.stdout
    memcheck = (tmp_path / "blind" / "out" / "sanitize_memcheck_08_fp8_gemm.log").read_text()
    racecheck = (tmp_path / "blind" / "out" / "sanitize_racecheck_08_fp8_gemm.log").read_text()
    assert "fp8_gemm_blockwise__v5_tuned__a" in memcheck
    assert "fp8_gemm_blockwise__v5_tuned__a" not in racecheck
    assert "fp8_gemm__v5_tuned__b" in racecheck and "v4_blockwise__c" in racecheck
    # v6 hands M > 16 to v5 (left out with it); its GEMV alone, the ablation, is racechecked.
    assert "v6_small_m__d" in memcheck and "v6_small_m__d" not in racecheck
    assert "ablation_v6_gemv_only__e" in racecheck
    # v7's scale warp fills its slots as v5's does: memchecked only.
    assert "v7_swap_ab__f" in memcheck and "v7_swap_ab__f" not in racecheck

    seeing = _fake_fp8_machine(tmp_path / "seeing", PROBE_CORRECT_RC="0")
    assert seeing.returncode == 0, seeing.stdout
    assert "every kernel is racechecked" in seeing.stdout
    racecheck = (tmp_path / "seeing" / "out" / "sanitize_racecheck_08_fp8_gemm.log").read_text()
    assert "fp8_gemm_blockwise__v5_tuned__a" in racecheck

    missed = _fake_fp8_machine(tmp_path / "missed", PROBE_RACY_RC="0")
    assert missed.returncode != 0
    assert "racecheck missed the probe's real race" in missed.stdout


def test_a_filter_that_matches_nothing_fails(tmp_path):
    out = _fake_machine(tmp_path, LKW_SANITIZE_FILTER="*nothing*")
    assert out.returncode != 0
    assert "memcheck: no test of build/test_99_fake matched the filter" in out.stdout, out.stdout


def test_only_the_results_a_stage_changed_come_back(tmp_path):
    """A device call brings back a few files, two folders deep: the recorded runs copied into $OUT
    that no stage changed are removed, a changed or new one stays, and an experiment's file comes
    up beside its GPU's runs; LKW_KEEP_RECORDED=1 keeps everything where it was."""
    def machine(keep: bool) -> tuple[Path, subprocess.CompletedProcess]:
        root = tmp_path / ("keep" if keep else "prune")
        repo, out = _fake_repo(root), root / "out"
        (repo / "results" / "h100" / "experiments").mkdir(parents=True)
        (repo / "results" / "sass").mkdir(parents=True)
        (out / "results" / "h100" / "experiments").mkdir(parents=True)
        (out / "results" / "sass").mkdir(parents=True)
        for rel, recorded, now in [("h100/same.json", "1", "1"), ("h100/changed.json", "1", "2"),
                                   ("h100/experiments/old.json", "3", "3"), ("sass/mix.json", "4", "4")]:
            (repo / "results" / rel).write_text(recorded)
            (out / "results" / rel).write_text(now)
        (out / "results" / "h100" / "new.json").write_text("5")
        (out / "results" / "h100" / "experiments" / "08_promotion.json").write_text("6")
        return out, _device_check(root, "no-stage", LKW_KEEP_RECORDED="1" if keep else None)

    out, done = machine(keep=False)
    assert done.returncode == 0, done.stdout + done.stderr
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*.json"))
    assert left == ["results/h100/changed.json", "results/h100/experiments--08_promotion.json",
                    "results/h100/new.json"], left
    assert (out / "results" / "h100" / "experiments--08_promotion.json").read_text() == "6"
    assert not (out / "results" / "sass").exists()  # emptied folders go too
    assert "the results that changed: results/h100/changed.json" in done.stdout, done.stdout

    out, done = machine(keep=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(list(out.rglob("*.json"))) == 6


def test_a_layer_run_prepares_the_peers_where_the_kit_is(tmp_path):
    """The layer stage alone (as the bench and ncu stages) installs the kit of .peers/ first, unless
    LKW_NO_PEERS=1: a layer run without the peers stage had no production-kernel layer."""
    def machine(name: str, no_peers: str | None) -> str:
        root = tmp_path / name
        repo = _fake_repo(root)
        (repo / ".peers").mkdir()
        (repo / ".peers" / "kit-0.1-py3-none-any.whl").write_text("")
        calls = root / "calls.txt"  # a python3 that only says how it was called
        _executable(root / "bin" / "python3", f"#!/bin/sh\necho \"$*\" >> {calls}\ncat > /dev/null\n")
        done = _device_check(root, "layer", LKW_PEERS_SITE=str(root / "site"), LKW_NO_PEERS=no_peers)
        assert "layer_bench" in calls.read_text(), done.stdout + done.stderr
        return calls.read_text()

    assert "-m pip install" in machine("kit", None)
    assert "-m pip install" not in machine("no_peers", "1")


def test_a_second_invocation_keeps_the_first_one_s_results(tmp_path):
    """Two stages that merge into $OUT's results in one call (08's bench, then the layer): the
    second's copy of the recorded runs must not overwrite the first's newer merge."""
    repo, out = _fake_repo(tmp_path), tmp_path / "out"
    (repo / "results" / "h100").mkdir(parents=True)
    (out / "results" / "h100").mkdir(parents=True)
    recorded, merged = repo / "results" / "h100" / "08.json", out / "results" / "h100" / "08.json"
    recorded.write_text("recorded")
    (repo / "results" / "h100" / "11.json").write_text("layer")
    merged.write_text("merged by the first invocation")
    os.utime(recorded, (1_000_000_000, 1_000_000_000))  # the recorded file is the older one
    _executable(tmp_path / "bin" / "python3", "#!/bin/sh\ncat > /dev/null\n")
    done = _device_check(tmp_path, "layer", LKW_NO_PEERS="1")
    assert merged.read_text() == "merged by the first invocation", done.stdout + done.stderr
    assert not (out / "results" / "h100" / "11.json").exists()  # copied in, unchanged, pruned
