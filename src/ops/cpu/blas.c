/*
 * ops/cpu/blas.c — sgemm on the CPU: oneDNN's JIT kernels where the build has
 * them (AVX-512 and AVX512_BF16 picked from cpuid at run time), else OpenBLAS;
 * always single-threaded inside: the threads are ours.
 *
 * Which library. OpenBLAS is held to its AVX2 (Haswell) kernels on this
 * project's machines (OPENBLAS_CORETYPE=Haswell: older builds miscompute with
 * their AVX-512 kernels there), about half the FMA peak of an AVX-512 core;
 * oneDNN's dnnl_sgemm reaches the peak (`tessera bench gemm` prints both).
 * TS_GEMM=openblas|onednn picks one where both are built (ts_cpu_gemm_library).
 *
 * bfloat16 precision (ts_set_matmul_precision(TS_BF16)): both operands are
 * rounded to bfloat16 (core/half.h) and the products accumulated in float32.
 * With oneDNN, the operands are rounded into bfloat16 copies as stored
 * (transposes go to the primitive as strides) and multiplied by a matmul primitive (bf16 x bf16 -> f32, beta 1 as a
 * sum post-op), cached per shape; without it, or for an alpha/beta it does not
 * take, the operands are rounded in float32 and go through sgemm: the same
 * products (a product of two bfloat16 values is exact in float32), summed in
 * another order. float16 precision (TS_F16, the float16 training of --precision
 * fp16, with loss scaling) always takes that second path: the operands rounded
 * to float16 values (11-bit mantissas: their products are exact in float32) —
 * this CPU has no float16 arithmetic, so it runs at float32's speed and stands
 * for the GPU's float16 tensor-core products.
 *
 * Threads. OpenBLAS 0.3.21 (Debian's OpenMP build) keeps ONE global thread
 * count, and openblas_set_num_threads frees and reallocates its per-thread
 * buffers: called while another thread runs a sgemm — from inside an OpenMP
 * team (conv2d's per-image gemms), from another device's worker with a
 * different budget, or from another rank thread — it corrupts that sgemm's
 * result (wrong conv2d gradients about once in 60 steps on two threads;
 * scripts/openblas_race.c reproduces it without Tessera). Its own threading even
 * calls that setter from inside a sgemm whenever the caller's OpenMP budget
 * differs from the global count. So OpenBLAS is set to one thread once, before
 * its first use, and never touched again, and oneDNN (OpenMP runtime) is called
 * with the calling thread's OpenMP count set to 1 for the call. A large product
 * outside a parallel region is split here: C's rows or columns in one contiguous
 * block per thread of an OpenMP team, each block one single-threaded call. A
 * split along M or N leaves every element's sum over K in the same order, so
 * the result is the same for any thread count.
 */
#include "core/env.h"
#include "tensor/tensor.h"
#include "device/k_blas.h"
#include "core/half.h"

#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <strings.h>

#ifdef TS_HAVE_DNNL
#include "ops/cpu/onednn.h"
#endif

void openblas_set_num_threads(int n); /* from OpenBLAS; not in every cblas.h */

/* Below this many multiply-adds (about 50 us of one core) one thread does the whole product. */
#define SGEMM_PAR_MIN (1 << 21)

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static _Atomic bool use_dnnl; /* set by blas_init (TS_GEMM) and ts_set_cpu_gemm_library */

/* OpenBLAS's OpenMP build also sets the calling thread's OpenMP count: put it back. */
static void blas_init(void) {
    int n = omp_get_max_threads();
    openblas_set_num_threads(1);
    omp_set_num_threads(n);
#ifdef TS_HAVE_DNNL
    use_dnnl = ts_env_enum(TS_ENV_GEMM) == TS_ENV_GEMM_ONEDNN; /* a bad value warns (core/env.c): onednn */
#endif
}

const char *ts_cpu_gemm_library(void) {
    pthread_once(&blas_once, blas_init);
    return use_dnnl ? "onednn" : "openblas";
}

