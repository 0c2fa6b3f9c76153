#!/usr/bin/python3
"""PyTorch side of bench/ops_extra.c: forward + backward of softmax, GELU, SiLU,
div, sum/mean over dims, max along a dim, transpose/permute (made contiguous, as
Tessera's results are), bmm, batched matmul and adaptive average pooling, at 1
and 2 threads (median and best ms).

usage: /usr/bin/python3 bench/ops_extra.py [ITERS]
"""
import sys
import time

import torch
import torch.nn.functional as F


def r(*shape, lo=-1.0, hi=1.0):
    return (torch.rand(shape) * (hi - lo) + lo).requires_grad_(True)


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    torch.manual_seed(1)
    ops = [
        ("softmax (32,8,128,128) dim -1", (r(32, 8, 128, 128, lo=-3, hi=3),), lambda a: F.softmax(a, -1)),
        ("gelu erf (8192,1024)", (r(8192, 1024, lo=-3, hi=3),), lambda a: F.gelu(a)),
        ("silu (8192,1024)", (r(8192, 1024, lo=-3, hi=3),), lambda a: F.silu(a)),
        ("div (8192,1024) / (1024)", (r(8192, 1024, lo=-3, hi=3), r(1024, lo=0.5, hi=2)), lambda a, b: a / b),
        ("sum_dims (8192,1024) dim 0", (r(8192, 1024, lo=-3, hi=3),), lambda a: a.sum(0)),
        ("mean_dims (64,256,14,14) dims 2,3", (r(64, 256, 14, 14),), lambda a: a.mean((2, 3))),
        ("max_dim (8192,1000) dim -1", (r(8192, 1000),), lambda a: a.max(-1)[0]),
        ("transpose (32,128,8,64) 1,2", (r(32, 128, 8, 64),), lambda a: a.transpose(1, 2).contiguous()),
        ("permute (64,64,28,28) to NHWC", (r(64, 64, 28, 28),), lambda a: a.permute(0, 2, 3, 1).contiguous()),
        ("bmm (256,128,64)x(256,64,128)", (r(256, 128, 64), r(256, 64, 128)), torch.bmm),
        ("matmul (32,128,512)x(512,512)", (r(32, 128, 512), r(512, 512)), torch.matmul),
        ("adaptive_avgpool2d (64,512,7,7)->3x3", (r(64, 512, 7, 7),), lambda a: F.adaptive_avg_pool2d(a, 3)),
    ]
    print("%-40s %8s %18s" % ("op (forward + backward)", "threads", "median / best ms"))
    for name, inputs, fn in ops:
        gy = torch.rand(fn(*inputs).shape) * 2 - 1
        for threads in (1, 2):
            torch.set_num_threads(threads)
            ts = []
            for i in range(iters + 2):
                for t in inputs:
                    t.grad = None
                t0 = time.perf_counter()
                fn(*inputs).backward(gy)
                if i >= 2:
                    ts.append((time.perf_counter() - t0) * 1e3)
            ts.sort()
            print("%-40s %8d %9.2f / %6.2f" % (name, threads, ts[len(ts) // 2], ts[0]), flush=True)


if __name__ == "__main__":
    main()
