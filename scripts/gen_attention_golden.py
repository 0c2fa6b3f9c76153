#!/usr/bin/env python3
"""
scripts/gen_attention_golden.py — PyTorch's F.scaled_dot_product_attention as the reference for
tests/test_attention.c (src/ops/attention.c): forward and gradients in float32, under bfloat16 autocast,
and torch's own float32 error against float64 at the edges (the bar the test holds ours to).

Regenerate with the newest PyTorch from pip (numpy is not needed; the test never needs torch):

    .pyvenv-torch/bin/python scripts/gen_attention_golden.py

The output is deterministic; "torch_version" records which torch wrote it. Every input is drawn from
the portable generator the test repeats bit for bit (gen() here, golden_gen() there): element i of
seed s is u = (k - 2^23) 2^-23 in [-1, 1), k the top 24 bits of splitmix64((s << 32) + i), exact in
float32. Case k's tensors use seeds 5000 + 16 k + j: j = 0 q, 1 k, 2 v, 3 the upstream gradient gy
(the loss is sum(out * gy)). One thread.

Output: tests/golden/attention.tsg.gz (gzip), in the TSGOLD1 format of scripts/gen_golden.py (read by
tests/golden_io.h). Records:

  "torch_version"     i32: the version's characters (e.g. "2.15.0+cu132")
  "causal_top_left"   i32 (1): 1 when is_causal with Tq != Tk equals the top-left mask tril(ones(Tq, Tk))
  "c<k>/case"         i64 (6): B, H, Tq, Tk, D, causal
  "c<k>/scale"        f32 (1): the scale passed (0: None, torch's 1/sqrt(D))
  "c<k>/out", "c<k>/gq", "c<k>/gk", "c<k>/gv"   f32: F.scaled_dot_product_attention in float32 and the
                      gradients of sum(out * gy)
  "ac<k>/..."         the same records for cases under torch.autocast("cpu", dtype=torch.bfloat16)
                      (float32 leaves; out is the bfloat16 result widened, the gradients float32)
  "edge<k>/case"      i64 (2): far, causal — the close-logit inputs of the test's check_close_logits:
                      B 1, H 2, T 200, D 16, q_i = (4, 4 (i % 3) / 8, 0, ...), k_i = (1e4 (1 + far (i % 3))
                      + ((37 i) % 97) / 64, (i % 5) / 8, 0, ...), v and gy from seeds 6000 + 16 k + 2, + 3
  "edge<k>/torch_err" f32 (4): torch float32 against torch float64 on those inputs: max |out - out64|,
                      then for gq, gk, gv max |g - g64| / max(1, max |g64|)
"""
import gzip
import os
import struct

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "golden", "attention.tsg.gz")
MAGIC = b"TSGOLD1\n"
CODES = {torch.float32: (0, "<f"), torch.int64: (3, "<q"), torch.int32: (4, "<i")}
M64 = (1 << 64) - 1


def splitmix64(x):
    z = (x + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def gen(seed, shape):
    n = 1
    for s in shape:
        n *= s
    vals = [((splitmix64((seed << 32) + i) >> 40) - (1 << 23)) * 2.0**-23 for i in range(n)]
    return torch.tensor(vals, dtype=torch.float32).reshape(shape)


def write(path, records):
    out = bytearray(MAGIC + struct.pack("<I", len(records)))
    for name, t in records:
        t = t.detach().contiguous()
        code, fmt = CODES[t.dtype]
        nb = name.encode()
        out += struct.pack("<I", len(nb)) + nb + struct.pack("<BI", code, t.dim())
        out += struct.pack("<%dq" % t.dim(), *t.shape)
        out += struct.pack("<%d%s" % (t.numel(), fmt[1]), *t.flatten().tolist())
    out = gzip.compress(bytes(out), compresslevel=9, mtime=0)  # mtime 0: the same bytes every run
    with open(path, "wb") as f:
        f.write(out)
    print("%s: %d records, %d bytes" % (os.path.relpath(path, ROOT), len(records), len(out)))


def run(q, k, v, gy, causal, scale, dtype=torch.float32, autocast=False):
    leaves = [t.detach().to(dtype).clone().requires_grad_(True) for t in (q, k, v)]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = F.scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale or None)
    (out.float() * gy.to(dtype) if autocast else out * gy.to(dtype)).sum().backward()
    return out, [t.grad for t in leaves]


