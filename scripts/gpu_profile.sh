#!/usr/bin/env bash
# Where a training step's GPU time goes, Tessera beside PyTorch, per kernel: Tessera's kernels timed by
# Nsight Compute (ncu, clocks left alone) over a window of launches after the warm-up, PyTorch's by
# torch.profiler over 3 steps; each printed as milliseconds per step by kernel name (scripts/kernel_table.py).
# Runs on the GPU machine from the bundle of scripts/gpu_bundle.sh, like scripts/gpu_check.sh.
#
# usage: scripts/gpu_profile.sh OUT_DIR [MODEL] [IMAGE_SIZE] [BATCH] [PRECISION] [LAUNCHES]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/gpu_profile.sh OUT_DIR [MODEL] [IMAGE_SIZE] [BATCH] [PRECISION] [LAUNCHES]}
M=${2:-resnet18} S=${3:-224} B=${4:-128} P=${5:-fp32} N=${6:-1200}
mkdir -p "$OUT"
SP=$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)
LIBS=$PWD/.gpu/lib
for d in "$SP"/nvidia/*/lib /usr/local/cuda/lib64; do [ -d "$d" ] && LIBS=$LIBS:$d; done
export LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
tag=${M}_${S}_${B}_${P}
# 12 warm-up steps of a few hundred launches each are skipped; the window holds several whole steps
timeout 240 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
  --launch-skip 4000 --launch-count "$N" \
  .gpu/bin/tessera bench train --device cuda:0 --model "$M" --image-size "$S" --batch-size "$B" --precision "$P" \
  --warmup 12 --steps 8 > "$OUT/ncu_$tag.csv" 2> "$OUT/ncu_$tag.err"
echo "== tessera $tag (ncu; per step = per ce_backward_kernel launch)"
python3 scripts/kernel_table.py ncu "$OUT/ncu_$tag.csv" ce_backward_kernel 25
echo "== pytorch $tag (torch.profiler, 3 steps)"
timeout 120 python3 bench/gpu_vs_pytorch.py "$M" "$S" "$B" 3 "$P" --profile 25
