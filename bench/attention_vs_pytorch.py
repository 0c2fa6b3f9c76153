#!/usr/bin/env python3
"""
bench/attention_vs_pytorch.py — causal scaled-dot-product attention, forward + backward, in Tessera
(ts_scaled_dot_product_attention through build/bench_attention) beside PyTorch's
F.scaled_dot_product_attention on the CPU, with the machine's FLOP limit measured in the same run
(Tessera's sgemm, an N^3 ts_matmul), float32, for T = 256 .. 2048.

usage: .pyvenv-torch/bin/python bench/attention_vs_pytorch.py [--build build] [--threads 2] [--rounds 3]
                                                              [--B 2] [--H 8] [--D 64] [--iters 5]

Each (side, T) runs in a fresh process, rounds alternating the two sides, so every peak-memory figure is
that process's own: the peak resident memory during the first forward + backward beyond what was
resident before it (the inputs allocated; /proc/self/clear_refs resets the high-water mark), and for
Tessera also its allocator's peak. Times: the median of ITERS forward + backward after that first one,
best over the rounds. FLOPs: 4 T^2 D forward + 10 T^2 D backward (which recomputes the scores) per head,
halved for the causal mask; "limit" is that count at the sgemm rate.
"""
import argparse
import os
import re
import subprocess
import sys
import time


def torch_child(T, B, H, D, iters):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(7)
    q, k, v = (torch.rand(B, H, T, D) * 2 - 1 for _ in range(3))
    for t in (q, k, v):
        t.requires_grad_(True)
    g = torch.rand(B, H, T, D) * 2 - 1

    def rss(key):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return float(line.split()[1]) * 1024
        return 0.0

    ms = []
    peak = 0.0
    for i in range(iters + 1):
        if i == 0:
            r0 = rss("VmRSS:")
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        t0 = time.perf_counter()
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(g)
        ms.append((time.perf_counter() - t0) * 1e3)
        if i == 0:
            peak = rss("VmHWM:") - r0
        del out
        for t in (q, k, v):
            t.grad = None
    rest = sorted(ms[1:])
    print("T=%d ms=%.2f peak_rss_mib=%.2f torch=%s threads=%d" % (T, rest[len(rest) // 2], peak / 2**20,
                                                                   torch.__version__, torch.get_num_threads()))


def fields(line):
    return {k: v for k, v in re.findall(r"(\w+)=(\S+)", line)}


def run(cmd, env):
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return fields(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--T", default="256,512,1024,2048")
    ap.add_argument("--torch-child", type=int, default=0)
    a = ap.parse_args()
    if a.torch_child:
        import torch
        torch.set_num_threads(a.threads)
        torch_child(a.torch_child, a.B, a.H, a.D, a.iters)
        return
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    exe = os.path.join(a.build, "bench_attention")
    Ts = [int(t) for t in a.T.split(",")]
    gemm = max(float(run([exe, "gemm", "1024"], env)["gemm_gflops"]) for _ in range(3))
    ours, theirs = {}, {}
    for _ in range(a.rounds):
        for T in Ts:
            o = run([exe, str(T), str(a.B), str(a.H), str(a.D), str(a.iters), "1"], env)
            p = run([sys.executable, __file__, "--torch-child", str(T), "--threads", str(a.threads), "--B", str(a.B),
                     "--H", str(a.H), "--D", str(a.D), "--iters", str(a.iters)], env)
            if T not in ours or float(o["ms"]) < float(ours[T]["ms"]):
                ours[T] = o
            if T not in theirs or float(p["ms"]) < float(theirs[T]["ms"]):
                theirs[T] = p
    gemm = max(gemm, max(float(run([exe, "gemm", "1024"], env)["gemm_gflops"]) for _ in range(3)))
    print("causal attention forward + backward, float32, B %d H %d D %d, %d threads; torch %s; sgemm %.1f GFLOP/s "
          "(1024^3, %s)" % (a.B, a.H, a.D, a.threads, theirs[Ts[0]]["torch"], gemm,
                            run([exe, "gemm", "256"], env)["library"]))
    print("| T | Tessera ms | PyTorch ms | Tessera / PyTorch | limit ms (sgemm rate) | Tessera % of limit | "
          "Tessera peak RSS MiB (allocator) | PyTorch peak RSS MiB | inputs MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for T in Ts:
        o, p = ours[T], theirs[T]
        flops = 14.0 * T * T * a.D * a.B * a.H * 0.5
        limit = flops / gemm / 1e6
        print("| %d | %.1f | %.1f | %.2f | %.1f | %.0f%% | %.1f (%.1f) | %.1f | %.1f |" % (
            T, float(o["ms"]), float(p["ms"]), float(o["ms"]) / float(p["ms"]), limit, 100 * limit / float(o["ms"]),
            float(o["peak_rss_mib"]), float(o["peak_alloc_mib"]), float(p["peak_rss_mib"]), float(o["inputs_mib"])))
    if 1024 in ours and 2048 in ours:
        print("peak RSS growth 1024 -> 2048: Tessera x%.2f, PyTorch x%.2f" % (
            float(ours[2048]["peak_rss_mib"]) / float(ours[1024]["peak_rss_mib"]),
            float(theirs[2048]["peak_rss_mib"]) / max(1e-9, float(theirs[1024]["peak_rss_mib"]))))


if __name__ == "__main__":
    main()
