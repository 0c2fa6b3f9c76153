"""bench/python_op_overhead.py — what one op costs when a model's forward is written in Python: a tiny op (add
of two 1-element tensors) and a 64x64 matmul, through tessera from Python (tessera.ops.add(a, b), a + b,
a @ b) beside torch from Python (torch.add, a + b, a @ b) and beside the same call from C
(build/bench_op_overhead, when given). One thread; inputs that do not and that do require grad (then each
call records an autograd node), the best of 7 trials of N calls, in microseconds per call.

usage: PYTHONPATH=build/python python3 bench/python_op_overhead.py [--c build/bench_op_overhead] [--iters N]
"""
import argparse
import json
import os
import subprocess
import timeit

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

import tessera  # noqa: E402
from tessera import ops  # noqa: E402

torch.set_num_threads(1)


def best_us(stmt, iters):
    return min(timeit.repeat(stmt, number=iters, repeat=7)) / iters * 1e6


def run(grad, iters):
    ta1, tb1 = torch.ones(1, requires_grad=grad), torch.ones(1)
    ta64, tb64 = torch.full((64, 64), 0.5, requires_grad=grad), torch.full((64, 64), 0.25)
    sa1, sb1 = tessera.tensor([1.0], requires_grad=grad), tessera.tensor([1.0])
    sa64, sb64 = tessera.tensor(ta64.detach(), requires_grad=grad), tessera.tensor(tb64)
    add, matmul = ops.add, ops.matmul
    rows = [
        ("add, 1 element", "tessera.ops.add(a, b)", best_us(lambda: add(sa1, sb1), iters),
         "torch.add(a, b)", best_us(lambda: torch.add(ta1, tb1), iters)),
        ("add, 1 element", "a + b", best_us(lambda: sa1 + sb1, iters), "a + b", best_us(lambda: ta1 + tb1, iters)),
        ("matmul 64x64", "tessera.ops.matmul(a, b)", best_us(lambda: matmul(sa64, sb64), iters // 10),
         "torch.matmul(a, b)", best_us(lambda: torch.matmul(ta64, tb64), iters // 10)),
        ("matmul 64x64", "a @ b", best_us(lambda: sa64 @ sb64, iters // 10), "a @ b",
         best_us(lambda: ta64 @ tb64, iters // 10)),
    ]
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--c", help="build/bench_op_overhead: the same ops from C")
    ap.add_argument("--iters", type=int, default=20000)
    a = ap.parse_args()
    c = {}
    if a.c:
        out = subprocess.run([a.c, str(a.iters)], capture_output=True, text=True, check=True).stdout
        c = {d["op"]: d["us"] for d in map(json.loads, out.splitlines())}
    print(f"{'op':<16} {'grad':<5} {'tessera from Python':<32} {'torch from Python':<28} {'C (tessera)':>11}")
    for grad in (False, True):
        for op, sname, s_us, tname, t_us in run(grad, a.iters):
            cu = c.get("add_1" if op.startswith("add") else "matmul_64") if not grad else None
            print(f"{op:<16} {'yes' if grad else 'no':<5} {sname:<24} {s_us:6.2f} us  {tname:<20} {t_us:6.2f} us  "
                  f"{'' if cu is None else f'{cu:8.2f} us':>11}")


if __name__ == "__main__":
    main()
