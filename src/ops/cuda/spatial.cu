/*
 * ops/cuda/spatial.cu — CUDA kernels of the spatial family (launchers: spatial_cu.h): pooling,
 * batchnorm2d and conv2d's bias helpers. Convolutions go to cuDNN (spatial.c).
 *
 * Every kernel matches the CPU's formulas (src/ops/cpu/spatial.c) and is deterministic:
 *   - pooling backward passes gather instead of scatter: each input element adds, in (oh, ow)
 *     order, the gradients of the windows covering it (max pool: of those whose argmax it is), the
 *     same terms in the same order as the CPU's scatter loops, so no atomics are needed even where
 *     windows overlap;
 *   - per-channel reductions (batchnorm, bias gradient) add in double in a fixed order (see
 *     spatial_cu.h).
 * Elementwise and pooling kernels index with 32-bit unsigned arithmetic when the element count fits
 * in an int (divisions are cheaper), else with int64_t.
 *
 * The kernels that touch activations (bias add, max pooling, batchnorm) are templates on their element
 * type D (TS_CU_F32, or TS_CU_BF16: bfloat16 activations under ts_set_autocast), loading through
 * elem16.cuh: every element computed in float32 (the sums in double, as for float32) and each output
 * rounded once, as the CPU's bfloat16 kernels.
 */
#include "ops/cuda/spatial_cu.h"
#include "ops/cuda/elem16.cuh"

#include <math.h>

#define RED_THREADS 256 /* threads of a per-channel reduction block (a power of two) */

/* Launch a kernel templated on its index type: 32-bit when n fits (i + stride then cannot wrap). */
#define LAUNCH_IDX(n, kernel, s, ...)                                                          \
    do {                                                                                       \
        if ((n) <= (int64_t)INT32_MAX)                                                         \
            kernel<uint32_t><<<ts_cu_blocks(n), TS_CU_THREADS, 0, (s)>>>(__VA_ARGS__);         \
        else                                                                                   \
            kernel<int64_t><<<ts_cu_blocks(n), TS_CU_THREADS, 0, (s)>>>(__VA_ARGS__);          \
    } while (0)

/* The same for kernels templated on <element type, index type>, dt chosen at run time. */
#define LAUNCH_DT_IDX(dt, n, kernel, s, ...)                                                      \
    do {                                                                                          \
        if ((dt) == TS_CU_BF16)                                                                   \
            LAUNCH_IDX_D(TS_CU_BF16, n, kernel, s, __VA_ARGS__);                                  \
        else                                                                                      \
            LAUNCH_IDX_D(TS_CU_F32, n, kernel, s, __VA_ARGS__);                                   \
    } while (0)
#define LAUNCH_IDX_D(D, n, kernel, s, ...)                                                        \
    do {                                                                                          \
        if ((n) <= (int64_t)INT32_MAX)                                                            \
            kernel<D, uint32_t><<<ts_cu_blocks(n), TS_CU_THREADS, 0, (s)>>>(__VA_ARGS__);         \
        else                                                                                      \
            kernel<D, int64_t><<<ts_cu_blocks(n), TS_CU_THREADS, 0, (s)>>>(__VA_ARGS__);          \
    } while (0)

/* Grid-stride loop over [0, n) with index type I. */
#define IDX_LOOP(I, i, n) \
    for (I i = (I)(blockIdx.x * blockDim.x + threadIdx.x); i < (I)(n); i += (I)(blockDim.x * gridDim.x))

/* ================================ conv2d helpers ================================ */

// y: (N, K, HW) += b[k]
template <int D, typename I>
__global__ void bias_add_kernel(void *y, const float *b, I n, I K, I HW) {
    IDX_LOOP(I, i, n) ts_cu_store<D>(y, i, ts_cu_load<D>(y, i) + b[(i / HW) % K]);
}

TS_CU_EXTERN_C cudaError_t ts_cu_bias_add(int dt, void *y, const float *b, int64_t N, int64_t K, int64_t HW,
                                          cudaStream_t s) {
    const int64_t n = N * K * HW;
    if (n == 0) return cudaSuccess;
    LAUNCH_DT_IDX(dt, n, bias_add_kernel, s, y, b, n, K, HW);
    return cudaGetLastError();
}

/* ================================ pooling ================================ */

