/*
 * ops/cpu/blas.c — sgemm through OpenBLAS (its OpenMP build: it shares our
 * thread pool and runs single-threaded when called inside a parallel region).
 */
#include "tensor/tensor.h"
#include "device/k_blas.h"

#include <cblas.h>
#include <omp.h>

/* OpenBLAS keeps ONE global thread count, which its OpenMP build resets from
 * the calling thread's omp_get_max_threads() only while it is above 1. Worker
 * threads of virtual CPU devices run with a smaller OpenMP budget than the main
 * thread, so follow the caller's budget on every call (a cheap comparison) —
 * but never from inside a parallel region: there OpenBLAS runs single-threaded
 * by itself, and openblas_set_num_threads frees and reallocates its per-thread
 * buffers, which corrupts the sgemm another thread of the team is running
 * (OpenBLAS 0.3.21: wrong conv2d gradients in about 1 step of 60 with two
 * threads; bench/openblas_race.c reproduces it without Tessera). */
int openblas_get_num_threads(void);
void openblas_set_num_threads(int n);

static ts_status cpu_sgemm(ts_device *d, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                           const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                           int64_t ldc) {
    if (M == 0 || N == 0) return TS_OK;
    if (!omp_in_parallel() && openblas_get_num_threads() != omp_get_max_threads())
        openblas_set_num_threads(omp_get_max_threads());
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)M,
                (blasint)N, (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
    return TS_OK;
}

const struct ts_kernels_blas ts_cpu_kernels_blas = {
    .sgemm = cpu_sgemm,
};
