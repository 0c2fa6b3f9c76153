/*
 * ops/cuda/misc.cu — CUDA kernels of the misc family (launchers in ops/cuda/misc_cu.h, the kernel
 * table in ops/cuda/misc.c): embedding gather/scatter-add, the block copy behind concat/slice,
 * masked scaling for dropout, softmax and log-softmax, and the fused cross-entropy and MSE losses.
 *
 * Row-wise ops work on (outer, n, inner) tensors: a row is n elements at stride inner. A row is
 * handled by a "group" of threads (GWarp, GBlock, GThread, ops/cuda/reduce.cuh): a warp per row for contiguous
 * rows of up to 1024 elements, a block for longer ones, one thread per row when inner > 1 (then
 * neighbouring threads read neighbouring columns, which coalesces). Each thread of a group walks
 * the row with stride size(); the group's sum/max are shuffle (and shared-memory) trees whose
 * shape depends only on the launch shape, so results are deterministic.
 *
 * Precision follows the CPU kernels (ops/cpu/misc.c): their sums are double (the CPU's in eight
 * double accumulators per row; here per-thread double partials and double trees), and the softmax
 * family's per-element formulas are device/k_elem.h's, the CPU's.
 * Loss totals go through a fixed two-stage reduction (TS_CU_MISC_PARTS block partials, then one
 * block) rather than atomics.
 */
#include "ops/cuda/misc_cu.h"
#include "ops/cuda/reduce.cuh"
#include "device/k_elem.h"

#include <math.h>


/* Kernels and helpers are file-local (other .cu files may use the same names); the launchers below
 * the namespace blocks are the only exported symbols. */
namespace {

/* Runs op.row<G>(base, r, n, inner) for every row r of (outer, n, inner), base = its first element. */
template <class G, class Op> __global__ void rows_kernel(Op op, int64_t rows, int64_t n, int64_t inner) {
    for (int64_t r = G::first(); r < rows; r += G::stride()) {
        const int64_t a = r / inner, b = r - a * inner;
        op.template row<G>(a * n * inner + b, r, n, inner);
    }
}

template <class Op> static cudaError_t launch_rows(const Op &op, int64_t outer, int64_t n, int64_t inner,
                                                   cudaStream_t s) {
    const int64_t rows = outer * inner;
    if (rows <= 0) return cudaSuccess;
    if (inner > 1)
        rows_kernel<GThread><<<ts_cu_blocks(rows), TS_CU_THREADS, 0, s>>>(op, rows, n, inner);
    else if (n <= 1024)
        rows_kernel<GWarp><<<ts_cu_blocks(rows * 32), TS_CU_THREADS, 0, s>>>(op, rows, n, inner);
    else
        rows_kernel<GBlock><<<(unsigned)(rows < 65535 * 8 ? rows : 65535 * 8), ROW_BLOCK, 0, s>>>(op, rows, n, inner);
    return cudaGetLastError();
}

/* Blocks of the first stage of a reduction over n items (at least 16 per thread, at most
 * TS_CU_MISC_PARTS blocks): fixed by n alone, so the summation order is too. */
static int parts_for(int64_t n) {
    int64_t b = (n + 16 * TS_CU_THREADS - 1) / (16 * TS_CU_THREADS);
    if (b < 1) b = 1;
    if (b > TS_CU_MISC_PARTS) b = TS_CU_MISC_PARTS;
    return (int)b;
}

/* out[block] = the block's sums of in[].x and in[].y (grid-stride slices). */
__global__ void sum_pairs_kernel(const double2 *in, int64_t n, double2 *out) {
    double a = 0, b = 0;
    TS_CU_LOOP(i, n) {
        a += in[i].x;
        b += in[i].y;
    }
    a = GBlock::sum(a);
    b = GBlock::sum(b);
    if (threadIdx.x == 0) out[blockIdx.x] = make_double2(a, b);
}

/* The last kernel of an op that checks indices (one thread): folds the op's first bad position
 * r->cur into the record, unless the record still holds an earlier op's that the host has not reported
 * (the first one wins), and resets r->cur for the next op. Stream order makes every atomicMin of the op's
 * kernels visible here. True when the op found a bad index. */
__device__ bool keep_bad(ts_cu_bad_rec *r, const int64_t *idx, const ts_cu_bad_what &what) {
    const unsigned long long p = r->cur;
    if (p == TS_CU_NO_BAD) return false;
    r->cur = TS_CU_NO_BAD;
    if (r->pos == TS_CU_NO_BAD) {
        r->val = (long long)idx[p];
        r->what = what;
        r->pos = p;
    }
    return true;
}

__global__ void keep_bad_kernel(ts_cu_bad_rec *r, const int64_t *idx, ts_cu_bad_what what) {
    (void)keep_bad(r, idx, what);
}

/* Second stage, one block: (a, b) = sums of part[0..nb); loss[0] = a (div == 0), a / b (div < 0)
 * or a / div. With rec (an op that checks indices: keep_bad), NaN if the op found a bad index in idx. */
__global__ void finish_kernel(const double2 *part, int nb, float *loss, double div, ts_cu_bad_rec *rec,
                              const int64_t *idx, ts_cu_bad_what what) {
    double a = 0, b = 0;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) {
        a += part[i].x;
        b += part[i].y;
    }
    a = GBlock::sum(a);
    b = GBlock::sum(b);
    if (threadIdx.x == 0) {
        const bool bad = rec && keep_bad(rec, idx, what);
        loss[0] = bad ? NAN : (float)(div == 0 ? a : div < 0 ? a / b : a / div);
    }
}

