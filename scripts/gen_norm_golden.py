#!/usr/bin/python3
"""
scripts/gen_norm_golden.py — PyTorch float32's own error against float64 for
layer_norm, group_norm and batch_norm at the edges (long rows, |mean| >> std),
the bar tests/test_norm_numerics.c holds Tessera's kernels to.

Regenerate (Debian's python3-torch, or any torch with numpy; the test never
needs torch):

    /usr/bin/python3 scripts/gen_norm_golden.py

Every input is drawn from the portable generator below, which the test repeats
bit for bit (gen() here, norm_gen() in the test), so both measure the same
float32 inputs. PyTorch runs each case in float32 and in float64 on those
inputs, one thread, and records its float32 error; the float64 result itself
is not stored (the test computes its own in C doubles). "torch_version" names
the torch that wrote the file.

Output: tests/golden/norm_numerics.tsg, in the TSGOLD1 format of
scripts/gen_golden.py (read by tests/golden_io.h). Records:

  "torch_version"      i32: the version's characters
  "ln<k>/case"         i64 (4): R, D, mean * 1e6, std * 1e6 (the test checks its own list against it)
  "ln<k>/torch_err"    f32 (4): layer_norm over rows of D: max |y - y64|, max |gx - gx64| / max |gx64|,
                       max |gw - gw64| / max |gw64|, max |gb - gb64| / max |gb64|
  "gn<k>/case"         i64 (7): N, C, H, W, groups, mean * 1e6, std * 1e6
  "gn<k>/torch_err"    f32 (4): group_norm, the same four figures
  "bn<k>/case"         i64 (4 + 2C): N, C, H, W, then each channel's mean * 1e6, std * 1e6
  "bn<k>/torch_err"    f32 (C, 6): batch_norm in training mode, per channel: max |y - y64|,
                       max |gx - gx64| / max |gx64|, |gw - gw64| / sum |gy|, |gb - gb64| / sum |gy|,
                       |running_mean - rm64| / std64, |running_var - rv64| / rv64
                       (std64: the channel's biased standard deviation in float64)

Inputs, with u(seed, i) = (k - 2^23) * 2^-23 in [-1, 1), k the top 24 bits of
splitmix64((seed << 32) + i): uniform values of centre c and half-width h are
float32(c + h * u) (two double roundings, no fused multiply-add); a "mean m,
std s" input has c = m, h = s * sqrt(3). Case k's tensors use seeds
base + 16 k + j: j = 0 x, 1 weight (c 1, h 0.5), 2 bias (c 0, h 1), 3 the
upstream gradient gy (c 0, h 1); base 1000 (ln), 2000 (gn), 3000 (bn).
Every loss is sum(y * gy); eps 1e-5; batch_norm: running stats 0 and 1,
momentum 0.1.
"""
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_golden import OUT, splitmix64, write  # noqa: E402

SQRT3 = math.sqrt(3.0)

# the test's lists (tests/test_norm_numerics.c): keep them equal
LN_CASES = [  # R, D, mean, std
    (4, 1024, 100.0, 1.0),
    (2, 16384, 100.0, 1.0),
    (2, 65536, 100.0, 1.0),
    (2, 131072, 100.0, 1.0),
    (1, 14256, 3.0, 0.1),
    (1, 131072, 3.0, 0.1),
    (2, 131072, 1000.0, 0.1),
    (2, 131072, 0.0, 1.0),
]
GN_CASES = [  # N, C, H, W, groups, mean, std
    (2, 4, 128, 128, 2, 100.0, 1.0),
    (1, 2, 256, 256, 1, 1000.0, 0.1),
]
BN_CASES = [  # N, C, H, W, [(mean, std) per channel]
    (8, 4, 16, 16, [(0.0, 1.0), (100.0, 0.01), (10000.0, 1.0), (1000.0, 0.01)]),
    (2, 2, 224, 224, [(10000.0, 1.0), (100.0, 1.0)]),
]


def gen(seed, n, centre, half):
    """float32(centre + half * u(seed, i)) for i < n; centre, half: scalars or arrays of n."""
    i = np.arange(n, dtype=np.uint64)
    k = (splitmix64((np.uint64(seed) << np.uint64(32)) + i) >> np.uint64(40)).astype(np.int64)
    u = (k - (1 << 23)).astype(np.float64) * 2.0 ** -23
    t = np.asarray(half, dtype=np.float64) * u
    return (np.asarray(centre, dtype=np.float64) + t).astype(np.float32)


def rel(a, b):
    """max |a - b| / max |b|"""
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def run_row_norm(fn, x, w, b, gy, dtype):
    xt = torch.tensor(x, dtype=dtype, requires_grad=True)
    wt = torch.tensor(w, dtype=dtype, requires_grad=True)
    bt = torch.tensor(b, dtype=dtype, requires_grad=True)
    y = fn(xt, wt, bt)
    (y * torch.tensor(gy, dtype=dtype)).sum().backward()
    return [t.detach().double().numpy() for t in (y, xt.grad, wt.grad, bt.grad)]


