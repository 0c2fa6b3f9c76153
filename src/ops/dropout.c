/*
 * ops/dropout.c — inverted dropout (PyTorch 1.13 semantics): in training each
 * element is zeroed with probability p and the kept ones are scaled by
 * 1/(1-p); the mask is drawn from the given generator (NULL: the default
 * one) and saved (one byte per element) for backward, so the gradient flows
 * only through kept elements. p == 0, eval mode or an empty input return the
 * input itself; p == 1 zeroes everything without drawing.
 */
#include "autograd/autograd.h"
#include "ops/half.h"
#include "tensor/tensor.h"
#include "device/k_misc.h"
#include "ops/trace.h"
#include "tessera/ops.h"

#include <math.h>

static ts_status dropout_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    ts_tensor *g = NULL;
    TS_TRY(ts__contiguous(g_in, &g));
    ts_status st = ts__new_like(g, &gin[0]);
    if (st == TS_OK) st = g->storage->device->k_misc->masked_scale(gin[0], g, ts__node_saved(n, 0), n->p.f[0]);
    ts_tensor_release(g);
    return st;
}

typedef struct dropout_args {
    float p;
    bool training;
    ts_rng *rng;
} dropout_args;
static ts_status dropout_thunk(const ts_tensor *x, const ts_tensor *b, const void *arg, ts_tensor **out) {
    const dropout_args *a = arg;
    (void)b;
    return ts_dropout(x, a->p, a->training, a->rng, out);
}

/* 16-bit x: on a float32 copy, the output rounded to x's dtype (ops/half.h) */
ts_status ts_dropout(const ts_tensor *x_in, float p, bool training, ts_rng *rng, ts_tensor **out) {
    if (ts__any_half(x_in, NULL)) return ts__half_op(dropout_thunk, x_in, NULL, &(dropout_args){p, training, rng}, out);
    TS_TRY(ts__check_f32("dropout", "x", x_in));
    TS_ARG(out, "dropout: NULL out");
    if (!(p >= 0.0f && p <= 1.0f)) /* also rejects NaN */
        return ts_error(TS_ERR_INVALID_ARG, "dropout: probability p = %g is outside [0, 1]", (double)p);
    if (!training || p == 0.0f || ts_tensor_numel(x_in) == 0) {
        if (ts_tensor_is_contiguous(x_in)) {
            *out = ts_tensor_retain((ts_tensor *)x_in);
            return TS_OK;
        }
        /* results are contiguous: a differentiable copy */
        return ts_reshape(x_in, x_in->ndim, x_in->shape, out);
    }
    if (!rng) rng = ts_rng_default();
    ts_device *d = x_in->storage->device;
    ts_status st;
    ts_tensor *x = NULL, *mask = NULL, *o = NULL;
    float scale = 0.0f;
    TS_CHECK_GOTO(ts__contiguous(x_in, &x));
    TS_CHECK_GOTO(ts__new_like(x, &o));
    if (p < 1.0f) {
        scale = (float)(1.0 / (1.0 - (double)p));
        TS_CHECK_GOTO(ts__new(d, TS_U8, x->ndim, x->shape, &mask));
        TS_CHECK_GOTO(d->k_misc->dropout_mask(mask, p, rng));
    }
    /* p == 1: mask NULL and scale 0, i.e. x * 0 as PyTorch computes it */
    TS_CHECK_GOTO(d->k_misc->masked_scale(o, x, mask, scale));
    ts_node *n = NULL;
    TS_CHECK_GOTO(ts__node_new("dropout", dropout_backward, 1, &x_in, &n));
    if (n) {
        ts__node_save(n, mask);
        n->p.f[0] = scale;
        TS_CHECK_GOTO(ts__node_attach(n, o));
    }
    TS_CHECK_GOTO(ts__trace_op(TS_OP_DROPOUT, 1, &x_in, o, &(ts__trace_attrs){.i = {training}, .f = {p}}));
    *out = o;
    o = NULL;
fail:
    ts_tensor_release(x);
    ts_tensor_release(mask);
    ts_tensor_release(o);
    return st;
}