/* ---- embedding ---------------------------------------------------------------------------------- */
// out: (n, dim) = w[idx[i], :] (NaN for an index outside [0, num)); w: (num, dim)
__global__ void embedding_kernel(float *out, const int64_t *idx, const float *w, int64_t n, int64_t num, int64_t dim,
                                 unsigned long long *bad) {
    TS_CU_LOOP(i, n) {
        if (idx[i] < 0 || idx[i] >= num) atomicMin(bad, (unsigned long long)i);
    }
    TS_CU_LOOP(k, n * dim) {
        const int64_t i = k / dim, v = idx[i];
        out[k] = v >= 0 && v < num ? w[v * dim + (k - i * dim)] : NAN;
    }
}

} // namespace

cudaError_t ts_cu_embedding(float *out, const int64_t *idx, const float *w, int64_t n, int64_t num, int64_t dim,
                            ts_cu_bad_rec *rec, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    embedding_kernel<<<ts_cu_blocks(n * dim > n ? n * dim : n), TS_CU_THREADS, 0, s>>>(out, idx, w, n, num, dim,
                                                                                      &rec->cur);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    keep_bad_kernel<<<1, 1, 0, s>>>(rec, idx, ts_cu_bad_what{TS_CU_BAD_EMBEDDING, n, num, dim, 0});
    return cudaGetLastError();
}

namespace {

/* gw[idx[i], j] += g[i, j]. Float atomicAdd: rows that repeat are summed in whatever order the
 * threads arrive, so the last bits of gw may differ from run to run (accepted here: a
 * deterministic version needs a sort of the indices). */
__global__ void embedding_backward_kernel(float *gw, const int64_t *idx, const float *g, int64_t n, int64_t num,
                                          int64_t dim) {
    TS_CU_LOOP(k, n * dim) {
        const int64_t i = k / dim, v = idx[i];
        if (v >= 0 && v < num) atomicAdd(gw + v * dim + (k - i * dim), g[k]);
    }
}

} // namespace

cudaError_t ts_cu_embedding_backward(float *gw, const int64_t *idx, const float *g, int64_t n, int64_t num,
                                     int64_t dim, cudaStream_t s) {
    cudaError_t e = cudaMemsetAsync(gw, 0, (size_t)(num * dim) * sizeof(float), s);
    if (e != cudaSuccess) return e;
    if (n * dim == 0) return cudaSuccess;
    embedding_backward_kernel<<<ts_cu_blocks(n * dim), TS_CU_THREADS, 0, s>>>(gw, idx, g, n, num, dim);
    return cudaGetLastError();
}

