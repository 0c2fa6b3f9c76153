"""tests/python/test_distributed.py: tessera.distributed and tessera.torch on 2 real processes — collectives in
place on torch tensors and NumPy arrays, async Work, bad input as exceptions that leave the group usable, the
sampler index for index against torch's DistributedSampler, DDP with tessera.torch.allreduce_hook against DDP
over gloo (20 steps, parameters within 1e-6), a rank that dies mid-collective and mid-hook (the other raises
naming it, no hang), Ctrl-C in a collective whose peer never comes (KeyboardInterrupt promptly, and the peer
then fails naming the interrupted rank). The ranks are this file run again with RANK / WORLD_SIZE /
MASTER_ADDR / MASTER_PORT set (the launcher's variables by hand); the collectives also run under
`tessera run -n 2` when the build tree's tessera command is beside the package."""
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time

import torch

try:
    import numpy as np
except ImportError:  # pip's torch 2.x without NumPy: the NumPy checks are skipped
    np = None

import tessera
import tessera.distributed as dist
from testutil import check


def expect(exc, fn, *words):
    """fn() raises exc whose message holds every word; returns the message."""
    try:
        fn()
    except exc as e:
        msg = str(e)
        check(all(w in msg for w in words), f"{type(e).__name__}: {msg}")
        return msg
    except BaseException as e:  # noqa: B902
        check(False, f"expected {exc.__name__}, got {type(e).__name__}: {e}")
    check(False, f"expected {exc.__name__}, nothing raised")


# ---- the ranks' parts ----------------------------------------------------------------------------------------

def rank_collectives():
    g = dist.init()
    r, w = dist.get_rank(), dist.get_world_size()
    check(dist.is_initialized() and dist.init() is g and g.world_size == 2 and g.backend == "builtin",
          f"init() from the environment, idempotent: {g!r}, {g.links}")
    x = torch.full((1000,), float(r + 1))
    p = x.data_ptr()
    dist.all_reduce(x)
    check(x.data_ptr() == p and bool((x == 3).all()), "all_reduce(torch) sum, in place")
    m = torch.full((3,), float(r))
    dist.all_reduce(m, op=torch.distributed.ReduceOp.MIN)
    check(m.tolist() == [0, 0, 0], "op=torch.distributed.ReduceOp.MIN")
    v = torch.full((4,), 2.0 * (r + 1))
    dist.all_reduce(v, op="avg")
    check(v.tolist() == [3.0] * 4, "all_reduce avg")
    big = torch.full((1 << 20,), float(r + 1))
    dist.all_reduce(big)
    check(bool((big == 3).all()), "all_reduce of 4 MiB (the ring)")
    b = torch.arange(5, dtype=torch.int64) * (r + 1)
    pb = b.data_ptr()
    dist.broadcast(b, src=1)
    check(b.data_ptr() == pb and b.tolist() == [0, 2, 4, 6, 8], "broadcast(int64 torch, src=1) in place")
    out = torch.zeros(2, 3)
    po = out.data_ptr()
    dist.all_gather(out, torch.full((3,), float(r + 10)))
    check(out.data_ptr() == po and out.tolist() == [[10] * 3, [11] * 3], "all_gather into a (2, 3) tensor")
    parts = [torch.zeros(2), torch.zeros(2)]
    dist.all_gather(parts, torch.full((2,), float(r)))
    check([t.tolist() for t in parts] == [[0, 0], [1, 1]], "all_gather into a list (torch's form)")
    o = torch.zeros(2)
    dist.reduce_scatter(o, torch.arange(4.0) * (r + 1))
    check(o.tolist() == ([0, 3] if r == 0 else [6, 9]), f"reduce_scatter sum: rank {r} gets block {r}")
    if np is not None:
        numpy_collectives(r)
    dist.barrier()
    check(True, "barrier")
    y = torch.ones(1 << 16)
    work = dist.all_reduce(y, async_op=True)
    check(isinstance(work, dist.Work), "async_op=True: a Work")
    work.wait()
    work.wait()
    check(work.is_completed() and bool((y == 2).all()), "Work.wait(), is_completed(), the result in place")
    works = [g.all_reduce(torch.full((8,), float(i)), async_op=True) for i in range(5)]
    for wk in works:
        wk.wait()
    check(True, "5 async all_reduces in flight, waited in order")

    # bad input: exceptions naming what is wrong; nothing is queued, the group stays usable
    expect(tessera.DtypeError, lambda: dist.all_reduce(torch.ones(3, dtype=torch.int64)), "float32", "int64")
    expect(tessera.Error, lambda: dist.all_reduce(torch.ones(3, dtype=torch.float64)), "all_reduce", "tensor",
           "float64")
    expect(tessera.ArgumentError, lambda: dist.all_reduce(torch.ones(4, 4).t()), "not contiguous")
    expect(tessera.ArgumentError, lambda: dist.all_reduce(torch.ones(3), op="prod"), "prod", "sum, avg, max")
    expect(tessera.ArgumentError, lambda: dist.broadcast(torch.ones(3), src=2), "root 2", "world size 2")
    expect(tessera.ShapeError, lambda: dist.all_gather(torch.zeros(5), torch.zeros(3)), "all_gather", "expected")
    expect(tessera.DtypeError, lambda: dist.all_gather(torch.zeros(6), torch.zeros(3, dtype=torch.int32)),
           "all_gather")
    expect(tessera.ShapeError, lambda: dist.reduce_scatter(torch.zeros(2), torch.zeros(3)), "reduce_scatter")
    expect(TypeError, lambda: dist.all_reduce([1.0, 2.0]), "all_reduce", "tensor", "__dlpack__")
    expect(tessera.Error, lambda: dist.all_gather(torch.zeros(6), torch.zeros(3, dtype=torch.float64)), "input")
    z = torch.full((2,), float(r + 1))
    dist.all_reduce(z)
    check(z.tolist() == [3, 3], "after the bad calls the group still reduces")
    dist.destroy()
    check(not dist.is_initialized(), "destroy()")
    expect(tessera.DistributedError, lambda: dist.get_rank(), "not initialized")
    expect(tessera.DistributedError, lambda: g.all_reduce(torch.ones(1)), "closed")


