/*
 * ops/cpu/misc.c — CPU kernels of the misc family (see device/k_misc.h):
 * embedding gather/scatter-add, the block copy behind concat/slice, dropout
 * masks, softmax and log-softmax, and the fused cross-entropy and MSE losses.
 *
 * The softmax family (softmax, log_softmax, cross-entropy) shares one row
 * reduction (row_stats: the max m and s = sum exp(x - m) in double, the same
 * bits for a row at any stride) and the per-element formulas of
 * device/k_elem.h, which the CUDA kernels use too.
 *
 * Plain loops that serve as the reference for other backends; OpenMP only
 * above PAR_MIN elements so the small training-loop shapes, e.g. a (64, 10)
 * cross-entropy, run on one thread without fork/join overhead. Index checks
 * run serially before any parallel region so the error names the first bad
 * index deterministically.
 */
#include "tensor/tensor.h"
#include "device/k_misc.h"
#include "ops/cpu/attention.h"
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
/* Sums over a row go into ROW_ACC double accumulators, element c into accumulator c % ROW_ACC, added in a
 * fixed order at the end: the same bits for a row whatever its stride (a (N, C, H, W) cross-entropy equals
 * the (N*H*W, C) one exactly), float64 accuracy, and a contiguous row's blocks of ROW_ACC vectorise. */
#define ROW_ACC 8

static inline double acc_total(const double *acc) {
    double s = 0;
    for (int k = 0; k < ROW_ACC; k++) s += acc[k];
    return s;
}

#define EXP_CHUNK 256 /* exponentials computed a chunk at a time (a multiple of ROW_ACC) */

/* acc[k % ROW_ACC] += v[k] for k < len (len from a chunk that starts at a multiple of ROW_ACC). */
static inline void accumulate(double *acc, const float *v, int len) {
    int k = 0;
    for (; k + ROW_ACC <= len; k += ROW_ACC)
        for (int j = 0; j < ROW_ACC; j++) acc[j] += v[k + j];
    for (int j = 0; k + j < len; j++) acc[j] += v[k + j];
}

/* s = sum exp(x_c - m) over a row of n at stride st; with e non-NULL, e[c * st] = exp(x_c - m) too.
 * The exponentials go through a chunk buffer (a vectorised loop for contiguous rows, cloned per CPU width),
 * the sums into the accumulators. */
TS_CLONES static double sum_exp(const float *restrict x, int64_t n, int64_t st, float m, float *restrict e) {
    double acc[ROW_ACC] = {0};
    float buf[EXP_CHUNK];
    for (int64_t c0 = 0; c0 < n; c0 += EXP_CHUNK) {
        const int len = (int)TS_MIN((int64_t)EXP_CHUNK, n - c0);
        const float *xs = x + c0 * st;
        if (st == 1) {
#pragma omp simd
            for (int k = 0; k < len; k++) buf[k] = ts_elem_shift_exp(xs[k], m);
            if (e) memcpy(e + c0, buf, sizeof(float) * (size_t)len);
        } else {
            for (int k = 0; k < len; k++) buf[k] = ts_elem_shift_exp(xs[k * st], m);
            for (int k = 0; e && k < len; k++) e[(c0 + k) * st] = buf[k];
        }
        accumulate(acc, buf, len);
    }
    return acc_total(acc);
}

/* One row of n at stride st: *m_out = its max, returns s = sum exp(x - m) (sum_exp); with e non-NULL,
 * e[c * st] = exp(x_c - m) too (softmax's numerators). fmaxf skips NaN, but a NaN logit still makes s,
 * and so the row, NaN. */
static double row_stats(const float *restrict x, int64_t n, int64_t st, float *restrict e, float *m_out) {
    float m = -INFINITY;
    if (st == 1) {
#pragma omp simd reduction(max : m)
        for (int64_t c = 0; c < n; c++) m = x[c] > m ? x[c] : m;
    } else {
        for (int64_t c = 0; c < n; c++) m = fmaxf(m, x[c * st]);
    }
    *m_out = m;
    return sum_exp(x, n, st, m, e);
}

/* sum_c a_c b_c over rows of n at stride st, in the accumulators of sum_exp. */
static inline double row_dot(const float *restrict a, const float *restrict b, int64_t n, int64_t st) {
    double acc[ROW_ACC] = {0};
    int64_t c0 = 0;
    for (; c0 + ROW_ACC <= n; c0 += ROW_ACC)
        for (int k = 0; k < ROW_ACC; k++) acc[k] += (double)a[(c0 + k) * st] * b[(c0 + k) * st];
    for (int k = 0; c0 + k < n; k++) acc[k] += (double)a[(c0 + k) * st] * b[(c0 + k) * st];
    return acc_total(acc);
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
        const double dot = inner == 1 ? row_dot(pg + base, py + base, n, 1) : row_dot(pg + base, py + base, n, inner);
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

/* o[c] = si (softmax_c - spread) over a contiguous row without class weights (the one-hot term is the
 * caller's), cloned per CPU width so the exponentials vectorise. */
TS_CLONES static void ce_grad_row(float *restrict o, const float *restrict x, int64_t n, float si, float m, float ls,
                                  float spread) {
    for (int64_t c = 0; c < n; c++) o[c] = si * (ts__vexpf(ts_elem_log_softmax(x[c], m, ls)) - spread);
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
        if (!w && S == 1) {
            ce_grad_row(orow, row, C, si, m, ls, spread);
            orow[t[i]] -= si * hit;
            continue;
        }
        if (!w) {
            for (int64_t c = 0; c < C; c++)
                orow[c * S] = si * (ts__vexpf(ts_elem_log_softmax(row[c * S], m, ls)) - spread);
            orow[t[i] * S] -= si * hit;
            continue;
        }
        const float wt = w[t[i]], a = hit * wt + spread * (float)wall; /* coefficient of softmax */
        for (int64_t c = 0; c < C; c++)
            orow[c * S] = si * (a * ts__vexpf(ts_elem_log_softmax(row[c * S], m, ls)) - spread * w[c]);
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
    .attention_forward = ts__cpu_attention_forward, /* ops/cpu/attention.c */
    .attention_backward = ts__cpu_attention_backward,
};