namespace {

/* ---- block copy ------------------------------------------------------------------------------------ */
/* outer rows of `row` units T: dst[o * dp + j] = src[o * sp + j] (pitches in units). */
template <class T> __global__ void narrow_kernel(T *dst, int64_t dp, const T *src, int64_t sp, int64_t row,
                                                 int64_t outer) {
    TS_CU_LOOP(k, outer * row) {
        const int64_t o = k / row, j = k - o * row;
        dst[o * dp + j] = src[o * sp + j];
    }
}

template <class T> static cudaError_t narrow_as(char *dst, int64_t dp, const char *src, int64_t sp, int64_t row,
                                                int64_t outer, cudaStream_t s) {
    const int64_t w = (int64_t)sizeof(T), units = row / w;
    narrow_kernel<T><<<ts_cu_blocks(outer * units), TS_CU_THREADS, 0, s>>>((T *)dst, dp / w, (const T *)src, sp / w,
                                                                           units, outer);
    return cudaGetLastError();
}

/* Copied in the widest unit (16, 8, 4, 2 or 1 bytes) that divides the row, both pitches and both
 * start addresses, whatever the dtype. */
} // namespace

cudaError_t ts_cu_narrow_copy(void *dst, int64_t dst_n, int64_t dst_start, const void *src, int64_t src_n,
                              int64_t src_start, int64_t len, int64_t outer, int64_t inner, size_t es, cudaStream_t s) {
    const int64_t e = (int64_t)es, row = len * inner * e, dp = dst_n * inner * e, sp = src_n * inner * e;
    if (row <= 0 || outer <= 0) return cudaSuccess;
    char *d = (char *)dst + dst_start * inner * e;
    const char *p = (const char *)src + src_start * inner * e;
    uint64_t m = (uint64_t)row | (uint64_t)(uintptr_t)d | (uint64_t)(uintptr_t)p;
    if (outer > 1) m |= (uint64_t)dp | (uint64_t)sp; /* one row: the pitches are never used */
    if (m % 16 == 0) return narrow_as<uint4>(d, dp, p, sp, row, outer, s);
    if (m % 8 == 0) return narrow_as<uint2>(d, dp, p, sp, row, outer, s);
    if (m % 4 == 0) return narrow_as<uint32_t>(d, dp, p, sp, row, outer, s);
    if (m % 2 == 0) return narrow_as<uint16_t>(d, dp, p, sp, row, outer, s);
    return narrow_as<uint8_t>(d, dp, p, sp, row, outer, s);
}

namespace {

/* ---- dropout ------------------------------------------------------------------------------------------ */
__global__ void masked_scale_kernel(float *out, const float *x, const uint8_t *mask, float scale, int64_t n) {
    TS_CU_LOOP(i, n) out[i] = !mask || mask[i] ? x[i] * scale : 0.0f;
}

} // namespace

cudaError_t ts_cu_masked_scale(float *out, const float *x, const uint8_t *mask, float scale, int64_t n,
                               cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    masked_scale_kernel<<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(out, x, mask, scale, n);
    return cudaGetLastError();
}