def numpy_collectives(r):
    """The same collectives on NumPy arrays, in place."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3) * (r + 1)
    pa = a.ctypes.data
    dist.all_reduce(a, op="max")
    check(a.ctypes.data == pa and a.tolist() == (np.arange(6).reshape(2, 3) * 2).tolist(), "all_reduce(numpy) max")
    nb = np.full(3, r, dtype=np.uint8)
    dist.broadcast(nb, 0)
    check(nb.tolist() == [0, 0, 0], "broadcast(numpy uint8)")
    ng = np.zeros(4, dtype=np.float32)
    dist.all_gather(ng, np.full(2, r + 1, dtype=np.float32))
    check(ng.tolist() == [1, 1, 2, 2], "all_gather(numpy)")
    no = np.zeros(1, dtype=np.float32)
    dist.reduce_scatter(no, np.array([r, -r], dtype=np.float32), op="min")
    check(no.tolist() == [0 if r == 0 else -1], "reduce_scatter(numpy) min")
    expect(tessera.ArgumentError, lambda: dist.all_reduce(np.ones((4, 4), dtype=np.float32)[:, ::2]),
           "not contiguous")
    ro = np.ones(3, dtype=np.float32)
    ro.flags.writeable = False
    expect(Exception, lambda: dist.all_reduce(ro), "all_reduce", "tensor")


def ddp_params(hook, steps=20):
    """20 SGD steps of DDP over a small MLP, each rank its own data; the parameters after."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                              torch.nn.Linear(64, 4))
    model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.01)  # several buckets
    calls = []
    if hook:
        import tessera.torch as tt

        def counting(state, bucket):
            calls.append(1)
            return tt.allreduce_hook(state, bucket)

        model.register_comm_hook(None, counting)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    for _ in range(steps):
        x = torch.randn(16, 32, generator=gen)
        y = torch.randn(16, 4, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()], len(calls)


def rank_ddp():
    import tessera.torch as tt
    g = tt.init_process_group("gloo")
    check(torch.distributed.is_initialized() and torch.distributed.get_world_size() == 2 and g.world_size == 2,
          "tessera.torch.init_process_group: tessera's group and torch's gloo group")
    ref, _ = ddp_params(hook=False)
    ours, calls = ddp_params(hook=True)
    diff = max(float((a - b).abs().max()) for a, b in zip(ref, ours))
    check(calls >= 20, f"DDP reduced its buckets through tessera's hook ({calls} calls in 20 steps)")
    check(diff <= 1e-6, f"DDP + tessera hook vs DDP + gloo after 20 steps: max |difference| {diff:.2e} <= 1e-6")
    flat = torch.cat([p.flatten() for p in ours])
    other = torch.zeros(2 * flat.numel())
    dist.all_gather(other, flat)
    check(torch.equal(other[:flat.numel()], other[flat.numel():]), "both ranks hold the same parameters")
    expect(tessera.DtypeError, lambda: tt.allreduce_hook(None, _Bucket(torch.ones(3, dtype=torch.int64))),
           "float32")


