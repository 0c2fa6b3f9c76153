/*
 * ops/cpu/misc.c — CPU kernels of the misc family (see device/k_misc.h):
 * embedding gather/scatter-add, the block copy behind concat/slice, dropout
 * masks, softmax and log-softmax, and the fused cross-entropy and MSE losses.
 *
 * The softmax family (softmax, log_softmax, cross-entropy) shares one row
 * reduction (row_stats: the max m and s = sum exp(x - m) in double) and the
 * per-element formulas of device/k_elem.h, which the CUDA kernels use too.
 *
 * Plain loops that serve as the reference for other backends; OpenMP only
 * above PAR_MIN elements so the small training-loop shapes, e.g. a (64, 10)
 * cross-entropy, run on one thread without fork/join overhead. Index checks
 * run serially before any parallel region so the error names the first bad
 * index deterministically.
 */
#include "tensor/tensor.h"
#include "device/k_misc.h"
#include "ops/cpu/vmath.h"

#define TS_ELEM_EXPF ts__vexpf /* the vectorising exp of ops/cpu/vmath.h (before k_elem.h) */
#include "device/k_elem.h"

#include <math.h>
#include <omp.h>

#define PAR_MIN 32768 /* below this many elements, stay on one thread */

/* ---- embedding ------------------------------------------------------------------------------- */
/* out: (n, dim) = weight[idx[i]]; weight: (num, dim) */
static ts_status cpu_embedding(ts_tensor *out, const ts_tensor *idx, const ts_tensor *weight) {
    const int64_t *ix = (const int64_t *)ts__ptr(idx);
    const float *w = ts__f32(weight);
    float *o = ts__f32(out);
    int64_t n = ts_tensor_numel(idx), num = weight->shape[0], dim = weight->shape[1];
    for (int64_t i = 0; i < n; i++) {
        if (ix[i] < 0 || ix[i] >= num) {
            char b[64];
            return ts_error(TS_ERR_INVALID_ARG,
                            "embedding: index %lld (at flat position %lld of the indices) is out of range [0, %lld) "
                            "for weight %s",
                            (long long)ix[i], (long long)i, (long long)num, ts_shape_str(2, weight->shape, b, sizeof b));
        }
    }
#pragma omp parallel for if (n * dim > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) memcpy(o + i * dim, w + ix[i] * dim, (size_t)dim * sizeof(float));
    return TS_OK;
}

/* gw: (num, dim) = scatter-add of g: (n, dim) rows at idx */
static ts_status cpu_embedding_backward(ts_tensor *gw, const ts_tensor *idx, const ts_tensor *g) {
    const int64_t *ix = (const int64_t *)ts__ptr(idx);
    const float *pg = ts__f32(g);
    float *o = ts__f32(gw);
    int64_t n = ts_tensor_numel(idx), dim = gw->shape[1];
    memset(o, 0, ts_tensor_nbytes(gw));
    /* rows repeat, so split over columns rather than over indices */
    if (n * dim > PAR_MIN && dim >= 64) {
#pragma omp parallel for schedule(static)
        for (int64_t j0 = 0; j0 < dim; j0 += 16) {
            int64_t j1 = TS_MIN(j0 + 16, dim);
            for (int64_t i = 0; i < n; i++) {
                float *dst = o + ix[i] * dim;
                const float *src = pg + i * dim;
                for (int64_t j = j0; j < j1; j++) dst[j] += src[j];
            }
        }
        return TS_OK;
    }
    for (int64_t i = 0; i < n; i++) {
        float *dst = o + ix[i] * dim;
        const float *src = pg + i * dim;
        for (int64_t j = 0; j < dim; j++) dst[j] += src[j];
    }
    return TS_OK;
}

