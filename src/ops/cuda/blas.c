/*
 * ops/cuda/blas.c — the blas family on CUDA devices: cuBLAS.
 *
 * Our matrices are row-major; cuBLAS's are column-major. A row-major C (M x N)
 * is a column-major C^T, so C = op(A) op(B) runs as C^T = op(B)^T op(A)^T:
 * the operands swap places and M/N swap, the transposes stay as given.
 *
 * Precision follows ts_get_matmul_precision(), like the CPU: float32 products
 * in float32 (CUBLAS_COMPUTE_32F: never TF32, as PyTorch's default
 * allow_tf32=False for matmuls); under TS_BF16 both operands are rounded to
 * bfloat16 copies (nearest even, the cast kernel of ew.cu, as the CPU rounds)
 * and multiplied as bf16 x bf16 -> float32 with float32 accumulation on the
 * tensor cores. (CUBLAS_COMPUTE_32F_FAST_16BF on float32 operands was tried:
 * its results differed from the CPU's bf16 products by ~1e-2 relative on a
 * 64x96x80 product, not the ~1e-6 of a different summation order: it does not
 * round its inputs to nearest.) TS_F16 (float16 training) is the same with
 * float16 copies (CUDA_R_16F). gemm_bf16 (autocast's linear) takes bfloat16
 * activations as they are and rounds only its float32 operands (the weights).
 *
 * A batch whose operand offsets are evenly spaced (broadcast operands: spacing 0)
 * is one strided-batched call; other batches run product by product. The handle
 * is created on the device's first product, bound to the device's stream, and
 * used under the device's lib_mu (a cuBLAS handle is not for two threads at once).
 */
#include "ops/cuda/common.h"
#include "ops/cuda/ew_cu.h"
#include "device/k_blas.h"

#include <cublas_v2.h>
#include <limits.h>

static const char *cublas_msg(cublasStatus_t st) {
    switch (st) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "error";
    }
}

static ts_status cublas_status(ts_device *d, cublasStatus_t st, const char *call) {
    if (st == CUBLAS_STATUS_SUCCESS) return TS_OK;
    return ts_error(st == CUBLAS_STATUS_ALLOC_FAILED ? TS_ERR_NOMEM : TS_ERR_DEVICE, "%s: %s failed: %s (%d)", d->name,
                    call, cublas_msg(st), (int)st);
}
#define CUBLAS_TRY(d, call) TS_TRY(cublas_status((d), (call), #call))

/* The device's handle (created on first use), with lib_mu held on success. */
static ts_status lock_handle(ts_device *d, cublasHandle_t *out) {
    ts__cuda_ctx *c = ts__cuda(d);
    cudaStream_t s;
    TS_TRY(ts__cuda_enter(d, &s));
    pthread_mutex_lock(&c->lib_mu);
    if (!c->cublas) {
        cublasHandle_t h = NULL;
        ts_status st = cublas_status(d, cublasCreate(&h), "cublasCreate");
        if (st == TS_OK) st = cublas_status(d, cublasSetStream(h, s), "cublasSetStream");
        if (st != TS_OK) {
            if (h) cublasDestroy(h);
            pthread_mutex_unlock(&c->lib_mu);
            return st;
        }
        c->cublas = h;
    }
    *out = c->cublas;
    return TS_OK;
}

static void unlock_handle(ts_device *d) { pthread_mutex_unlock(&ts__cuda(d)->lib_mu); }

static bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

static ts_status check_dims(ts_device *d, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc) {
    if (fits_int(M) && fits_int(N) && fits_int(K) && fits_int(lda) && fits_int(ldb) && fits_int(ldc)) return TS_OK;
    return ts_error(TS_ERR_UNSUPPORTED, "%s: gemm %lld x %lld x %lld (leading dims %lld, %lld, %lld) exceeds cuBLAS's "
                    "32-bit sizes", d->name, (long long)M, (long long)N, (long long)K, (long long)lda, (long long)ldb,
                    (long long)ldc);
}

/* The elements a (rows x cols, leading dim ld) spans in memory. */
static int64_t span(bool trans, int64_t r, int64_t c, int64_t ld) {
    int64_t rows = trans ? c : r, cols = trans ? r : c;
    return rows ? (rows - 1) * ld + cols : 0;
}