ts_status ts_set_cpu_gemm_library(const char *name) {
    pthread_once(&blas_once, blas_init);
    bool dnnl = name && strcasecmp(name, "onednn") == 0;
    TS_ARG(dnnl || (name && strcasecmp(name, "openblas") == 0), "GEMM library '%s': expected onednn or openblas",
           name ? name : "(null)");
#ifndef TS_HAVE_DNNL
    if (dnnl) return ts_error(TS_ERR_UNSUPPORTED, "GEMM library onednn: this build has no oneDNN (libdnnl-dev)");
#endif
    use_dnnl = dnnl;
    return TS_OK;
}

#ifdef TS_HAVE_DNNL
/* Runs f with the calling thread's OpenMP count at 1 (oneDNN threads with it), then restores it. */
#define ONE_THREAD(f)                              \
    do {                                           \
        int saved_ = omp_get_max_threads();        \
        if (saved_ != 1) omp_set_num_threads(1);   \
        f;                                         \
        if (saved_ != 1) omp_set_num_threads(saved_); \
    } while (0)
#endif

static void sgemm1(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                   const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
#ifdef TS_HAVE_DNNL
    if (use_dnnl) {
        ONE_THREAD((void)dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));
        return;
    }
#endif
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)M,
                (blasint)N, (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
}

/* ---- bfloat16 precision ---------------------------------------------------------------------------- */
/* Scratch of `bytes` for the rounded operands, from the device's (caching) allocator; NULL when out of memory. */
static ts_tensor *scratch_bytes(ts_device *d, size_t bytes) {
    ts_tensor *t = NULL;
    return ts__scratch_bytes(d, bytes, &t) == TS_OK ? t : NULL;
}

/* X (rows x cols as stored, leading dimension ld) into dst, contiguous rows x cols, each value rounded to
 * bfloat16: as 16-bit values (dst16) or as float32 (dst32). Row by row, as stored: the loops vectorise;
 * transposes stay with the product. */
/* X's rows rounded to bfloat16 (dst16: the 16-bit values, ts_convert's per-ISA loop) or to the nearest value of
 * dt, BF16 or F16, kept in float32 (dst32). */
static void round_rows(int64_t rows, int64_t cols, const float *X, int64_t ld, uint16_t *dst16, float *dst32,
                       ts_dtype dt) {
    for (int64_t i = 0; i < rows; i++) {
        const float *x = X + i * ld;
        if (dst16) {
            (void)ts_convert(dst16 + i * cols, TS_BF16, x, TS_F32, (size_t)cols);
        } else if (dt == TS_F16) {
            float *o = dst32 + i * cols;
            for (int64_t j = 0; j < cols; j++) o[j] = ts__f16_to_f32(ts__f16_from_f32(x[j]));
        } else {
            float *o = dst32 + i * cols;
            for (int64_t j = 0; j < cols; j++) o[j] = ts__bf16_to_f32(ts__bf16_from_f32(x[j]));
        }
    }
}

#ifdef TS_HAVE_DNNL
/* bf16 x bf16 -> f32 matmul primitives, one per (M, N, K, transposes, ldc, accumulate); a small table searched
 * linearly (a network has a few dozen shapes), the oldest replaced when full. */
#define PRIM_CACHE 128
typedef struct prim_entry {
    int64_t M, N, K, ldc;
    bool ta, tb, acc;
    dnnl_primitive_t prim;
    size_t scratch_bytes;
    uint64_t used;
} prim_entry;
static prim_entry prims[PRIM_CACHE];
static int nprims;
static uint64_t prim_clock;
static pthread_mutex_t prim_mu = PTHREAD_MUTEX_INITIALIZER;

/* The logical (rows, cols) operand of a product, stored contiguously as (cols, rows) when transposed. */
static bool operand_md(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, bool t, dnnl_data_type_t dt) {
    dnnl_dims_t dims = {rows, cols}, strides = {t ? 1 : cols, t ? rows : 1};
    return dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides) == dnnl_success;
}

