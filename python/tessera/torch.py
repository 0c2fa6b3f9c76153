"""tessera.torch: PyTorch's DistributedDataParallel reducing its gradient buckets through Tessera.

    import torch, tessera.torch
    tessera.torch.init_process_group("gloo")       # Tessera's group, and torch's (DDP's set-up needs one)
    model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=25)
    model.register_comm_hook(None, tessera.torch.allreduce_hook)   # None: tessera.distributed's default group

allreduce_hook has torch's communication hook signature: DDP calls it with each gradient bucket as soon as the
bucket's gradients are ready; it starts Tessera's all-reduce (average) of the bucket in place and returns a
torch.futures.Future that completes when it is done, so the reduction overlaps the rest of backward as torch's
own hook does. DDP still uses torch's process group for its set-up (the broadcast of rank 0's parameters and
buffers); init_process_group() makes both from the launcher's environment.
"""
import datetime as _datetime
import os as _os
import queue as _queue
import threading as _threading

import torch as _torch
import torch.distributed as _td

from . import distributed as _dist

__all__ = ["allreduce_hook", "init_process_group"]


def init_process_group(backend="gloo", timeout=None, **tessera_options):
    """Joins Tessera's group (tessera.distributed.init(timeout=timeout, **tessera_options)) and, unless
    torch.distributed is already initialized, torch's default group with `backend` over a torch TCPStore that
    Tessera's rank 0 serves on a free port (its port goes to the others through Tessera's broadcast): one
    rendezvous, whatever the launcher (under `tessera run` MASTER_PORT is held by Tessera's own store).
    Returns Tessera's group."""
    g = _dist.init(timeout=timeout, **tessera_options)
    if _td.is_initialized():
        return g
    seconds = _dist._seconds(timeout) or g.timeout
    td = _datetime.timedelta(seconds=seconds)
    host = _os.environ.get("MASTER_ADDR") or "127.0.0.1"
    port = _torch.zeros(1, dtype=_torch.int64)
    store = None
    if g.rank == 0:  # world_size None: the server does not wait for its clients here
        store = _td.TCPStore(host, 0, None, True, td)
        port[0] = store.port
    g.broadcast(port, 0)
    if g.rank != 0:
        store = _td.TCPStore(host, int(port[0]), None, False, td)
    _td.init_process_group(backend, store=store, rank=g.rank, world_size=g.world_size, timeout=td)
    return g


class _Completer:
    """One thread per process that completes the hooks' futures in the order their all-reduces were issued
    (the order the group runs them): waits for each Work with the GIL released, then set_result (or
    set_exception with the library's error: a rank that died, a timeout)."""

    def __init__(self):
        self._q = _queue.SimpleQueue()
        self._thread = None
        self._lock = _threading.Lock()

    def put(self, work, fut, tensor):
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = _threading.Thread(target=self._run, name="tessera-ddp-hook", daemon=True)
                self._thread.start()
        self._q.put((work, fut, tensor))

    def _run(self):
        while True:
            work, fut, tensor = self._q.get()
            try:
                work.wait()
            except BaseException as e:  # noqa: B902 — every failure goes to DDP through the future
                fut.set_exception(e)
            else:
                fut.set_result(tensor)
            del work, fut, tensor


_completer = _Completer()


def _bucket_tensor(bucket):
    return bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()  # torch < 1.10: get_tensor


def allreduce_hook(state, bucket):
    """DDP communication hook (model.register_comm_hook(state, tessera.torch.allreduce_hook)): averages the
    bucket over the ranks of `state` (a tessera.distributed.ProcessGroup; None: the default group) in place
    with Tessera's backend, and returns a torch.futures.Future of the averaged bucket."""
    group = state if isinstance(state, _dist.ProcessGroup) else _dist.group()
    tensor = _bucket_tensor(bucket)
    work = group.all_reduce(tensor, "avg", async_op=True)
    fut = _torch.futures.Future()
    _completer.put(work, fut, tensor)
    # then(): an error re-raised in a callback fails the returned future in C++ as well, so DDP's backward
    # raises it with the library's message (a bare set_exception reaches DDP as an "Unable to cast" error)
    return fut.then(_value)


def _value(fut):
    return fut.value()
