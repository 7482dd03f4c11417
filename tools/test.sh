#!/usr/bin/env bash
# Sets up (tools/setup.sh) and runs every test: CTest (golden data, host tests, GPU tests —
# skipped with a visible reason where there is no GPU —, SASS facts) and pytest (references,
# tools, notebooks in replay mode, the book). Exit status is non-zero if anything failed.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
tools/setup.sh || exit 1

status=0
echo "== ctest"
ctest --test-dir build --output-on-failure || status=1
echo "== pytest"
.venv/bin/python -m pytest tests/python -q -rs || status=1
exit $status