static bool prim_make(prim_entry *e) {
    dnnl_memory_desc_t a, b, c;
    dnnl_dims_t cd = {e->M, e->N}, cs = {e->ldc, 1};
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    bool ok = operand_md(&a, e->M, e->K, e->ta, dnnl_bf16) && operand_md(&b, e->K, e->N, e->tb, dnnl_bf16) &&
              dnnl_memory_desc_init_by_strides(&c, 2, cd, dnnl_f32, cs) == dnnl_success &&
              dnnl_matmul_desc_init(&md, &a, &b, NULL, &c) == dnnl_success &&
              dnnl_primitive_attr_create(&attr) == dnnl_success &&
              dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
    if (ok && e->acc)
        ok = dnnl_post_ops_create(&po) == dnnl_success && dnnl_post_ops_append_sum(po, 1.0f) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    ok = ok && dnnl_primitive_desc_create(&pd, &md, attr, ts__dnnl_engine(), NULL) == dnnl_success;
    e->scratch_bytes = ok ? ts__dnnl_scratchpad_bytes(pd) : 0;
    ok = ok && dnnl_primitive_create(&e->prim, pd) == dnnl_success;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return ok;
}

/* The cached primitive for this shape (NULL when oneDNN cannot make one). */
static dnnl_primitive_t prim_get(int64_t M, int64_t N, int64_t K, bool ta, bool tb, int64_t ldc, bool acc,
                                 size_t *scratch_bytes) {
    dnnl_primitive_t p = NULL;
    const bool have_eng = ts__dnnl_engine() != NULL;
    pthread_mutex_lock(&prim_mu);
    for (int i = 0; have_eng && i < nprims && !p; i++) {
        prim_entry *e = &prims[i];
        if (e->M == M && e->N == N && e->K == K && e->ta == ta && e->tb == tb && e->ldc == ldc && e->acc == acc) {
            e->used = ++prim_clock;
            p = e->prim;
            *scratch_bytes = e->scratch_bytes;
        }
    }
    if (!p && have_eng) {
        int slot = nprims < PRIM_CACHE ? nprims : 0;
        for (int i = 1; nprims == PRIM_CACHE && i < PRIM_CACHE; i++)
            if (prims[i].used < prims[slot].used) slot = i;
        /* a replaced primitive may still run on another thread: it is kept (leaked) rather than destroyed */
        prim_entry e = {M, N, K, ldc, ta, tb, acc, NULL, 0, ++prim_clock};
        if (prim_make(&e)) {
            prims[slot] = e;
            if (nprims < PRIM_CACHE) nprims++;
            p = e.prim;
            *scratch_bytes = e.scratch_bytes;
        }
    }
    pthread_mutex_unlock(&prim_mu);
    return p;
}

/* C = op(a) op(b) (+ C when acc) for contiguous bfloat16 operands (round_rows' layout) -> float32, on one
 * thread (inside blas.c's split) or on the calling thread's whole OpenMP budget (all_threads); false when
 * oneDNN could not run it. */