class _Bucket:
    def __init__(self, t):
        self.t = t

    def buffer(self):
        return self.t


def rank_dies():
    g = dist.init(heartbeat_timeout=3)
    x = torch.ones(1 << 22)  # 16 MiB: the ring, several chunks
    dist.all_reduce(x)
    if g.rank == 1:  # dies while rank 0 waits in the next all_reduce
        time.sleep(0.5)
        os._exit(3)
    t0 = time.monotonic()
    expect(tessera.Error, lambda: dist.all_reduce(x), "rank 1")
    dt = time.monotonic() - t0
    check(dt < 10, f"rank 0 raised {dt:.1f} s after entering the all_reduce (peer died at 0.5 s; heartbeat 3 s)")
    expect(tessera.Error, lambda: dist.barrier(), "aborted")


def rank_dies_in_hook():
    import tessera.torch as tt
    g = tt.init_process_group("gloo", heartbeat_timeout=3)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Tanh(), torch.nn.Linear(512, 4))
    model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.25)
    model.register_comm_hook(g, tt.allreduce_hook)
    x, y = torch.randn(8, 256), torch.randn(8, 4)
    for step in range(3):
        if step == 2 and g.rank == 1:
            os._exit(3)
        t0 = time.monotonic()
        try:
            torch.nn.functional.mse_loss(model(x), y).backward()
        except Exception as e:  # noqa: B902 — DDP passes the future's error on (a RuntimeError in torch)
            check(step == 2 and "rank 1" in str(e) and "DistributedError" in str(e),
                  f"backward raised naming the dead rank: {str(e)[:300]}")
            check(time.monotonic() - t0 < 10, "within the heartbeat timeout, no hang")
            return
    check(False, "backward with a dead peer raised")


def rank_sigint(flag):
    g = dist.init()
    x = torch.ones(1000)
    dist.all_reduce(x)
    if g.rank == 1:  # never arrives until rank 0 has been interrupted
        while not os.path.exists(flag):
            time.sleep(0.05)
        try:  # rank 0's half may be in shared memory already: this one can still complete
            dist.all_reduce(x)
        except tessera.Error as e:
            print("the first all_reduce after the interrupt:", e)
        expect(tessera.Error, lambda: dist.all_reduce(x), "rank 0", "KeyboardInterrupt")
        return
    print("blocking", flush=True)
    t0 = time.monotonic()
    try:
        dist.all_reduce(x)
        check(False, "all_reduce without its peer returned")
    except KeyboardInterrupt:
        dt = time.monotonic() - t0
        print(f"interrupted after {dt:.2f} s", flush=True)
    def again():  # an interrupt inside the collective aborted the group: this one raises at once
        try:
            dist.all_reduce(x)
        except KeyboardInterrupt:
            # on a starved machine the signal can land in the bytecode before all_reduce: nothing was aborted,
            # this all_reduce blocked, and the parent's second SIGINT came inside it
            print("the first SIGINT came before the collective; the second inside it", flush=True)
            dist.all_reduce(x)
    expect(tessera.Error, again, "interrupted (KeyboardInterrupt)")


