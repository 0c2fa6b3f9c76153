#!/usr/bin/env bash
# `tessera train` over the library's ts_run_config (tessera/run.h):
#   --print-config writes the configuration as `field = value` lines that --config reads back (the command
#     line wins over the file; unknown keys and bad values name FILE:LINE);
#   --max-steps is the run's length: the cosine schedule spans it (lr near 0 at its last step);
#   --resume takes the checkpoint's model, classes and seed (no --model needed; a --model or --num-classes
#     that disagrees is refused naming both) and goes on bit for bit;
#   --skip-corrupt leaves out an undecodable JPEG, names it and counts it in the summary.
set -u
TS=${1:?usage: cli_run_config.sh path/to/tessera}
. "$(dirname "$0")/testlib.sh"
need_fashion_mnist
test_tmpdir

# expect_exit CODE NEEDLE CMD...: exit status CODE and stderr+stdout mentioning NEEDLE

# ---- --print-config and --config ----------------------------------------------------------------------
"$TS" train --model mlp --lr 0.2 --lr-schedule step --precision bf16 --skip-corrupt --image-size 28 --print-config \
  > "$T/run.conf" 2>&1 || bad "--print-config: $(cat "$T/run.conf")"
grep -qx "model = mlp" "$T/run.conf" && grep -qx "lr = 0.2" "$T/run.conf" && grep -qx "lr_schedule = step" "$T/run.conf" &&
  grep -qx "precision = bf16" "$T/run.conf" && grep -qx "skip_corrupt = true" "$T/run.conf" &&
  grep -qx "# resume =" "$T/run.conf" && ok "--print-config writes field = value lines" || bad "--print-config: $(cat "$T/run.conf")"
"$TS" train --config "$T/run.conf" --print-config > "$T/again.conf" 2>&1
cmp -s "$T/run.conf" "$T/again.conf" && ok "--config reads back what --print-config wrote" \
  || bad "round trip: $(diff "$T/run.conf" "$T/again.conf")"
"$TS" train --config "$T/run.conf" --lr 0.3 --print-config | grep -qx "lr = 0.3" && ok "the command line wins over --config" \
  || bad "--lr after --config"
printf 'model = mlp\nepochs = 0\n' > "$T/bad1.conf"
expect_exit 2 "--epochs must be in [1, 1e+06], got 0" "$TS" train --config "$T/bad1.conf"
printf '# a comment\n\nmodel = mlp\nlearning_rate = 0.1\n' > "$T/bad2.conf"
expect_exit 2 "$T/bad2.conf:4: unknown key 'learning_rate'" "$TS" train --config "$T/bad2.conf"
printf 'quiet = maybe\n' > "$T/bad3.conf"
expect_exit 2 "$T/bad3.conf:1: quiet takes true or false, got 'maybe'" "$TS" train --config "$T/bad3.conf"
expect_exit 2 "--config: $T/none.conf: cannot open: No such file" "$TS" train --config "$T/none.conf"
printf 'model = resnet9000\n' > "$T/bad4.conf"
expect_exit 2 "unknown model 'resnet9000'" "$TS" train --config "$T/bad4.conf"

# ---- --max-steps is the run's length: cosine ends near 0 -------------------------------------------------
common=(--model mlp --batch-size 32 --seed 2 --quiet --threads 2)
"$TS" train "${common[@]}" --max-steps 30 --checkpoint "$T/m30.ckpt" > "$T/m30.log" 2>&1 || bad "30 steps: $(cat "$T/m30.log")"
# torch's CosineAnnealingLR(T_max=30) at the last step (29): 0.05 (1 + cos(29 pi / 30)) / 2 = 1.3695e-4
lr=$("$TS" ckpt show "$T/m30.ckpt" | awk '$1 == "optim.lr" {print $4}')
awk -v x="${lr:-1}" 'BEGIN{exit !(x > 1.36e-4 && x < 1.38e-4)}' && ok "--max-steps 30: the cosine schedule ends at $lr" \
  || bad "--max-steps 30: lr at the last step is '$lr', not 1.3695e-4"

# ---- --resume takes the checkpoint's model ------------------------------------------------------------
"$TS" train "${common[@]}" --max-steps 6 --checkpoint "$T/s6.ckpt" --checkpoint-dir "$T/sdir" --checkpoint-every 3 \
  > "$T/s6.log" 2>&1 || bad "6 steps: $(cat "$T/s6.log")"
"$TS" train --batch-size 32 --quiet --threads 2 --max-steps 6 --resume "$T/sdir/step-000000000003.ckpt" \
  --checkpoint "$T/r6.ckpt" > "$T/r6.log" 2>&1 || bad "resume without --model: $(cat "$T/r6.log")"
grep -q "^training mlp on" "$T/r6.log" && ok "--resume without --model trains the checkpoint's mlp" || bad "resume: $(cat "$T/r6.log")"
expect_exit 0 "max abs difference: 0 " "$TS" ckpt diff "$T/s6.ckpt" "$T/r6.ckpt" --tol 0
expect_exit 2 "this is a mlp checkpoint; the model is cnn" "$TS" train --model cnn --batch-size 32 --resume "$T/s6.ckpt"
expect_exit 2 "num_classes 12: $T/s6.ckpt was written with 10 classes" "$TS" train --num-classes 12 --batch-size 32 \
  --resume "$T/s6.ckpt"

# ---- --skip-corrupt -----------------------------------------------------------------------------------
"$TS" data export fashion-mnist --format jpeg --split train --limit 100 --out "$T/fmj" > /dev/null 2>&1 || bad "export"
"$TS" data export fashion-mnist --format png --split test --limit 20 --out "$T/fmp" > /dev/null 2>&1 || bad "export test"
mv "$T/fmp/test" "$T/fmj/test"
victim=$(find "$T/fmj/train" -name '*.jpg' | sort | head -1)
head -c 300 "$victim" > "$T/cut" && mv "$T/cut" "$victim"
name="$(basename "$(dirname "$victim")")/$(basename "$victim")"
img=(--data "$T/fmj" --model cnn --batch-size 16 --seed 1 --quiet --threads 2 --epochs 1)
expect_exit 1 "$name" "$TS" train "${img[@]}"
"$TS" train "${img[@]}" --skip-corrupt --metrics-json "$T/sk.json" > "$T/sk.log" 2>&1 || bad "--skip-corrupt: $(cat "$T/sk.log")"
grep -q "skipping a corrupt sample: .*$name" "$T/sk.log" && ok "--skip-corrupt names the file" || bad "no name: $(cat "$T/sk.log")"
grep -q "^--skip-corrupt: 1 training image left out as corrupt" "$T/sk.log" && ok "--skip-corrupt counts it" \
  || bad "no count: $(cat "$T/sk.log")"
grep -q '"skipped_samples": 1' "$T/sk.json" && ok "the metrics record it" || bad "metrics: $(cat "$T/sk.json")"
grep -q "^done: 7 steps" "$T/sk.log" && ok "the epoch trains on the 99 others" || bad "steps: $(cat "$T/sk.log")"

cli_summary
