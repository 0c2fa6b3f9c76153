#!/usr/bin/env bash
# tests/cli_dlpack.sh — Tessera's DLPack against PyTorch's and NumPy's own (tests/dlpack_torch.py, through
# ctypes on libtessera.so): shared memory both ways, strided views, every dtype both have, ownership.
# Skips (77) when no Python has torch and numpy (tests/find_python.sh); fails instead under
# TS_REQUIRE_TORCH=1 (CI).
set -u
TS=${1:?usage: cli_dlpack.sh path/to/tessera}
LIB=$(dirname "$TS")/libtessera.so
[ -f "$LIB" ] || { echo "skip: no $LIB"; exit 77; }
PY=$(bash "$(dirname "$0")/find_python.sh" torch numpy) || {
  [ "${TS_REQUIRE_TORCH:-0}" = 1 ] && { echo "FAIL: TS_REQUIRE_TORCH=1 (CI) and no Python with torch and numpy"; exit 1; }
  echo "skip: no Python with torch and numpy (scripts/install-deps makes .pyvenv/)"
  exit 77
}
exec "$PY" "$(dirname "$0")/dlpack_torch.py" "$LIB"
