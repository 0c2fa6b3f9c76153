"""tests/dlpack_cuda.py LIBTESSERA: DLPack with CUDA tensors, run by scripts/gpu_check.sh on a GPU machine:
a Tessera tensor on cuda:0 read by torch.from_dlpack in place (same device pointer, equal values), and a
torch CUDA tensor wrapped by Tessera in place (same pointer, values copied back to the host equal).
Prints one "ok: ..." line per check; exits 1 on the first failure."""
import ctypes
import sys

import torch

lib = ctypes.CDLL(sys.argv[1])
P = ctypes.c_void_p
py = ctypes.pythonapi
py.PyCapsule_New.restype = ctypes.py_object
py.PyCapsule_New.argtypes = [P, ctypes.c_char_p, P]
py.PyCapsule_GetPointer.restype = P
py.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
py.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
lib.ts_device_get.argtypes = [ctypes.c_char_p, ctypes.POINTER(P)]
lib.ts_tensor_from_data.argtypes = [P, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64), P, ctypes.POINTER(P)]
lib.ts_tensor_to_dlpack.argtypes = [P, ctypes.POINTER(P)]
lib.ts_tensor_from_dlpack_unversioned.argtypes = [P, ctypes.POINTER(P)]
lib.ts_tensor_to_host.argtypes = [P, P, ctypes.c_size_t]
lib.ts_tensor_release.argtypes = [P]
lib.ts_last_error.restype = ctypes.c_char_p


def check(cond, what):
    if not cond:
        print("FAIL:", what, "|", lib.ts_last_error().decode())
        sys.exit(1)
    print("ok:", what)


dev = P()
check(lib.ts_device_get(b"cuda:0", ctypes.byref(dev)) == 0, "ts_device_get cuda:0")
host = (ctypes.c_float * 6)(1, 2, 3, 4, 5, 6)
t = P()
check(lib.ts_tensor_from_data(dev, 0, 2, (ctypes.c_int64 * 2)(2, 3), ctypes.cast(host, P), ctypes.byref(t)) == 0,
      "a 2x3 float32 tensor on cuda:0")


class Shared:
    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        m = P()
        check(lib.ts_tensor_to_dlpack(t, ctypes.byref(m)) == 0, "ts_tensor_to_dlpack of a CUDA tensor")
        return py.PyCapsule_New(m, b"dltensor_versioned", None)

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA, device 0


x = torch.from_dlpack(Shared())
check(x.is_cuda and x.device.index == 0, "torch sees it on cuda:0")
check(torch.equal(x.cpu(), torch.arange(1, 7, dtype=torch.float32).reshape(2, 3)), "equal values")
x.mul_(2)
torch.cuda.synchronize()
back = (ctypes.c_float * 6)()
check(lib.ts_tensor_to_host(t, ctypes.cast(back, P), 24) == 0 and list(back) == [2, 4, 6, 8, 10, 12],
      "torch's in-place write is Tessera's memory")
lib.ts_tensor_release(t)
del x

y = torch.arange(12, dtype=torch.float32, device="cuda:0").reshape(3, 4)
cap = torch.utils.dlpack.to_dlpack(y)
u = P()
check(lib.ts_tensor_from_dlpack_unversioned(py.PyCapsule_GetPointer(cap, b"dltensor"), ctypes.byref(u)) == 0,
      "ts_tensor_from_dlpack of a torch CUDA tensor")
py.PyCapsule_SetName(cap, b"used_dltensor")
got = (ctypes.c_float * 12)()
torch.cuda.synchronize()
check(lib.ts_tensor_to_host(u, ctypes.cast(got, P), 48) == 0 and list(got) == list(range(12)),
      "Tessera reads torch's CUDA memory in place")
lib.ts_tensor_release(u)
print("done: torch", torch.__version__)
