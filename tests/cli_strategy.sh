#!/usr/bin/env bash
# `tessera train --strategy data|model --devices LIST`: one process on several
# virtual CPU devices. Short runs train and checkpoint with the plain model's
# keys (no "module." prefix), so a plain checkpoint resumes under a strategy
# and the other way round; the MLP (no BatchNorm) under data parallelism and
# the CNN under model parallelism end where a plain run ends; bad strategies,
# devices and combinations are refused with exit status 2 and a message
# naming them.
set -u
TS=${1:?usage: cli_strategy.sh path/to/tessera}
. "$(dirname "$0")/testlib.sh"
need_fashion_mnist
test_tmpdir
unset TS_CPU_DEVICES

# expect_exit CODE NEEDLE CMD...: exit status CODE and stderr+stdout mentioning NEEDLE
# run NAME CMD...: exit 0 and the log in $T/NAME.log
run() {
  local name=$1; shift
  if "$@" > "$T/$name.log" 2>&1; then ok "$name"; else bad "$name: $(cat "$T/$name.log")"; fi
}

# errors
expect_exit 0 "--strategy" "$TS" train --help
expect_exit 2 "unknown --strategy 'warp': expected none, ddp, data, model" "$TS" train --strategy warp
expect_exit 2 "unknown device 'cpu:99'" "$TS" train --strategy data --devices cpu:0,cpu:99
expect_exit 2 "unknown device 'gpu:0'" "$TS" train --strategy data --devices gpu:0
if "$TS" devices --json | grep -q '"cuda": \[\]'; then
  expect_exit 2 "unknown device 'cuda:0': " "$TS" train --strategy model --devices cpu:0,cuda:0
  expect_exit 2 "unknown device 'cuda:0': " "$TS" train --device cuda:0
fi
expect_exit 2 "device runs the model on one device per process; strategy data takes devices" "$TS" train --strategy data --device cpu
expect_exit 2 "cpu:1 appears twice" "$TS" train --strategy data --devices cpu:1,cpu:1
expect_exit 2 "empty" "$TS" train --strategy data --devices ,
expect_exit 2 "cannot be combined with nproc 2" "$TS" train --strategy data --nproc 2
expect_exit 2 "devices needs strategy" "$TS" train --devices cpu:0,cpu:1
expect_exit 2 "unknown --schedule 'zigzag'" "$TS" train --strategy data --schedule zigzag

# data parallelism: the CNN trains; the checkpoint has the plain model's keys
common=(--threads 2 --batch-size 32 --seed 7 --quiet --epochs 1)
run data_cnn "$TS" train "${common[@]}" --model cnn --strategy data --devices cpu:0,cpu:1 --max-steps 4 \
  --checkpoint "$T/dc.ckpt" --metrics-json "$T/dc.json"
grep -q -- "--strategy data over cpu:0, cpu:1" "$T/data_cnn.log" && ok "data: announced" || bad "data banner: $(cat "$T/data_cnn.log")"
grep -q '"steps": 4' "$T/dc.json" && ok "data: 4 steps" || bad "data metrics: $(cat "$T/dc.json")"
"$TS" ckpt show "$T/dc.ckpt" | grep -q " model\.0\.weight " && ok "data: checkpoint keys model.0.weight" \
  || bad "data checkpoint keys: $("$TS" ckpt show "$T/dc.ckpt" | head -20)"
"$TS" ckpt show "$T/dc.ckpt" | grep -q "module\." && bad "data: checkpoint has module. keys" || ok "data: no module. prefix"

# the MLP (no BatchNorm) under data parallelism over 3 devices (the count grows to cover cpu:2) ends
# where a plain run ends, also when it resumes a plain checkpoint halfway
run plain_mlp "$TS" train "${common[@]}" --model mlp --max-steps 6 --checkpoint "$T/p6.ckpt" --checkpoint-dir "$T/p6dir" \
  --checkpoint-every 3
run data_mlp "$TS" train "${common[@]}" --model mlp --strategy data --devices cpu:0,cpu:1,cpu:2 --max-steps 6 \
  --checkpoint "$T/d6.ckpt"
expect_exit 0 "max abs difference" "$TS" ckpt diff "$T/p6.ckpt" "$T/d6.ckpt" --tol 1e-5
cp "$T/p6dir/step-000000000003.ckpt" "$T/p3.ckpt" # the 6-step run at step 3 (the schedule spans the 6)
run resume_data "$TS" train "${common[@]}" --model mlp --strategy data --devices cpu:1,cpu:0 --max-steps 6 \
  --resume "$T/p3.ckpt" --checkpoint "$T/r6.ckpt"
grep -q "resumed from" "$T/resume_data.log" && ok "data: resumed a plain checkpoint" || bad "resume: $(cat "$T/resume_data.log")"
expect_exit 0 "max abs difference" "$TS" ckpt diff "$T/p6.ckpt" "$T/r6.ckpt" --tol 1e-5

# model parallelism: the CNN over two devices computes what one device computes
run plain_cnn "$TS" train "${common[@]}" --model cnn --max-steps 3 --checkpoint "$T/pc.ckpt"
run model_cnn "$TS" train "${common[@]}" --model cnn --strategy model --devices cpu:0,cpu:1 --max-steps 3 \
  --checkpoint "$T/mc.ckpt"
