/*
 * ops/attention.c — scaled-dot-product attention as one op (torch.nn.functional.
 * scaled_dot_product_attention without a mask tensor or dropout): argument checks, the 16-bit and
 * autocast rules, the autograd node; the work is the device's misc kernels (attention_forward,
 * attention_backward: FlashAttention-2's tiling, memory O(T)).
 *
 * The node saves q, k, v, the output and the per-row statistics (B, H, Tq, 2) = (max, log of the sum
 * of exp) — the log-sum-exp in two parts — and never a Tq x Tk matrix: backward recomputes the scores.
 *
 * 16-bit inputs: as ops/half.h's rule, float32 copies (ts_to_dtype nodes), the float32 op, the result
 * rounded back. Under autocast (ts_set_autocast(TS_BF16)) float32 inputs are cast to bfloat16 first,
 * as PyTorch's CPU autocast lists scaled_dot_product_attention among its lower-precision ops.
 */
#include "autograd/autograd.h"
#include "device/k_misc.h"
#include "ops/half.h"
#include "ops/trace.h"
#include "tensor/tensor.h"
#include "tessera/ops.h"

#include <math.h>

static const char *const OP = "scaled_dot_product_attention";

/* saved: q, k, v, out, stats; p.i[0]: causal, p.d[1]: scale */
static ts_status attention_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    const ts_tensor *q = ts__node_saved(n, 0), *k = ts__node_saved(n, 1), *v = ts__node_saved(n, 2);
    const ts_tensor *o = ts__node_saved(n, 3), *stats = ts__node_saved(n, 4);
    const struct ts_kernels_misc *km = q->storage->device->k_misc;
    if (!km->attention_backward)
        return ts_error(TS_ERR_UNSUPPORTED, "%s backward: no attention kernel on device %s", OP,
                        q->storage->device->name);
    ts_status st;
    ts_tensor *g = NULL, *gq = NULL, *gk = NULL, *gv = NULL;
    TS_CHECK_GOTO(ts__contiguous(g_in, &g));
    TS_CHECK_GOTO(ts__new_like(q, &gq));
    TS_CHECK_GOTO(ts__new_like(k, &gk));
    TS_CHECK_GOTO(ts__new_like(v, &gv));
    TS_CHECK_GOTO(km->attention_backward(gq, gk, gv, g, q, k, v, o, stats, n->p.i[0] != 0, (float)n->p.d[1]));
    ts_tensor *const got[3] = {gq, gk, gv};
    for (int i = 0; i < 3; i++) {
        if (n->needs[i]) gin[i] = ts_tensor_retain(got[i]);
    }
fail:
    ts_tensor_release(g);
    ts_tensor_release(gq);
    ts_tensor_release(gk);
    ts_tensor_release(gv);
    return st;
}

/* The shape checks: q (B, H, Tq, D), k and v (B, H, Tk, D), float32 (after the 16-bit rule), one device. */
static ts_status check_args(const ts_tensor *q, const ts_tensor *k, const ts_tensor *v) {
    const ts_tensor *t[3] = {q, k, v};
    const char *name[3] = {"q", "k", "v"};
    char a[96], b[96], c[96];
    for (int i = 0; i < 3; i++) {
        TS_TRY(ts__check_f32(OP, name[i], t[i]));
        if (t[i]->ndim != 4)
            return ts_error(TS_ERR_SHAPE, "%s: %s has shape %s, expected 4 dimensions (batch, heads, tokens, head dim)",
                            OP, name[i], ts_shape_str(t[i]->ndim, t[i]->shape, a, sizeof a));
    }
    TS_TRY(ts__check_same_device(OP, q, k));
    TS_TRY(ts__check_same_device(OP, q, v));
    ts_shape_str(4, q->shape, a, sizeof a);
    ts_shape_str(4, k->shape, b, sizeof b);
    ts_shape_str(4, v->shape, c, sizeof c);
    if (k->shape[0] != q->shape[0] || k->shape[1] != q->shape[1] || v->shape[0] != q->shape[0] ||
        v->shape[1] != q->shape[1])
        return ts_error(TS_ERR_SHAPE, "%s: q %s, k %s, v %s: batch and head dims (the first two) differ", OP, a, b, c);
    if (k->shape[3] != q->shape[3] || v->shape[3] != q->shape[3])
        return ts_error(TS_ERR_SHAPE, "%s: q %s, k %s, v %s: the head dims (the last) differ", OP, a, b, c);
    if (v->shape[2] != k->shape[2])
        return ts_error(TS_ERR_SHAPE, "%s: k %s and v %s: different numbers of keys (dim 2)", OP, b, c);
    if (k->shape[2] == 0 || q->shape[3] == 0)
        return ts_error(TS_ERR_SHAPE, "%s: q %s, k %s: %s", OP, a, b,
                        k->shape[2] == 0 ? "no keys (k's dim 2 is 0)" : "a head dim of 0");
    return TS_OK;
}

