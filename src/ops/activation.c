/*
 * ops/activation.c — sigmoid, tanh, GELU (erf or tanh approximation), SiLU,
 * and softmax and log_softmax along a dim, with their backward functions
 * (PyTorch 1.13 semantics).
 *
 * Sigmoid, tanh, softmax and log_softmax save their output (the derivative is
 * a function of it); GELU and SiLU save their input. ReLU lives in
 * elementwise.c. softmax and log_softmax are one op here (softmax_family) over
 * the misc kernels, whose formulas (device/k_elem.h) cross-entropy shares.
 */
#include "autograd/autograd.h"
#include "ops/half.h"
#include "tensor/tensor.h"
#include "device/k_ew.h"
#include "device/k_misc.h"
#include "ops/trace.h"
#include "tessera/ops.h"

/* ---- unary activations ----------------------------------------------------------------------------- */
static bool saves_output(ts_unop op) { return op == TS_UN_SIGMOID || op == TS_UN_TANH; }

static ts_status unary_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    ts_unop op = (ts_unop)n->p.i[0];
    const ts_tensor *saved = ts__node_saved(n, 0);
    ts_tensor *g = NULL;
    TS_TRY(ts__contiguous(g_in, &g));
    ts_status st = ts__new_like(g, &gin[0]);
    if (st == TS_OK)
        st = g->storage->device->k_ew->unary_backward(op, gin[0], g, saves_output(op) ? NULL : saved,
                                                      saves_output(op) ? saved : NULL);
    ts_tensor_release(g);
    return st;
}

typedef struct unary_args {
    const char *name;
    ts_unop op;
} unary_args;
static ts_status unary_op(const char *name, ts_unop op, const ts_tensor *x_in, ts_tensor **out);
static ts_status unary_thunk(const ts_tensor *a, const ts_tensor *b, const void *arg, ts_tensor **out) {
    (void)b;
    return unary_op(((const unary_args *)arg)->name, ((const unary_args *)arg)->op, a, out);
}

static ts_status unary_op(const char *name, ts_unop op, const ts_tensor *x_in, ts_tensor **out) {
    if (ts__any_half(x_in, NULL)) return ts__half_op(unary_thunk, x_in, NULL, &(unary_args){name, op}, out);
    TS_TRY(ts__check_f32(name, "x", x_in));
    TS_ARG(out, "%s: NULL out", name);
    ts_status st;
    ts_tensor *x = NULL, *o = NULL;
    TS_CHECK_GOTO(ts__contiguous(x_in, &x));
    TS_CHECK_GOTO(ts__new_like(x, &o));
    TS_CHECK_GOTO(x->storage->device->k_ew->unary(op, o, x));
    ts_node *n = NULL;
    TS_CHECK_GOTO(ts__node_new(name, unary_backward, 1, &x_in, &n));
    if (n) {
        n->p.i[0] = op;
        ts__node_save(n, saves_output(op) ? o : x);
        TS_CHECK_GOTO(ts__node_attach(n, o));
    }
    TS_CHECK_GOTO(ts__trace_op(op == TS_UN_SIGMOID ? TS_OP_SIGMOID
                               : op == TS_UN_TANH  ? TS_OP_TANH
                               : op == TS_UN_SILU  ? TS_OP_SILU
                                                   : TS_OP_GELU,
                               1, &x_in, o, &(ts__trace_attrs){.i = {op == TS_UN_GELU_TANH}}));
    *out = o;
    o = NULL;
fail:
    ts_tensor_release(x);
    ts_tensor_release(o);
    return st;
}

ts_status ts_sigmoid(const ts_tensor *x, ts_tensor **out) { return unary_op("sigmoid", TS_UN_SIGMOID, x, out); }
ts_status ts_tanh(const ts_tensor *x, ts_tensor **out) { return unary_op("tanh", TS_UN_TANH, x, out); }
ts_status ts_silu(const ts_tensor *x, ts_tensor **out) { return unary_op("silu", TS_UN_SILU, x, out); }
ts_status ts_gelu(const ts_tensor *x, bool tanh_approx, ts_tensor **out) {
    return unary_op("gelu", tanh_approx ? TS_UN_GELU_TANH : TS_UN_GELU, x, out);
}

/* ---- softmax and log_softmax -------------------------------------------------------------------------- */
typedef enum smax_kind { SMAX_SOFTMAX = 0, SMAX_LOG_SOFTMAX = 1 } smax_kind;
static const char *const smax_names[] = {"softmax", "log_softmax"};

