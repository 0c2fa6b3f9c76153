/*
 * nn/layers.c — the leaf layers: Linear, Conv2d, BatchNorm2d, BatchNorm1d,
 * LayerNorm, GroupNorm, ReLU, MaxPool2d, AvgPool2d, GlobalAvgPool2d, Flatten,
 * Dropout, Embedding. Each is a thin
 * module over one op of tessera/ops.h, with PyTorch's default initialisation,
 * and keeps the arguments it was built with in its impl, read by its typed
 * accessor (ts_conv2d_get_config, ...). Also the BatchNorm family's owner
 * hooks: the argument checks and the in-place conversion to SyncBatchNorm.
 */
#include "nn/module.h"

#include <math.h>

/* Moves *t (owned, may be NULL) into m's next parameter or buffer slot; *t is NULL afterwards. */
static ts_status give_param(ts_module *m, const char *name, ts_tensor **t) {
    ts_tensor *v = *t;
    *t = NULL;
    return ts__module_add_param(m, name, v);
}
static ts_status give_buffer(ts_module *m, const char *name, ts_tensor **t) {
    ts_tensor *v = *t;
    *t = NULL;
    return ts__module_add_buffer(m, name, v);
}

/* TS_OK when m is of kind a or b; else TS_ERR_INVALID_ARG naming fn, what it
 * expects (want) and m's actual type. */
static ts_status expect_kind(const ts_module *m, const char *fn, ts_module_kind_id a, ts_module_kind_id b,
                             const char *want) {
    if (!m) return ts_error(TS_ERR_INVALID_ARG, "%s: NULL module", fn);
    ts_module_kind_id k = ts_module_kind(m);
    if (k != a && k != b)
        return ts_error(TS_ERR_INVALID_ARG, "%s: expected %s, got a %s", fn, want, ts_module_type_name(m));
    return TS_OK;
}

/* ---- Linear ------------------------------------------------------------------------------- */
/* x: (N, in), weight: (out, in), bias: (out) -> (N, out) */
typedef struct linear_impl {
    int64_t in, out;
    bool bias;
} linear_impl;

static ts_status linear_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    return ts_linear(x, m->params[0], m->params[1], out);
}
static const ts_module_vt linear_vt = {.name = "Linear", .kind = TS_MODULE_LINEAR, .forward = linear_forward};

ts_status ts_nn_linear_new(int64_t in_features, int64_t out_features, bool bias, ts_rng *rng, ts_module **out) {
    TS_ARG(out, "ts_nn_linear_new: NULL out");
    TS_ARG(in_features > 0 && out_features > 0, "ts_nn_linear_new: bad sizes in=%lld out=%lld",
           (long long)in_features, (long long)out_features);
    ts_module *m = NULL;
    ts_tensor *w = NULL, *b = NULL;
    double bound = 1.0 / sqrt((double)in_features);
    ts_status st;
    TS_CHECK_GOTO(ts__module_new(&linear_vt, sizeof(linear_impl), &m));
    *(linear_impl *)m->impl = (linear_impl){in_features, out_features, bias};
    TS_CHECK_GOTO(ts__param_uniform(2, (int64_t[]){out_features, in_features}, bound, rng, &w));
    if (bias) TS_CHECK_GOTO(ts__param_uniform(1, &out_features, bound, rng, &b));
    TS_CHECK_GOTO(give_param(m, "weight", &w));
    TS_CHECK_GOTO(give_param(m, "bias", &b));
    *out = m;
    return TS_OK;
fail:
    ts_tensor_release(w);
    ts_tensor_release(b);
    ts_module_free(m);
    return st;
}

ts_status ts_linear_get_config(const ts_module *m, int64_t *in_features, int64_t *out_features, bool *bias) {
    TS_TRY(expect_kind(m, "ts_linear_get_config", TS_MODULE_LINEAR, TS_MODULE_LINEAR, "a Linear"));
    const linear_impl *c = m->impl;
    if (in_features) *in_features = c->in;
    if (out_features) *out_features = c->out;
    if (bias) *bias = c->bias;
    return TS_OK;
}

