/*
 * ops/cuda/attention.cu — scaled-dot-product attention on CUDA (launchers in ops/cuda/misc_cu.h, the
 * kernel table entries in ops/cuda/misc.c), forward and backward with FlashAttention's memory rule: no
 * Tq x Tk matrix anywhere; the forward keeps each row's running max and sum (online softmax) and saves
 * (max, log sum) per row, the backward recomputes the probabilities from them.
 *
 * One warp per row: a query row in the forward and in the gradient of q, a key row in the gradients of
 * k and v (so each output row has one writer: no atomics, the same bits on every run). The warp walks
 * the other side's rows 32 at a time, one per lane: each lane takes a full dot product against the
 * warp's own row (held in shared memory), the warp reduces maxima and sums with shuffles, and each lane
 * accumulates D / 32 columns of the output row (its registers), reading the 32 rows' columns together.
 * Head dims up to 256 (DPL = columns per lane: 1, 2, 4, 8). Float32 throughout, as the CPU kernels'
 * float32 GEMM tiles (ops/cpu/attention.c); scores, masks and statistics as device/k_misc.h defines.
 *
 * Shapes: q, out, gout, gq (BH, Tq, D); k, v, gk, gv (BH, Tk, D); stats (BH, Tq, 2); delta (BH, Tq)
 * scratch for D_i = gout_i . out_i. Causal: query i sees keys j <= i.
 */
#include "ops/cuda/misc_cu.h"

#include <math.h>

