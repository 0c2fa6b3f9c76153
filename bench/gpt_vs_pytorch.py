#!/usr/bin/env python3
"""
bench/gpt_vs_pytorch.py — a GPT-2's training step and its greedy generation, Tessera beside PyTorch on the CPU,
with the machine's physical limit in the same run.

  training step: forward, cross-entropy, backward and AdamW (lr 6e-4, betas 0.9/0.95, weight decay 0.1 on the
    matrices) on B x T random tokens. Tessera: ts_model_gpt through build/bench_gpt, float32 and bfloat16
    (TS_AUTOCAST=bf16). PyTorch: nanoGPT's model definition (model.py: pre-LN blocks, GELU(tanh),
    F.scaled_dot_product_attention(is_causal=True), tied head) with torch.optim.AdamW on the same groups,
    float32 and torch.autocast("cpu", torch.bfloat16).
  limit: the tokens/s the step would reach if every multiply-add of its matrix products (6 x tokens x
    matrix parameters, plus causal attention's 6 B T^2 C per layer) ran at the rate torch.mm reaches on this
    machine with the same threads (the best of 2048 x 384 x 1152, 2048 x 384 x 8192 and 1024^3 products).
  generation: GEN greedy tokens from a one-token prompt with a key/value cache (Tessera's ts_gpt_generate;
    PyTorch: transformers' GPT2LMHeadModel.generate(do_sample=False), whose cache nanoGPT lacks).

usage: .pyvenv-torch/bin/python bench/gpt_vs_pytorch.py [--build build] [--threads 1 2] [--rounds 2]
           [--n-layer 6] [--n-head 6] [--n-embd 384] [--B 8] [--T 256] [--vocab 50257] [--iters 3] [--gen 64]
           [--no-bf16] [--torch-bf16]

Random weights (GPT-2's initialisation), random tokens; the median of ITERS timed steps after a first, untimed
one; best over ROUNDS (the sides alternate, each a fresh process with the same thread count).
"""
import argparse
import os
import re
import subprocess
import sys
import time

import nanogpt  # bench/nanogpt.py: the PyTorch side


def torch_child(a):
    import torch
    torch.manual_seed(1)
    m = nanogpt.build(a.n_layer, a.n_head, a.n_embd, a.vocab, a.T)
    m.train()
    params = [p for p in m.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95))
    x = torch.randint(0, a.vocab, (a.B, a.T))
    t = torch.randint(0, a.vocab, (a.B, a.T))
    res = {}
    for prec in ("fp32", "bf16") if a.torch_bf16 else ("fp32",):
        ms = []
        for _ in range(a.iters + 1):
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=prec == "bf16"):
                _, loss = m(x, t)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            ms.append((time.perf_counter() - t0) * 1e3)
        res[prec] = sorted(ms[1:])[len(ms[1:]) // 2]
    gen = 0.0
    if a.gen:
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=a.n_layer, n_head=a.n_head, n_embd=a.n_embd, n_positions=max(a.T, a.gen + 1),
                         vocab_size=a.vocab, bos_token_id=0, eos_token_id=0, pad_token_id=0)
        g = GPT2LMHeadModel(cfg).eval()
        with torch.no_grad():
            p = torch.zeros(1, 1, dtype=torch.long)
            g0 = time.perf_counter()
            out = g.generate(p, do_sample=False, max_new_tokens=a.gen, min_new_tokens=a.gen,
                             attention_mask=torch.ones_like(p))
            gen = (out.shape[1] - 1) / (time.perf_counter() - g0)
    rate = 0.0
    for (n, k, mm) in ((2048, 384, 1152), (2048, 384, 8192), (1024, 1024, 1024)):
        u, v = torch.randn(n, k), torch.randn(k, mm)
        for _ in range(3):
            t0 = time.perf_counter()
            u @ v
            rate = max(rate, 2 * n * k * mm / (time.perf_counter() - t0))
    print("ms=%.2f bf16_ms=%.2f gen_tok_s=%.1f sgemm_gflops=%.1f torch=%s threads=%d" % (
        res["fp32"], res.get("bf16", 0.0), gen, rate / 1e9, torch.__version__, torch.get_num_threads()))


