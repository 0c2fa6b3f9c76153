#!/usr/bin/env bash
# The GPU checks, on a machine with a CUDA GPU, from the bundle of scripts/gpu_bundle.sh (.gpu/): lists the
# devices, runs the CUDA tests and the golden op and training-step suites on cuda:0, then
# bench/gpu_vs_pytorch.sh beside the machine's PyTorch. The CUDA libraries (cuBLAS, cuDNN) are taken from
# the machine: its PyTorch's pip packages (nvidia/*/lib) or the CUDA toolkit. Logs go to OUT_DIR.
#
# usage: scripts/gpu_check.sh OUT_DIR [BENCH_STEPS] [BENCH_ROUNDS]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR [BENCH_STEPS] [BENCH_ROUNDS]}
mkdir -p "$OUT"
SP=$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)
LIBS=$PWD/.gpu/lib
for d in "$SP"/nvidia/*/lib /usr/local/cuda/lib64; do [ -d "$d" ] && LIBS=$LIBS:$d; done
export LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# the tests were built with their data directory's absolute path
SRC=$(strings .gpu/bin/test_golden_ops | grep -m1 '/tests/golden/ops.tsg' | sed 's|/tests/golden/ops.tsg||')
if [ -n "$SRC" ] && [ ! -e "$SRC/tests/golden" ]; then mkdir -p "$(dirname "$SRC")"; ln -sfn "$PWD" "$SRC"; fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/nvidia-smi.txt"
rc=0
step() { # name command...
  local name=$1; shift
  local t0=$(date +%s.%N)
  timeout 150 "$@" > "$OUT/$name.log" 2>&1; local r=$?
  printf '%-24s rc=%-3d %6.1fs  %s\n' "$name" "$r" "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{print b-a}')" \
    "$(tail -1 "$OUT/$name.log")"
  [ $r -eq 0 ] || rc=1
}
step devices .gpu/bin/tessera devices
step test_cuda_host .gpu/bin/test_cuda_host
step test_nccl_host .gpu/bin/test_nccl_host
step test_cuda .gpu/bin/test_cuda
TS_TEST_DEVICE=cuda:0 step golden_ops_cuda .gpu/bin/test_golden_ops
# DLPack with CUDA tensors beside the machine's PyTorch (checked on the CPU only before)
python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null &&
  step dlpack_cuda python3 tests/dlpack_cuda.py .gpu/lib/libtessera.so.0
TS_TEST_DEVICE=cuda:0 step golden_step_cuda .gpu/bin/test_golden_step
TS_TEST_DEVICE=cuda:0 step precision_cuda .gpu/bin/test_precision # autocast's bf16 kernels vs the float32 ones
TS_TEST_DEVICE=cuda:0 step optim_cuda .gpu/bin/test_optim # SGD and AdamW steps vs torch's formulas in double
TS_TEST_DEVICE=cuda:0 step accum_cuda .gpu/bin/test_accum # the trainer: accumulation, clipping, loss scaling, DDP ranks sharing the GPU
TS_TEST_DEVICE=cuda:0 step trainer_cuda .gpu/bin/test_train # the trainer: resume bit for bit, forged checkpoints, DDP
TS_TEST_DEVICE=cuda:0 step ddp_equiv_cuda .gpu/bin/test_ddp # DDP ranks (threads) on the GPU equal one process
TS_TEST_DEVICE=cuda:0 step attention_cuda .gpu/bin/test_attention test_device_kernels # the CUDA kernels against the CPU's, four shapes
TS_TEST_DEVICE=cuda:0 step gpt_cuda .gpu/bin/test_gpt test_device # GPT-2 vs transformers: logits, gradients, cached greedy generation
TS_TEST_DEVICE=cuda:0 TS_CUDNN_ALGO=find step golden_ops_cuda_find .gpu/bin/test_golden_ops
TS_TEST_DEVICE=cuda:0 TS_CUDNN_ALGO=find step golden_step_cuda_find .gpu/bin/test_golden_step
if [ -d .gpu/fashion-mnist ]; then # end to end: train on the GPU, evaluate the checkpoint on the CPU
  step train_cuda .gpu/bin/tessera train --device cuda:0 --model cnn --epochs 2 --data .gpu/fashion-mnist --quiet \
    --checkpoint "$OUT/cuda.ckpt" --metrics-json "$OUT/train_cuda.json"
  step eval_cpu .gpu/bin/tessera eval --checkpoint "$OUT/cuda.ckpt" --data .gpu/fashion-mnist --confusion 0
  rm -f "$OUT/cuda.ckpt"
  # two DDP ranks sharing the GPU: buckets through host memory (the builtin backend, the default for a shared
  # GPU), then on the device through NCCL (each rank a "host" of its own: scripts/nccl_rank.sh): the same
  # checkpoint; NCCL without that refuses two ranks on one GPU, and the error says what to do
  DDP="--device cuda:0 --model cnn --epochs 1 --batch-size 32 --data .gpu/fashion-mnist --quiet"
  step ddp_cuda .gpu/bin/tessera train --nproc 2 $DDP --checkpoint "$OUT/ddp_builtin.ckpt"
  step ddp_nccl .gpu/bin/tessera run -n 2 scripts/nccl_rank.sh .gpu/bin/tessera train --backend nccl $DDP \
    --checkpoint "$OUT/ddp_nccl.ckpt"
  step ddp_nccl_same .gpu/bin/tessera ckpt diff "$OUT/ddp_builtin.ckpt" "$OUT/ddp_nccl.ckpt" --tol 0
  step ddp_nccl_bf16 .gpu/bin/tessera run -n 2 scripts/nccl_rank.sh .gpu/bin/tessera train --backend nccl $DDP \
    --ddp-comm bf16 --max-steps 300 --checkpoint "$OUT/ddp_nccl16.ckpt"
  step ddp_builtin_bf16 .gpu/bin/tessera train --nproc 2 $DDP --ddp-comm bf16 --max-steps 300 \
    --checkpoint "$OUT/ddp_builtin16.ckpt"
  step ddp_bf16_same .gpu/bin/tessera ckpt diff "$OUT/ddp_builtin16.ckpt" "$OUT/ddp_nccl16.ckpt" --tol 1e-6
  NCCL_DEBUG=WARN timeout 60 .gpu/bin/tessera train --nproc 2 --backend nccl $DDP --max-steps 5 > "$OUT/nccl_dup.log" 2>&1
  printf '%-24s %s\n' nccl_dup_gpu "$(grep -m1 -o 'one GPU per rank[^)]*' "$OUT/nccl_dup.log" || tail -2 "$OUT/nccl_dup.log")"
  rm -f "$OUT"/*.ckpt
  # one process, a GPU and a CPU: every --strategy over cpu:0,cuda:0 against the same strategy over two CPU
  # devices (the same splits of batches and layers; the GPU's float32 differs in rounding only). 3 steps,
  # where rounding has not grown yet: after 40 steps (2026-11-26) model (its convs on the CPU) was within
  # 8.6e-4 of its CPU twin, data/pipeline/tile 0.4-0.7 apart — as far as the CPU alone drifts when only the
  # convolution algorithm changes (im2col vs oneDNN: 0.42-0.68 after 40 steps). After 3 steps (H200,
  # 2026-11-28) data and tile were 4.2e-4 and 2.0e-4 apart, in the second conv's momentum buffer; the CPU
  # alone, im2col vs Winograd, differs by 4.2e-4 in the same buffer, the parameters by at most 2.1e-5
  MIX="--model cnn --epochs 1 --max-steps 3 --batch-size 64 --data .gpu/fashion-mnist --quiet"
  for st in data model pipeline tile; do
    step "cpu_$st" .gpu/bin/tessera train $MIX --strategy $st --devices cpu:0,cpu:1 --checkpoint "$OUT/cpu_$st.ckpt"
    step "mixed_$st" .gpu/bin/tessera train $MIX --strategy $st --devices cpu:0,cuda:0 --checkpoint "$OUT/mix_$st.ckpt"
    step "mixed_${st}_same" .gpu/bin/tessera ckpt diff "$OUT/cpu_$st.ckpt" "$OUT/mix_$st.ckpt" --tol 1e-3
    grep "over tolerance)" "$OUT/mixed_${st}_same.log"
  done
  rm -f "$OUT"/*.ckpt
  step fp16_cuda .gpu/bin/tessera train --device cuda:0 --precision fp16 --model cnn --epochs 1 \
    --data .gpu/fashion-mnist --quiet
  # bf16 autocast on the GPU (bfloat16 activations through cuDNN/cuBLAS and our bfloat16 kernels; first
  # compiled 2026-11-26 without a GPU), then the products-only bf16 of before (TS_AUTOCAST=fp32)
  step bf16_autocast_cuda .gpu/bin/tessera train --device cuda:0 --precision bf16 --model cnn --epochs 1 \
    --data .gpu/fashion-mnist --quiet --metrics-json "$OUT/bf16_autocast.json"
  TS_AUTOCAST=fp32 step bf16_products_cuda .gpu/bin/tessera train --device cuda:0 --precision bf16 --model cnn \
    --epochs 1 --data .gpu/fashion-mnist --quiet --metrics-json "$OUT/bf16_products.json"
fi
if [ -d .gpu/photos ]; then # mixed decoding (nvJPEG on the GPU, first written 2026-11-26 without one) beside the
  # worker threads' decoding, batches on cuda:0 both ways (images/s, 8 workers, 224x224), then ResNet-18 trained on it
  step loader_cpu .gpu/bin/tessera bench loader .gpu/photos --data-threads 8 --seconds 3 --no-raw --device cuda:0
  step loader_mixed .gpu/bin/tessera bench loader .gpu/photos --data-threads 8 --seconds 3 --no-raw --device cuda:0 \
    --decode mixed
  step train_mixed .gpu/bin/tessera train --device cuda:0 --decode mixed --model resnet18 --image-size 64 \
    --data .gpu/photos --max-steps 30 --batch-size 32 --quiet
  if python3 -c 'import torchvision.io, torchvision.transforms.v2' 2>/dev/null; then # the reference: torchvision's nvJPEG
    step loader_torchvision timeout 60 python3 bench/loader_vs_torchvision.py gpu-decode .gpu/photos --threads 8 \
      --seconds 3
  fi
  grep -h "img/s\|decoded by\|images_per_second" "$OUT"/loader_*.log
fi
# PyTorch's cudnn.benchmark set (FFT and Winograd included): how far those algorithms drift from the
# golden tolerance (informational: not counted in the status)
TS_TEST_DEVICE=cuda:0 TS_CUDNN_ALGO=benchmark timeout 150 .gpu/bin/test_golden_ops > "$OUT/golden_ops_cuda_benchmark.log" 2>&1
printf '%-24s rc=%-3d %s\n' golden_ops_benchmark $? "$(tail -1 "$OUT/golden_ops_cuda_benchmark.log")"
grep -E "^FAIL|^SKIP|^  " "$OUT"/golden_ops_cuda*.log | head -40
grep -E "matmul|conv|step|autocast|mixed|FAIL|CHECK" "$OUT/test_cuda.log"
if [ "${2:-}" != 0 ]; then
  timeout 300 bench/gpu_vs_pytorch.sh .gpu/bin "${2:-60}" "${3:-1}" 2>&1 | tee "$OUT/bench.log"
fi
exit $rc
