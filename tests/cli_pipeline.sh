#!/usr/bin/env bash
# `tessera train --strategy pipeline`: short GPipe and 1F1B runs on two virtual
# CPU devices write metrics, and bad pipeline settings fail naming what is wrong.
# Skips (77) while `tessera train` has no --strategy flag.
set -u
TS=${1:?usage: cli_pipeline.sh path/to/tessera}
DATA=/usr/share/datasets/fashion-mnist
[ -f "$DATA/train-images-idx3-ubyte.gz" ] || { echo "skip: no $DATA"; exit 77; }
help=$("$TS" train --help 2>&1)
for flag in --strategy --devices --micro-batches --schedule; do
  grep -qF -- "$flag" <<<"$help" || { echo "skip: tessera train has no $flag flag yet"; exit 77; }
done
. "$(dirname "$0")/testlib.sh"
test_tmpdir

# expect_fail NEEDLE CMD...: a non-zero exit and output mentioning NEEDLE
expect_fail() {
  local needle=$1; shift
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" -eq 0 ]; then bad "'$*' succeeded: $out"; return; fi
  if ! grep -qF -- "$needle" <<<"$out"; then bad "'$*' output lacks '$needle': $out"; return; fi
  ok "$* -> $rc"
}

common=(--threads 2 --batch-size 32 --seed 3 --quiet --epochs 1)
run() { # run NAME ARGS...: trains, expects exit 0 and metrics with 3 steps
  local name=$1; shift
  if "$TS" train "${common[@]}" "$@" --metrics-json "$T/$name.json" > "$T/$name.log" 2>&1; then
    ok "$name: train $*"
  else
    bad "$name: train $* exited non-zero: $(cat "$T/$name.log")"; return
  fi
  grep -q '"steps": 3' "$T/$name.json" && ok "$name: 3 steps" || bad "$name: metrics $(cat "$T/$name.json")"
  grep -q '"final_loss": [0-9]' "$T/$name.json" && ok "$name: finite loss" || bad "$name: loss in $(cat "$T/$name.json")"
}

run 1f1b --strategy pipeline --devices cpu:0,cpu:1 --micro-batches 4 --schedule 1f1b --max-steps 3
run gpipe --strategy pipeline --devices cpu:0,cpu:1 --micro-batches 3 --schedule gpipe --max-steps 3
run mlp --model mlp --strategy pipeline --devices cpu:0,cpu:1 --micro-batches 5 --schedule 1f1b --max-steps 3

# without BatchNorm the pipeline trains exactly like one device: same loss and accuracy after 20 steps
"$TS" train "${common[@]}" --model mlp --max-steps 20 --metrics-json "$T/one.json" > "$T/one.log" 2>&1 ||
  bad "mlp on one device: $(cat "$T/one.log")"
"$TS" train "${common[@]}" --model mlp --max-steps 20 --strategy pipeline --devices cpu:0,cpu:1 --micro-batches 5 \
  --schedule gpipe --metrics-json "$T/pp.json" > "$T/pp.log" 2>&1 || bad "mlp pipeline: $(cat "$T/pp.log")"
for key in final_loss test_accuracy; do
  a=$(sed -n "s/.*\"$key\": \([-0-9.e]*\).*/\1/p" "$T/one.json" 2>/dev/null)
  b=$(sed -n "s/.*\"$key\": \([-0-9.e]*\).*/\1/p" "$T/pp.json" 2>/dev/null)
  if [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; exit !(d < 1e-4 && d > -1e-4) }'; then
    ok "mlp $key: pipeline $b, one device $a"
  else
    bad "mlp $key: pipeline '$b', one device '$a'"
  fi
done

expect_fail "zigzag" "$TS" train "${common[@]}" --strategy pipeline --devices cpu:0,cpu:1 --schedule zigzag --max-steps 1
# the MLP has 4 layers: 5 stages cannot each get one
TS_CPU_DEVICES=5 expect_fail "only 4 layers" "$TS" train "${common[@]}" --model mlp --strategy pipeline \
  --devices cpu:0,cpu:1,cpu:2,cpu:3,cpu:4 --max-steps 1

cli_summary
