#!/usr/bin/env python3
"""
bench/gpt_memory.py — the peak resident memory of a GPT-2 training forward + backward (logits, cross-entropy,
backward), float32 on the CPU, at T = 1024 and 2048: Tessera (ts_model_gpt through build/bench_gpt_memory)
beside the same model written as nanoGPT writes it in PyTorch (pre-LN blocks, CausalSelfAttention on
F.scaled_dot_product_attention(is_causal=True), an MLP with GELU(tanh), the lm_head tied to wte, no dropout).

usage: .pyvenv-torch/bin/python bench/gpt_memory.py [--build build] [--threads 2] [--n-layer 6] [--n-head 6]
           [--n-embd 384] [--vocab 50257] [--block 2048] [--fixed-b 2] [--tokens 4096] [--T 1024,2048]

Every (side, B, T) runs in a fresh process: one warm-up step, the gradients freed, then the measured step, whose
peak is VmHWM after /proc/self/clear_refs reset it (see bench/gpt_memory.c for each key). "activations" is that
peak minus the resident size right after the model was built minus the gradients' bytes: the peak minus the
parameters' share (parameters + gradients) and minus the program's own resident size, which has nothing to do
with T. Two readings of "memory at 2048 against 1024":
  (a) the same batch B (--fixed-b): twice the tokens, so everything outside attention doubles; a flash-style
      attention adds nothing beyond that, so the ratio is about 2 and ratio / 2 ("beyond linear") about 1;
  (b) the same tokens per batch (--tokens, B = tokens / T): a (B, H, T, T) attention matrix would double,
      everything else stays; the ratio should be about 1 (goal <= 1.3).
"""
import argparse
import os
import re
import resource
import subprocess
import sys

import nanogpt  # bench/nanogpt.py: the PyTorch side


def rss(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return float(line.split()[1]) * 1024
    return -1.0


def torch_child(a, B, T):
    import torch

    torch.set_num_threads(a.threads)
    V = a.vocab
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, V, (B, T), generator=g)
    y = torch.randint(0, V, (B, T), generator=g)
    base = rss("VmRSS:")
    model = nanogpt.build(a.n_layer, a.n_head, a.n_embd, V, a.block)
    model_rss = rss("VmRSS:")
    n = sum(p.numel() for p in model.parameters())
    params = n * 4.0
    logits, loss = model(x, y)  # the warm-up
    loss.backward()
    del logits, loss
    model.zero_grad(set_to_none=True)
    pre = rss("VmRSS:")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    logits, loss = model(x, y)
    loss.backward()
    peak = rss("VmHWM:")
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0
    M = 2.0 ** 20
    print("B=%d T=%d params_n=%d threads=%d torch=%s base_rss=%.1f model_rss=%.1f pre_rss=%.1f params=%.1f grads=%.1f "
          "param_share=%.1f peak_rss=%.1f maxrss=%.1f step=%.1f act=%.1f" % (
              B, T, n, torch.get_num_threads(), torch.__version__, base / M, model_rss / M, pre / M, params / M,
              params / M, 2 * params / M, peak / M, maxrss / M, (peak - model_rss) / M,
              (peak - model_rss - params) / M))


def fields(line):
    return {k: v for k, v in re.findall(r"(\w+)=(\S+)", line)}


def run(cmd, env):
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return fields(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-layer", type=int, default=6)
    ap.add_argument("--n-head", type=int, default=6)
    ap.add_argument("--n-embd", type=int, default=384)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--block", type=int, default=2048, help="the model's context (wpe rows), the same at every T")
    ap.add_argument("--fixed-b", type=int, default=2, help="B of reading (a)")
    ap.add_argument("--tokens", type=int, default=4096, help="B x T of reading (b)")
    ap.add_argument("--T", default="1024,2048")
    ap.add_argument("--torch-child", default="")
    a = ap.parse_args()
    if a.torch_child:
        B, T = (int(s) for s in a.torch_child.split(","))
        torch_child(a, B, T)
        return
    Ts = [int(t) for t in a.T.split(",")]
    t_lo, t_hi = Ts[0], Ts[-1]
    runs = sorted({(a.fixed_b, T) for T in Ts} | {(a.tokens // T, T) for T in Ts}, key=lambda bt: (bt[1], bt[0]))
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    exe = os.path.join(a.build, "bench_gpt_memory")
    res = {}
    for B, T in runs:
        res["Tessera", B, T] = run([exe, str(a.n_layer), str(a.n_head), str(a.n_embd), str(B), str(T), str(a.vocab),
                                    str(a.block)], env)
        res["PyTorch", B, T] = run([sys.executable, __file__, "--torch-child", "%d,%d" % (B, T), "--threads",
                                    str(a.threads), "--n-layer", str(a.n_layer), "--n-head", str(a.n_head),
                                    "--n-embd", str(a.n_embd), "--vocab", str(a.vocab), "--block", str(a.block)], env)
    f = lambda side, B, T, k: float(res[side, B, T][k])  # noqa: E731
    tv = res["PyTorch", runs[0][0], runs[0][1]]["torch"]
    print("GPT-2 %d layers, %d heads, %d wide, vocabulary %d, context %d (%s parameters), float32 forward + "
          "cross-entropy + backward, %d threads; torch %s" % (a.n_layer, a.n_head, a.n_embd, a.vocab, a.block,
                                                              res["Tessera", runs[0][0], runs[0][1]]["params_n"],
                                                              a.threads, tv))
    print("| side | B | T | tokens | logits MiB | peak RSS MiB | RSS after build | params + grads | activations "
          "(peak - build - grads) | Tessera's allocator: after forward / peak - grads |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for side in ("Tessera", "PyTorch"):
        for B, T in runs:
            r = res[side, B, T]
            alloc = "%.0f / %.0f" % (float(r["alloc_fwd"]), float(r["alloc_act"])) if "alloc_act" in r else "-"
            print("| %s | %d | %d | %d | %.0f | %.0f | %.0f | %.0f | %.0f | %s |" % (
                side, B, T, B * T, B * T * a.vocab * 4 / 2.0 ** 20, f(side, B, T, "peak_rss"),
                f(side, B, T, "model_rss"), f(side, B, T, "param_share"), f(side, B, T, "act"), alloc))
    readings = (("(a) B %d" % a.fixed_b, (a.fixed_b, t_lo), (a.fixed_b, t_hi)),
                ("(b) %d tokens" % a.tokens, (a.tokens // t_lo, t_lo), (a.tokens // t_hi, t_hi)))
    print("\n| reading | side | activations %d -> %d MiB | ratio | ratio / 2 (beyond linear) | (peak RSS - params "
          "- grads) ratio |" % (t_lo, t_hi))
    print("|---|---|---|---|---|---|")
    for name, lo, hi in readings:
        for side in ("Tessera", "PyTorch"):
            act0, act1 = f(side, *lo, "act"), f(side, *hi, "act")
            raw0 = f(side, *lo, "peak_rss") - f(side, *lo, "param_share")
            raw1 = f(side, *hi, "peak_rss") - f(side, *hi, "param_share")
            beyond = "%.2f" % (act1 / act0 / 2) if lo[0] == hi[0] else "-"
            print("| %s | %s | %.0f -> %.0f | %.2f | %s | %.2f |" % (name, side, act0, act1, act1 / act0, beyond,
                                                                    raw1 / raw0))


if __name__ == "__main__":
    main()
