#!/usr/bin/env bash
# A GPT-2 training step, Tessera (build/bench_gpt) beside llm.c's CPU reference train_gpt2.c built from its
# sources, the same model, the same random weights and the same tokens per step, at 1 and 2 threads.
#
# usage: bench/gpt_vs_llmc.sh LLMC   (LLMC: llm.c's git directory, e.g. the `.git` of a clone, or a source
#                                      checkout holding train_gpt2.c and llmc/)
# environment (defaults: the issue's 6 layers, 6 heads, 384 wide, T 256, batch 8, GPT-2's 50,257 tokens):
#   L=6 NH=6 C=384 T=256 B=8 V=50257   the model and the batch
#   BUILD=build                        Tessera's build folder (tessera, bench_gpt, bench_gpt_weights)
#   THREADS="1 2"                      the thread counts (OMP_NUM_THREADS on both sides)
#   LLMC_STEPS=3  ITERS=3  ROUNDS=1    llm.c's timed steps after its first; bench_gpt's; runs of each, alternating
#   GFLOPS=                            the sgemm rate per thread count for the floor, e.g. "75 140" (default:
#                                      measured here: numpy's float32 matmul 2048x384 @ 384x2048, best of 10)
#   PYTHON=.pyvenv/bin/python3         a Python with numpy and safetensors (the converter, the sgemm rate)
#
# What runs:
#  * llm.c: train_gpt2.c and llmc/*.h exported to a temporary folder, built as its Makefile builds train_gpt2 on
#    Linux with gcc and OpenMP: gcc -Ofast -Wno-unused-result -Wno-ignored-pragmas -Wno-unknown-attributes
#    -march=native -fopenmp -DOMP train_gpt2.c -lm. Its main() is patched by sed in exactly three places, nothing
#    else: `int B = 4;` -> B, `int T = 64;` -> T, and `step <= 40` -> `step <= LLMC_STEPS` (LLMC_STEPS < 10, so
#    its validation loss (5 forward batches, outside its timer) runs once, before step 0, and its sampling (every
#    20 steps, outside its timer) never). Its checkpoint gpt2_124M.bin is written by scripts/llmc_checkpoint.py
#    from Tessera's weights; its data files dev/data/tinyshakespeare/tiny_shakespeare_{train,val}.bin are llm.c
#    token shards written by `tessera data tokenize --tokenizer bytes` from the King James Bible (Debian's
#    bible-kjv; else this repository's docs) — token ids below 257, valid for any V >= 257. Its timer covers
#    what its loop times: the next batch, forward, zero_grad, backward and AdamW (lr 1e-4, betas 0.9/0.999,
#    no weight decay); the figure is the median of its steps after step 0 (which also allocates).
#  * Tessera: bench_gpt L NH C B T V ITERS 0 (the same weights: ts_model_gpt seeded 1; random token ids in
#    [0, V)): forward, cross-entropy, backward, AdamW (lr 6e-4, betas 0.9/0.95, weight decay 0.1 on matrices:
#    the same work per parameter as llm.c's update); the median step after a first.
#  * The loss check: llm.c's printed validation loss at its initial weights (the mean over the first 5
#    validation batches, read in order) beside Tessera's forward loss on the same 5 batches (bench_gpt_weights).
#  * The floor: the step's multiply-adds as matmuls — 6 x (12 L C^2 + V C) x B T (forward and two backward
#    products of every linear layer and the tied head) + 12 L B T^2 C (attention's QK^T and PV, full T x T as
#    both sides compute it, forward and backward) — over the sgemm rate of the same threads.
# Every figure is the best of ROUNDS alternating runs; the machine's load average is printed with the table.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n 2,6p "$0" >&2; exit 2; }
LLMC=$1
L=${L:-6} NH=${NH:-6} C=${C:-384} T=${T:-256} B=${B:-8} V=${V:-50257}
BUILD=${BUILD:-build} THREADS=${THREADS:-"1 2"} LLMC_STEPS=${LLMC_STEPS:-3} ITERS=${ITERS:-3} ROUNDS=${ROUNDS:-1}
PYTHON=${PYTHON:-.pyvenv/bin/python3}
[ "$LLMC_STEPS" -ge 1 ] && [ "$LLMC_STEPS" -lt 10 ] || { echo "gpt_vs_llmc: LLMC_STEPS must be 1-9" >&2; exit 2; }
for exe in tessera bench_gpt bench_gpt_weights; do
  [ -x "$BUILD/$exe" ] || { echo "gpt_vs_llmc: no $BUILD/$exe (cmake --build $BUILD)" >&2; exit 1; }
done
"$PYTHON" -c 'import numpy, safetensors' || { echo "gpt_vs_llmc: $PYTHON lacks numpy or safetensors" >&2; exit 1; }

work=$(mktemp -d /tmp/gpt_vs_llmc.XXXXXX)
trap 'rm -rf "$work"' EXIT
# ---- llm.c's sources, patched (B, T, the step count) and built ----
if [ -f "$LLMC/train_gpt2.c" ]; then
  cp "$LLMC/train_gpt2.c" "$work/" && cp -r "$LLMC/llmc" "$work/"
  rev=$(git -C "$LLMC" rev-parse --short HEAD 2>/dev/null || echo "source folder")
else
  git --git-dir="$LLMC" archive HEAD train_gpt2.c llmc | tar -x -C "$work"
  rev=$(git --git-dir="$LLMC" rev-parse --short HEAD)