def run(cmd, env):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("%s failed:\n%s%s" % (" ".join(cmd), out.stdout, out.stderr))
    line = out.stdout.strip().splitlines()[-1]
    return {k: float(v) if re.fullmatch(r"[-+0-9.e]+", v) else v for k, v in re.findall(r"(\w+)=(\S+)", line)}


def step_flops(a):
    matrix_params = 12 * a.n_layer * a.n_embd ** 2 + a.vocab * a.n_embd  # blocks' products and the head
    return 6.0 * a.B * a.T * matrix_params + 6.0 * a.n_layer * a.B * a.T ** 2 * a.n_embd


def one(a, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TS_NUM_THREADS=str(threads))
    env.pop("TS_AUTOCAST", None)
    tess = [os.path.join(a.build, "bench_gpt"), str(a.n_layer), str(a.n_head), str(a.n_embd), str(a.B), str(a.T),
            str(a.vocab), str(a.iters), str(a.gen)]
    tess16 = tess[:-1] + ["0"]
    child = [sys.executable, __file__] + sys.argv[1:] + ["--child", "--threads", str(threads)]  # the last wins
    best = {}
    for _ in range(a.rounds):
        sides = [("tessera", tess, env), ("torch", child, env)]
        if a.bf16:
            sides.insert(1, ("tessera_bf16", tess16, dict(env, TS_AUTOCAST="bf16")))
        for side, cmd, e in sides:
            r = run(cmd, e)
            b = best.get(side)
            if b is None:
                best[side] = r
                continue
            for k in ("ms", "bf16_ms"):
                if k in r and r[k] and (not b.get(k) or r[k] < b[k]):
                    b[k] = r[k]
            for k in ("gen_tok_s", "sgemm_gflops"):
                if k in r:
                    b[k] = max(b.get(k, 0.0), r[k])
    te, to = best["tessera"], best["torch"]
    tok = a.B * a.T
    limit_ms = step_flops(a) / (to["sgemm_gflops"] * 1e9) * 1e3
    rows = [("float32", te["ms"], to["ms"])]
    if a.bf16:
        rows.append(("bfloat16", best["tessera_bf16"]["ms"], to.get("bf16_ms") or float("nan")))
    print("%d thread(s), torch %s; the limit: %.1f GFLOP of products per step at torch.mm's %.1f GFLOP/s" % (
        threads, to["torch"], step_flops(a) / 1e9, to["sgemm_gflops"]))
    for name, t_ms, p_ms in rows:
        print("  step %-9s tessera %9.0f tok/s (%7.0f ms)  pytorch %9.0f tok/s (%7.0f ms)  ratio %.2f   limit %7.0f tok/s"
              "  tessera at %.0f%% of it" % (name, tok / t_ms * 1e3, t_ms, tok / p_ms * 1e3, p_ms, p_ms / t_ms,
                                              tok / limit_ms * 1e3, limit_ms / t_ms * 100))
    if a.bf16:
        print("  bfloat16 / float32 step speed: tessera %.2fx, pytorch %.2fx" % (
            te["ms"] / best["tessera_bf16"]["ms"], to["ms"] / (to.get("bf16_ms") or float("nan"))))
    if a.gen:
        print("  generate (greedy, KV cache) tessera %8.1f tok/s  pytorch %8.1f tok/s  ratio %.2f" % (
            te["gen_tok_s"], to["gen_tok_s"], te["gen_tok_s"] / to["gen_tok_s"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--n-layer", type=int, default=6)
    ap.add_argument("--n-head", type=int, default=6)
    ap.add_argument("--n-embd", type=int, default=384)
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--no-bf16", dest="bf16", action="store_false")
    ap.add_argument("--torch-bf16", action="store_true",
                    help="PyTorch's bfloat16 autocast step too (on CPUs without AVX512_BF16 it runs several times "
                         "slower than its float32: minutes a step at the default size)")
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    if a.child:
        import torch
        torch.set_num_threads(a.threads[0])
        return torch_child(a)
    print("GPT-2 %d layers, %d heads, %d wide, vocabulary %d, B %d x T %d: one training step (forward, "
          "cross-entropy, backward, AdamW)" % (a.n_layer, a.n_head, a.n_embd, a.vocab, a.B, a.T))
    for th in a.threads:
        one(a, th)


if __name__ == "__main__":
    main()
