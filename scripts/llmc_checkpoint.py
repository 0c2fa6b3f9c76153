#!/usr/bin/env python3
"""A GPT-2 safetensors file in Hugging Face's names (what ts_gpt_save_safetensors and save_pretrained write)
as llm.c's float32 checkpoint (what its train_gpt2.py write_model writes and train_gpt2.c's
gpt2_build_from_checkpoint reads).

usage: llmc_checkpoint.py IN.safetensors OUT.bin [--heads N]

llm.c's file: a header of 256 int32 -- [0] the magic 20240326, [1] the version 3 (float32, padded vocabulary),
[2] maxT (the positions), [3] V, [4] L, [5] NH, [6] C, [7] Vp (V rounded up to a multiple of 128), the rest 0 --
then the float32 parameters in llm.c's order, each layer's tensor of a kind one after another:
    wte (Vp, C; rows V .. Vp-1 zero), wpe (maxT, C), ln1w, ln1b (L, C), qkvw (L, 3C, C), qkvb (L, 3C),
    attprojw (L, C, C), attprojb, ln2w, ln2b (L, C), fcw (L, 4C, C), fcb (L, 4C), fcprojw (L, C, 4C), fcprojb (L, C),
    lnfw, lnfb (C).
llm.c's matmul weights are (out, in): the transpose of GPT-2's Conv1D (in, out). The safetensors file does not
hold the head count: pass --heads (default: C / 64, GPT-2's head width).
"""
import argparse
import sys

import numpy as np
from safetensors.numpy import load_file

MAGIC, VERSION_F32, HEADER_INTS = 20240326, 3, 256


def padded_vocab(v, multiple=128):
    return (v + multiple - 1) // multiple * multiple


def llmc_tensors(sd, n_layer):
    """The parameters in llm.c's order, float32, in llm.c's layouts (wte not yet padded)."""
    def get(name):
        for key in (name, name[len("transformer."):]):  # GPT2Model's files have no "transformer." prefix
            if key in sd:
                return np.asarray(sd[key], dtype=np.float32)
        raise KeyError(f"llmc_checkpoint: no tensor {name}")

    def layers(suffix, transpose=False):
        ts = [get(f"transformer.h.{i}.{suffix}") for i in range(n_layer)]
        return [np.ascontiguousarray(t.T) if transpose else t for t in ts]

    out = [get("transformer.wte.weight"), get("transformer.wpe.weight")]
    for suffix, tr in (("ln_1.weight", False), ("ln_1.bias", False), ("attn.c_attn.weight", True),
                       ("attn.c_attn.bias", False), ("attn.c_proj.weight", True), ("attn.c_proj.bias", False),
                       ("ln_2.weight", False), ("ln_2.bias", False), ("mlp.c_fc.weight", True),
                       ("mlp.c_fc.bias", False), ("mlp.c_proj.weight", True), ("mlp.c_proj.bias", False)):
        out += layers(suffix, tr)
    out += [get("transformer.ln_f.weight"), get("transformer.ln_f.bias")]
    return out


def convert(src, dst, n_head=0):
    sd = load_file(src)
    if "lm_head.weight" in sd and not np.array_equal(sd["lm_head.weight"], sd.get("transformer.wte.weight")):
        raise ValueError("llmc_checkpoint: lm_head.weight differs from wte: llm.c ties them")
    keys = [k[len("transformer."):] if k.startswith("transformer.") else k for k in sd]
    n_layer = 1 + max(int(k.split(".")[1]) for k in keys if k.startswith("h."))
    tensors = llmc_tensors(sd, n_layer)
    wte, wpe = tensors[0], tensors[1]
    V, C = wte.shape
    maxT = wpe.shape[0]
    n_head = n_head or max(1, C // 64)
    if C % n_head:
        raise ValueError(f"llmc_checkpoint: {n_head} heads do not divide the width {C}")
    Vp = padded_vocab(V)
    tensors[0] = np.concatenate([wte, np.zeros((Vp - V, C), np.float32)])
    header = np.zeros(HEADER_INTS, np.int32)
    header[:8] = [MAGIC, VERSION_F32, maxT, V, n_layer, n_head, C, Vp]
    with open(dst, "wb") as f:
        f.write(header.astype("<i4").tobytes())
        for t in tensors:
            f.write(np.ascontiguousarray(t, dtype="<f4").tobytes())
    return dict(maxT=maxT, V=V, Vp=Vp, L=n_layer, NH=n_head, C=C, params=sum(t.size for t in tensors))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", help="GPT-2 safetensors (Hugging Face names)")
    ap.add_argument("dst", help="llm.c checkpoint to write")
    ap.add_argument("--heads", type=int, default=0, help="attention heads (default: width / 64)")
    a = ap.parse_args(argv)
    try:
        info = convert(a.src, a.dst, a.heads)
    except (KeyError, ValueError, OSError) as e:
        print(e.args[0] if isinstance(e, KeyError) else e, file=sys.stderr)
        return 1
    print(" ".join(f"{k}={v}" for k, v in info.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
