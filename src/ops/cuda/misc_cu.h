/*
 * ops/cuda/misc_cu.h — launchers of the misc family's CUDA kernels (ops/cuda/misc.cu), called by
 * its kernel table (ops/cuda/misc.c). Raw device pointers, sizes and the stream; each queues its
 * kernels on the stream and returns the launch's cudaError_t. Shapes as in device/k_misc.h.
 *
 * `rec` arguments are the device's index-check record (ts_cu_bad_rec below; device/cuda.h's
 * ts__cuda_check_begin gives it): the op's kernel lowers rec->cur (atomicMin) to the first invalid
 * position, and the op's last kernel folds it into the record (keeping an earlier op's bad index if the
 * host has not seen it yet) and resets rec->cur. Nothing waits: the host reads a copy later.
 * `part` arguments are device scratch of doubles for the deterministic two-stage reductions:
 * TS_CU_MISC_PARTS pairs of doubles (plus what each launcher names).
 */
#ifndef TS_OPS_CUDA_MISC_CU_H
#define TS_OPS_CUDA_MISC_CU_H

#include "ops/cuda/cu.h"
#include "device/cuda_check.h"

#define TS_CU_MISC_PARTS 256               /* blocks (partial sums) of the first reduction stage */


/* out: (n, dim) = w[idx[i], :]; w: (num, dim); rows whose idx[i] is outside [0, num) are NaN, the first
 * such i goes to rec. */
TS_CU_EXTERN_C cudaError_t ts_cu_embedding(float *out, const int64_t *idx, const float *w, int64_t n, int64_t num,
                                           int64_t dim, ts_cu_bad_rec *rec, cudaStream_t s);
/* gw: (num, dim) = 0, then gw[idx[i], :] += g[i, :] (float atomics). */
TS_CU_EXTERN_C cudaError_t ts_cu_embedding_backward(float *gw, const int64_t *idx, const float *g, int64_t n,
                                                    int64_t num, int64_t dim, cudaStream_t s);
/* dst (outer, dst_n, inner)[:, dst_start:+len, :] = src (outer, src_n, inner)[:, src_start:+len, :];
 * elements of es bytes. */
TS_CU_EXTERN_C cudaError_t ts_cu_narrow_copy(void *dst, int64_t dst_n, int64_t dst_start, const void *src,
                                             int64_t src_n, int64_t src_start, int64_t len, int64_t outer,
                                             int64_t inner, size_t es, cudaStream_t s);
/* out = mask[i] ? x[i] * scale : 0 (mask NULL: x * scale); out may alias x. */
TS_CU_EXTERN_C cudaError_t ts_cu_masked_scale(float *out, const float *x, const uint8_t *mask, float scale, int64_t n,
                                              cudaStream_t s);

/* (outer, n, inner), softmax-like ops over the middle dim. */
TS_CU_EXTERN_C cudaError_t ts_cu_log_softmax(float *y, const float *x, int64_t outer, int64_t n, int64_t inner,
                                             cudaStream_t s);
TS_CU_EXTERN_C cudaError_t ts_cu_log_softmax_backward(float *gx, const float *gy, const float *y, int64_t outer,
                                                      int64_t n, int64_t inner, cudaStream_t s);
TS_CU_EXTERN_C cudaError_t ts_cu_softmax(float *y, const float *x, int64_t outer, int64_t n, int64_t inner,
                                         cudaStream_t s);
TS_CU_EXTERN_C cudaError_t ts_cu_softmax_backward(float *gx, const float *gy, const float *y, int64_t outer, int64_t n,
                                                  int64_t inner, cudaStream_t s);

/* Cross-entropy over logits x (N, C, S) (rows i = n S + s), target t (N S), weight w (C) or NULL.
 * none: loss (N S) per sample; else loss [] = the sum, divided by the sum of w[t] over the samples
 * not ignored if mean. lse <- (N S, 2): each row's max and log-sum-exp. part: (N S) +
 * TS_CU_MISC_PARTS pairs of doubles (unused with none). A sample whose target is neither ignore nor in [0, C) makes its loss (none) or the
 * total NaN, and the first one goes to rec. */
TS_CU_EXTERN_C cudaError_t ts_cu_cross_entropy(float *loss, float *lse, const float *x, const int64_t *t,
                                               const float *w, int64_t N, int64_t C, int64_t S, float eps,
                                               int64_t ignore, int none, int mean, double *part,
                                               ts_cu_bad_rec *rec, cudaStream_t s);
/* gx: (N, C, S) from gloss ((N S) with none, else []); part: TS_CU_MISC_PARTS + 1 pairs of doubles. */
TS_CU_EXTERN_C cudaError_t ts_cu_cross_entropy_backward(float *gx, const float *gloss, const float *x,
                                                        const float *lse, const int64_t *t, const float *w, int64_t N,
                                                        int64_t C, int64_t S, float eps, int64_t ignore, int none,
                                                        int mean, double *part, cudaStream_t s);

/* loss [] = mean of (p - q)^2 (double); part: TS_CU_MISC_PARTS pairs of doubles. */
TS_CU_EXTERN_C cudaError_t ts_cu_mse(float *loss, const float *p, const float *q, int64_t n, double *part,
                                     cudaStream_t s);
/* gp = 2 gloss[0] / n (p - q), gq = -gp; either may be NULL. */
TS_CU_EXTERN_C cudaError_t ts_cu_mse_backward(float *gp, float *gq, const float *gloss, const float *p, const float *q,
                                              int64_t n, cudaStream_t s);

/* Scaled-dot-product attention (ops/cuda/attention.cu), device/k_misc.h's contract: q, out (BH, Tq, D), k, v
 * (BH, Tk, D), stats (BH, Tq, 2) = (max, log sum) per row; the backward's delta is (BH, Tq) scratch. Head dims
 * 1..TS_CU_ATTENTION_MAX_D (cudaErrorInvalidValue past it). */
#define TS_CU_ATTENTION_MAX_D 256
TS_CU_EXTERN_C cudaError_t ts_cu_attention_forward(float *out, float *stats, const float *q, const float *k,
                                                   const float *v, int64_t BH, int64_t Tq, int64_t Tk, int D,
                                                   bool causal, float scale, cudaStream_t s);
TS_CU_EXTERN_C cudaError_t ts_cu_attention_backward(float *gq, float *gk, float *gv, float *delta, const float *gout,
                                                    const float *q, const float *k, const float *v, const float *o,
                                                    const float *stats, int64_t BH, int64_t Tq, int64_t Tk, int D,
                                                    bool causal, float scale, cudaStream_t s);

#endif
