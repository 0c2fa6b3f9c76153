"""tessera.distributed: Tessera's process group and collectives from Python, over the job the launcher started.

Every rank calls ``init()``, which joins the job from the launcher's environment as ``tessera train`` does
(``tessera run``, torchrun, mpirun, srun, or RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT by hand; the same
rendezvous, job token and backends), then the collectives, in the same order on every rank:

    import tessera.distributed as dist, torch
    dist.init()
    x = torch.full((4,), float(dist.get_rank()))
    dist.all_reduce(x)                       # in place: x is the sum over the ranks (numpy arrays too)

Collectives work in place on CPU torch tensors and NumPy arrays (their memory, never a copy): contiguous,
float32 for reductions (bfloat16 too on the builtin backend), any dtype for broadcast and all_gather. A
blocking call releases the GIL, and Ctrl-C interrupts it: the group is aborted (the other ranks fail at once
naming this one) and KeyboardInterrupt propagates. A rank that dies or stops makes the others raise
tessera.DistributedError / tessera.TimeoutError naming it (the heartbeat timeout: TS_HEARTBEAT_TIMEOUT or
``init(heartbeat_timeout=...)``).
"""
import datetime as _datetime
import os as _os
import sys as _sys
import threading as _threading

from ._tessera import (  # noqa: F401
    ArgumentError,
    DistributedError,
    ProcessGroup,
    Work,
    _sampler_indices,
    _sampler_len,
)

__all__ = [
    "init", "is_initialized", "group", "get_rank", "get_world_size", "destroy", "all_reduce", "broadcast",
    "all_gather", "reduce_scatter", "barrier", "ProcessGroup", "Work", "DistributedSampler",
]

_group = None
_lock = _threading.Lock()


def _seconds(t):
    if t is None:
        return None
    if isinstance(t, _datetime.timedelta):
        return t.total_seconds()
    return float(t)


def _torch_store():
    """When torch.distributed was initialized first from the same environment (env://, rank 0 serving a
    TCPStore on MASTER_PORT), Tessera joins through that store as a client: 'torch-tcp://addr:port'."""
    td = _sys.modules.get("torch.distributed")
    if td is None or not td.is_available() or not td.is_initialized():
        return None
    if _os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":  # torchrun's agent store: env:// finds it
        return None
    addr, port = _os.environ.get("MASTER_ADDR"), _os.environ.get("MASTER_PORT")
    return f"torch-tcp://{addr}:{port}" if addr and port else None


def init(backend=None, init_method=None, timeout=None, heartbeat_timeout=None):
    """Joins the job and returns its process group (the default group of the functions below); again: the same
    group. backend: 'builtin' (shared memory + TCP; the default), 'mpi', 'nccl'. init_method: 'env://' (the
    default: the launcher's variables), 'tcp://host:port', 'torch-tcp://host:port' (a torch TCPStore someone
    serves; chosen by itself when torch.distributed was initialized first from the same environment),
    'file:///path'. timeout: seconds (or a timedelta) for the rendezvous and every collective (default
    TS_DIST_TIMEOUT, else 1800). heartbeat_timeout: seconds of silence after which a peer is failed (default
    TS_HEARTBEAT_TIMEOUT, else 30; 0: no heartbeats)."""
    global _group
    with _lock:
        if _group is not None and not _group.closed:
            return _group
        if init_method is None:
            init_method = _torch_store()
        _group = ProcessGroup(backend=backend, init_method=init_method, timeout=_seconds(timeout),
                              heartbeat_timeout=_seconds(heartbeat_timeout))
        return _group


def is_initialized():
    """Whether init() has joined a group (and destroy() has not left it)."""
    return _group is not None and not _group.closed


def _default():
    if not is_initialized():
        raise DistributedError("tessera.distributed is not initialized: call tessera.distributed.init() first")
    return _group


def group():
    """The default group (init()'s)."""
    return _default()


def get_rank():
    return _default().rank