/* ---- Conv2d -------------------------------------------------------------------------------- */
/* x: (N, C_in, H, W), weight: (C_out, C_in/groups, kH, kW), bias: (C_out) -> (N, C_out, H_out, W_out) */
typedef struct conv2d_impl {
    ts_conv2d_params p;
    int64_t in, out;
    int kh, kw;
    bool bias;
} conv2d_impl;

static ts_status conv2d_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    const conv2d_impl *c = m->impl;
    return ts_conv2d(x, m->params[0], m->params[1], c->p, out);
}
static const ts_module_vt conv2d_vt = {.name = "Conv2d", .kind = TS_MODULE_CONV2D, .forward = conv2d_forward};

ts_status ts_nn_conv2d_new(int64_t in_channels, int64_t out_channels, int kh, int kw, ts_conv2d_params p, bool bias,
                           ts_rng *rng, ts_module **out) {
    TS_ARG(out, "ts_nn_conv2d_new: NULL out");
    TS_ARG(in_channels > 0 && out_channels > 0 && kh > 0 && kw > 0, "ts_nn_conv2d_new: bad sizes");
    TS_ARG(p.groups >= 1 && in_channels % p.groups == 0 && out_channels % p.groups == 0,
           "ts_nn_conv2d_new: groups %d must divide in_channels %lld and out_channels %lld", p.groups,
           (long long)in_channels, (long long)out_channels);
    TS_ARG(p.stride[0] >= 1 && p.stride[1] >= 1 && p.dilation[0] >= 1 && p.dilation[1] >= 1 && p.padding[0] >= 0 &&
               p.padding[1] >= 0,
           "ts_nn_conv2d_new: stride and dilation must be >= 1, padding >= 0");
    ts_module *m = NULL;
    ts_tensor *w = NULL, *b = NULL;
    int64_t cin_g = in_channels / p.groups;
    double bound = 1.0 / sqrt((double)(cin_g * kh * kw)); /* fan_in = C_in/groups * kH * kW */
    ts_status st;
    TS_CHECK_GOTO(ts__module_new(&conv2d_vt, sizeof(conv2d_impl), &m));
    *(conv2d_impl *)m->impl = (conv2d_impl){p, in_channels, out_channels, kh, kw, bias};
    TS_CHECK_GOTO(ts__param_uniform(4, (int64_t[]){out_channels, cin_g, kh, kw}, bound, rng, &w));
    if (bias) TS_CHECK_GOTO(ts__param_uniform(1, &out_channels, bound, rng, &b));
    TS_CHECK_GOTO(give_param(m, "weight", &w));
    TS_CHECK_GOTO(give_param(m, "bias", &b));
    *out = m;
    return TS_OK;
fail:
    ts_tensor_release(w);
    ts_tensor_release(b);
    ts_module_free(m);
    return st;
}

ts_status ts_conv2d_get_config(const ts_module *m, int64_t *in_channels, int64_t *out_channels, int *kh, int *kw,
                               ts_conv2d_params *params, bool *bias) {
    TS_TRY(expect_kind(m, "ts_conv2d_get_config", TS_MODULE_CONV2D, TS_MODULE_CONV2D, "a Conv2d"));
    const conv2d_impl *c = m->impl;
    if (in_channels) *in_channels = c->in;
    if (out_channels) *out_channels = c->out;
    if (kh) *kh = c->kh;
    if (kw) *kw = c->kw;
    if (params) *params = c->p;
    if (bias) *bias = c->bias;
    return TS_OK;
}

/* ---- BatchNorm2d ------------------------------------------------------------------------------ */
/* impl: a ts__bn_config (nn/module.h), also the head of SyncBatchNorm's impl */

/* x: (N, C, H, W) -> (N, C, H, W). Training with tracked stats updates running_mean/var
 * and num_batches_tracked; eval normalises with the running stats; without tracked
 * stats, batch statistics are always used (PyTorch's bn_training). */