# ---- the parent: starts the ranks -----------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(rank, port):
    e = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
             MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TS_JOB_TOKEN=TOKEN, OMP_NUM_THREADS="1")
    e["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return e


def start(part, *args):
    port = free_port()
    return [subprocess.Popen([sys.executable, __file__, part, *args], env=env_for(r, port), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for r in range(2)]


def finish(procs, what, rcs=(0, 0), timeout=120, first=0):
    outs = []
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            print(out)
            check(False, f"{what}: rank {r} hung")
        outs.append(out)
        for line in out.splitlines():
            print(f"  [rank {first + r}] {line}")
    check([p.returncode for p in procs] == list(rcs), f"{what}: exit statuses {[p.returncode for p in procs]}")
    return outs


def parent():
    t_start = time.monotonic()
    # the sampler: index for index torch's DistributedSampler (no group needed with num_replicas and rank)
    from torch.utils.data import DistributedSampler as TorchSampler
    cases = 0
    for n in (0, 1, 7, 10, 64, 101):
        for replicas in (1, 2, 3, 8):
            for shuffle in (False, True):
                for drop_last in (False, True):
                    for seed, epoch in ((0, 0), (42, 3)):
                        for rank in range(replicas):
                            ours = dist.DistributedSampler(range(n), replicas, rank, shuffle, seed, drop_last)
                            ref = TorchSampler(range(n), replicas, rank, shuffle, seed, drop_last)
                            ours.set_epoch(epoch)
                            ref.set_epoch(epoch)
                            if list(ours) != list(ref) or len(ours) != len(ref):
                                check(False, f"sampler n={n} replicas={replicas} rank={rank} shuffle={shuffle} "
                                      f"drop_last={drop_last} seed={seed} epoch={epoch}: {list(ours)} != {list(ref)}")
                            cases += 1
    check(True, f"DistributedSampler equals torch's index for index in {cases} cases")
    expect(ValueError, lambda: dist.DistributedSampler(range(4), 2, 2), "rank")
    loader = torch.utils.data.DataLoader(range(10), batch_size=2, sampler=dist.DistributedSampler(range(10), 2, 1))
    check(sum(len(b) for b in loader) == 5, "usable as a DataLoader's sampler")

    finish(start("collectives"), "collectives, env:// by hand")
    tessera_bin = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(tessera.__file__))), "..", "tessera")
    if os.access(tessera_bin, os.X_OK):
        p = subprocess.Popen([tessera_bin, "run", "-n", "2", sys.executable, __file__, "collectives"],
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        out = finish([p], "collectives under `tessera run -n 2`", rcs=(0,))
        check(out[0].count("ok: barrier") == 2, "both ranks ran under tessera run")
    else:
        print("skip: no tessera command beside the package (an installed wheel): tessera run not tried")
    finish(start("ddp"), "DDP with the tessera hook vs gloo")
    finish(start("dies"), "a rank that dies mid-collective", rcs=(0, 3), timeout=60)
    finish(start("dies_in_hook"), "a rank that dies mid-hook", rcs=(0, 3), timeout=60)

    with tempfile.TemporaryDirectory() as d:
        flag = os.path.join(d, "interrupted")
        procs = start("sigint", flag)
        line = ""
        deadline = time.monotonic() + 60
        while "blocking" not in line and time.monotonic() < deadline:
            line = procs[0].stdout.readline()
            print("  [rank 0]", line.rstrip())
            if not line and procs[0].poll() is not None:
                break
        check("blocking" in line, "rank 0 entered all_reduce")
        time.sleep(1.0)
        t0 = time.monotonic()
        procs[0].send_signal(signal.SIGINT)
        try:
            out0 = procs[0].communicate(timeout=10)[0]
        except subprocess.TimeoutExpired:  # the first SIGINT came before the collective (see rank_sigint)
            t0 = time.monotonic()
            procs[0].send_signal(signal.SIGINT)
            out0 = procs[0].communicate(timeout=30)[0]
        dt = time.monotonic() - t0
        for l in out0.splitlines():
            print("  [rank 0]", l)
        check(procs[0].returncode == 0 and "interrupted after" in out0, "SIGINT: KeyboardInterrupt in all_reduce")
        check(dt < 5, f"rank 0 ended {dt:.2f} s after SIGINT")
        open(flag, "w").close()
        finish(procs[1:], "the interrupted rank's peer", rcs=(0,), timeout=60, first=1)
    print(f"done in {time.monotonic() - t_start:.0f} s: torch {torch.__version__}")


TOKEN = os.environ.get("TS_JOB_TOKEN") or secrets.token_hex(32)

if __name__ == "__main__":
    part = sys.argv[1] if len(sys.argv) > 1 else ""
    if part == "":
        parent()
    elif part == "collectives":
        rank_collectives()
    elif part == "ddp":
        rank_ddp()
    elif part == "dies":
        rank_dies()
    elif part == "dies_in_hook":
        rank_dies_in_hook()
        # torch's own gloo group (init_process_group made one beside tessera's) still holds the dead peer: its
        # destructors at interpreter exit can end in std::terminate ("terminate called without an active
        # exception"), which is torch's teardown, not what is tested here — leave without them
        sys.stdout.flush()
        os._exit(0)
    elif part == "sigint":
        rank_sigint(sys.argv[2])
