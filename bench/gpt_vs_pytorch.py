#!/usr/bin/env python3
"""
bench/gpt_vs_pytorch.py — a GPT-2's training forward + backward (logits, cross-entropy, backward) and its greedy
generation, in Tessera (ts_model_gpt and ts_gpt_generate through build/bench_gpt) beside transformers'
GPT2LMHeadModel in PyTorch eager mode (its default attention: F.scaled_dot_product_attention) on the same
config, float32 on the CPU, with the same number of threads. Prints tokens/s of each and the ratio.

usage: .pyvenv-torch/bin/python bench/gpt_vs_pytorch.py [--build build] [--threads 2] [--rounds 2]
           [--n-layer 4] [--n-head 4] [--n-embd 256] [--B 8] [--T 256] [--vocab 8192] [--iters 5] [--gen 128]

Both sides: random weights (GPT-2's initialisation), random tokens; the median of ITERS timed steps after a
first, untimed one; best over ROUNDS (the two sides alternate, each a fresh process). Generation: GEN greedy
tokens from a one-token prompt (transformers: generate(do_sample=False) with its key/value cache).
"""
import argparse
import os
import re
import subprocess
import sys
import time


def torch_child(a):
    import torch
    import torch.nn.functional as F
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(1)
    cfg = GPT2Config(n_layer=a.n_layer, n_head=a.n_head, n_embd=a.n_embd, n_positions=max(a.T, a.gen + 1),
                     vocab_size=a.vocab, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     bos_token_id=0, eos_token_id=0, pad_token_id=0)
    m = GPT2LMHeadModel(cfg)
    m.train()
    x = torch.randint(0, a.vocab, (a.B, a.T))
    t = torch.randint(0, a.vocab, (a.B * a.T,))
    ms = []
    for _ in range(a.iters + 1):
        t0 = time.perf_counter()
        logits = m(input_ids=x).logits
        F.cross_entropy(logits.view(-1, a.vocab), t).backward()
        ms.append((time.perf_counter() - t0) * 1e3)
        m.zero_grad(set_to_none=True)
    rest = sorted(ms[1:])
    med = rest[len(rest) // 2]
    m.eval()
    with torch.no_grad():
        p = torch.zeros(1, 1, dtype=torch.long)
        g0 = time.perf_counter()
        out = m.generate(p, do_sample=False, max_new_tokens=a.gen, min_new_tokens=a.gen,
                         attention_mask=torch.ones_like(p))
        gs = time.perf_counter() - g0
    print("ms=%.2f tok_s=%.0f gen_tok_s=%.1f torch=%s threads=%d" % (
        med, a.B * a.T / med * 1e3, (out.shape[1] - 1) / gs, torch.__version__, torch.get_num_threads()))


def run(cmd, env):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("%s failed:\n%s%s" % (" ".join(cmd), out.stdout, out.stderr))
    line = out.stdout.strip().splitlines()[-1]
    return {k: v for k, v in re.findall(r"(\w+)=(\S+)", line)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=256)
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    if a.child:
        import torch
        torch.set_num_threads(a.threads)
        return torch_child(a)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), TS_NUM_THREADS=str(a.threads))
    tess_cmd = [os.path.join(a.build, "bench_gpt"), str(a.n_layer), str(a.n_head), str(a.n_embd), str(a.B), str(a.T),
                str(a.vocab), str(a.iters), str(a.gen)]
    torch_cmd = [sys.executable, __file__, "--child"] + sys.argv[1:]
    best = {"tessera": None, "torch": None}
    for _ in range(a.rounds):
        for side, cmd in (("tessera", tess_cmd), ("torch", torch_cmd)):
            r = run(cmd, env)
            if best[side] is None or float(r["ms"]) < float(best[side]["ms"]):
                best[side] = dict(r, gen_tok_s=max(float(r["gen_tok_s"]),
                                                   float(best[side]["gen_tok_s"]) if best[side] else 0.0))
    te, to = best["tessera"], best["torch"]
    print("GPT-2 %d layers, %d heads, %d wide, vocab %d, B %d x T %d, float32, %d threads (torch %s)" % (
        a.n_layer, a.n_head, a.n_embd, a.vocab, a.B, a.T, a.threads, to["torch"]))
    print("  forward+backward  tessera %8.1f ms %9.0f tok/s   torch %8.1f ms %9.0f tok/s   ratio %.2f" % (
        float(te["ms"]), float(te["tok_s"]), float(to["ms"]), float(to["tok_s"]), float(te["tok_s"]) / float(to["tok_s"])))
    print("  greedy generate   tessera %8.1f tok/s                torch %8.1f tok/s                ratio %.2f" % (
        float(te["gen_tok_s"]), float(to["gen_tok_s"]), float(te["gen_tok_s"]) / float(to["gen_tok_s"])))


if __name__ == "__main__":
    main()
