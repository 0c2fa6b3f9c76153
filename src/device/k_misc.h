/*
 * device/k_misc.h — the misc kernel family: embedding gather/scatter, the block
 * copy behind concat and slice, dropout masks, softmax, log-softmax, the fused
 * cross-entropy and mean-squared-error losses, and scaled-dot-product attention, forward and backward. Every
 * backend provides one instance (src/ops/cpu/misc.c for the CPU).
 *
 * The op layer (src/ops/index.c, shape.c, dropout.c, loss.c) checks shapes
 * and dtypes, allocates contiguous results on the inputs' device and calls
 * these kernels. Every tensor passed here is contiguous. Kernels that read
 * indices (embedding, cross_entropy) validate them and report the first bad
 * one through ts_error, since only the device can read them cheaply.
 *
 * The (outer, n, inner) convention: a contiguous tensor seen as three dims,
 * the middle one being the dim an op works along (outer = product of the dims
 * before it, inner = product of the dims after it).
 */
#ifndef TS_K_MISC_H
#define TS_K_MISC_H

#include "device/device.h"
#include "tessera/ops.h" /* ts_reduction */

struct ts_kernels_misc {
    /* out: (n, dim) = weight[idx[i], :]; idx: n I64 (any shape, read flat),
     * weight: (num, dim) F32. Fails with TS_ERR_INVALID_ARG naming the first
     * index outside [0, num). */
    ts_status (*embedding)(ts_tensor *out, const ts_tensor *idx, const ts_tensor *weight);
    /* gw: (num, dim), overwritten: gw[r] = sum of g[i] over i with idx[i] == r;
     * g: (n, dim); idx already validated by the forward. */
    ts_status (*embedding_backward)(ts_tensor *gw, const ts_tensor *idx, const ts_tensor *g);

    /* Block copy of any dtype (dst and src share it): dst seen as (outer, dst_n, inner),
     * src as (outer, src_n, inner); dst[:, dst_start + j, :] = src[:, src_start + j, :]
     * for j in [0, len). Other elements of dst are left as they are. */
    ts_status (*narrow_copy)(ts_tensor *dst, int64_t dst_n, int64_t dst_start, const ts_tensor *src, int64_t src_n,
                             int64_t src_start, int64_t len, int64_t outer, int64_t inner);

    /* mask: any shape, U8, overwritten with 1 (keep) with probability 1 - p and 0
     * (drop) with probability p, drawn in order from rng; 0 <= p < 1. */
    ts_status (*dropout_mask)(ts_tensor *mask, float p, ts_rng *rng);
    /* out = x * mask * scale elementwise (mask U8 like x, or NULL for all ones);
     * out and x F32 of one shape; out may alias x. */
    ts_status (*masked_scale)(ts_tensor *out, const ts_tensor *x, const ts_tensor *mask, float scale);

    /* The softmax family: each row's max m and s = sum exp(x - m) in double, then device/k_elem.h's
     * per-element formulas, on every backend. */
    /* out, x: (outer, n, inner); out = (x - m) - log s over the middle dim. */
    ts_status (*log_softmax)(ts_tensor *out, const ts_tensor *x, int64_t outer, int64_t n, int64_t inner);
    /* gx = gy - exp(y) * sum over the middle dim of gy; all (outer, n, inner), y = log_softmax output. */
    ts_status (*log_softmax_backward)(ts_tensor *gx, const ts_tensor *gy, const ts_tensor *y, int64_t outer, int64_t n,
                                      int64_t inner);