def get_world_size():
    return _default().world_size


def destroy():
    """Leaves the default group (pending work finishes or fails); init() may join again."""
    global _group
    with _lock:
        if _group is not None:
            _group.close()
        _group = None


def _op(op):
    if isinstance(op, str):
        return op.lower()
    td = _sys.modules.get("torch.distributed")  # torch.distributed.ReduceOp.SUM and friends
    if td is not None and hasattr(td, "ReduceOp"):
        for name in ("SUM", "AVG", "MAX", "MIN", "PRODUCT", "BAND", "BOR", "BXOR", "PREMUL_SUM"):
            v = getattr(td.ReduceOp, name, None)
            if v is not None and op == v:
                return name.lower()
    return str(op)


def all_reduce(tensor, op="sum", group=None, async_op=False):
    """Reduces tensor over the ranks, in place: op 'sum', 'avg', 'max', 'min' (or torch's ReduceOp). With
    async_op=True returns a Work (wait(), is_completed()); keep tensor alive until it completes."""
    return (group or _default()).all_reduce(tensor, _op(op), async_op=async_op)


def broadcast(tensor, src=0, group=None, async_op=False):
    """Rank src's tensor to every rank, in place."""
    return (group or _default()).broadcast(tensor, src, async_op=async_op)


def all_gather(output, input, group=None, async_op=False):
    """output (world_size x input's elements, as torch's all_gather_into_tensor) gets every rank's input, rank
    r's at r * input.numel(). A list of world_size tensors is also taken (gathered, then copied into them)."""
    g = group or _default()
    if isinstance(output, (list, tuple)):
        import torch  # torch's list form: gather into one tensor, then copy out
        flat = torch.empty((len(output) * input.numel(),), dtype=input.dtype)
        g.all_gather(flat, input)
        for i, o in enumerate(output):
            o.copy_(flat[i * input.numel():(i + 1) * input.numel()].view_as(o))
        return None
    return g.all_gather(output, input, async_op=async_op)


def reduce_scatter(output, input, op="sum", group=None, async_op=False):
    """Rank r's output gets the reduction of block r of the ranks' inputs (input: world_size x output's
    elements, as torch's reduce_scatter_tensor)."""
    return (group or _default()).reduce_scatter(output, input, _op(op), async_op=async_op)


def barrier(group=None, async_op=False):
    """Waits until every rank has called it."""
    return (group or _default()).barrier(async_op=async_op)


def _replicas_and_rank(num_replicas, rank):
    if num_replicas is not None and rank is not None:
        return num_replicas, rank
    if is_initialized():
        g = _group
        return (g.world_size if num_replicas is None else num_replicas), (g.rank if rank is None else rank)
    td = _sys.modules.get("torch.distributed")
    if td is not None and td.is_available() and td.is_initialized():
        return (td.get_world_size() if num_replicas is None else num_replicas), \
            (td.get_rank() if rank is None else rank)
    raise DistributedError("DistributedSampler: give num_replicas and rank, or call tessera.distributed.init() "
                           "first")


class DistributedSampler:
    """torch.utils.data.DistributedSampler, index for index (the library's ts_dist_sampler): this rank's share
    of range(len(dataset)), shuffled by seed + epoch as torch shuffles it, padded by repeating from the start
    (drop_last: truncated) so every rank gets len(self) indices. Call set_epoch(e) before each epoch when
    shuffling. num_replicas / rank default to the tessera group's (else torch.distributed's)."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False):
        num_replicas, rank = _replicas_and_rank(num_replicas, rank)
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.epoch = 0
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.num_samples = _sampler_len(len(dataset), self.num_replicas, self.rank, self.drop_last)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        t = _sampler_indices(len(self.dataset), self.num_replicas, self.rank, self.shuffle, self.seed,
                             self.drop_last, self.epoch)
        return iter(memoryview(t).tolist())

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        self.epoch = int(epoch)
