#!/usr/bin/python3
"""
scripts/gen_golden.py — writes PyTorch golden values for Tessera's tests.

Regenerate (needs Debian's python3-torch; the tests themselves never need torch):

    TS_WITH_TORCH=1 scripts/install-deps && /usr/bin/python3 scripts/gen_golden.py

Use /usr/bin/python3 explicitly: a pyenv `python3` earlier on PATH has no torch.
Everything is deterministic (fixed seeds, float32, CPU, one thread), so a rerun
with the same torch version rewrites identical files. Outputs:

  tests/golden/ops.tsg         one case per op variant (tests/test_golden_ops.c)
  tests/golden/cnn_step.tsg.gz the reference CNN, two SGD steps (tests/test_golden_step.c)

File format ("TSG1"; read by tests/golden_io.h, which documents the same):

  file   := magic[8] = "TSGOLD1\\n", u32 count, record * count
  record := u32 name_len, name[name_len] (UTF-8, no NUL),
            u8 dtype (Tessera's ts_dtype codes: 0 = f32, 3 = i64, 4 = i32),
            u32 ndim, i64 shape[ndim], data[numel * dtype size]
  All integers and data little-endian; data is the tensor in C (row-major)
  order; ndim 0 is a scalar (one element). A file may be gzip-compressed as a
  whole (the reader uses zlib's gzread, which reads plain files too).

ops.tsg: record names are "<case>/<tensor>", with <case> = "<op>:<variant>".
  Inputs are named after the op's arguments (x, a, b, w, bias, idx, target,
  running_mean, ...); "args" (i64) and "fargs" (f32) hold the op's other
  parameters (see each case below); "gy" is the upstream gradient, "y" the
  forward output, "grad_<input>" the gradient of sum(y * gy) with respect to
  that input, and for batchnorm "running_mean_out"/"running_var_out" are the
  running statistics after the call.

cnn_step.tsg.gz: the reference CNN (the nn.Sequential in cnn_step() below),
  a batch "x" (8,1,28,28) f32 and "target" (8) i64, cross-entropy loss, and
  SGD(lr=0.1, momentum=0.9, weight_decay=5e-4), two steps. The full state
  dicts would be ~5 MB of incompressible float32, so:
  - The initial conv/linear weights and biases are not stored: they follow
    PyTorch's default distribution U(-1/sqrt(fan_in), 1/sqrt(fan_in)) but are
    drawn from a tiny portable generator that C reproduces bit for bit
    (init_uniform() below, tg_init_uniform() in tests/golden_io.h). For those
    keys "initgen/<key>" (i64) = [seed, fan_in] and "initsum/<key>" (f32) =
    [sum, sum of |v|] to check the C generator. Every other state-dict entry
    (BatchNorm weight/bias/running stats/num_batches_tracked) is stored in full
    as "init/<key>".
  - After step k (k = 1, 2) float entries are stored as fixed-point offsets
    from the initial value: "q<k>/<key>" (i32) with
        state_k = init + (q1 + ... + qk) * 2^-Q,   Q = "qbits" (i64 scalar, 16),
    where the cumulative sum q1 + ... + qk = round((state_k - init) * 2^Q), so
    the stored reference is within 2^-(Q+1) (7.6e-6) of PyTorch's float32
    result, well inside the test's 1e-4 tolerance. i64 entries
    (num_batches_tracked) are stored in full as "step<k>/<key>".
  - "loss1", "loss2": the loss computed in the forward pass of step 1 and 2.
"""
import gzip
import io
import math
import os
import struct
import zlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "golden")
MAGIC = b"TSGOLD1\n"
DTYPES = {np.dtype(np.float32): 0, np.dtype(np.int64): 3, np.dtype(np.int32): 4}


def encode(records):
    """records: list of (name, array-like). Returns the file's bytes."""
    buf = io.BytesIO()
    buf.write(MAGIC)
    buf.write(struct.pack("<I", len(records)))
    seen = set()
    for name, value in records:
        assert name not in seen, name
        seen.add(name)
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        a = np.array(value, order="C")  # (np.ascontiguousarray would turn 0-d into 1-d)
        if a.dtype == np.float64:
            a = a.astype(np.float32)
        code = DTYPES[a.dtype]
        nb = name.encode()
        buf.write(struct.pack("<I", len(nb)))
        buf.write(nb)
        buf.write(struct.pack("<BI", code, a.ndim))
        buf.write(struct.pack("<%dq" % a.ndim, *a.shape))
        buf.write(a.astype(a.dtype.newbyteorder("<")).tobytes())
    return buf.getvalue()


