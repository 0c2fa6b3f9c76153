/*
 * ops/cuda/ew.cu — CUDA kernels of the elementwise family (launchers declared in ew_cu.h).
 *
 * Elementwise kernels: one thread per element in grid-stride loops (TS_CU_LOOP), the formulas
 * from device/k_elem.h, one kernel per op (a template argument), so the op's switch folds away.
 * Strided ones (copy, permute, broadcast binary ops) turn a flat index into offsets by an
 * odometer over at most TS_CU_MAX_DIMS dims (the table coalesces dims first).
 *
 * Reductions, all deterministic (the split depends on the shape only; fixed shuffle trees):
 *   rows, in double:   x: (rows, n) -> (rows). n <= 1024: a warp per row. Longer rows: a block
 *                      per row, or for few rows `splits` blocks per row writing double partials
 *                      that a second kernel adds in order.
 *   columns, in float: x: (outer, n, inner) -> (outer, inner): a block of (32, by) threads takes
 *                      32 columns; each row of threads adds every by-th element, then a tree.
 *   reduce_to, float:  a thread per output adding in x order (as the CPU), or a block per
 *                      output when there are few outputs with many terms each.
 *   max:               a thread per output walking the dim (as the CPU), or for inner == 1 a
 *                      warp per row, the lanes' winners combined: NaN first, then larger, ties
 *                      to the lower index (so the first NaN, else the first maximum).
 */
#include "ops/cuda/ew_cu.h"
#include "core/half.h"
#include "device/k_elem.h"
#include "ops/cuda/elem16.cuh"

#include <math.h>

#define FULL_MASK 0xffffffffu

/* ---- index arithmetic ---------------------------------------------------------------------------- */
/* offsets of flat index i of w's shape under its strides a and b */
static __device__ __forceinline__ void walk_offsets(const ts_cu_walk &w, int64_t i, int64_t *oa, int64_t *ob) {
    int64_t a = 0, b = 0;
#pragma unroll
    for (int d = TS_CU_MAX_DIMS - 1; d >= 0; d--)
        if (d < w.ndim) {
            int64_t q = i / w.shape[d], c = i - q * w.shape[d];
            a += c * w.a[d];
            b += c * w.b[d];
            i = q;
        }
    *oa = a;
    *ob = b;
}

/* offset of flat index i under strides a only */
static __device__ __forceinline__ int64_t walk_offset(const ts_cu_walk &w, int64_t i) {
    int64_t a = 0;
#pragma unroll
    for (int d = TS_CU_MAX_DIMS - 1; d >= 0; d--)
        if (d < w.ndim) {
            int64_t q = i / w.shape[d];
            a += (i - q * w.shape[d]) * w.a[d];
            i = q;
        }
    return a;
}

static int64_t walk_numel(const ts_cu_walk *w) {
    int64_t n = 1;
    for (int d = 0; d < w->ndim; d++) n *= w->shape[d];
    return n;
}

/* ---- fills and copies ------------------------------------------------------------------------------ */
static __global__ void fill_kernel(float *o, int64_t n, float v) {
    TS_CU_LOOP(i, n) o[i] = v;
}

static __global__ void expand_scalar_kernel(float *o, int64_t n, const float *x, float alpha) {
    float v = alpha * x[0];
    TS_CU_LOOP(i, n) o[i] = v;
}

template <typename E>
static __global__ void strided_copy_kernel(E *dst, const E *src, ts_cu_walk w, int64_t n) {
    TS_CU_LOOP(i, n) {
        int64_t a, b;
        walk_offsets(w, i, &a, &b);
        dst[a] = src[b];
    }
}

extern "C" cudaError_t ts_cu_fill(float *o, int64_t n, float v, cudaStream_t s) {
    fill_kernel<<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(o, n, v);
    return cudaGetLastError();
}

extern "C" cudaError_t ts_cu_expand_scalar(float *o, int64_t n, const float *x, float alpha, cudaStream_t s) {
    expand_scalar_kernel<<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(o, n, x, alpha);
    return cudaGetLastError();
}

extern "C" cudaError_t ts_cu_memcpy(void *dst, const void *src, size_t bytes, cudaStream_t s) {
    if (bytes == 0) return cudaSuccess;
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
}

