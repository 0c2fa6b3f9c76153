/*
 * ops/conv.c — conv2d (stride, padding, dilation, groups, optional bias) with
 * its backward, over the device's spatial kernels. Shapes and output sizes as
 * PyTorch: H_out = (H + 2p - d(k-1) - 1) / s + 1.
 */
#include "autograd/autograd.h"
#include "ops/half.h"
#include "tensor/tensor.h"
#include "device/k_spatial.h"
#include "ops/trace.h"
#include "tessera/ops.h"

/* Geometry from x's and w's shapes and the parameters (already checked). */
static ts_conv2d_geom conv_geom(const int64_t *xs, const int64_t *ws, const ts_conv2d_params *p) {
    ts_conv2d_geom g = {
        .N = xs[0], .C = xs[1], .H = xs[2], .W = xs[3], .K = ws[0],
        .kh = (int)ws[2], .kw = (int)ws[3],
        .sh = p->stride[0], .sw = p->stride[1],
        .ph = p->padding[0], .pw = p->padding[1],
        .dh = p->dilation[0], .dw = p->dilation[1],
        .groups = p->groups,
    };
    g.OH = (g.H + 2 * g.ph - (int64_t)g.dh * (g.kh - 1) - 1) / g.sh + 1;
    g.OW = (g.W + 2 * g.pw - (int64_t)g.dw * (g.kw - 1) - 1) / g.sw + 1;
    return g;
}

static ts_status conv_check(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, const ts_conv2d_params *p) {
    if (x->dtype != TS_BF16) TS_TRY(ts__check_f32("conv2d", "input", x)); /* bfloat16: checked by ts_conv2d */
    TS_TRY(ts__check_f32("conv2d", "weight", w));
    TS_TRY(ts__check_ndim("conv2d", "input", x, 4));
    TS_TRY(ts__check_ndim("conv2d", "weight", w, 4));
    TS_TRY(ts__check_same_device("conv2d", x, w));
    for (int i = 0; i < 2; i++)
        if (p->stride[i] < 1 || p->padding[i] < 0 || p->dilation[i] < 1)
            return ts_error(TS_ERR_INVALID_ARG,
                            "conv2d: stride (%d, %d) and dilation (%d, %d) must be >= 1, padding (%d, %d) >= 0",
                            p->stride[0], p->stride[1], p->dilation[0], p->dilation[1], p->padding[0], p->padding[1]);
    if (p->groups < 1) return ts_error(TS_ERR_INVALID_ARG, "conv2d: groups %d must be >= 1", p->groups);
    char xs[96], wsb[96], bs[64];
    ts_shape_str(4, x->shape, xs, sizeof xs);
    ts_shape_str(4, w->shape, wsb, sizeof wsb);
    if (x->shape[1] % p->groups != 0 || w->shape[0] % p->groups != 0)
        return ts_error(TS_ERR_SHAPE, "conv2d: groups %d must divide the input channels (input %s) and the output "
                        "channels (weight %s)", p->groups, xs, wsb);
    if (w->shape[1] * p->groups != x->shape[1])
        return ts_error(TS_ERR_SHAPE,
                        "conv2d: input %s has %lld channels, but weight %s with groups %d expects %lld", xs,
                        (long long)x->shape[1], wsb, p->groups, (long long)(w->shape[1] * p->groups));
    if (w->shape[2] < 1 || w->shape[3] < 1 || w->shape[0] < 1)
        return ts_error(TS_ERR_SHAPE, "conv2d: weight %s has an empty dimension", wsb);
    for (int i = 0; i < 2; i++) {
        int64_t eff = (int64_t)p->dilation[i] * (w->shape[2 + i] - 1) + 1, padded = x->shape[2 + i] + 2 * p->padding[i];
        if (eff > padded)
            return ts_error(TS_ERR_SHAPE,
                            "conv2d: kernel %s (dilated size %lld) is larger than the padded input %s (%s size %lld)",
                            wsb, (long long)eff, xs, i ? "width" : "height", (long long)padded);
    }
    if (b) {
        TS_TRY(ts__check_f32("conv2d", "bias", b));
        TS_TRY(ts__check_same_device("conv2d", x, b));
        if (b->ndim != 1 || b->shape[0] != w->shape[0])
            return ts_error(TS_ERR_SHAPE, "conv2d: bias %s does not fit weight %s (%lld output channels)",
                            ts_shape_str(b->ndim, b->shape, bs, sizeof bs), wsb, (long long)w->shape[0]);
    }
    return TS_OK;
}

static void params_store(ts_node *n, const ts_conv2d_params *p) {
    n->p.i[0] = p->stride[0];
    n->p.i[1] = p->stride[1];
    n->p.i[2] = p->padding[0];
    n->p.i[3] = p->padding[1];
    n->p.i[4] = p->dilation[0];
    n->p.i[5] = p->dilation[1];
    n->p.i[6] = p->groups;
}

