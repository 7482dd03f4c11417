#!/usr/bin/env bash
# The learner's one command: build, test, grade or bench one chapter of chapters/ (the exercise
# tree) in one reused build directory (build-lab/), for this machine's GPU only.
#
#   tools/lab.sh 04_rmsnorm            # build and test (the same as `test`)
#   tools/lab.sh 04_rmsnorm build      # compile the chapter, its tests and the SASS checker
#   tools/lab.sh 04_rmsnorm test       # build, then its CTest tests: host, gpu (skipped, visibly,
#                                      #   without a GPU) and the SASS facts
#   tools/lab.sh 04_rmsnorm grade      # build, then tools/grade.py on the same build: a score per
#                                      #   version, results in build-lab/results.json
#   tools/lab.sh 04_rmsnorm bench      # also build the Python extension and time the versions
#                                      #   (tools/bench.py; needs a GPU)
#   tools/lab.sh 04 grade --seed 7     # a unique prefix names the chapter; arguments after the
#                                      #   action go to ctest / tools/grade.py / tools/bench.py
#   tools/lab.sh 04_rmsnorm test --dry-run   # print the commands, run nothing
#
# Only that chapter is built (CMake -DLKW_ONLY=<chapter> -DLKW_EXERCISES=<chapter>), with what it
# needs to link (chapter 06: chapter 00's cuBLAS peer; the bench: chapter 00's copy ceiling).
# Architecture: the local GPU's (nvidia-smi compute_cap 9.0 -> 90a, 8.0 -> 80, 8.9 -> 89), 90a
# without a GPU; LKW_ARCHS overrides. CMake is re-run only when these options change. Python and
# cuobjdump come from .venv (created with tools/setup.sh --venv when missing).
# Environment: LKW_ARCHS, LKW_LAB_BUILD_DIR (default <repo>/build-lab), LKW_JOBS (ninja -j).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

actions="build test grade bench"
say() { echo "lab: $*"; }
die() { echo "lab: $*" >&2; exit 2; }
usage_error() { echo "lab: $*" >&2; echo >&2; usage >&2; exit 2; }

# The chapters a learner can work on: folders of chapters/ with sources (a hand-out may also
# hold an earlier chapter's solved headers alone, which is not a lab).
chapters=()
for dir in chapters/[0-9][0-9]_*/; do
  dir="${dir%/}"
  compgen -G "$dir/*.cu" >/dev/null && chapters+=("${dir#chapters/}")
done

usage() {
  cat <<EOF
usage: tools/lab.sh CHAPTER [build|test|grade|bench] [--dry-run] [ARGS...]

  build   compile the chapter from chapters/CHAPTER, its tests and the SASS checker
  test    build, then run its tests (host, gpu, SASS facts) [default]
  grade   build, then grade it (tools/grade.py): a score per version
  bench   build the Python extension too, then time the versions (tools/bench.py; GPU only)

  --dry-run   print the commands instead of running them
  ARGS        passed on to ctest, tools/grade.py or tools/bench.py

chapters: ${chapters[*]:-(none found in chapters/)}
a unique prefix is enough (04 = 04_rmsnorm). Build directory: ${LKW_LAB_BUILD_DIR:-build-lab}/.
EOF
}

# ---------------------------------------------------------------------------------------------
# Arguments
dry_run=0
chapter=""
action=""
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --dry-run|-n) dry_run=1 ;;
    --) shift; extra+=("$@"); break ;;
    *)
      if [ -z "$chapter" ]; then
        [[ "$1" == -* ]] && usage_error "the first argument must be a chapter, not '$1'"
        chapter="$1"
      elif [ -z "$action" ] && [[ "$1" != -* ]]; then
        action="$1"
      else
        extra+=("$1")
      fi ;;
  esac
  shift
done

[ -n "$chapter" ] || usage_error "name a chapter"
action="${action:-test}"
[[ " $actions " == *" $action "* ]] || usage_error "unknown action '$action' (one of: $actions)"

# chapters/04_rmsnorm/ (tab completion), 04_rmsnorm, 04_rms, 04: one chapter.
want="${chapter%/}"
want="${want#./}"
want="${want#chapters/}"
matches=()
for c in "${chapters[@]}"; do
  if [ "$c" = "$want" ]; then matches=("$c"); break; fi
  [[ "$c" == "$want"* ]] && matches+=("$c")