/* ---- block copy (concat, slice) ---------------------------------------------------------------- */
/* dst: (outer, dst_n, inner)[:, dst_start:+len, :] = src: (outer, src_n, inner)[:, src_start:+len, :] */
static ts_status cpu_narrow_copy(ts_tensor *dst, int64_t dst_n, int64_t dst_start, const ts_tensor *src, int64_t src_n,
                                 int64_t src_start, int64_t len, int64_t outer, int64_t inner) {
    size_t es = ts_dtype_size(dst->dtype);
    char *d = ts__ptr(dst);
    const char *s = ts__ptr(src);
    size_t block = (size_t)(len * inner) * es;
    if (block == 0) return TS_OK;
#pragma omp parallel for if (outer * len * inner > PAR_MIN) schedule(static)
    for (int64_t o = 0; o < outer; o++)
        memcpy(d + (size_t)((o * dst_n + dst_start) * inner) * es, s + (size_t)((o * src_n + src_start) * inner) * es,
               block);
    return TS_OK;
}

/* ---- dropout ------------------------------------------------------------------------------------- */
/* mask: any shape, U8: 1 with probability 1 - p (core/rng.c's draw, shared with the other backends). */
static ts_status cpu_dropout_mask(ts_tensor *mask, float p, ts_rng *rng) {
    ts__rng_keep_mask(rng, ts__ptr(mask), ts_tensor_numel(mask), p);
    return TS_OK;
}

/* out = x * mask * scale (mask NULL: all ones) */
static ts_status cpu_masked_scale(ts_tensor *out, const ts_tensor *x, const ts_tensor *mask, float scale) {
    float *o = ts__f32(out);
    const float *px = ts__f32(x);
    int64_t n = ts_tensor_numel(out);
    if (!mask) {
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) o[i] = px[i] * scale;
        return TS_OK;
    }
    const uint8_t *m = ts__ptr(mask);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) o[i] = m[i] ? px[i] * scale : 0.0f;
    return TS_OK;
}

/* ---- the softmax family's row reduction -------------------------------------------------------------- */
#define SUM_BLOCK 1024 /* contiguous rows: float SIMD partials over blocks this long, added in double */

/* One row of n at stride st: *m = its max, returns s = sum exp(x - m) in double; with e non-NULL,
 * e[c * st] = exp(x_c - m) too (softmax's numerators). Contiguous rows vectorise: each SIMD lane adds
 * at most SUM_BLOCK / (lanes) terms in float before the block's sum joins the double total. */
static double row_stats(const float *restrict x, int64_t n, int64_t st, float *restrict e, float *m_out) {
    float m = -INFINITY;
    double s = 0;
    if (st == 1) {
#pragma omp simd reduction(max : m)
        for (int64_t c = 0; c < n; c++) m = x[c] > m ? x[c] : m;
        for (int64_t c0 = 0; c0 < n; c0 += SUM_BLOCK) {
            const int64_t c1 = TS_MIN(c0 + SUM_BLOCK, n);
            float part = 0.0f;
            if (e) {
#pragma omp simd reduction(+ : part)
                for (int64_t c = c0; c < c1; c++) {
                    const float v = ts_elem_shift_exp(x[c], m);
                    e[c] = v;
                    part += v;
                }
            } else {
#pragma omp simd reduction(+ : part)
                for (int64_t c = c0; c < c1; c++) part += ts_elem_shift_exp(x[c], m);
            }
            s += part;
        }
    } else {
        for (int64_t c = 0; c < n; c++) m = fmaxf(m, x[c * st]);
        for (int64_t c = 0; c < n; c++) {
            const float v = ts_elem_shift_exp(x[c * st], m);
            if (e) e[c * st] = v;
            s += v;
        }
    }
    /* fmaxf skips NaN: a NaN logit still makes s, and so the row, NaN */
    *m_out = m;
    return s;
}

/* The first element of row r of (outer, n, inner) (rows are n elements at stride inner). */
static inline int64_t row_base(int64_t r, int64_t n, int64_t inner) {
    const int64_t a = r / inner;
    return a * n * inner + (r - a * inner);
}