extern "C" cudaError_t ts_cu_strided_copy(void *dst, const void *src, int es, const ts_cu_walk *w, cudaStream_t s) {
    int64_t n = walk_numel(w);
    if (n == 0) return cudaSuccess;
    unsigned g = ts_cu_blocks(n);
    switch (es) {
    case 1: strided_copy_kernel<<<g, TS_CU_THREADS, 0, s>>>((uint8_t *)dst, (const uint8_t *)src, *w, n); break;
    case 2: strided_copy_kernel<<<g, TS_CU_THREADS, 0, s>>>((uint16_t *)dst, (const uint16_t *)src, *w, n); break;
    case 4: strided_copy_kernel<<<g, TS_CU_THREADS, 0, s>>>((uint32_t *)dst, (const uint32_t *)src, *w, n); break;
    case 8: strided_copy_kernel<<<g, TS_CU_THREADS, 0, s>>>((uint64_t *)dst, (const uint64_t *)src, *w, n); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* ---- elementwise arithmetic ------------------------------------------------------------------------ */
template <int OP>
static __global__ void binary_kernel(float *o, const float *a, const float *b, int64_t n) {
    TS_CU_LOOP(i, n) o[i] = ts_elem_binary(OP, a[i], b[i]);
}

template <int OP>
static __global__ void binary_walk_kernel(float *o, const float *a, const float *b, ts_cu_walk w, int64_t n) {
    TS_CU_LOOP(i, n) {
        int64_t oa, ob;
        walk_offsets(w, i, &oa, &ob);
        o[i] = ts_elem_binary(OP, a[oa], b[ob]);
    }
}

template <int OP>
static void binary_launch(float *o, const float *a, const float *b, int64_t n, const ts_cu_walk *w, cudaStream_t s) {
    if (w)
        binary_walk_kernel<OP><<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(o, a, b, *w, n);
    else
        binary_kernel<OP><<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(o, a, b, n);
}

extern "C" cudaError_t ts_cu_binary(int op, float *o, const float *a, const float *b, int64_t n,
                                    const ts_cu_walk *w, cudaStream_t s) {
    switch (op) {
    case TS_ELEM_ADD: binary_launch<TS_ELEM_ADD>(o, a, b, n, w, s); break;
    case TS_ELEM_SUB: binary_launch<TS_ELEM_SUB>(o, a, b, n, w, s); break;
    case TS_ELEM_MUL: binary_launch<TS_ELEM_MUL>(o, a, b, n, w, s); break;
    case TS_ELEM_DIV: binary_launch<TS_ELEM_DIV>(o, a, b, n, w, s); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

static __global__ void scale_kernel(float *o, const float *x, float v, int64_t n) {
    TS_CU_LOOP(i, n) o[i] = ts_elem_scale(x[i], v);
}

static __global__ void axpy_kernel(float *y, float alpha, const float *x, int64_t n) {
    TS_CU_LOOP(i, n) y[i] = ts_elem_axpy(y[i], alpha, x[i]);
}

static __global__ void relu_kernel(float *o, const float *x, int64_t n) {
    TS_CU_LOOP(i, n) o[i] = ts_elem_relu(x[i]);
}

static __global__ void relu_backward_kernel(float *gx, const float *gy, const float *y, int64_t n) {
    TS_CU_LOOP(i, n) gx[i] = ts_elem_relu_backward(gy[i], y[i]);
}

extern "C" cudaError_t ts_cu_scale(float *o, const float *x, float v, int64_t n, cudaStream_t s) {
    scale_kernel<<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(o, x, v, n);
    return cudaGetLastError();
}

extern "C" cudaError_t ts_cu_axpy(float *y, float alpha, const float *x, int64_t n, cudaStream_t s) {
    axpy_kernel<<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(y, alpha, x, n);
    return cudaGetLastError();
}

extern "C" cudaError_t ts_cu_relu(float *o, const float *x, int64_t n, cudaStream_t s) {
    relu_kernel<<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(o, x, n);
    return cudaGetLastError();
}

extern "C" cudaError_t ts_cu_relu_backward(float *gx, const float *gy, const float *y, int64_t n, cudaStream_t s) {
    relu_backward_kernel<<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(gx, gy, y, n);
    return cudaGetLastError();
}

/* ---- bfloat16 activations (and float16 gradients' axpy): each element in float32, rounded once, the
 * CPU's formulas (k_elem.h) ---- */
static __global__ void add_bf16_kernel(uint16_t *o, const uint16_t *a, const uint16_t *b, int64_t n) {
    TS_CU_LOOP(i, n) ts_cu_store<TS_CU_BF16>(o, i, ts_elem_binary(TS_ELEM_ADD, ts_cu_load<TS_CU_BF16>(a, i),
                                                                 ts_cu_load<TS_CU_BF16>(b, i)));
}

template <int D>
static __global__ void axpy16_kernel(void *y, float alpha, const void *x, int64_t n) {
    TS_CU_LOOP(i, n) ts_cu_store<D>(y, i, ts_elem_axpy(ts_cu_load<D>(y, i), alpha, ts_cu_load<D>(x, i)));
}

static __global__ void relu_bf16_kernel(uint16_t *o, const uint16_t *x, int64_t n) {
    TS_CU_LOOP(i, n) ts_cu_store<TS_CU_BF16>(o, i, ts_elem_relu(ts_cu_load<TS_CU_BF16>(x, i)));
}

static __global__ void relu_backward_bf16_kernel(uint16_t *gx, const uint16_t *gy, const uint16_t *y, int64_t n) {
    TS_CU_LOOP(i, n) {
        const float g = ts_cu_load<TS_CU_BF16>(gy, i), v = ts_cu_load<TS_CU_BF16>(y, i);
        ts_cu_store<TS_CU_BF16>(gx, i, ts_elem_relu_backward(g, v));
    }
}

extern "C" cudaError_t ts_cu_add_bf16(uint16_t *o, const uint16_t *a, const uint16_t *b, int64_t n, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    add_bf16_kernel<<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(o, a, b, n);
    return cudaGetLastError();
}

extern "C" cudaError_t ts_cu_axpy16(int dt, void *y, float alpha, const void *x, int64_t n, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    if (dt == TS_CU_BF16)
        axpy16_kernel<TS_CU_BF16><<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(y, alpha, x, n);
    else if (dt == TS_CU_F16)
        axpy16_kernel<TS_CU_F16><<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(y, alpha, x, n);
    else
        return cudaErrorInvalidValue;
    return cudaGetLastError();
}

extern "C" cudaError_t ts_cu_relu_bf16(uint16_t *o, const uint16_t *x, int64_t n, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    relu_bf16_kernel<<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(o, x, n);
    return cudaGetLastError();
}

extern "C" cudaError_t ts_cu_relu_backward_bf16(uint16_t *gx, const uint16_t *gy, const uint16_t *y, int64_t n,
                                                cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    relu_backward_bf16_kernel<<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(gx, gy, y, n);
    return cudaGetLastError();
}

template <int OP>
static __global__ void unary_kernel(float *o, const float *x, int64_t n) {
    TS_CU_LOOP(i, n) o[i] = ts_elem_unary(OP, x[i]);
}

template <int OP>
static __global__ void unary_backward_kernel(float *gx, const float *gy, const float *v, int64_t n) {
    TS_CU_LOOP(i, n) gx[i] = ts_elem_unary_backward(OP, gy[i], v[i]);
}

extern "C" cudaError_t ts_cu_unary(int op, float *o, const float *x, int64_t n, cudaStream_t s) {
    unsigned g = ts_cu_blocks(n);
    switch (op) {
    case TS_ELEM_SIGMOID: unary_kernel<TS_ELEM_SIGMOID><<<g, TS_CU_THREADS, 0, s>>>(o, x, n); break;
    case TS_ELEM_TANH: unary_kernel<TS_ELEM_TANH><<<g, TS_CU_THREADS, 0, s>>>(o, x, n); break;
    case TS_ELEM_GELU: unary_kernel<TS_ELEM_GELU><<<g, TS_CU_THREADS, 0, s>>>(o, x, n); break;
    case TS_ELEM_GELU_TANH: unary_kernel<TS_ELEM_GELU_TANH><<<g, TS_CU_THREADS, 0, s>>>(o, x, n); break;
    case TS_ELEM_SILU: unary_kernel<TS_ELEM_SILU><<<g, TS_CU_THREADS, 0, s>>>(o, x, n); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

extern "C" cudaError_t ts_cu_unary_backward(int op, float *gx, const float *gy, const float *v, int64_t n,
                                            cudaStream_t s) {
    unsigned g = ts_cu_blocks(n);
    switch (op) {
    case TS_ELEM_SIGMOID: unary_backward_kernel<TS_ELEM_SIGMOID><<<g, TS_CU_THREADS, 0, s>>>(gx, gy, v, n); break;
    case TS_ELEM_TANH: unary_backward_kernel<TS_ELEM_TANH><<<g, TS_CU_THREADS, 0, s>>>(gx, gy, v, n); break;
    case TS_ELEM_GELU: unary_backward_kernel<TS_ELEM_GELU><<<g, TS_CU_THREADS, 0, s>>>(gx, gy, v, n); break;
    case TS_ELEM_GELU_TANH:
        unary_backward_kernel<TS_ELEM_GELU_TANH><<<g, TS_CU_THREADS, 0, s>>>(gx, gy, v, n);
        break;
    case TS_ELEM_SILU: unary_backward_kernel<TS_ELEM_SILU><<<g, TS_CU_THREADS, 0, s>>>(gx, gy, v, n); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* ---- reduction helpers ----------------------------------------------------------------------------- */
/* the warp's sum in lane 0 */
template <typename A>
static __device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(FULL_MASK, v, o);
    return v;
}

/* the block's sum in thread 0 (blockDim.x a multiple of 32; every thread of the block calls it) */
template <typename A>
static __device__ A block_sum(A v) {
    __shared__ A part[32];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) part[wid] = v;
    __syncthreads();
    A r = 0;
    if (wid == 0) r = warp_sum(lane < (int)(blockDim.x >> 5) ? part[lane] : (A)0);
    __syncthreads(); /* part is free for the next call */
    return r;
}

/* ---- row sums in double (sum_all, sum_dim with inner == 1, reduce_to to one element, sumsq) -------- */
#define ROW_WARP_MAX 1024 /* rows up to this long: a warp each */
#define ROW_SPLIT 8192    /* a split row gives each block at least this many elements */
#define ROW_BLOCKS 1024   /* split rows while there are fewer blocks than this */

/* SQ: x squared (grad_sumsq), the double sum stored as is; else (float)(alpha * sum) */
template <bool SQ>
static __device__ __forceinline__ double row_term(float v) {
    return SQ ? ts_elem_sq(v) : (double)v;
}

template <bool SQ>
static __device__ __forceinline__ void row_store(float *out, double *dout, int64_t r, double acc, float alpha) {
    if (SQ)
        dout[r] = acc;
    else
        out[r] = (float)((double)alpha * acc);
}

template <bool SQ>
static __global__ void row_warp_kernel(float *out, double *dout, const float *x, int64_t rows, int64_t n, float alpha) {
    int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    for (int64_t r = (int64_t)blockIdx.x * wpb + (threadIdx.x >> 5); r < rows; r += (int64_t)gridDim.x * wpb) {
        const float *row = x + r * n;
        double acc = 0;
        for (int64_t k = lane; k < n; k += 32) acc += row_term<SQ>(row[k]);
        acc = warp_sum(acc);
        if (lane == 0) row_store<SQ>(out, dout, r, acc, alpha);
    }
}

/* block (c, r) adds the c-th of gridDim.x chunks of len elements of row r */
template <bool SQ>
static __global__ void row_block_kernel(float *out, double *dout, double *part, const float *x, int64_t rows, int64_t n,
                                 int64_t len, float alpha) {
    int64_t sp = gridDim.x, c = blockIdx.x;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const float *row = x + r * n;
        int64_t k1 = (c + 1) * len < n ? (c + 1) * len : n;
        double acc = 0;
        for (int64_t k = c * len + threadIdx.x; k < k1; k += blockDim.x) acc += row_term<SQ>(row[k]);
        acc = block_sum(acc);
        if (threadIdx.x == 0) {
            if (sp > 1)
                part[r * sp + c] = acc;
            else
                row_store<SQ>(out, dout, r, acc, alpha);
        }
    }
}

/* the sp partials of each row, added in order */
template <bool SQ>
static __global__ void row_final_kernel(float *out, double *dout, const double *part, int64_t rows, int64_t sp,
                                 float alpha) {
    TS_CU_LOOP(r, rows) {
        double acc = 0;
        for (int64_t c = 0; c < sp; c++) acc += part[r * sp + c];
        row_store<SQ>(out, dout, r, acc, alpha);
    }
}

/* blocks per row: 1, unless few long rows leave the GPU idle */
static int64_t row_splits(int64_t rows, int64_t n) {
    if (n <= ROW_WARP_MAX || rows <= 0) return 1;
    int64_t sp = (n + ROW_SPLIT - 1) / ROW_SPLIT, cap = (ROW_BLOCKS + rows - 1) / rows;
    sp = sp < cap ? sp : cap;
    return sp < 1 ? 1 : sp;
}

extern "C" size_t ts_cu_rowsum_scratch(int64_t rows, int64_t n) {
    int64_t sp = row_splits(rows, n);
    return sp > 1 ? (size_t)(rows * sp) * sizeof(double) : 0;
}

template <bool SQ>
static cudaError_t rowsum(float *out, double *dout, const float *x, int64_t rows, int64_t n, float alpha,
                          void *scratch, cudaStream_t s) {
    if (rows <= 0) return cudaSuccess;
    if (n <= ROW_WARP_MAX) {
        row_warp_kernel<SQ><<<ts_cu_blocks(rows * 32), TS_CU_THREADS, 0, s>>>(out, dout, x, rows, n, alpha);
        return cudaGetLastError();
    }
    int64_t sp = row_splits(rows, n), len = (n + sp - 1) / sp;
    dim3 grid((unsigned)sp, (unsigned)(rows < 65535 ? rows : 65535));
    double *part = (double *)scratch;
    row_block_kernel<SQ><<<grid, TS_CU_THREADS, 0, s>>>(out, dout, part, x, rows, n, len, alpha);
    if (sp > 1) row_final_kernel<SQ><<<ts_cu_blocks(rows), TS_CU_THREADS, 0, s>>>(out, dout, part, rows, sp, alpha);
    return cudaGetLastError();
}

extern "C" cudaError_t ts_cu_rowsum(float *out, const float *x, int64_t rows, int64_t n, float alpha, void *scratch,
                                    cudaStream_t s) {
    return rowsum<false>(out, NULL, x, rows, n, alpha, scratch, s);
}

extern "C" cudaError_t ts_cu_sumsq(double *out, const float *x, int64_t n, void *scratch, cudaStream_t s) {
    return rowsum<true>(NULL, out, x, 1, n, 1.0f, scratch, s);
}

/* ---- column sums in float (sum_dim with inner > 1) -------------------------------------------------- */
// x: (outer, n, inner) -> out: (outer, inner). Block (32, by): columns blockIdx.x * 32 + tx of row
// blockIdx.y (grid-stride); thread row ty adds k = ty, ty + by, ...; then a tree over ty.
static __global__ void colsum_kernel(float *out, const float *x, int64_t outer, int64_t n, int64_t inner, float alpha) {
    __shared__ float sh[32][33];
    int tx = threadIdx.x, ty = threadIdx.y, by = blockDim.y;
    int64_t i = (int64_t)blockIdx.x * 32 + tx;
    for (int64_t r = blockIdx.y; r < outer; r += gridDim.y) {
        float acc = 0.0f;
        if (i < inner) {
            const float *xr = x + r * n * inner + i;
            for (int64_t k = ty; k < n; k += by) acc += xr[k * inner];
        }
        sh[ty][tx] = acc;
        __syncthreads();
        for (int h = by / 2; h > 0; h >>= 1) {
            if (ty < h) sh[ty][tx] += sh[ty + h][tx];
            __syncthreads();
        }
        if (ty == 0 && i < inner) out[r * inner + i] = sh[0][tx] * alpha;
        __syncthreads();
    }
}

extern "C" cudaError_t ts_cu_colsum(float *out, const float *x, int64_t outer, int64_t n, int64_t inner, float alpha,
                                    cudaStream_t s) {
    if (outer <= 0 || inner <= 0) return cudaSuccess;
    int64_t cb = (inner + 31) / 32;
    /* few blocks: more thread rows per column, so long columns still spread over many threads */
    unsigned by = outer * cb < 1024 ? 32 : 8;
    dim3 grid((unsigned)cb, (unsigned)(outer < 65535 ? outer : 65535)), block(32, by);
    colsum_kernel<<<grid, block, 0, s>>>(out, x, outer, n, inner, alpha);
    return cudaGetLastError();
}

/* ---- reduce_to -------------------------------------------------------------------------------------- */
/* a thread per output, terms in x order (the CPU's order) */
static __global__ void reduce_to_thread_kernel(float *out, const float *x, int64_t on, ts_cu_walk kept, int64_t m,
                                        ts_cu_walk red) {
    TS_CU_LOOP(j, on) {
        int64_t xo, oo;
        walk_offsets(kept, j, &xo, &oo);
        float acc = 0.0f;
        for (int64_t k = 0; k < m; k++) acc += x[xo + walk_offset(red, k)];
        out[oo] = acc;
    }
}

/* a block per output, its threads over the terms, then a tree */
static __global__ void reduce_to_block_kernel(float *out, const float *x, int64_t on, ts_cu_walk kept, int64_t m,
                                       ts_cu_walk red) {
    for (int64_t j = blockIdx.x; j < on; j += gridDim.x) {
        int64_t xo, oo;
        walk_offsets(kept, j, &xo, &oo);
        float acc = 0.0f;
        for (int64_t k = threadIdx.x; k < m; k += blockDim.x) acc += x[xo + walk_offset(red, k)];
        acc = block_sum(acc);
        if (threadIdx.x == 0) out[oo] = acc;
    }
}

extern "C" cudaError_t ts_cu_reduce_to(float *out, const float *x, int64_t on, const ts_cu_walk *kept, int64_t m,
                                       const ts_cu_walk *red, cudaStream_t s) {
    if (on <= 0) return cudaSuccess;
    unsigned blocks = (unsigned)(on < 65535 ? on : 65535);
    if (m <= 256 || on >= 16384) /* short sums, or outputs enough to fill the GPU (reads coalesce) */
        reduce_to_thread_kernel<<<ts_cu_blocks(on), TS_CU_THREADS, 0, s>>>(out, x, on, *kept, m, *red);
    else
        reduce_to_block_kernel<<<blocks, TS_CU_THREADS, 0, s>>>(out, x, on, *kept, m, *red);
    return cudaGetLastError();
}

/* ---- expand_dim, max_dim ---------------------------------------------------------------------------- */
static __global__ void expand_dim_kernel(float *out, const float *x, int64_t total, int64_t n, int64_t inner,
                                         float alpha) {
    TS_CU_LOOP(e, total) {
        int64_t t = e / inner, i = e - t * inner, r = t / n;
        out[e] = alpha * x[r * inner + i];
    }
}

extern "C" cudaError_t ts_cu_expand_dim(float *out, const float *x, int64_t outer, int64_t n, int64_t inner,
                                        float alpha, cudaStream_t s) {
    int64_t total = outer * n * inner;
    if (total <= 0) return cudaSuccess;
    expand_dim_kernel<<<ts_cu_blocks(total), TS_CU_THREADS, 0, s>>>(out, x, total, n, inner, alpha);
    return cudaGetLastError();
}

/* (bv, bi) beats (av, ai) in a combine of two scans' winners: a NaN beats a number, then the larger,
 * then (equal, or both NaN) the lower index */
static __device__ __forceinline__ bool pair_wins(float bv, int64_t bi, float av, int64_t ai) {
    bool bn = bv != bv, an = av != av;
    if (bn != an) return bn;
    if (bn || bv == av) return bi < ai;
    return bv > av;
}

/* inner == 1: a warp per row; lane l scans k = l, l + 32, ... keeping its first winner */
static __global__ void max_row_kernel(float *v, int64_t *idx, const float *x, int64_t rows, int64_t n) {
    int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    for (int64_t r = (int64_t)blockIdx.x * wpb + (threadIdx.x >> 5); r < rows; r += (int64_t)gridDim.x * wpb) {
        const float *row = x + r * n;
        float best = -INFINITY;
        long long bi = INT64_MAX; /* a lane with no element loses to any */
        if (lane < n) {
            best = row[lane];
            bi = lane;
        }
        for (int64_t k = lane + 32; k < n; k += 32)
            if (ts_elem_max_wins(row[k], best)) {
                best = row[k];
                bi = k;
            }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_down_sync(FULL_MASK, best, o);
            long long oi = __shfl_down_sync(FULL_MASK, bi, o);
            if (pair_wins(ov, oi, best, bi)) {
                best = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            v[r] = best;
            idx[r] = bi;
        }
    }
}

/* inner > 1: a thread per output walking the dim (adjacent threads read adjacent columns) */
static __global__ void max_col_kernel(float *v, int64_t *idx, const float *x, int64_t outer, int64_t n, int64_t inner) {
    TS_CU_LOOP(j, outer * inner) {
        int64_t r = j / inner, i = j - r * inner;
        const float *xr = x + r * n * inner + i;
        float best = xr[0];
        int64_t bi = 0;
        for (int64_t k = 1; k < n; k++) {
            float e = xr[k * inner];
            if (ts_elem_max_wins(e, best)) {
                best = e;
                bi = k;
            }
        }
        v[j] = best;
        idx[j] = bi;
    }
}

extern "C" cudaError_t ts_cu_max_dim(float *v, int64_t *idx, const float *x, int64_t outer, int64_t n, int64_t inner,
                                     cudaStream_t s) {
    if (outer * inner <= 0 || n <= 0) return cudaSuccess;
    if (inner == 1)
        max_row_kernel<<<ts_cu_blocks(outer * 32), TS_CU_THREADS, 0, s>>>(v, idx, x, outer, n);
    else
        max_col_kernel<<<ts_cu_blocks(outer * inner), TS_CU_THREADS, 0, s>>>(v, idx, x, outer, n, inner);
    return cudaGetLastError();
}

static __global__ void max_dim_backward_kernel(float *gx, const float *g, const int64_t *idx, int64_t total, int64_t n,
                                        int64_t inner) {
    TS_CU_LOOP(e, total) {
        int64_t t = e / inner, i = e - t * inner, r = t / n, k = t - r * n, j = r * inner + i;
        gx[e] = idx[j] == k ? g[j] : 0.0f;
    }
}

extern "C" cudaError_t ts_cu_max_dim_backward(float *gx, const float *g, const int64_t *idx, int64_t outer, int64_t n,
                                              int64_t inner, cudaStream_t s) {
    int64_t total = outer * n * inner;
    if (total <= 0) return cudaSuccess;
    max_dim_backward_kernel<<<ts_cu_blocks(total), TS_CU_THREADS, 0, s>>>(gx, g, idx, total, n, inner);
    return cudaGetLastError();
}

/* ---- cast ------------------------------------------------------------------------------------------- */
/* through float32, as the CPU (16 bits to float32 is exact) */
template <int F, int T>
static __global__ void cast_kernel(void *o, const void *x, int64_t n) {
    TS_CU_LOOP(i, n) ts_cu_store<T>(o, i, ts_cu_load<F>(x, i));
}

extern "C" cudaError_t ts_cu_cast(void *o, int to, const void *x, int from, int64_t n, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    unsigned g = ts_cu_blocks(n);
    const int T = TS_CU_THREADS;
    if (from == TS_CU_F32 && to == TS_CU_F16)
        cast_kernel<TS_CU_F32, TS_CU_F16><<<g, T, 0, s>>>(o, x, n);
    else if (from == TS_CU_F32 && to == TS_CU_BF16)
        cast_kernel<TS_CU_F32, TS_CU_BF16><<<g, T, 0, s>>>(o, x, n);
    else if (from == TS_CU_F16 && to == TS_CU_F32)
        cast_kernel<TS_CU_F16, TS_CU_F32><<<g, T, 0, s>>>(o, x, n);
    else if (from == TS_CU_BF16 && to == TS_CU_F32)
        cast_kernel<TS_CU_BF16, TS_CU_F32><<<g, T, 0, s>>>(o, x, n);
    else if (from == TS_CU_F16 && to == TS_CU_BF16)
        cast_kernel<TS_CU_F16, TS_CU_BF16><<<g, T, 0, s>>>(o, x, n);
    else if (from == TS_CU_BF16 && to == TS_CU_F16)
        cast_kernel<TS_CU_BF16, TS_CU_F16><<<g, T, 0, s>>>(o, x, n);
    else
        return cudaErrorInvalidValue;
    return cudaGetLastError();
}