static ts_status bn_run(ts_module *m, const ts_tensor *x, bool one_d, ts_tensor **out) {
    const ts__bn_config *c = m->impl;
    ts_tensor *rm = c->track ? m->buffers[0] : NULL, *rv = c->track ? m->buffers[1] : NULL;
    ts_tensor *nbt = c->track ? m->buffers[2] : NULL;
    bool update = m->training && c->track;
    float momentum = c->momentum;
    int64_t count = 0;
    if (update) {
        count = (int64_t)ts_tensor_item(nbt, 0) + 1;
        if (momentum < 0) momentum = 1.0f / (float)count;
    }
    TS_TRY((one_d ? ts_batchnorm1d : ts_batchnorm2d)(x, m->params[0], m->params[1], rm, rv, m->training || !c->track,
                                                      momentum < 0 ? 0 : momentum, c->eps, out));
    if (update) {
        ts_status st = ts_tensor_from_host(nbt, &count, sizeof count);
        if (st != TS_OK) {
            ts_tensor_release(*out);
            *out = NULL;
            return st;
        }
    }
    return TS_OK;
}
static ts_status bn_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) { return bn_run(m, x, false, out); }
static ts_status bn1d_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) { return bn_run(m, x, true, out); }
static const ts_module_vt bn_vt = {.name = "BatchNorm2d", .kind = TS_MODULE_BATCHNORM2D, .forward = bn_forward};
static const ts_module_vt bn1d_vt = {.name = "BatchNorm1d", .kind = TS_MODULE_BATCHNORM1D, .forward = bn1d_forward};

ts_status ts__batchnorm2d_check_args(const char *fn, int64_t num_features, float eps, float momentum) {
    TS_ARG(num_features > 0, "%s: num_features %lld must be > 0", fn, (long long)num_features);
    TS_ARG(eps > 0, "%s: eps %g must be > 0", fn, (double)eps);
    TS_ARG(momentum <= 1, "%s: momentum %g must be <= 1 (< 0: cumulative average)", fn, (double)momentum);
    return TS_OK;
}

/* A BatchNorm of type vt (BatchNorm2d or BatchNorm1d) with PyTorch's initial tensors. */
static ts_status bn_new(const ts_module_vt *vt, const char *fn, int64_t num_features, float eps, float momentum,
                        bool affine, bool track_running_stats, ts_module **out) {
    TS_ARG(out, "%s: NULL out", fn);
    TS_TRY(ts__batchnorm2d_check_args(fn, num_features, eps, momentum));
    ts_module *m = NULL;
    ts_tensor *t[5] = {NULL, NULL, NULL, NULL, NULL}; /* weight, bias, running_mean, running_var, nbt */
    ts_device *cpu = ts_device_cpu();
    ts_status st;
    TS_CHECK_GOTO(ts__module_new(vt, sizeof(ts__bn_config), &m));
    *(ts__bn_config *)m->impl = (ts__bn_config){num_features, eps, momentum, affine, track_running_stats};
    if (affine) {
        TS_CHECK_GOTO(ts_tensor_full(cpu, 1, &num_features, 1.0f, &t[0]));
        TS_CHECK_GOTO(ts_tensor_zeros(cpu, TS_F32, 1, &num_features, &t[1]));
    }
    if (track_running_stats) {
        TS_CHECK_GOTO(ts_tensor_zeros(cpu, TS_F32, 1, &num_features, &t[2]));
        TS_CHECK_GOTO(ts_tensor_full(cpu, 1, &num_features, 1.0f, &t[3]));
        TS_CHECK_GOTO(ts_tensor_zeros(cpu, TS_I64, 0, NULL, &t[4]));
    }
    TS_CHECK_GOTO(give_param(m, "weight", &t[0]));
    TS_CHECK_GOTO(give_param(m, "bias", &t[1]));
    TS_CHECK_GOTO(give_buffer(m, "running_mean", &t[2]));
    TS_CHECK_GOTO(give_buffer(m, "running_var", &t[3]));
    TS_CHECK_GOTO(give_buffer(m, "num_batches_tracked", &t[4]));
    *out = m;
    return TS_OK;
fail:
    for (int i = 0; i < 5; i++) ts_tensor_release(t[i]);
    ts_module_free(m);
    return st;
}

