#!/usr/bin/env python3
"""
scripts/gen_zoo_golden.py — torchvision's ResNets as golden values for tests/test_zoo.c.

Needs torch and torchvision (pip: `pip install torch torchvision`; the tests never need them):

    python3 scripts/gen_zoo_golden.py

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
"""
import os
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


def main():
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
