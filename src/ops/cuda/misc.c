/*
 * ops/cuda/misc.c — the misc family on CUDA devices (see device/k_misc.h): checks, sizes and
 * pointers here, kernels in ops/cuda/misc.cu.
 *
 * embedding and cross_entropy validate their indices on the device without waiting for it: the
 * kernels keep the first bad index in the device's check record and a copy of it goes to pinned host
 * memory (device/cuda.h: ts__cuda_check_begin / _end); the host reports it with the CPU's message
 * (device/cuda.c) at the device's next synchronisation or the next checking op, as PyTorch
 * reports device-side asserts. Meanwhile the op's result is NaN where an index was bad (an embedding
 * row, a per-sample loss, or the reduced loss), so a value read while the error goes unnoticed shows
 * it. dropout_mask draws the mask on the host with the CPU's exact ts_rng calls and copies it over
 * (waiting: the host buffer is pageable), so a seed gives the same mask on every backend.
 */
#include "ops/cuda/common.h"
#include "device/k_misc.h"
#include "ops/cuda/misc_cu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- embedding ----------------------------------------------------------------------------------- */
/* out: (n, dim) = weight[idx[i]]; weight: (num, dim). A bad index is reported later (see above). */
static ts_status cu_embedding(ts_tensor *out, const ts_tensor *idx, const ts_tensor *weight) {
    ts_device *dev = ts__dev(out);
    TS_CU_BEGIN(dev, s);
    const int64_t n = ts_tensor_numel(idx), num = weight->shape[0], dim = weight->shape[1];
    void *rec = NULL;
    TS_TRY(ts__cuda_check_begin(dev, s, &rec)); /* an earlier op's bad index, if the stream is past it */
    ts_status st = ts__cuda_status(
        dev, ts_cu_embedding(ts__f32(out), (const int64_t *)ts__ptr(idx), ts__f32(weight), n, num, dim, rec, s),
        "misc.embedding");
    return ts__cuda_check_end(dev, s, st);
}

/* gw: (num, dim) = scatter-add of g: (n, dim) rows at idx */
static ts_status cu_embedding_backward(ts_tensor *gw, const ts_tensor *idx, const ts_tensor *g) {
    ts_device *dev = ts__dev(gw);
    TS_CU_BEGIN(dev, s);
    const int64_t n = ts_tensor_numel(idx), num = gw->shape[0], dim = gw->shape[1];
    TS_CU_LAUNCH(dev, "misc.embedding_backward",
                 ts_cu_embedding_backward(ts__f32(gw), (const int64_t *)ts__ptr(idx), ts__f32(g), n, num, dim, s));
    return TS_OK;
}

/* ---- block copy (concat, slice) ---------------------------------------------------------------- */
static ts_status cu_narrow_copy(ts_tensor *dst, int64_t dst_n, int64_t dst_start, const ts_tensor *src, int64_t src_n,
                                int64_t src_start, int64_t len, int64_t outer, int64_t inner) {
    ts_device *dev = ts__dev(dst);
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "misc.narrow_copy",
                 ts_cu_narrow_copy(ts__ptr(dst), dst_n, dst_start, ts__ptr(src), src_n, src_start, len, outer, inner,
                                   ts_dtype_size(dst->dtype), s));
    return TS_OK;
}

/* ---- dropout ------------------------------------------------------------------------------------- */
/* The CPU's draw exactly (core/rng.c's ts__rng_keep_mask), into a host buffer copied to the device. The copy is from pageable memory; waiting for the stream
 * before freeing the buffer keeps this correct whatever the driver stages. */
static ts_status cu_dropout_mask(ts_tensor *mask, float p, ts_rng *rng) {
    ts_device *dev = ts__dev(mask);
    TS_CU_BEGIN(dev, s);
    const int64_t n = ts_tensor_numel(mask);
    if (n == 0) return TS_OK;
    uint8_t *m = ts__malloc((size_t)n);
    if (!m) return TS_ERR_NOMEM;
    ts__rng_keep_mask(rng, m, n, p); /* the CPU's draw (core/rng.c) */
    ts_status st = ts__cuda_status(dev, cudaMemcpyAsync(ts__ptr(mask), m, (size_t)n, cudaMemcpyHostToDevice, s),
                                   "cudaMemcpyAsync (dropout mask)");
    if (st == TS_OK) st = ts__cuda_status(dev, cudaStreamSynchronize(s), "cudaStreamSynchronize (dropout mask)");
    free(m);
    return st;
}

/* out = x * mask * scale (mask NULL: all ones) */
static ts_status cu_masked_scale(ts_tensor *out, const ts_tensor *x, const ts_tensor *mask, float scale) {
    ts_device *dev = ts__dev(out);
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "misc.masked_scale",
                 ts_cu_masked_scale(ts__f32(out), ts__f32(x), mask ? (const uint8_t *)ts__ptr(mask) : NULL, scale,
                                    ts_tensor_numel(out), s));
    return TS_OK;
}