ts_status ts_nn_batchnorm2d_new(int64_t num_features, float eps, float momentum, bool affine, bool track_running_stats,
                                ts_module **out) {
    return bn_new(&bn_vt, "ts_nn_batchnorm2d_new", num_features, eps, momentum, affine, track_running_stats, out);
}

ts_status ts_nn_batchnorm1d_new(int64_t num_features, float eps, float momentum, bool affine, bool track_running_stats,
                                ts_module **out) {
    return bn_new(&bn1d_vt, "ts_nn_batchnorm1d_new", num_features, eps, momentum, affine, track_running_stats, out);
}

static void bn_get_config(const ts_module *m, int64_t *num_features, float *eps, float *momentum, bool *affine,
                          bool *track_running_stats) {
    const ts__bn_config *c = m->impl; /* SyncBatchNorm's impl starts with one too */
    if (num_features) *num_features = c->num_features;
    if (eps) *eps = c->eps;
    if (momentum) *momentum = c->momentum;
    if (affine) *affine = c->affine;
    if (track_running_stats) *track_running_stats = c->track;
}

ts_status ts_batchnorm1d_get_config(const ts_module *m, int64_t *num_features, float *eps, float *momentum,
                                    bool *affine, bool *track_running_stats) {
    TS_TRY(expect_kind(m, "ts_batchnorm1d_get_config", TS_MODULE_BATCHNORM1D, TS_MODULE_BATCHNORM1D, "a BatchNorm1d"));
    bn_get_config(m, num_features, eps, momentum, affine, track_running_stats);
    return TS_OK;
}

ts_status ts_batchnorm2d_get_config(const ts_module *m, int64_t *num_features, float *eps, float *momentum,
                                    bool *affine, bool *track_running_stats) {
    TS_TRY(expect_kind(m, "ts_batchnorm2d_get_config", TS_MODULE_BATCHNORM2D, TS_MODULE_SYNC_BATCHNORM,
                       "a BatchNorm2d or SyncBatchNorm"));
    bn_get_config(m, num_features, eps, momentum, affine, track_running_stats);
    return TS_OK;
}

ts_status ts__batchnorm2d_convert(ts_module *m, const ts_module_vt *vt, void *impl) {
    if (ts_module_kind(m) != TS_MODULE_BATCHNORM1D)
        TS_TRY(expect_kind(m, "convert to SyncBatchNorm", TS_MODULE_BATCHNORM2D, TS_MODULE_BATCHNORM2D,
                           "a BatchNorm2d or BatchNorm1d"));
    TS_ARG(vt && vt->kind == TS_MODULE_SYNC_BATCHNORM && impl,
           "convert BatchNorm: the new type must be of kind SyncBatchNorm, with a configuration");
    *(ts__bn_config *)impl = *(const ts__bn_config *)m->impl;
    if (!m->impl_borrowed) free(m->impl); /* BatchNorm2d has no free_impl */
    m->impl = impl;
    m->impl_borrowed = false;
    m->vt = vt;
    return TS_OK;
}

/* ---- LayerNorm and GroupNorm --------------------------------------------------------------------- */
typedef struct layernorm_impl {
    int ndim;
    int64_t shape[TS_MAX_DIMS];
    float eps;
    bool affine;
} layernorm_impl;

/* x: (*, normalized_shape) -> like x */
static ts_status layernorm_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    const layernorm_impl *c = m->impl;
    TS_ARG(x, "LayerNorm: NULL input");
    bool ok = x->ndim >= c->ndim;
    for (int i = 0; ok && i < c->ndim; i++) ok = x->shape[x->ndim - c->ndim + i] == c->shape[i];
    if (!ok) {
        char xs[96], ns[96];
        return ts_error(TS_ERR_SHAPE, "LayerNorm: input %s does not end in the normalized shape %s",
                        ts_shape_str(x->ndim, x->shape, xs, sizeof xs), ts_shape_str(c->ndim, c->shape, ns, sizeof ns));
    }
    return ts_layer_norm(x, c->ndim, m->params[0], m->params[1], c->eps, out);
}
static const ts_module_vt layernorm_vt = {.name = "LayerNorm", .kind = TS_MODULE_LAYERNORM, .forward = layernorm_forward};

