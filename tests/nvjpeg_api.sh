#!/usr/bin/env bash
# tests/nvjpeg_api.sh TEST_CUDA_HOST CUDA_INCLUDE CC: the nvJPEG declarations the CUDA build carries
# (src/ops/cuda/nvjpeg_api.h) against NVIDIA's nvidia-nvjpeg package (its nvjpeg.h and libnvjpeg.so.13,
# in the interop venv scripts/install-deps makes, or any Python of tests/find_python.sh's list):
# tests/nvjpeg_abi.c compiles against the header, and test_cuda_host loads the library through
# TS_NVJPEG_LIB (every function found). Skips (77) where the package is not installed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:?usage: tests/nvjpeg_api.sh TEST_CUDA_HOST CUDA_INCLUDE CC}
cuda_inc=${2:?}
cc=${3:-cc}
pkg=""
for py in ${TS_PYTHON:+"$TS_PYTHON"} "$root/.pyvenv/bin/python3" python3 /usr/bin/python3; do
  command -v "$py" >/dev/null 2>&1 || continue
  for d in $("$py" -c 'import site, sys; print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null); do
    if [ -f "$d/nvidia/cu13/include/nvjpeg.h" ] && [ -f "$d/nvidia/cu13/lib/libnvjpeg.so.13" ]; then pkg=$d/nvidia/cu13; break 2; fi
  done
done
if [ -z "$pkg" ]; then
  echo "SKIP: no nvidia-nvjpeg package (pip install nvidia-nvjpeg; scripts/install-deps puts it in .pyvenv)"
  exit 77
fi
echo "nvJPEG package: $pkg"
rc=0
if "$cc" -std=c11 -Wall -Wextra -Werror -fsyntax-only -I"$pkg/include" -I"$cuda_inc" -I"$root/src" \
    "$root/tests/nvjpeg_abi.c"; then
  echo "ok   tests/nvjpeg_abi.c compiles against $pkg/include/nvjpeg.h"
else
  echo "FAIL src/ops/cuda/nvjpeg_api.h differs from $pkg/include/nvjpeg.h (above)"; rc=1
fi
if out=$(TS_NVJPEG_LIB="$pkg/lib/libnvjpeg.so.13" "$bin" test_nvjpeg_loader 2>&1) && grep -q "nvJPEG loaded from" <<<"$out"; then
  echo "ok   every nvJPEG function loads from $pkg/lib/libnvjpeg.so.13"
else
  echo "FAIL loading $pkg/lib/libnvjpeg.so.13: $out"; rc=1
fi
exit $rc
