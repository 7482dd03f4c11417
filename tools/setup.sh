#!/usr/bin/env bash
# Sets up a fresh machine for the workbook: a Python venv with the pinned requirements (.venv),
# then configures and builds everything with CMake + Ninja into build/. Idempotent and quick when
# nothing changed. Needs: CUDA toolkit (nvcc), CMake >= 3.25, a C++ compiler, python3 (venv).
#   LKW_ARCHS="90a" tools/setup.sh     # build for fewer architectures (default 80;89;90a)
#   tools/setup.sh --venv              # only the Python environment (.venv); tools/lab.sh uses it
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

venv_only=0
case "${1:-}" in
  "") ;;
  --venv) venv_only=1 ;;
  *) echo "usage: tools/setup.sh [--venv]" >&2; exit 2 ;;
esac

need() { command -v "$1" >/dev/null 2>&1 || { echo "setup: '$1' is required but not found" >&2; exit 1; }; }

# Python environment, re-installed only when requirements.txt changes.
setup_venv() {
  if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
  local stamp=.venv/.requirements.sha want
  want="$(sha256sum requirements.txt | cut -d' ' -f1)"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -r requirements.txt
    echo "$want" > "$stamp"
  fi
}

need python3
if [ "$venv_only" = 1 ]; then
  if ! python3 -c "import venv, ensurepip" 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && apt-get install -y -qq python3-venv
    else
      echo "setup: please install: python3-venv" >&2; exit 1
    fi
  fi
  setup_venv
  exit 0
fi
need cmake
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
need nvcc

# Build tools from the distribution when missing (Debian/Ubuntu, as root).
missing=()
command -v ninja >/dev/null 2>&1 || missing+=(ninja-build)
[ -e /usr/src/googletest/CMakeLists.txt ] || [ -e /usr/lib/x86_64-linux-gnu/cmake/GTest ] || missing+=(libgtest-dev)
python3 -c "import venv, ensurepip" 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq "${missing[@]}"
  else
    echo "setup: please install: ${missing[*]}" >&2; exit 1
  fi
fi

setup_venv

# cuobjdump (and the nvdisasm it calls) from the toolkit, else from the venv's NVIDIA wheels.
cuobjdump="$(command -v cuobjdump || true)"
if [ -z "$cuobjdump" ] || ! command -v nvdisasm >/dev/null 2>&1; then
  cuobjdump="$(.venv/bin/python -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "bin", "cuobjdump"))')"
fi

cmake -S . -B build -G Ninja -Wno-dev \
  -DPython_EXECUTABLE="$repo/.venv/bin/python" \
  -DLKW_CUOBJDUMP="$cuobjdump" \
  ${LKW_ARCHS:+-DCMAKE_CUDA_ARCHITECTURES="$LKW_ARCHS"} >/dev/null
cmake --build build
