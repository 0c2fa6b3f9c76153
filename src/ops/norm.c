/*
 * ops/norm.c — batchnorm2d. Training normalises with the batch statistics
 * (biased variance) and updates the running statistics in place with the
 * unbiased variance, as PyTorch does; eval normalises with the running
 * statistics. The node saves x, the mean and invstd used and the weight.
 */
#include "autograd/autograd.h"
#include "tensor/tensor.h"
#include "device/k_ew.h"
#include "device/k_spatial.h"
#include "ops/trace.h"
#include "tessera/ops.h"

#include <math.h>

/* A (C) parameter or statistic: F32, contiguous, on x's device. */
static ts_status check_vec(const char *arg, const ts_tensor *t, const ts_tensor *x) {
    TS_TRY(ts__check_f32("batchnorm2d", arg, t));
    TS_TRY(ts__check_same_device("batchnorm2d", x, t));
    char ts[64], xs[96];
    if (t->ndim != 1 || t->shape[0] != x->shape[1])
        return ts_error(TS_ERR_SHAPE, "batchnorm2d: %s %s does not fit input %s (%lld channels)", arg,
                        ts_shape_str(t->ndim, t->shape, ts, sizeof ts), ts_shape_str(4, x->shape, xs, sizeof xs),
                        (long long)x->shape[1]);
    return TS_OK;
}

static ts_status batchnorm2d_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    const ts_tensor *x = ts__node_saved(n, 0), *mean = ts__node_saved(n, 1), *invstd = ts__node_saved(n, 2),
                    *w = ts__node_saved(n, 3);
    ts_device *d = x->storage->device;
    ts_tensor *g = NULL;
    TS_TRY(ts__contiguous(g_in, &g));
    ts_status st;
    if (n->needs[0]) TS_CHECK_GOTO(ts__new_like(x, &gin[0]));
    if (n->needs[1]) TS_CHECK_GOTO(ts__new_like(mean, &gin[1]));
    if (n->needs[2]) TS_CHECK_GOTO(ts__new_like(mean, &gin[2]));
    TS_CHECK_GOTO(d->k_spatial->batchnorm2d_backward(g, x, mean, invstd, w, n->p.i[0] != 0, gin[0], gin[1], gin[2]));
fail:
    ts_tensor_release(g);
    return st;
}

ts_status ts_batchnorm2d(const ts_tensor *x_in, const ts_tensor *weight, const ts_tensor *bias,
                         ts_tensor *running_mean, ts_tensor *running_var, bool training, float momentum, float eps,
                         ts_tensor **out) {
    TS_ARG(out, "batchnorm2d: NULL out");
    TS_TRY(ts__check_f32("batchnorm2d", "input", x_in));
    TS_TRY(ts__check_ndim("batchnorm2d", "input", x_in, 4));
    if (weight) TS_TRY(check_vec("weight", weight, x_in));
    if (bias) TS_TRY(check_vec("bias", bias, x_in));
    if (running_mean) TS_TRY(check_vec("running_mean", running_mean, x_in));
    if (running_var) TS_TRY(check_vec("running_var", running_var, x_in));
    TS_ARG(!running_mean == !running_var, "batchnorm2d: give both running_mean and running_var, or neither");
    TS_ARG((running_mean == NULL || ts_tensor_is_contiguous(running_mean)) &&
               (running_var == NULL || ts_tensor_is_contiguous(running_var)),
           "batchnorm2d: running statistics must be contiguous (they are updated in place)");
    TS_ARG(training || running_mean, "batchnorm2d: eval mode needs running_mean and running_var");
    TS_ARG(eps >= 0 && isfinite(eps), "batchnorm2d: eps %g must be >= 0", (double)eps);
    const int64_t C = x_in->shape[1];
    if (training && x_in->shape[0] * x_in->shape[2] * x_in->shape[3] <= 1) {
        char xs[96];
        return ts_error(TS_ERR_SHAPE, "batchnorm2d: input %s: expected more than 1 value per channel when training",
                        ts_shape_str(4, x_in->shape, xs, sizeof xs));
    }
    ts_status st;
    ts_tensor *x = NULL, *w = NULL, *b = NULL, *mean = NULL, *invstd = NULL, *o = NULL;
    TS_CHECK_GOTO(ts__contiguous(x_in, &x));
    if (weight) TS_CHECK_GOTO(ts__contiguous(weight, &w));
    if (bias) TS_CHECK_GOTO(ts__contiguous(bias, &b));
    ts_device *d = x->storage->device;
    TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &C, &mean));
    TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &C, &invstd));
    if (training) {
        TS_CHECK_GOTO(d->k_spatial->batchnorm2d_stats(x, eps, momentum, mean, invstd, running_mean, running_var));
    } else {
        /* a private copy: the caller may change the running statistics before backward */
        TS_CHECK_GOTO(d->k_ew->copy(mean, running_mean));
        TS_CHECK_GOTO(d->k_spatial->batchnorm2d_invstd(running_var, eps, invstd));
    }
    TS_CHECK_GOTO(ts__new_like(x, &o));
    TS_CHECK_GOTO(d->k_spatial->batchnorm2d_apply(o, x, mean, invstd, w, b));
    const ts_tensor *in[3] = {x_in, weight, bias};
    ts_node *n = NULL;
    TS_CHECK_GOTO(ts__node_new("batchnorm2d", batchnorm2d_backward, 3, in, &n));
    if (n) {
        ts__node_save(n, x);
        ts__node_save(n, mean);
        ts__node_save(n, invstd);
        ts__node_save(n, w);
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
    ts_tensor_release(invstd);
    ts_tensor_release(o);
    return st;
}
