/*
 * ops/norm.c — batchnorm2d and batchnorm1d, layer_norm and group_norm.
 *
 * batchnorm2d: training normalises with the batch statistics (biased variance)
 * and updates the running statistics in place with the unbiased variance, as
 * PyTorch does; eval normalises with the running statistics. The node saves x,
 * the mean and invstd used, the weight and, in training, the mean's residual
 * (mres: the double mean minus the float one; see device/k_spatial.h). batchnorm1d is batchnorm2d on the
 * view (N, C, L, 1) of its (N, C) or (N, C, L) input: the statistics run over
 * the same N*L elements per channel, so the result is PyTorch's BatchNorm1d.
 *
 * layer_norm and group_norm normalise each row (the last k dims; a group of
 * C/G channels of one sample) by its own statistics, then apply a per-element
 * (layer_norm) or per-channel (group_norm) affine: one kernel pair (k_norm.h)
 * with the geometry saying which. Their nodes save x, the rows' mean and
 * invstd, the weight and the means' residuals.
 */
#include "autograd/autograd.h"
#include "ops/half.h"
#include "tensor/tensor.h"
#include "device/k_ew.h"
#include "device/k_norm.h"
#include "device/k_spatial.h"
#include "ops/trace.h"
#include "tessera/ops.h"

#include <math.h>

/* A (C) parameter or statistic: F32, contiguous, on x's device. */
static ts_status check_vec(const char *op, const char *arg, const ts_tensor *t, const ts_tensor *x) {
    TS_TRY(ts__check_f32(op, arg, t));
    TS_TRY(ts__check_same_device(op, x, t));
    char ts[64], xs[96];
    if (t->ndim != 1 || t->shape[0] != x->shape[1])
        return ts_error(TS_ERR_SHAPE, "%s: %s %s does not fit input %s (%lld channels)", op, arg,
                        ts_shape_str(t->ndim, t->shape, ts, sizeof ts), ts_shape_str(x->ndim, x->shape, xs, sizeof xs),
                        (long long)x->shape[1]);
    return TS_OK;
}

static ts_status batchnorm2d_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    const ts_tensor *x = ts__node_saved(n, 0), *mean = ts__node_saved(n, 1), *invstd = ts__node_saved(n, 2),
                    *w = ts__node_saved(n, 3), *mres = ts__node_saved(n, 4);
    ts_device *d = x->storage->device;
    if (g_in->dtype != x->dtype)
        return ts_error(TS_ERR_DTYPE, "batchnorm2d backward: a %s gradient for a %s output", ts_dtype_name(g_in->dtype),
                        ts_dtype_name(x->dtype));
    ts_tensor *g = NULL;
    TS_TRY(ts__contiguous(g_in, &g));
    ts_status st;
    if (n->needs[0]) TS_CHECK_GOTO(ts__new_like(x, &gin[0]));
    if (n->needs[1]) TS_CHECK_GOTO(ts__new_like(mean, &gin[1]));
    if (n->needs[2]) TS_CHECK_GOTO(ts__new_like(mean, &gin[2]));
    TS_CHECK_GOTO(
        d->k_spatial->batchnorm2d_backward(g, x, mean, mres, invstd, w, n->p.i[0] != 0, gin[0], gin[1], gin[2]));
fail:
    ts_tensor_release(g);
    return st;
}

