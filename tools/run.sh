#!/usr/bin/env bash
# The main job. On a machine with a GPU: build, then verify and time every chapter's versions
# and print the tables (tools/bench.py --all). Without a GPU: build, run the host checks and the
# SASS facts, then print the results recorded on an H200 (results/h200/), saying so.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
tools/setup.sh || exit 1
py=.venv/bin/python

if $py -c "from lkw import _ext; import sys; sys.exit(0 if _ext.device()['present'] else 1)" \
    2>/dev/null; then
  PYTHONPATH=reference $py tools/bench.py --all "$@"
else
  echo "run: no CUDA device on this machine: building, running the host checks and SASS facts."
  ctest --test-dir build -L 'host|sass' --output-on-failure || exit 1
  echo
  echo "run: these are the results recorded on an H200 (results/h200/), not measured here:"
  echo
  PYTHONPATH=reference $py tools/bench.py --replay --all
fi
