#!/usr/bin/env bash
# tests/python_wheel.sh BUILD: `pip install .` (and `pip install ./python`) as a user runs it — pyproject.toml, scikit-build-core driving
# this repository's CMake (CPU-only here, TS_CUDA=OFF, to keep the test short), the extension and
# libtessera.so.0 side by side in the installed tessera/ — then tests/python/test_*.py against the installed
# package (not the build tree). Uses the interop venv's Python (torch, numpy, scikit-build-core: no download).
# Skips (77) without such a Python; fails instead under TS_REQUIRE_TORCH=1 (CI).
set -u
BUILD=${1:?usage: python_wheel.sh BUILD}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
need() { [ "${TS_REQUIRE_TORCH:-0}" = 1 ] && { echo "FAIL: TS_REQUIRE_TORCH=1 (CI) and $1"; exit 1; }; echo "skip: $1"; exit 77; }
PY=$(bash "$HERE/find_python.sh" torch numpy scikit_build_core) ||
  need "no Python with torch, numpy and scikit-build-core (scripts/install-deps makes .pyvenv/)"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# the wheel's CMake build stays in BUILD/wheel between runs (incremental); the install goes to a fresh folder
if ! "$PY" -m pip install --no-build-isolation --no-deps --disable-pip-version-check -q --target "$T/site" \
     --config-settings=cmake.define.TS_CUDA=OFF --config-settings=build-dir="$BUILD/wheel" "$ROOT" > "$T/pip.log" 2>&1; then
  echo "FAIL: pip install . failed:"; tail -30 "$T/pip.log"; exit 1
fi
ls "$T/site/tessera" | tr '\n' ' '; echo
[ -f "$T/site/tessera/libtessera.so.0" ] && [ ! -L "$T/site/tessera/libtessera.so.0" ] ||
  { echo "FAIL: no libtessera.so.0 beside the extension"; exit 1; }
(cd "$T" && PYTHONPATH="$T/site" "$PY" -c 'import tessera, sys; assert tessera.__file__.startswith(sys.argv[1]), tessera.__file__' "$T/site") ||
  { echo "FAIL: import tessera did not find the installed package"; exit 1; }
# `pip install ./python` (python/pyproject.toml: the same CMake project one folder up, the same build folder)
if ! "$PY" -m pip install --no-build-isolation --no-deps --disable-pip-version-check -q --target "$T/site2" \
     --config-settings=cmake.define.TS_CUDA=OFF --config-settings=build-dir="$BUILD/wheel" "$ROOT/python" > "$T/pip2.log" 2>&1; then
  echo "FAIL: pip install ./python failed:"; tail -30 "$T/pip2.log"; exit 1
fi
cmp -s "$T/site/tessera/_tessera.abi3.so" "$T/site2/tessera/_tessera.abi3.so" && cmp -s "$T/site/tessera/_train.py" "$T/site2/tessera/_train.py" ||
  { echo "FAIL: pip install ./python installed another package than pip install ."; exit 1; }
echo "ok: pip install ./python installs the same package"
# the same tests as against the build tree, against what pip installed
(cd "$T" && bash "$HERE/python_tests.sh" "$T/site" "$BUILD/tessera")
