/*
 * nn/layers.c — the leaf layers: Linear, Conv2d, BatchNorm2d, ReLU, MaxPool2d,
 * AvgPool2d, GlobalAvgPool2d, Flatten, Dropout, Embedding. Each is a thin
 * module over one op of tessera/ops.h, with PyTorch's default initialisation.
 */
#include "nn/module.h"

#include <math.h>

/* ---- Linear ------------------------------------------------------------------------------- */
/* x: (N, in), weight: (out, in), bias: (out) -> (N, out) */
static ts_status linear_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    return ts_linear(x, m->params[0], m->params[1], out);
}
static const ts_module_vt linear_vt = {"Linear", linear_forward, NULL};

ts_status ts_nn_linear_new(int64_t in_features, int64_t out_features, bool bias, ts_rng *rng, ts_module **out) {
    TS_ARG(out, "ts_nn_linear_new: NULL out");
    TS_ARG(in_features > 0 && out_features > 0, "ts_nn_linear_new: bad sizes in=%lld out=%lld",
           (long long)in_features, (long long)out_features);
    ts_module *m = NULL;
    ts_tensor *w = NULL, *b = NULL;
    double bound = 1.0 / sqrt((double)in_features);
    ts_status st;
    TS_CHECK_GOTO(ts__module_new(&linear_vt, 0, &m));
    TS_CHECK_GOTO(ts__param_uniform(2, (int64_t[]){out_features, in_features}, bound, rng, &w));
    if (bias) TS_CHECK_GOTO(ts__param_uniform(1, &out_features, bound, rng, &b));
    ts__module_add_param(m, "weight", w);
    ts__module_add_param(m, "bias", b);
    *out = m;
    return TS_OK;
fail:
    ts_tensor_release(w);
    ts_tensor_release(b);
    ts_module_free(m);
    return st;
}

/* ---- Conv2d -------------------------------------------------------------------------------- */
/* x: (N, C_in, H, W), weight: (C_out, C_in/groups, kH, kW), bias: (C_out) -> (N, C_out, H_out, W_out) */
static ts_status conv2d_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    const ts_conv2d_params *p = m->impl;
    return ts_conv2d(x, m->params[0], m->params[1], *p, out);
}
static const ts_module_vt conv2d_vt = {"Conv2d", conv2d_forward, NULL};

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
    TS_CHECK_GOTO(ts__module_new(&conv2d_vt, sizeof(ts_conv2d_params), &m));
    *(ts_conv2d_params *)m->impl = p;
    TS_CHECK_GOTO(ts__param_uniform(4, (int64_t[]){out_channels, cin_g, kh, kw}, bound, rng, &w));
    if (bias) TS_CHECK_GOTO(ts__param_uniform(1, &out_channels, bound, rng, &b));
    ts__module_add_param(m, "weight", w);
    ts__module_add_param(m, "bias", b);
    *out = m;
    return TS_OK;
fail:
    ts_tensor_release(w);
    ts_tensor_release(b);
    ts_module_free(m);
    return st;
}

/* ---- BatchNorm2d ------------------------------------------------------------------------------ */
typedef struct bn_impl {
    float eps, momentum; /* momentum < 0: cumulative average (PyTorch's None) */
    bool track;
} bn_impl;

/* x: (N, C, H, W) -> (N, C, H, W). Training with tracked stats updates running_mean/var
 * and num_batches_tracked; eval normalises with the running stats; without tracked
 * stats, batch statistics are always used (PyTorch's bn_training). */
static ts_status bn_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    const bn_impl *c = m->impl;
    ts_tensor *rm = c->track ? m->buffers[0] : NULL, *rv = c->track ? m->buffers[1] : NULL;
    ts_tensor *nbt = c->track ? m->buffers[2] : NULL;
    bool update = m->training && c->track;
    float momentum = c->momentum;
    int64_t count = 0;
    if (update) {
        count = (int64_t)ts_tensor_item(nbt, 0) + 1;
        if (momentum < 0) momentum = 1.0f / (float)count;
    }
    TS_TRY(ts_batchnorm2d(x, m->params[0], m->params[1], rm, rv, m->training || !c->track, momentum < 0 ? 0 : momentum,
                          c->eps, out));
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
static const ts_module_vt bn_vt = {"BatchNorm2d", bn_forward, NULL};

bool ts__batchnorm2d_config(const ts_module *m, float *eps, float *momentum, bool *track_running_stats) {
    if (!m || m->vt != &bn_vt) return false;
    const bn_impl *c = m->impl;
    *eps = c->eps;
    *momentum = c->momentum;
    *track_running_stats = c->track;
    return true;
}

