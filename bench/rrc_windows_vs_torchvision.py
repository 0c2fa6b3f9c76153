#!/usr/bin/env python3
"""bench/rrc_windows_vs_torchvision.py — the random resized crop windows ImagePipeline draws
(ts_random_resized_crop_roi, each sample's generator seeded as the pipeline seeds it) beside torchvision's
RandomResizedCrop.get_params, and the flip rate beside RandomHorizontalFlip's, over N draws on a W x H image:
mean and spread of the area fraction, of the log aspect ratio, of the window's centre, the share of whole-image
windows (the fallback), and the largest gap between the two histograms of width, height, x and y.

    PYTHONPATH=build/python .pyvenv/bin/python3 bench/rrc_windows_vs_torchvision.py build/libtessera.so --draws 100000

Options: --draws (100000), --size W H (28 28), --scale LO HI (0.08 1), --ratio LO HI (0.75 1.3333), --seed (1).
"""
import argparse
import ctypes as C

import numpy as np
import torch
from torchvision import transforms

M64 = (1 << 64) - 1


class Rng(C.Structure):  # ts_rng (include/tessera/core.h)
    _fields_ = [("state_hi", C.c_uint64), ("state_lo", C.c_uint64), ("inc_hi", C.c_uint64), ("inc_lo", C.c_uint64),
                ("spare_normal", C.c_double), ("has_spare", C.c_int)]


class Roi(C.Structure):  # ts_roi (include/tessera/pipeline.h)
    _fields_ = [("x", C.c_int), ("y", C.c_int), ("w", C.c_int), ("h", C.c_int)]


def splitmix(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def tessera_windows(lib, a):
    lib.ts_random_resized_crop_roi.restype = Roi
    lib.ts_random_resized_crop_roi.argtypes = [C.POINTER(Rng), C.c_int, C.c_int, C.POINTER(C.c_float),
                                               C.POINTER(C.c_float)]
    lib.ts_rng_uniform.restype = C.c_double
    lib.ts_rng_uniform.argtypes = [C.POINTER(Rng)]
    lib.ts_rng_seed.argtypes = [C.POINTER(Rng), C.c_uint64]
    scale, ratio = (C.c_float * 2)(*a.scale), (C.c_float * 2)(*a.ratio)
    out, r = np.zeros((a.draws, 5)), Rng()
    for pos in range(a.draws):  # sample `pos` of epoch 0, as the pipeline's sample_rng seeds it
        lib.ts_rng_seed(C.byref(r), splitmix(a.seed ^ splitmix(pos)))
        b = lib.ts_random_resized_crop_roi(C.byref(r), a.size[0], a.size[1], scale, ratio)
        out[pos] = (b.x, b.y, b.w, b.h, lib.ts_rng_uniform(C.byref(r)) < 0.5)
    return out


def torchvision_windows(a):
    torch.manual_seed(a.seed)
    img, out = torch.zeros(1, a.size[1], a.size[0]), np.zeros((a.draws, 5))
    for k in range(a.draws):
        i, j, h, w = transforms.RandomResizedCrop.get_params(img, list(a.scale), list(a.ratio))
        out[k] = (j, i, w, h, float(torch.rand(1) < 0.5))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib", help="libtessera.so")
    ap.add_argument("--draws", type=int, default=100000)
    ap.add_argument("--size", type=int, nargs=2, default=(28, 28))
    ap.add_argument("--scale", type=float, nargs=2, default=(0.08, 1.0))
    ap.add_argument("--ratio", type=float, nargs=2, default=(3 / 4, 4 / 3))
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    res = {"tessera": tessera_windows(C.CDLL(a.lib), a), "torchvision": torchvision_windows(a)}
    W, H = a.size
    print(f"{a.draws} windows on {W}x{H}, scale {tuple(a.scale)}, ratio {tuple(a.ratio)}\n"
          "| source | area fraction | log aspect ratio | centre x | centre y | whole image | flip rate |\n"
          "|---|--:|--:|--:|--:|--:|--:|")
    for name, v in res.items():
        x, y, w, h, f = v.T
        area, lr = w * h / (W * H), np.log(w / h)
        print(f"| {name} | {area.mean():.4f} ± {area.std():.4f} | {lr.mean():+.4f} ± {lr.std():.4f} | "
              f"{(x + w / 2).mean():.3f} | {(y + h / 2).mean():.3f} | {np.mean((w == W) & (h == H)):.4f} | "
              f"{f.mean():.4f} |")
    gaps = []
    for col, name in ((2, "width"), (3, "height"), (0, "x"), (1, "y")):
        n = max(W, H) + 1
        p, q = (np.bincount(res[k][:, col].astype(int), minlength=n) / a.draws for k in res)
        gaps.append(f"{name} {np.abs(p - q).max():.4f}")
    print(f"largest gap between the histograms (probability): {', '.join(gaps)} "
          f"(two samples of one distribution: up to about {1 / np.sqrt(a.draws):.4f})")


if __name__ == "__main__":
    main()
