"""Tessera: training on many devices, from Python. A thin front end over the C library (libtessera).

This release: the library's errors as exceptions, tensors shared with PyTorch and NumPy without a copy
(DLPack both ways, the buffer protocol), and checkpoints read as {name: Tensor}:

    import tessera, torch, numpy as np
    t = tessera.from_dlpack(torch.arange(6.0))   # torch's memory, seen by Tessera
    x = torch.from_dlpack(t)                     # and back: the same memory
    a = np.asarray(tessera.zeros([2, 3]))        # NumPy over a Tessera tensor
    sd = {k: torch.from_dlpack(v) for k, v in tessera.load_checkpoint("run.ckpt").items()}

Models in Python: tessera.ops (the library's ops with autograd), tessera.nn.Module (a module of the library
whose forward is Python) and the built-in layers; tessera.train(model=module, ...) trains one with the library's
run (docs/python.md, "Models in Python").
"""
from . import nn, ops  # noqa: F401  (models in Python: ops with autograd, nn.Module)
from .ops import enable_grad, full, is_grad_enabled, manual_seed, no_grad, rand, randn, tensor  # noqa: F401
from ._train import export_onnx, export_safetensors, run_fields, save_safetensors, train  # noqa: F401
from ._tessera import (  # noqa: F401
    ArgumentError,
    DeviceError,
    DistributedError,
    DtypeError,
    Error,
    FileError,
    FormatError,
    OutOfMemoryError,
    ShapeError,
    Tensor,
    TimeoutError,
    UnsupportedError,
    from_dlpack,
    load_checkpoint,
    zeros,
)
from . import data  # noqa: E402,F401  tessera.data.ImagePipeline: the input pipeline for PyTorch

__all__ = [
    "Error", "ArgumentError", "ShapeError", "DtypeError", "DeviceError", "FileError", "FormatError",
    "OutOfMemoryError", "DistributedError", "TimeoutError", "UnsupportedError", "Tensor", "from_dlpack",
    "load_checkpoint", "zeros", "train", "run_fields", "export_safetensors", "save_safetensors", "export_onnx",
    "data",
    "nn", "ops", "tensor", "randn", "rand", "full", "manual_seed", "no_grad", "enable_grad", "is_grad_enabled",
]
