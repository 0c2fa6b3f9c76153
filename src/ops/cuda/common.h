/*
 * ops/cuda/common.h — shared by the CUDA backend's kernel tables (src/ops/cuda/<family>.c).
 *
 * Split of the backend: a family's .c file implements the ts_kernels_<family> table (it sees
 * ts_tensor, checks dtypes, computes sizes and pointers, names errors) and calls launchers: plain
 * C functions defined in the family's .cu file and declared in its <family>_cu.h, which take raw
 * device pointers, sizes and the stream and return the launch's cudaError_t. The .cu files never
 * see the library's C11 headers (atomics), only ops/cuda/cu.h and the shared per-element
 * arithmetic of device/k_elem.h, which the CPU kernels use too.
 *
 * Every kernel is queued on the device's stream (device/cuda.h) and runs asynchronously; a
 * function that must hand a value to the host (an invalid class index, a norm) copies it back,
 * which waits for the stream.
 */
#ifndef TS_OPS_CUDA_COMMON_H
#define TS_OPS_CUDA_COMMON_H

#include "device/cuda.h"
#include "tensor/tensor.h"

/* Makes t's device current and declares its stream as `s`: TS_CU_BEGIN(d, s); */
#define TS_CU_BEGIN(dev, s) \
    cudaStream_t s;         \
    TS_TRY(ts__cuda_enter((dev), &s))

/* Turns a launcher's cudaError_t into a ts_status naming the device and the kernel. */
#define TS_CU_LAUNCH(dev, what, call) TS_TRY(ts__cuda_status((dev), (call), (what)))

static inline ts_device *ts__dev(const ts_tensor *t) { return t->storage->device; }

#endif
