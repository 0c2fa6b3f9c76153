/*
 * ops/cuda/norm.cu — CUDA kernels of the norm family (launchers in ops/cuda/norm_cu.h, the kernel
 * table in ops/cuda/norm.c): group_norm / layer_norm forward and backward (device/k_norm.h).
 *
 * A row (D = Cg * S contiguous elements) is handled by a warp when D <= 1024, else by a block.
 * Row statistics follow the CPU's two passes (ops/cpu/norm.c): a float mean m0 from the sum, then
 * the sums s1 of (x - m0) and s2 of (x - m0)^2, mean = m0 + s1/D, var = (s2 - s1^2/D)/D. Every
 * sum is per-thread float partials that go to a per-thread double every RUN_TERMS = 16 terms, as
 * the CPU's float lanes do every TS_PLANE_RUN blocks (RunSum: the error does not grow with the
 * row), totalled by a double shuffle/shared-memory tree. The mean is kept as a float and its
 * residual (mres), and the output is centred on both: ((x - mean) - mres) invstd w + b. Backward
 * recomputes each row's two sums the same way, about the same two floats, and writes gx in a
 * second pass over the row.
 *
 * Weight and bias gradients are sums over every sample n = r / G of a channel's elements; no
 * atomics, so they are deterministic:
 *   S == 1 (layer norm, or group norm on (N, C)): x is (N, P); a thread per (chunk of
 *     TS_CU_NORM_CHUNK samples, channel) sums down its column in double -> part[chunk][ch];
 *   S > 1: a warp (block when S > 1024) per (sample, channel) plane of S elements -> part[n][ch];
 * then a thread per channel adds its partials in chunk order.
 */
#include "ops/cuda/norm_cu.h"
#include "ops/cuda/reduce.cuh"

#include <math.h>


/* Kernels and helpers are file-local (other .cu files may use the same names); the launchers below
 * the namespace blocks are the only exported symbols. */
namespace {

/* A thread's share of a sum: float partials of at most RUN_TERMS terms, each added to a double. */
#define RUN_TERMS 16
struct RunSum {
    float f = 0.0f;
    double d = 0.0;
    int n = 0;
    __device__ void add(float v) {
        f += v;
        if (++n == RUN_TERMS) {
            d += (double)f;
            f = 0.0f;
            n = 0;
        }
    }
    __device__ double total() const { return d + (double)f; }
};

static unsigned groups_grid(int64_t items, bool warp) {
    if (warp) return ts_cu_blocks(items * 32); /* TS_CU_THREADS / 32 items per block */
    return (unsigned)(items < 65535 * 8 ? items : 65535 * 8);
}

/* ---- forward ------------------------------------------------------------------------------------------- */
// out, x: (R, D); mean, mres (or NULL), invstd: (R); w, b: (G*Cg) or NULL
template <class Grp> __global__ void norm_fwd_kernel(float *out, float *mean, float *mres, float *invstd,
                                                     const float *x, const float *w, const float *b, int64_t R,
                                                     int64_t G, int64_t Cg, int64_t S, float eps) {
    const int64_t D = Cg * S;
    for (int64_t r = Grp::first(); r < R; r += Grp::stride()) {
        const float *xr = x + r * D;
        float *orow = out + r * D;
        RunSum ps;
        for (int64_t k = Grp::lane(); k < D; k += Grp::size()) ps.add(xr[k]);
        const float m0 = D ? (float)(Grp::sum(ps.total()) / (double)D) : 0.0f;
        RunSum p1, p2; /* about m0: sum (x - m0), sum (x - m0)^2 (no cancellation when |mean| >> std) */
        for (int64_t k = Grp::lane(); k < D; k += Grp::size()) {
            const float d = xr[k] - m0;
            p1.add(d);
            p2.add(__fmul_rn(d, d));
        }
        const double s1 = Grp::sum(p1.total()), s2 = Grp::sum(p2.total());
        double var = D ? (s2 - s1 * s1 / (double)D) / (double)D : 0.0;
        if (var < 0) var = 0;
        const double mu = D ? (double)m0 + s1 / (double)D : 0.0;
        const float mf = (float)mu, lo = (float)(mu - (double)mf);
        const float is = (float)(1.0 / sqrt(var + (double)eps));
        if (Grp::lane() == 0) {
            mean[r] = mf;
            if (mres) mres[r] = lo;
            invstd[r] = is;
        }
        const int64_t ch0 = (r % G) * Cg;
        if (S == 1) { /* layer norm: one element per channel */
            for (int64_t k = Grp::lane(); k < D; k += Grp::size())
                orow[k] = ((xr[k] - mf) - lo) * is * (w ? w[ch0 + k] : 1.0f) + (b ? b[ch0 + k] : 0.0f);
            continue;
        }
        for (int64_t k = Grp::lane(); k < D; k += Grp::size()) { /* (x - mf) a + (b - lo a), as the CPU's */
            const int64_t ch = ch0 + k / S;
            const float a = is * (w ? w[ch] : 1.0f);
            const float c = (float)((b ? (double)b[ch] : 0.0) - (double)lo * a);
            orow[k] = __fadd_rn(__fmul_rn(xr[k] - mf, a), c);
        }
    }
}

} // namespace