/* Operands as cuBLAS reads them: the float32 originals, or (bf16 / f16 precision) 16-bit copies rounded to
 * nearest even in scratch tensors *ta / *tb (released by the caller after queuing the product). */
typedef struct gemm_operands {
    const void *a, *b;
    cudaDataType_t type;
    cublasComputeType_t compute;
    ts_tensor *ta, *tb;
} gemm_operands;

/* One operand of n elements of dtype dt as cuBLAS reads it in 16-bit type ct (TS_CU_BF16 / TS_CU_F16): as it is
 * when it is of that type already (bfloat16 activations under autocast), else a copy rounded to nearest even in
 * the scratch *t (released by the caller after queuing the product). */
static ts_status operand16(ts_device *d, cudaStream_t s, int ct, const void *p, ts_dtype dt, int64_t n,
                           const void **out, ts_tensor **t, const char *what) {
    *out = p;
    *t = NULL;
    if ((ct == TS_CU_BF16 && dt == TS_BF16) || (ct == TS_CU_F16 && dt == TS_F16)) return TS_OK;
    TS_TRY(ts__scratch_bytes(d, (size_t)TS_MAX(n, 1) * 2, t));
    ts_status st = ts__cuda_status(d, ts_cu_cast(ts__ptr(*t), ct, p, TS_CU_F32, n, s), what);
    if (st != TS_OK) {
        ts_tensor_release(*t);
        *t = NULL;
        return st;
    }
    *out = ts__ptr(*t);
    return TS_OK;
}

static ts_status operands(ts_device *d, const float *A, int64_t na, const float *B, int64_t nb, gemm_operands *o) {
    memset(o, 0, sizeof *o);
    o->a = A, o->b = B, o->type = CUDA_R_32F, o->compute = CUBLAS_COMPUTE_32F;
    const ts_dtype prec = ts_get_matmul_precision();
    if (prec != TS_BF16 && prec != TS_F16) return TS_OK;
    const int ct = prec == TS_BF16 ? TS_CU_BF16 : TS_CU_F16;
    TS_CU_BEGIN(d, s);
    ts_status st = operand16(d, s, ct, A, TS_F32, na, &o->a, &o->ta, "gemm: 16-bit A");
    if (st == TS_OK) st = operand16(d, s, ct, B, TS_F32, nb, &o->b, &o->tb, "gemm: 16-bit B");
    if (st != TS_OK) {
        ts_tensor_release(o->ta);
        ts_tensor_release(o->tb);
        return st;
    }
    o->type = prec == TS_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    return TS_OK;
}

static void operands_done(gemm_operands *o) {
    ts_tensor_release(o->ta);
    ts_tensor_release(o->tb);
}

static ts_status cuda_sgemm(ts_device *d, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                            const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                            int64_t ldc) {
    if (M == 0 || N == 0) return TS_OK;
    TS_TRY(check_dims(d, M, N, K, lda, ldb, ldc));
    gemm_operands o;
    TS_TRY(operands(d, A, span(trans_a, M, K, lda), B, span(trans_b, K, N, ldb), &o));
    cublasHandle_t h;
    ts_status st = lock_handle(d, &h);
    if (st == TS_OK) {
        st = cublas_status(d,
                           cublasGemmEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        (int)N, (int)M, (int)K, &alpha, o.b, o.type, (int)ldb, o.a, o.type, (int)lda,
                                        &beta, C, CUDA_R_32F, (int)ldc, o.compute, CUBLAS_GEMM_DEFAULT),
                           "cublasGemmEx");
        unlock_handle(d);
    }
    operands_done(&o);
    return st;
}

/* The common spacing of offs[0..n), or -1 when they are not evenly spaced. */
static int64_t spacing(const int64_t *offs, int64_t n) {
    if (n < 2) return 0;
    int64_t s = offs[1] - offs[0];
    for (int64_t i = 2; i < n; i++)
        if (offs[i] - offs[i - 1] != s) return -1;
    return s < 0 ? -1 : s;
}