/* The first tap position s + j*d (j >= 0) that is >= 0. */
__device__ __forceinline__ int first_valid(int s, int d) { return s >= 0 ? s : s + ((-s + d - 1) / d) * d; }

/* ceil(a / b) for b > 0 and any a; floor for a >= 0 is a / b. */
__device__ __forceinline__ int ceil_div(int a, int b) { return a <= 0 ? -((-a) / b) : (a + b - 1) / b; }

// out, idx: (P, OH, OW) <- x: (P, H, W); the CPU's sequential rule: v > best or v is NaN wins
// (so the last NaN does), the index starts at the window's first valid position
template <int D, typename I>
__global__ void maxpool_kernel(ts_cu_pool_geom g, void *out, int32_t *idx, const void *x, I n) {
    const int H = (int)g.H, W = (int)g.W, OH = (int)g.OH, OW = (int)g.OW;
    IDX_LOOP(I, i, n) {
        const int ow = (int)(i % (I)OW);
        const I r = i / (I)OW;
        const int oh = (int)(r % (I)OH);
        const int64_t xp = (int64_t)(r / (I)OH) * H * W; /* the plane's first element */
        const int hs = oh * g.sh - g.ph, he = min(hs + (g.kh - 1) * g.dh + 1, H);
        const int ws = ow * g.sw - g.pw, we = min(ws + (g.kw - 1) * g.dw + 1, W);
        const int h0 = first_valid(hs, g.dh), w0 = first_valid(ws, g.dw);
        float best = -INFINITY;
        int bi = h0 * W + w0;
        for (int ih = h0; ih < he; ih += g.dh)
            for (int iw = w0; iw < we; iw += g.dw) {
                const float v = ts_cu_load<D>(x, xp + ih * W + iw);
                if (v > best || isnan(v)) {
                    best = v;
                    bi = ih * W + iw;
                }
            }
        ts_cu_store<D>(out, i, best); /* one of the inputs: exact in their type */
        idx[i] = h0 < he && w0 < we ? bi : 0;
    }
}

TS_CU_EXTERN_C cudaError_t ts_cu_maxpool2d(int dt, const ts_cu_pool_geom *g, void *out, int32_t *idx, const void *x,
                                           cudaStream_t s) {
    const int64_t n = g->N * g->C * g->OH * g->OW;
    if (n == 0) return cudaSuccess;
    LAUNCH_DT_IDX(dt, n, maxpool_kernel, s, *g, out, idx, x, n);
    return cudaGetLastError();
}

// gx: (P, H, W) <- gout, idx: (P, OH, OW). Input (ih, iw) is tap (a, b) of output (oh, ow) when
// ih = oh sh - ph + a dh with 0 <= a < kh (likewise for columns); it adds gout of those whose idx
// is its position, in (oh, ow) order (the CPU's scatter order).
template <int D, typename I>
__global__ void maxpool_backward_kernel(ts_cu_pool_geom g, void *gx, const void *gout, const int32_t *idx, I n) {
    const int H = (int)g.H, W = (int)g.W, OH = (int)g.OH, OW = (int)g.OW;
    IDX_LOOP(I, i, n) {
        const int iw = (int)(i % (I)W);
        const I r = i / (I)W;
        const int ih = (int)(r % (I)H);
        const int64_t p = (int64_t)(r / (I)H);
        const int64_t gp = p * OH * OW; /* the plane's first output */
        const int32_t *ip = idx + gp;
        const int pos = ih * W + iw;
        const int oh0 = max(ceil_div(ih + g.ph - (g.kh - 1) * g.dh, g.sh), 0);
        const int oh1 = min((ih + g.ph) / g.sh, OH - 1);
        const int ow0 = max(ceil_div(iw + g.pw - (g.kw - 1) * g.dw, g.sw), 0);
        const int ow1 = min((iw + g.pw) / g.sw, OW - 1);
        float acc = 0.0f;
        for (int oh = oh0; oh <= oh1; oh++) {
            if ((ih + g.ph - oh * g.sh) % g.dh != 0) continue;
            for (int ow = ow0; ow <= ow1; ow++) {
                if ((iw + g.pw - ow * g.sw) % g.dw != 0) continue;
                if (ip[oh * OW + ow] == pos) acc += ts_cu_load<D>(gout, gp + oh * OW + ow);
            }
        }
        ts_cu_store<D>(gx, i, acc);
    }
}

