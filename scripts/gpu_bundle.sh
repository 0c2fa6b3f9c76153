#!/usr/bin/env bash
# Builds the CUDA build for a GPU machine and packs what the GPU checks need into .gpu/ (ignored by git):
# the tessera command and the tests that run on a device (bin/), the host libraries a stock CUDA image may
# lack (lib/: libturbojpeg, libspng, Debian's libjpeg), and scripts/gpu_check.sh runs them there.
# oneDNN and MPI are left out of this build (the CPU paths they speed up are not what runs there).
#
# usage: scripts/gpu_bundle.sh [CUDA_ARCHS]        (default 90: H100/H200)
set -euo pipefail
cd "$(dirname "$0")/.."
ARCHS=${1:-90}
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DTS_CUDA=ON -DTS_WITH_DNNL=OFF -DTS_WITH_MPI=OFF \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" >/dev/null
TARGETS="tessera test_cuda test_cuda_host test_nccl_host test_golden_ops test_golden_step test_precision test_optim test_accum test_train"
cmake --build build-gpu -j "$(nproc)" --target $TARGETS
rm -rf .gpu && mkdir -p .gpu/bin .gpu/lib
for t in $TARGETS; do cp "build-gpu/$t" .gpu/bin/; done
for l in libturbojpeg.so.0 libspng.so.0 libjpeg.so.62; do cp -L "/lib/x86_64-linux-gnu/$l" .gpu/lib/; done
# Fashion-MNIST (Debian's dataset-fashion-mnist) for the end-to-end `tessera train --device cuda:0` check
if [ -d /usr/share/datasets/fashion-mnist ]; then cp -r /usr/share/datasets/fashion-mnist .gpu/; fi
grep -qs '^/.gpu/' .git/info/exclude || echo '/.gpu/' >> .git/info/exclude
du -sh .gpu
