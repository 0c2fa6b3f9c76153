/*
 * ops/cpu/norm.c — CPU kernels of the norm family (see device/k_norm.h):
 * per-row normalisation with a per-channel affine (group_norm; layer_norm is
 * its G = 1, S = 1 case), forward and backward.
 *
 * Rows run in parallel (OpenMP above PAR_MIN elements). Row statistics take two
 * passes (plane.c's sums: float lanes of at most 256 elements, totalled in
 * double, so the error stays flat as rows grow to 2^17 and beyond): the sum
 * gives a float mean m0, then the sums s1 of (x - m0) and s2 of (x - m0)^2 give
 * the mean m0 + s1/D and the variance (s2 - s1^2/D)/D, which does not cancel
 * when |mean| >> std. The mean is kept as a float plus its residual (mres: the
 * double mean minus the float), and the output is ((x - mean) - mres) invstd w
 * + b, centred (never x a + (b - mean a)); backward centres on the same two
 * floats. Backward is one pass over the rows too; the weight and
 * bias gradients (sums over every row of a channel's group) go to per-thread
 * double accumulators, summed in thread order afterwards.
 */
#include "tensor/tensor.h"
#include "device/k_norm.h"
#include "ops/cpu/plane.h"

#include <math.h>
#include <omp.h>

#define PAR_MIN 32768 /* below this many elements, stay on one thread */
#define CHUNK 256     /* elements a float SIMD partial sum covers before it goes to double */

/* A row's mean and 1 / sqrt(biased variance + eps), in double from the float32 row x[0..D) (D > 0). */
static void row_stats(const float *x, int64_t D, float eps, double *mean, float *invstd) {
    const float m0 = (float)(ts__cpu_plane_sum(x, D, false) / (double)D);
    double s1 = 0.0, s2 = 0.0;
    ts__cpu_plane_shifted_sums(x, D, m0, false, &s1, &s2);
    double var = (s2 - s1 * s1 / (double)D) / (double)D;
    if (var < 0) var = 0; /* rounding below zero; NaN stays */
    *mean = (double)m0 + s1 / (double)D;
    *invstd = (float)(1.0 / sqrt(var + (double)eps));
}

// out, x: (R, Cg*S); mean, mres (or NULL), invstd: (R); weight, bias: (G*Cg) or NULL
static ts_status cpu_group_norm(const ts_norm_geom *g, ts_tensor *out, ts_tensor *mean, ts_tensor *mres,
                                ts_tensor *invstd, const ts_tensor *x, const ts_tensor *weight, const ts_tensor *bias,
                                float eps) {
    const int64_t R = g->R, G = g->G, Cg = g->Cg, S = g->S, D = Cg * S;
    const float *px = ts__f32(x), *pw = weight ? ts__f32(weight) : NULL, *pb = bias ? ts__f32(bias) : NULL;
    float *po = ts__f32(out), *pm = ts__f32(mean), *pis = ts__f32(invstd), *pr = mres ? ts__f32(mres) : NULL;
#pragma omp parallel for if (R * D > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < R; r++) {
        const float *xr = px + r * D;
        float *orow = po + r * D;
        double mu = 0.0;
        float is = (float)(1.0 / sqrt((double)eps));
        if (D) row_stats(xr, D, eps, &mu, &is);
        const float mf = (float)mu, lo = (float)(mu - mf);
        pm[r] = mf;
        if (pr) pr[r] = lo;
        pis[r] = is;
        const int64_t ch0 = (r % G) * Cg;
        if (S == 1) { /* layer norm: one element per channel */
#pragma omp simd
            for (int64_t c = 0; c < Cg; c++)
                orow[c] = ((xr[c] - mf) - lo) * is * (pw ? pw[ch0 + c] : 1.0f) + (pb ? pb[ch0 + c] : 0.0f);
            continue;
        }
        for (int64_t c = 0; c < Cg; c++) { /* (x - mf) a + (b - lo a) */
            const float a = is * (pw ? pw[ch0 + c] : 1.0f);
            ts__cpu_plane_affine(orow + c * S, xr + c * S, S, mf, a,
                                 (float)((pb ? (double)pb[ch0 + c] : 0.0) - (double)lo * a), false);
        }
    }
    return TS_OK;
}