def write(path, records, compress=False):
    data = encode(records)
    if compress:
        # mtime=0 and no file name keep the output byte-identical across runs.
        data = gzip.compress(data, compresslevel=9, mtime=0)
    with open(path, "wb") as f:
        f.write(data)
    print("%-28s %4d records %8d bytes" % (os.path.relpath(path, ROOT), len(records), len(data)))


# ---- op cases ------------------------------------------------------------------------------------

class Cases:
    def __init__(self):
        self.records = []
        self.names = set()

    def gen(self, case):
        """A generator seeded from the case name, so adding a case changes no other."""
        assert case not in self.names, case
        self.names.add(case)
        return torch.Generator().manual_seed(zlib.crc32(case.encode()))

    def add(self, case, inputs, y, g, args=None, fargs=None, extra=None, no_grad=()):
        """inputs: dict name -> tensor (float ones get gradients unless in no_grad);
        y: forward output computed from those tensors; g: the generator for gy."""
        for name, t in inputs.items():
            self.records.append(("%s/%s" % (case, name), t.detach().clone()))
        if args is not None:
            self.records.append((case + "/args", np.array(args, dtype=np.int64)))
        if fargs is not None:
            self.records.append((case + "/fargs", np.array(fargs, dtype=np.float32)))
        gy = torch.randn(y.shape, generator=g)
        self.records.append((case + "/gy", gy))
        self.records.append((case + "/y", y.detach()))
        grads = [(n, t) for n, t in inputs.items() if t.requires_grad and n not in no_grad]
        gs = torch.autograd.grad(y, [t for _, t in grads], gy, allow_unused=True)
        for (n, t), gt in zip(grads, gs):
            if gt is None:
                gt = torch.zeros_like(t)
            self.records.append(("%s/grad_%s" % (case, n), gt))
        for n, t in (extra or {}).items():
            self.records.append(("%s/%s" % (case, n), t.detach()))


def rnd(g, *shape, grad=True, lo=None, hi=None):
    if lo is not None:
        t = torch.rand(shape, generator=g) * (hi - lo) + lo
    else:
        t = torch.randn(shape, generator=g)
    return t.requires_grad_(grad)


