#!/usr/bin/env python3
"""PyTorch side of bench/gpu_vs_pytorch.sh, on a CUDA GPU: training images/s of the reference CNN
(batch 64, 28x28) and ResNet-18 (batch 32 or as given, 64x64 / 112x112 / 224x224) on in-memory batches
already on the GPU, SGD + momentum 0.9, weight decay 5e-4, with loss.item() every step (what `tessera
bench train` does: it reads the loss each step). fp32 runs with TF32 off (matmuls and cuDNN), as
Tessera's fp32; bf16 under torch.autocast("cuda", torch.bfloat16). `--peak` measures the GPU's dense
matmul rates (fp32 without TF32, bf16) on 8192^3 products: the physical limit beside the figures.

With `--profile ROWS` after the arguments it prints where STEPS steps' GPU time goes instead (torch.profiler:
milliseconds per step by kernel, the top ROWS), for scripts/gpu_profile.sh.

usage: python3 bench/gpu_vs_pytorch.py cnn|resnet18 IMAGE_SIZE BATCH STEPS fp32|bf16 [--profile ROWS]
       python3 bench/gpu_vs_pytorch.py --peak
"""
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resnet_vs_pytorch import forward_flops, resnet18  # noqa: E402


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


def peak():
    torch.backends.cuda.matmul.allow_tf32 = False
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    n = 8192
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a = torch.randn(n, n, device="cuda", dtype=dt)
        b = torch.randn(n, n, device="cuda", dtype=dt)
        for _ in range(3):
            torch.mm(a, b)
        torch.cuda.synchronize()
        reps = 10 if dt == torch.bfloat16 else 3
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        torch.cuda.synchronize()
        out[name + "_tflops"] = reps * 2 * n ** 3 / (time.perf_counter() - t0) / 1e12
    print(json.dumps(out))


def profile(step, steps, rows):
    from torch.profiler import ProfilerActivity
    with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            step(i)
        torch.cuda.synchronize()

    def self_time(e):  # microseconds; the attribute was renamed from cuda to device
        return getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
    kernels = [e for e in prof.key_averages() if self_time(e) > 0]
    total = sum(self_time(e) for e in kernels) / steps / 1e3
    print(f"{steps} steps, {sum(e.count for e in kernels) / steps:.0f} launches and {total:.2f} ms of kernels per step")
    for e in sorted(kernels, key=self_time, reverse=True)[:rows]:
        ms = self_time(e) / steps / 1e3
        print(f"{ms:9.3f} ms {100 * ms / total:5.1f}% {e.count / steps:6.1f}x  {e.key[:70]}")


def main():
    if sys.argv[1] == "--peak":
        return peak()
    name, size, batch, steps, prec = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = cnn() if name == "cnn" else resnet18()
    classes, chans = (10, 1) if name == "cnn" else (1000, 3)
    flops = forward_flops(model, size) if name != "cnn" else 0
    model = model.cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    nb = 16
    xs = [torch.randn(batch, chans, size, size, device="cuda") for _ in range(nb)]
    ys = [torch.randint(0, classes, (batch,), device="cuda") for _ in range(nb)]
    bf16 = prec == "bf16"

    def step(i):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(xs[i % nb]), ys[i % nb])
        loss.backward()
        opt.step()
        return loss.item()

    for i in range(10):  # warm-up (cudnn.benchmark picks its algorithms here)
        step(i)
    torch.cuda.synchronize()
    if len(sys.argv) > 7 and sys.argv[6] == "--profile":
        return profile(step, steps, int(sys.argv[7]))
    t0 = time.perf_counter()
    for i in range(steps):
        loss = step(i)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(json.dumps({"framework": "pytorch " + torch.__version__, "model": name, "image_size": size,
                      "batch_size": batch, "precision": prec, "steps": steps, "seconds": dt,
                      "images_per_second": steps * batch / dt, "forward_gflops_per_image": flops / 1e9,
                      "final_loss": loss}))


if __name__ == "__main__":
    main()
