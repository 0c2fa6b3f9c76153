/*
 * ops/pool.c — max pooling (kernel, stride, padding, dilation, ceil_mode; the
 * argmax indices are kept for backward), average pooling (count_include_pad
 * on or off, ceil_mode), global and adaptive average pooling, with their backward functions.
 * Output sizes follow PyTorch 1.13, including the ceil_mode rule that the last
 * window must start inside the input or its left padding.
 */
#include "autograd/autograd.h"
#include "ops/half.h"
#include "tensor/tensor.h"
#include "device/k_spatial.h"
#include "ops/trace.h"
#include "tessera/ops.h"

/* PyTorch's pooling_output_shape: floor (or ceil) division, and with ceil_mode
 * the last window must start before in + pad. */
static int64_t pool_out_size(int64_t in, int k, int pad, int s, int d, bool ceil_mode) {
    int64_t num = in + 2 * (int64_t)pad - (int64_t)d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
    int64_t q = num >= 0 ? num / s : -((-num + s - 1) / s); /* floor */
    int64_t o = q + 1;
    if (ceil_mode && (o - 1) * s >= in + pad) o--;
    return o;
}

/* Normalises p (stride 0 -> kernel, dilation 0 -> 1), checks it against x and fills the geometry. */
static ts_status pool_setup(const char *op, const ts_tensor *x, ts_pool2d_params *p, bool allow_dilation,
                            ts_pool2d_geom *g) {
    if (!ts__bf16_kept(x)) TS_TRY(ts__check_f32(op, "input", x));
    TS_TRY(ts__check_ndim(op, "input", x, 4));
    for (int i = 0; i < 2; i++) {
        if (p->stride[i] == 0) p->stride[i] = p->kernel[i];
        if (p->dilation[i] == 0) p->dilation[i] = 1;
    }
    if (p->kernel[0] < 1 || p->kernel[1] < 1 || p->stride[0] < 1 || p->stride[1] < 1 || p->dilation[0] < 1 ||
        p->dilation[1] < 1 || p->padding[0] < 0 || p->padding[1] < 0)
        return ts_error(TS_ERR_INVALID_ARG,
                        "%s: kernel (%d, %d), stride (%d, %d) and dilation (%d, %d) must be positive, padding (%d, %d) "
                        ">= 0", op, p->kernel[0], p->kernel[1], p->stride[0], p->stride[1], p->dilation[0],
                        p->dilation[1], p->padding[0], p->padding[1]);
    if (!allow_dilation && (p->dilation[0] != 1 || p->dilation[1] != 1))
        return ts_error(TS_ERR_INVALID_ARG, "%s: dilation (%d, %d) is not supported", op, p->dilation[0], p->dilation[1]);
    if (allow_dilation && p->exclude_pad) /* max pooling */
        return ts_error(TS_ERR_INVALID_ARG, "%s: exclude_pad is an average pooling option (padding never wins a max)",
                        op);
    if (p->padding[0] > p->kernel[0] / 2 || p->padding[1] > p->kernel[1] / 2)
        return ts_error(TS_ERR_INVALID_ARG, "%s: padding (%d, %d) must be at most half of kernel (%d, %d)", op,
                        p->padding[0], p->padding[1], p->kernel[0], p->kernel[1]);
    *g = (ts_pool2d_geom){
        .N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3],
        .kh = p->kernel[0], .kw = p->kernel[1], .sh = p->stride[0], .sw = p->stride[1],
        .ph = p->padding[0], .pw = p->padding[1], .dh = p->dilation[0], .dw = p->dilation[1],
        .exclude_pad = p->exclude_pad,
    };
    g->OH = pool_out_size(g->H, g->kh, g->ph, g->sh, g->dh, p->ceil_mode);
    g->OW = pool_out_size(g->W, g->kw, g->pw, g->sw, g->dw, p->ceil_mode);
    if (g->OH < 1 || g->OW < 1) {
        char xs[96];
        return ts_error(TS_ERR_SHAPE,
                        "%s: kernel (%d, %d) with dilation (%d, %d) is larger than the padded input %s "
                        "(padding (%d, %d)): output size %lldx%lld",
                        op, g->kh, g->kw, g->dh, g->dw, ts_shape_str(4, x->shape, xs, sizeof xs), g->ph, g->pw,
                        (long long)g->OH, (long long)g->OW);
    }
    if (g->H * g->W > INT32_MAX)
        return ts_error(TS_ERR_SHAPE, "%s: input plane of %lldx%lld is too large", op, (long long)g->H, (long long)g->W);
    return TS_OK;
}