/* ---- log-softmax and softmax: (outer, n, inner) ----------------------------------------------------- */
static ts_status cu_log_softmax(ts_tensor *out, const ts_tensor *x, int64_t outer, int64_t n, int64_t inner) {
    ts_device *dev = ts__dev(out);
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "misc.log_softmax", ts_cu_log_softmax(ts__f32(out), ts__f32(x), outer, n, inner, s));
    return TS_OK;
}

static ts_status cu_log_softmax_backward(ts_tensor *gx, const ts_tensor *gy, const ts_tensor *y, int64_t outer,
                                         int64_t n, int64_t inner) {
    ts_device *dev = ts__dev(gx);
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "misc.log_softmax_backward",
                 ts_cu_log_softmax_backward(ts__f32(gx), ts__f32(gy), ts__f32(y), outer, n, inner, s));
    return TS_OK;
}

static ts_status cu_softmax(ts_tensor *out, const ts_tensor *x, int64_t outer, int64_t n, int64_t inner) {
    ts_device *dev = ts__dev(out);
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "misc.softmax", ts_cu_softmax(ts__f32(out), ts__f32(x), outer, n, inner, s));
    return TS_OK;
}

static ts_status cu_softmax_backward(ts_tensor *gx, const ts_tensor *gy, const ts_tensor *y, int64_t outer, int64_t n,
                                     int64_t inner) {
    ts_device *dev = ts__dev(gx);
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "misc.softmax_backward",
                 ts_cu_softmax_backward(ts__f32(gx), ts__f32(gy), ts__f32(y), outer, n, inner, s));
    return TS_OK;
}

/* ---- cross-entropy ------------------------------------------------------------------------------------ */
/* logits (N, C, S...) are rows i = n * S + s of C values at stride S; target is (N * S), lse (N * S, 2). */
static void ce_geom(const ts_tensor *logits, int64_t *N, int64_t *C, int64_t *S) {
    *N = logits->shape[0];
    *C = logits->shape[1];
    const int64_t NC = *N * *C;
    *S = NC ? ts_tensor_numel(logits) / NC : 1;
}

static ts_status cu_cross_entropy(ts_tensor *loss, ts_tensor *lse, const ts_tensor *logits, const ts_tensor *target,
                                  const ts_tensor *weight, float eps, int64_t ignore_index, ts_reduction reduction) {
    ts_device *dev = ts__dev(loss);
    TS_CU_BEGIN(dev, s);
    int64_t N, C, S;
    ce_geom(logits, &N, &C, &S);
    const int64_t rows = N * S;
    const bool none = reduction == TS_REDUCTION_NONE, mean = reduction == TS_REDUCTION_MEAN;
    const int64_t *t = (const int64_t *)ts__ptr(target);
    /* scratch: the pairs of doubles of the reduction (none: nothing) */
    ts_tensor *sc = NULL;
    if (!none) TS_TRY(ts__scratch_bytes(dev, (size_t)(rows + TS_CU_MISC_PARTS) * 2 * sizeof(double), &sc));
    void *rec = NULL;
    ts_status st = ts__cuda_check_begin(dev, s, &rec); /* an earlier op's bad index, if the stream is past it */
    if (st == TS_OK) {
        st = ts__cuda_status(dev,
                             ts_cu_cross_entropy(ts__f32(loss), ts__f32(lse), ts__f32(logits), t,
                                                 weight ? ts__f32(weight) : NULL, N, C, S, eps, ignore_index, none,
                                                 mean, sc ? (double *)ts__ptr(sc) : NULL, rec, s),
                             "misc.cross_entropy");
        st = ts__cuda_check_end(dev, s, st); /* a bad target is reported later (see above) */
    }
    ts_tensor_release(sc); /* stream-ordered: the kernels queued above still own it */
    return st;
}

static ts_status cu_cross_entropy_backward(ts_tensor *gx, const ts_tensor *gloss, const ts_tensor *logits,
                                           const ts_tensor *lse, const ts_tensor *target, const ts_tensor *weight,
                                           float eps, int64_t ignore_index, ts_reduction reduction) {
    ts_device *dev = ts__dev(gx);
    TS_CU_BEGIN(dev, s);
    int64_t N, C, S;
    ce_geom(logits, &N, &C, &S);
    ts_tensor *sc = NULL;
    TS_TRY(ts__scratch_bytes(dev, (size_t)(TS_CU_MISC_PARTS + 1) * 2 * sizeof(double), &sc));
    ts_status st = ts__cuda_status(
        dev,
        ts_cu_cross_entropy_backward(ts__f32(gx), ts__f32(gloss), ts__f32(logits), ts__f32(lse),
                                     (const int64_t *)ts__ptr(target), weight ? ts__f32(weight) : NULL, N, C, S, eps,
                                     ignore_index, reduction == TS_REDUCTION_NONE, reduction == TS_REDUCTION_MEAN,
                                     (double *)ts__ptr(sc), s),
        "misc.cross_entropy_backward");
    ts_tensor_release(sc);
    return st;
}