static bool matmul_bf16_run(ts_device *d, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t *a,
                            const uint16_t *b, bool acc, float *C, int64_t ldc, bool all_threads) {
    size_t sbytes = 0;
    dnnl_primitive_t p = prim_get(M, N, K, ta, tb, ldc, acc, &sbytes);
    if (!p) return false;
    ts_tensor *tw = sbytes ? scratch_bytes(d, sbytes) : NULL;
    void *ws = tw ? ts__ptr(tw) : NULL;
    bool ok = !sbytes || ws;
    dnnl_memory_desc_t ad, bd, cd;
    dnnl_dims_t cd_ = {M, N}, cs = {ldc, 1};
    dnnl_memory_t am = NULL, bm = NULL, cm = NULL, sm = NULL;
    dnnl_stream_t s = NULL;
    dnnl_engine_t eng = ts__dnnl_engine();
    ok = ok && operand_md(&ad, M, K, ta, dnnl_bf16) && operand_md(&bd, K, N, tb, dnnl_bf16) &&
         dnnl_memory_desc_init_by_strides(&cd, 2, cd_, dnnl_f32, cs) == dnnl_success &&
         dnnl_memory_create(&am, &ad, eng, (void *)a) == dnnl_success &&
         dnnl_memory_create(&bm, &bd, eng, (void *)b) == dnnl_success &&
         dnnl_memory_create(&cm, &cd, eng, C) == dnnl_success &&
         dnnl_stream_create(&s, eng, dnnl_stream_default_flags) == dnnl_success;
    if (ok && sbytes) ok = ts__dnnl_bytes_memory(ws, sbytes, &sm);
    if (ok) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm},
                                   {DNNL_ARG_SCRATCHPAD, sm}};
        dnnl_status_t st = dnnl_success;
        if (all_threads)
            st = dnnl_primitive_execute(p, s, sbytes ? 4 : 3, args);
        else
            ONE_THREAD(st = dnnl_primitive_execute(p, s, sbytes ? 4 : 3, args));
        ok = st == dnnl_success && dnnl_stream_wait(s) == dnnl_success;
    }
    if (s) dnnl_stream_destroy(s);
    if (am) dnnl_memory_destroy(am);
    if (bm) dnnl_memory_destroy(bm);
    if (cm) dnnl_memory_destroy(cm);
    if (sm) dnnl_memory_destroy(sm);
    ts_tensor_release(tw);
    return ok;
}

/* C = op(A) op(B) (+ C when acc) in bfloat16 x bfloat16 -> float32 from float32 operands, rounded here; false
 * when oneDNN could not run it. */
static bool gemm_bf16_dnnl(ts_device *d, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A,
                           int64_t lda, const float *B, int64_t ldb, bool acc, float *C, int64_t ldc) {
    ts_tensor *ta_ = scratch_bytes(d, (size_t)(M * K) * 2), *tb_ = scratch_bytes(d, (size_t)(K * N) * 2);
    uint16_t *a = ta_ ? ts__ptr(ta_) : NULL, *b = tb_ ? ts__ptr(tb_) : NULL;
    bool ok = a && b;
    if (ok) {
        round_rows(ta ? K : M, ta ? M : K, A, lda, a, NULL, TS_BF16);
        round_rows(tb ? N : K, tb ? K : N, B, ldb, b, NULL, TS_BF16);
        ok = matmul_bf16_run(d, ta, tb, M, N, K, a, b, acc, C, ldc, false);
    }
    ts_tensor_release(ta_);
    ts_tensor_release(tb_);
    return ok;
}
#endif

#ifdef TS_HAVE_DNNL
/* Whether a product in precision prec goes to oneDNN's bfloat16 matmul primitive. */
static bool bf16_dnnl_takes(ts_dtype prec, float alpha, float beta, int64_t K) {
    return prec == TS_BF16 && use_dnnl && alpha == 1.0f && (beta == 0.0f || beta == 1.0f) && K > 0;
}
#endif

/* One product in bfloat16 or float16 precision (see the top of the file). */
static ts_status gemm1_half(ts_device *d, ts_dtype prec, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                            float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                            int64_t ldc) {
#ifdef TS_HAVE_DNNL
    if (bf16_dnnl_takes(prec, alpha, beta, K) && gemm_bf16_dnnl(d, ta, tb, M, N, K, A, lda, B, ldb, beta == 1.0f, C, ldc))
        return TS_OK;
#endif
    ts_tensor *ta_ = scratch_bytes(d, (size_t)(M * K) * 4), *tb_ = scratch_bytes(d, (size_t)(K * N) * 4);
    if (!ta_ || !tb_) {
        ts_tensor_release(ta_);
        ts_tensor_release(tb_);
        return ts_error(TS_ERR_NOMEM, "sgemm (%s precision): %lld x %lld x %lld operands", ts_dtype_name(prec),
                        (long long)M, (long long)N, (long long)K);
    }
    float *a = ts__ptr(ta_), *b = ts__ptr(tb_);
    round_rows(ta ? K : M, ta ? M : K, A, lda, NULL, a, prec);
    round_rows(tb ? N : K, tb ? K : N, B, ldb, NULL, b, prec);
    sgemm1(ta, tb, M, N, K, alpha, a, ta ? M : K, b, tb ? K : N, beta, C, ldc);
    ts_tensor_release(ta_);
    ts_tensor_release(tb_);
    return TS_OK;
}