namespace {

/* ---- log-softmax and softmax ------------------------------------------------------------------------------ */
/* A row's max m and s = sum exp(x - m) in double (device/k_elem.h's row statistics); with e, e = exp(x - m)
 * too. Every lane of the group gets both. */
template <class G> __device__ double row_stats(const float *xr, int64_t n, int64_t st, float *e, float *m_out) {
    float m = -INFINITY;
    for (int64_t c = G::lane(); c < n; c += G::size()) m = fmaxf(m, xr[c * st]);
    m = G::max(m);
    double sum = 0;
    for (int64_t c = G::lane(); c < n; c += G::size()) {
        const float v = ts_elem_shift_exp(xr[c * st], m);
        if (e) e[c * st] = v;
        sum += v;
    }
    *m_out = m;
    return G::sum(sum);
}

/* y = (x - m) - log s */
struct LogSoftmaxOp {
    float *y;
    const float *x;
    template <class G> __device__ void row(int64_t base, int64_t r, int64_t n, int64_t st) const {
        const float *xr = x + base;
        float *yr = y + base, m;
        const float ls = (float)log(row_stats<G>(xr, n, st, NULL, &m));
        for (int64_t c = G::lane(); c < n; c += G::size()) yr[c * st] = ts_elem_log_softmax(xr[c * st], m, ls);
    }
};

/* gx = gy - exp(y) sum(gy); the sum in double. */
struct LogSoftmaxBwdOp {
    float *gx;
    const float *gy, *y;
    template <class G> __device__ void row(int64_t base, int64_t r, int64_t n, int64_t st) const {
        double sum = 0;
        for (int64_t c = G::lane(); c < n; c += G::size()) sum += gy[base + c * st];
        const float sf = (float)G::sum(sum);
        for (int64_t c = G::lane(); c < n; c += G::size()) {
            const int64_t k = base + c * st;
            gx[k] = gy[k] - expf(y[k]) * sf;
        }
    }
};

/* y = exp(x - m) / s */
struct SoftmaxOp {
    float *y;
    const float *x;
    template <class G> __device__ void row(int64_t base, int64_t r, int64_t n, int64_t st) const {
        float *yr = y + base, m;
        const float inv = (float)(1.0 / row_stats<G>(x + base, n, st, yr, &m));
        for (int64_t c = G::lane(); c < n; c += G::size()) yr[c * st] *= inv; /* this thread's own writes */
    }
};

/* gx = y (gy - sum(gy y)); the dot product in double. */
struct SoftmaxBwdOp {
    float *gx;
    const float *gy, *y;
    template <class G> __device__ void row(int64_t base, int64_t r, int64_t n, int64_t st) const {
        double dot = 0;
        for (int64_t c = G::lane(); c < n; c += G::size()) dot += (double)gy[base + c * st] * y[base + c * st];
        const float sf = (float)G::sum(dot);
        for (int64_t c = G::lane(); c < n; c += G::size()) {
            const int64_t k = base + c * st;
            gx[k] = y[k] * (gy[k] - sf);
        }
    }
};
} // namespace

cudaError_t ts_cu_log_softmax(float *y, const float *x, int64_t outer, int64_t n, int64_t inner, cudaStream_t s) {
    return launch_rows(LogSoftmaxOp{y, x}, outer, n, inner, s);
}

cudaError_t ts_cu_log_softmax_backward(float *gx, const float *gy, const float *y, int64_t outer, int64_t n,
                                       int64_t inner, cudaStream_t s) {
    return launch_rows(LogSoftmaxBwdOp{gx, gy, y}, outer, n, inner, s);
}

cudaError_t ts_cu_softmax(float *y, const float *x, int64_t outer, int64_t n, int64_t inner, cudaStream_t s) {
    return launch_rows(SoftmaxOp{y, x}, outer, n, inner, s);
}

cudaError_t ts_cu_softmax_backward(float *gx, const float *gy, const float *y, int64_t outer, int64_t n, int64_t inner,
                                   cudaStream_t s) {
    return launch_rows(SoftmaxBwdOp{gx, gy, y}, outer, n, inner, s);
}

namespace {

/* ---- cross-entropy ------------------------------------------------------------------------------------------ */
/* Row i of C logits at stride S: lse[i] = (m, log s) (row_stats), then (double, device/k_elem.h)
 *   l_i = (1 - eps) w[t] (lse - x[t]) + eps / C sum_c w[c] (lse - x[c]),  lse - x = (m - x) + log s
 * -> per[i] (NONE; NaN for a bad target) or part[i] = (l_i, w[t]) for the total; ignored and bad rows
 * give (0, 0) there, and a bad one makes the total NaN (finish_kernel). */
struct CrossEntropyOp {
    float *lse, *per;
    double2 *part;
    const float *x, *w;
    const int64_t *t;
    int64_t ignore;
    float eps;
    unsigned long long *bad;
    template <class G> __device__ void row(int64_t base, int64_t i, int64_t C, int64_t S) const {
        const float *xr = x + base;
        float m;
        const double ls = log(row_stats<G>(xr, C, S, NULL, &m));
        const int64_t ti = t[i];
        const bool ign = ti == ignore, ok = ti >= 0 && ti < C;
        double li = 0, wi = 0;
        if (!ign && ok) { /* the same for the whole group, so its reductions below are safe */
            wi = w ? (double)w[ti] : 1.0;
            li = (1.0 - (double)eps) * wi * ts_elem_lse_minus(xr[ti * S], m, ls);
            if (eps != 0.0f) {
                double sm = 0; /* sum_c w[c] (lse - x[c]) */
                for (int64_t c = G::lane(); c < C; c += G::size())
                    sm += (w ? (double)w[c] : 1.0) * ts_elem_lse_minus(xr[c * S], m, ls);
                sm = G::sum(sm);
                li += (double)eps * sm / (double)C;
            }
        }
        if (G::lane() != 0) return;
        lse[2 * i] = m;
        lse[2 * i + 1] = (float)ls;
        if (!ign && !ok) atomicMin(bad, (unsigned long long)i); /* only the minimum matters: order-free */
        if (per) per[i] = !ign && !ok ? NAN : (float)li;
        if (part) part[i] = make_double2(li, wi);
    }
};
} // namespace

