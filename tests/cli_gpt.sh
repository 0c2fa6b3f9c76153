#!/usr/bin/env bash
# A GPT trained by `tessera train` on token shards: the banner and the validation lines, --eval-every, the
# loss falling below the text's unigram entropy, a run resumed mid-epoch equal bit for bit to one that did not
# stop, two DDP ranks at half the rows equal to one process (within 1e-5), --strategy pipeline over two virtual
# devices equal to one process (within 1e-5) and its checkpoint generating, `tessera eval` on the checkpoint,
# `tessera generate --checkpoint --prompt TEXT` (the byte tokenizer), and the mismatches named (an image model
# on token shards, a GPT on images, a context longer than the model's).
set -u
TS=${1:?usage: cli_gpt.sh path/to/tessera}
. "$(dirname "$0")/testlib.sh"
test_tmpdir

# a text with structure a small model picks up: the golden tokenizer text, three times
G=$(cd "$(dirname "$0")" && pwd)/golden/tok
for i in 1 2 3; do cat "$G/text.txt"; done > "$T/text.txt"
out=$("$TS" data tokenize "$T/text.txt" --out "$T/tok" 2>&1) || bad "tokenize: $out"
entropy=$(sed -n 's/.*bits\/token, \([0-9.]*\) nats.*/\1/p' <<<"$out")
[ -n "$entropy" ] && ok "unigram entropy $entropy nats/token" || bad "no entropy line: $out"

GPT="--model gpt2-tiny --seq-len 32 --data $T/tok --batch-size 8 --optimizer adamw --lr 3e-3 --weight-decay 0.1 --seed 3 --quiet"
out=$("$TS" train $GPT --max-steps 200 --eval-every 100 --eval-batches 8 --checkpoint "$T/a.ckpt" \
  --metrics-json "$T/a.json" 2>&1)
rc=$?
[ $rc -eq 0 ] && ok "train gpt2-tiny on token shards" || bad "train: rc $rc: $out"
grep -q "^training gpt2-tiny (2 layers, 2 heads, 64 wide, context 32, 257 tokens)" <<<"$out" \
  && ok "banner names the sizes and the data's vocabulary" || bad "banner: $out"
[ "$(grep -c '^step [12]00: train loss .*val loss' <<<"$out")" = 2 ] && ok "--eval-every 100: steps 100 and 200" \
  || bad "eval lines: $out"
val=$(sed -n 's/.*"eval_loss": \([0-9.]*\).*/\1/p' "$T/a.json")
awk -v v="$val" -v e="$entropy" 'BEGIN { exit !(v > 0 && v < e - 0.3) }' \
  && ok "validation loss $val below the unigram entropy $entropy" || bad "val loss $val vs entropy $entropy"

# resumed mid-epoch = uninterrupted, bit for bit
"$TS" train $GPT --max-steps 30 --checkpoint "$T/full.ckpt" >/dev/null 2>&1 || bad "30 steps"
"$TS" train $GPT --max-steps 30 --checkpoint-every 12 --checkpoint-dir "$T/dir" --keep 0 >/dev/null 2>&1
cp "$T/dir/step-000000000012.ckpt" "$T/part.ckpt" 2>/dev/null || bad "no step-12 checkpoint: $(ls "$T/dir")"
"$TS" train $GPT --max-steps 30 --resume "$T/part.ckpt" --checkpoint "$T/resumed.ckpt" >/dev/null 2>&1 || bad "resume"
"$TS" ckpt diff "$T/full.ckpt" "$T/resumed.ckpt" --tol 0 >/dev/null 2>&1 \
  && ok "resumed at step 12 of 30 = uninterrupted (tol 0)" || bad "resume differs: $("$TS" ckpt diff "$T/full.ckpt" "$T/resumed.ckpt" 2>&1 | tail -3)"

# two ranks of 4 rows = one process of 8 (the same windows each step), 20 steps
"$TS" train $GPT --max-steps 20 --checkpoint "$T/one.ckpt" >/dev/null 2>&1 || bad "one process"
"$TS" train ${GPT/--batch-size 8/--batch-size 4} --nproc 2 --max-steps 20 --checkpoint "$T/two.ckpt" >/dev/null 2>&1 \
  || bad "two ranks"
"$TS" ckpt diff "$T/one.ckpt" "$T/two.ckpt" --tol 1e-5 >/dev/null 2>&1 \
  && ok "--nproc 2 at 4 rows = 1 process at 8 (tol 1e-5)" || bad "DDP differs: $("$TS" ckpt diff "$T/one.ckpt" "$T/two.ckpt" --tol 1e-5 2>&1 | tail -3)"

