#!/usr/bin/env bash
# Training throughput on a CUDA GPU, Tessera beside PyTorch (the GPU machine's own torch), side by side in
# one run: the reference CNN (batch 64) and ResNet-18 (batch 32 at 64x64 and 112x112, 128 at 224x224),
# fp32 (no TF32 on either side) and bf16 (Tessera --precision bf16: cuBLAS/cuDNN with bfloat16 operands
# and float32 accumulation; PyTorch torch.autocast). Both read the loss every step. Best of ROUNDS
# alternating runs. Last: the GPU's dense matmul rates measured by PyTorch in the same run (the physical
# limit) and Tessera's achieved fraction of them for ResNet-18 (3x the forward FLOPs per image).
# Tessera runs three times per row, by how cuDNN's algorithms are chosen (TS_CUDNN_ALGO): ts_heur, its
# heuristics (the default, exact families only); ts_find, measured among the exact (GEMM and direct) ones;
# ts_bench, measured among all, FFT and Winograd included, the set of PyTorch's cudnn.benchmark=True, which
# the PyTorch side sets. best/pt and tflops% use the best of Tessera's three.
#
# usage: bench/gpu_vs_pytorch.sh [BUILD_DIR] [STEPS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
STEPS=${2:-100}
ROUNDS=${3:-2}
PY=${PYTHON:-python3}
json_field() { sed -n "s/.*\"$1\": *\"\{0,1\}\([0-9.e+-]*\).*/\1/p"; }
max() { awk -v a="$1" -v b="${2:-0}" 'BEGIN{print (b>a)?b:a}'; }
"$BUILD/tessera" devices
peak=$($PY bench/gpu_vs_pytorch.py --peak)
echo "peak: $peak"
p32=$(echo "$peak" | json_field fp32_tflops)
p16=$(echo "$peak" | json_field bf16_tflops)
printf '%-9s %4s %5s %4s %9s %9s %9s %9s %7s %8s\n' model size batch prec ts_heur ts_find ts_bench pytorch best/pt tflops%
ts() { "$BUILD/tessera" bench train --device cuda:0 --model "$1" --image-size "$2" --batch-size "$3" --precision "$4" \
       --steps "$STEPS" --json | json_field images_per_second; }
run() { # model size batch prec
  local m=$1 s=$2 b=$3 p=$4 a=0 f=0 k=0 c=0 gf=0
  for r in $(seq "$ROUNDS"); do
    a=$(max "$a" "$(ts "$m" "$s" "$b" "$p")")
    f=$(max "$f" "$(TS_CUDNN_ALGO=find ts "$m" "$s" "$b" "$p")")
    k=$(max "$k" "$(TS_CUDNN_ALGO=benchmark ts "$m" "$s" "$b" "$p")")
    out=$($PY bench/gpu_vs_pytorch.py "$m" "$s" "$b" "$STEPS" "$p")
    c=$(max "$c" "$(echo "$out" | json_field images_per_second)")
    gf=$(echo "$out" | json_field forward_gflops_per_image)
  done
  local pk=$p32; [ "$p" = bf16 ] && pk=$p16
  local best; best=$(max "$(max "$a" "$f")" "$k")
  printf '%-9s %4s %5s %4s %9.0f %9.0f %9.0f %9.0f %7.2f %8.2f\n' "$m" "$s" "$b" "$p" "$a" "$f" "$k" "$c" \
    "$(awk -v a="$best" -v c="$c" 'BEGIN{print (c>0)?a/c:0}')" \
    "$(awk -v a="$best" -v g="$gf" -v k="$pk" 'BEGIN{print (k>0)?100*a*3*g/1000/k:0}')"
}
for p in fp32 bf16; do
  run cnn 28 64 "$p"
  run resnet18 64 32 "$p"
  run resnet18 112 32 "$p"
  run resnet18 224 128 "$p"
done
