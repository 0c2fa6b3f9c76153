#!/usr/bin/env bash
# bench/ddp_hook_vs_gloo.sh [BUILD_DIR] [ARGS...] — PyTorch DDP (25 MB buckets) with tessera.torch.allreduce_hook
# beside torch's all-reduce hook over gloo, 2 ranks under `tessera run -n 2`, in one run (bench/ddp_hook_vs_gloo.py
# says what is timed; ARGS go to it: --layers, --width, --steps, --rounds). Needs the build's Python package
# (BUILD_DIR/python) and a Python with torch (tests/find_python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
shift || true
PY=$(bash tests/find_python.sh torch) || { echo "ddp_hook_vs_gloo: no Python with torch" >&2; exit 1; }
ls "$BUILD"/python/tessera/_tessera*.so > /dev/null || { echo "ddp_hook_vs_gloo: no Python package in $BUILD/python" >&2; exit 1; }
PYTHONPATH="$PWD/$BUILD/python" "$BUILD/tessera" run -n 2 "$PY" bench/ddp_hook_vs_gloo.py "$@"