/* The batchnorm family's argument checks: x is (N, C, ...) with ndim already checked. */
static ts_status batchnorm_check(const char *op, const ts_tensor *x_in, const ts_tensor *weight, const ts_tensor *bias,
                                 const ts_tensor *running_mean, const ts_tensor *running_var, bool training, float eps) {
    if (weight) TS_TRY(check_vec(op, "weight", weight, x_in));
    if (bias) TS_TRY(check_vec(op, "bias", bias, x_in));
    if (running_mean) TS_TRY(check_vec(op, "running_mean", running_mean, x_in));
    if (running_var) TS_TRY(check_vec(op, "running_var", running_var, x_in));
    TS_ARG(!running_mean == !running_var, "%s: give both running_mean and running_var, or neither", op);
    TS_ARG((running_mean == NULL || ts_tensor_is_contiguous(running_mean)) &&
               (running_var == NULL || ts_tensor_is_contiguous(running_var)),
           "%s: running statistics must be contiguous (they are updated in place)", op);
    TS_ARG(training || running_mean, "%s: eval mode needs running_mean and running_var", op);
    TS_ARG(eps >= 0 && isfinite(eps), "%s: eps %g must be >= 0", op, (double)eps);
    if (training && ts_tensor_numel(x_in) / (x_in->shape[1] ? x_in->shape[1] : 1) <= 1) {
        char xs[96];
        return ts_error(TS_ERR_SHAPE, "%s: input %s: expected more than 1 value per channel when training", op,
                        ts_shape_str(x_in->ndim, x_in->shape, xs, sizeof xs));
    }
    return TS_OK;
}

/* batchnorm on a checked (N, C, H, W) input */
static ts_status batchnorm_run(const ts_tensor *x_in, const ts_tensor *weight, const ts_tensor *bias,
                               ts_tensor *running_mean, ts_tensor *running_var, bool training, float momentum,
                               float eps, ts_tensor **out) {
    const int64_t C = x_in->shape[1];
    ts_status st;
    ts_tensor *x = NULL, *w = NULL, *b = NULL, *mean = NULL, *mres = NULL, *invstd = NULL, *o = NULL;
    TS_CHECK_GOTO(ts__contiguous(x_in, &x));
    if (weight) TS_CHECK_GOTO(ts__contiguous(weight, &w));
    if (bias) TS_CHECK_GOTO(ts__contiguous(bias, &b));
    ts_device *d = x->storage->device;
    TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &C, &mean));
    TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &C, &invstd));
    if (training) {
        TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &C, &mres));
        TS_CHECK_GOTO(
            d->k_spatial->batchnorm2d_stats(x, eps, momentum, mean, mres, invstd, running_mean, running_var));
    } else {
        /* a private copy: the caller may change the running statistics before backward */
        TS_CHECK_GOTO(d->k_ew->copy(mean, running_mean));
        TS_CHECK_GOTO(d->k_spatial->batchnorm2d_invstd(running_var, eps, invstd));
    }
    TS_CHECK_GOTO(ts__new_like(x, &o));
    TS_CHECK_GOTO(d->k_spatial->batchnorm2d_apply(o, x, mean, mres, invstd, w, b));
    const ts_tensor *in[3] = {x_in, weight, bias};
    ts_node *n = NULL;
    TS_CHECK_GOTO(ts__node_new("batchnorm2d", batchnorm2d_backward, 3, in, &n));
    if (n) {
        ts__node_save(n, x);
        ts__node_save(n, mean);
        ts__node_save(n, invstd);
        ts__node_save(n, w);
        ts__node_save(n, mres);
        n->p.i[0] = training;
        TS_CHECK_GOTO(ts__node_attach(n, o));
    }
    const ts_tensor *tin[5] = {x_in, weight, bias, running_mean, running_var};
    TS_CHECK_GOTO(ts__trace_op(TS_OP_BATCHNORM2D, 5, tin, o, &(ts__trace_attrs){.i = {training}, .f = {eps}}));
    *out = o;
    o = NULL;
fail:
    ts_tensor_release(x);
    ts_tensor_release(w);
    ts_tensor_release(b);
    ts_tensor_release(mean);
    ts_tensor_release(mres);
    ts_tensor_release(invstd);
    ts_tensor_release(o);
    return st;
}

typedef struct bn_args {
    bool one_d; /* batchnorm1d */
    const ts_tensor *weight, *bias;
    ts_tensor *running_mean, *running_var;
    bool training;
    float momentum, eps;
} bn_args;
static ts_status bn_thunk(const ts_tensor *x, const ts_tensor *b, const void *arg, ts_tensor **out) {
    const bn_args *a = arg;
    (void)b;
    return (a->one_d ? ts_batchnorm1d : ts_batchnorm2d)(x, a->weight, a->bias, a->running_mean, a->running_var,
                                                         a->training, a->momentum, a->eps, out);
}

