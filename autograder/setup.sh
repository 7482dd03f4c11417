#!/usr/bin/env bash
# Gradescope's setup step, run once when the image is built (autograder/Dockerfile runs it):
# records the chapter to grade, keeps an untouched copy of its hand-out, installs the workbook's
# Python environment (.venv from requirements.txt) and grades the untouched hand-out once, so that
# the configure, the build and the golden data exist and each submission only recompiles the
# files it changed.
#
#   LKW_CHAPTER=04_rmsnorm autograder/setup.sh
#   LKW_CHAPTER=04_rmsnorm LKW_ARCHS=90a autograder/setup.sh     # one architecture: faster builds
#
# Environment (defaults in brackets):
#   LKW_CHAPTER      the chapter [the file autograder/chapter from an earlier setup]; written to
#                    autograder/chapter for run_autograder
#   LKW_ARCHS        CMAKE_CUDA_ARCHITECTURES [80;89;90a]; written to autograder/archs
#   LKW_SOURCE       the workbook [the folder above this script]
#   LKW_PRISTINE     where the untouched hand-out is kept [$LKW_SOURCE/autograder/pristine]
#   LKW_SETUP_VENV   0: do not create/refresh .venv (tests; an image that has it already) [1]
#   LKW_SETUP_BUILD  0: skip the warm-up grading (the first submission then builds everything) [1]
#   and the run_autograder variables (LKW_GRADE_BUILD_DIR, LKW_GRADE_CMD, ...), which the warm-up
#   grading uses exactly as a submission's grading will.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SOURCE="${LKW_SOURCE:-$(dirname "$here")}"
export LKW_SOURCE="$SOURCE"
kit="$SOURCE/autograder"

chapter="${LKW_CHAPTER:-}"
if [ -z "$chapter" ] && [ -r "$kit/chapter" ]; then
  chapter="$(tr -d '[:space:]' < "$kit/chapter")"
fi
if [ -z "$chapter" ]; then
  echo "setup: which chapter? e.g. LKW_CHAPTER=04_rmsnorm $0" >&2
  echo "setup: chapters: $(cd "$SOURCE/chapters" && printf "%s " [0-9][0-9]_*)" >&2
  exit 1
fi
if ! [[ "$chapter" =~ ^[0-9][0-9]_[a-z0-9_]+$ ]] || [ ! -d "$SOURCE/chapters/$chapter" ]; then
  echo "setup: no chapter '$chapter' in $SOURCE/chapters" >&2
  exit 1
fi
archs="${LKW_ARCHS:-}"
if [ -z "$archs" ] && [ -r "$kit/archs" ]; then archs="$(tr -d '[:space:]' < "$kit/archs")"; fi
archs="${archs:-80;89;90a}"
echo "$chapter" > "$kit/chapter"
echo "$archs" > "$kit/archs"
echo "setup: chapter $chapter, architectures $archs"

# The hand-out as shipped: run_autograder reads its exercise files (those with a TODO) from here
# and puts it back before each submission, so that no student's files outlive their run.
pristine="${LKW_PRISTINE:-$kit/pristine}/$chapter"
rm -rf -- "$pristine"
mkdir -p "$pristine"
find "$SOURCE/chapters/$chapter" -maxdepth 1 -type f -exec cp -- {} "$pristine"/ \;
exercises="$(grep -l 'TODO(exercise)' "$pristine"/*.cu "$pristine"/*.cuh 2>/dev/null | wc -l || true)"
echo "setup: hand-out saved in $pristine ($exercises exercise files)"

if [ "${LKW_SETUP_VENV:-1}" != 0 ]; then
  if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
  for tool in python3 cmake ninja nvcc; do
    command -v "$tool" >/dev/null 2>&1 || { echo "setup: '$tool' not found" >&2; exit 1; }
  done
  if [ ! -x "$SOURCE/.venv/bin/python" ]; then python3 -m venv "$SOURCE/.venv"; fi
  "$SOURCE/.venv/bin/python" -m pip install -q --upgrade pip
  "$SOURCE/.venv/bin/python" -m pip install -q -r "$SOURCE/requirements.txt"
  echo "setup: Python environment ready in $SOURCE/.venv"
fi

if [ "${LKW_SETUP_BUILD:-1}" != 0 ]; then
  echo "setup: grading the untouched hand-out once (configure, build, golden data)"
  LKW_CHAPTER="$chapter" LKW_ARCHS="$archs" "$kit/run_autograder" --warm-up
fi
echo "setup: done; each submission runs $kit/run_autograder (installed as /autograder/run_autograder)"
