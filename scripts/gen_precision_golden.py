#!/usr/bin/env python3
"""
scripts/gen_precision_golden.py — PyTorch reference values for Tessera's 16-bit
floats and loss scaling (src/core/half.h, src/optim/grad.c; tests/test_precision.c).

Regenerate with the newest PyTorch from pip (torch.amp.GradScaler("cpu") needs
torch >= 2.3; the tests never need torch):

    pip install torch numpy && python3 scripts/gen_precision_golden.py

The output is deterministic; "torch_version" records which torch wrote it.

Output: tests/golden/precision.tsg.gz (gzip), in the TSGOLD1 format of scripts/gen_golden.py
(read by tests/golden_io.h). Records:

  "torch_version"       i32: the version's characters (e.g. "2.15.0+cu132")
  "convert/x"           f32 (N): inputs — zeros, infinities, NaNs, the float16
                        and bfloat16 edges (largest finite, the halfway points
                        to infinity, smallest normal and subnormal, the halfway
                        points around them), ties at every rounding position,
                        then random bit patterns over all of float32 and random
                        values at scales 2^-30 .. 2^20
  "convert/bf16"        i32 (N): x.to(torch.bfloat16) as its 16 bits
  "convert/f16"         i32 (N): x.to(torch.float16) as its 16 bits
  "scaler<k>/config"    f32 (4): init_scale, growth_factor, backoff_factor, growth_interval
  "scaler<k>/factors"   i64 (2): growth_factor and backoff_factor x 1000 (exact: torch multiplies the
                        float32 scale by the double factor, so 0.7 must be the double 0.7)
  "scaler<k>/found_inf" i32 (S): whether step s's gradients held an inf/NaN
  "scaler<k>/scale"     f32 (S): scaler.get_scale() after step s's update()
  "scaler<k>/stepped"   i32 (S): whether optimizer.step ran at step s (the parameter changed)
  "step/x", "step/target"  a batch (8, 1, 28, 28) f32 and (8) i64 for a small CNN: nn.Sequential(
                        Conv2d(1, 8, 3, padding=1), BatchNorm2d(8), ReLU(), MaxPool2d(2),
                        Conv2d(8, 16, 3, padding=1), BatchNorm2d(16), ReLU(), MaxPool2d(2),
                        Flatten(), Linear(784, 10))
  "step/init/<key>"     its initial state dict (torch.manual_seed(1) default init; num_batches_tracked i64)
  "step/fp32/<key>", "step/bf16/<key>"  every float entry after 2 steps of SGD(lr 0.02, momentum 0.9) on the
                        batch with cross-entropy, in float32, and under torch.autocast("cpu", torch.bfloat16)
  "step/fp32/loss", "step/bf16/loss"   f32 (2): the two steps' losses
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_golden import OUT, write  # noqa: E402  (the TSGOLD1 writer)


def f32(bits):
    return np.array(bits, dtype=np.uint32).view(np.float32)


def convert_inputs():
    specials = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FA00000,
                0x3F800000, 0xBF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000]
    vals = [65504.0, 65519.0, 65519.99, 65520.0, 65520.01, 65536.0, -65520.0, 2.0**-14, 2.0**-24, 2.0**-25,
            1.5 * 2.0**-25, 2.0**-26, 3.0 * 2.0**-25, 2.0**-14 - 2.0**-25, 2.0**-14 - 2.0**-26, 2.0**-15 + 2.0**-25,
            1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 3.3895314e38, 3.3961776e38,
            1e-40, -1e-45, 0.1, -0.3, 1.0 / 3.0, 100.0, 1e10]
    x = list(f32(specials)) + [np.float32(v) for v in vals]
    # ties at every float16 rounding position: mantissa bits below position 13 exactly 0x1000, both parities
    rng = np.random.default_rng(20261125)
    for e in range(103, 143):
        for m in rng.integers(0, 1 << 10, size=4):
            for low in (0x1000, 0x0FFF, 0x1001):
                x.append(f32([(e << 23) | (int(m) << 13) | low])[0])
    # ties for bfloat16: low 16 bits exactly 0x8000, both parities
    for b in rng.integers(0, 1 << 16, size=64):
        x.append(f32([(int(b) << 16) | 0x8000])[0])
    x += list(f32(rng.integers(0, 1 << 32, size=4000, dtype=np.uint64).astype(np.uint32)))
    for sc in range(-30, 21, 2):
        x += list((rng.standard_normal(100) * 2.0**sc).astype(np.float32))
    return np.array(x, dtype=np.float32)


def scaler_case(init_scale, growth, backoff, interval, found):
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([p], lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_factor=growth, backoff_factor=backoff,
                                  growth_interval=interval)
    scales, stepped = [], []
    for bad in found:
        opt.zero_grad()
        loss = scaler.scale((p + 1).sum())  # the scaled loss: its gradient is the scale
        loss.backward()
        if bad:
            p.grad[1] = float("inf") if len(scales) % 2 else float("nan")
        before = p.detach().clone()
        scaler.step(opt)
        scaler.update()
        stepped.append(int(not torch.equal(before, p.detach())))
        scales.append(scaler.get_scale())
    return (np.array([init_scale, growth, backoff, interval], dtype=np.float32),
            np.array([round(growth * 1000), round(backoff * 1000)], dtype=np.int64), np.array(found, dtype=np.int32),
            np.array(scales, dtype=np.float32), np.array(stepped, dtype=np.int32))


def small_cnn():
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(784, 10))


def bf16_step_records():
    torch.manual_seed(1)
    model = small_cnn()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, 1, 28, 28, generator=g)
    target = torch.randint(0, 10, (8,), generator=g)
    recs = [("step/x", x), ("step/target", target)] + [("step/init/" + k, v) for k, v in init.items()]
    for mode in ("fp32", "bf16"):
        m = small_cnn()
        m.load_state_dict(init)
        m.train()
        opt = torch.optim.SGD(m.parameters(), lr=0.02, momentum=0.9)
        losses = []
        for _ in range(2):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16"):
                loss = torch.nn.functional.cross_entropy(m(x), target)
            loss.float().backward()
            opt.step()
            losses.append(loss.float().item())
        for k, v in m.state_dict().items():
            if v.dtype == torch.float32:
                recs.append(("step/%s/%s" % (mode, k), v.detach()))
        recs.append(("step/%s/loss" % mode, np.array(losses, dtype=np.float32)))
    return recs


def main():
    torch.manual_seed(0)
    recs = [("torch_version", np.array([ord(c) for c in torch.__version__], dtype=np.int32))]
    x = convert_inputs()
    t = torch.from_numpy(x.copy())
    recs.append(("convert/x", x))
    recs.append(("convert/bf16", t.to(torch.bfloat16).view(torch.int16).numpy().astype(np.int32) & 0xFFFF))
    recs.append(("convert/f16", t.to(torch.float16).view(torch.int16).numpy().astype(np.int32) & 0xFFFF))
    rng = np.random.default_rng(7)
    cases = [
        (2.0**10, 2.0, 0.5, 3, [int(v) for v in rng.random(40) < 0.2]),
        (65536.0, 2.0, 0.5, 2000, [0, 0, 1, 0, 1, 1, 0]),
        (2.0**120, 4.0, 0.25, 2, [0] * 12 + [1] + [0] * 6),  # growth would overflow float32: not taken
        (3.0, 1.5, 0.7, 1, [0, 1, 0, 0, 1, 0, 0, 0, 1, 1, 0]),
    ]
    for k, c in enumerate(cases):
        cfg, factors, found, scales, stepped = scaler_case(*c)
        recs += [("scaler%d/config" % k, cfg), ("scaler%d/factors" % k, factors), ("scaler%d/found_inf" % k, found), ("scaler%d/scale" % k, scales),
                 ("scaler%d/stepped" % k, stepped)]
    recs += bf16_step_records()
    write(os.path.join(OUT, "precision.tsg.gz"), recs, compress=True)


if __name__ == "__main__":
    main()