    /* logits: (N, C) or (N, C, d1, ...) (a sample per (n, d1, ...), classes along dim 1),
     * target: (N) or (N, d1, ...) I64, weight: (C) or NULL (all 1) -> per sample
     *   l_i = (1 - eps) w[t_i] (lse_i - x_i[t_i]) + eps / C * sum_c w[c] (lse_i - x_i[c])
     * (0 when t_i == ignore_index); loss: like target = l for TS_REDUCTION_NONE, else [] = sum l
     * (SUM) or sum l / sum of w[t_i] over samples not ignored (MEAN; 0/0 = NaN with none).
     * lse: (N * S, 2) = each sample's max m and log s over the classes, so lse_i = m + log s (kept for
     * backward, which takes softmax as exp((x - m) - log s)). Fails with TS_ERR_INVALID_ARG
     * naming the first sample whose target is outside [0, C) and not ignore_index. */
    ts_status (*cross_entropy)(ts_tensor *loss, ts_tensor *lse, const ts_tensor *logits, const ts_tensor *target,
                               const ts_tensor *weight, float eps, int64_t ignore_index, ts_reduction reduction);
    /* gx: like logits = s_i ((1 - eps) w[t_i] (softmax(x_i) - onehot(t_i)) + eps / C (sum(w) softmax(x_i) - w)),
     * samples with target == ignore_index zero; s_i = gloss[i] (NONE, gloss like target), gloss (SUM, gloss [])
     * or gloss / sum of w[t_i] (MEAN). gloss on the device. */
    ts_status (*cross_entropy_backward)(ts_tensor *gx, const ts_tensor *gloss, const ts_tensor *logits,
                                        const ts_tensor *lse, const ts_tensor *target, const ts_tensor *weight,
                                        float eps, int64_t ignore_index, ts_reduction reduction);

    /* loss: [] = mean of (pred - target)^2; pred, target F32 of one shape. */
    ts_status (*mse)(ts_tensor *loss, const ts_tensor *pred, const ts_tensor *target);
    /* gpred = 2 gloss / n (pred - target), gtarget = -gpred; either may be NULL. */
    ts_status (*mse_backward)(ts_tensor *gpred, ts_tensor *gtarget, const ts_tensor *gloss, const ts_tensor *pred,
                              const ts_tensor *target);

    /* out, x: (outer, n, inner); out = exp(x - m) / s over the middle dim. */
    ts_status (*softmax)(ts_tensor *out, const ts_tensor *x, int64_t outer, int64_t n, int64_t inner);
    /* gx = y * (gy - sum over the middle dim of gy * y); all (outer, n, inner), y = softmax output. */
    ts_status (*softmax_backward)(ts_tensor *gx, const ts_tensor *gy, const ts_tensor *y, int64_t outer, int64_t n,
                                  int64_t inner);

    /* Scaled-dot-product attention (ts_scaled_dot_product_attention), FlashAttention-2's tiling: memory
     * O(T), never a Tq x Tk matrix. q: (B, H, Tq, D), k, v: (B, H, Tk, D), out: (B, H, Tq, D), all F32;
     * Tk >= 1, D >= 1. Scores s_ij = scale q_i . k_j; causal: query i sees keys j <= i (the top-left
     * aligned mask of PyTorch's is_causal, so every row sees key 0). stats: (B, H, Tq, 2) = each row's
     * max m of its visible scores and log l, l = sum_j exp(s_ij - m): the log-sum-exp m + log l in two
     * parts, so that backward takes P = exp((s - m) - log l) without rounding m + log l. NULL where the
     * backend has none (the op layer then refuses with TS_ERR_UNSUPPORTED naming the device). */
    ts_status (*attention_forward)(ts_tensor *out, ts_tensor *stats, const ts_tensor *q, const ts_tensor *k,
                                   const ts_tensor *v, bool causal, float scale);
    /* gq, gk, gv (shaped like q, k, v, overwritten) from gout (like out) and the forward's q, k, v, out and
     * stats, recomputing the scores tile by tile: D_i = sum_d gout_id out_id, P = exp((s - m) - log l),
     * dP = gout v^T, dS = P (dP - D_i), gq = scale dS k, gk = scale dS^T q, gv = P^T gout. */
    ts_status (*attention_backward)(ts_tensor *gq, ts_tensor *gk, ts_tensor *gv, const ts_tensor *gout,
                                    const ts_tensor *q, const ts_tensor *k, const ts_tensor *v, const ts_tensor *out,
                                    const ts_tensor *stats, bool causal, float scale);
};

/* The CPU backend's instance (src/ops/cpu/misc.c), which device/cpu.c puts in
 * the table of every CPU device. */
extern const struct ts_kernels_misc ts_cpu_kernels_misc;
#ifdef TS_HAVE_CUDA
extern const struct ts_kernels_misc ts_cuda_kernels_misc; /* src/ops/cuda/misc.c */
#endif

#endif /* TS_K_MISC_H */
