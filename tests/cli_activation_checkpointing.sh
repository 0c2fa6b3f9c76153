#!/usr/bin/env bash
# `tessera train --activation-checkpointing`: a GPT with dropout trained 30 steps with the flag equals the run
# without it (checkpoints within 1e-5; the recomputation replays the dropout masks), also as two DDP ranks, as
# a two-stage pipeline and as DataParallel over two virtual devices; the banner says it; a model without blocks (the cnn) is refused, named.
set -u
TS=${1:?usage: cli_activation_checkpointing.sh path/to/tessera}
. "$(dirname "$0")/testlib.sh"
test_tmpdir

G=$(cd "$(dirname "$0")" && pwd)/golden/tok
for i in 1 2 3; do cat "$G/text.txt"; done > "$T/text.txt"
out=$("$TS" data tokenize "$T/text.txt" --out "$T/tok" 2>&1) || bad "tokenize: $out"

GPT="--model gpt2-tiny --n-layer 3 --seq-len 32 --dropout 0.1 --data $T/tok --batch-size 8 --optimizer adamw --lr 1e-3 --seed 3 --quiet"
"$TS" train $GPT --max-steps 30 --checkpoint "$T/plain.ckpt" >/dev/null 2>&1 || bad "train without the flag"
out=$("$TS" train $GPT --max-steps 30 --activation-checkpointing --checkpoint "$T/ac.ckpt" 2>&1)
[ $? -eq 0 ] && ok "train with --activation-checkpointing" || bad "train with the flag: $out"
grep -q "^--activation-checkpointing: each block keeps only its input" <<<"$out" && ok "banner line" || bad "banner: $out"
"$TS" ckpt diff "$T/plain.ckpt" "$T/ac.ckpt" --tol 1e-5 >/dev/null 2>&1 \
  && ok "30 steps with dropout: = without the flag (tol 1e-5)" \
  || bad "differs: $("$TS" ckpt diff "$T/plain.ckpt" "$T/ac.ckpt" --tol 1e-5 2>&1 | tail -3)"

# DDP (the gradients reach the buckets' hooks from the outer backward) and pipeline stages, dropout 0: each
# equal to one process without the flag
G0=${GPT/--dropout 0.1/--dropout 0}
"$TS" train $G0 --max-steps 10 --checkpoint "$T/one.ckpt" >/dev/null 2>&1 || bad "one process"
"$TS" train ${G0/--batch-size 8/--batch-size 4} --nproc 2 --max-steps 10 --activation-checkpointing \
  --checkpoint "$T/two.ckpt" >/dev/null 2>&1 || bad "two ranks with the flag"
"$TS" ckpt diff "$T/one.ckpt" "$T/two.ckpt" --tol 1e-5 >/dev/null 2>&1 \
  && ok "--nproc 2 --activation-checkpointing = 1 process without (tol 1e-5)" \
  || bad "DDP differs: $("$TS" ckpt diff "$T/one.ckpt" "$T/two.ckpt" --tol 1e-5 2>&1 | tail -3)"
"$TS" train $G0 --max-steps 10 --strategy pipeline --devices cpu:0,cpu:1 --micro-batches 2 --activation-checkpointing \
  --checkpoint "$T/pp.ckpt" >/dev/null 2>&1 || bad "pipeline with the flag"
"$TS" ckpt diff "$T/one.ckpt" "$T/pp.ckpt" --tol 1e-5 >/dev/null 2>&1 \
  && ok "--strategy pipeline --activation-checkpointing = 1 device without (tol 1e-5)" \
  || bad "pipeline differs: $("$TS" ckpt diff "$T/one.ckpt" "$T/pp.ckpt" --tol 1e-5 2>&1 | tail -3)"

"$TS" train $G0 --max-steps 10 --strategy data --devices cpu:0,cpu:1 --activation-checkpointing \
  --checkpoint "$T/dp.ckpt" >/dev/null 2>&1 || bad "DataParallel with the flag"
"$TS" ckpt diff "$T/one.ckpt" "$T/dp.ckpt" --tol 1e-5 >/dev/null 2>&1 \
  && ok "--strategy data --activation-checkpointing = 1 device without (tol 1e-5)" \
  || bad "DataParallel differs: $("$TS" ckpt diff "$T/one.ckpt" "$T/dp.ckpt" --tol 1e-5 2>&1 | tail -3)"

# a model without units
DATA=/usr/share/datasets/fashion-mnist
if [ -f "$DATA/train-images-idx3-ubyte.gz" ]; then
  expect_exit 2 "activation checkpointing: the model (cnn) has no unit to checkpoint" "$TS" train --model cnn --data "$DATA" --max-steps 1 --activation-checkpointing --quiet
else
  echo "skip: no $DATA (the cnn's refusal)"
fi
cli_summary