TS_CU_EXTERN_C cudaError_t ts_cu_maxpool2d_backward(int dt, const ts_cu_pool_geom *g, void *gx, const void *gout,
                                                    const int32_t *idx, cudaStream_t s) {
    const int64_t n = g->N * g->C * g->H * g->W;
    if (n == 0) return cudaSuccess;
    LAUNCH_DT_IDX(dt, n, maxpool_backward_kernel, s, *g, gx, gout, idx, n);
    return cudaGetLastError();
}

/* 1 / the divisor of avg-pool window (oh, ow) (count_include_pad: the window clipped at H + ph,
 * W + pw; exclude_pad: its input elements), 0 for a window without input elements (the CPU's
 * avgpool_divisors). */
__device__ __forceinline__ float avg_inv(const ts_cu_pool_geom &g, int oh, int ow) {
    const int H = (int)g.H, W = (int)g.W;
    const int hs = oh * g.sh - g.ph, he = min(hs + g.kh, H + g.ph);
    const int hn = min(he, H) - max(hs, 0);
    const int ws = ow * g.sw - g.pw, we = min(ws + g.kw, W + g.pw);
    const int wn = min(we, W) - max(ws, 0);
    const int64_t count = g.exclude_pad ? (int64_t)hn * wn : (int64_t)(he - hs) * (we - ws);
    return hn > 0 && wn > 0 ? 1.0f / (float)count : 0.0f;
}

// out: (P, OH, OW) = window sums of x: (P, H, W) (row by row, as the CPU) times avg_inv
template <typename I>
__global__ void avgpool_kernel(ts_cu_pool_geom g, float *out, const float *x, I n) {
    const int H = (int)g.H, W = (int)g.W, OH = (int)g.OH, OW = (int)g.OW;
    IDX_LOOP(I, i, n) {
        const int ow = (int)(i % (I)OW);
        const I r = i / (I)OW;
        const int oh = (int)(r % (I)OH);
        const float *xp = x + (int64_t)(r / (I)OH) * H * W;
        const int hs = max(oh * g.sh - g.ph, 0), he = min(oh * g.sh - g.ph + g.kh, H);
        const int ws = max(ow * g.sw - g.pw, 0), we = min(ow * g.sw - g.pw + g.kw, W);
        float acc = 0.0f;
        for (int ih = hs; ih < he; ih++)
            for (int iw = ws; iw < we; iw++) acc += xp[ih * W + iw];
        out[i] = acc * avg_inv(g, oh, ow);
    }
}

TS_CU_EXTERN_C cudaError_t ts_cu_avgpool2d(const ts_cu_pool_geom *g, float *out, const float *x, cudaStream_t s) {
    const int64_t n = g->N * g->C * g->OH * g->OW;
    if (n == 0) return cudaSuccess;
    LAUNCH_IDX(n, avgpool_kernel, s, *g, out, x, n);
    return cudaGetLastError();
}

// gx: (P, H, W): input (ih, iw) lies in window (oh, ow) when oh sh - ph <= ih < oh sh - ph + kh (and
// likewise for columns); it adds gout * avg_inv of those windows in (oh, ow) order
template <typename I>
__global__ void avgpool_backward_kernel(ts_cu_pool_geom g, float *gx, const float *gout, I n) {
    const int H = (int)g.H, W = (int)g.W, OH = (int)g.OH, OW = (int)g.OW;
    IDX_LOOP(I, i, n) {
        const int iw = (int)(i % (I)W);
        const I r = i / (I)W;
        const int ih = (int)(r % (I)H);
        const float *gp = gout + (int64_t)(r / (I)H) * OH * OW;
        const int oh0 = max(ceil_div(ih + g.ph - g.kh + 1, g.sh), 0), oh1 = min((ih + g.ph) / g.sh, OH - 1);
        const int ow0 = max(ceil_div(iw + g.pw - g.kw + 1, g.sw), 0), ow1 = min((iw + g.pw) / g.sw, OW - 1);
        float acc = 0.0f;
        for (int oh = oh0; oh <= oh1; oh++)
            for (int ow = ow0; ow <= ow1; ow++) acc += gp[oh * OW + ow] * avg_inv(g, oh, ow);
        gx[i] = acc;
    }
}

