#!/usr/bin/env bash
# Tessera vs PyTorch, side by side in one run: the reference CNN trained on
# in-memory batches of 64 with SGD + momentum, at 1 and 2 threads. Each figure
# is the best of ROUNDS alternating runs, so both see the same machine state.
#
# usage: bench/train_vs_pytorch.sh [BUILD_DIR] [STEPS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
STEPS=${2:-150}
ROUNDS=${3:-3}
PY=/usr/bin/python3
if ! $PY -c 'import torch' 2>/dev/null; then
  echo "train_vs_pytorch: PyTorch is not installed; run: TS_WITH_TORCH=1 scripts/install-deps" >&2
  exit 1
fi
json_field() { sed -n "s/.*\"$1\": *\([0-9.e+-]*\).*/\1/p"; }
printf '%-8s %14s %14s %8s\n' threads tessera_img/s pytorch_img/s ratio
for t in 1 2; do
  best_ts=0; best_pt=0
  for r in $(seq "$ROUNDS"); do
    ts=$("$BUILD/tessera" bench train --threads "$t" --steps "$STEPS" --batch-size 64 --json | json_field images_per_second)
    pt=$($PY bench/train_vs_pytorch.py "$t" "$STEPS" 64 | json_field images_per_second)
    best_ts=$(awk -v a="$best_ts" -v b="$ts" 'BEGIN{print (b>a)?b:a}')
    best_pt=$(awk -v a="$best_pt" -v b="$pt" 'BEGIN{print (b>a)?b:a}')
  done
  awk -v t="$t" -v a="$best_ts" -v b="$best_pt" 'BEGIN{printf "%-8s %14.0f %14.0f %8.2f\n", t, a, b, a/b}'
done