/* out, x: (outer, n, inner); out = (x - m) - log s (device/k_elem.h) */
static ts_status cpu_log_softmax(ts_tensor *out, const ts_tensor *x, int64_t outer, int64_t n, int64_t inner) {
    float *o = ts__f32(out);
    const float *px = ts__f32(x);
    const int64_t rows = outer * inner;
#pragma omp parallel for if (rows * n > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t base = row_base(r, n, inner);
        float m;
        const float ls = (float)log(row_stats(px + base, n, inner, NULL, &m));
        for (int64_t c = 0; c < n; c++) o[base + c * inner] = ts_elem_log_softmax(px[base + c * inner], m, ls);
    }
    return TS_OK;
}

/* gx, gy, y: (outer, n, inner); gx = gy - exp(y) * sum_c gy (the sum in double) */
static ts_status cpu_log_softmax_backward(ts_tensor *gx, const ts_tensor *gy, const ts_tensor *y, int64_t outer,
                                          int64_t n, int64_t inner) {
    float *o = ts__f32(gx);
    const float *pg = ts__f32(gy), *py = ts__f32(y);
    const int64_t rows = outer * inner;
#pragma omp parallel for if (rows * n > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t base = row_base(r, n, inner);
        double sum = 0;
        for (int64_t c = 0; c < n; c++) sum += pg[base + c * inner];
        const float sf = (float)sum;
        for (int64_t c = 0; c < n; c++) {
            const int64_t k = base + c * inner;
            o[k] = pg[k] - expf(py[k]) * sf;
        }
    }
    return TS_OK;
}

/* out, x: (outer, n, inner); out = exp(x - m) / s */
static ts_status cpu_softmax(ts_tensor *out, const ts_tensor *x, int64_t outer, int64_t n, int64_t inner) {
    float *o = ts__f32(out);
    const float *px = ts__f32(x);
    const int64_t rows = outer * inner;
#pragma omp parallel for if (rows * n > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t base = row_base(r, n, inner);
        float m, *yr = o + base;
        const float inv = (float)(1.0 / row_stats(px + base, n, inner, yr, &m));
        if (inner == 1) {
#pragma omp simd
            for (int64_t c = 0; c < n; c++) yr[c] *= inv;
        } else {
            for (int64_t c = 0; c < n; c++) yr[c * inner] *= inv;
        }
    }
    return TS_OK;
}

/* gx, gy, y: (outer, n, inner); gx = y (gy - sum_c gy y), the dot product in double */
static ts_status cpu_softmax_backward(ts_tensor *gx, const ts_tensor *gy, const ts_tensor *y, int64_t outer,
                                      int64_t n, int64_t inner) {
    float *o = ts__f32(gx);
    const float *pg = ts__f32(gy), *py = ts__f32(y);
    const int64_t rows = outer * inner;
#pragma omp parallel for if (rows * n > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t base = row_base(r, n, inner);
        double dot = 0;
        if (inner == 1) {
            for (int64_t c0 = 0; c0 < n; c0 += SUM_BLOCK) { /* float SIMD partials per block, as row_stats */
                const int64_t c1 = TS_MIN(c0 + SUM_BLOCK, n);
                float part = 0.0f;
#pragma omp simd reduction(+ : part)
                for (int64_t c = c0; c < c1; c++) part += pg[base + c] * py[base + c];
                dot += part;
            }
        } else {
            for (int64_t c = 0; c < n; c++) dot += (double)pg[base + c * inner] * py[base + c * inner];
        }
        const float sf = (float)dot;
        for (int64_t c = 0; c < n; c++) {
            const int64_t k = base + c * inner;
            o[k] = py[k] * (pg[k] - sf);
        }
    }
    return TS_OK;
}

/* ---- cross-entropy (fused log-softmax + NLL + class weights + label smoothing) ----------------------- */
/* logits (N, C, S...) are rows i = n * S + s of C values at stride S, starting at
 * n * C * S + s; target and lse are (N * S) in the same order. S = 1 for (N, C). */

/* Checks every target; *wsum = the sum of the weights of the samples that are not ignored
 * (their count without weights): the mean's denominator. */