TS_CU_EXTERN_C cudaError_t ts_cu_avgpool2d_backward(const ts_cu_pool_geom *g, float *gx, const float *gout,
                                                    cudaStream_t s) {
    const int64_t n = g->N * g->C * g->H * g->W;
    if (n == 0) return cudaSuccess;
    LAUNCH_IDX(n, avgpool_backward_kernel, s, *g, gx, gout, n);
    return cudaGetLastError();
}

/* PyTorch's adaptive windows: [floor(i in / out), ceil((i + 1) in / out)) */
__device__ __forceinline__ int64_t ad_start(int64_t i, int64_t in, int64_t out) { return (i * in) / out; }
__device__ __forceinline__ int64_t ad_end(int64_t i, int64_t in, int64_t out) { return ((i + 1) * in + out - 1) / out; }

// out: (P, OH, OW) = window means of x: (P, H, W)
template <typename I>
__global__ void adaptive_avgpool_kernel(float *out, const float *x, I n, int64_t H, int64_t W, int64_t OH,
                                        int64_t OW) {
    IDX_LOOP(I, i, n) {
        const int64_t ow = (int64_t)(i % (I)OW);
        const I r = i / (I)OW;
        const int64_t oh = (int64_t)(r % (I)OH);
        const float *xp = x + (int64_t)(r / (I)OH) * H * W;
        const int64_t hs = ad_start(oh, H, OH), he = ad_end(oh, H, OH);
        const int64_t ws = ad_start(ow, W, OW), we = ad_end(ow, W, OW);
        float acc = 0.0f;
        for (int64_t ih = hs; ih < he; ih++)
            for (int64_t iw = ws; iw < we; iw++) acc += xp[ih * W + iw];
        out[i] = acc / (float)((he - hs) * (we - ws));
    }
}

TS_CU_EXTERN_C cudaError_t ts_cu_adaptive_avgpool2d(float *out, const float *x, int64_t P, int64_t H, int64_t W,
                                                    int64_t OH, int64_t OW, cudaStream_t s) {
    const int64_t n = P * OH * OW;
    if (n == 0) return cudaSuccess;
    LAUNCH_IDX(n, adaptive_avgpool_kernel, s, out, x, n, H, W, OH, OW);
    return cudaGetLastError();
}

// gx: (P, H, W): row ih lies in windows oh = floor(ih OH / H) .. floor(((ih + 1) OH - 1) / H)
// (start(oh) <= ih < end(oh)), likewise for columns; adds gout / window size in (oh, ow) order
template <typename I>
__global__ void adaptive_avgpool_backward_kernel(float *gx, const float *gout, I n, int64_t H, int64_t W,
                                                 int64_t OH, int64_t OW) {
    IDX_LOOP(I, i, n) {
        const int64_t iw = (int64_t)(i % (I)W);
        const I r = i / (I)W;
        const int64_t ih = (int64_t)(r % (I)H);
        const float *gp = gout + (int64_t)(r / (I)H) * OH * OW;
        const int64_t oh0 = (ih * OH) / H, oh1 = min(((ih + 1) * OH - 1) / H, OH - 1);
        const int64_t ow0 = (iw * OW) / W, ow1 = min(((iw + 1) * OW - 1) / W, OW - 1);
        float acc = 0.0f;
        for (int64_t oh = oh0; oh <= oh1; oh++) {
            const int64_t hs = ad_start(oh, H, OH), he = ad_end(oh, H, OH);
            if (ih < hs || ih >= he) continue; /* (cannot happen; kept as the definition) */
            for (int64_t ow = ow0; ow <= ow1; ow++) {
                const int64_t ws = ad_start(ow, W, OW), we = ad_end(ow, W, OW);
                if (iw < ws || iw >= we) continue;
                acc += gp[oh * OW + ow] / (float)((he - hs) * (we - ws));
            }
        }
        gx[i] = acc;
    }
}

TS_CU_EXTERN_C cudaError_t ts_cu_adaptive_avgpool2d_backward(float *gx, const float *gout, int64_t P, int64_t H,
                                                             int64_t W, int64_t OH, int64_t OW, cudaStream_t s) {
    const int64_t n = P * H * W;
    if (n == 0) return cudaSuccess;
    LAUNCH_IDX(n, adaptive_avgpool_backward_kernel, s, gx, gout, n, H, W, OH, OW);
    return cudaGetLastError();
}

/* ============================ per-channel reductions ============================ */