cudaError_t ts_cu_cross_entropy(float *loss, float *lse, const float *x, const int64_t *t, const float *w, int64_t N,
                                int64_t C, int64_t S, float eps, int64_t ignore, int none, int mean, double *part,
                                ts_cu_bad_rec *rec, cudaStream_t s) {
    const int64_t rows = N * S;
    const ts_cu_bad_what what{TS_CU_BAD_CROSS_ENTROPY, N, C, S, ignore};
    double2 *rowpart = none ? NULL : (double2 *)part, *blocks = none ? NULL : (double2 *)part + rows;
    cudaError_t e =
        launch_rows(CrossEntropyOp{lse, none ? loss : NULL, rowpart, x, w, t, ignore, eps, &rec->cur}, N, C, S, s);
    if (e != cudaSuccess) return e;
    if (none) {
        keep_bad_kernel<<<1, 1, 0, s>>>(rec, t, what);
        return cudaGetLastError();
    }
    const int nb = parts_for(rows);
    sum_pairs_kernel<<<nb, TS_CU_THREADS, 0, s>>>(rowpart, rows, blocks);
    /* MEAN over no counted sample gives NaN (0/0), as PyTorch; a bad target NaN too (finish_kernel) */
    finish_kernel<<<1, TS_CU_THREADS, 0, s>>>(blocks, nb, loss, mean ? -1.0 : 0.0, rec, t, what);
    return cudaGetLastError();
}

namespace {

/* part[block] = (sum of w[t_i] over samples not ignored, sum of w[c]) (slices of both). */
__global__ void ce_weights_kernel(const int64_t *t, const float *w, int64_t rows, int64_t C, int64_t ignore,
                                  double2 *out) {
    double a = 0, b = 0;
    TS_CU_LOOP(i, rows) {
        const int64_t ti = t[i];
        if (ti != ignore && ti >= 0 && ti < C) a += w ? (double)w[ti] : 1.0;
    }
    if (w) TS_CU_LOOP(c, C) b += w[c];
    a = GBlock::sum(a);
    b = GBlock::sum(b);
    if (threadIdx.x == 0) out[blockIdx.x] = make_double2(a, b);
}

/* coef[0] = the scale of every sample (not with none): gloss / wsum (mean) or gloss; coef[1] = sum(w). */
__global__ void ce_coef_kernel(const double2 *part, int nb, const float *gloss, int none, int mean, float *coef) {
    double a = 0, b = 0;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) {
        a += part[i].x;
        b += part[i].y;
    }
    a = GBlock::sum(a);
    b = GBlock::sum(b);
    if (threadIdx.x != 0) return;
    coef[0] = none ? 0.0f : mean ? (float)((double)gloss[0] / a) : gloss[0];
    coef[1] = (float)b;
}