static void geom_store(ts_node *n, const ts_pool2d_geom *g) {
    const int64_t v[] = {g->N,  g->C,  g->H,  g->W,  g->OH, g->OW, g->kh, g->kw,
                         g->sh, g->sw, g->ph, g->pw, g->dh, g->dw, g->exclude_pad};
    memcpy(n->p.i, v, sizeof v);
}

static ts_pool2d_geom geom_load(const ts_node *n) {
    const int64_t *v = n->p.i;
    return (ts_pool2d_geom){v[0],       v[1],        v[2],        v[3],        v[4],        v[5],
                            (int)v[6],  (int)v[7],   (int)v[8],   (int)v[9],   (int)v[10],  (int)v[11],
                            (int)v[12], (int)v[13],  v[14] != 0};
}

/* ---- max pooling -------------------------------------------------------------------------------- */
static ts_status maxpool2d_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    ts_pool2d_geom geom = geom_load(n);
    ts_tensor *g = NULL;
    TS_TRY(ts__contiguous(g_in, &g));
    ts_device *d = g->storage->device;
    ts_status st = ts__new(d, g->dtype, 4, (int64_t[]){geom.N, geom.C, geom.H, geom.W}, &gin[0]);
    if (st == TS_OK) st = d->k_spatial->maxpool2d_backward(&geom, gin[0], g, ts__node_saved(n, 0));
    ts_tensor_release(g);
    return st;
}

static ts_status maxpool_thunk(const ts_tensor *x, const ts_tensor *b, const void *arg, ts_tensor **out) {
    (void)b;
    return ts_maxpool2d(x, *(const ts_pool2d_params *)arg, out);
}

/* bfloat16 x stays bfloat16 where the device's kernels take it (the output is exact: a max rounds nothing);
 * other 16-bit inputs run on a float32 copy */
ts_status ts_maxpool2d(const ts_tensor *x_in, ts_pool2d_params p, ts_tensor **out) {
    TS_ARG(x_in && out, "maxpool2d: NULL argument");
    if (ts__any_half(x_in, NULL) && !ts__bf16_kept(x_in))
        return ts__half_op(maxpool_thunk, x_in, NULL, &p, out);
    ts_pool2d_geom g;
    TS_TRY(pool_setup("maxpool2d", x_in, &p, true, &g));
    ts_status st;
    ts_tensor *x = NULL, *o = NULL, *idx = NULL;
    TS_CHECK_GOTO(ts__contiguous(x_in, &x));
    ts_device *d = x->storage->device;
    const int64_t shape[4] = {g.N, g.C, g.OH, g.OW};
    TS_CHECK_GOTO(ts__new(d, x->dtype, 4, shape, &o));
    TS_CHECK_GOTO(ts__new(d, TS_I32, 4, shape, &idx));
    TS_CHECK_GOTO(d->k_spatial->maxpool2d(&g, o, idx, x));
    ts_node *n = NULL;
    TS_CHECK_GOTO(ts__node_new("maxpool2d", maxpool2d_backward, 1, &x_in, &n));
    if (n) {
        ts__node_save(n, idx);
        geom_store(n, &g);
        TS_CHECK_GOTO(ts__node_attach(n, o));
    }
    TS_CHECK_GOTO(ts__trace_op(TS_OP_MAXPOOL2D, 1, &x_in, o, &(ts__trace_attrs){.i = {
        p.kernel[0], p.kernel[1], p.stride[0], p.stride[1], p.padding[0], p.padding[1], p.dilation[0], p.dilation[1],
        p.ceil_mode}}));
    *out = o;
    o = NULL;
fail:
    ts_tensor_release(x);
    ts_tensor_release(idx);
    ts_tensor_release(o);
    return st;
}

