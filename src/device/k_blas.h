/*
 * device/k_blas.h — dense matrix multiply on device pointers, row-major, as
 * C = alpha * op(A) op(B) + beta * C with op(X) = X or X^T, one product or a
 * batch of them.
 */
#ifndef TS_K_BLAS_H
#define TS_K_BLAS_H

#include "device/device.h"

struct ts_kernels_blas {
    ts_status (*sgemm)(ts_device *d, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
    /* batch products: for i < batch, C + i * cstride = alpha op(A + aoff[i]) op(B + boff[i])
     * + beta (C + i * cstride); aoff and boff are host arrays of element offsets (they
     * may repeat: broadcast operands); the C blocks must not overlap. */
    ts_status (*sgemm_batched)(ts_device *d, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                               const float *A, int64_t lda, const int64_t *aoff, const float *B, int64_t ldb,
                               const int64_t *boff, float beta, float *C, int64_t ldc, int64_t cstride,
                               int64_t batch);
    /* C: (M, N) float32 = alpha op(A) op(B) + beta C with bfloat16 products and float32 sums whatever the
     * matmul precision; A and B each of dtype adt, bdt: F32 (rounded to bfloat16 here) or BF16 (read as they
     * are: autocast's activations); on all threads of the caller's OpenMP budget. NULL where the backend has
     * none (the op layer then widens its bfloat16 operands). */
    ts_status (*gemm_bf16)(ts_device *d, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                           const void *A, ts_dtype adt, int64_t lda, const void *B, ts_dtype bdt, int64_t ldb,
                           float beta, float *C, int64_t ldc);
};

/* The CPU backend's instance (src/ops/cpu/blas.c), which device/cpu.c puts in
 * the table of every CPU device. */
extern const struct ts_kernels_blas ts_cpu_kernels_blas;
#ifdef TS_HAVE_CUDA
extern const struct ts_kernels_blas ts_cuda_kernels_blas; /* src/ops/cuda/blas.c */
#endif

#endif