TS_CU_EXTERN_C int ts_cu_chan_splits(int64_t N, int64_t C, int64_t HW) {
    /* about 1024 blocks in all, each over at least 8192 elements */
    const int64_t M = N * HW;
    int64_t S = C > 0 ? (1024 + C - 1) / C : 1;
    if (S > M / 8192) S = M / 8192;
    if (S < 1) S = 1;
    if (S > 65535) S = 65535;
    return (int)S;
}

// part[(c S + s) 2 + {0, 1}] <- sums over range s = [s M / S, (s + 1) M / S) of channel c's M = N*HW
// elements (flat n*HW + j, element (n, c, j) of x); grid (C, S), RED_THREADS threads; each thread adds
// its elements in double, then the block's tree adds the threads' sums
template <int MODE, int D>
__global__ void __launch_bounds__(RED_THREADS) chan_partials_kernel(const void *x, const void *g, const float *mean,
                                                                    int64_t N, int64_t C, int64_t HW, int S,
                                                                    double *part) {
    __shared__ double sa[RED_THREADS], sb[RED_THREADS];
    const int64_t c = blockIdx.x, sidx = blockIdx.y, M = N * HW;
    const int64_t lo = M * sidx / S, hi = M * (sidx + 1) / S;
    const double m = MODE == TS_CU_CHAN_SUM ? 0.0 : (double)mean[c];
    const int t = threadIdx.x;
    double a = 0.0, b = 0.0;
    if (hi > lo) {
        /* element f = lo + t, lo + t + RED_THREADS, ... of the channel: plane n, offset j, advanced
         * without dividing (dj < HW, so one carry at most) */
        int64_t f = lo + t, n = f / HW, j = f - n * HW;
        const int64_t dn = RED_THREADS / HW, dj = RED_THREADS % HW;
        for (; f < hi; f += RED_THREADS) {
            const int64_t e = (n * C + c) * HW + j;
            const float v = ts_cu_load<D>(x, e);
            if (MODE == TS_CU_CHAN_SUM) {
                a += (double)v;
            } else if (MODE == TS_CU_CHAN_SQDEV) {
                const double d = (double)v - m;
                a += d * d;
            } else {
                const double gv = (double)ts_cu_load<D>(g, e);
                a += gv;
                b += gv * ((double)v - m);
            }
            n += dn;
            j += dj;
            if (j >= HW) {
                j -= HW;
                n++;
            }
        }
    }
    sa[t] = a;
    sb[t] = b;
    __syncthreads();
    for (int k = RED_THREADS / 2; k > 0; k >>= 1) {
        if (t < k) {
            sa[t] += sa[t + k];
            sb[t] += sb[t + k];
        }
        __syncthreads();
    }
    if (t == 0) {
        part[(c * S + sidx) * 2] = sa[0];
        part[(c * S + sidx) * 2 + 1] = sb[0];
    }
}

template <int D>
static void chan_partials_launch(int mode, const void *x, const void *g, const float *mean, int64_t N, int64_t C,
                                 int64_t HW, int S, double *part, cudaStream_t s) {
    const dim3 grid((unsigned)C, (unsigned)S);
    if (mode == TS_CU_CHAN_SUM)
        chan_partials_kernel<TS_CU_CHAN_SUM, D><<<grid, RED_THREADS, 0, s>>>(x, g, mean, N, C, HW, S, part);
    else if (mode == TS_CU_CHAN_SQDEV)
        chan_partials_kernel<TS_CU_CHAN_SQDEV, D><<<grid, RED_THREADS, 0, s>>>(x, g, mean, N, C, HW, S, part);
    else
        chan_partials_kernel<TS_CU_CHAN_DOTDEV, D><<<grid, RED_THREADS, 0, s>>>(x, g, mean, N, C, HW, S, part);
}

TS_CU_EXTERN_C cudaError_t ts_cu_chan_partials(int mode, int dt, const void *x, const void *g, const float *mean,
                                               int64_t N, int64_t C, int64_t HW, int S, double *part, cudaStream_t s) {
    if (C == 0) return cudaSuccess;
    if (dt == TS_CU_BF16)
        chan_partials_launch<TS_CU_BF16>(mode, x, g, mean, N, C, HW, S, part, s);
    else
        chan_partials_launch<TS_CU_F32>(mode, x, g, mean, N, C, HW, S, part, s);
    return cudaGetLastError();
}

