#!/usr/bin/python3
"""PyTorch side of bench/train_1v2.sh: the reference CNN trained with
DistributedDataParallel (gloo) on NPROC processes of 1 thread each, 64 images
per rank from in-memory Fashion-MNIST-shaped random batches. Prints global
images/s as JSON from rank 0.

usage: /usr/bin/python3 bench/ddp_pytorch.py NPROC [STEPS]
"""
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def run(rank, nproc, steps, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
    if nproc > 1:
        dist.init_process_group("gloo", rank=rank, world_size=nproc)
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    xs = [torch.randn(64, 1, 28, 28) for _ in range(8)]
    ys = [torch.randint(0, 10, (64,)) for _ in range(8)]
    loss_fn = nn.CrossEntropyLoss()

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss_fn(model(xs[i % 8]), ys[i % 8]).backward()
        opt.step()

    for i in range(10):
        step(i)
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    dt = time.perf_counter() - t0
    if rank == 0:
        print(json.dumps({"framework": "pytorch " + torch.__version__, "processes": nproc,
                          "images_per_second": steps * 64 * nproc / dt}), flush=True)
    if nproc > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    nproc = int(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    if nproc == 1:
        run(0, 1, steps, port)
    else:
        mp.spawn(run, args=(nproc, steps, port), nprocs=nproc, join=True)
