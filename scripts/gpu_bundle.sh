#!/usr/bin/env bash
# Builds the CUDA build for a GPU machine and packs what the GPU checks need into .gpu/ (ignored by git):
# the tessera command and the tests that run on a device (bin/), the host libraries a stock CUDA image may
# lack (lib/: libturbojpeg, libspng, Debian's libjpeg; nvJPEG), photographs for the loader and mixed-decoding
# checks (photos/), and scripts/gpu_check.sh runs them there.
# oneDNN and MPI are left out of this build (the CPU paths they speed up are not what runs there).
#
# usage: scripts/gpu_bundle.sh [CUDA_ARCHS]        (default 90: H100/H200)
set -euo pipefail
cd "$(dirname "$0")/.."
ARCHS=${1:-90}
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DTS_CUDA=ON -DTS_WITH_DNNL=OFF -DTS_WITH_MPI=OFF \
  -DTS_TESTS_LINK_SHARED=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" >/dev/null
TARGETS="tessera test_cuda test_cuda_host test_nccl_host test_golden_ops test_golden_step test_precision test_optim test_accum test_train test_ddp test_attention test_gpt"
cmake --build build-gpu -j "$(nproc)" --target $TARGETS
rm -rf .gpu && mkdir -p .gpu/bin .gpu/lib
for t in $TARGETS; do cp "build-gpu/$t" .gpu/bin/; done
cp -L build-gpu/libtessera.so.0 .gpu/lib/ # the tests' library (TS_TESTS_LINK_SHARED)
for l in libturbojpeg.so.0 libspng.so.0 libjpeg.so.62; do cp -L "/lib/x86_64-linux-gnu/$l" .gpu/lib/; done
# Fashion-MNIST (Debian's dataset-fashion-mnist) for the end-to-end `tessera train --device cuda:0` check
if [ -d /usr/share/datasets/fashion-mnist ]; then cp -r /usr/share/datasets/fashion-mnist .gpu/; fi
# nvJPEG for the mixed decoding (loaded at run time): NVIDIA's nvidia-nvjpeg wheel, from the interop venv
# (scripts/install-deps) or downloaded
nvj=$(compgen -G ".pyvenv/lib/python3*/site-packages/nvidia/cu13/lib/libnvjpeg.so.13" | head -1 || true)
if [ -z "$nvj" ]; then
  rm -rf build-gpu/nvjpeg && mkdir -p build-gpu/nvjpeg
  if python3 -m pip download -q --no-deps -d build-gpu/nvjpeg nvidia-nvjpeg &&
     python3 -m zipfile -e build-gpu/nvjpeg/*.whl build-gpu/nvjpeg/x; then
    nvj=build-gpu/nvjpeg/x/nvidia/cu13/lib/libnvjpeg.so.13
  fi
fi
if [ -n "$nvj" ] && [ -f "$nvj" ]; then cp -L "$nvj" .gpu/lib/; else echo "gpu_bundle: no nvJPEG: mixed decoding falls back" >&2; fi
# photographs for the loader check: every third 500x375 crop of bench/loader_vs_torchvision.py make-photos
# (Debian's mate-backgrounds), ~100 files
if [ ! -d build-gpu/photos ] && [ -d /usr/share/backgrounds/mate ]; then
  /usr/bin/python3 bench/loader_vs_torchvision.py make-photos --out build-gpu/photos >/dev/null || rm -rf build-gpu/photos
fi
if [ -d build-gpu/photos ]; then
  (cd build-gpu/photos && find . -name '*.jpg' | sort | awk 'NR % 3 == 1') | while read -r f; do
    mkdir -p ".gpu/photos/$(dirname "$f")" && cp "build-gpu/photos/$f" ".gpu/photos/$f"
  done
fi
grep -qs '^/.gpu/' .git/info/exclude || echo '/.gpu/' >> .git/info/exclude
du -sh .gpu
