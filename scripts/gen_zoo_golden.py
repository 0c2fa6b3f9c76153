#!/usr/bin/env python3
"""
scripts/gen_zoo_golden.py — torchvision's ResNets as golden values for tests/test_zoo.c.

Needs torch and torchvision (pip: `pip install torch torchvision`; the tests never need them):

    python3 scripts/gen_zoo_golden.py            # write the file
    python3 scripts/gen_zoo_golden.py --float64  # check it: resnet18's pass in float64 (below)

Writes tests/golden/zoo.tsg.gz (the TSG1 format of scripts/gen_golden.py / tests/golden_io.h):

  "version/torch", "version/torchvision"   the packages that made the file (u8 strings as i64 codes)
  "shape/<model>/<key>" (i64)              the shape of every state-dict entry of
                                           torchvision.models.<model>(num_classes=10), in state_dict order;
                                           "order/<model>" (i64) = the number of keys
  "fwd/<model>/...":                       a forward (and for resnet18 a backward) pass on weights both
                                           sides generate bit for bit: every conv/linear weight and bias
                                           = init_uniform(seed, fan_in) (seed = the key's index in the
                                           state dict), BatchNorm weight = 1 + init_uniform(seed, 16)/2,
                                           bias = init_uniform(seed, 16), running stats at their defaults.
      xshape = (N, 3, S, S): x = 2 * init_uniform(1000, 1) (U(-2, 2)), target (N): inputs; logits_train, loss: the training-mode forward;
      gsum/<key>, gabs/<key> (f32): sum and sum of |.| of each parameter's gradient (resnet18);
      logits_eval: eval mode after the training forward updated the running statistics.

--float64 writes nothing: it runs resnet18's pass of the file in float64 and prints how far the stored
gradient sums and this machine's torch float32 ones are from it, in tests/test_zoo.c's measure
(|sum - sum64| / sum |g64|), and every ReLU input within 1e-5 of zero in float64 with its float32 value: one
that float32 rounding puts on the other side passes (or stops) its gradient, which moves every gradient
below it by a few percent (see test_zoo.c's GRAD_TOL).
"""
import gzip
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_golden import init_uniform, write  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
XSEED = 1000
OUT = os.path.join(ROOT, "tests", "golden", "zoo.tsg.gz")


def text(s):
    return np.frombuffer(s.encode(), dtype=np.uint8).astype(np.int64)


def det_init(model):
    sd = model.state_dict()
    fan = {}
    bn = set()
    for mname, mod in model.named_modules():
        if isinstance(mod, (nn.Conv2d, nn.Linear)):
            for p in ("weight", "bias"):
                fan["%s.%s" % (mname, p)] = mod.weight[0].numel()
        if isinstance(mod, nn.BatchNorm2d):
            bn.add(mname + ".weight")
            bn.add(mname + ".bias")
    init = {}
    for seed, (key, t) in enumerate(sd.items()):
        if key in fan:
            init[key] = torch.from_numpy(init_uniform(seed, fan[key], tuple(t.shape)))
        elif key in bn:
            v = init_uniform(seed, 16, tuple(t.shape))
            init[key] = torch.from_numpy(1 + v * np.float32(0.5) if key.endswith("weight") else v)
        else:
            init[key] = t.clone()
    model.load_state_dict(init)


def read_tsg(path):
    """The records of a TSG1 file (gzip'd or not) as a dict name -> numpy array."""
    with open(path, "rb") as f:
        b = f.read()
    if b[:2] == b"\x1f\x8b":
        b = gzip.decompress(b)
    assert b[:8] == b"TSGOLD1\n", path
    (n,), o, out = struct.unpack_from("<I", b, 8), 12, {}
    for _ in range(n):
        (ln,) = struct.unpack_from("<I", b, o)
        name = b[o + 4:o + 4 + ln].decode()
        code, nd = struct.unpack_from("<BI", b, o + 4 + ln)
        o += 9 + ln
        shape = struct.unpack_from("<%dq" % nd, b, o)
        o += 8 * nd
        a = np.frombuffer(b, dtype={0: "<f4", 3: "<i8", 4: "<i4"}[code], count=int(np.prod(shape)), offset=o)
        out[name] = a.reshape(shape)
        o += a.nbytes
    return out


