#!/usr/bin/python3
"""PyTorch side of bench/train_vs_pytorch.sh: trains the reference CNN on
in-memory batches (batch 64, SGD with momentum) and prints images/s as JSON.
PRECISION bf16 runs the forward under torch.autocast("cpu", dtype=torch.bfloat16).

usage: python3 bench/train_vs_pytorch.py THREADS [STEPS] [BATCH] [fp32|bf16]
"""
import json
import sys
import time

import torch
import torch.nn as nn


def main():
    threads = int(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    batch = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    bf16 = len(sys.argv) > 4 and sys.argv[4] == "bf16"
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    nbatches = 16
    xs = [torch.randn(batch, 1, 28, 28) for _ in range(nbatches)]
    ys = [torch.randint(0, 10, (batch,)) for _ in range(nbatches)]
    loss_fn = nn.CrossEntropyLoss()

    def step(i):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model(xs[i % nbatches]), ys[i % nbatches])
        loss.backward()
        opt.step()
        return loss

    for i in range(10):  # warm-up
        step(i)
    t0 = time.perf_counter()
    for i in range(steps):
        loss = step(i)
    dt = time.perf_counter() - t0
    print(json.dumps({"framework": "pytorch " + torch.__version__, "threads": threads, "batch_size": batch,
                      "precision": "bf16" if bf16 else "fp32",
                      "steps": steps, "seconds": dt, "images_per_second": steps * batch / dt,
                      "final_loss": float(loss.detach())}))


if __name__ == "__main__":
    main()