CASES = [  # B, H, Tq, Tk, D, causal, scale
    (2, 2, 65, 65, 16, True, 0.0),
    (1, 2, 7, 130, 16, False, 0.0),
    (1, 2, 130, 7, 16, True, 0.0),   # Tq > Tk, causal: the last 123 queries see every key
    (1, 2, 37, 100, 32, True, 0.0),  # Tq < Tk, causal: query i sees keys 0..i
    (1, 2, 64, 64, 32, False, 0.3),
    (1, 1, 1, 1, 16, True, 0.0),
]
AUTOCAST = [(1, 2, 50, 50, 32, True, 0.0), (2, 1, 33, 70, 16, False, 0.0)]


def case_records(prefix, k, case, autocast):
    B, H, Tq, Tk, D, causal, scale = case
    base = 5000 + 16 * k + (1000 if autocast else 0)
    q, kk, v, gy = (gen(base + j, (B, H, T, D)) for j, T in enumerate((Tq, Tk, Tk, Tq)))
    out, grads = run(q, kk, v, gy, causal, scale, autocast=autocast)
    if autocast:
        assert out.dtype == torch.bfloat16, out.dtype
    recs = [("%s%d/case" % (prefix, k), torch.tensor([B, H, Tq, Tk, D, int(causal)], dtype=torch.int64)),
            ("%s%d/scale" % (prefix, k), torch.tensor([scale], dtype=torch.float32)),
            ("%s%d/out" % (prefix, k), out.float())]
    recs += [("%s%d/g%s" % (prefix, k, n), g.float()) for n, g in zip("qkv", grads)]
    return recs


def edge_inputs(k, far):
    T, D = 200, 16
    q = torch.zeros(1, 2, T, D)
    kk = torch.zeros(1, 2, T, D)
    for i in range(T):
        q[:, :, i, 0] = 4.0
        q[:, :, i, 1] = 4.0 * (i % 3) / 8.0
        kk[:, :, i, 0] = 1e4 * (1 + (i % 3 if far else 0)) + ((i * 37) % 97) / 64.0
        kk[:, :, i, 1] = (i % 5) / 8.0
    return q, kk, gen(6000 + 16 * k + 2, (1, 2, T, D)), gen(6000 + 16 * k + 3, (1, 2, T, D))


def edge_records(k, far, causal):
    q, kk, v, gy = edge_inputs(k, far)
    o32, g32 = run(q, kk, v, gy, causal, 0.0)
    o64, g64 = run(q, kk, v, gy, causal, 0.0, dtype=torch.float64)
    errs = [(o32.double() - o64).abs().max().item()]
    errs += [((a.double() - b).abs().max() / max(1.0, b.abs().max().item())).item() for a, b in zip(g32, g64)]
    print("edge far=%d causal=%d: torch float32 errors %s" % (far, causal, ", ".join("%.2g" % e for e in errs)))
    return [("edge%d/case" % k, torch.tensor([int(far), int(causal)], dtype=torch.int64)),
            ("edge%d/torch_err" % k, torch.tensor(errs, dtype=torch.float32))]


def causal_top_left():
    q, k, v = gen(1, (1, 1, 5, 8)), gen(2, (1, 1, 9, 8)), gen(3, (1, 1, 9, 8))
    mask = torch.ones(5, 9, dtype=torch.bool).tril()
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    b = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return int(torch.allclose(a, b, atol=1e-6, rtol=0))


def main():
    torch.set_num_threads(1)
    ver = torch.__version__
    recs = [("torch_version", torch.tensor([ord(c) for c in ver], dtype=torch.int32)),
            ("causal_top_left", torch.tensor([causal_top_left()], dtype=torch.int32))]
    assert recs[1][1].item() == 1, "is_causal is not top-left aligned in this torch"
    for k, case in enumerate(CASES):
        recs += case_records("c", k, case, False)
    for k, case in enumerate(AUTOCAST):
        recs += case_records("ac", k, case, True)
    k = 0
    for far in (0, 1):
        for causal in (0, 1):
            recs += edge_records(k, bool(far), bool(causal))
            k += 1
    write(OUT, recs)


if __name__ == "__main__":
    main()