def resnet18_pass(dtype, target):
    """The file's resnet18 training forward + backward in dtype: (gradients by name, [(ReLU call, its input)])."""
    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=10)
    det_init(m)
    x = torch.from_numpy(init_uniform(XSEED, 1, (4, 3, 64, 64)) * np.float32(2))
    m, x = m.to(dtype), x.to(dtype)
    relu_in = []

    def hook(name):  # inplace ReLUs: a pre-hook sees the input before it is overwritten
        return lambda _m, inp: relu_in.append(("%s call %d" % (name, sum(n.startswith(name + " ") for n, _ in relu_in) + 1),
                                               inp[0].detach().double().flatten().clone()))

    for name, mod in m.named_modules():
        if isinstance(mod, nn.ReLU):
            mod.register_forward_pre_hook(hook(name))
    m.train()
    F.cross_entropy(m(x), target).backward()
    return {k: p.grad.double() for k, p in m.named_parameters()}, relu_in


def check_float64():
    torch.set_num_threads(1)
    gold = read_tsg(OUT)
    target = torch.from_numpy(gold["fwd/resnet18/target"].copy())
    g64, r64 = resnet18_pass(torch.float64, target)
    g32, r32 = resnet18_pass(torch.float32, target)

    def worst(sums):  # test_zoo.c's measure, over both sums of every parameter
        w = (0.0, "")
        for k, g in g64.items():
            a = g.abs().sum().item()
            s, sa = sums(k)
            w = max(w, (abs(s - g.sum().item()) / a, k), (abs(sa - a) / a, k + " (|g| sum)"))
        return w

    print("float64 vs the stored sums (torch %s): %.2e at %s" % (
        "".join(map(chr, gold["version/torch"])),
        *worst(lambda k: (gold["fwd/resnet18/gsum/" + k].item(), gold["fwd/resnet18/gabs/" + k].item()))))
    print("float64 vs torch %s float32 here: %.2e at %s" % (
        torch.__version__, *worst(lambda k: (g32[k].sum().item(), g32[k].abs().sum().item()))))
    print("ReLU inputs within 1e-5 of zero (of %d), float64 -> float32 here:" % sum(t.numel() for _, t in r64))
    for (name, a64), (_, a32) in zip(r64, r32):
        for i in (a64.abs() < 1e-5).nonzero().flatten().tolist():
            flip = (a64[i] > 0) != (a32[i] > 0)
            print("  %s, element %d: %.3e -> %.3e%s" % (name, i, a64[i], a32[i], "  (other side)" if flip else ""))


def main():
    if "--float64" in sys.argv[1:]:
        check_float64()
        return
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    recs = [("version/torch", text(torch.__version__)), ("version/torchvision", text(torchvision.__version__))]
    for name in ("resnet18", "resnet34", "resnet50"):
        m = getattr(torchvision.models, name)(num_classes=10)
        sd = m.state_dict()
        recs.append(("order/" + name, np.array(len(sd), dtype=np.int64)))
        for k, t in sd.items():
            recs.append(("shape/%s/%s" % (name, k), np.array(list(t.shape), dtype=np.int64)))
    for name, n, size in (("resnet18", 4, 64), ("resnet50", 2, 64)):
        torch.manual_seed(0)
        m = getattr(torchvision.models, name)(num_classes=10)
        det_init(m)
        g = torch.Generator().manual_seed(7)
        x = torch.from_numpy(init_uniform(XSEED, 1, (n, 3, size, size)) * np.float32(2))
        target = torch.randint(0, 10, (n,), generator=g)
        p = "fwd/%s/" % name
        recs += [(p + "xshape", np.array([n, 3, size, size], dtype=np.int64)), (p + "target", target)]
        m.train()
        logits = m(x)
        loss = F.cross_entropy(logits, target)
        recs += [(p + "logits_train", logits.detach()), (p + "loss", loss.detach().reshape(()))]
        if name == "resnet18":
            loss.backward()
            for k, prm in m.named_parameters():
                gr = prm.grad.double()
                recs.append((p + "gsum/" + k, np.array(gr.sum().item(), dtype=np.float32)))
                recs.append((p + "gabs/" + k, np.array(gr.abs().sum().item(), dtype=np.float32)))
        m.eval()
        with torch.no_grad():
            recs.append((p + "logits_eval", m(x)))
        print("%s: loss %.6f" % (name, loss.item()))
    write(OUT, recs, compress=True)
    print("wrote", OUT, "torch", torch.__version__, "torchvision", torchvision.__version__)


if __name__ == "__main__":
    main()