grep -q -- "--strategy model over cpu:0, cpu:1" "$T/model_cnn.log" && ok "model: announced" || bad "model banner: $(cat "$T/model_cnn.log")"
expect_exit 0 "max abs difference" "$TS" ckpt diff "$T/pc.ckpt" "$T/mc.ckpt" --tol 1e-5
# and a model-parallel checkpoint resumes in a plain run
run resume_plain "$TS" train "${common[@]}" --model cnn --max-steps 4 --resume "$T/mc.ckpt" --checkpoint "$T/rp.ckpt"
grep -q "resumed from" "$T/resume_plain.log" && ok "plain run resumed a model-parallel checkpoint" || bad "resume: $(cat "$T/resume_plain.log")"
# default devices: every virtual CPU device (TS_CPU_DEVICES=3)
TS_CPU_DEVICES=3 run model_default "$TS" train "${common[@]}" --model mlp --strategy model --max-steps 2
grep -q -- "--strategy model over cpu:0, cpu:1, cpu:2" "$T/model_default.log" && ok "model: default devices" \
  || bad "default devices: $(cat "$T/model_default.log")"

# pipeline parallelism (more in tests/cli_pipeline.sh): the CNN trains in 1F1B over two stages; the MLP
# (no BatchNorm) in GPipe with micro-batches of 11, 11, 10 ends where the plain run ends
run pipeline_cnn "$TS" train "${common[@]}" --model cnn --strategy pipeline --devices cpu:0,cpu:1 --micro-batches 4 \
  --schedule 1f1b --max-steps 3
grep -q -- "--strategy pipeline over cpu:0, cpu:1" "$T/pipeline_cnn.log" && ok "pipeline: announced" \
  || bad "pipeline banner: $(cat "$T/pipeline_cnn.log")"
run pipeline_mlp "$TS" train "${common[@]}" --model mlp --strategy pipeline --devices cpu:0,cpu:1 --micro-batches 3 \
  --schedule gpipe --max-steps 6 --checkpoint "$T/pp6.ckpt"
expect_exit 0 "max abs difference" "$TS" ckpt diff "$T/p6.ckpt" "$T/pp6.ckpt" --tol 1e-5

# --device: the model on one device per process (the path CUDA devices take), here a virtual CPU device: one
# process, and DDP ranks (host-staged all-reduce) each on cpu:1, end where the CPU runs end
run device_mlp "$TS" train "${common[@]}" --model mlp --device cpu:1 --max-steps 6 --checkpoint "$T/dev6.ckpt"
grep -q ", on cpu:1" "$T/device_mlp.log" && ok "--device cpu:1 announced" || bad "--device banner: $(cat "$T/device_mlp.log")"
expect_exit 0 "max abs difference: 0 " "$TS" ckpt diff "$T/p6.ckpt" "$T/dev6.ckpt" --tol 0
run ddp_plain "$TS" train "${common[@]}" --model cnn --nproc 2 --batch-size 16 --max-steps 4 --checkpoint "$T/dp.ckpt"
run ddp_device "$TS" train "${common[@]}" --model cnn --nproc 2 --batch-size 16 --device cpu:1 --max-steps 4 \
  --checkpoint "$T/dd.ckpt"
grep -q ", on cpu:1" "$T/ddp_device.log" && ok "DDP --device cpu:1 announced" || bad "DDP --device: $(cat "$T/ddp_device.log")"
expect_exit 0 "max abs difference: 0 " "$TS" ckpt diff "$T/dp.ckpt" "$T/dd.ckpt" --tol 0
expect_exit 2 "device: unknown device 'cpu:99'" "$TS" train --device cpu:99

# tessera devices: the CPU, the virtual devices and the CUDA devices or the reason there are none; --json parses
expect_exit 0 "cpu:K" "$TS" devices
"$TS" devices --json > "$T/devices.json" 2>&1 || bad "devices --json: $(cat "$T/devices.json")"
if ! command -v python3 > /dev/null; then echo "skip: no python3 to parse devices --json"
elif python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
assert d["virtual_cpu_devices"] >= 1 and "host CPU" in d["cpu"]
assert (len(d["cuda"]) > 0) != (len(d["cuda_missing"]) > 0), d
for g in d["cuda"]: assert g["name"].startswith("cuda:") and "compute capability" in g["description"]' "$T/devices.json"
then ok "devices --json: $(head -c 200 "$T/devices.json")"; else bad "devices --json: $(cat "$T/devices.json")"; fi

# every strategy trains under --precision bf16 (autocast: bfloat16 activations cross devices and tiles)
for s in data model pipeline tile; do
  run "bf16_$s" "$TS" train "${common[@]}" --model cnn --strategy "$s" --devices cpu:0,cpu:1 --max-steps 3 \
    --precision bf16
  grep -q "autocast: bfloat16 activations" "$T/bf16_$s.log" && grep -q "test accuracy" "$T/bf16_$s.log" &&
    ok "bf16 $s: autocast, evaluated" || bad "bf16 $s: $(tail -3 "$T/bf16_$s.log")"
done

cli_summary
