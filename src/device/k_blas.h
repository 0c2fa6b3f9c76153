/*
 * device/k_blas.h — dense matrix multiply on device pointers, row-major, as
 * C = alpha * op(A) op(B) + beta * C with op(X) = X or X^T.
 */
#ifndef TS_K_BLAS_H
#define TS_K_BLAS_H

#include "device/device.h"

struct ts_kernels_blas {
    ts_status (*sgemm)(ts_device *d, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
};

/* The CPU backend's instance (src/ops/cpu/blas.c), which device/cpu.c puts in
 * the table of every CPU device. */
extern const struct ts_kernels_blas ts_cpu_kernels_blas;

#endif
