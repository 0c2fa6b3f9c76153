#!/usr/bin/python3
"""PyTorch side of bench/spatial_ops.c: forward + backward of the reference
CNN's two conv blocks (conv 3x3 pad 1, batchnorm2d train, relu, maxpool 2) at
batch 64, each alone and chained, at 1 and 2 threads (median and best ms).

usage: /usr/bin/python3 bench/spatial_ops.py [ITERS]
"""
import sys
import time

import torch
import torch.nn as nn


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2))


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    torch.manual_seed(1)
    b1, b2 = block(1, 32), block(32, 64)
    x1 = torch.randn(64, 1, 28, 28)
    x2 = torch.randn(64, 32, 14, 14, requires_grad=True)
    s1, s2 = torch.randn(64, 32, 14, 14), torch.randn(64, 64, 7, 7)
    runs = {
        "block1 conv(1->32)+bn+relu+pool": lambda: b1(x1).backward(s1),
        "block2 conv(32->64)+bn+relu+pool": lambda: b2(x2).backward(s2),
        "both blocks": lambda: b2(b1(x1)).backward(s2),
    }
    print("%-36s %8s %10s %10s" % ("fwd+bwd, batch 64", "threads", "median_ms", "best_ms"))
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for name, fn in runs.items():
            ts = []
            for i in range(iters + 3):
                for m in (b1, b2):
                    m.zero_grad(set_to_none=True)
                x2.grad = None
                t0 = time.perf_counter()
                fn()
                if i >= 3:
                    ts.append((time.perf_counter() - t0) * 1e3)
            ts.sort()
            print("%-36s %8d %10.3f %10.3f" % (name, threads, ts[len(ts) // 2], ts[0]))


if __name__ == "__main__":
    main()