/* ---- average pooling (also the global one) ------------------------------------------------------------- */
static ts_status avgpool2d_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    ts_pool2d_geom geom = geom_load(n);
    ts_tensor *g = NULL;
    TS_TRY(ts__contiguous(g_in, &g));
    ts_device *d = g->storage->device;
    ts_status st = ts__new(d, TS_F32, 4, (int64_t[]){geom.N, geom.C, geom.H, geom.W}, &gin[0]);
    if (st == TS_OK) st = d->k_spatial->avgpool2d_backward(&geom, gin[0], g);
    ts_tensor_release(g);
    return st;
}

static ts_status avgpool_run(const char *name, const ts_tensor *x_in, const ts_pool2d_geom *g, ts_tensor **out) {
    ts_status st;
    ts_tensor *x = NULL, *o = NULL;
    TS_CHECK_GOTO(ts__contiguous(x_in, &x));
    ts_device *d = x->storage->device;
    TS_CHECK_GOTO(ts__new(d, TS_F32, 4, (int64_t[]){g->N, g->C, g->OH, g->OW}, &o));
    TS_CHECK_GOTO(d->k_spatial->avgpool2d(g, o, x));
    ts_node *n = NULL;
    TS_CHECK_GOTO(ts__node_new(name, avgpool2d_backward, 1, &x_in, &n));
    if (n) {
        geom_store(n, g);
        TS_CHECK_GOTO(ts__node_attach(n, o));
    }
    *out = o;
    o = NULL;
fail:
    ts_tensor_release(x);
    ts_tensor_release(o);
    return st;
}

/* Reports x -> *out to the tracer; on failure releases *out. */
static ts_status trace_unary(ts__op_kind k, const ts_tensor *x, ts_tensor **out, const ts__trace_attrs *a) {
    ts_status st = ts__trace_op(k, 1, &x, *out, a);
    if (st != TS_OK) {
        ts_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

/* The average pools on 16-bit inputs: a float32 copy, the result rounded to x's dtype (ops/half.h) */
typedef struct avg_args {
    int kind; /* 0: avgpool2d, 1: global, 2: adaptive */
    ts_pool2d_params p;
    int oh, ow;
} avg_args;
static ts_status avg_thunk(const ts_tensor *x, const ts_tensor *b, const void *arg, ts_tensor **out) {
    const avg_args *a = arg;
    (void)b;
    return a->kind == 0   ? ts_avgpool2d(x, a->p, out)
           : a->kind == 1 ? ts_global_avgpool2d(x, out)
                          : ts_adaptive_avgpool2d(x, a->oh, a->ow, out);
}

ts_status ts_avgpool2d(const ts_tensor *x, ts_pool2d_params p, ts_tensor **out) {
    TS_ARG(out, "avgpool2d: NULL out");
    if (ts__any_half(x, NULL)) return ts__half_op(avg_thunk, x, NULL, &(avg_args){.kind = 0, .p = p}, out);
    ts_pool2d_geom g;
    TS_TRY(pool_setup("avgpool2d", x, &p, false, &g));
    TS_TRY(avgpool_run("avgpool2d", x, &g, out));
    return trace_unary(TS_OP_AVGPOOL2D, x, out, &(ts__trace_attrs){.i = {
        p.kernel[0], p.kernel[1], p.stride[0], p.stride[1], p.padding[0], p.padding[1], 1, 1, p.ceil_mode,
        p.exclude_pad}});
}

ts_status ts_global_avgpool2d(const ts_tensor *x, ts_tensor **out) {
    TS_ARG(out, "global_avgpool2d: NULL out");
    if (ts__any_half(x, NULL)) return ts__half_op(avg_thunk, x, NULL, &(avg_args){.kind = 1}, out);
    TS_TRY(ts__check_f32("global_avgpool2d", "input", x));
    TS_TRY(ts__check_ndim("global_avgpool2d", "input", x, 4));
    if (x->shape[2] < 1 || x->shape[3] < 1 || x->shape[2] > INT32_MAX || x->shape[3] > INT32_MAX) {
        char xs[96];
        return ts_error(TS_ERR_SHAPE, "global_avgpool2d: input %s has an empty or oversized plane",
                        ts_shape_str(4, x->shape, xs, sizeof xs));
    }
    /* one window covering the whole plane */
    ts_pool2d_geom g = {
        .N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3], .OH = 1, .OW = 1,
        .kh = (int)x->shape[2], .kw = (int)x->shape[3], .sh = (int)x->shape[2], .sw = (int)x->shape[3],
        .dh = 1, .dw = 1,
    };
    TS_TRY(avgpool_run("global_avgpool2d", x, &g, out));
    return trace_unary(TS_OP_GLOBAL_AVGPOOL2D, x, out, NULL);
}

/* ---- adaptive average pooling ------------------------------------------------------------------------- */
/* p.i[0..4] = P (planes), H, W, OH, OW */
static ts_status adaptive_avgpool2d_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    const int64_t *v = n->p.i;
    ts_tensor *g = NULL;
    TS_TRY(ts__contiguous(g_in, &g));
    ts_device *d = g->storage->device;
    ts_status st = ts__new(d, TS_F32, n->in_ndim[0], n->in_shape[0], &gin[0]);
    if (st == TS_OK) st = d->k_spatial->adaptive_avgpool2d_backward(gin[0], g, v[0], v[1], v[2], v[3], v[4]);
    ts_tensor_release(g);
    return st;
}