/* The sum of component k of channel c's S partials, in order. */
__device__ __forceinline__ double part_total(const double *part, int64_t c, int S, int k) {
    double t = 0.0;
    for (int i = 0; i < S; i++) t += part[(c * S + i) * 2 + k];
    return t;
}

__global__ void chan_sum_finalize_kernel(const double *part, int64_t C, int S, float *out) {
    TS_CU_LOOP(c, C) out[c] = (float)part_total(part, c, S, 0);
}

TS_CU_EXTERN_C cudaError_t ts_cu_chan_sum_finalize(const double *part, int64_t C, int S, float *out, cudaStream_t s) {
    if (C == 0) return cudaSuccess;
    chan_sum_finalize_kernel<<<ts_cu_blocks(C), TS_CU_THREADS, 0, s>>>(part, C, S, out);
    return cudaGetLastError();
}

/* ================================ batchnorm2d ================================ */

__global__ void bn_stats_mean_kernel(const double *part, int64_t C, int S, int64_t M, double *mu, float *mean,
                                     float *mres) {
    TS_CU_LOOP(c, C) {
        const double m = M ? part_total(part, c, S, 0) / (double)M : 0.0;
        mu[c] = m;
        mean[c] = (float)m;
        if (mres) mres[c] = (float)(m - (double)(float)m);
    }
}

TS_CU_EXTERN_C cudaError_t ts_cu_bn_stats_mean(const double *part, int64_t C, int S, int64_t M, double *mu,
                                               float *mean, float *mres, cudaStream_t s) {
    if (C == 0) return cudaSuccess;
    bn_stats_mean_kernel<<<ts_cu_blocks(C), TS_CU_THREADS, 0, s>>>(part, C, S, M, mu, mean, mres);
    return cudaGetLastError();
}

// the sum of squares was taken about the float mean mf: subtract M (mu - mf)^2 (as the CPU)
__global__ void bn_stats_var_kernel(const double *part, int64_t C, int S, int64_t M, const double *mu,
                                    const float *mean, float eps, float momentum, float *invstd, float *rm,
                                    float *rv) {
    TS_CU_LOOP(c, C) {
        const double m = mu[c], mf = (double)mean[c], mom = (double)momentum;
        const double ss = part_total(part, c, S, 0) - (double)M * (m - mf) * (m - mf);
        invstd[c] = (float)(1.0 / sqrt((M ? ss / (double)M : 0.0) + (double)eps));
        if (rm) rm[c] = (float)(mom * m + (1.0 - mom) * (double)rm[c]);
        if (rv) rv[c] = (float)(mom * (M > 1 ? ss / (double)(M - 1) : 0.0) + (1.0 - mom) * (double)rv[c]);
    }
}

TS_CU_EXTERN_C cudaError_t ts_cu_bn_stats_var(const double *part, int64_t C, int S, int64_t M, const double *mu,
                                              const float *mean, float eps, float momentum, float *invstd,
                                              float *running_mean, float *running_var, cudaStream_t s) {
    if (C == 0) return cudaSuccess;
    bn_stats_var_kernel<<<ts_cu_blocks(C), TS_CU_THREADS, 0, s>>>(part, C, S, M, mu, mean, eps, momentum, invstd,
                                                                   running_mean, running_var);
    return cudaGetLastError();
}

__global__ void bn_invstd_kernel(const float *var, float eps, float *invstd, int64_t C) {
    TS_CU_LOOP(c, C) invstd[c] = (float)(1.0 / sqrt((double)var[c] + (double)eps));
}

TS_CU_EXTERN_C cudaError_t ts_cu_bn_invstd(const float *var, float eps, float *invstd, int64_t C, cudaStream_t s) {
    if (C == 0) return cudaSuccess;
    bn_invstd_kernel<<<ts_cu_blocks(C), TS_CU_THREADS, 0, s>>>(var, eps, invstd, C);
    return cudaGetLastError();
}

// out: (N, C, HW) = (x - mean[c]) s + (bias[c] - mres[c] s), s = invstd[c] weight[c] (centred, as the CPU's:
// x s + (bias - mean s) cancels when |mean| >> std); __fmul_rn/__fadd_rn: no FMA, the CPU's roundings
template <int D, typename I>
__global__ void bn_apply_kernel(void *out, const void *x, const float *mean, const float *mres, const float *invstd,
                                const float *weight, const float *bias, I n, I C, I HW) {
    IDX_LOOP(I, i, n) {
        const I c = (i / HW) % C;
        const float scale = invstd[c] * (weight ? weight[c] : 1.0f);
        const float shift = (float)((bias ? (double)bias[c] : 0.0) - (mres ? (double)mres[c] * scale : 0.0));
        const float d = ts_cu_load<D>(x, i) - mean[c];
        ts_cu_store<D>(out, i, __fadd_rn(__fmul_rn(d, scale), shift));
    }
}