/* ---- mean squared error ---------------------------------------------------------------------------- */
static ts_status cu_mse(ts_tensor *loss, const ts_tensor *pred, const ts_tensor *target) {
    ts_device *dev = ts__dev(loss);
    TS_CU_BEGIN(dev, s);
    ts_tensor *sc = NULL;
    TS_TRY(ts__scratch_bytes(dev, (size_t)TS_CU_MISC_PARTS * 2 * sizeof(double), &sc));
    ts_status st = ts__cuda_status(dev,
                                   ts_cu_mse(ts__f32(loss), ts__f32(pred), ts__f32(target), ts_tensor_numel(pred),
                                             (double *)ts__ptr(sc), s),
                                   "misc.mse");
    ts_tensor_release(sc);
    return st;
}

static ts_status cu_mse_backward(ts_tensor *gpred, ts_tensor *gtarget, const ts_tensor *gloss, const ts_tensor *pred,
                                 const ts_tensor *target) {
    ts_device *dev = ts__dev(pred);
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "misc.mse_backward",
                 ts_cu_mse_backward(gpred ? ts__f32(gpred) : NULL, gtarget ? ts__f32(gtarget) : NULL, ts__f32(gloss),
                                    ts__f32(pred), ts__f32(target), ts_tensor_numel(pred), s));
    return TS_OK;
}

/* ---- scaled-dot-product attention (ops/cuda/attention.cu) ------------------------------------------------ */
static ts_status attention_dims(const ts_tensor *q, const ts_tensor *k, int64_t *bh, int64_t *tq, int64_t *tk, int *d) {
    *bh = q->shape[0] * q->shape[1];
    *tq = q->shape[2];
    *tk = k->shape[2];
    *d = (int)q->shape[3];
    if (q->shape[3] > TS_CU_ATTENTION_MAX_D)
        return ts_error(TS_ERR_UNSUPPORTED, "scaled_dot_product_attention on %s: head dim %lld; the CUDA kernel takes "
                        "up to %d", ts__dev(q)->name, (long long)q->shape[3], TS_CU_ATTENTION_MAX_D);
    return TS_OK;
}

static ts_status cu_attention_forward(ts_tensor *out, ts_tensor *stats, const ts_tensor *q, const ts_tensor *k,
                                      const ts_tensor *v, bool causal, float scale) {
    int64_t bh, tq, tk;
    int d;
    TS_TRY(attention_dims(q, k, &bh, &tq, &tk, &d));
    ts_device *dev = ts__dev(out);
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "misc.attention_forward",
                 ts_cu_attention_forward(ts__f32(out), ts__f32(stats), ts__f32(q), ts__f32(k), ts__f32(v), bh, tq, tk,
                                         d, causal, scale, s));
    return TS_OK;
}

static ts_status cu_attention_backward(ts_tensor *gq, ts_tensor *gk, ts_tensor *gv, const ts_tensor *gout,
                                       const ts_tensor *q, const ts_tensor *k, const ts_tensor *v, const ts_tensor *out,
                                       const ts_tensor *stats, bool causal, float scale) {
    int64_t bh, tq, tk;
    int d;
    TS_TRY(attention_dims(q, k, &bh, &tq, &tk, &d));
    ts_device *dev = ts__dev(gq);
    ts_tensor *delta = NULL; /* gout_i . out_i per query row */
    int64_t n = bh * tq > 0 ? bh * tq : 1;
    TS_TRY(ts_tensor_empty(dev, TS_F32, 1, &n, &delta));
    cudaStream_t s;
    ts_status st = ts__cuda_enter(dev, &s);
    if (st == TS_OK)
        st = ts__cuda_status(dev,
                             ts_cu_attention_backward(ts__f32(gq), ts__f32(gk), ts__f32(gv), ts__f32(delta), ts__f32(gout),
                                                      ts__f32(q), ts__f32(k), ts__f32(v), ts__f32(out), ts__f32(stats),
                                                      bh, tq, tk, d, causal, scale, s),
                             "misc.attention_backward");
    ts_tensor_release(delta); /* reused only by work queued after the kernels on the device's one stream */
    return st;
}

const struct ts_kernels_misc ts_cuda_kernels_misc = {
    .embedding = cu_embedding,
    .embedding_backward = cu_embedding_backward,
    .narrow_copy = cu_narrow_copy,
    .dropout_mask = cu_dropout_mask,
    .masked_scale = cu_masked_scale,
    .log_softmax = cu_log_softmax,
    .log_softmax_backward = cu_log_softmax_backward,
    .cross_entropy = cu_cross_entropy,
    .cross_entropy_backward = cu_cross_entropy_backward,
    .mse = cu_mse,
    .mse_backward = cu_mse_backward,
    .softmax = cu_softmax,
    .softmax_backward = cu_softmax_backward,
    .attention_forward = cu_attention_forward,
    .attention_backward = cu_attention_backward,
};