/* weight 1 and bias 0 of the given shape into m's "weight" and "bias" slots (NULL slots when !affine) */
static ts_status norm_affine_params(ts_module *m, bool affine, int ndim, const int64_t *shape) {
    ts_tensor *w = NULL, *b = NULL;
    ts_status st;
    if (affine) {
        TS_CHECK_GOTO(ts_tensor_full(ts_device_cpu(), ndim, shape, 1.0f, &w));
        TS_CHECK_GOTO(ts_tensor_zeros(ts_device_cpu(), TS_F32, ndim, shape, &b));
    }
    TS_CHECK_GOTO(give_param(m, "weight", &w));
    TS_CHECK_GOTO(give_param(m, "bias", &b));
fail:
    ts_tensor_release(w);
    ts_tensor_release(b);
    return st;
}

ts_status ts_nn_layernorm_new(int ndim, const int64_t *normalized_shape, float eps, bool elementwise_affine,
                              ts_module **out) {
    TS_ARG(out, "ts_nn_layernorm_new: NULL out");
    TS_ARG(ndim >= 1 && ndim <= TS_MAX_DIMS && normalized_shape,
           "ts_nn_layernorm_new: normalized_shape must have 1 to %d dims, got %d", TS_MAX_DIMS, ndim);
    for (int i = 0; i < ndim; i++)
        TS_ARG(normalized_shape[i] > 0, "ts_nn_layernorm_new: normalized_shape[%d] = %lld must be > 0", i,
               (long long)normalized_shape[i]);
    TS_ARG(eps > 0 && isfinite(eps), "ts_nn_layernorm_new: eps %g must be > 0", (double)eps);
    ts_module *m = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts__module_new(&layernorm_vt, sizeof(layernorm_impl), &m));
    layernorm_impl *c = m->impl;
    c->ndim = ndim;
    memcpy(c->shape, normalized_shape, sizeof(int64_t) * (size_t)ndim);
    c->eps = eps;
    c->affine = elementwise_affine;
    TS_CHECK_GOTO(norm_affine_params(m, elementwise_affine, ndim, normalized_shape));
    *out = m;
    return TS_OK;
fail:
    ts_module_free(m);
    return st;
}

ts_status ts_layernorm_get_config(const ts_module *m, int *ndim, int64_t *normalized_shape, float *eps,
                                  bool *elementwise_affine) {
    TS_TRY(expect_kind(m, "ts_layernorm_get_config", TS_MODULE_LAYERNORM, TS_MODULE_LAYERNORM, "a LayerNorm"));
    const layernorm_impl *c = m->impl;
    if (ndim) *ndim = c->ndim;
    if (normalized_shape) memcpy(normalized_shape, c->shape, sizeof(int64_t) * (size_t)c->ndim);
    if (eps) *eps = c->eps;
    if (elementwise_affine) *elementwise_affine = c->affine;
    return TS_OK;
}

typedef struct groupnorm_impl {
    int groups;
    int64_t channels;
    float eps;
    bool affine;
} groupnorm_impl;

/* x: (N, C, *) -> like x */
static ts_status groupnorm_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    const groupnorm_impl *c = m->impl;
    TS_ARG(x, "GroupNorm: NULL input");
    if (x->ndim < 2 || x->shape[1] != c->channels) {
        char xs[96];
        return ts_error(TS_ERR_SHAPE, "GroupNorm: input %s is not (N, %lld, *)",
                        ts_shape_str(x->ndim, x->shape, xs, sizeof xs), (long long)c->channels);
    }
    return ts_group_norm(x, c->groups, m->params[0], m->params[1], c->eps, out);
}
static const ts_module_vt groupnorm_vt = {.name = "GroupNorm", .kind = TS_MODULE_GROUPNORM, .forward = groupnorm_forward};