/* A bfloat16 input stays bfloat16 where the device's kernels take it (statistics, weight, bias and their
 * gradients float32, as PyTorch's mixed-type BatchNorm under autocast); other 16-bit inputs run on a float32
 * copy, the output rounded to the input's dtype. */
ts_status ts_batchnorm2d(const ts_tensor *x, const ts_tensor *weight, const ts_tensor *bias,
                         ts_tensor *running_mean, ts_tensor *running_var, bool training, float momentum, float eps,
                         ts_tensor **out) {
    TS_ARG(x && out, "batchnorm2d: NULL argument");
    const bool native = ts__bf16_kept(x);
    if (ts__any_half(x, NULL) && !native)
        return ts__half_op(bn_thunk, x, NULL,
                           &(bn_args){false, weight, bias, running_mean, running_var, training, momentum, eps}, out);
    if (!native) TS_TRY(ts__check_f32("batchnorm2d", "input", x));
    TS_TRY(ts__check_ndim("batchnorm2d", "input", x, 4));
    TS_TRY(batchnorm_check("batchnorm2d", x, weight, bias, running_mean, running_var, training, eps));
    return batchnorm_run(x, weight, bias, running_mean, running_var, training, momentum, eps, out);
}

/* 16-bit inputs as batchnorm2d's */
ts_status ts_batchnorm1d(const ts_tensor *x, const ts_tensor *weight, const ts_tensor *bias,
                         ts_tensor *running_mean, ts_tensor *running_var, bool training, float momentum, float eps,
                         ts_tensor **out) {
    TS_ARG(x && out, "batchnorm1d: NULL argument");
    const bool native = ts__bf16_kept(x);
    if (ts__any_half(x, NULL) && !native)
        return ts__half_op(bn_thunk, x, NULL,
                           &(bn_args){true, weight, bias, running_mean, running_var, training, momentum, eps}, out);
    if (!native) TS_TRY(ts__check_f32("batchnorm1d", "input", x));
    if (x->ndim != 2 && x->ndim != 3) {
        char xs[96];
        return ts_error(TS_ERR_SHAPE, "batchnorm1d: input %s must be (N, C) or (N, C, L)",
                        ts_shape_str(x->ndim, x->shape, xs, sizeof xs));
    }
    TS_TRY(batchnorm_check("batchnorm1d", x, weight, bias, running_mean, running_var, training, eps));
    /* (N, C[, L]) -> (N, C, L, 1): recorded reshapes, so gradients flow through the views */
    const int64_t shape4[4] = {x->shape[0], x->shape[1], x->ndim == 3 ? x->shape[2] : 1, 1};
    ts_tensor *x4 = NULL, *y4 = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts_reshape(x, 4, shape4, &x4));
    TS_CHECK_GOTO(batchnorm_run(x4, weight, bias, running_mean, running_var, training, momentum, eps, &y4));
    TS_CHECK_GOTO(ts_reshape(y4, x->ndim, x->shape, out));
fail:
    ts_tensor_release(x4);
    ts_tensor_release(y4);
    return st;
}

/* ---- layer_norm and group_norm ------------------------------------------------------------------ */
/* saved: x, mean (R), invstd (R), weight (or NULL), mres (R); p.i[0..3] = the geometry */
static ts_status row_norm_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    const ts_tensor *x = ts__node_saved(n, 0), *mean = ts__node_saved(n, 1), *invstd = ts__node_saved(n, 2),
                    *w = ts__node_saved(n, 3), *mres = ts__node_saved(n, 4);
    const ts_norm_geom geom = {n->p.i[0], n->p.i[1], n->p.i[2], n->p.i[3]};
    ts_device *d = x->storage->device;
    ts_tensor *g = NULL, *gw = NULL, *gb = NULL;
    TS_TRY(ts__contiguous(g_in, &g));
    ts_status st;
    const int64_t P = geom.G * geom.Cg;
    if (n->needs[0]) TS_CHECK_GOTO(ts__new_like(x, &gin[0]));
    /* the kernel writes (P) gradients; the op's weight and bias may have the shape of several dims */
    if (n->needs[1]) TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &P, &gw));
    if (n->needs[2]) TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &P, &gb));
    TS_CHECK_GOTO(d->k_norm->group_norm_backward(&geom, g, x, mean, mres, invstd, w, gin[0], gw, gb));
    if (gw) TS_CHECK_GOTO(ts__view(gw, n->in_ndim[1], n->in_shape[1], &gin[1]));
    if (gb) TS_CHECK_GOTO(ts__view(gb, n->in_ndim[2], n->in_shape[2], &gin[2]));
