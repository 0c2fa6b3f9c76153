"""tessera.ops: the ops of the C library (tessera/ops.h) with autograd, as functions on tessera.Tensor.

Every op takes tessera.Tensors (or anything with __dlpack__ — torch tensors, NumPy arrays —, shared without a
copy), returns a new contiguous tessera.Tensor, and records autograd when an input requires grad (and grad mode
is on: `tessera.no_grad()`). Binary ops also take Python numbers. Shapes follow PyTorch (NCHW images); float
ops take float32, indices int64. A shape, dtype or device that does not fit is a tessera.ShapeError /
DtypeError / DeviceError carrying the library's message.

    import tessera
    from tessera import ops
    x = tessera.randn([8, 4]); w = tessera.randn([3, 4]).requires_grad_()
    loss = ops.cross_entropy(ops.linear(x, w), tessera.tensor([0, 1, 2, 0, 1, 2, 0, 1], dtype="int64"))
    loss.backward(); print(w.grad)
"""
from __future__ import annotations

from typing import Any, Sequence

from . import _tessera
from ._tessera import (  # noqa: F401
    Tensor,
    adaptive_avg_pool2d,
    add,
    avg_pool2d,
    batch_norm,
    bmm,
    cat,
    conv2d,
    cross_entropy,
    div,
    dropout,
    embedding,
    flatten,
    gelu,
    global_avg_pool2d,
    group_norm,
    is_grad_enabled,
    layer_norm,
    linear,
    log_softmax,
    manual_seed,
    matmul,
    max,
    max_pool2d,
    mean,
    mse_loss,
    mul,
    narrow,
    permute,
    rand,
    randn,
    relu,
    reshape,
    scale,
    scaled_dot_product_attention,
    sigmoid,
    silu,
    softmax,
    sub,
    sum,
    tanh,
    to,
    transpose,
)

__all__ = [
    "add", "sub", "mul", "div", "scale", "matmul", "bmm", "linear", "conv2d", "relu", "sigmoid", "tanh", "gelu",
    "silu", "softmax", "log_softmax", "sum", "mean", "max", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
    "global_avg_pool2d", "batch_norm", "layer_norm", "group_norm", "embedding", "reshape", "flatten", "transpose",
    "permute", "narrow", "cat", "dropout", "scaled_dot_product_attention", "cross_entropy", "mse_loss", "to", "tensor", "randn", "rand", "full",
    "manual_seed", "no_grad", "enable_grad", "is_grad_enabled",
]


def _flatten(data: Any, shape: list, out: list, depth: int) -> None:
    if isinstance(data, (list, tuple)):
        if len(shape) <= depth:
            shape.append(len(data))
        elif shape[depth] != len(data):
            raise _tessera.ShapeError(f"tensor: ragged nested sequence (a length {len(data)} where {shape[depth]} "
                                      f"was expected at depth {depth})")
        for item in data:
            _flatten(item, shape, out, depth + 1)
    else:
        if len(shape) != depth:
            raise _tessera.ShapeError("tensor: ragged nested sequence (a number beside a sequence)")
        out.append(data)


def tensor(data: Any, dtype: str | None = None, device: str = "cpu", requires_grad: bool = False) -> Tensor:
    """A new tensor (a copy) from nested lists of numbers, a number, or anything with __dlpack__ (a torch tensor,
    a NumPy array). dtype: "float32" (numbers' default), "int64" (the default when every number is an int), or
    for DLPack inputs any dtype Tessera has (None: keep it). requires_grad makes it a leaf that backward fills."""
    if hasattr(data, "__dlpack__") or isinstance(data, Tensor):
        t = _tessera.from_dlpack(data).clone()
        if dtype is not None and t.dtype != dtype:
            t = to(t, dtype=dtype)
        if device != "cpu":
            t = to(t, device=device)
    else:
        shape: list = []
        values: list = []
        _flatten(data, shape, values, 0)
        if dtype is None:
            dtype = "int64" if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values) \
                else "float32"
        t = _tessera._tensor_from_flat(values, tuple(shape), dtype, device)
    if requires_grad:
        t.requires_grad_(True)
    return t


def full(shape: Sequence[int], value: float, device: str = "cpu") -> Tensor:
    """A new float32 tensor of `shape` filled with value."""
    return _tessera.zeros(list(shape), "float32", device) + float(value)


class no_grad:
    """with tessera.no_grad(): ops record no autograd (this thread), as torch.no_grad(). Also a decorator."""

    _mode = False

    def __enter__(self) -> None:
        self._prev = _tessera._set_grad_enabled(self._mode)

    def __exit__(self, *exc: Any) -> None:
        _tessera._set_grad_enabled(self._prev)

    def __call__(self, fn):  # type: ignore[no-untyped-def]
        import functools

        @functools.wraps(fn)
        def wrapped(*a, **k):  # type: ignore[no-untyped-def]
            with type(self)():
                return fn(*a, **k)
        return wrapped


class enable_grad(no_grad):
    """with tessera.enable_grad(): grad mode on again inside a no_grad block."""

    _mode = True


# ---- tessera.Tensor's methods over the ops (the operators, backward, grad, ... are the extension's) --------------
def _shape_args(shape: tuple) -> Sequence[int]:
    return shape[0] if len(shape) == 1 and isinstance(shape[0], (list, tuple)) else shape


Tensor.reshape = lambda self, *shape: reshape(self, _shape_args(shape))  # type: ignore[attr-defined]
Tensor.view = Tensor.reshape  # type: ignore[attr-defined]
Tensor.flatten = lambda self, start_dim=0, end_dim=-1: flatten(self, start_dim, end_dim)  # type: ignore[attr-defined]
Tensor.permute = lambda self, *dims: permute(self, _shape_args(dims))  # type: ignore[attr-defined]
Tensor.transpose = lambda self, dim0, dim1: transpose(self, dim0, dim1)  # type: ignore[attr-defined]
Tensor.t = lambda self: transpose(self, 0, 1)  # type: ignore[attr-defined]
Tensor.sum = lambda self, dim=None, keepdim=False: sum(self, dim, keepdim)  # type: ignore[attr-defined]
Tensor.mean = lambda self, dim=None, keepdim=False: mean(self, dim, keepdim)  # type: ignore[attr-defined]
Tensor.relu = lambda self: relu(self)  # type: ignore[attr-defined]
Tensor.softmax = lambda self, dim: softmax(self, dim)  # type: ignore[attr-defined]
Tensor.log_softmax = lambda self, dim: log_softmax(self, dim)  # type: ignore[attr-defined]
Tensor.matmul = lambda self, other: matmul(self, other)  # type: ignore[attr-defined]
Tensor.to = lambda self, device=None, dtype=None: to(self, dtype=dtype, device=device)  # type: ignore[attr-defined]
Tensor.numel = lambda self: __import__("math").prod(self.shape)  # type: ignore[attr-defined]
Tensor.size = lambda self, dim=None: self.shape if dim is None else self.shape[dim]  # type: ignore[attr-defined]
Tensor.tolist = lambda self: __import__("numpy").asarray(self).tolist()  # type: ignore[attr-defined]
Tensor.numpy = lambda self: __import__("numpy").asarray(self)  # type: ignore[attr-defined]