namespace {

constexpr int WARPS = 4; /* rows per block */

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* row (D floats, global) into sh (shared) by the warp's lanes */
__device__ __forceinline__ void load_row(float *sh, const float *row, int D, int lane) {
    for (int d = lane; d < D; d += 32) sh[d] = row[d];
    __syncwarp();
}

__device__ __forceinline__ float dot(const float *sh, const float *row, int D) {
    float s = 0.0f;
    for (int d = 0; d < D; d++) s = fmaf(sh[d], row[d], s);
    return s;
}

/* The number of keys query i sees. */
__device__ __forceinline__ int64_t visible(int64_t i, int64_t Tk, bool causal) {
    return causal ? (i + 1 < Tk ? i + 1 : Tk) : Tk;
}

template <int DPL>
__global__ void forward_kernel(float *out, float *stats, const float *q, const float *k, const float *v, int64_t BH,
                               int64_t Tq, int64_t Tk, int D, bool causal, float scale) {
    extern __shared__ float smem[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float *qs = smem + w * D;
    for (int64_t r = (int64_t)blockIdx.x * WARPS + w; r < BH * Tq; r += (int64_t)gridDim.x * WARPS) {
        const int64_t bh = r / Tq, i = r - bh * Tq, nk = visible(i, Tk, causal);
        const float *kb = k + bh * Tk * D, *vb = v + bh * Tk * D;
        load_row(qs, q + r * D, D, lane);
        float m = -INFINITY, l = 0.0f, acc[DPL];
        for (int c = 0; c < DPL; c++) acc[c] = 0.0f;
        for (int64_t j0 = 0; j0 < nk; j0 += 32) {
            const int64_t j = j0 + lane;
            const float s = j < nk ? scale * dot(qs, kb + j * D, D) : -INFINITY;
            const float mn = fmaxf(m, warp_max(s));
            const float corr = expf(m - mn); /* 0 on the first chunk (m = -inf) */
            const float p = j < nk ? expf(s - mn) : 0.0f;
            l = l * corr + warp_sum(p);
            m = mn;
            for (int c = 0; c < DPL; c++) acc[c] *= corr;
            const int n = nk - j0 < 32 ? (int)(nk - j0) : 32;
            for (int jj = 0; jj < n; jj++) {
                const float pj = __shfl_sync(0xffffffffu, p, jj);
                const float *vr = vb + (j0 + jj) * D;
                for (int c = 0; c < DPL; c++) {
                    const int d = lane + 32 * c;
                    if (d < D) acc[c] = fmaf(pj, vr[d], acc[c]);
                }
            }
        }
        for (int c = 0; c < DPL; c++) {
            const int d = lane + 32 * c;
            if (d < D) out[r * D + d] = acc[c] / l;
        }
        if (lane == 0) {
            stats[2 * r] = m;
            stats[2 * r + 1] = logf(l);
        }
        __syncwarp();
    }
}

/* gq per query row, and delta_i = gout_i . out_i for the key-side kernel. */
template <int DPL>
__global__ void backward_q_kernel(float *gq, float *delta, const float *gout, const float *q, const float *k,
                                  const float *v, const float *o, const float *stats, int64_t BH, int64_t Tq,
                                  int64_t Tk, int D, bool causal, float scale) {
    extern __shared__ float smem[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float *qs = smem + 2 * w * D, *gs = qs + D;
    for (int64_t r = (int64_t)blockIdx.x * WARPS + w; r < BH * Tq; r += (int64_t)gridDim.x * WARPS) {
        const int64_t bh = r / Tq, i = r - bh * Tq, nk = visible(i, Tk, causal);
        const float *kb = k + bh * Tk * D, *vb = v + bh * Tk * D;
        load_row(qs, q + r * D, D, lane);
        load_row(gs, gout + r * D, D, lane);
        float di = 0.0f;
        for (int d = lane; d < D; d += 32) di = fmaf(gs[d], o[r * D + d], di);
        di = warp_sum(di);
        if (lane == 0) delta[r] = di;
        const float m = stats[2 * r], ll = stats[2 * r + 1];
        float acc[DPL];
        for (int c = 0; c < DPL; c++) acc[c] = 0.0f;
        for (int64_t j0 = 0; j0 < nk; j0 += 32) {
            const int64_t j = j0 + lane;
            float ds = 0.0f;
            if (j < nk) {
                const float p = expf((scale * dot(qs, kb + j * D, D) - m) - ll);
                ds = p * (dot(gs, vb + j * D, D) - di);
            }
            const int n = nk - j0 < 32 ? (int)(nk - j0) : 32;
            for (int jj = 0; jj < n; jj++) {
                const float dj = __shfl_sync(0xffffffffu, ds, jj);
                const float *kr = kb + (j0 + jj) * D;
                for (int c = 0; c < DPL; c++) {
                    const int d = lane + 32 * c;
                    if (d < D) acc[c] = fmaf(dj, kr[d], acc[c]);
                }
            }
        }
        for (int c = 0; c < DPL; c++) {
            const int d = lane + 32 * c;
            if (d < D) gq[r * D + d] = scale * acc[c];
        }
        __syncwarp();
    }
}

/* gk and gv per key row: the queries that see key j (causal: i >= j). */
template <int DPL>
__global__ void backward_kv_kernel(float *gk, float *gv, const float *delta, const float *gout, const float *q,
                                   const float *k, const float *v, const float *stats, int64_t BH, int64_t Tq,
                                   int64_t Tk, int D, bool causal, float scale) {
    extern __shared__ float smem[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float *ks = smem + 2 * w * D, *vs = ks + D;
    for (int64_t r = (int64_t)blockIdx.x * WARPS + w; r < BH * Tk; r += (int64_t)gridDim.x * WARPS) {
        const int64_t bh = r / Tk, j = r - bh * Tk, i0 = causal ? j : 0;
        const float *qb = q + bh * Tq * D, *gb = gout + bh * Tq * D, *sb = stats + bh * Tq * 2, *db = delta + bh * Tq;
        load_row(ks, k + r * D, D, lane);
        load_row(vs, v + r * D, D, lane);
        float ak[DPL], av[DPL];
        for (int c = 0; c < DPL; c++) ak[c] = av[c] = 0.0f;
        for (int64_t a0 = i0; a0 < Tq; a0 += 32) {
            const int64_t i = a0 + lane;
            float p = 0.0f, ds = 0.0f;
            if (i < Tq) {
                p = expf((scale * dot(ks, qb + i * D, D) - sb[2 * i]) - sb[2 * i + 1]);
                ds = p * (dot(vs, gb + i * D, D) - db[i]);
            }
            const int n = Tq - a0 < 32 ? (int)(Tq - a0) : 32;
            for (int ii = 0; ii < n; ii++) {
                const float pi = __shfl_sync(0xffffffffu, p, ii), di = __shfl_sync(0xffffffffu, ds, ii);
                const float *qr = qb + (a0 + ii) * D, *gr = gb + (a0 + ii) * D;
                for (int c = 0; c < DPL; c++) {
                    const int d = lane + 32 * c;
                    if (d < D) {
                        ak[c] = fmaf(di, qr[d], ak[c]);
                        av[c] = fmaf(pi, gr[d], av[c]);
                    }
                }
            }
        }
        for (int c = 0; c < DPL; c++) {
            const int d = lane + 32 * c;
            if (d < D) {
                gk[r * D + d] = scale * ak[c];
                gv[r * D + d] = av[c];
            }
        }
        __syncwarp();
    }
}

unsigned blocks_for(int64_t rows) {
    int64_t b = (rows + WARPS - 1) / WARPS;
    if (b < 1) b = 1;
    if (b > 65535 * 8) b = 65535 * 8;
    return (unsigned)b;
}

/* The instantiation for D columns: DPL = ceil(D / 32) rounded up to 1, 2, 4 or 8. */
int dpl_for(int D) { return D <= 32 ? 1 : D <= 64 ? 2 : D <= 128 ? 4 : 8; }

} // namespace

#define TS_ATTN_DISPATCH(KERNEL, ROWS, SHARED, ...)                                                        \
    do {                                                                                                   \
        const unsigned g = blocks_for(ROWS);                                                               \
        const size_t sh = (size_t)(SHARED) * sizeof(float);                                                \
        switch (dpl_for(D)) {                                                                              \
        case 1: KERNEL<1><<<g, 32 * WARPS, sh, s>>>(__VA_ARGS__); break;                                   \
        case 2: KERNEL<2><<<g, 32 * WARPS, sh, s>>>(__VA_ARGS__); break;                                   \
        case 4: KERNEL<4><<<g, 32 * WARPS, sh, s>>>(__VA_ARGS__); break;                                   \
        default: KERNEL<8><<<g, 32 * WARPS, sh, s>>>(__VA_ARGS__); break;                                  \
        }                                                                                                  \
    } while (0)

cudaError_t ts_cu_attention_forward(float *out, float *stats, const float *q, const float *k, const float *v,
                                    int64_t BH, int64_t Tq, int64_t Tk, int D, bool causal, float scale,
                                    cudaStream_t s) {
    if (D < 1 || D > TS_CU_ATTENTION_MAX_D) return cudaErrorInvalidValue;
    if (BH * Tq == 0) return cudaSuccess;
    TS_ATTN_DISPATCH(forward_kernel, BH * Tq, WARPS * D, out, stats, q, k, v, BH, Tq, Tk, D, causal, scale);
    return cudaGetLastError();
}

cudaError_t ts_cu_attention_backward(float *gq, float *gk, float *gv, float *delta, const float *gout, const float *q,
                                     const float *k, const float *v, const float *o, const float *stats, int64_t BH,
                                     int64_t Tq, int64_t Tk, int D, bool causal, float scale, cudaStream_t s) {
    if (D < 1 || D > TS_CU_ATTENTION_MAX_D) return cudaErrorInvalidValue;
    if (BH * Tq == 0) return cudaMemsetAsync(gk, 0, (size_t)(BH * Tk * D) * sizeof(float), s) == cudaSuccess
                                 ? cudaMemsetAsync(gv, 0, (size_t)(BH * Tk * D) * sizeof(float), s)
                                 : cudaGetLastError();
    TS_ATTN_DISPATCH(backward_q_kernel, BH * Tq, 2 * WARPS * D, gq, delta, gout, q, k, v, o, stats, BH, Tq, Tk, D,
                     causal, scale);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    TS_ATTN_DISPATCH(backward_kv_kernel, BH * Tk, 2 * WARPS * D, gk, gv, delta, gout, q, k, v, stats, BH, Tq, Tk, D,
                     causal, scale);
    return cudaGetLastError();
}