ts_status ts_adaptive_avgpool2d(const ts_tensor *x_in, int out_h, int out_w, ts_tensor **out) {
    TS_ARG(out, "adaptive_avgpool2d: NULL out");
    if (ts__any_half(x_in, NULL))
        return ts__half_op(avg_thunk, x_in, NULL, &(avg_args){.kind = 2, .oh = out_h, .ow = out_w}, out);
    TS_TRY(ts__check_f32("adaptive_avgpool2d", "input", x_in));
    char xs[96];
    int nd = x_in->ndim;
    if (nd != 3 && nd != 4)
        return ts_error(TS_ERR_SHAPE, "adaptive_avgpool2d: input %s must be (N, C, H, W) or (C, H, W)",
                        ts_shape_str(nd, x_in->shape, xs, sizeof xs));
    if (out_h < 1 || out_w < 1)
        return ts_error(TS_ERR_INVALID_ARG, "adaptive_avgpool2d: output size (%d, %d) must be positive", out_h, out_w);
    int64_t H = x_in->shape[nd - 2], W = x_in->shape[nd - 1], P = ts__numel(nd - 2, x_in->shape);
    if (H < 1 || W < 1)
        return ts_error(TS_ERR_SHAPE, "adaptive_avgpool2d: input %s has an empty plane",
                        ts_shape_str(nd, x_in->shape, xs, sizeof xs));
    int64_t shape[4];
    memcpy(shape, x_in->shape, sizeof(int64_t) * (size_t)nd);
    shape[nd - 2] = out_h;
    shape[nd - 1] = out_w;
    ts_status st;
    ts_tensor *x = NULL, *o = NULL;
    TS_CHECK_GOTO(ts__contiguous(x_in, &x));
    ts_device *d = x->storage->device;
    TS_CHECK_GOTO(ts__new(d, TS_F32, nd, shape, &o));
    TS_CHECK_GOTO(d->k_spatial->adaptive_avgpool2d(o, x, P, H, W, out_h, out_w));
    ts_node *n = NULL;
    TS_CHECK_GOTO(ts__node_new("adaptive_avgpool2d", adaptive_avgpool2d_backward, 1, &x_in, &n));
    if (n) {
        const int64_t v[] = {P, H, W, out_h, out_w};
        memcpy(n->p.i, v, sizeof v);
        TS_CHECK_GOTO(ts__node_attach(n, o));
    }
    TS_CHECK_GOTO(ts__trace_op(TS_OP_ADAPTIVE_AVGPOOL2D, 1, &x_in, o, &(ts__trace_attrs){.i = {out_h, out_w}}));
    *out = o;
    o = NULL;
fail:
    ts_tensor_release(x);
    ts_tensor_release(o);
    return st;
}
