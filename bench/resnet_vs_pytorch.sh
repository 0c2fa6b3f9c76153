#!/usr/bin/env bash
# ResNet-18 training, Tessera beside PyTorch, side by side in one run: batch 32 of random in-memory
# images at 64x64 and 112x112, SGD + momentum, 1 and 2 threads; PyTorch from pip (python3, the newest
# CPU build the registry offers) and Debian's python3-torch (/usr/bin/python3), each when present.
# Every figure is the best of ROUNDS alternating runs (the machine is shared: compare ratios within
# one run). Tessera runs three times: its default (--conv-algo auto: oneDNN's convolution primitives
# where the build has oneDNN), --conv-algo winograd (our Winograd F(2x2)/F(4x4) on oneDNN's or
# OpenBLAS's sgemm) and --precision bf16 (bfloat16 products, float32 accumulation; compare with the
# fp32 columns knowing it rounds more). Effective GFLOP/s = 3 x forward FLOPs per image (forward + two
# backward products; counted by the PyTorch script's hooks: 2 x MACs of every convolution and linear
# layer, as a direct convolution does them) x images/s of the default, against the AVX-512 (else AVX2)
# FMA peak of the same threads measured in the same run (`tessera bench gemm`); wino_pip / wino_deb are the
# Winograd run over PyTorch's, and 1.5x_needs is the share of that peak a direct-convolution step would
# need to run 1.5x PyTorch (pip's, else Debian's): beyond ~90% it takes fewer multiplies (Winograd), not a
# faster direct kernel.
#
# usage: bench/resnet_vs_pytorch.sh [BUILD_DIR] [STEPS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
STEPS=${2:-4}
ROUNDS=${3:-2}
PIP_PY=python3
DEB_PY=/usr/bin/python3
have() { "$1" -c 'import torch' 2>/dev/null; }
have "$PIP_PY" || PIP_PY=""
have "$DEB_PY" || DEB_PY=""
if [ -z "$PIP_PY" ] && [ -z "$DEB_PY" ]; then
  echo "resnet_vs_pytorch: no PyTorch (pip install torch, or TS_WITH_TORCH=1 scripts/install-deps)" >&2
  exit 1
fi
REF=${PIP_PY:-$DEB_PY}
json_field() { sed -n "s/.*\"$1\": *\"\{0,1\}\([^,\"}]*\).*/\1/p"; }
max() { awk -v a="$1" -v b="$2" 'BEGIN{print (b>a)?b:a}'; }
pipv=$([ -n "$PIP_PY" ] && $PIP_PY -c 'import torch; print(torch.__version__)' || echo -)
debv=$([ -n "$DEB_PY" ] && $DEB_PY -c 'import torch; print(torch.__version__)' || echo -)
echo "ResNet-18 training, batch 32, SGD momentum 0.9; best of $ROUNDS rounds of $STEPS steps"
echo "pip torch: $pipv   Debian torch: $debv"
printf '%-5s %-7s %9s %9s %9s %9s %9s %7s %7s %8s %8s %10s %9s %7s %9s\n' size threads tessera ts_wino ts_bf16 \
  pip_torch deb_torch vs_pip vs_deb wino_pip wino_deb eff_GFLOP/s fma_peak of_peak 1.5x_needs
for size in 64 112; do
  fwd=$($REF bench/resnet_vs_pytorch.py 1 "$size" 1 2 | json_field forward_gflops_per_image)
  for t in 1 2; do
    ts=0; t4=0; ti=0; pp=0; dp=0; peak=0
    for r in $(seq "$ROUNDS"); do
      v=$("$BUILD/tessera" bench train --model resnet18 --image-size "$size" --batch-size 32 --threads "$t" \
          --steps "$STEPS" --warmup 1 --json | json_field images_per_second); ts=$(max "$ts" "$v")
      v=$("$BUILD/tessera" bench train --model resnet18 --image-size "$size" --batch-size 32 --threads "$t" \
          --steps "$STEPS" --warmup 1 --conv-algo winograd --json | json_field images_per_second); t4=$(max "$t4" "$v")
      v=$("$BUILD/tessera" bench train --model resnet18 --image-size "$size" --batch-size 32 --threads "$t" \
          --steps "$STEPS" --warmup 1 --precision bf16 --json | json_field images_per_second); ti=$(max "$ti" "$v")
      if [ -n "$PIP_PY" ]; then v=$($PIP_PY bench/resnet_vs_pytorch.py "$t" "$size" "$STEPS" 32 | json_field images_per_second); pp=$(max "$pp" "$v"); fi
      if [ -n "$DEB_PY" ]; then v=$($DEB_PY bench/resnet_vs_pytorch.py "$t" "$size" "$STEPS" 32 | json_field images_per_second); dp=$(max "$dp" "$v"); fi
      g=$("$BUILD/tessera" bench gemm --threads "$t" --json); v=$(json_field fma_peak_avx512 <<<"$g")
      [ "$(awk -v p="$v" 'BEGIN{print (p>0)}')" = 1 ] || v=$(json_field fma_peak_avx2 <<<"$g"); peak=$(max "$peak" "$v")
    done
    awk -v s="$size" -v t="$t" -v a="$ts" -v f4="$t4" -v i="$ti" -v p="$pp" -v d="$dp" -v f="$fwd" -v pk="$peak" 'BEGIN{
      g = 3 * f * a; r = (p > 0 ? p : d);
      printf "%-5s %-7s %9.1f %9.1f %9.1f %9s %9s %7s %7s %8s %8s %10.1f %9.1f %6.0f%% %8.0f%%\n", s, t, a, f4, i,
        (p > 0 ? sprintf("%.1f", p) : "-"), (d > 0 ? sprintf("%.1f", d) : "-"),
        (p > 0 ? sprintf("%.2f", a / p) : "-"), (d > 0 ? sprintf("%.2f", a / d) : "-"),
        (p > 0 ? sprintf("%.2f", f4 / p) : "-"), (d > 0 ? sprintf("%.2f", f4 / d) : "-"), g, pk, 100 * g / pk,
        100 * 3 * f * 1.5 * r / pk }'
  done
done