static ts_status cuda_sgemm_batched(ts_device *d, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                    float alpha, const float *A, int64_t lda, const int64_t *aoff, const float *B,
                                    int64_t ldb, const int64_t *boff, float beta, float *C, int64_t ldc,
                                    int64_t cstride, int64_t batch) {
    if (M == 0 || N == 0 || batch == 0) return TS_OK;
    TS_TRY(check_dims(d, M, N, K, lda, ldb, ldc));
    int64_t sa = spacing(aoff, batch), sb = spacing(boff, batch);
    cublasOperation_t opa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, opb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (sa >= 0 && sb >= 0 && batch <= INT_MAX) {
        /* the operands as one span each, from the first offset to the end of the last product's */
        int64_t na = sa * (batch - 1) + span(trans_a, M, K, lda), nb = sb * (batch - 1) + span(trans_b, K, N, ldb);
        gemm_operands o;
        TS_TRY(operands(d, A + aoff[0], na, B + boff[0], nb, &o));
        cublasHandle_t h;
        ts_status st = lock_handle(d, &h);
        if (st == TS_OK) {
            st = cublas_status(d,
                               cublasGemmStridedBatchedEx(h, opb, opa, (int)N, (int)M, (int)K, &alpha, o.b, o.type,
                                                          (int)ldb, sb, o.a, o.type, (int)lda, sa, &beta, C,
                                                          CUDA_R_32F, (int)ldc, cstride, (int)batch, o.compute,
                                                          CUBLAS_GEMM_DEFAULT),
                               "cublasGemmStridedBatchedEx");
            unlock_handle(d);
        }
        operands_done(&o);
        return st;
    }
    for (int64_t i = 0; i < batch; i++)
        TS_TRY(cuda_sgemm(d, trans_a, trans_b, M, N, K, alpha, A + aoff[i], lda, B + boff[i], ldb, beta,
                          C + i * cstride, ldc));
    return TS_OK;
}

/* The k_blas gemm_bf16 contract: bfloat16 operands (autocast's activations) read as they are, float32 ones
 * rounded to bfloat16 copies, bf16 x bf16 -> float32 with float32 accumulation whatever the precision. */
static ts_status cuda_gemm_bf16(ts_device *d, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                                const void *A, ts_dtype adt, int64_t lda, const void *B, ts_dtype bdt, int64_t ldb,
                                float beta, float *C, int64_t ldc) {
    if (M == 0 || N == 0) return TS_OK;
    TS_ARG((adt == TS_F32 || adt == TS_BF16) && (bdt == TS_F32 || bdt == TS_BF16),
           "gemm_bf16 on %s: operands of %s and %s (want float32 or bfloat16)", d->name, ts_dtype_name(adt),
           ts_dtype_name(bdt));
    TS_TRY(check_dims(d, M, N, K, lda, ldb, ldc));
    TS_CU_BEGIN(d, s);
    const void *a = NULL, *b = NULL;
    ts_tensor *ta = NULL, *tb = NULL;
    ts_status st = operand16(d, s, TS_CU_BF16, A, adt, span(trans_a, M, K, lda), &a, &ta, "gemm_bf16: bfloat16 A");
    if (st == TS_OK)
        st = operand16(d, s, TS_CU_BF16, B, bdt, span(trans_b, K, N, ldb), &b, &tb, "gemm_bf16: bfloat16 B");
    cublasHandle_t h;
    if (st == TS_OK && (st = lock_handle(d, &h)) == TS_OK) {
        st = cublas_status(d,
                           cublasGemmEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        (int)N, (int)M, (int)K, &alpha, b, CUDA_R_16BF, (int)ldb, a, CUDA_R_16BF,
                                        (int)lda, &beta, C, CUDA_R_32F, (int)ldc, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT),
                           "cublasGemmEx");
        unlock_handle(d);
    }
    ts_tensor_release(ta);
    ts_tensor_release(tb);
    return st;
}

const struct ts_kernels_blas ts_cuda_kernels_blas = {
    .sgemm = cuda_sgemm,
    .sgemm_batched = cuda_sgemm_batched,
    .gemm_bf16 = cuda_gemm_bf16,
};
