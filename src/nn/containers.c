/*
 * nn/containers.c — modules made of modules: Sequential and the ResNet
 * BasicBlock (ResidualBlock).
 */
#include "nn/module.h"

/* ---- Sequential ----------------------------------------------------------------------------- */
/* The order Sequential runs child i in: a ReLU followed by a MaxPool2d runs after it instead. Max and ReLU
 * commute (ReLU is monotonic, max pooling's padding never wins, ties go to the first element either way),
 * so the output and every gradient are the same bit for bit, and ReLU and its backward touch a quarter of
 * the elements behind a 2x2 pool (the reference CNN: 7% of a training step). */
static int run_order(const ts_module *m, int i) {
    bool relu_pool = i + 1 < m->nchildren && ts_module_kind(m->children[i]) == TS_MODULE_RELU &&
                     ts_module_kind(m->children[i + 1]) == TS_MODULE_MAXPOOL2D;
    bool pool_after_relu = i > 0 && ts_module_kind(m->children[i - 1]) == TS_MODULE_RELU &&
                           ts_module_kind(m->children[i]) == TS_MODULE_MAXPOOL2D;
    return relu_pool ? i + 1 : pool_after_relu ? i - 1 : i;
}

static ts_status sequential_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    ts_tensor *cur = ts_tensor_retain((ts_tensor *)x);
    for (int k = 0; k < m->nchildren; k++) {
        int i = run_order(m, k);
        ts_tensor *next = NULL;
        ts_status st = ts_module_forward(m->children[i], cur, &next);
        ts_tensor_release(cur);
        if (st != TS_OK) return ts__error_prefix(st, "Sequential '%s' (%s)", m->child_names[i], m->children[i]->vt->name);
        cur = next;
    }
    *out = cur;
    return TS_OK;
}
static const ts_module_vt sequential_vt = {
    .name = "Sequential", .kind = TS_MODULE_SEQUENTIAL, .forward = sequential_forward};

ts_status ts_nn_sequential_new(ts_module **out) {
    TS_ARG(out, "ts_nn_sequential_new: NULL out");
    return ts__module_new(&sequential_vt, 0, out);
}

ts_status ts_nn_sequential_add(ts_module *seq, const char *name, ts_module *child) {
    if (ts_module_kind(seq) != TS_MODULE_SEQUENTIAL) {
        ts_module_free(child);
        return ts_error(TS_ERR_INVALID_ARG, "ts_nn_sequential_add: expected a Sequential, got %s",
                        seq ? ts_module_type_name(seq) : "NULL");
    }
    return ts__module_add_child(seq, name, child);
}

int ts_nn_sequential_len(const ts_module *seq) { return seq ? seq->nchildren : 0; }

/* ---- residual blocks (torchvision's BasicBlock and Bottleneck) ------------------------------------ */
/* Children: `pairs` (conv, bn) pairs — BasicBlock: conv1 bn1 conv2 bn2; Bottleneck: conv1 bn1 conv2 bn2
 * conv3 bn3 — then optionally downsample. Forward: ReLU after every pair but the last, then the sum with
 * the identity (or downsample(x)) and a ReLU.
 * x: (N, C_in, H, W) -> (N, C_out, H/stride, W/stride) */
typedef struct residual_impl {
    int pairs; /* 2: BasicBlock, 3: Bottleneck */
} residual_impl;

static ts_status residual_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    const int pairs = ((const residual_impl *)m->impl)->pairs;
    ts_tensor *a = ts_tensor_retain((ts_tensor *)x), *b = NULL, *id = NULL;
    ts_status st;
    for (int i = 0; i < pairs; i++) {
        TS_CHECK_GOTO(ts_module_forward(m->children[2 * i], a, &b)); /* conv */
        ts_tensor_release(a);
        a = NULL;
        TS_CHECK_GOTO(ts_module_forward(m->children[2 * i + 1], b, &a)); /* bn */
        ts_tensor_release(b);
        b = NULL;
        if (i + 1 < pairs) {
            TS_CHECK_GOTO(ts_relu(a, &b));
            ts_tensor_release(a);
            a = b;
            b = NULL;
        }
    }
    if (m->nchildren > 2 * pairs)
        TS_CHECK_GOTO(ts_module_forward(m->children[2 * pairs], x, &id)); /* downsample */
    else
        id = ts_tensor_retain((ts_tensor *)x);
    TS_CHECK_GOTO(ts_add(a, id, &b));
    ts_tensor_release(a);
    a = NULL;
    TS_CHECK_GOTO(ts_relu(b, out));
    ts_tensor_release(b);
    ts_tensor_release(id);
    return TS_OK;