done
if [ ${#matches[@]} -eq 0 ]; then
  usage_error "no chapter '$chapter' in chapters/"
elif [ ${#matches[@]} -gt 1 ]; then
  usage_error "'$chapter' names several chapters: ${matches[*]}"
fi
chapter="${matches[0]}"

# ---------------------------------------------------------------------------------------------
# The GPU's architecture: compute_cap 9.0 -> 90a (wgmma, setmaxnreg), 8.0 -> 80, 12.0 -> 120.
gpu_archs=""
if command -v nvidia-smi >/dev/null 2>&1; then
  caps="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null || true)"
  for cap in $caps; do
    [[ "$cap" =~ ^([0-9]+)\.([0-9]+)$ ]] || continue
    major="${BASH_REMATCH[1]}" minor="${BASH_REMATCH[2]}"
    arch="$major$minor"
    if [ "$arch" = 90 ]; then
      arch=90a
    elif [ "$major" -lt 8 ]; then
      say "GPU with compute capability $cap: the kernels need sm_80 or newer; building for 80" \
        "(its GPU tests will skip)"
      arch=80
    fi
    [[ ";$gpu_archs;" == *";$arch;"* ]] || gpu_archs="${gpu_archs:+$gpu_archs;}$arch"
  done
fi
if [ -n "${LKW_ARCHS:-}" ]; then
  archs="$LKW_ARCHS"
  why="(LKW_ARCHS)"
elif [ -n "$gpu_archs" ]; then
  archs="$gpu_archs"
  why="(this machine's GPU)"
else
  archs="90a"
  why="(no GPU found: the H200's; the GPU tests skip, correctness needs an sm_80+ GPU)"
fi

build="${LKW_LAB_BUILD_DIR:-$repo/build-lab}"
case "$build" in /*) ;; *) build="$repo/$build" ;; esac
python="$repo/.venv/bin/python"
python_ext=OFF
[ "$action" = bench ] && python_ext=ON

say "$action $chapter (chapters/$chapter) in ${build#"$repo"/}/"
say "for sm_$archs $why"

# ---------------------------------------------------------------------------------------------
# Running (or, with --dry-run, printing) the steps
show() {
  local out="+" arg
  for arg in "$@"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_./:=,+-]+$ ]]; then out+=" $arg"; else out+=" '$arg'"; fi
  done
  echo "$out"
}
run() {
  show "$@"
  [ "$dry_run" = 1 ] || "$@"
}

# The toolkit, as tools/setup.sh finds it.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
if [ "$dry_run" = 0 ]; then
  for tool in cmake ninja nvcc; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' is required but not found (see tools/setup.sh)"
  done
fi

# The venv (numpy, ml_dtypes, nanobind, cuobjdump) when missing: tools/setup.sh's venv part.
if [ ! -x "$python" ]; then
  say "no .venv yet: creating it (tools/setup.sh --venv)"
  run tools/setup.sh --venv
fi

# CMake only when the build directory lacks these options (tools/grade.py re-runs it with the
# same ones, which rebuilds nothing).
cache_value() {  # NAME -> the value in the build's CMakeCache.txt, empty when absent
  sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" 2>/dev/null | head -n 1
}
declare -A options=(
  [CMAKE_CUDA_ARCHITECTURES]="$archs"
  [LKW_ONLY]="$chapter"
  [LKW_EXERCISES]="$chapter"
  [LKW_BUILD_PYTHON]="$python_ext"
)
reconfigure=""
if [ ! -f "$build/build.ninja" ] || [ "$(cache_value CMAKE_GENERATOR)" != Ninja ]; then
  reconfigure="a new build directory"
else
  for name in CMAKE_CUDA_ARCHITECTURES LKW_ONLY LKW_EXERCISES LKW_BUILD_PYTHON; do
    have="$(cache_value "$name")"
    if [ "$have" != "${options[$name]}" ]; then
      reconfigure="$name was '$have', now '${options[$name]}'"
      break
    fi
  done
fi
if [ -n "$reconfigure" ]; then
  say "configuring ($reconfigure)"
  run cmake -S "$repo" -B "$build" -G Ninja -Wno-dev \
    -DCMAKE_CUDA_ARCHITECTURES="$archs" -DLKW_ONLY="$chapter" -DLKW_EXERCISES="$chapter" \
    -DLKW_BUILD_PYTHON="$python_ext"
fi

# Ninja's progress, with the elapsed time, on every line.
export NINJA_STATUS="${NINJA_STATUS:-[%f/%t %es] }"
jobs=()
[ -n "${LKW_JOBS:-}" ] && jobs=(-j "$LKW_JOBS")

case "$action" in
  build)
    run cmake --build "$build" ${jobs[@]+"${jobs[@]}"}
    say "built: $build/test_$chapter (run: tools/lab.sh $chapter test)"
    ;;
  test)
    run cmake --build "$build" ${jobs[@]+"${jobs[@]}"}
    [ -n "$gpu_archs" ] || say "no GPU here: the $chapter.gpu tests will be reported as skipped"
    # The golden data is the host and gpu tests' fixture: ctest runs it first.
    run ctest --test-dir "$build" --output-on-failure -R "^($chapter\\.(host|gpu)|sass)\$" \
      ${extra[@]+"${extra[@]}"}
    ;;
  grade)
    # The test binary and the SASS checker, with ninja's progress (tools/grade.py builds silently:
    # here it has nothing left to do). LKW_ONLY keeps grade.py's configure on this chapter alone.
    run cmake --build "$build" --target "test_$chapter" lkw_sass_check ${jobs[@]+"${jobs[@]}"}
    [ "$dry_run" = 1 ] && echo "+ export LKW_ONLY=$chapter"
    LKW_ONLY="$chapter" run "$python" tools/grade.py --chapter "$chapter" --build-dir "$build" \
      --archs "$archs" ${extra[@]+"${extra[@]}"}
    ;;
  bench)
    run cmake --build "$build" ${jobs[@]+"${jobs[@]}"}
    [ "$dry_run" = 1 ] && echo "+ export LKW_BUILD_DIR=$build"
    LKW_BUILD_DIR="$build" run "$python" tools/bench.py --chapter "$chapter" ${extra[@]+"${extra[@]}"}
    ;;
esac