# --strategy pipeline over two virtual devices (embedding + block 0 | block 1 + ln_f + the tied head), GPipe and
# 1F1B: one process's checkpoint within 1e-5 after 20 steps (at --lr 1e-3: AdamW turns the rounding noise of
# gradients that are zero in exact arithmetic, c_attn's key bias, into steps of up to lr), and it generates
PGPT=${GPT/--lr 3e-3/--lr 1e-3}
"$TS" train $PGPT --max-steps 20 --checkpoint "$T/one1.ckpt" >/dev/null 2>&1 || bad "one process at lr 1e-3"
for sched in gpipe 1f1b; do
  out=$("$TS" train $PGPT --max-steps 20 --strategy pipeline --devices cpu:0,cpu:1 --micro-batches 3 --schedule $sched \
    --checkpoint "$T/pp_$sched.ckpt" 2>&1) || bad "pipeline $sched: $out"
  "$TS" ckpt diff "$T/one1.ckpt" "$T/pp_$sched.ckpt" --tol 1e-5 >/dev/null 2>&1 \
    && ok "--strategy pipeline --schedule $sched over cpu:0,cpu:1 = 1 device (tol 1e-5)" \
    || bad "pipeline $sched differs: $("$TS" ckpt diff "$T/one1.ckpt" "$T/pp_$sched.ckpt" --tol 1e-5 2>&1 | tail -3)"
done
out=$(TS_LOG_LEVEL=info "$TS" train $PGPT --max-steps 2 --strategy pipeline --devices cpu:0,cpu:1 --micro-batches 2 2>&1)
grep -q "pipeline: 1f1b schedule, 2 micro-batches per batch; cpu:0: 1 blocks, cpu:1: 1 blocks" <<<"$out" \
  && ok "pipeline banner: blocks per stage" || bad "pipeline banner: $out"
g=$("$TS" generate --checkpoint "$T/pp_1f1b.ckpt" --prompt "The " --max-new-tokens 20 --seed 5 2>&1)
grep -q "^The " <<<"$g" && ok "generate from the pipeline's checkpoint" || bad "generate after pipeline: '$g'"
out=$(TS_CPU_DEVICES=3 "$TS" train $PGPT --max-steps 1 --strategy pipeline --devices cpu:0,cpu:1,cpu:2 2>&1)
grep -q "3 stages but the GPT has only 2 blocks" <<<"$out" && ok "3 stages for 2 blocks refused, named" \
  || bad "3 stages: $out"

# eval on the checkpoint
out=$("$TS" eval --checkpoint "$T/a.ckpt" --data "$T/tok" --batch-size 4 2>&1)
grep -q "^gpt2-tiny on .*tokens, loss [0-9.]* (.* bits/token, perplexity .*), next-token accuracy" <<<"$out" \
  && ok "eval: loss, bits/token, perplexity" || bad "eval: $out"

# generate from the checkpoint: text in, text out (bytes); the same seed, the same text
g1=$("$TS" generate --checkpoint "$T/a.ckpt" --prompt "The " --max-new-tokens 40 --seed 5 2>&1)
g2=$("$TS" generate --checkpoint "$T/a.ckpt" --prompt "The " --max-new-tokens 40 --seed 5 2>&1)
[ -n "$g1" ] && [ "$g1" = "$g2" ] && grep -q "^The " <<<"$g1" && ok "generate: text after the prompt, seeded" \
  || bad "generate: '$g1' / '$g2'"

# ONNX export of the checkpoint: token ids in, the reference files as int64 ids and float logits
"$TS" export --checkpoint "$T/a.ckpt" --out "$T/a.onnx" --input-shape 2,20 --reference "$T/ref" >/dev/null 2>&1 \
  && head -c 80 "$T/ref.input.npy" | grep -q "'descr': '<i8'.*'shape': (2, 20)" \
  && head -c 80 "$T/ref.output.npy" | grep -q "'descr': '<f4'.*'shape': (2, 20, 257)" \
  && ok "export: a GPT as ONNX, example token ids (2, 20) -> logits (2, 20, 257)" || bad "export of the GPT"
PY=$(bash "$(dirname "$0")/find_python.sh" onnxruntime 2>/dev/null)
if [ -n "$PY" ]; then
  "$PY" - "$T" <<'PYEOF' && ok "onnxruntime's logits = Tessera's (1e-5)" || bad "onnxruntime disagrees"
import sys, numpy as np, onnxruntime as ort
d = sys.argv[1]
s = ort.InferenceSession(d + "/a.onnx")
x, y = np.load(d + "/ref.input.npy"), np.load(d + "/ref.output.npy")
sys.exit(0 if abs(s.run(None, {s.get_inputs()[0].name: x})[0] - y).max() < 1e-5 else 1)
PYEOF
fi

# mismatches, named
out=$("$TS" train --model cnn --data "$T/tok" --max-steps 1 2>&1)
grep -q "holds token shards: model cnn takes images" <<<"$out" && ok "cnn on token shards refused" || bad "$out"
mkdir -p "$T/img/a" "$T/img/b"
out=$("$TS" train --model gpt2-tiny --data "$T/img" --max-steps 1 2>&1)
grep -q "language model: it trains on token shards" <<<"$out" && ok "a GPT on images refused" || bad "$out"
out=$("$TS" train --model gpt2-tiny --data "$T/tok" --seq-len 100 --max-steps 1 --quiet 2>&1)
[ $? -eq 0 ] && ok "--seq-len 100 grows gpt2-tiny's context" || bad "seq-len 100: $out"
cli_summary