def row_norm_errors(fn, x, w, b, gy):
    f = run_row_norm(fn, x, w, b, gy, torch.float32)
    d = run_row_norm(fn, x, w, b, gy, torch.float64)
    return [float(np.max(np.abs(f[0] - d[0]))), rel(f[1], d[1]), rel(f[2], d[2]), rel(f[3], d[3])]


def ln_case(k, R, D, mean, std):
    s = 1000 + 16 * k
    x = gen(s, R * D, mean, std * SQRT3).reshape(R, D)
    w, b = gen(s + 1, D, 1.0, 0.5), gen(s + 2, D, 0.0, 1.0)
    gy = gen(s + 3, R * D, 0.0, 1.0).reshape(R, D)
    err = row_norm_errors(lambda xt, wt, bt: F.layer_norm(xt, (D,), wt, bt, 1e-5), x, w, b, gy)
    return [("ln%d/case" % k, np.array([R, D, round(mean * 1e6), round(std * 1e6)], dtype=np.int64)),
            ("ln%d/torch_err" % k, np.array(err, dtype=np.float32))]


def gn_case(k, N, C, H, W, G, mean, std):
    s = 2000 + 16 * k
    n = N * C * H * W
    x = gen(s, n, mean, std * SQRT3).reshape(N, C, H, W)
    w, b = gen(s + 1, C, 1.0, 0.5), gen(s + 2, C, 0.0, 1.0)
    gy = gen(s + 3, n, 0.0, 1.0).reshape(N, C, H, W)
    err = row_norm_errors(lambda xt, wt, bt: F.group_norm(xt, G, wt, bt, 1e-5), x, w, b, gy)
    return [("gn%d/case" % k, np.array([N, C, H, W, G, round(mean * 1e6), round(std * 1e6)], dtype=np.int64)),
            ("gn%d/torch_err" % k, np.array(err, dtype=np.float32))]


def run_bn(x, w, b, gy, dtype):
    C = x.shape[1]
    xt = torch.tensor(x, dtype=dtype, requires_grad=True)
    wt = torch.tensor(w, dtype=dtype, requires_grad=True)
    bt = torch.tensor(b, dtype=dtype, requires_grad=True)
    rm, rv = torch.zeros(C, dtype=dtype), torch.ones(C, dtype=dtype)
    y = F.batch_norm(xt, rm, rv, wt, bt, training=True, momentum=0.1, eps=1e-5)
    (y * torch.tensor(gy, dtype=dtype)).sum().backward()
    return [t.detach().double().numpy() for t in (y, xt.grad, wt.grad, bt.grad, rm, rv)]


def bn_case(k, N, C, H, W, chans):
    s = 3000 + 16 * k
    n, HW = N * C * H * W, H * W
    ch = (np.arange(n) // HW) % C
    means = np.array([m for m, _ in chans])[ch]
    halves = np.array([sd * SQRT3 for _, sd in chans])[ch]
    x = gen(s, n, means, halves).reshape(N, C, H, W)
    w, b = gen(s + 1, C, 1.0, 0.5), gen(s + 2, C, 0.0, 1.0)
    gy = gen(s + 3, n, 0.0, 1.0).reshape(N, C, H, W)
    f, d = run_bn(x, w, b, gy, torch.float32), run_bn(x, w, b, gy, torch.float64)
    err = np.zeros((C, 6), dtype=np.float32)
    for c in range(C):
        y32, y64 = f[0][:, c], d[0][:, c]
        gx32, gx64 = f[1][:, c], d[1][:, c]
        sg = float(np.sum(np.abs(gy[:, c].astype(np.float64))))
        std64 = float(np.std(x[:, c].astype(np.float64)))
        err[c] = [np.max(np.abs(y32 - y64)), rel(gx32, gx64), abs(f[2][c] - d[2][c]) / sg,
                  abs(f[3][c] - d[3][c]) / sg, abs(f[4][c] - d[4][c]) / std64, abs(f[5][c] - d[5][c]) / d[5][c]]
    case = [N, C, H, W] + [v for m, sd in chans for v in (round(m * 1e6), round(sd * 1e6))]
    return [("bn%d/case" % k, np.array(case, dtype=np.int64)), ("bn%d/torch_err" % k, err)]


def main():
    torch.set_num_threads(1)
    version = np.array([ord(c) for c in torch.__version__], dtype=np.int32)
    recs = [("torch_version", version)]
    for k, c in enumerate(LN_CASES):
        recs += ln_case(k, *c)
    for k, c in enumerate(GN_CASES):
        recs += gn_case(k, *c)
    for k, c in enumerate(BN_CASES):
        recs += bn_case(k, *c)
    for name, v in recs:
        if name.endswith("torch_err"):
            print("%-16s %s" % (name, np.array2string(v, precision=3)))
    write(os.path.join(OUT, "norm_numerics.tsg"), recs)


if __name__ == "__main__":
    main()