/* One pass over the rows (in parallel), per row, with mean = mf + lo (the float mean and its residual):
 * the channel sums a = sum g and b = sum g (x - mean) -> A = sum h = sum w a, B = sum h xhat =
 * invstd sum w b, and
 *   gx = invstd (h - A/D - xhat B/D) = invstd w g + k1 (x - mf) + (k0 - k1 lo);
 * gw[ch] = sum invstd b and gb[ch] = sum a over the rows of ch's group, accumulated in
 * per-thread double buffers summed afterwards in thread order (no strided column walks,
 * which made LayerNorm's weight gradient 6x slower). */
static ts_status cpu_group_norm_backward(const ts_norm_geom *g, const ts_tensor *gout, const ts_tensor *x,
                                         const ts_tensor *mean, const ts_tensor *mres, const ts_tensor *invstd,
                                         const ts_tensor *weight, ts_tensor *gx, ts_tensor *gw, ts_tensor *gb) {
    const int64_t R = g->R, G = g->G, Cg = g->Cg, S = g->S, D = Cg * S, P = G * Cg;
    const float *px = ts__f32(x), *pg = ts__f32(gout), *pm = ts__f32(mean), *pis = ts__f32(invstd);
    const float *pr = mres ? ts__f32(mres) : NULL;
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
            const float mu = pm[r], lo = pr ? pr[r] : 0.0f, is = pis[r];
            double A = 0, B = 0;
            if (S == 1) { /* layer norm: one element per channel; float partial sums CHUNK elements long */
                double *swr = sums ? sw + ch0 : NULL, *sbr = sums ? sb + ch0 : NULL;
                for (int64_t c0 = 0; c0 < Cg; c0 += CHUNK) {
                    const int64_t c1 = Cg - c0 > CHUNK ? c0 + CHUNK : Cg;
                    float fa = 0.0f, fb = 0.0f;
                    if (sums) {
#pragma omp simd reduction(+ : fa, fb)
                        for (int64_t c = c0; c < c1; c++) {
                            const float w = pw ? pw[ch0 + c] : 1.0f, gd = gr[c] * ((xr[c] - mu) - lo);
                            fa += w * gr[c];
                            fb += w * gd;
                            swr[c] += (double)(gd * is);
                            sbr[c] += (double)gr[c];
                        }
                    } else {
#pragma omp simd reduction(+ : fa, fb)
                        for (int64_t c = c0; c < c1; c++) {
                            const float w = pw ? pw[ch0 + c] : 1.0f;
                            fa += w * gr[c];
                            fb += w * gr[c] * ((xr[c] - mu) - lo);
                        }
                    }
                    A += fa;
                    B += fb;
                }
                B *= is;
            } else {
                for (int64_t c = 0; c < Cg; c++) {
                    const double w = pw ? pw[ch0 + c] : 1.0;
                    double a = 0.0, b = 0.0; /* sum g, sum g (x - mean) over the channel's S elements */
                    ts__cpu_plane_dot_dev(gr + c * S, xr + c * S, S, mu, false, &a, &b);
                    b -= (double)lo * a; /* about mf + lo */
                    A += w * a;
                    B += w * b * is;
                    if (sums) {
                        sw[ch0 + c] += b * is;
                        sb[ch0 + c] += a;
                    }
                }
            }
            if (!pgx) continue;
            const float k1 = D ? (float)(-(double)is * is * B / (double)D) : 0.0f;
            const float k0 = D ? (float)(-(double)is * A / (double)D - (double)k1 * lo) : 0.0f;
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
