#!/usr/bin/env bash
# tests/python_tests.sh BUILD/python [TESSERA]: runs tests/python/test_*.py against the extension CMake built
# in BUILD/python (`import tessera`; TESSERA, the command, is $TESSERA_BIN to tests that compare with it) with a Python that has torch and numpy (tests/find_python.sh). Skips (77)
# when there is no such Python or the extension was not built (no python3-dev); fails instead under
# TS_REQUIRE_TORCH=1 (CI), where scripts/install-deps installed both.
set -u
PYDIR=${1:?usage: python_tests.sh BUILD/python [TESSERA]}
export TESSERA_BIN=${2:-$PYDIR/../tessera}
HERE=$(cd "$(dirname "$0")" && pwd)
need() { [ "${TS_REQUIRE_TORCH:-0}" = 1 ] && { echo "FAIL: TS_REQUIRE_TORCH=1 (CI) and $1"; exit 1; }; echo "skip: $1"; exit 77; }
ls "$PYDIR"/tessera/_tessera*.so > /dev/null 2>&1 || need "no Python extension in $PYDIR (apt-get install python3-dev, then build)"
PY=$(bash "$HERE/find_python.sh" torch numpy) || need "no Python with torch and numpy (scripts/install-deps makes .pyvenv/)"
fails=0
for t in "$HERE"/python/test_*.py; do
  echo "== $(basename "$t")"
  # faulthandler: a crash (an abort from the C library's heap checks, a segfault) prints every thread's Python stack
  PYTHONPATH=$PYDIR "$PY" -X faulthandler "$t" || { rc=$?; fails=$((fails+1)); echo "FAIL: $(basename "$t") (exit status $rc)"; }
done
[ $fails -eq 0 ]