static ts_conv2d_params params_load(const ts_node *n) {
    return (ts_conv2d_params){{(int)n->p.i[0], (int)n->p.i[1]},
                              {(int)n->p.i[2], (int)n->p.i[3]},
                              {(int)n->p.i[4], (int)n->p.i[5]},
                              (int)n->p.i[6]};
}

static ts_status conv2d_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    const ts_tensor *x = ts__node_saved(n, 0), *w = ts__node_saved(n, 1);
    ts_device *d = x->storage->device;
    ts_conv2d_params p = params_load(n);
    ts_conv2d_geom geom = conv_geom(x->shape, w->shape, &p);
    if (g_in->dtype != x->dtype)
        return ts_error(TS_ERR_DTYPE, "conv2d backward: a %s gradient for a %s output", ts_dtype_name(g_in->dtype),
                        ts_dtype_name(x->dtype));
    ts_tensor *g = NULL;
    TS_TRY(ts__contiguous(g_in, &g));
    ts_status st;
    if (n->needs[0]) TS_CHECK_GOTO(ts__new_like(x, &gin[0]));
    if (n->needs[1]) TS_CHECK_GOTO(ts__new_like(w, &gin[1]));
    if (n->needs[2]) TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &geom.K, &gin[2]));
    TS_CHECK_GOTO(d->k_spatial->conv2d_backward(&geom, g, x, w, gin[0], gin[1], gin[2]));
fail:
    ts_tensor_release(g);
    return st;
}

typedef struct conv_args {
    const ts_tensor *b;
    ts_conv2d_params p;
} conv_args;
static ts_status conv2d_run(const ts_tensor *x_in, const ts_tensor *w_in, const ts_tensor *b, ts_conv2d_params p,
                            ts_tensor **out);

/* conv2d on float32 x and w; the bias goes up to float32 here when it is 16-bit */
static ts_status conv_thunk(const ts_tensor *x, const ts_tensor *w, const void *arg, ts_tensor **out) {
    const conv_args *c = arg;
    ts_tensor *fb = NULL;
    if (c->b) TS_TRY(ts_to_dtype(c->b, TS_F32, &fb));
    ts_status st = conv2d_run(x, w, fb, c->p, out);
    ts_tensor_release(fb);
    return st;
}

/* Under autocast x goes to bfloat16 first. A bfloat16 x with float32 weight and bias runs on the device's
 * kernels where they take bfloat16 activations (the output bfloat16); other 16-bit combinations run on
 * float32 copies, the result in x's dtype. */
ts_status ts_conv2d(const ts_tensor *x_in, const ts_tensor *w_in, const ts_tensor *b, ts_conv2d_params p,
                    ts_tensor **out) {
    TS_ARG(x_in && w_in && out, "conv2d: NULL argument");
    ts_tensor *x = NULL;
    TS_TRY(ts__autocast(x_in, &x));
    const bool native = ts__bf16_kept(x) && w_in->dtype == TS_F32 && (!b || b->dtype == TS_F32);
    ts_status st = !native && (ts__any_half(x, w_in) || ts__any_half(b, NULL))
                       ? ts__half_op_as(conv_thunk, x, w_in, &(conv_args){b, p}, ts__any_half(x, NULL) ? x->dtype : TS_F32, out)
                       : conv2d_run(x, w_in, b, p, out);
    ts_tensor_release(x);
    return st;
}

static ts_status conv2d_run(const ts_tensor *x_in, const ts_tensor *w_in, const ts_tensor *b, ts_conv2d_params p,
                            ts_tensor **out) {
    TS_TRY(conv_check(x_in, w_in, b, &p));
    ts_status st;
    ts_tensor *x = NULL, *w = NULL, *bc = NULL, *o = NULL;
    TS_CHECK_GOTO(ts__contiguous(x_in, &x));
    TS_CHECK_GOTO(ts__contiguous(w_in, &w));
    if (b) TS_CHECK_GOTO(ts__contiguous(b, &bc));
    ts_conv2d_geom g = conv_geom(x->shape, w->shape, &p);
    ts_device *d = x->storage->device;
    TS_CHECK_GOTO(ts__new(d, x->dtype, 4, (int64_t[]){g.N, g.K, g.OH, g.OW}, &o));
    TS_CHECK_GOTO(d->k_spatial->conv2d(&g, o, x, w, bc));
    const ts_tensor *in[3] = {x_in, w_in, b};
    ts_node *n = NULL;
    TS_CHECK_GOTO(ts__node_new("conv2d", conv2d_backward, 3, in, &n));
    if (n) {
        ts__node_save(n, x);
        ts__node_save(n, w);
        params_store(n, &p);
        TS_CHECK_GOTO(ts__node_attach(n, o));
    }
    TS_CHECK_GOTO(ts__trace_op(TS_OP_CONV2D, 3, in, o,
                               &(ts__trace_attrs){.i = {p.stride[0], p.stride[1], p.padding[0], p.padding[1],
                                                        p.dilation[0], p.dilation[1], p.groups}}));
    *out = o;
    o = NULL;
fail:
    ts_tensor_release(x);
    ts_tensor_release(w);
    ts_tensor_release(bc);
    ts_tensor_release(o);
    return st;
}