static ts_status check_targets(const int64_t *t, const float *w, int64_t N, int64_t C, int64_t S, int64_t ignore,
                               double *wsum) {
    double k = 0;
    for (int64_t i = 0; i < N * S; i++) {
        if (t[i] == ignore) continue;
        if (t[i] < 0 || t[i] >= C) {
            if (S == 1)
                return ts_error(TS_ERR_INVALID_ARG,
                                "cross_entropy: target %lld of sample %lld is out of range [0, %lld) for logits "
                                "[%lld, %lld] (ignore_index is %lld)",
                                (long long)t[i], (long long)i, (long long)C, (long long)N, (long long)C,
                                (long long)ignore);
            return ts_error(TS_ERR_INVALID_ARG,
                            "cross_entropy: target %lld of sample %lld at position %lld (flat over the spatial dims) "
                            "is out of range [0, %lld) (ignore_index is %lld)",
                            (long long)t[i], (long long)(i / S), (long long)(i % S), (long long)C, (long long)ignore);
        }
        k += w ? (double)w[t[i]] : 1.0;
    }
    *wsum = k;
    return TS_OK;
}

/* logits: (N, C, S...), target: (N * S), weight: (C) or NULL -> loss: [] or (N * S) (NONE),
 * lse: (N * S, 2) = each row's max m and log s (row_stats) */
static ts_status cpu_cross_entropy(ts_tensor *loss, ts_tensor *lse, const ts_tensor *logits, const ts_tensor *target,
                                   const ts_tensor *weight, float eps, int64_t ignore_index, ts_reduction reduction) {
    const int64_t N = logits->shape[0], C = logits->shape[1], NC = N * C;
    const int64_t S = NC ? ts_tensor_numel(logits) / NC : 1, rows = N * S;
    const float *x = ts__f32(logits), *w = weight ? ts__f32(weight) : NULL;
    const int64_t *t = (const int64_t *)ts__ptr(target);
    float *pl = ts__f32(lse), *per = reduction == TS_REDUCTION_NONE ? ts__f32(loss) : NULL;
    double wsum = 0;
    TS_TRY(check_targets(t, w, N, C, S, ignore_index, &wsum));
    double total = 0;
#pragma omp parallel for if (rows * C > PAR_MIN) reduction(+ : total) schedule(static)
    for (int64_t i = 0; i < rows; i++) {
        const float *row = x + (i / S) * C * S + i % S;
        float m;
        const double ls = log(row_stats(row, C, S, NULL, &m));
        pl[2 * i] = m;
        pl[2 * i + 1] = (float)ls;
        if (t[i] == ignore_index) {
            if (per) per[i] = 0.0f;
            continue;
        }
        double li = (1.0 - (double)eps) * (w ? (double)w[t[i]] : 1.0) * ts_elem_lse_minus(row[t[i] * S], m, ls);
        if (eps != 0.0f) {
            double sm = 0; /* sum_c w[c] (lse - x[c]) */
            for (int64_t c = 0; c < C; c++) sm += (w ? (double)w[c] : 1.0) * ts_elem_lse_minus(row[c * S], m, ls);
            li += (double)eps * sm / (double)C;
        }
        if (per) per[i] = (float)li;
        total += li;
    }
    if (!per) /* MEAN over no counted sample gives NaN (0/0), as PyTorch */
        ts__f32(loss)[0] = (float)(reduction == TS_REDUCTION_SUM ? total : total / wsum);
    return TS_OK;
}

