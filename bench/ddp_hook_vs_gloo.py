"""bench/ddp_hook_vs_gloo.py — PyTorch DDP (bucket_cap_mb=25) reducing its gradient buckets through
tessera.torch.allreduce_hook against torch's own all-reduce hook over gloo, in one run, on the ranks the
launcher started (bench/ddp_hook_vs_gloo.sh: `tessera run -n 2`).

Each rank trains the same MLP (--layers x Linear(--width, --width): 8 x 1536 x 1536 is 75 MB of float32
gradients, 4 buckets) for --steps steps with each hook in turn, alternating, --rounds times. Both hooks go through
the same timer: per step, the time the group's communication was busy with the buckets (buckets run one after
another in issue order: the sum over buckets of done - max(issued, previous done)), and the step's wall time.
Then each bucket size alone, all-reduced back to back (best of --reps), and the machine's memcpy rate on a buffer
of the largest bucket's size (the memory floor: an all-reduce over shared memory moves every byte at least
once). Rank 0 prints the table."""
import argparse
import statistics
import time

import torch
import torch.distributed as td
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import tessera.distributed as dist
import tessera.torch as tt


class Timed:
    """Wraps a comm hook: records (issued, done) per bucket of the current step."""

    def __init__(self, hook, state):
        self.hook, self.state, self.events = hook, state, []

    def comm_hook(self, state, bucket):
        i = len(self.events)
        self.events.append([time.perf_counter(), None, bucket.buffer().numel() * 4])
        fut = self.hook(self.state, bucket)

        def done(f):
            self.events[i][1] = time.perf_counter()
            return f.value()
        return fut.then(done)

    def busy(self):
        t, prev = 0.0, 0.0
        for issued, done, _ in self.events:
            start = max(issued, prev)
            t += done - start
            prev = done
        return t


def model(args):
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def run(args, name, timer):
    ddp = torch.nn.parallel.DistributedDataParallel(model(args), bucket_cap_mb=25)
    ddp.register_comm_hook(None, timer.comm_hook)
    x = torch.randn(args.batch, args.width)
    busy, wall = [], []
    for step in range(args.warmup + args.steps):
        timer.events = []
        t0 = time.perf_counter()
        ddp(x).square().mean().backward()
        t1 = time.perf_counter()
        if step >= args.warmup:
            busy.append(timer.busy())
            wall.append(t1 - t0)
    sizes = [e[2] for e in timer.events]
    return busy, wall, sizes


def alone(nbytes, reps, g):
    t = torch.ones(nbytes // 4)
    best_ts = best_gloo = 1e9
    for _ in range(reps):
        td.barrier()
        t0 = time.perf_counter()
        g.all_reduce(t, "avg")
        best_ts = min(best_ts, time.perf_counter() - t0)
        td.barrier()
        t0 = time.perf_counter()
        td.all_reduce(t)
        t.div_(2)
        best_gloo = min(best_gloo, time.perf_counter() - t0)
    return best_ts, best_gloo


def memcpy_gbs(nbytes, reps):
    a, b = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
    best = 1e9
    for _ in range(reps):
        t0 = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=1536)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    g = tt.init_process_group("gloo")
    torch.set_num_threads(1)
    res = {"tessera": ([], []), "gloo": ([], [])}
    sizes = []
    for _ in range(args.rounds):
        for name, timer in (("tessera", Timed(tt.allreduce_hook, g)), ("gloo", Timed(default_hooks.allreduce_hook, None))):
            busy, wall, sizes = run(args, name, timer)
            res[name][0].extend(busy)
            res[name][1].extend(wall)
    per_size = {s: alone(s, args.reps, g) for s in sorted(set(sizes))}
    gbs = memcpy_gbs(max(sizes), args.reps)
    if g.rank != 0:
        return
    mb = sum(sizes) / 2**20
    print(f"DDP, 2 ranks, {g.links}; model {args.layers} x Linear({args.width}, {args.width}): {mb:.1f} MiB of "
          f"gradients in {len(sizes)} buckets of {', '.join(f'{s / 2**20:.1f}' for s in sizes)} MiB; "
          f"torch {torch.__version__}")
    tb, gb = min(res["tessera"][0]), min(res["gloo"][0])
    print(f"{'per step (best of ' + str(len(res['gloo'][0])) + ')':34} {'tessera hook':>13} {'gloo hook':>11} "
          f"{'ratio':>7}")
    print(f"{'bucket all-reduce busy time, ms':34} {tb * 1e3:13.2f} {gb * 1e3:11.2f} {tb / gb:7.2f}")
    tm, gm = statistics.median(res["tessera"][0]), statistics.median(res["gloo"][0])
    print(f"{'  median, ms':34} {tm * 1e3:13.2f} {gm * 1e3:11.2f} {tm / gm:7.2f}")
    tw, gw = min(res["tessera"][1]), min(res["gloo"][1])
    print(f"{'forward + backward wall time, ms':34} {tw * 1e3:13.2f} {gw * 1e3:11.2f} {tw / gw:7.2f}")
    for s, (a, b) in per_size.items():
        floor = s / (gbs * 1e9)
        print(f"{f'one {s / 2**20:.1f} MiB all-reduce alone, ms':34} {a * 1e3:13.2f} {b * 1e3:11.2f} {a / b:7.2f}"
              f"   (memcpy of it: {floor * 1e3:.2f} ms)")
    print(f"memcpy: {gbs:.1f} GB/s")


if __name__ == "__main__":
    main()
