/*
 * ops/cpu/misc.c — CPU kernels of the misc family (see device/k_misc.h):
 * embedding gather/scatter-add, the block copy behind concat/slice, dropout
 * masks, log-softmax, and the fused cross-entropy and MSE losses.
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

/* ---- log-softmax ------------------------------------------------------------------------------------ */
/* One row of n elements at stride s: y = x - (max + log sum exp(x - max)). */
static void log_softmax_row(float *y, const float *x, int64_t n, int64_t s) {
    float m = -INFINITY;
    for (int64_t c = 0; c < n; c++) m = fmaxf(m, x[c * s]);
    double sum = 0;
    for (int64_t c = 0; c < n; c++) sum += expf(x[c * s] - m);
    float lse = m + (float)log(sum);
    for (int64_t c = 0; c < n; c++) y[c * s] = x[c * s] - lse;
}

/* out, x: (outer, n, inner) */
static ts_status cpu_log_softmax(ts_tensor *out, const ts_tensor *x, int64_t outer, int64_t n, int64_t inner) {
    float *o = ts__f32(out);
    const float *px = ts__f32(x);
    int64_t rows = outer * inner;
#pragma omp parallel for if (rows * n > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t a = r / inner, b = r - a * inner;
        int64_t base = a * n * inner + b;
        log_softmax_row(o + base, px + base, n, inner);
    }
    return TS_OK;
}

/* gx, gy, y: (outer, n, inner); gx = gy - exp(y) * sum_c gy */
static ts_status cpu_log_softmax_backward(ts_tensor *gx, const ts_tensor *gy, const ts_tensor *y, int64_t outer,
                                          int64_t n, int64_t inner) {
    float *o = ts__f32(gx);
    const float *pg = ts__f32(gy), *py = ts__f32(y);
    int64_t rows = outer * inner;
#pragma omp parallel for if (rows * n > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t a = r / inner, b = r - a * inner;
        int64_t base = a * n * inner + b;
        double sum = 0;
        for (int64_t c = 0; c < n; c++) sum += pg[base + c * inner];
        float s = (float)sum;
        for (int64_t c = 0; c < n; c++) {
            int64_t k = base + c * inner;
            o[k] = pg[k] - expf(py[k]) * s;
        }
    }
    return TS_OK;
}

/* y = softmax of one contiguous row of n: vector max, exp and sum (float
 * partial sums in SIMD lanes, each adding n/16 terms or fewer) */
static void softmax_row(float *restrict y, const float *restrict x, int64_t n) {
    float m = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : m)
    for (int64_t c = 0; c < n; c++) m = x[c] > m ? x[c] : m;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < n; c++) {
        float e = ts__vexpf(x[c] - m);
        y[c] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t c = 0; c < n; c++) y[c] *= inv;
}

/* out, x: (outer, n, inner); softmax over the middle dim, max-shifted */
static ts_status cpu_softmax(ts_tensor *out, const ts_tensor *x, int64_t outer, int64_t n, int64_t inner) {
    float *o = ts__f32(out);
    const float *px = ts__f32(x);
    if (inner == 1) {
#pragma omp parallel for if (outer * n > PAR_MIN) schedule(static)
        for (int64_t r = 0; r < outer; r++) softmax_row(o + r * n, px + r * n, n);
        return TS_OK;
    }
    int64_t rows = outer * inner;
#pragma omp parallel for if (rows * n > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t a = r / inner, b = r - a * inner;
        int64_t base = a * n * inner + b;
        const float *xr = px + base;
        float *yr = o + base;
        float m = -INFINITY;
        for (int64_t c = 0; c < n; c++) m = fmaxf(m, xr[c * inner]);
        double sum = 0;
        for (int64_t c = 0; c < n; c++) {
            float e = ts__vexpf(xr[c * inner] - m);
            yr[c * inner] = e;
            sum += e;
        }
        float inv = (float)(1.0 / sum);
        for (int64_t c = 0; c < n; c++) yr[c * inner] *= inv;
    }
    return TS_OK;
}

/* gx, gy, y: (outer, n, inner); gx = y (gy - sum_c gy y) */
static ts_status cpu_softmax_backward(ts_tensor *gx, const ts_tensor *gy, const ts_tensor *y, int64_t outer,
                                      int64_t n, int64_t inner) {
    float *o = ts__f32(gx);
    const float *pg = ts__f32(gy), *py = ts__f32(y);
    if (inner == 1) { /* contiguous rows: vector dot product and update */
#pragma omp parallel for if (outer * n > PAR_MIN) schedule(static)
        for (int64_t r = 0; r < outer; r++) {
            const float *g = pg + r * n, *yr = py + r * n;
            float *gr = o + r * n, dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t c = 0; c < n; c++) dot += g[c] * yr[c];
#pragma omp simd
            for (int64_t c = 0; c < n; c++) gr[c] = yr[c] * (g[c] - dot);
        }
        return TS_OK;
    }
    int64_t rows = outer * inner;
#pragma omp parallel for if (rows * n > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t a = r / inner, b = r - a * inner;
        int64_t base = a * n * inner + b;
        double dot = 0;
        for (int64_t c = 0; c < n; c++) dot += (double)pg[base + c * inner] * py[base + c * inner];
        float s = (float)dot;
        for (int64_t c = 0; c < n; c++) {
            int64_t k = base + c * inner;
            o[k] = py[k] * (pg[k] - s);
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

/* logits: (N, C, S...), target: (N * S), weight: (C) or NULL -> loss: [] or (N * S) (NONE), lse: (N * S) */
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
        float m = -INFINITY;
        for (int64_t c = 0; c < C; c++) m = fmaxf(m, row[c * S]);
        float s = 0;
        for (int64_t c = 0; c < C; c++) s += expf(row[c * S] - m);
        float l = m + logf(s);
        pl[i] = l;
        if (t[i] == ignore_index) {
            if (per) per[i] = 0.0f;
            continue;
        }
        double li = (1.0 - (double)eps) * (w ? (double)w[t[i]] : 1.0) * ((double)l - row[t[i] * S]);
        if (eps != 0.0f) {
            double sm = 0; /* sum_c w[c] (lse - x[c]) */
            if (w)
                for (int64_t c = 0; c < C; c++) sm += (double)w[c] * ((double)l - row[c * S]);
            else {
                double xs = 0;
                for (int64_t c = 0; c < C; c++) xs += row[c * S];
                sm = (double)C * l - xs;
            }
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
        const float l = pl[i];
        if (!w) {
            for (int64_t c = 0; c < C; c++) orow[c * S] = si * (expf(row[c * S] - l) - spread);
            orow[t[i] * S] -= si * hit;
            continue;
        }
        const float wt = w[t[i]], a = hit * wt + spread * (float)wall; /* coefficient of softmax */
        for (int64_t c = 0; c < C; c++) orow[c * S] = si * (a * expf(row[c * S] - l) - spread * w[c]);
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