fi
src=$work/train_gpt2.c
sed -i -e "s/^\( *int B = \)4;/\1$B;/" -e "s/^\( *int T = \)64;/\1$T;/" \
       -e "s/for (int step = 0; step <= 40; step++)/for (int step = 0; step <= $LLMC_STEPS; step++)/" "$src"
for want in "int B = $B;" "int T = $T;" "step <= $LLMC_STEPS;"; do
  grep -qF "$want" "$src" || { echo "gpt_vs_llmc: patching train_gpt2.c failed at: $want" >&2; exit 1; }
done
(cd "$work" && gcc -Ofast -Wno-unused-result -Wno-ignored-pragmas -Wno-unknown-attributes -march=native \
   -fopenmp -DOMP train_gpt2.c -lm -o train_gpt2)

# ---- the data: llm.c token shards where its main() looks for them ----
data=$work/dev/data/tinyshakespeare
mkdir -p "$data"
if command -v bible >/dev/null; then bible -f "gen1:1-rev22:21" > "$work/text.txt"; else cat docs/*.md > "$work/text.txt"; fi
"$BUILD/tessera" data tokenize "$work/text.txt" --out "$work/tok" --tokenizer bytes --val-tokens $((5 * B * T + 1)) \
  > /dev/null
mv "$work"/tok/tokens_val_*.bin "$data/tiny_shakespeare_val.bin"
mv "$work"/tok/tokens_train_*.bin "$data/tiny_shakespeare_train.bin"

# ---- the weights: Tessera's, as safetensors, then as llm.c's checkpoint ----
ts_loss=$("$BUILD/bench_gpt_weights" "$L" "$NH" "$C" "$T" "$V" "$work/model.safetensors" \
  "$data/tiny_shakespeare_val.bin" "$B" 5 | sed -n 's/^loss=//p')
"$PYTHON" scripts/llmc_checkpoint.py "$work/model.safetensors" "$work/gpt2_124M.bin" --heads "$NH" > /dev/null
rm -f "$work/model.safetensors"

sgemm_rate() {  # GFLOP/s of numpy's float32 matmul (2048x384 @ 384x2048) at $1 threads, best of 10
  OMP_NUM_THREADS=$1 OPENBLAS_NUM_THREADS=$1 MKL_NUM_THREADS=$1 "$PYTHON" -c '
import time, numpy as np
a = np.random.rand(2048, 384).astype(np.float32); b = np.random.rand(384, 2048).astype(np.float32)
a @ b; best = min((lambda t0: (a @ b, time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(10))
print("%.1f" % (2 * 2048 * 384 * 2048 / best / 1e9))'
}
llmc_step() {  # median ms of llm.c's steps after step 0 at $1 threads (its output stays in $work/llmc.out)
  (cd "$work" && OMP_NUM_THREADS=$1 ./train_gpt2 > llmc.out)
  sed -n 's/^step \([0-9]*\): train loss .* (took \([0-9.]*\) ms)$/\1 \2/p' "$work/llmc.out" |
    awk '$1 > 0 {print $2}' | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'
}
ts_step() {  # bench_gpt's median ms at $1 threads
  OMP_NUM_THREADS=$1 "$BUILD/bench_gpt" "$L" "$NH" "$C" "$B" "$T" "$V" "$ITERS" 0 | sed -n 's/^ms=\([0-9.]*\) .*/\1/p'
}
min() { awk -v a="$1" -v b="$2" 'BEGIN{print (a == "" || b < a) ? b : a}'; }

read -r -a rates <<<"${GFLOPS:-}"
echo "GPT-2 training step: $L layers, $NH heads, $C wide, vocabulary $V, B $B x T $T tokens; llm.c $rev"
printf '%-7s %11s %11s %11s %11s %7s %9s %10s %9s\n' threads llmc_ms tessera_ms llmc_tok/s tessera_tok/s ratio \
  sgemm_GF/s floor_ms ts/floor
i=0
for t in $THREADS; do
  lm=""; tm=""
  for _ in $(seq "$ROUNDS"); do
    lm=$(min "$lm" "$(llmc_step "$t")")
    tm=$(min "$tm" "$(ts_step "$t")")
  done
  rate=${rates[$i]:-$(sgemm_rate "$t")}
  i=$((i + 1))
  awk -v t="$t" -v lm="$lm" -v tm="$tm" -v r="$rate" -v L="$L" -v C="$C" -v V="$V" -v B="$B" -v T="$T" 'BEGIN{
    tok = B * T; fl = 6 * (12 * L * C * C + V * C) * tok + 12 * L * B * T * T * C; floor = fl / (r * 1e9) * 1e3;
    printf "%-7s %11.1f %11.1f %11.0f %11.0f %6.2fx %9.1f %10.1f %8.2fx\n", t, lm, tm, tok / lm * 1e3, tok / tm * 1e3,
      lm / tm, r, floor, tm / floor }'
done
llmc_loss=$(sed -n 's/^val loss //p' "$work/llmc.out" | head -1)
echo "loss at the initial weights, first 5 validation batches: llm.c $llmc_loss, Tessera $ts_loss" \
  "(|diff| $(awk -v a="$llmc_loss" -v b="$ts_loss" 'BEGIN{d = a - b; printf "%.2g", d < 0 ? -d : d}'))"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