/* gx: (N, C, S...) = s_i ((1 - eps) w[t] (softmax - onehot) + eps / C (sum(w) softmax - w)) */
static ts_status cpu_cross_entropy_backward(ts_tensor *gx, const ts_tensor *gloss, const ts_tensor *logits,
                                            const ts_tensor *lse, const ts_tensor *target, const ts_tensor *weight,
                                            float eps, int64_t ignore_index, ts_reduction reduction) {
    const int64_t N = logits->shape[0], C = logits->shape[1], NC = N * C;
    const int64_t S = NC ? ts_tensor_numel(logits) / NC : 1, rows = N * S;
    const float *x = ts__f32(logits), *pl = ts__f32(lse), *w = weight ? ts__f32(weight) : NULL;
    const float *pg = ts__f32(gloss);
    const int64_t *t = (const int64_t *)ts__ptr(target);
    float *o = ts__f32(gx);
    double wsum = 0, wall = 0;
    for (int64_t i = 0; i < rows; i++)
        if (t[i] != ignore_index) wsum += w ? (double)w[t[i]] : 1.0;
    if (w)
        for (int64_t c = 0; c < C; c++) wall += w[c];
    const float scale = reduction == TS_REDUCTION_MEAN ? (float)((double)pg[0] / wsum) : pg[0];
    const float hit = 1.0f - eps, spread = eps / (float)C;
#pragma omp parallel for if (rows * C > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < rows; i++) {
        const int64_t base = (i / S) * C * S + i % S;
        const float *row = x + base;
        float *orow = o + base;
        if (t[i] == ignore_index) {
            for (int64_t c = 0; c < C; c++) orow[c * S] = 0.0f;
            continue;
        }
        const float si = reduction == TS_REDUCTION_NONE ? pg[i] : scale;
        const float m = pl[2 * i], ls = pl[2 * i + 1]; /* softmax = exp(log_softmax) */
        if (!w) {
            for (int64_t c = 0; c < C; c++)
                orow[c * S] = si * (expf(ts_elem_log_softmax(row[c * S], m, ls)) - spread);
            orow[t[i] * S] -= si * hit;
            continue;
        }
        const float wt = w[t[i]], a = hit * wt + spread * (float)wall; /* coefficient of softmax */
        for (int64_t c = 0; c < C; c++)
            orow[c * S] = si * (a * expf(ts_elem_log_softmax(row[c * S], m, ls)) - spread * w[c]);
        orow[t[i] * S] -= si * hit * wt;
    }
    return TS_OK;
}

/* ---- mean squared error ---------------------------------------------------------------------------------- */
/* pred, target: same shape -> loss: [] */
static ts_status cpu_mse(ts_tensor *loss, const ts_tensor *pred, const ts_tensor *target) {
    const float *p = ts__f32(pred), *q = ts__f32(target);
    int64_t n = ts_tensor_numel(pred);
    double acc = 0;
#pragma omp parallel for if (n > PAR_MIN) reduction(+ : acc) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        double d = (double)p[i] - q[i];
        acc += d * d;
    }
    ts__f32(loss)[0] = (float)(acc / (double)n); /* n == 0: NaN, as PyTorch */
    return TS_OK;
}

static ts_status cpu_mse_backward(ts_tensor *gpred, ts_tensor *gtarget, const ts_tensor *gloss, const ts_tensor *pred,
                                  const ts_tensor *target) {
    const float *p = ts__f32(pred), *q = ts__f32(target);
    int64_t n = ts_tensor_numel(pred);
    float s = 2.0f * ts__f32(gloss)[0] / (float)n;
    float *gp = gpred ? ts__f32(gpred) : NULL, *gt = gtarget ? ts__f32(gtarget) : NULL;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float v = s * (p[i] - q[i]);
        if (gp) gp[i] = v;
        if (gt) gt[i] = -v;
    }
    return TS_OK;
}

const struct ts_kernels_misc ts_cpu_kernels_misc = {
    .embedding = cpu_embedding,
    .embedding_backward = cpu_embedding_backward,
    .narrow_copy = cpu_narrow_copy,
    .dropout_mask = cpu_dropout_mask,
    .masked_scale = cpu_masked_scale,
    .log_softmax = cpu_log_softmax,
    .log_softmax_backward = cpu_log_softmax_backward,
    .cross_entropy = cpu_cross_entropy,
    .cross_entropy_backward = cpu_cross_entropy_backward,
    .mse = cpu_mse,
    .mse_backward = cpu_mse_backward,
    .softmax = cpu_softmax,
    .softmax_backward = cpu_softmax_backward,
};