def op_cases():
    c = Cases()

    # add/sub/mul: numpy broadcasting. No args.
    shapes = {
        "same": ((2, 3, 4), (2, 3, 4)),
        "row": ((2, 3, 4), (4,)),
        "col": ((2, 3, 4), (3, 1)),
        "both": ((2, 1, 4), (1, 3, 1)),
        "left": ((1, 4), (2, 3, 4)),
        "scalar": ((2, 3), ()),
    }
    for op, fn in (("add", torch.add), ("sub", torch.sub), ("mul", torch.mul)):
        for v, (sa, sb) in shapes.items():
            case = "%s:%s" % (op, v)
            g = c.gen(case)
            a, b = rnd(g, *sa), rnd(g, *sb)
            c.add(case, {"a": a, "b": b}, fn(a, b), g)

    # scale: fargs = [s]
    for v, s in (("neg", -1.5), ("half", 0.5)):
        case = "scale:" + v
        g = c.gen(case)
        x = rnd(g, 2, 3, 4)
        c.add(case, {"x": x}, x * s, g, fargs=[s])

    case = "relu:basic"
    g = c.gen(case)
    x = rnd(g, 2, 3, 7, 6)
    c.add(case, {"x": x}, F.relu(x), g)

    for op, fn in (("sum", torch.sum), ("mean", torch.mean)):
        case = op + ":basic"
        g = c.gen(case)
        x = rnd(g, 2, 3, 7, 6)
        c.add(case, {"x": x}, fn(x), g)

    case = "matmul:basic"
    g = c.gen(case)
    a, b = rnd(g, 5, 7), rnd(g, 7, 3)
    c.add(case, {"a": a, "b": b}, a @ b, g)

    for v, has_bias in (("bias", True), ("nobias", False)):
        case = "linear:" + v
        g = c.gen(case)
        x, w = rnd(g, 4, 7), rnd(g, 5, 7)
        inputs = {"x": x, "w": w}
        if has_bias:
            inputs["bias"] = rnd(g, 5)
        c.add(case, inputs, F.linear(x, w, inputs.get("bias")), g)

    # conv2d: args = [stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups]
    conv = [
        # name, C_in, C_out, (kh, kw), stride, padding, dilation, groups, bias, (H, W)
        ("k3_bias", 3, 4, (3, 3), (1, 1), (0, 0), (1, 1), 1, True, (7, 6)),
        ("k3_s2_p1", 3, 4, (3, 3), (2, 2), (1, 1), (1, 1), 1, True, (7, 6)),
        ("k3_p1_nobias", 3, 5, (3, 3), (1, 1), (1, 1), (1, 1), 1, False, (7, 6)),
        ("k3_d2_p2", 3, 4, (3, 3), (1, 1), (2, 2), (2, 2), 1, True, (7, 6)),
        ("groups2", 4, 6, (3, 3), (1, 1), (1, 1), (1, 1), 2, False, (7, 6)),
        ("depthwise", 4, 8, (3, 3), (2, 1), (1, 1), (1, 1), 4, True, (7, 6)),
        ("asym", 3, 4, (3, 2), (2, 1), (1, 0), (1, 2), 1, False, (7, 6)),
        ("k1", 3, 5, (1, 1), (1, 1), (0, 0), (1, 1), 1, True, (7, 6)),
        ("s3_uncovered", 2, 3, (2, 2), (3, 3), (0, 0), (1, 1), 1, True, (7, 6)),
        ("k5_p2_s2", 2, 3, (5, 5), (2, 2), (2, 2), (1, 1), 1, True, (8, 9)),
    ]
    for name, cin, cout, k, s, p, d, groups, bias, hw in conv:
        case = "conv2d:" + name
        g = c.gen(case)
        x = rnd(g, 2, cin, *hw)
        w = rnd(g, cout, cin // groups, *k) * 0.3
        w = w.detach().requires_grad_(True)
        inputs = {"x": x, "w": w}
        if bias:
            inputs["bias"] = rnd(g, cout)
        y = F.conv2d(x, w, inputs.get("bias"), s, p, d, groups)
        c.add(case, inputs, y, g, args=[*s, *p, *d, groups])

    # maxpool2d / avgpool2d: args = [kh, kw, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, ceil_mode]
    # (stride 0 = kernel, as in ts_pool2d_params; avg pool counts padding, dilation must be 1)
    pools = [
        # name, kernel, stride, padding, dilation, ceil, (H, W)
        ("k2", (2, 2), (0, 0), (0, 0), (1, 1), False, (7, 6)),
        ("k3_s2_p1", (3, 3), (2, 2), (1, 1), (1, 1), False, (7, 6)),
        ("k3_s2_ceil", (3, 3), (2, 2), (0, 0), (1, 1), True, (7, 6)),
        ("k3_s2_p1_ceil", (3, 3), (2, 2), (1, 1), (1, 1), True, (8, 7)),
        ("k2_s2_p1_ceil", (2, 2), (2, 2), (1, 1), (1, 1), True, (7, 6)),
        ("k2_s1", (2, 2), (1, 1), (0, 0), (1, 1), False, (7, 6)),
        ("k32_s12_p11", (3, 2), (1, 2), (1, 1), (1, 1), False, (7, 6)),
    ]
    max_only = [
        ("k2_d2", (2, 2), (1, 1), (0, 0), (2, 2), False, (7, 6)),
        ("k3_d2_p1_ceil", (3, 3), (2, 2), (1, 1), (2, 2), True, (7, 8)),
    ]
    for op in ("maxpool2d", "avgpool2d"):
        for name, k, s, p, d, ceil, hw in pools + (max_only if op == "maxpool2d" else []):
            case = "%s:%s" % (op, name)
            g = c.gen(case)
            x = rnd(g, 2, 3, *hw)
            st = tuple(si if si else ki for si, ki in zip(s, k))
            if op == "maxpool2d":
                y = F.max_pool2d(x, k, st, p, d, ceil_mode=ceil)
            else:
                y = F.avg_pool2d(x, k, st, p, ceil_mode=ceil, count_include_pad=True)
            c.add(case, {"x": x}, y, g, args=[*k, *s, *p, *d, int(ceil)])

    case = "global_avgpool2d:basic"
    g = c.gen(case)
    x = rnd(g, 2, 3, 7, 6)
    c.add(case, {"x": x}, F.adaptive_avg_pool2d(x, 1), g)

    # batchnorm2d: args = [training], fargs = [momentum, eps]; weight/bias and
    # running stats are optional (absent = NULL).
    bns = [
        # name, training, affine, running stats, momentum, eps
        ("train", True, True, True, 0.1, 1e-5),
        ("train_m03_eps1e-3", True, True, True, 0.3, 1e-3),
        ("train_nostats", True, True, False, 0.1, 1e-5),
        ("train_noaffine", True, False, True, 0.1, 1e-5),
        ("eval", False, True, True, 0.1, 1e-5),
        ("eval_noaffine", False, False, True, 0.1, 1e-5),
    ]
    for name, training, affine, stats, mom, eps in bns:
        case = "batchnorm2d:" + name
        g = c.gen(case)
        x = (rnd(g, 2, 3, 7, 6, grad=False) * 2 + 0.5).requires_grad_(True)
        inputs = {"x": x}
        if affine:
            inputs["weight"] = rnd(g, 3, lo=0.5, hi=1.5)
            inputs["bias"] = rnd(g, 3)
        extra = {}
        rm = rv = None
        if stats:
            rm = rnd(g, 3, grad=False) * 0.5
            rv = rnd(g, 3, grad=False, lo=0.5, hi=2.0)
            inputs["running_mean"] = rm.clone()
            inputs["running_var"] = rv.clone()
        y = F.batch_norm(x, rm, rv, inputs.get("weight"), inputs.get("bias"), training, mom, eps)
        if stats:
            extra = {"running_mean_out": rm, "running_var_out": rv}
        c.add(case, inputs, y, g, args=[int(training)], fargs=[mom, eps], extra=extra)

    # embedding: idx (i64) with repeated indices; the gradient accumulates.
    case = "embedding:repeats"
    g = c.gen(case)
    w = rnd(g, 6, 4)
    idx = torch.tensor([[0, 2, 2, 5, 1], [2, 0, 5, 5, 3]], dtype=torch.int64)
    c.add(case, {"idx": idx, "weight": w}, F.embedding(idx, w), g)
    case = "embedding:1d"
    g = c.gen(case)
    w = rnd(g, 5, 3)
    idx = torch.tensor([4, 4, 4, 0], dtype=torch.int64)
    c.add(case, {"idx": idx, "weight": w}, F.embedding(idx, w), g)

    # reshape: args = the new shape (may hold one -1)
    for name, shape, new in (("2d", (2, 3, 4), (4, -1)), ("4d", (6, 4), (2, 1, 3, 4))):
        case = "reshape:" + name
        g = c.gen(case)
        x = rnd(g, *shape)
        c.add(case, {"x": x}, x.reshape(new), g, args=list(new))

    # flatten: args = [start_dim] (to the last dim)
    for name, sd in (("from1", 1), ("from2", 2), ("from0", 0)):
        case = "flatten:" + name
        g = c.gen(case)
        x = rnd(g, 2, 3, 4, 5)
        c.add(case, {"x": x}, torch.flatten(x, sd), g, args=[sd])

    # concat: inputs x0..x{n-1}; args = [dim, n]
    for name, dim, shapes_ in (("dim1", 1, ((2, 1, 4), (2, 3, 4), (2, 2, 4))),
                               ("dim0", 0, ((1, 5), (3, 5))),
                               ("dimlast", 2, ((2, 3, 2), (2, 3, 3)))):
        case = "concat:" + name
        g = c.gen(case)
        xs = [rnd(g, *s) for s in shapes_]
        c.add(case, {"x%d" % i: t for i, t in enumerate(xs)}, torch.cat(xs, dim), g, args=[dim, len(xs)])

    # slice: args = [dim, start, end] (negative values count from the end)
    for name, dim, start, end in (("mid", 1, 1, 3), ("neg", 2, -3, -1), ("dim0", 0, 0, 1), ("full", 3, 0, 6)):
        case = "slice:" + name
        g = c.gen(case)
        x = rnd(g, 2, 4, 5, 6)
        sl = [slice(None)] * 4
        sl[dim] = slice(start, end)
        c.add(case, {"x": x}, x[tuple(sl)], g, args=[dim, start, end])

    # dropout: values are random, so only the deterministic cases. args = [training], fargs = [p]
    for name, p, training in (("p0_train", 0.0, True), ("p05_eval", 0.5, False)):
        case = "dropout:" + name
        g = c.gen(case)
        x = rnd(g, 2, 3, 4)
        c.add(case, {"x": x}, F.dropout(x, p, training), g, args=[int(training)], fargs=[p])

    # log_softmax: args = [dim]
    for name, shape, dim in (("dim1", (4, 7), 1), ("last3d", (2, 3, 5), -1), ("dim0", (4, 3), 0),
                             ("mid3d", (2, 3, 5), 1), ("large", (3, 6), 1)):
        case = "log_softmax:" + name
        g = c.gen(case)
        # "large": logits near +-150, where exp overflows float32 unless the max is subtracted
        x = rnd(g, *shape) * (50 if name == "large" else 3)
        x = x.detach().requires_grad_(True)
        c.add(case, {"x": x}, F.log_softmax(x, dim), g, args=[dim])

    # cross_entropy: logits (N, C), target (N) i64; fargs = [label_smoothing]
    for name, ls, mag in (("ls0", 0.0, 2), ("ls01", 0.1, 2), ("ls01_large", 0.1, 60)):
        case = "cross_entropy:" + name
        g = c.gen(case)
        logits = (rnd(g, 6, 5) * mag).detach().requires_grad_(True)
        target = torch.randint(0, 5, (6,), generator=g)
        c.add(case, {"logits": logits, "target": target},
              F.cross_entropy(logits, target, label_smoothing=ls), g, fargs=[ls])

    case = "mse_loss:basic"
    g = c.gen(case)
    pred, target = rnd(g, 3, 4), rnd(g, 3, 4)
    c.add(case, {"pred": pred, "target": target}, F.mse_loss(pred, target), g)

    # ---- ops of the second batch: div, activations, softmax, dim reductions, max, permute/transpose,
    # flatten_range, bmm/batched matmul, adaptive average pooling ----

    # div: numpy broadcasting like add/sub/mul; |b| in [0.5, 2] keeps the quotient tame. No args.
    for v, (sa, sb) in shapes.items():
        case = "div:" + v
        g = c.gen(case)
        a = rnd(g, *sa)
        mag = torch.rand(sb, generator=g) * 1.5 + 0.5
        sign = torch.where(torch.randn(sb, generator=g) >= 0, 1.0, -1.0)
        b = (mag * sign).requires_grad_(True)
        c.add(case, {"a": a, "b": b}, torch.div(a, b), g)

    # sigmoid/tanh/silu: no args; gelu: args = [tanh_approx]
    for op, fn in (("sigmoid", torch.sigmoid), ("tanh", torch.tanh), ("silu", F.silu)):
        case = op + ":basic"
        g = c.gen(case)
        x = (rnd(g, 2, 3, 7, 6, grad=False) * 3).requires_grad_(True)
        c.add(case, {"x": x}, fn(x), g)
    for name, approx in (("erf", False), ("tanh", True)):
        case = "gelu:" + name
        g = c.gen(case)
        x = (rnd(g, 2, 3, 7, 6, grad=False) * 3).requires_grad_(True)
        c.add(case, {"x": x}, F.gelu(x, approximate="tanh" if approx else "none"), g, args=[int(approx)])

    # softmax: args = [dim]
    for name, shape, dim in (("dim1", (4, 7), 1), ("last3d", (2, 3, 5), -1), ("dim0", (4, 3), 0),
                             ("mid3d", (2, 3, 5), 1), ("large", (3, 6), 1), ("neg2_4d", (2, 3, 4, 5), -2)):
        case = "softmax:" + name
        g = c.gen(case)
        # "large": logits near +-150, where exp overflows float32 unless the max is subtracted
        x = rnd(g, *shape) * (50 if name == "large" else 3)
        x = x.detach().requires_grad_(True)
        c.add(case, {"x": x}, F.softmax(x, dim), g, args=[dim])

    # sum_dims / mean_dims: args = [keepdim, dims...] (no dims: all of them, as dim=[])
    reds = [
        # name, shape, dims, keepdim
        ("d1_keep", (2, 3, 4, 5), (1,), True),
        ("d13", (2, 3, 4, 5), (1, 3), False),
        ("last_keep", (2, 3, 4, 5), (-1,), True),
        ("d023", (2, 3, 4, 5), (0, 2, 3), False),
        ("hw_keep", (2, 3, 4, 5), (-2, -1), True),
        ("d0", (4, 6), (0,), False),
        ("all", (3, 4), (), False),
        ("all_keep", (3, 4), (1, 0), True),
        ("size1", (2, 1, 5), (1,), False),
    ]
    for op, fn in (("sum_dims", torch.sum), ("mean_dims", torch.mean)):
        for name, shape, dims, keep in reds:
            case = "%s:%s" % (op, name)
            g = c.gen(case)
            x = rnd(g, *shape)
            y = fn(x, dim=list(dims), keepdim=keep) if dims else fn(x, dim=[], keepdim=keep)
            c.add(case, {"x": x}, y, g, args=[int(keep), *dims])

    # max_dim: args = [dim, keepdim]; y = the values, "indices" (i64) the argmax (random data: no ties)
    for name, shape, dim, keep in (("d1_keep", (4, 7), 1, True), ("last", (2, 3, 5), -1, False),
                                   ("d0", (5, 3), 0, False), ("mid_keep", (2, 6, 4), 1, True),
                                   ("neg3_4d", (3, 2, 4, 5), -3, False)):
        case = "max_dim:" + name
        g = c.gen(case)
        x = rnd(g, *shape)
        vals, idx = torch.max(x, dim, keepdim=keep)
        c.add(case, {"x": x}, vals, g, args=[dim, int(keep)], extra={"indices": idx})

    # permute: args = perm; transpose: args = [dim0, dim1]
    for name, shape, perm in (("2d", (5, 7), (1, 0)), ("nchw_nhwc", (2, 3, 4, 5), (0, 2, 3, 1)),
                              ("rev", (2, 3, 4), (2, 1, 0)), ("neg", (2, 3, 4, 5), (-1, 0, -2, 1)),
                              ("big2d", (40, 70), (1, 0))):
        case = "permute:" + name
        g = c.gen(case)
        x = rnd(g, *shape)
        c.add(case, {"x": x}, x.permute(*perm), g, args=list(perm))
    for name, shape, d0, d1 in (("last2", (2, 3, 4), -1, -2), ("d02", (2, 3, 4, 5), 0, 2), ("same", (3, 4), 1, 1)):
        case = "transpose:" + name
        g = c.gen(case)
        x = rnd(g, *shape)
        c.add(case, {"x": x}, x.transpose(d0, d1), g, args=[d0, d1])

    # flatten_range: args = [start_dim, end_dim]
    for name, sd, ed in (("mid", 1, 2), ("neg", 0, -2), ("one", 2, 2), ("all", 0, -1)):
        case = "flatten_range:" + name
        g = c.gen(case)
        x = rnd(g, 2, 3, 4, 5)
        c.add(case, {"x": x}, torch.flatten(x, sd, ed), g, args=[sd, ed])

    # bmm: (B, M, K) x (B, K, N); matmul_nd: torch.matmul with broadcast batch dims (the "matmul" runner)
    for name, sa, sb in (("basic", (3, 4, 5), (3, 5, 2)), ("b1", (1, 6, 3), (1, 3, 4))):
        case = "bmm:" + name
        g = c.gen(case)
        a, b = rnd(g, *sa), rnd(g, *sb)
        c.add(case, {"a": a, "b": b}, torch.bmm(a, b), g)
    for name, sa, sb in (("batch3d", (3, 4, 5), (3, 5, 2)), ("a4d_b2d", (2, 3, 4, 5), (5, 6)),
                         ("a2d_b3d", (4, 5), (2, 5, 3)), ("bcast_both", (2, 1, 4, 5), (3, 5, 6)),
                         ("bcast_lead1", (1, 4, 5), (3, 5, 2))):
        case = "matmul:" + name
        g = c.gen(case)
        a, b = rnd(g, *sa), rnd(g, *sb)
        c.add(case, {"a": a, "b": b}, torch.matmul(a, b), g)

    # adaptive_avgpool2d: args = [out_h, out_w]; windows overlap when the sizes do not divide
    for name, shape, osz in (("7x6_3x4", (2, 3, 7, 6), (3, 4)), ("5x5_2x3", (2, 2, 5, 5), (2, 3)),
                             ("8x8_4x4", (1, 3, 8, 8), (4, 4)), ("6x5_1x1", (2, 3, 6, 5), (1, 1)),
                             ("up_3x4_5x7", (1, 2, 3, 4), (5, 7)), ("chw_7x6_2x2", (3, 7, 6), (2, 2))):
        case = "adaptive_avgpool2d:" + name
        g = c.gen(case)
        x = rnd(g, *shape)
        c.add(case, {"x": x}, F.adaptive_avg_pool2d(x, osz), g, args=list(osz))
    # ---- normalisation layers, loss options, avg pool count_include_pad off ----
    # layer_norm: args = [normalized_ndim], fargs = [eps]; weight/bias optional (absent = NULL)
    lns = [
        # name, x shape, normalized_ndim, affine, eps
        ("last1", (4, 7), 1, True, 1e-5),
        ("last1_noaffine", (2, 3, 6), 1, False, 1e-5),
        ("last2", (2, 3, 4, 5), 2, True, 1e-5),
        ("last3_eps1e-3", (2, 3, 4, 5), 3, True, 1e-3),
        ("all2_noaffine", (3, 5), 2, False, 1e-5),
    ]
    for name, shape, k, affine, eps in lns:
        case = "layer_norm:" + name
        g = c.gen(case)
        x = (rnd(g, *shape, grad=False) * 2 + 0.5).requires_grad_(True)
        inputs = {"x": x}
        if affine:
            inputs["weight"] = rnd(g, *shape[-k:], lo=0.5, hi=1.5)
            inputs["bias"] = rnd(g, *shape[-k:])
        y = F.layer_norm(x, shape[-k:], inputs.get("weight"), inputs.get("bias"), eps)
        c.add(case, inputs, y, g, args=[k], fargs=[eps])

    # group_norm: args = [num_groups], fargs = [eps]; weight/bias (C) optional
    gns = [
        # name, x shape, groups, affine, eps
        ("g1_4d", (2, 6, 4, 5), 1, True, 1e-5),
        ("g2_4d", (2, 6, 4, 5), 2, True, 1e-5),
        ("gC_4d", (2, 6, 3, 3), 6, True, 1e-5),
        ("g2_3d", (3, 4, 7), 2, True, 1e-5),
        ("g3_3d_noaffine", (2, 6, 5), 3, False, 1e-3),
        ("g2_2d", (4, 6), 2, True, 1e-5),
    ]
    for name, shape, groups, affine, eps in gns:
        case = "group_norm:" + name
        g = c.gen(case)
        x = (rnd(g, *shape, grad=False) * 2 - 0.5).requires_grad_(True)
        inputs = {"x": x}
        if affine:
            inputs["weight"] = rnd(g, shape[1], lo=0.5, hi=1.5)
            inputs["bias"] = rnd(g, shape[1])
        y = F.group_norm(x, groups, inputs.get("weight"), inputs.get("bias"), eps)
        c.add(case, inputs, y, g, args=[groups], fargs=[eps])

    # batchnorm1d: as batchnorm2d (args = [training], fargs = [momentum, eps]) on (N, C) or (N, C, L)
    bn1s = [
        # name, shape, training, affine, running stats, momentum, eps
        ("2d_train", (6, 4), True, True, True, 0.1, 1e-5),
        ("2d_eval", (6, 4), False, True, True, 0.1, 1e-5),
        ("2d_train_noaffine_nostats", (5, 3), True, False, False, 0.1, 1e-5),
        ("3d_train", (3, 4, 7), True, True, True, 0.2, 1e-5),
        ("3d_eval_noaffine", (3, 4, 7), False, False, True, 0.1, 1e-3),
    ]
    for name, shape, training, affine, stats, mom, eps in bn1s:
        case = "batchnorm1d:" + name
        g = c.gen(case)
        x = (rnd(g, *shape, grad=False) * 2 + 0.5).requires_grad_(True)
        C = shape[1]
        inputs = {"x": x}
        if affine:
            inputs["weight"] = rnd(g, C, lo=0.5, hi=1.5)
            inputs["bias"] = rnd(g, C)
        extra = {}
        rm = rv = None
        if stats:
            rm = rnd(g, C, grad=False) * 0.5
            rv = rnd(g, C, grad=False, lo=0.5, hi=2.0)
            inputs["running_mean"] = rm.clone()
            inputs["running_var"] = rv.clone()
        y = F.batch_norm(x, rm, rv, inputs.get("weight"), inputs.get("bias"), training, mom, eps)
        if stats:
            extra = {"running_mean_out": rm, "running_var_out": rv}
        c.add(case, inputs, y, g, args=[int(training)], fargs=[mom, eps], extra=extra)

    # cross_entropy_ex: logits (N, C), target (N) i64, class weight (C) optional (no gradient);
    # args = [reduction (0 mean, 1 sum, 2 none), ignore_index], fargs = [label_smoothing]
    reductions = {"mean": 0, "sum": 1, "none": 2}
    for red in ("mean", "sum", "none"):
        for weighted in (False, True):
            for ignore in (None, -100, 2):
                for ls in (0.0, 0.2):
                    name = "%s%s%s_ls%s" % (red, "_w" if weighted else "",
                                            "" if ignore is None else "_ign%d" % ignore, str(ls).replace(".", ""))
                    case = "cross_entropy_ex:" + name
                    g = c.gen(case)
                    N, C = 7, 5
                    logits = (rnd(g, N, C) * 2).detach().requires_grad_(True)
                    target = torch.randint(0, C, (N,), generator=g)
                    ii = -100 if ignore is None else ignore
                    if ignore is not None:
                        target[1] = ii
                        target[4] = ii
                    inputs = {"logits": logits, "target": target}
                    w = None
                    if weighted:
                        w = rnd(g, C, grad=False, lo=0.2, hi=2.0)
                        inputs["weight"] = w
                    y = F.cross_entropy(logits, target, weight=w, ignore_index=ii, reduction=red,
                                        label_smoothing=ls)
                    c.add(case, inputs, y, g, args=[reductions[red], ii], fargs=[ls])

    # cross_entropy_ex on (N, C, d1, ...) logits and (N, d1, ...) targets: a sample per position
    for name, shape, red, weighted, ls in (("spatial2d_mean_w_ls01", (2, 4, 3, 5), "mean", True, 0.1),
                                           ("spatial1d_none", (3, 5, 4), "none", False, 0.0),
                                           ("spatial2d_sum_ls02", (2, 3, 2, 4), "sum", False, 0.2)):
        case = "cross_entropy_ex:" + name
        g = c.gen(case)
        C = shape[1]
        logits = (rnd(g, *shape) * 2).detach().requires_grad_(True)
        tshape = (shape[0],) + shape[2:]
        target = torch.randint(0, C, tshape, generator=g)
        target.view(-1)[::5] = -100
        inputs = {"logits": logits, "target": target}
        w = None
        if weighted:
            w = rnd(g, C, grad=False, lo=0.2, hi=2.0)
            inputs["weight"] = w
        y = F.cross_entropy(logits, target, weight=w, reduction=red, label_smoothing=ls)
        c.add(case, inputs, y, g, args=[reductions[red], -100], fargs=[ls])

    # avgpool2d with count_include_pad=False: the avgpool2d args plus exclude_pad = 1
    pools_ex = [
        # name, kernel, stride, padding, ceil, (H, W)
        ("k3_s2_p1_excl", (3, 3), (2, 2), (1, 1), False, (7, 6)),
        ("k3_s1_p1_excl", (3, 3), (1, 1), (1, 1), False, (5, 6)),
        ("k3_s2_p1_ceil_excl", (3, 3), (2, 2), (1, 1), True, (8, 7)),
        ("k2_s2_p1_ceil_excl", (2, 2), (2, 2), (1, 1), True, (7, 6)),
        ("k3_s2_ceil_excl", (3, 3), (2, 2), (0, 0), True, (6, 8)),
        ("k32_s12_p11_excl", (3, 2), (1, 2), (1, 1), False, (7, 6)),
        ("k4_s3_p2_ceil_excl", (4, 4), (3, 3), (2, 2), True, (8, 9)),
    ]
    for name, k, s, p, ceil, hw in pools_ex:
        case = "avgpool2d:" + name
        g = c.gen(case)
        x = rnd(g, 2, 3, *hw)
        y = F.avg_pool2d(x, k, s, p, ceil_mode=ceil, count_include_pad=False)
        c.add(case, {"x": x}, y, g, args=[*k, *s, *p, 1, 1, int(ceil), 1])

    return c.records


# ---- the reference CNN, two SGD steps ------------------------------------------------------------

QBITS = 16


def splitmix64(x):
    """Vectorised splitmix64 finaliser over uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def init_uniform(seed, fan_in, shape):
    """U(-b, b), b = 1/sqrt(fan_in), element i from splitmix64((seed << 32) + i):
    k = top 24 bits, v = float(k - 2^23) * (b * 2^-23) in float32 (one rounding)."""
    n = int(np.prod(shape, dtype=np.int64))
    i = np.arange(n, dtype=np.uint64)
    k = (splitmix64((np.uint64(seed) << np.uint64(32)) + i) >> np.uint64(40)).astype(np.int64)
    bound = np.float32(1.0 / math.sqrt(fan_in))
    scale = np.float32(bound * np.float32(2.0 ** -23))
    v = (k - (1 << 23)).astype(np.float32) * scale
    assert v.dtype == np.float32
    return v.reshape(shape)


def reference_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


def cnn_step():
    torch.manual_seed(1234)
    model = reference_cnn()
    recs = []
    sd = model.state_dict()
    weights = {}  # key -> fan_in for generated entries
    for mname, mod in model.named_modules():
        if isinstance(mod, (nn.Conv2d, nn.Linear)):
            fan_in = mod.weight[0].numel()
            for p in ("weight", "bias"):
                weights["%s.%s" % (mname, p)] = fan_in
    init = {}
    for seed, (key, t) in enumerate(sd.items()):
        if key in weights:
            v = init_uniform(seed, weights[key], tuple(t.shape))
            init[key] = torch.from_numpy(v)
            recs.append(("initgen/" + key, np.array([seed, weights[key]], dtype=np.int64)))
            recs.append(("initsum/" + key, np.array([v.astype(np.float64).sum(),
                                                      np.abs(v.astype(np.float64)).sum()])))
        else:
            init[key] = t.clone()
            recs.append(("init/" + key, init[key]))  # a clone: state_dict() aliases live tensors
    model.load_state_dict(init)
    model.train()

    g = torch.Generator().manual_seed(99)
    x = torch.randn(8, 1, 28, 28, generator=g)
    target = torch.randint(0, 10, (8,), generator=g)
    recs += [("x", x), ("target", target), ("qbits", np.array(QBITS, dtype=np.int64))]

    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    prev_q = {}
    for step in (1, 2):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), target)
        loss.backward()
        opt.step()
        recs.append(("loss%d" % step, loss.detach().reshape(())))
        for key, t in model.state_dict().items():
            if t.dtype == torch.float32:
                d = t.double().numpy() - init[key].double().numpy()
                q = np.round(d * 2.0 ** QBITS).astype(np.int64)
                assert np.abs(q).max() < 2 ** 31
                recs.append(("q%d/%s" % (step, key), (q - prev_q.get(key, 0)).astype(np.int32)))
                prev_q[key] = q
            else:
                recs.append(("step%d/%s" % (step, key), t.clone()))
        print("cnn step %d: loss %.7f" % (step, loss.item()))
    return recs


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(OUT, exist_ok=True)
    write(os.path.join(OUT, "ops.tsg"), op_cases())
    write(os.path.join(OUT, "cnn_step.tsg.gz"), cnn_step(), compress=True)


if __name__ == "__main__":
    main()