// gx: (N, C, S), element k = (a, c, s), sample i = a S + s
__global__ void ce_backward_kernel(float *gx, const float *gloss, const float *x, const float *lse, const int64_t *t,
                                   const float *w, int64_t N, int64_t C, int64_t S, float eps, int64_t ignore, int none,
                                   const float *coef) {
    const float hit = 1.0f - eps, spread = eps / (float)C;
    const int64_t CS = C * S;
    TS_CU_LOOP(k, N * CS) {
        const int64_t a = k / CS, rem = k - a * CS, c = rem / S, i = a * S + (rem - c * S);
        const int64_t ti = t[i];
        if (ti == ignore || ti < 0 || ti >= C) { /* out of range: checked by the forward */
            gx[k] = 0.0f;
            continue;
        }
        const float si = none ? gloss[i] : coef[0];
        const float e = expf(ts_elem_log_softmax(x[k], lse[2 * i], lse[2 * i + 1])); /* softmax */
        float v;
        if (!w) {
            v = si * (e - spread);
            if (c == ti) v -= si * hit;
        } else {
            const float wt = w[ti], co = hit * wt + spread * coef[1]; /* coefficient of softmax */
            v = si * (co * e - spread * w[c]);
            if (c == ti) v -= si * hit * wt;
        }
        gx[k] = v;
    }
}

} // namespace

cudaError_t ts_cu_cross_entropy_backward(float *gx, const float *gloss, const float *x, const float *lse,
                                         const int64_t *t, const float *w, int64_t N, int64_t C, int64_t S, float eps,
                                         int64_t ignore, int none, int mean, double *part, cudaStream_t s) {
    const int64_t rows = N * S;
    float *coef = (float *)((double2 *)part + TS_CU_MISC_PARTS);
    if (!none || w) {
        const int nb = parts_for(rows > C ? rows : C);
        ce_weights_kernel<<<nb, TS_CU_THREADS, 0, s>>>(t, w, rows, C, ignore, (double2 *)part);
        ce_coef_kernel<<<1, TS_CU_THREADS, 0, s>>>((const double2 *)part, nb, gloss, none, mean, coef);
    }
    if (N * C * S > 0)
        ce_backward_kernel<<<ts_cu_blocks(N * C * S), TS_CU_THREADS, 0, s>>>(gx, gloss, x, lse, t, w, N, C, S, eps,
                                                                            ignore, none, coef);
    return cudaGetLastError();
}

namespace {

/* ---- mean squared error ---------------------------------------------------------------------------------------- */
/* out[block] = (sum of (p - q)^2 in double over the block's slice, 0) */
__global__ void mse_kernel(const float *p, const float *q, int64_t n, double2 *out) {
    double a = 0;
    TS_CU_LOOP(i, n) {
        const double d = (double)p[i] - q[i];
        a += d * d;
    }
    a = GBlock::sum(a);
    if (threadIdx.x == 0) out[blockIdx.x] = make_double2(a, 0.0);
}

} // namespace

cudaError_t ts_cu_mse(float *loss, const float *p, const float *q, int64_t n, double *part, cudaStream_t s) {
    const int nb = parts_for(n);
    mse_kernel<<<nb, TS_CU_THREADS, 0, s>>>(p, q, n, (double2 *)part);
    /* n == 0: 0 / 0 = NaN, as PyTorch (a NaN divisor is "a / div" too) */
    finish_kernel<<<1, TS_CU_THREADS, 0, s>>>((const double2 *)part, nb, loss, n ? (double)n : NAN, NULL, NULL,
                                              ts_cu_bad_what{0, 0, 0, 0, 0});
    return cudaGetLastError();
}

namespace {

__global__ void mse_backward_kernel(float *gp, float *gq, const float *gloss, const float *p, const float *q,
                                    int64_t n) {
    const float sc = 2.0f * gloss[0] / (float)n;
    TS_CU_LOOP(i, n) {
        const float v = sc * (p[i] - q[i]);
        if (gp) gp[i] = v;
        if (gq) gq[i] = -v;
    }
}

} // namespace

cudaError_t ts_cu_mse_backward(float *gp, float *gq, const float *gloss, const float *p, const float *q, int64_t n,
                               cudaStream_t s) {
    if (n <= 0 || (!gp && !gq)) return cudaSuccess;
    mse_backward_kernel<<<ts_cu_blocks(n), TS_CU_THREADS, 0, s>>>(gp, gq, gloss, p, q, n);
    return cudaGetLastError();
}