static ts_status gemm1(ts_device *d, ts_dtype prec, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (prec != TS_F32) return gemm1_half(d, prec, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    sgemm1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return TS_OK;
}

// C: (M, N) = alpha op(A): (M, K) @ op(B): (K, N) + beta C, row-major; op(A) = A^T when ta (A stored (K, M))
static ts_status cpu_sgemm(ts_device *d, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                           const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                           int64_t ldc) {
    if (M == 0 || N == 0) return TS_OK;
    pthread_once(&blas_once, blas_init);
    const ts_dtype prec = ts_get_matmul_precision();
    int nthr = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (nthr <= 1 || (double)M * (double)N * (double)K < SGEMM_PAR_MIN)
        return gemm1(d, prec, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    const bool by_rows = M >= N; /* split the longer side of C */
    const int64_t len = by_rows ? M : N, align = by_rows ? 8 : 16;
    int bad = 0;
#pragma omp parallel num_threads(nthr) reduction(| : bad)
    {
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t per = ((len + nt - 1) / nt + align - 1) / align * align;
        const int64_t lo = TS_MIN(len, t * per), hi = TS_MIN(len, lo + per);
        if (hi > lo) {
            if (by_rows) /* rows lo..hi of C: rows of A, or columns of the stored A^T */
                bad |= gemm1(d, prec, ta, tb, hi - lo, N, K, alpha, ta ? A + lo : A + lo * lda, lda, B, ldb, beta,
                             C + lo * ldc, ldc) != TS_OK;
            else /* columns lo..hi of C: columns of B, or rows of the stored B^T */
                bad |= gemm1(d, prec, ta, tb, M, hi - lo, K, alpha, A, lda, tb ? B + lo * ldb : B + lo, ldb, beta,
                             C + lo, ldc) != TS_OK;
        }
    }
    return bad ? ts_error(TS_ERR_NOMEM, "sgemm (%s precision): out of memory for the rounded operands", ts_dtype_name(prec))
               : TS_OK;
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
    pthread_once(&blas_once, blas_init);
    const ts_dtype prec = ts_get_matmul_precision();
    int nthr = omp_in_parallel() ? 1 : omp_get_max_threads();
    double work = (double)M * (double)N * (double)K;
    if (batch == 1 || nthr <= 1 || work >= SGEMM_PAR_MIN) {
        for (int64_t i = 0; i < batch; i++)
            TS_TRY(cpu_sgemm(d, ta, tb, M, N, K, alpha, A + aoff[i], lda, B + boff[i], ldb, beta, C + i * cstride,
                             ldc));
        return TS_OK;
    }
    int bad = 0;
#pragma omp parallel for num_threads(nthr) if (work * (double)batch >= SGEMM_PAR_MIN) schedule(static) reduction(| : bad)
    for (int64_t i = 0; i < batch; i++)
        bad |= gemm1(d, prec, ta, tb, M, N, K, alpha, A + aoff[i], lda, B + boff[i], ldb, beta, C + i * cstride, ldc) !=
               TS_OK;
    return bad ? ts_error(TS_ERR_NOMEM, "sgemm (%s precision): out of memory for the rounded operands", ts_dtype_name(prec))
               : TS_OK;
}

/* ---- bfloat16 operands (autocast's activations) ---------------------------------------------------------- */
/* X (rows x cols as stored, leading dimension ld; F32 or BF16) into dst, contiguous rows x cols bfloat16:
 * copied, or rounded to nearest even; rows over the threads when there are many */
#ifdef TS_HAVE_DNNL
static void bf16_rows(int64_t rows, int64_t cols, const void *X, ts_dtype dt, int64_t ld, uint16_t *dst) {
#pragma omp parallel for if (!omp_in_parallel() && rows * cols >= (1 << 16)) schedule(static)
    for (int64_t i = 0; i < rows; i++)
        (void)ts_convert(dst + i * cols, TS_BF16, (const char *)X + (size_t)(i * ld) * ts_dtype_size(dt), dt, (size_t)cols);
}
#endif

/* The k_blas gemm_bf16 contract (device/k_blas.h): oneDNN's bfloat16 matmul on the calling thread's OpenMP
 * budget, bfloat16 operands read where they are already contiguous; without oneDNN (or for an alpha/beta its
 * primitive does not take), float32 copies of the operands through the bfloat16-precision sgemm path (the
 * same products: bfloat16 values round to themselves). */
static ts_status cpu_gemm_bf16(ts_device *d, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                               const void *A, ts_dtype adt, int64_t lda, const void *B, ts_dtype bdt, int64_t ldb,
                               float beta, float *C, int64_t ldc) {
    if (M == 0 || N == 0) return TS_OK;
    TS_ARG((adt == TS_F32 || adt == TS_BF16) && (bdt == TS_F32 || bdt == TS_BF16),
           "gemm_bf16: operands of %s and %s (want float32 or bfloat16)", ts_dtype_name(adt), ts_dtype_name(bdt));
    pthread_once(&blas_once, blas_init);
    const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    ts_status st = TS_OK;
    ts_tensor *sa = NULL, *sb = NULL;
#ifdef TS_HAVE_DNNL
    if (bf16_dnnl_takes(TS_BF16, alpha, beta, K)) {
        const uint16_t *a = adt == TS_BF16 && lda == ac ? A : NULL, *b = bdt == TS_BF16 && ldb == bc ? B : NULL;
        if (!a && (sa = scratch_bytes(d, (size_t)(ar * ac) * 2))) bf16_rows(ar, ac, A, adt, lda, ts__ptr(sa));
        if (!b && (sb = scratch_bytes(d, (size_t)(br * bc) * 2))) bf16_rows(br, bc, B, bdt, ldb, ts__ptr(sb));
        if (!a) a = sa ? ts__ptr(sa) : NULL;
        if (!b) b = sb ? ts__ptr(sb) : NULL;
        bool done = a && b && matmul_bf16_run(d, ta, tb, M, N, K, a, b, beta == 1.0f, C, ldc, true);
        ts_tensor_release(sa);
        ts_tensor_release(sb);
        if (done) return TS_OK;
        sa = sb = NULL;
    }
#endif
    /* float32 copies (contiguous), then the bfloat16-precision path of cpu_sgemm */
    sa = scratch_bytes(d, (size_t)(ar * ac) * 4);
    sb = scratch_bytes(d, (size_t)(br * bc) * 4);
    if (!sa || !sb) {
        st = ts_error(TS_ERR_NOMEM, "gemm_bf16: %lld x %lld x %lld operands", (long long)M, (long long)N, (long long)K);
    } else {
        float *fa = ts__ptr(sa), *fb = ts__ptr(sb);
        for (int64_t i = 0; i < ar; i++)
            (void)ts_convert(fa + i * ac, TS_F32, (const char *)A + (size_t)(i * lda) * ts_dtype_size(adt), adt, (size_t)ac);
        for (int64_t i = 0; i < br; i++)
            (void)ts_convert(fb + i * bc, TS_F32, (const char *)B + (size_t)(i * ldb) * ts_dtype_size(bdt), bdt, (size_t)bc);
        st = gemm1(d, TS_BF16, ta, tb, M, N, K, alpha, fa, ac, fb, bc, beta, C, ldc);
    }
    ts_tensor_release(sa);
    ts_tensor_release(sb);
    return st;
}

const struct ts_kernels_blas ts_cpu_kernels_blas = {
    .sgemm = cpu_sgemm,
    .sgemm_batched = cpu_sgemm_batched,
    .gemm_bf16 = cpu_gemm_bf16,
};
