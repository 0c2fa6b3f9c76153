/*
 * ops/cuda/cu.h — included by every .cu file of the CUDA backend (and by the launcher headers
 * <family>_cu.h, which C files include too): launch shapes and C linkage for launchers.
 */
#ifndef TS_OPS_CUDA_CU_H
#define TS_OPS_CUDA_CU_H

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define TS_CU_EXTERN_C extern "C"
#else
#define TS_CU_EXTERN_C
#endif

#ifdef __CUDACC__
/* Threads per block for elementwise kernels, and the grid for n elements with a grid-stride loop
 * (at most 65535 * 8 blocks; the loop covers the rest). */
#define TS_CU_THREADS 256
static inline unsigned ts_cu_blocks(int64_t n) {
    int64_t b = (n + TS_CU_THREADS - 1) / TS_CU_THREADS;
    if (b < 1) b = 1;
    if (b > 65535 * 8) b = 65535 * 8;
    return (unsigned)b;
}
/* for (i = this thread's first; i < n; i += all threads) */
#define TS_CU_LOOP(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)blockDim.x * gridDim.x)
#endif

#endif