cudaError_t ts_cu_group_norm(float *out, float *mean, float *mres, float *invstd, const float *x, const float *w,
                             const float *b, int64_t R, int64_t G, int64_t Cg, int64_t S, float eps, cudaStream_t s) {
    if (R <= 0) return cudaSuccess;
    if (Cg * S <= 1024)
        norm_fwd_kernel<GWarp><<<groups_grid(R, true), TS_CU_THREADS, 0, s>>>(out, mean, mres, invstd, x, w, b, R, G,
                                                                              Cg, S, eps);
    else
        norm_fwd_kernel<GBlock><<<groups_grid(R, false), ROW_BLOCK, 0, s>>>(out, mean, mres, invstd, x, w, b, R, G,
                                                                            Cg, S, eps);
    return cudaGetLastError();
}

namespace {

/* ---- backward: gx ------------------------------------------------------------------------------------- */
/* Per row, with h = g w[ch] and mean = mf + lo (mres): A = sum h, B = invstd sum h (x - mean), then
 *   gx = invstd (h - A/D - xhat B/D) = invstd w g + k1 (x - mf) + (k0 - k1 lo). */
template <class Grp> __global__ void norm_bwd_kernel(float *gx, const float *g, const float *x, const float *mean,
                                                     const float *mres, const float *invstd, const float *w, int64_t R,
                                                     int64_t G, int64_t Cg, int64_t S) {
    const int64_t D = Cg * S;
    for (int64_t r = Grp::first(); r < R; r += Grp::stride()) {
        const float *xr = x + r * D, *gr = g + r * D;
        float *o = gx + r * D;
        const int64_t ch0 = (r % G) * Cg;
        const float mu = mean[r], lo = mres ? mres[r] : 0.0f, is = invstd[r];
        RunSum fa, fb;
        for (int64_t k = Grp::lane(); k < D; k += Grp::size()) {
            const float wv = w ? w[ch0 + (S == 1 ? k : k / S)] : 1.0f;
            fa.add(wv * gr[k]);
            fb.add(wv * (gr[k] * ((xr[k] - mu) - lo)));
        }
        const double A = Grp::sum(fa.total()), B = Grp::sum(fb.total()) * is;
        const float k1 = D ? (float)(-(double)is * is * B / (double)D) : 0.0f;
        const float k0 = D ? (float)(-(double)is * A / (double)D - (double)k1 * lo) : 0.0f;
        for (int64_t k = Grp::lane(); k < D; k += Grp::size()) {
            const float a = is * (w ? w[ch0 + (S == 1 ? k : k / S)] : 1.0f);
            o[k] = a * gr[k] + k1 * (xr[k] - mu) + k0;
        }
    }
}

/* ---- backward: weight and bias gradients ---------------------------------------------------------------- */
/* S == 1: x, g seen as (N, P); part[j * P + ch] = (sum g (x - mean) invstd, sum g) over the samples
 * of chunk j, in sample order, in double (the CPU's per-element terms). */
__global__ void wgrad_cols_kernel(const float *g, const float *x, const float *mean, const float *mres,
                                  const float *invstd, int64_t N, int64_t G, int64_t Cg, int64_t nchunks,
                                  double2 *part) {
    const int64_t P = G * Cg;
    TS_CU_LOOP(k, nchunks * P) {
        const int64_t j = k / P, ch = k - j * P, grp = ch / Cg;
        const int64_t n0 = j * TS_CU_NORM_CHUNK, n1 = n0 + TS_CU_NORM_CHUNK < N ? n0 + TS_CU_NORM_CHUNK : N;
        double sw = 0, sb = 0;
        for (int64_t n = n0; n < n1; n++) {
            const int64_t r = n * G + grp, e = n * P + ch;
            const float gd = g[e] * ((x[e] - mean[r]) - (mres ? mres[r] : 0.0f));
            sw += (double)(gd * invstd[r]);
            sb += (double)g[e];
        }
        part[k] = make_double2(sw, sb);
    }
}

/* S > 1: plane q = n * P + ch holds S elements at q * S (row r = n G + ch / Cg);
 * part[q] = (invstd sum g (x - mean), sum g). */
template <class Grp> __global__ void wgrad_planes_kernel(const float *g, const float *x, const float *mean,
                                                         const float *mres, const float *invstd, int64_t nplanes,
                                                         int64_t G, int64_t Cg, int64_t S, double2 *part) {
    const int64_t P = G * Cg;
    for (int64_t q = Grp::first(); q < nplanes; q += Grp::stride()) {
        const int64_t n = q / P, ch = q - n * P, r = n * G + ch / Cg;
        const float *gs = g + q * S, *xs = x + q * S;
        const float mu = mean[r];
        RunSum a, b;
        for (int64_t k = Grp::lane(); k < S; k += Grp::size()) {
            a.add(gs[k]);
            b.add(gs[k] * (xs[k] - mu));
        }
        const double ad = Grp::sum(a.total()), bd = Grp::sum(b.total()) - (mres ? (double)mres[r] * ad : 0.0);
        if (Grp::lane() == 0) part[q] = make_double2(bd * invstd[r], ad);
    }
}

/* gw[ch], gb[ch] = sums of part[j * P + ch] over j in order (0 for no partials). */
__global__ void wgrad_final_kernel(const double2 *part, int64_t nchunks, int64_t P, float *gw, float *gb) {
    TS_CU_LOOP(ch, P) {
        double sw = 0, sb = 0;
        for (int64_t j = 0; j < nchunks; j++) {
            sw += part[j * P + ch].x;
            sb += part[j * P + ch].y;
        }
        if (gw) gw[ch] = (float)sw;
        if (gb) gb[ch] = (float)sb;
    }
}

} // namespace

