#!/usr/bin/env bash
# scripts/demo_gpt.sh BUILD [flags for tessera train]: `make demo-gpt` — a small GPT trained for a few minutes on the
# King James Bible (public domain; Debian's bible-kjv and bible-kjv-text packages) as bytes, then text sampled from it.
#   1. the text: `bible` prints every verse; the verse references are cut off (BUILD/kjv.txt, 4.1 MB)
#   2. tessera data tokenize: bytes as tokens (vocabulary 257 with <|endoftext|>), the first 10% the validation
#      split; it prints the unigram entropy of the tokens — what a model that ignores context can reach
#   3. tessera train: a 4-layer GPT (4 heads, 128 wide, context 128), AdamW, warmup + cosine, validation loss
#      every 100 steps, checkpoint BUILD/gpt-demo.ckpt
#   4. tessera generate: 300 bytes after a prompt, temperature 0.8, top-k 40
set -euo pipefail
BUILD=${1:-build}
shift || true
T="$BUILD/tessera"
if ! command -v bible >/dev/null; then
  echo "demo-gpt: the bible command is missing (scripts/install-deps installs bible-kjv and bible-kjv-text)" >&2
  exit 2
fi
if [ ! -s "$BUILD/kjv.txt" ]; then
  bible -f "gen1:1-rev22:21" | sed -E 's/^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ //' > "$BUILD/kjv.txt.part"
  mv "$BUILD/kjv.txt.part" "$BUILD/kjv.txt"
fi
"$T" data tokenize "$BUILD/kjv.txt" --out "$BUILD/kjv-tokens" | tee "$BUILD/kjv-tokens.txt"
entropy=$(sed -n 's/.*entropy of the training tokens: [0-9.]* bits\/token, \([0-9.]*\) nats.*/\1/p' "$BUILD/kjv-tokens.txt")
rm -f "$BUILD/gpt-demo.ckpt"
"$T" train --model gpt2 --n-layer 4 --n-head 4 --n-embd 128 --seq-len 128 --data "$BUILD/kjv-tokens" \
  --batch-size 16 --optimizer adamw --lr 2e-3 --weight-decay 0.1 --warmup-steps 40 --clip-grad-norm 1 \
  --max-steps 400 --eval-every 100 --eval-batches 20 --checkpoint "$BUILD/gpt-demo.ckpt" \
  --metrics-json "$BUILD/gpt-demo-metrics.json" "$@"
val=$(sed -n 's/.*"eval_loss": \([0-9.]*\).*/\1/p' "$BUILD/gpt-demo-metrics.json")
echo
echo "validation loss ${val:-?} nats/token against the unigram entropy of the text, $entropy nats/token"
echo
echo "--- sampled from $BUILD/gpt-demo.ckpt after \"And God said\":"
"$T" generate --checkpoint "$BUILD/gpt-demo.ckpt" --prompt "And God said" --max-new-tokens 300 \
  --temperature 0.8 --top-k 40 --seed 1
