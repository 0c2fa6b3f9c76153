/*
 * ops/cpu/blas.c — sgemm through OpenBLAS, always single-threaded inside;
 * the threads are ours.
 *
 * OpenBLAS 0.3.21 (Debian's OpenMP build) keeps ONE global thread count, and
 * openblas_set_num_threads frees and reallocates its per-thread buffers: called
 * while another thread runs a sgemm — from inside an OpenMP team (conv2d's
 * per-image gemms), from another device's worker with a different budget, or
 * from another rank thread — it corrupts that sgemm's result (wrong conv2d
 * gradients about once in 60 steps on two threads; scripts/openblas_race.c
 * reproduces it without Tessera). Its own threading even calls that setter
 * from inside a sgemm whenever the caller's OpenMP budget differs from the
 * global count. So OpenBLAS is set to one thread once, before its first use,
 * and never touched again (it then never resizes anything), and a large sgemm
 * outside a parallel region is split here: C's rows or columns in one
 * contiguous block per thread of an OpenMP team, each block one single-threaded
 * OpenBLAS call. A split along M or N leaves every element's sum over K in the
 * same order, so the result is the same for any thread count.
 */
#include "tensor/tensor.h"
#include "device/k_blas.h"

#include <cblas.h>
#include <omp.h>
#include <pthread.h>

void openblas_set_num_threads(int n); /* from OpenBLAS; not in every cblas.h */

/* Below this many multiply-adds (about 50 us of one core) one thread does the whole product. */
#define SGEMM_PAR_MIN (1 << 21)

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
/* OpenBLAS's OpenMP build also sets the calling thread's OpenMP count: put it back. */
static void blas_single_threaded(void) {
    int n = omp_get_max_threads();
    openblas_set_num_threads(1);
    omp_set_num_threads(n);
}

static void sgemm1(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                   const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)M,
                (blasint)N, (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
}

// C: (M, N) = alpha op(A): (M, K) @ op(B): (K, N) + beta C, row-major; op(A) = A^T when ta (A stored (K, M))
static ts_status cpu_sgemm(ts_device *d, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                           const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                           int64_t ldc) {
    (void)d;
    if (M == 0 || N == 0) return TS_OK;
    pthread_once(&blas_once, blas_single_threaded);
    int nthr = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (nthr <= 1 || (double)M * (double)N * (double)K < SGEMM_PAR_MIN) {
        sgemm1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return TS_OK;
    }
    const bool by_rows = M >= N; /* split the longer side of C */
    const int64_t len = by_rows ? M : N, align = by_rows ? 8 : 16;
#pragma omp parallel num_threads(nthr)
    {
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t per = ((len + nt - 1) / nt + align - 1) / align * align;
        const int64_t lo = TS_MIN(len, t * per), hi = TS_MIN(len, lo + per);
        if (hi > lo) {
            if (by_rows) /* rows lo..hi of C: rows of A, or columns of the stored A^T */
                sgemm1(ta, tb, hi - lo, N, K, alpha, ta ? A + lo : A + lo * lda, lda, B, ldb, beta, C + lo * ldc,
                       ldc);
            else /* columns lo..hi of C: columns of B, or rows of the stored B^T */
                sgemm1(ta, tb, M, hi - lo, K, alpha, A, lda, tb ? B + lo * ldb : B + lo, ldb, beta, C + lo, ldc);
        }
    }
    return TS_OK;
}

/* A batch of products. Products big enough to split (cpu_sgemm's rule) run one
 * after another, each split across the threads; smaller ones run one per thread
 * (whole products, so each element's sum over K is in the same order as with
 * one thread). */
static ts_status cpu_sgemm_batched(ts_device *d, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                                   const float *A, int64_t lda, const int64_t *aoff, const float *B, int64_t ldb,
                                   const int64_t *boff, float beta, float *C, int64_t ldc, int64_t cstride,
                                   int64_t batch) {
    if (M == 0 || N == 0 || batch == 0) return TS_OK;
    pthread_once(&blas_once, blas_single_threaded);
    int nthr = omp_in_parallel() ? 1 : omp_get_max_threads();
    double work = (double)M * (double)N * (double)K;
    if (batch == 1 || nthr <= 1 || work >= SGEMM_PAR_MIN) {
        for (int64_t i = 0; i < batch; i++)
            TS_TRY(cpu_sgemm(d, ta, tb, M, N, K, alpha, A + aoff[i], lda, B + boff[i], ldb, beta, C + i * cstride,
                             ldc));
        return TS_OK;
    }
#pragma omp parallel for num_threads(nthr) if (work * (double)batch >= SGEMM_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < batch; i++)
        sgemm1(ta, tb, M, N, K, alpha, A + aoff[i], lda, B + boff[i], ldb, beta, C + i * cstride, ldc);
    return TS_OK;
}

const struct ts_kernels_blas ts_cpu_kernels_blas = {
    .sgemm = cpu_sgemm,
    .sgemm_batched = cpu_sgemm_batched,
};