fail:
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(id);
    return ts__error_prefix(st, "%s", m->vt->name);
}
static const ts_module_vt residual_vt = {
    .name = "BasicBlock", .kind = TS_MODULE_RESIDUAL_BLOCK, .forward = residual_forward};
static const ts_module_vt bottleneck_vt = {
    .name = "Bottleneck", .kind = TS_MODULE_BOTTLENECK, .forward = residual_forward};

static ts_status conv_bn(ts_module *m, const char *conv_name, const char *bn_name, int64_t cin, int64_t cout, int k,
                         int stride, ts_rng *rng) {
    ts_conv2d_params p = TS_CONV2D_DEFAULT;
    p.stride[0] = p.stride[1] = stride;
    p.padding[0] = p.padding[1] = k / 2;
    ts_module *c = NULL;
    TS_TRY(ts_nn_conv2d_new(cin, cout, k, k, p, false, rng, &c));
    TS_TRY(ts__module_add_child(m, conv_name, c));
    TS_TRY(ts_nn_batchnorm2d_new(cout, 1e-5f, 0.1f, true, true, &c));
    return ts__module_add_child(m, bn_name, c);
}

/* A block of type vt: `pairs` (conv, bn) pairs with kernel sizes k[i], output channels ch[i] and the
 * stride on pair stride_at; downsample = Sequential(conv1x1(stride), BN) when the shape changes. */
static ts_status block_new(const ts_module_vt *vt, int pairs, int64_t cin, const int64_t *ch, const int *k,
                           int stride_at, int stride, ts_rng *rng, ts_module **out) {
    static const char *const names[3][2] = {{"conv1", "bn1"}, {"conv2", "bn2"}, {"conv3", "bn3"}};
    ts_module *m = NULL, *ds = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts__module_new(vt, sizeof(residual_impl), &m));
    ((residual_impl *)m->impl)->pairs = pairs;
    /* children in torchvision's registration order: conv1, bn1, conv2, bn2, [conv3, bn3,] downsample */
    for (int i = 0; i < pairs; i++)
        TS_CHECK_GOTO(conv_bn(m, names[i][0], names[i][1], i ? ch[i - 1] : cin, ch[i], k[i],
                              i == stride_at ? stride : 1, rng));
    int64_t cout = ch[pairs - 1];
    if (stride != 1 || cin != cout) {
        TS_CHECK_GOTO(ts_nn_sequential_new(&ds));
        TS_CHECK_GOTO(conv_bn(ds, "0", "1", cin, cout, 1, stride, rng));
        st = ts__module_add_child(m, "downsample", ds);
        ds = NULL; /* owned by m now, or freed */
        TS_CHECK_GOTO(st);
    }
    *out = m;
    return TS_OK;
fail:
    ts_module_free(ds);
    ts_module_free(m);
    return st;
}

ts_status ts_nn_residual_block_new(int64_t in_channels, int64_t out_channels, int stride, ts_rng *rng,
                                   ts_module **out) {
    TS_ARG(out, "ts_nn_residual_block_new: NULL out");
    TS_ARG(in_channels > 0 && out_channels > 0 && stride >= 1, "ts_nn_residual_block_new: bad sizes or stride");
    const int64_t ch[2] = {out_channels, out_channels};
    return block_new(&residual_vt, 2, in_channels, ch, (const int[]){3, 3}, 0, stride, rng, out);
}

ts_status ts_nn_bottleneck_new(int64_t in_channels, int64_t width, int64_t out_channels, int stride, ts_rng *rng,
                               ts_module **out) {
    TS_ARG(out, "ts_nn_bottleneck_new: NULL out");
    TS_ARG(in_channels > 0 && width > 0 && out_channels > 0 && stride >= 1,
           "ts_nn_bottleneck_new: bad sizes (%lld, %lld, %lld) or stride %d", (long long)in_channels,
           (long long)width, (long long)out_channels, stride);
    const int64_t ch[3] = {width, width, out_channels};
    return block_new(&bottleneck_vt, 3, in_channels, ch, (const int[]){1, 3, 1}, 1, stride, rng, out);
}
