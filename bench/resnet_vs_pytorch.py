#!/usr/bin/env python3
"""PyTorch side of bench/resnet_vs_pytorch.sh: ResNet-18 (torchvision's architecture, written out here
so Debian's python3-torch, which has no torchvision, runs it too) trained on in-memory random batches
with SGD + momentum; prints images/s, the forward GFLOPs per image (counted by hooks on every
convolution and linear layer: 2 * MACs) and torch's sgemm rate, as JSON.

usage: python3 bench/resnet_vs_pytorch.py THREADS IMAGE_SIZE [STEPS] [BATCH]
       python3 bench/resnet_vs_pytorch.py --gemm THREADS [SIZE]
"""
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


def resnet18(num_classes=1000):
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for i, c in enumerate((64, 128, 256, 512)):
        layers.append(nn.Sequential(BasicBlock(cin, c, 1 if i == 0 else 2), BasicBlock(c, c, 1)))
        cin = c
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


def forward_flops(model, size):
    total = [0]

    def hook(mod, inp, out):
        if isinstance(mod, nn.Conv2d):
            k = mod.weight[0].numel()  # cin/groups * kh * kw
            total[0] += 2 * k * out.numel()
        elif isinstance(mod, nn.Linear):
            total[0] += 2 * mod.in_features * out.numel()

    hs = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        model.eval()
        model(torch.zeros(1, 3, size, size))
        model.train()
    for h in hs:
        h.remove()
    return total[0]


def gemm(threads, n):
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = 1e30
    for r in range(11):
        t0 = time.perf_counter()
        torch.mm(a, b)
        dt = time.perf_counter() - t0
        if r:
            best = min(best, dt)
    print(json.dumps({"framework": "pytorch " + torch.__version__, "threads": threads, "size": n,
                      "gflops": 2 * n ** 3 / best / 1e9}))


def main():
    if sys.argv[1] == "--gemm":
        return gemm(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 1024)
    threads, size = int(sys.argv[1]), int(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else 32
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = resnet18()
    flops = forward_flops(model, size)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    nb = 4
    xs = [torch.randn(batch, 3, size, size) for _ in range(nb)]
    ys = [torch.randint(0, 1000, (batch,)) for _ in range(nb)]

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xs[i % nb]), ys[i % nb])
        loss.backward()
        opt.step()
        return loss

    for i in range(2):  # warm-up
        step(i)
    t0 = time.perf_counter()
    for i in range(steps):
        loss = step(i)
    dt = time.perf_counter() - t0
    print(json.dumps({"framework": "pytorch " + torch.__version__, "threads": threads, "image_size": size,
                      "batch_size": batch, "steps": steps, "seconds": dt, "images_per_second": steps * batch / dt,
                      "forward_gflops_per_image": flops / 1e9, "final_loss": loss.item()}))


if __name__ == "__main__":
    main()
