#!/usr/bin/env bash
# The reference CNN's training throughput, Tessera beside PyTorch, side by side in one run: in-memory
# batches of 64, SGD + momentum, 1 and 2 threads, float32 and bfloat16 (Tessera's --precision bf16;
# PyTorch's torch.autocast("cpu", torch.bfloat16)). PyTorch from pip (python3: the newest CPU build
# the registry offers) and Debian's python3-torch (/usr/bin/python3), each when installed. Every
# figure is the best of ROUNDS alternating runs (the machine is shared: compare ratios within one run).
# The last columns are the GEMM rates and the FMA peak of the same threads, measured in the same run
# (`tessera bench gemm`): the physical limit.
#
# usage: bench/train_vs_pytorch.sh [BUILD_DIR] [STEPS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
STEPS=${2:-150}
ROUNDS=${3:-3}
PIP_PY=python3
DEB_PY=/usr/bin/python3
have() { "$1" -c 'import torch' 2>/dev/null; }
have "$PIP_PY" || PIP_PY=""
have "$DEB_PY" || DEB_PY=""
[ "$PIP_PY" = "$DEB_PY" ] && PIP_PY=""
if [ -z "$PIP_PY" ] && [ -z "$DEB_PY" ]; then
  echo "train_vs_pytorch: no PyTorch (pip install torch, or TS_WITH_TORCH=1 scripts/install-deps)" >&2
  exit 1
fi
json_field() { sed -n "s/.*\"$1\": *\([0-9.e+-]*\).*/\1/p"; }
max() { awk -v a="$1" -v b="${2:-0}" 'BEGIN{print (b>a)?b:a}'; }
pt() { [ -n "$1" ] && "$1" bench/train_vs_pytorch.py "$2" "$STEPS" 64 "$3" | json_field images_per_second || echo 0; }
echo "reference CNN training, batch 64, best of $ROUNDS rounds of $STEPS steps; images/s"
echo "pip torch: $([ -n "$PIP_PY" ] && $PIP_PY -c 'import torch; print(torch.__version__)' || echo -)" \
     "  Debian torch: $([ -n "$DEB_PY" ] && $DEB_PY -c 'import torch; print(torch.__version__)' || echo -)"
printf '%-7s %9s %9s %9s %9s %9s %9s %7s %7s %7s %9s %9s %9s\n' threads ts_fp32 ts_bf16 pip_fp32 pip_bf16 deb_fp32 \
  deb_bf16 fp32/pip fp32/deb bf16/fp32 gemm_fp32 gemm_bf16 fma_peak
for t in 1 2; do
  a=0; b=0; c=0; d=0; e=0; f=0
  for r in $(seq "$ROUNDS"); do
    a=$(max "$a" "$("$BUILD/tessera" bench train --threads "$t" --steps "$STEPS" --batch-size 64 --json | json_field images_per_second)")
    b=$(max "$b" "$("$BUILD/tessera" bench train --threads "$t" --steps "$STEPS" --batch-size 64 --precision bf16 --json | json_field images_per_second)")
    c=$(max "$c" "$(pt "$PIP_PY" "$t" fp32)")
    d=$(max "$d" "$(pt "$PIP_PY" "$t" bf16)")
    e=$(max "$e" "$(pt "$DEB_PY" "$t" fp32)")
    f=$(max "$f" "$(pt "$DEB_PY" "$t" bf16)")
  done
  g=$("$BUILD/tessera" bench gemm --threads "$t" --json)
  gf=$(json_field gflops <<<"$g"); gb=$(json_field bf16_gflops <<<"$g"); pk=$(json_field fma_peak_avx512 <<<"$g")
  [ "$(awk -v p="$pk" 'BEGIN{print (p>0)}')" = 1 ] || pk=$(json_field fma_peak_avx2 <<<"$g")
  awk -v t="$t" -v a="$a" -v b="$b" -v c="$c" -v d="$d" -v e="$e" -v f="$f" -v gf="$gf" -v gb="$gb" -v pk="$pk" \
    'function r(x, y) { return y > 0 ? sprintf("%.2f", x / y) : "-" }
     BEGIN { printf "%-7s %9.0f %9.0f %9.0f %9.0f %9.0f %9.0f %7s %7s %7s %9.0f %9.0f %9.0f\n",
             t, a, b, c, d, e, f, r(a, c), r(a, e), r(b, a), gf, gb, pk }'
done
