"""tests/dlpack_torch.py LIBTESSERA: Tessera's DLPack (include/tessera/dlpack.h) against PyTorch's and
NumPy's own, through ctypes (the Python package's extension will use the same C calls). Checks that memory
is shared (data pointers equal, writes seen both ways), that strided views keep their strides, every dtype
both frameworks share, and that ownership ends where it should (the producer's deleter runs once the last
user is gone). Prints one "ok: ..." line per check; exits 1 on the first failure."""
import ctypes
import gc
import sys

import numpy as np
import torch
import torch.utils.dlpack

lib = ctypes.CDLL(sys.argv[1])
py = ctypes.pythonapi
py.PyCapsule_New.restype = ctypes.py_object
py.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
py.PyCapsule_GetPointer.restype = ctypes.c_void_p
py.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
py.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
py.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]

P = ctypes.c_void_p
lib.ts_tensor_from_data.argtypes = [P, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64), P, ctypes.POINTER(P)]
lib.ts_tensor_to_dlpack_unversioned.argtypes = [P, ctypes.POINTER(P)]
lib.ts_tensor_to_dlpack.argtypes = [P, ctypes.POINTER(P)]
lib.ts_tensor_from_dlpack_unversioned.argtypes = [P, ctypes.POINTER(P)]
lib.ts_tensor_data.argtypes = [P]
lib.ts_tensor_data.restype = P
lib.ts_tensor_strides.argtypes = [P]
lib.ts_tensor_strides.restype = ctypes.POINTER(ctypes.c_int64)
lib.ts_tensor_dtype.argtypes = [P]
lib.ts_tensor_release.argtypes = [P]
lib.ts_last_error.restype = ctypes.c_char_p

TS = {"float32": 0, "float16": 1, "bfloat16": 2, "int64": 3, "int32": 4, "uint8": 5}


def check(cond, what):
    if not cond:
        print("FAIL:", what)
        sys.exit(1)
    print("ok:", what)


def ts_tensor(arr_bytes, dtype, shape):
    out = P()
    sh = (ctypes.c_int64 * len(shape))(*shape)
    buf = ctypes.create_string_buffer(arr_bytes, len(arr_bytes))
    st = lib.ts_tensor_from_data(None, TS[dtype], len(shape), sh, ctypes.cast(buf, P), ctypes.byref(out))
    check(st == 0, f"ts_tensor_from_data ({lib.ts_last_error().decode()})")
    return out


def export_capsule(t, versioned=False):
    m = P()
    if versioned:
        check(lib.ts_tensor_to_dlpack(t, ctypes.byref(m)) == 0, "ts_tensor_to_dlpack")
        return py.PyCapsule_New(m, b"dltensor_versioned", None)
    check(lib.ts_tensor_to_dlpack_unversioned(t, ctypes.byref(m)) == 0, "ts_tensor_to_dlpack_unversioned")
    return py.PyCapsule_New(m, b"dltensor", None)


class Shared:
    """An object with the DLPack protocol, over a Tessera tensor (what np.from_dlpack asks for)."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return export_capsule(self.t, versioned=bool(max_version and max_version[0] >= 1))

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


# ---- Tessera -> torch: the same memory ----------------------------------------------------------------
t = ts_tensor(np.arange(6, dtype=np.float32).tobytes(), "float32", [2, 3])
x = torch.utils.dlpack.from_dlpack(export_capsule(t))
check(x.data_ptr() == lib.ts_tensor_data(t), "torch.utils.dlpack.from_dlpack: the tensor's own memory")
check(x.shape == (2, 3) and x.dtype == torch.float32 and x.stride() == (3, 1), "shape, dtype and strides")
x[1, 2] = -7.0
check(ctypes.cast(lib.ts_tensor_data(t), ctypes.POINTER(ctypes.c_float))[5] == -7.0, "torch's write is Tessera's")
lib.ts_tensor_release(t)  # torch's reference keeps the memory
check(float(x.sum()) == 0 + 1 + 2 + 3 + 4 - 7, "the memory outlives Tessera's reference")
del x
gc.collect()

# ---- torch -> Tessera: the same memory, a strided view, every shared dtype -----------------------------
y = torch.arange(24, dtype=torch.float32).reshape(4, 6)[:, ::2]
cap = torch.utils.dlpack.to_dlpack(y)
out = P()
check(lib.ts_tensor_from_dlpack_unversioned(py.PyCapsule_GetPointer(cap, b"dltensor"), ctypes.byref(out)) == 0,
      "ts_tensor_from_dlpack_unversioned of torch's capsule")
py.PyCapsule_SetName(cap, b"used_dltensor")  # Tessera owns it now: the capsule must not delete it
check(lib.ts_tensor_data(out) == y.data_ptr(), "Tessera's tensor is torch's memory")
st = lib.ts_tensor_strides(out)
check((st[0], st[1]) == y.stride() == (6, 2), "a strided view keeps its strides (6, 2)")
base = ctypes.cast(lib.ts_tensor_data(out), ctypes.POINTER(ctypes.c_float))
base[6 + 2] = 99.0  # row 1, column 1 of the view
check(float(y[1, 1]) == 99.0, "Tessera's write is torch's")
lib.ts_tensor_release(out)  # runs torch's deleter; y stays (Python holds it)
del cap
check(float(y[1, 1]) == 99.0, "torch's tensor lives on after Tessera released its view")

for name, tdt in [("float32", torch.float32), ("float16", torch.float16), ("bfloat16", torch.bfloat16),
                  ("int64", torch.int64), ("int32", torch.int32), ("uint8", torch.uint8)]:
    z = (torch.arange(5) * 3).to(tdt)
    cap = torch.utils.dlpack.to_dlpack(z)
    out = P()
    ok = lib.ts_tensor_from_dlpack_unversioned(py.PyCapsule_GetPointer(cap, b"dltensor"), ctypes.byref(out)) == 0
    py.PyCapsule_SetName(cap, b"used_dltensor")
    same = ok and lib.ts_tensor_dtype(out) == TS[name] and lib.ts_tensor_data(out) == z.data_ptr()
    back = torch.utils.dlpack.from_dlpack(export_capsule(out)) if ok else None
    lib.ts_tensor_release(out)
    check(same and back is not None and back.dtype == tdt and torch.equal(back, z) and back.data_ptr() == z.data_ptr(),
          f"{name}: torch -> Tessera -> torch, one memory, equal values")

refused = torch.utils.dlpack.to_dlpack(torch.zeros(3, dtype=torch.complex64))
out = P()
rc = lib.ts_tensor_from_dlpack_unversioned(py.PyCapsule_GetPointer(refused, b"dltensor"), ctypes.byref(out))
check(rc != 0 and b"complex64 is not one Tessera has" in lib.ts_last_error() and
      py.PyCapsule_IsValid(refused, b"dltensor"), "complex64 refused, naming it; the capsule left to torch")
del refused
gc.collect()

# ---- NumPy's DLPack protocol ----------------------------------------------------------------------------
if hasattr(np, "from_dlpack"):
    t = ts_tensor(np.arange(4, dtype=np.int64).tobytes(), "int64", [4])
    a = np.from_dlpack(Shared(t))
    check(a.ctypes.data == lib.ts_tensor_data(t) and a.tolist() == [0, 1, 2, 3], "np.from_dlpack: the same memory")
    lib.ts_tensor_release(t)
    del a
    gc.collect()
print("done: torch", torch.__version__, "numpy", np.__version__)
