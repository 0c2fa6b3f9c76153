#!/usr/bin/python3
"""PyTorch gloo all-reduce timings, nccl-tests style, for bench/allreduce_vs.sh.

usage: /usr/bin/python3 bench/allreduce_gloo.py [NPROC] [MAX_BYTES]
Prints one JSON object per size from rank 0: bytes, time_us, algbw, busbw (GB/s).
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def iters_for(nbytes):
    return 200 if nbytes <= 65536 else 50 if nbytes <= (4 << 20) else 10


def run(rank, nproc, max_bytes, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=nproc)
    nbytes = 8
    while nbytes <= max_bytes:
        t = torch.ones(nbytes // 4)
        n = iters_for(nbytes)
        for _ in range(max(2, n // 10)):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            dist.all_reduce(t)
        dt = (time.perf_counter() - t0) / n
        if rank == 0:
            algbw = nbytes / dt / 1e9
            print(json.dumps({"impl": "gloo", "bytes": nbytes, "time_us": dt * 1e6, "algbw": algbw,
                              "busbw": algbw * 2 * (nproc - 1) / nproc}), flush=True)
        nbytes *= 2
    dist.destroy_process_group()


if __name__ == "__main__":
    nproc = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    max_bytes = int(sys.argv[2]) if len(sys.argv) > 2 else 256 << 20
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(run, args=(nproc, max_bytes, port), nprocs=nproc, join=True)