/* The float32 op on float32 inputs (any strides). */
static ts_status attention_f32(const ts_tensor *q_in, const ts_tensor *k_in, const ts_tensor *v_in, bool causal,
                               double scale, ts_tensor **out) {
    TS_TRY(check_args(q_in, k_in, v_in));
    if (scale == 0.0) scale = 1.0 / sqrt((double)q_in->shape[3]);
    const struct ts_kernels_misc *km = q_in->storage->device->k_misc;
    if (!km->attention_forward)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: no attention kernel on device %s yet", OP,
                        q_in->storage->device->name);
    ts_status st;
    ts_tensor *q = NULL, *k = NULL, *v = NULL, *o = NULL, *stats = NULL;
    TS_CHECK_GOTO(ts__contiguous(q_in, &q));
    TS_CHECK_GOTO(ts__contiguous(k_in, &k));
    TS_CHECK_GOTO(ts__contiguous(v_in, &v));
    TS_CHECK_GOTO(ts__new_like(q, &o));
    const int64_t sshape[4] = {q->shape[0], q->shape[1], q->shape[2], 2};
    TS_CHECK_GOTO(ts__new(q->storage->device, TS_F32, 4, sshape, &stats));
    TS_CHECK_GOTO(km->attention_forward(o, stats, q, k, v, causal, (float)scale));
    const ts_tensor *in[3] = {q_in, k_in, v_in};
    ts_node *n = NULL;
    TS_CHECK_GOTO(ts__node_new(OP, attention_backward, 3, in, &n));
    if (n) {
        ts__node_save(n, q);
        ts__node_save(n, k);
        ts__node_save(n, v);
        ts__node_save(n, o);
        ts__node_save(n, stats);
        n->p.i[0] = causal;
        n->p.d[1] = scale;
        TS_CHECK_GOTO(ts__node_attach(n, o));
    }
    TS_CHECK_GOTO(ts__trace_op(TS_OP_ATTENTION, 3, in, o, &(ts__trace_attrs){.i = {causal}, .f = {scale}}));
    *out = o;
    o = NULL;
fail:
    ts_tensor_release(q);
    ts_tensor_release(k);
    ts_tensor_release(v);
    ts_tensor_release(o);
    ts_tensor_release(stats);
    return st;
}

/* 16-bit inputs (all three of one dtype): float32 copies through ts_to_dtype nodes, the op, the result
 * rounded back to that dtype. */
static ts_status attention_half(const ts_tensor *q, const ts_tensor *k, const ts_tensor *v, bool causal,
                                double scale, ts_tensor **out) {
    if (k->dtype != q->dtype || v->dtype != q->dtype)
        return ts_error(TS_ERR_DTYPE, "%s: q, k, v have dtypes %s, %s, %s: they must be one dtype", OP,
                        ts_dtype_name(q->dtype), ts_dtype_name(k->dtype), ts_dtype_name(v->dtype));
    ts_tensor *f[3] = {NULL, NULL, NULL}, *o = NULL;
    const ts_tensor *in[3] = {q, k, v};
    ts_status st = TS_OK;
    for (int i = 0; i < 3 && st == TS_OK; i++) st = ts_to_dtype(in[i], TS_F32, &f[i]);
    if (st == TS_OK) st = attention_f32(f[0], f[1], f[2], causal, scale, &o);
    if (st == TS_OK) st = ts_to_dtype(o, q->dtype, out);
    ts_tensor_release(o);
    for (int i = 0; i < 3; i++) ts_tensor_release(f[i]);
    return st;
}

ts_status ts_scaled_dot_product_attention(const ts_tensor *q, const ts_tensor *k, const ts_tensor *v, bool causal,
                                          double scale, ts_tensor **out) {
    TS_ARG(q && k && v && out, "%s: NULL argument", OP);
    TS_ARG(isfinite(scale), "%s: scale %g is not finite", OP, scale);
    ts_tensor *c[3] = {NULL, NULL, NULL};
    const ts_tensor *in[3] = {q, k, v};
    ts_status st = TS_OK;
    for (int i = 0; i < 3 && st == TS_OK; i++) st = ts__autocast(in[i], &c[i]);
    if (st == TS_OK) {
        if (ts__any_half(c[0], c[1]) || ts__any_half(c[2], NULL))
            st = attention_half(c[0], c[1], c[2], causal, scale, out);
        else
            st = attention_f32(c[0], c[1], c[2], causal, scale, out);
    }
    for (int i = 0; i < 3; i++) ts_tensor_release(c[i]);
    return st;
}