fail:
    ts_tensor_release(g);
    ts_tensor_release(gw);
    ts_tensor_release(gb);
    return st;
}

/* Runs the row normalisation of x (checked) with weight/bias (checked, P elements or NULL). */
static ts_status row_norm_run(const char *op, const ts_tensor *x_in, const ts_norm_geom *geom, const ts_tensor *weight,
                              const ts_tensor *bias, float eps, ts_tensor **out) {
    ts_status st;
    ts_tensor *x = NULL, *w = NULL, *b = NULL, *mean = NULL, *mres = NULL, *invstd = NULL, *o = NULL;
    TS_CHECK_GOTO(ts__contiguous(x_in, &x));
    if (weight) TS_CHECK_GOTO(ts__contiguous(weight, &w));
    if (bias) TS_CHECK_GOTO(ts__contiguous(bias, &b));
    ts_device *d = x->storage->device;
    TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &geom->R, &mean));
    TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &geom->R, &mres));
    TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &geom->R, &invstd));
    TS_CHECK_GOTO(ts__new_like(x, &o));
    TS_CHECK_GOTO(d->k_norm->group_norm(geom, o, mean, mres, invstd, x, w, b, eps));
    const ts_tensor *in[3] = {x_in, weight, bias};
    ts_node *n = NULL;
    TS_CHECK_GOTO(ts__node_new(op, row_norm_backward, 3, in, &n));
    if (n) {
        ts__node_save(n, x);
        ts__node_save(n, mean);
        ts__node_save(n, invstd);
        ts__node_save(n, w);
        ts__node_save(n, mres);
        n->p.i[0] = geom->R;
        n->p.i[1] = geom->G;
        n->p.i[2] = geom->Cg;
        n->p.i[3] = geom->S;
        TS_CHECK_GOTO(ts__node_attach(n, o));
    }
    *out = o;
    o = NULL;
fail:
    ts_tensor_release(x);
    ts_tensor_release(w);
    ts_tensor_release(b);
    ts_tensor_release(mean);
    ts_tensor_release(mres);
    ts_tensor_release(invstd);
    ts_tensor_release(o);
    return st;
}

/* layer_norm's weight/bias: F32 on x's device, shaped like the last k dims of x. */
static ts_status check_ln_param(const char *arg, const ts_tensor *t, const ts_tensor *x, int k) {
    TS_TRY(ts__check_f32("layer_norm", arg, t));
    TS_TRY(ts__check_same_device("layer_norm", x, t));
    bool ok = t->ndim == k;
    for (int i = 0; ok && i < k; i++) ok = t->shape[i] == x->shape[x->ndim - k + i];
    if (!ok) {
        char ts[96], xs[96], ns[96];
        return ts_error(TS_ERR_SHAPE, "layer_norm: %s %s does not fit input %s (expected the normalized shape %s)",
                        arg, ts_shape_str(t->ndim, t->shape, ts, sizeof ts),
                        ts_shape_str(x->ndim, x->shape, xs, sizeof xs),
                        ts_shape_str(k, x->shape + x->ndim - k, ns, sizeof ns));
    }
    return TS_OK;
}

