#!/usr/bin/env bash
# `tessera train` from the command line: flag and path errors (exit 2 with a
# message naming what is wrong), metrics JSON, and resume giving the same
# parameters as an uninterrupted run (checked with `tessera ckpt diff`).
set -u
TS=${1:?usage: cli_train.sh path/to/tessera}
. "$(dirname "$0")/testlib.sh"
need_fashion_mnist
test_tmpdir

# expect_exit CODE NEEDLE CMD...: exit status CODE and stderr+stdout mentioning NEEDLE

expect_exit 0 "--max-steps" "$TS" train --help
expect_exit 0 "usage: tessera COMMAND" "$TS" --help
expect_exit 2 "unknown command 'trian'" "$TS" trian
expect_exit 2 "unknown flag '--epoch'" "$TS" train --epoch 3
expect_exit 2 "--lr expects a number, got 'fast'" "$TS" train --lr fast
expect_exit 2 "--epochs must be in" "$TS" train --epochs 0
expect_exit 2 "--batch-size needs a value" "$TS" train --batch-size
expect_exit 2 "unknown model 'resnet9000'" "$TS" train --model resnet9000
expect_exit 2 "unknown --optimizer 'lion'" "$TS" train --optimizer lion
expect_exit 2 "data /no/such/dir: No such file" "$TS" train --data /no/such/dir
mkdir -p "$T/empty"
expect_exit 2 "train-images-idx3-ubyte" "$TS" train --data "$T/empty"
# a truncated image file is named in the error
mkdir -p "$T/trunc"
cp "$DATA"/*labels* "$DATA"/t10k-images* "$T/trunc/"
head -c 100000 <(gzip -dc "$DATA/train-images-idx3-ubyte.gz") > "$T/trunc/train-images-idx3-ubyte"
expect_exit 2 "truncated" "$TS" train --data "$T/trunc"
expect_exit 2 "resume: $T/nothing.ckpt" "$TS" train --resume "$T/nothing.ckpt"
expect_exit 2 "unknown benchmark" "$TS" bench nothing

# a short run writes metrics and a checkpoint
common=(--model cnn --threads 2 --batch-size 32 --seed 5 --quiet)
if "$TS" train "${common[@]}" --max-steps 20 --checkpoint "$T/a.ckpt" --metrics-json "$T/m.json" > "$T/a.log" 2>&1; then
  ok "train 20 steps"
else
  bad "train 20 steps: $(cat "$T/a.log")"
fi
for key in test_accuracy images_per_second epochs steps final_loss; do
  grep -q "\"$key\"" "$T/m.json" 2>/dev/null && ok "metrics has $key" || bad "metrics lacks $key"
done
grep -q '"steps": 20' "$T/m.json" && ok "metrics steps = 20" || bad "metrics steps: $(cat "$T/m.json")"
grep -q "saved checkpoint to $T/a.ckpt" "$T/a.log" && ok "says where the checkpoint is" || bad "no checkpoint line"

# resume: the 20-step run's checkpoint at step 8, then 12 more from it == 20 straight (--max-steps is the run's
# length: the learning-rate schedule spans it, so the interrupted run is one of 20 steps too)
"$TS" train "${common[@]}" --max-steps 20 --checkpoint-dir "$T/bdir" --checkpoint-every 8 > "$T/b.log" 2>&1 || bad "train 20 steps: $(cat "$T/b.log")"
cp "$T/bdir/step-000000000008.ckpt" "$T/b.ckpt"
"$TS" train "${common[@]}" --max-steps 20 --resume "$T/b.ckpt" --checkpoint "$T/c.ckpt" > "$T/c.log" 2>&1 || bad "resume: $(cat "$T/c.log")"
grep -q "resumed from" "$T/c.log" && ok "resume says so" || bad "resume line missing: $(cat "$T/c.log")"
expect_exit 0 "max abs difference" "$TS" ckpt diff "$T/a.ckpt" "$T/c.ckpt" --tol 0
# and the uninterrupted run differs from the 8-step one
expect_exit 1 "" "$TS" ckpt diff "$T/a.ckpt" "$T/b.ckpt" --tol 0
# resuming with another model or batch size is refused, naming the mismatch
expect_exit 2 "this is a cnn checkpoint; the model is mlp" "$TS" train --model mlp --resume "$T/b.ckpt"
expect_exit 2 "with batch size 32" "$TS" train --model cnn --batch-size 64 --resume "$T/b.ckpt"
# a corrupted checkpoint is refused
cp "$T/b.ckpt" "$T/bad.ckpt"
printf '\xff\xff\xff\xff' | dd of="$T/bad.ckpt" bs=1 seek=5000 conv=notrunc 2>/dev/null
expect_exit 2 "checksum" "$TS" train "${common[@]}" --resume "$T/bad.ckpt"

# two DDP processes through the built-in launcher: rank-prefixed output, rank 0 checkpoints,
# every rank resumes; a 2-process checkpoint is refused by a 1-process run
dd=(--model mlp --batch-size 32 --seed 3 --quiet --nproc 2 --timeout 60)
if "$TS" train "${dd[@]}" --max-steps 6 --checkpoint "$T/d1.ckpt" > "$T/d1.log" 2>&1; then ok "train --nproc 2"; else bad "train --nproc 2: $(cat "$T/d1.log")"; fi
grep -q "\[rank 0\] training mlp.*2 ranks (DDP)" "$T/d1.log" && ok "ranks announced" || bad "no DDP banner: $(cat "$T/d1.log")"
grep -q "\[rank 1\] .*test accuracy" "$T/d1.log" && bad "rank 1 evaluated" || ok "only rank 0 evaluates"
[ -f "$T/d1.ckpt" ] && ok "rank 0 wrote the checkpoint" || bad "no checkpoint from --nproc 2"
if "$TS" train "${dd[@]}" --max-steps 10 --resume "$T/d1.ckpt" --checkpoint "$T/d2.ckpt" > "$T/d2.log" 2>&1; then
  ok "resume --nproc 2"
else
  bad "resume --nproc 2: $(cat "$T/d2.log")"
fi
if "$TS" ckpt show "$T/d2.ckpt" | grep -q "train.step *int64 *10$"; then ok "resumed to step 10"; else bad "step after resume: $("$TS" ckpt show "$T/d2.ckpt" | head -8)"; fi
expect_exit 2 "written by 2 processes at batch size 32 (global 64)" "$TS" train --model mlp --batch-size 32 --resume "$T/d1.ckpt"
# ... but one process at the same global batch goes on where the two stopped, and ends where they end
"$TS" train --model mlp --batch-size 64 --quiet --max-steps 10 --resume "$T/d1.ckpt" --checkpoint "$T/d3.ckpt" > "$T/d3.log" 2>&1 \
  || bad "resume a 2-process checkpoint in one process at batch 64: $(cat "$T/d3.log")"
expect_exit 0 "max abs difference" "$TS" ckpt diff "$T/d2.ckpt" "$T/d3.ckpt" --tol 1e-5

# --checkpoint-dir: a new file per save, the newest --keep kept; a run started again resumes from the newest
# (here the run lost its step-12 file, as a job killed between two saves would)
cd_=(--model mlp --batch-size 32 --seed 4 --quiet --checkpoint-dir "$T/cdir" --checkpoint-every 3 --keep 2 --max-steps 12)
"$TS" train "${cd_[@]}" > "$T/cd1.log" 2>&1 || bad "--checkpoint-dir: $(cat "$T/cd1.log")"
[ "$(ls "$T/cdir" | tr '\n' ' ')" = "step-000000000009.ckpt step-000000000012.ckpt " ] && ok "--keep 2 kept steps 9 and 12" \
  || bad "--checkpoint-dir holds: $(ls "$T/cdir")"
rm "$T/cdir/step-000000000012.ckpt"
"$TS" train "${cd_[@]}" > "$T/cd2.log" 2>&1 || bad "restart from --checkpoint-dir: $(cat "$T/cd2.log")"
grep -q "resumed from $T/cdir/step-000000000009.ckpt" "$T/cd2.log" && ok "a restart resumes from the newest checkpoint" \
  || bad "restart did not resume: $(cat "$T/cd2.log")"
"$TS" train --model mlp --batch-size 32 --seed 4 --quiet --max-steps 12 --checkpoint "$T/cd_straight.ckpt" > /dev/null 2>&1
expect_exit 0 "max abs difference" "$TS" ckpt diff "$T/cd_straight.ckpt" "$T/cdir/step-000000000012.ckpt" --tol 0

# --sync-bn: BatchNorm2d layers become SyncBatchNorm under DDP; the checkpoint keeps BatchNorm2d's keys
sb=(--model cnn --batch-size 16 --seed 3 --quiet --threads 1 --timeout 60 --max-steps 3 --sync-bn)
if "$TS" train "${sb[@]}" --nproc 2 --checkpoint "$T/s.ckpt" > "$T/s.log" 2>&1; then ok "train --nproc 2 --sync-bn"; else bad "train --nproc 2 --sync-bn: $(cat "$T/s.log")"; fi
grep -q "\[rank 0\] --sync-bn: BatchNorm2d layers are SyncBatchNorm over all 2 ranks" "$T/s.log" && ok "--sync-bn announced" || bad "no --sync-bn line: $(cat "$T/s.log")"
"$TS" ckpt show "$T/s.ckpt" 2>/dev/null | grep -q "model.5.running_var" && ok "--sync-bn checkpoint has BatchNorm2d keys" || bad "--sync-bn checkpoint keys: $("$TS" ckpt show "$T/s.ckpt" 2>&1 | head -12)"
expect_exit 0 "--sync-bn" "$TS" train --help
# SyncBatchNorm under autocast: bfloat16 activations in, float32 statistics over the ranks
if "$TS" train "${sb[@]}" --nproc 2 --precision bf16 > "$T/sbf.log" 2>&1; then ok "train --nproc 2 --sync-bn --precision bf16"
else bad "--sync-bn --precision bf16: $(cat "$T/sbf.log")"; fi
# with one process --sync-bn is accepted and changes nothing: the same checkpoint as the 20-step run
"$TS" train "${common[@]}" --max-steps 20 --sync-bn --checkpoint "$T/s1.ckpt" > "$T/s1.log" 2>&1 || bad "train --sync-bn (1 process): $(cat "$T/s1.log")"
expect_exit 0 "max abs difference" "$TS" ckpt diff "$T/a.ckpt" "$T/s1.ckpt" --tol 0


# --accum-steps: 2 ranks x 16 x 2 micro-batches per step train as one process at 64 (DDP all-reduces on the 2nd)
ac=(--model mlp --seed 3 --quiet --max-steps 5 --timeout 60)
if "$TS" train "${ac[@]}" --batch-size 16 --nproc 2 --accum-steps 2 --checkpoint "$T/acc.ckpt" > "$T/acc.log" 2>&1; then ok "train --accum-steps 2 --nproc 2"; else bad "train --accum-steps: $(cat "$T/acc.log")"; fi
grep -q "\[rank 0\] --accum-steps 2: one optimizer step per 2 batches (64 images over all ranks)" "$T/acc.log" && ok "--accum-steps announced" || bad "no --accum-steps line: $(cat "$T/acc.log")"
"$TS" train "${ac[@]}" --batch-size 64 --checkpoint "$T/acc64.ckpt" > /dev/null 2>&1 || bad "train at batch 64"
expect_exit 0 "max abs difference" "$TS" ckpt diff "$T/acc.ckpt" "$T/acc64.ckpt" --tol 1e-5
"$TS" ckpt show "$T/acc.ckpt" | grep -q "train.accum_steps *int64 *2$" && ok "checkpoint records accum_steps" || bad "no train.accum_steps: $("$TS" ckpt show "$T/acc.ckpt" | head -20)"
expect_exit 2 "2 batches per step (accum_steps), this run has 1" "$TS" train --model mlp --batch-size 32 --nproc 1 --resume "$T/acc.ckpt"
expect_exit 2 "--accum-steps must be in" "$TS" train --accum-steps 0
# --warmup-steps: step 4 of a 10-step warmup from lr/3 runs at 0.3 (1/3 + 2/3 x 3/10) = 0.16; --clip-grad-norm runs
"$TS" train --model mlp --batch-size 64 --seed 3 --quiet --max-steps 4 --warmup-steps 10 --lr 0.3 --clip-grad-norm 1 --checkpoint "$T/w.ckpt" > "$T/w.log" 2>&1 || bad "train --warmup-steps: $(cat "$T/w.log")"
"$TS" ckpt show "$T/w.ckpt" | grep -q "optim.lr *float32 *\[1\] *0.16$" && ok "--warmup-steps: lr 0.16 at step 4" || bad "warmup lr: $("$TS" ckpt show "$T/w.ckpt" | grep optim.lr)"
expect_exit 1 "" "$TS" ckpt diff "$T/w.ckpt" "$T/acc64.ckpt" --tol 0

# --ddp-comm bf16: bfloat16 gradient buckets; announced; bad values and the MPI backend are refused by name
if "$TS" train --model mlp --seed 3 --quiet --max-steps 4 --timeout 60 --batch-size 16 --nproc 2 --ddp-comm bf16 --checkpoint "$T/bf.ckpt" > "$T/bf.log" 2>&1; then ok "train --ddp-comm bf16"; else bad "train --ddp-comm bf16: $(cat "$T/bf.log")"; fi
grep -q "\[rank 0\] --ddp-comm bf16: gradient buckets are all-reduced in bfloat16" "$T/bf.log" && ok "--ddp-comm bf16 announced" || bad "no --ddp-comm line: $(cat "$T/bf.log")"
expect_exit 2 "--ddp-comm 'fp8': expected fp32 or bf16" "$TS" train --ddp-comm fp8
expect_exit 2 "ddp_comm bf16 needs backend builtin or nccl" "$TS" train --ddp-comm bf16 --backend mpi

# --precision bf16: announced, recorded in the metrics, trains; bad values refused
if "$TS" train --model cnn --seed 3 --quiet --max-steps 5 --batch-size 32 --precision bf16 --metrics-json "$T/pb.json" --checkpoint "$T/pb.ckpt" > "$T/pb.log" 2>&1; then ok "train --precision bf16"; else bad "train --precision bf16: $(cat "$T/pb.log")"; fi
grep -q -- "--precision bf16: matmuls and convolutions in bfloat16 with float32 accumulation" "$T/pb.log" && ok "--precision bf16 announced" || bad "no --precision line: $(cat "$T/pb.log")"
grep -q '"precision": "bfloat16"' "$T/pb.json" && ok "metrics record the precision" || bad "metrics: $(cat "$T/pb.json")"
"$TS" ckpt show "$T/pb.ckpt" | grep -q "model.0.weight *float32" && ok "bf16 training keeps float32 weights" || bad "weights: $("$TS" ckpt show "$T/pb.ckpt" | grep model.0)"
# autocast: announced with --precision bf16 on the CPU (bfloat16 activations), off under TS_AUTOCAST=fp32
grep -q "autocast: bfloat16 activations between layers" "$T/pb.log" && ok "autocast announced" || bad "no autocast: $(cat "$T/pb.log")"
TS_AUTOCAST=fp32 "$TS" train --model cnn --seed 3 --quiet --max-steps 2 --batch-size 32 --precision bf16 > "$T/pa.log" 2>&1 &&
  ! grep -q "autocast:" "$T/pa.log" && ok "TS_AUTOCAST=fp32: products only" || bad "TS_AUTOCAST=fp32: $(cat "$T/pa.log")"
"$TS" bench train --model cnn --steps 2 --warmup 1 --batch-size 16 --precision bf16 --json | grep -q '"autocast": "bfloat16"' &&
  ok "bench train reports autocast" || bad "bench train: no autocast field"
expect_exit 2 "--precision 'fp8': expected fp32, bf16 or fp16" "$TS" train --precision fp8
expect_exit 2 "precision fp16 (loss scaling) is not available with strategy pipeline" "$TS" train --precision fp16 \
  --strategy pipeline
expect_exit 0 "FMA peak" "$TS" bench gemm --size 128 --reps 1 --threads 1

cli_summary
