#!/usr/bin/env bash
# Training throughput of 1 process (1 thread) against 2 DDP processes (1
# thread each, 64 images per rank), Tessera and PyTorch DDP/gloo side by side
# in one run; best of ROUNDS alternating runs. Tessera trains on Fashion-MNIST
# through its loader; PyTorch on in-memory batches (so its figures exclude
# data loading).
#
# usage: bench/train_1v2.sh [BUILD_DIR] [STEPS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
STEPS=${2:-300}
ROUNDS=${3:-3}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
have_torch=0
/usr/bin/python3 -c 'import torch' 2>/dev/null && have_torch=1
field() { sed -n 's/.*"images_per_second": *\([0-9.e+-]*\).*/\1/p' "$@" | head -1; }
best() { awk -v a="$1" -v b="$2" 'BEGIN{print (b+0>a+0)?b:a}'; }
t1=0; t2=0; p1=0; p2=0
for r in $(seq "$ROUNDS"); do
  "$BUILD/tessera" train --threads 1 --max-steps "$STEPS" --epochs 1 --quiet --metrics-json "$T/1.json" >/dev/null
  "$BUILD/tessera" train --nproc 2 --max-steps "$STEPS" --epochs 1 --quiet --metrics-json "$T/2.json" >/dev/null
  t1=$(best "$t1" "$(field "$T/1.json")"); t2=$(best "$t2" "$(field "$T/2.json")")
  if [ $have_torch = 1 ]; then
    p1=$(best "$p1" "$(/usr/bin/python3 bench/ddp_pytorch.py 1 "$STEPS" | field)")
    p2=$(best "$p2" "$(/usr/bin/python3 bench/ddp_pytorch.py 2 "$STEPS" 2>/dev/null | field)")
  fi
done
printf '%-10s %12s %12s %8s\n' "" 1_process 2_processes speedup
awk -v a="$t1" -v b="$t2" 'BEGIN{printf "%-10s %12.0f %12.0f %7.2fx\n", "tessera", a, b, b/a}'
[ $have_torch = 1 ] && awk -v a="$p1" -v b="$p2" 'BEGIN{printf "%-10s %12.0f %12.0f %7.2fx\n", "pytorch", a, b, b/a}'
exit 0
