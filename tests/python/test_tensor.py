"""tests/python/test_tensor.py: `import tessera` — tensors shared with PyTorch and NumPy without a copy
(DLPack both ways, versioned and not; the buffer protocol), ownership across the boundary, and the
library's errors as Python exceptions. Plain asserts (run by tests/python_tests.sh); prints one line per
check."""
import gc

import numpy as np
import torch

import tessera
from testutil import check


# ---- torch -> tessera -> torch: one memory ----------------------------------------------------------------
x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
t = tessera.from_dlpack(x)
check(isinstance(t, tessera.Tensor) and t.shape == (3, 4) and t.dtype == "float32" and t.device == "cpu",
      f"from_dlpack(torch tensor): {t!r}")
check(t.data_ptr() == x.data_ptr(), "the same memory as torch's")
y = torch.from_dlpack(t)
check(y.data_ptr() == x.data_ptr() and torch.equal(y, x), "torch.from_dlpack(tessera tensor): the same memory")
y[0, 0] = 42
check(float(x[0, 0]) == 42, "a write through one is seen by the other")
del x, y
gc.collect()
check(t.shape == (3, 4) and np.asarray(t)[0, 0] == 42, "the memory lives while tessera's tensor does")

# a strided view keeps its strides
v = torch.arange(24, dtype=torch.float32).reshape(4, 6)[:, ::2]
tv = tessera.from_dlpack(v)
check(tv.strides == (6, 2) and tv.data_ptr() == v.data_ptr(), "a strided torch view: strides (6, 2), no copy")
a = np.asarray(tv)
check(a.strides == (24, 8) and a.tolist() == v.tolist(), "np.asarray over it: byte strides (24, 8), equal values")

# every dtype both have
for name, dt in [("float32", torch.float32), ("float16", torch.float16), ("bfloat16", torch.bfloat16),
                 ("int64", torch.int64), ("int32", torch.int32), ("uint8", torch.uint8)]:
    z = (torch.arange(5) * 3).to(dt)
    tz = tessera.from_dlpack(z)
    back = torch.from_dlpack(tz)
    check(tz.dtype == name and back.dtype == dt and torch.equal(back, z) and back.data_ptr() == z.data_ptr(),
          f"{name}: torch -> tessera -> torch")

# ---- NumPy ------------------------------------------------------------------------------------------------
n = np.arange(6, dtype=np.int64).reshape(2, 3)
tn = tessera.from_dlpack(n)
check(tn.data_ptr() == n.ctypes.data and tn.dtype == "int64", "from_dlpack(NumPy array): the same memory")
z = tessera.zeros([2, 3], dtype="float16")
za = np.asarray(z)
check(za.dtype == np.float16 and za.shape == (2, 3) and za.ctypes.data == z.data_ptr(), "np.asarray(zeros): in place")
za[1, 2] = 1.5
check(float(torch.from_dlpack(z)[1, 2]) == 1.5, "NumPy's write seen through DLPack")
mv = memoryview(tessera.zeros([4], dtype="int32"))
check(mv.format == "i" and mv.shape == (4,) and not mv.readonly, "memoryview: format 'i', writable")
if hasattr(np, "from_dlpack"):
    b = np.from_dlpack(z)
    check(b.ctypes.data == z.data_ptr(), "np.from_dlpack(tessera tensor): the same memory")

# a capsule nobody consumed frees its tensor (no leak, no crash)
cap = tessera.zeros([3]).__dlpack__()
del cap
cap = tessera.zeros([3]).__dlpack__(max_version=(1, 0))
check(type(cap).__name__ == "PyCapsule", "__dlpack__(max_version=(1, 0)): a versioned capsule")
del cap
gc.collect()

# ---- errors -----------------------------------------------------------------------------------------------
try:
    tessera.from_dlpack(torch.zeros(2, dtype=torch.complex64))
    check(False, "complex64 refused")
except tessera.DtypeError as e:
    check(isinstance(e, tessera.Error) and isinstance(e, TypeError) and "complex64" in str(e),
          f"complex64: tessera.DtypeError ({e})")
try:
    tessera.from_dlpack(np.arange(4, dtype=np.float32)[::-1])  # NumPy has negative strides (torch has none)
    check(False, "a flipped view refused")
except tessera.ArgumentError as e:
    check(isinstance(e, ValueError) and "negative" in str(e), f"negative strides: tessera.ArgumentError ({e})")
try:
    tessera.zeros([2], dtype="complex")
    check(False, "a bad dtype name refused")
except tessera.ArgumentError as e:
    check("complex" in str(e), f"zeros(dtype='complex'): {e}")
try:
    tessera.zeros([2], device="cuda:9")
    check(False, "a missing device refused")
except tessera.Error as e:
    check("cuda:9" in str(e), f"zeros(device='cuda:9'): {type(e).__name__}: {e}")
try:
    tessera.from_dlpack(object())
    check(False, "an object without __dlpack__ refused")
except TypeError as e:
    check("__dlpack__" in str(e), f"from_dlpack(object()): {e}")
try:
    memoryview(tessera.zeros([2], dtype="bfloat16"))
    check(False, "bfloat16 has no buffer format")
except BufferError as e:
    check("bfloat16" in str(e) and "DLPack" in str(e), f"memoryview(bfloat16): {e}")
w = torch.zeros(3, requires_grad=True)
try:
    tessera.from_dlpack(w)
    check(False, "a tensor that requires grad")
except (RuntimeError, tessera.Error) as e:  # torch refuses to export it itself
    check("grad" in str(e), f"requires_grad: {type(e).__name__}")
print("done: torch", torch.__version__, "numpy", np.__version__)