TS_CU_EXTERN_C cudaError_t ts_cu_bn_apply(int dt, void *out, const void *x, const float *mean, const float *mres,
                                          const float *invstd, const float *weight, const float *bias, int64_t N,
                                          int64_t C, int64_t HW, cudaStream_t s) {
    const int64_t n = N * C * HW;
    if (n == 0) return cudaSuccess;
    LAUNCH_DT_IDX(dt, n, bn_apply_kernel, s, out, x, mean, mres, invstd, weight, bias, n, C, HW);
    return cudaGetLastError();
}

/* With xhat = (x - mean - mres) invstd, per channel: gb = sum g, gw = sum g xhat; training:
 * gx = w invstd (g - gb/M - xhat gw/M), eval: gx = w invstd g; written as a g + b (x - mean) + k
 * (the CPU's cpu_batchnorm2d_backward, term for term; centred: no cancellation at |mean| >> std). The
 * DOTDEV partials ran about mean: sum g (x - mean - mres) = sgx - mres sg. */
__global__ void bn_backward_coef_kernel(const double *part, int64_t C, int S, int64_t M, const float *mres,
                                        const float *invstd, const float *weight, bool training, float *gw,
                                        float *gb, float *coef) {
    TS_CU_LOOP(c, C) {
        const double r = mres ? (double)mres[c] : 0.0, sg = part ? part_total(part, c, S, 0) : 0.0;
        const double sgx = part ? part_total(part, c, S, 1) - r * sg : 0.0;
        const double is = (double)invstd[c];
        if (gb) gb[c] = (float)sg;
        if (gw) gw[c] = (float)(sgx * is);
        const double wv = weight ? (double)weight[c] : 1.0;
        float a = (float)(wv * is), b = 0.0f, k = 0.0f;
        if (training && M > 0) {
            const double bb = -wv * is * is * is * sgx / (double)M;
            b = (float)bb;
            k = (float)(-wv * is * sg / (double)M - bb * r);
        }
        coef[c * 3] = a;
        coef[c * 3 + 1] = b;
        coef[c * 3 + 2] = k;
    }
}

TS_CU_EXTERN_C cudaError_t ts_cu_bn_backward_coef(const double *part, int64_t C, int S, int64_t M, const float *mres,
                                                  const float *invstd, const float *weight, bool training, float *gw,
                                                  float *gb, float *coef, cudaStream_t s) {
    if (C == 0) return cudaSuccess;
    bn_backward_coef_kernel<<<ts_cu_blocks(C), TS_CU_THREADS, 0, s>>>(part, C, S, M, mres, invstd, weight, training,
                                                                       gw, gb, coef);
    return cudaGetLastError();
}

// gx: (N, C, HW) = a g + b (x - mean[c]) + k with (a, b, k) = coef[c], rounded as the CPU's (no FMA)
template <int D, typename I>
__global__ void bn_axpbyc_kernel(void *gx, const void *g, const void *x, const float *mean, const float *coef, I n,
                                 I C, I HW) {
    IDX_LOOP(I, i, n) {
        const I c = (i / HW) % C;
        const float d = ts_cu_load<D>(x, i) - mean[c];
        const float ag = __fmul_rn(coef[c * 3], ts_cu_load<D>(g, i)), bd = __fmul_rn(coef[c * 3 + 1], d);
        ts_cu_store<D>(gx, i, __fadd_rn(__fadd_rn(ag, bd), coef[c * 3 + 2]));
    }
}

TS_CU_EXTERN_C cudaError_t ts_cu_bn_axpbyc(int dt, void *gx, const void *g, const void *x, const float *mean,
                                           const float *coef, int64_t N, int64_t C, int64_t HW, cudaStream_t s) {
    const int64_t n = N * C * HW;
    if (n == 0) return cudaSuccess;
    LAUNCH_DT_IDX(dt, n, bn_axpbyc_kernel, s, gx, g, x, mean, coef, n, C, HW);
    return cudaGetLastError();
}