ts_status ts_nn_groupnorm_new(int num_groups, int64_t num_channels, float eps, bool affine, ts_module **out) {
    TS_ARG(out, "ts_nn_groupnorm_new: NULL out");
    TS_ARG(num_groups >= 1 && num_channels >= 1 && num_channels % num_groups == 0,
           "ts_nn_groupnorm_new: num_groups %d must be >= 1 and divide num_channels %lld", num_groups,
           (long long)num_channels);
    TS_ARG(eps > 0 && isfinite(eps), "ts_nn_groupnorm_new: eps %g must be > 0", (double)eps);
    ts_module *m = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts__module_new(&groupnorm_vt, sizeof(groupnorm_impl), &m));
    *(groupnorm_impl *)m->impl = (groupnorm_impl){num_groups, num_channels, eps, affine};
    TS_CHECK_GOTO(norm_affine_params(m, affine, 1, &num_channels));
    *out = m;
    return TS_OK;
fail:
    ts_module_free(m);
    return st;
}

ts_status ts_groupnorm_get_config(const ts_module *m, int *num_groups, int64_t *num_channels, float *eps,
                                  bool *affine) {
    TS_TRY(expect_kind(m, "ts_groupnorm_get_config", TS_MODULE_GROUPNORM, TS_MODULE_GROUPNORM, "a GroupNorm"));
    const groupnorm_impl *c = m->impl;
    if (num_groups) *num_groups = c->groups;
    if (num_channels) *num_channels = c->channels;
    if (eps) *eps = c->eps;
    if (affine) *affine = c->affine;
    return TS_OK;
}

/* ---- parameter-free layers --------------------------------------------------------------------- */
static ts_status relu_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) { return ts_relu(x, out); }
static const ts_module_vt relu_vt = {.name = "ReLU", .kind = TS_MODULE_RELU, .forward = relu_forward};

ts_status ts_nn_relu_new(ts_module **out) {
    TS_ARG(out, "ts_nn_relu_new: NULL out");
    return ts__module_new(&relu_vt, 0, out);
}

static ts_status maxpool_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    return ts_maxpool2d(x, *(const ts_pool2d_params *)m->impl, out);
}
static ts_status avgpool_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    return ts_avgpool2d(x, *(const ts_pool2d_params *)m->impl, out);
}
static const ts_module_vt maxpool_vt = {.name = "MaxPool2d", .kind = TS_MODULE_MAXPOOL2D, .forward = maxpool_forward};
static const ts_module_vt avgpool_vt = {.name = "AvgPool2d", .kind = TS_MODULE_AVGPOOL2D, .forward = avgpool_forward};

static ts_status pool_new(const ts_module_vt *vt, ts_pool2d_params p, ts_module **out) {
    TS_ARG(out, "ts_nn_%s_new: NULL out", vt->name);
    TS_ARG(p.kernel[0] >= 1 && p.kernel[1] >= 1, "%s: kernel size must be >= 1", vt->name);
    TS_TRY(ts__module_new(vt, sizeof p, out));
    *(ts_pool2d_params *)(*out)->impl = p;
    return TS_OK;
}
ts_status ts_nn_maxpool2d_new(ts_pool2d_params p, ts_module **out) { return pool_new(&maxpool_vt, p, out); }
ts_status ts_nn_avgpool2d_new(ts_pool2d_params p, ts_module **out) { return pool_new(&avgpool_vt, p, out); }

ts_status ts_pool2d_get_params(const ts_module *m, ts_pool2d_params *params) {
    TS_TRY(expect_kind(m, "ts_pool2d_get_params", TS_MODULE_MAXPOOL2D, TS_MODULE_AVGPOOL2D,
                       "a MaxPool2d or AvgPool2d"));
    if (params) *params = *(const ts_pool2d_params *)m->impl;
    return TS_OK;
}

static ts_status gap_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    return ts_global_avgpool2d(x, out);
}
static const ts_module_vt gap_vt = {
    .name = "AdaptiveAvgPool2d", .kind = TS_MODULE_ADAPTIVE_AVGPOOL2D, .forward = gap_forward};
ts_status ts_nn_global_avgpool2d_new(ts_module **out) {
    TS_ARG(out, "ts_nn_global_avgpool2d_new: NULL out");
    return ts__module_new(&gap_vt, 0, out);
}