ts_status ts_nn_batchnorm2d_new(int64_t num_features, float eps, float momentum, bool affine, bool track_running_stats,
                                ts_module **out) {
    TS_ARG(out, "ts_nn_batchnorm2d_new: NULL out");
    TS_ARG(num_features > 0, "ts_nn_batchnorm2d_new: num_features %lld must be > 0", (long long)num_features);
    TS_ARG(eps > 0, "ts_nn_batchnorm2d_new: eps must be > 0");
    TS_ARG(momentum <= 1, "ts_nn_batchnorm2d_new: momentum %g must be <= 1", (double)momentum);
    ts_module *m = NULL;
    ts_tensor *t[5] = {NULL, NULL, NULL, NULL, NULL}; /* weight, bias, running_mean, running_var, nbt */
    ts_device *cpu = ts_device_cpu();
    ts_status st;
    TS_CHECK_GOTO(ts__module_new(&bn_vt, sizeof(bn_impl), &m));
    bn_impl *c = m->impl;
    c->eps = eps;
    c->momentum = momentum;
    c->track = track_running_stats;
    if (affine) {
        TS_CHECK_GOTO(ts_tensor_full(cpu, 1, &num_features, 1.0f, &t[0]));
        TS_CHECK_GOTO(ts_tensor_zeros(cpu, TS_F32, 1, &num_features, &t[1]));
    }
    if (track_running_stats) {
        TS_CHECK_GOTO(ts_tensor_zeros(cpu, TS_F32, 1, &num_features, &t[2]));
        TS_CHECK_GOTO(ts_tensor_full(cpu, 1, &num_features, 1.0f, &t[3]));
        TS_CHECK_GOTO(ts_tensor_zeros(cpu, TS_I64, 0, NULL, &t[4]));
    }
    ts__module_add_param(m, "weight", t[0]);
    ts__module_add_param(m, "bias", t[1]);
    ts__module_add_buffer(m, "running_mean", t[2]);
    ts__module_add_buffer(m, "running_var", t[3]);
    ts__module_add_buffer(m, "num_batches_tracked", t[4]);
    *out = m;
    return TS_OK;
fail:
    for (int i = 0; i < 5; i++) ts_tensor_release(t[i]);
    ts_module_free(m);
    return st;
}

/* ---- parameter-free layers --------------------------------------------------------------------- */
static ts_status relu_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) { return ts_relu(x, out); }
static const ts_module_vt relu_vt = {"ReLU", relu_forward, NULL};

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
static const ts_module_vt maxpool_vt = {"MaxPool2d", maxpool_forward, NULL};
static const ts_module_vt avgpool_vt = {"AvgPool2d", avgpool_forward, NULL};

static ts_status pool_new(const ts_module_vt *vt, ts_pool2d_params p, ts_module **out) {
    TS_ARG(out, "ts_nn_%s_new: NULL out", vt->name);
    TS_ARG(p.kernel[0] >= 1 && p.kernel[1] >= 1, "%s: kernel size must be >= 1", vt->name);
    TS_TRY(ts__module_new(vt, sizeof p, out));
    *(ts_pool2d_params *)(*out)->impl = p;
    return TS_OK;
}
ts_status ts_nn_maxpool2d_new(ts_pool2d_params p, ts_module **out) { return pool_new(&maxpool_vt, p, out); }
ts_status ts_nn_avgpool2d_new(ts_pool2d_params p, ts_module **out) { return pool_new(&avgpool_vt, p, out); }

static ts_status gap_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    return ts_global_avgpool2d(x, out);
}
static const ts_module_vt gap_vt = {"AdaptiveAvgPool2d", gap_forward, NULL};
ts_status ts_nn_global_avgpool2d_new(ts_module **out) {
    TS_ARG(out, "ts_nn_global_avgpool2d_new: NULL out");
    return ts__module_new(&gap_vt, 0, out);
}

static ts_status flatten_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) { return ts_flatten(x, 1, out); }
static const ts_module_vt flatten_vt = {"Flatten", flatten_forward, NULL};
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
static const ts_module_vt dropout_vt = {"Dropout", dropout_forward, NULL};

ts_status ts_nn_dropout_new(float p, ts_rng *rng, ts_module **out) {
    TS_ARG(out, "ts_nn_dropout_new: NULL out");
    TS_ARG(p >= 0 && p < 1, "ts_nn_dropout_new: p = %g must be in [0, 1)", (double)p);
    TS_TRY(ts__module_new(&dropout_vt, sizeof(dropout_impl), out));
    dropout_impl *c = (*out)->impl;
    c->p = p;
    c->rng = rng;
    return TS_OK;
}

/* ---- Embedding --------------------------------------------------------------------------------------- */
/* idx: any shape, TS_I64 -> idx.shape + (dim) */
static ts_status embedding_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    return ts_embedding(x, m->params[0], out);
}
static const ts_module_vt embedding_vt = {"Embedding", embedding_forward, NULL};

ts_status ts_nn_embedding_new(int64_t num_embeddings, int64_t dim, ts_rng *rng, ts_module **out) {
    TS_ARG(out, "ts_nn_embedding_new: NULL out");
    TS_ARG(num_embeddings > 0 && dim > 0, "ts_nn_embedding_new: bad sizes num=%lld dim=%lld",
           (long long)num_embeddings, (long long)dim);
    ts_module *m = NULL;
    ts_tensor *w = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts__module_new(&embedding_vt, 0, &m));
    TS_CHECK_GOTO(ts_tensor_empty(ts_device_cpu(), TS_F32, 2, (int64_t[]){num_embeddings, dim}, &w));
    TS_CHECK_GOTO(ts_tensor_normal_(w, 0.0f, 1.0f, rng));
    ts__module_add_param(m, "weight", w);
    *out = m;
    return TS_OK;
fail:
    ts_tensor_release(w);
    ts_module_free(m);
    return st;
}