cudaError_t ts_cu_group_norm_backward(float *gx, float *gw, float *gb, const float *g, const float *x,
                                      const float *mean, const float *mres, const float *invstd, const float *w,
                                      int64_t R, int64_t G, int64_t Cg, int64_t S, double *part, cudaStream_t s) {
    const int64_t D = Cg * S, P = G * Cg, N = G ? R / G : 0;
    if (gx && R > 0) {
        if (D <= 1024)
            norm_bwd_kernel<GWarp><<<groups_grid(R, true), TS_CU_THREADS, 0, s>>>(gx, g, x, mean, mres, invstd, w, R,
                                                                                  G, Cg, S);
        else
            norm_bwd_kernel<GBlock><<<groups_grid(R, false), ROW_BLOCK, 0, s>>>(gx, g, x, mean, mres, invstd, w, R, G,
                                                                                Cg, S);
    }
    if ((gw || gb) && P > 0) {
        double2 *pp = (double2 *)part;
        int64_t nchunks = N;
        if (S == 1) {
            nchunks = (N + TS_CU_NORM_CHUNK - 1) / TS_CU_NORM_CHUNK;
            if (nchunks > 0)
                wgrad_cols_kernel<<<ts_cu_blocks(nchunks * P), TS_CU_THREADS, 0, s>>>(g, x, mean, mres, invstd, N, G,
                                                                                     Cg, nchunks, pp);
        } else if (N > 0) {
            if (S <= 1024)
                wgrad_planes_kernel<GWarp><<<groups_grid(N * P, true), TS_CU_THREADS, 0, s>>>(g, x, mean, mres, invstd,
                                                                                              N * P, G, Cg, S, pp);
            else
                wgrad_planes_kernel<GBlock><<<groups_grid(N * P, false), ROW_BLOCK, 0, s>>>(g, x, mean, mres, invstd,
                                                                                            N * P, G, Cg, S, pp);
        }
        wgrad_final_kernel<<<ts_cu_blocks(P), TS_CU_THREADS, 0, s>>>(pp, nchunks, P, gw, gb);
    }
    return cudaGetLastError();
}