/* Reports a layer_norm / group_norm to the tracer; on failure releases *out. */
static ts_status trace_norm(ts__op_kind k, const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, int64_t i0,
                            float eps, ts_tensor **out) {
    const ts_tensor *in[3] = {x, w, b};
    ts_status st = ts__trace_op(k, 3, in, *out, &(ts__trace_attrs){.i = {i0}, .f = {eps}});
    if (st != TS_OK) {
        ts_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

/* layer_norm and group_norm on 16-bit inputs: a float32 copy, the output rounded to the input's dtype */
typedef struct rown_args {
    int k; /* layer_norm's normalized_ndim, or -group count for group_norm */
    const ts_tensor *weight, *bias;
    float eps;
} rown_args;
static ts_status rown_thunk(const ts_tensor *x, const ts_tensor *b, const void *arg, ts_tensor **out) {
    const rown_args *a = arg;
    (void)b;
    return a->k > 0 ? ts_layer_norm(x, a->k, a->weight, a->bias, a->eps, out)
                    : ts_group_norm(x, -a->k, a->weight, a->bias, a->eps, out);
}

ts_status ts_layer_norm(const ts_tensor *x, int normalized_ndim, const ts_tensor *weight, const ts_tensor *bias,
                        float eps, ts_tensor **out) {
    TS_ARG(out, "layer_norm: NULL out");
    if (ts__any_half(x, NULL) && normalized_ndim > 0)
        return ts__half_op(rown_thunk, x, NULL, &(rown_args){normalized_ndim, weight, bias, eps}, out);
    TS_TRY(ts__check_f32("layer_norm", "input", x));
    const int k = normalized_ndim;
    if (k < 1 || k > x->ndim) {
        char xs[96];
        return ts_error(TS_ERR_INVALID_ARG, "layer_norm: normalized_ndim %d is out of range [1, %d] for input %s", k,
                        x->ndim, ts_shape_str(x->ndim, x->shape, xs, sizeof xs));
    }
    if (weight) TS_TRY(check_ln_param("weight", weight, x, k));
    if (bias) TS_TRY(check_ln_param("bias", bias, x, k));
    TS_ARG(eps >= 0 && isfinite(eps), "layer_norm: eps %g must be >= 0", (double)eps);
    const int64_t D = ts__numel(k, x->shape + x->ndim - k);
    const ts_norm_geom geom = {D ? ts_tensor_numel(x) / D : 0, 1, D, 1};
    TS_TRY(row_norm_run("layer_norm", x, &geom, weight, bias, eps, out));
    return trace_norm(TS_OP_LAYER_NORM, x, weight, bias, k, eps, out);
}

ts_status ts_group_norm(const ts_tensor *x, int num_groups, const ts_tensor *weight, const ts_tensor *bias, float eps,
                        ts_tensor **out) {
    TS_ARG(out, "group_norm: NULL out");
    if (ts__any_half(x, NULL) && num_groups > 0)
        return ts__half_op(rown_thunk, x, NULL, &(rown_args){-num_groups, weight, bias, eps}, out);
    TS_TRY(ts__check_f32("group_norm", "input", x));
    char xs[96];
    if (x->ndim < 2)
        return ts_error(TS_ERR_SHAPE, "group_norm: input %s must be (N, C, *)",
                        ts_shape_str(x->ndim, x->shape, xs, sizeof xs));
    const int64_t C = x->shape[1];
    if (num_groups < 1 || C % num_groups != 0)
        return ts_error(TS_ERR_INVALID_ARG, "group_norm: num_groups %d must be >= 1 and divide the %lld channels of "
                        "input %s", num_groups, (long long)C, ts_shape_str(x->ndim, x->shape, xs, sizeof xs));
    if (weight) TS_TRY(check_vec("group_norm", "weight", weight, x));
    if (bias) TS_TRY(check_vec("group_norm", "bias", bias, x));
    TS_ARG(eps >= 0 && isfinite(eps), "group_norm: eps %g must be >= 0", (double)eps);
    const ts_norm_geom geom = {x->shape[0] * num_groups, num_groups, C / num_groups,
                               ts__numel(x->ndim - 2, x->shape + 2)};
    TS_TRY(row_norm_run("group_norm", x, &geom, weight, bias, eps, out));
    return trace_norm(TS_OP_GROUP_NORM, x, weight, bias, num_groups, eps, out);
}
