/*
 * ops/cpu/norm.c — CPU kernels of the norm family (see device/k_norm.h):
 * per-row normalisation with a per-channel affine (group_norm; layer_norm is
 * its G = 1, S = 1 case), forward and backward.
 *
 * Rows run in parallel (OpenMP above PAR_MIN elements); row statistics are
 * float SIMD partial sums totalled in double, the variance a second pass about
 * the mean. Backward is one pass over the rows too; the weight and bias
 * gradients (sums over every row of a channel's group) go to per-thread double
 * accumulators, summed in thread order afterwards.
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
        if (S == 1) { /* layer norm: one element per channel */
#pragma omp simd
            for (int64_t c = 0; c < Cg; c++)
                orow[c] = (xr[c] - mf) * is * (pw ? pw[ch0 + c] : 1.0f) + (pb ? pb[ch0 + c] : 0.0f);
            continue;
        }
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

/* One pass over the rows (in parallel), per row: the channel sums a = sum g and
 * b = sum g (x - mean) -> A = sum h = sum w a, B = sum h xhat = invstd sum w b, and
 *   gx = invstd (h - A/D - xhat B/D) = invstd w g + k1 (x - mean) + k0;
 * gw[ch] = sum invstd b and gb[ch] = sum a over the rows of ch's group, accumulated in
 * per-thread double buffers summed afterwards in thread order (no strided column walks,
 * which made LayerNorm's weight gradient 6x slower). */
static ts_status cpu_group_norm_backward(const ts_norm_geom *g, const ts_tensor *gout, const ts_tensor *x,
                                         const ts_tensor *mean, const ts_tensor *invstd, const ts_tensor *weight,
                                         ts_tensor *gx, ts_tensor *gw, ts_tensor *gb) {
    const int64_t R = g->R, G = g->G, Cg = g->Cg, S = g->S, D = Cg * S, P = G * Cg;
    const float *px = ts__f32(x), *pg = ts__f32(gout), *pm = ts__f32(mean), *pis = ts__f32(invstd);
    const float *pw = weight ? ts__f32(weight) : NULL;
    float *pgx = gx ? ts__f32(gx) : NULL;
    const bool par = R * D > PAR_MIN, sums = gw || gb;
    const int nbuf = par ? omp_get_max_threads() : 1;
    ts_tensor *buf = NULL; /* nbuf x (P sums of invstd b, P sums of a), doubles */
    if (sums) TS_TRY(ts__scratch_f32(x->storage->device, nbuf * 4 * P, &buf));
#pragma omp parallel if (par) num_threads(nbuf)
    {
        double *sw = sums ? (double *)ts__ptr(buf) + (int64_t)omp_get_thread_num() * 2 * P : NULL;
        double *sb = sums ? sw + P : NULL;
        if (sums) memset(sw, 0, sizeof(double) * (size_t)(2 * P));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < R; r++) {
            const float *xr = px + r * D, *gr = pg + r * D;
            const int64_t ch0 = (r % G) * Cg;
            const float mu = pm[r], is = pis[r];
            double A = 0, B = 0;
            if (S == 1) { /* layer norm: one element per channel */
                float fa = 0.0f, fb = 0.0f;
                if (sums) {
                    double *swr = sw + ch0, *sbr = sb + ch0;
#pragma omp simd reduction(+ : fa, fb)
                    for (int64_t c = 0; c < Cg; c++) {
                        const float w = pw ? pw[ch0 + c] : 1.0f, gd = gr[c] * (xr[c] - mu);
                        fa += w * gr[c];
                        fb += w * gd;
                        swr[c] += (double)(gd * is);
                        sbr[c] += (double)gr[c];
                    }
                } else {
#pragma omp simd reduction(+ : fa, fb)
                    for (int64_t c = 0; c < Cg; c++) {
                        const float w = pw ? pw[ch0 + c] : 1.0f;
                        fa += w * gr[c];
                        fb += w * gr[c] * (xr[c] - mu);
                    }
                }
                A = fa;
                B = (double)fb * is;
            } else {
                for (int64_t c = 0; c < Cg; c++) {
                    const float w = pw ? pw[ch0 + c] : 1.0f;
                    const float *xs = xr + c * S, *gs = gr + c * S;
                    float a = 0.0f, b = 0.0f;
#pragma omp simd reduction(+ : a, b)
                    for (int64_t k = 0; k < S; k++) {
                        a += gs[k];
                        b += gs[k] * (xs[k] - mu);
                    }
                    A += (double)w * a;
                    B += (double)w * b * is;
                    if (sums) {
                        sw[ch0 + c] += (double)b * is;
                        sb[ch0 + c] += a;
                    }
                }
            }
            if (!pgx) continue;
            const float k1 = D ? (float)(-(double)is * is * B / (double)D) : 0.0f;
            const float k0 = D ? (float)(-(double)is * A / (double)D) : 0.0f;
            float *o = pgx + r * D;
            for (int64_t c = 0; c < Cg; c++) {
                const float a = is * (pw ? pw[ch0 + c] : 1.0f);
                const float *xs = xr + c * S, *gs = gr + c * S;
                float *os = o + c * S;
                for (int64_t k = 0; k < S; k++) os[k] = a * gs[k] + k1 * (xs[k] - mu) + k0;
            }
        }
    }
    if (sums) {
        const double *base = (const double *)ts__ptr(buf);
        float *pgw = gw ? ts__f32(gw) : NULL, *pgb = gb ? ts__f32(gb) : NULL;
        for (int64_t ch = 0; ch < P; ch++) {
            double w = 0, b = 0;
            for (int t = 0; t < nbuf; t++) {
                w += base[(int64_t)t * 2 * P + ch];
                b += base[(int64_t)t * 2 * P + P + ch];
            }
            if (pgw) pgw[ch] = (float)w;
            if (pgb) pgb[ch] = (float)b;
        }
        ts_tensor_release(buf);
    }
    return TS_OK;
}

const struct ts_kernels_norm ts_cpu_kernels_norm = {
    .group_norm = cpu_group_norm,
    .group_norm_backward = cpu_group_norm_backward,
};