/* saved: the output y; p.i[0..2] = (outer, n, inner), p.i[3] = the kind */
static ts_status softmax_family_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    ts_tensor *g = NULL;
    TS_TRY(ts__contiguous(g_in, &g));
    ts_status st = ts__new_like(g, &gin[0]);
    const struct ts_kernels_misc *k = g->storage->device->k_misc;
    const ts_tensor *y = ts__node_saved(n, 0);
    if (st == TS_OK && n->p.i[3] == SMAX_SOFTMAX)
        st = k->softmax_backward(gin[0], g, y, n->p.i[0], n->p.i[1], n->p.i[2]);
    else if (st == TS_OK)
        st = k->log_softmax_backward(gin[0], g, y, n->p.i[0], n->p.i[1], n->p.i[2]);
    ts_tensor_release(g);
    return st;
}

typedef struct smax_args {
    smax_kind kind;
    int dim;
} smax_args;
static ts_status softmax_family(smax_kind kind, const ts_tensor *x_in, int dim, ts_tensor **out);
static ts_status softmax_thunk(const ts_tensor *a, const ts_tensor *b, const void *arg, ts_tensor **out) {
    (void)b;
    return softmax_family(((const smax_args *)arg)->kind, a, ((const smax_args *)arg)->dim, out);
}

/* softmax or log_softmax of x over dim: x viewed as (outer, n, inner) with n = x.shape[dim]. */
static ts_status softmax_family(smax_kind kind, const ts_tensor *x_in, int dim, ts_tensor **out) {
    const char *name = smax_names[kind];
    if (ts__any_half(x_in, NULL)) return ts__half_op(softmax_thunk, x_in, NULL, &(smax_args){kind, dim}, out);
    TS_TRY(ts__check_f32(name, "x", x_in));
    TS_ARG(out, "%s: NULL out", name);
    int nd = x_in->ndim ? x_in->ndim : 1; /* a 0-d tensor acts as one element along dim 0 */
    if (dim < -nd || dim >= nd) {
        char b[96];
        return ts_error(TS_ERR_INVALID_ARG, "%s: dim %d is out of range for a tensor of shape %s (expected [%d, %d])",
                        name, dim, ts_shape_str(x_in->ndim, x_in->shape, b, sizeof b), -nd, nd - 1);
    }
    int d = dim < 0 ? dim + nd : dim;
    int64_t outer = 1, n = 1, inner = 1;
    if (x_in->ndim) {
        outer = ts__numel(d, x_in->shape);
        n = x_in->shape[d];
        inner = ts__numel(x_in->ndim - d - 1, x_in->shape + d + 1);
    }
    ts_status st;
    ts_tensor *x = NULL, *o = NULL;
    TS_CHECK_GOTO(ts__contiguous(x_in, &x));
    TS_CHECK_GOTO(ts__new_like(x, &o));
    const struct ts_kernels_misc *k = x->storage->device->k_misc;
    TS_CHECK_GOTO(kind == SMAX_SOFTMAX ? k->softmax(o, x, outer, n, inner) : k->log_softmax(o, x, outer, n, inner));
    ts_node *node = NULL;
    TS_CHECK_GOTO(ts__node_new(name, softmax_family_backward, 1, &x_in, &node));
    if (node) {
        ts__node_save(node, o); /* softmax's backward needs y; log_softmax's exp(y) */
        node->p.i[0] = outer;
        node->p.i[1] = n;
        node->p.i[2] = inner;
        node->p.i[3] = kind;
        TS_CHECK_GOTO(ts__node_attach(node, o));
    }
    TS_CHECK_GOTO(ts__trace_op(kind == SMAX_SOFTMAX ? TS_OP_SOFTMAX : TS_OP_LOG_SOFTMAX, 1, &x_in, o,
                               &(ts__trace_attrs){.i = {d}}));
    *out = o;
    o = NULL;
fail:
    ts_tensor_release(x);
    ts_tensor_release(o);
    return st;
}

ts_status ts_softmax(const ts_tensor *x, int dim, ts_tensor **out) { return softmax_family(SMAX_SOFTMAX, x, dim, out); }
ts_status ts_log_softmax(const ts_tensor *x, int dim, ts_tensor **out) {
    return softmax_family(SMAX_LOG_SOFTMAX, x, dim, out);
}