static ts_status flatten_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) { return ts_flatten(x, 1, out); }
static const ts_module_vt flatten_vt = {.name = "Flatten", .kind = TS_MODULE_FLATTEN, .forward = flatten_forward};
ts_status ts_nn_flatten_new(ts_module **out) {
    TS_ARG(out, "ts_nn_flatten_new: NULL out");
    return ts__module_new(&flatten_vt, 0, out);
}

/* ---- Dropout --------------------------------------------------------------------------------------- */
typedef struct dropout_impl {
    float p;
    ts_rng *rng; /* borrowed */
} dropout_impl;

static ts_status dropout_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    const dropout_impl *c = m->impl;
    if (!m->training || c->p == 0) { /* identity, as F.dropout(training=False) */
        *out = ts_tensor_retain((ts_tensor *)x);
        return TS_OK;
    }
    return ts_dropout(x, c->p, true, c->rng, out);
}
static const ts_module_vt dropout_vt = {.name = "Dropout", .kind = TS_MODULE_DROPOUT, .forward = dropout_forward};

ts_status ts_nn_dropout_new(float p, ts_rng *rng, ts_module **out) {
    TS_ARG(out, "ts_nn_dropout_new: NULL out");
    TS_ARG(p >= 0 && p < 1, "ts_nn_dropout_new: p = %g must be in [0, 1)", (double)p);
    TS_TRY(ts__module_new(&dropout_vt, sizeof(dropout_impl), out));
    dropout_impl *c = (*out)->impl;
    c->p = p;
    c->rng = rng;
    return TS_OK;
}

ts_rng *ts__dropout_module_rng(const ts_module *m) {
    return ts_module_kind(m) == TS_MODULE_DROPOUT ? ((const dropout_impl *)m->impl)->rng : NULL;
}

ts_status ts_dropout_get_p(const ts_module *m, float *p) {
    TS_TRY(expect_kind(m, "ts_dropout_get_p", TS_MODULE_DROPOUT, TS_MODULE_DROPOUT, "a Dropout"));
    if (p) *p = ((const dropout_impl *)m->impl)->p;
    return TS_OK;
}

/* ---- Embedding --------------------------------------------------------------------------------------- */
typedef struct embedding_impl {
    int64_t num, dim;
} embedding_impl;

/* idx: any shape, TS_I64 -> idx.shape + (dim) */
static ts_status embedding_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    return ts_embedding(x, m->params[0], out);
}
static const ts_module_vt embedding_vt = {
    .name = "Embedding", .kind = TS_MODULE_EMBEDDING, .forward = embedding_forward};

ts_status ts_nn_embedding_new(int64_t num_embeddings, int64_t dim, ts_rng *rng, ts_module **out) {
    TS_ARG(out, "ts_nn_embedding_new: NULL out");
    TS_ARG(num_embeddings > 0 && dim > 0, "ts_nn_embedding_new: bad sizes num=%lld dim=%lld",
           (long long)num_embeddings, (long long)dim);
    ts_module *m = NULL;
    ts_tensor *w = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts__module_new(&embedding_vt, sizeof(embedding_impl), &m));
    *(embedding_impl *)m->impl = (embedding_impl){num_embeddings, dim};
    TS_CHECK_GOTO(ts_tensor_empty(ts_device_cpu(), TS_F32, 2, (int64_t[]){num_embeddings, dim}, &w));
    TS_CHECK_GOTO(ts_tensor_normal_(w, 0.0f, 1.0f, rng));
    TS_CHECK_GOTO(give_param(m, "weight", &w));
    *out = m;
    return TS_OK;
fail:
    ts_tensor_release(w);
    ts_module_free(m);
    return st;
}

ts_status ts_embedding_get_config(const ts_module *m, int64_t *num_embeddings, int64_t *dim) {
    TS_TRY(expect_kind(m, "ts_embedding_get_config", TS_MODULE_EMBEDDING, TS_MODULE_EMBEDDING, "an Embedding"));
    const embedding_impl *c = m->impl;
    if (num_embeddings) *num_embeddings = c->num;
    if (dim) *dim = c->dim;
    return TS_OK;
}
