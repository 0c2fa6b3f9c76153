/*
 * ops/cpu/norm.c — CPU kernels of the norm family (see device/k_norm.h):
 * per-row normalisation with a per-channel affine (group_norm; layer_norm is
 * its G = 1, S = 1 case), forward and backward.
 *
 * Rows run in parallel (OpenMP above PAR_MIN elements); row statistics are
 * float SIMD partial sums totalled in double, the variance a second pass about
 * the mean. The weight and bias gradients sum over every row of a channel's
 * group, so they run in parallel over channels, each reading its own slices.
 */
#include "tensor/tensor.h"
#include "device/k_norm.h"

#include <math.h>
#include <omp.h>

#define PAR_MIN 32768 /* below this many elements, stay on one thread */

/* sum of p[0..n) */
static double span_sum(const float *p, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += p[i];
    return s;
}

/* sum of (p[i] - m)^2 */
static double span_sqdev(const float *p, int64_t n, float m) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += (p[i] - m) * (p[i] - m);
    return s;
}

// out, x: (R, Cg*S); mean, invstd: (R); weight, bias: (G*Cg) or NULL
static ts_status cpu_group_norm(const ts_norm_geom *g, ts_tensor *out, ts_tensor *mean, ts_tensor *invstd,
                                const ts_tensor *x, const ts_tensor *weight, const ts_tensor *bias, float eps) {
    const int64_t R = g->R, G = g->G, Cg = g->Cg, S = g->S, D = Cg * S;
    const float *px = ts__f32(x), *pw = weight ? ts__f32(weight) : NULL, *pb = bias ? ts__f32(bias) : NULL;
    float *po = ts__f32(out), *pm = ts__f32(mean), *pis = ts__f32(invstd);
#pragma omp parallel for if (R * D > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < R; r++) {
        const float *xr = px + r * D;
        float *orow = po + r * D;
        double mu = D ? span_sum(xr, D) / (double)D : 0.0;
        float mf = (float)mu;
        /* the rounding of the mean changes the sum of squares by D (mu - mf)^2 */
        double ss = span_sqdev(xr, D, mf) - (double)D * (mu - mf) * (mu - mf);
        double var = D ? ss / (double)D : 0.0;
        if (var < 0) var = 0;
        float is = (float)(1.0 / sqrt(var + (double)eps));
        pm[r] = mf;
        pis[r] = is;
        const int64_t ch0 = (r % G) * Cg;
        for (int64_t c = 0; c < Cg; c++) {
            float a = is * (pw ? pw[ch0 + c] : 1.0f);
            float b = (pb ? pb[ch0 + c] : 0.0f) - mf * a;
            const float *xs = xr + c * S;
            float *os = orow + c * S;
            for (int64_t s = 0; s < S; s++) os[s] = xs[s] * a + b;
        }
    }
    return TS_OK;
}

/* gx per row: invstd (h - A/D - xhat B/D) with h = g w[ch], A = sum h, B = sum h xhat;
 * gw[ch] = sum g xhat, gb[ch] = sum g over the rows of ch's group. */
static ts_status cpu_group_norm_backward(const ts_norm_geom *g, const ts_tensor *gout, const ts_tensor *x,
                                         const ts_tensor *mean, const ts_tensor *invstd, const ts_tensor *weight,
                                         ts_tensor *gx, ts_tensor *gw, ts_tensor *gb) {
    const int64_t R = g->R, G = g->G, Cg = g->Cg, S = g->S, D = Cg * S;
    const float *px = ts__f32(x), *pg = ts__f32(gout), *pm = ts__f32(mean), *pis = ts__f32(invstd);
    const float *pw = weight ? ts__f32(weight) : NULL;
    if (gx) {
        float *pgx = ts__f32(gx);
#pragma omp parallel for if (R * D > PAR_MIN) schedule(static)
        for (int64_t r = 0; r < R; r++) {
            const float *xr = px + r * D, *gr = pg + r * D;
            float *o = pgx + r * D;
            const int64_t ch0 = (r % G) * Cg;
            const float mu = pm[r], is = pis[r];
            double A = 0, B = 0;
            for (int64_t c = 0; c < Cg; c++) {
                float w = pw ? pw[ch0 + c] : 1.0f, a = 0.0f, b = 0.0f;
                const float *xs = xr + c * S, *gs = gr + c * S;
#pragma omp simd reduction(+ : a, b)
                for (int64_t s = 0; s < S; s++) {
                    a += gs[s];
                    b += gs[s] * (xs[s] - mu);
                }
                A += (double)w * a;
                B += (double)w * b * is; /* sum h xhat */
            }
            /* gx = is h - is A/D - is xhat B/D = is w g + k1 (x - mu) + k0 */
            const float k1 = D ? (float)(-(double)is * is * B / (double)D) : 0.0f;
            const float k0 = D ? (float)(-(double)is * A / (double)D) : 0.0f;
            for (int64_t c = 0; c < Cg; c++) {
                float a = is * (pw ? pw[ch0 + c] : 1.0f);
                const float *xs = xr + c * S, *gs = gr + c * S;
                float *os = o + c * S;
                for (int64_t s = 0; s < S; s++) os[s] = a * gs[s] + k1 * (xs[s] - mu) + k0;
            }
        }
    }
    if (gw || gb) {
        float *pgw = gw ? ts__f32(gw) : NULL, *pgb = gb ? ts__f32(gb) : NULL;
        const int64_t P = G * Cg, rows = R / G;
#pragma omp parallel for if (R * D > PAR_MIN) schedule(static)
        for (int64_t ch = 0; ch < P; ch++) {
            const int64_t grp = ch / Cg, c = ch % Cg;
            double sg = 0, sgx = 0;
            for (int64_t n = 0; n < rows; n++) {
                const int64_t r = n * G + grp;
                const float *xs = px + r * D + c * S, *gs = pg + r * D + c * S;
                const float mu = pm[r];
                float a = 0.0f, b = 0.0f;
#pragma omp simd reduction(+ : a, b)
                for (int64_t s = 0; s < S; s++) {
                    a += gs[s];
                    b += gs[s] * (xs[s] - mu);
                }
                sg += a;
                sgx += (double)b * pis[r];
            }
            if (pgw) pgw[ch] = (float)sgx;
            if (pgb) pgb[ch] = (float)sg;
        }
    }
    return TS_OK;
}

const struct ts_kernels_norm ts_cpu_kernels_norm = {
    .group_norm = cpu_group_norm,
    .group_norm_backward = cpu_group_norm_backward,
};
