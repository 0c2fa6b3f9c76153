/*
 * ops/elementwise.c — add, sub, mul, div (numpy broadcasting), scale, relu, sum,
 * mean, and moving tensors between devices, with their backward functions.
 */
#include "autograd/autograd.h"
#include "ops/half.h"
#include "tensor/tensor.h"
#include "device/k_ew.h"
#include "ops/reduce.h"
#include "ops/trace.h"
#include "tessera/ops.h"

#include <stdio.h>

/* Broadcast a and b: out shape and per-out-dim strides of a and b (0 where broadcast). */
static ts_status broadcast(const char *op, const ts_tensor *a, const ts_tensor *b, int *ndim, int64_t *shape,
                           int64_t *astr, int64_t *bstr) {
    int nd = TS_MAX(a->ndim, b->ndim);
    for (int i = 0; i < nd; i++) {
        int ia = i - (nd - a->ndim), ib = i - (nd - b->ndim);
        int64_t sa = ia >= 0 ? a->shape[ia] : 1, sb = ib >= 0 ? b->shape[ib] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            char x[96], y[96];
            return ts_error(TS_ERR_SHAPE, "%s: shapes %s and %s cannot be broadcast together", op,
                            ts_shape_str(a->ndim, a->shape, x, sizeof x), ts_shape_str(b->ndim, b->shape, y, sizeof y));
        }
        shape[i] = sa == 1 ? sb : sa;
        astr[i] = (ia >= 0 && sa != 1) ? a->stride[ia] : 0;
        bstr[i] = (ib >= 0 && sb != 1) ? b->stride[ib] : 0;
    }
    *ndim = nd;
    return TS_OK;
}

/* Sum a gradient g (broadcast shape) down to the shape of input i of node n. */
static ts_status reduce_grad(ts_node *n, int i, ts_tensor *g, ts_tensor **out) {
    int nd = n->in_ndim[i];
    const int64_t *shape = n->in_shape[i];
    if (nd == g->ndim && memcmp(shape, g->shape, sizeof(int64_t) * (size_t)nd) == 0) {
        *out = ts_tensor_retain(g);
        return TS_OK;
    }
    TS_TRY(ts__new(g->storage->device, TS_F32, nd, shape, out));
    bool reduce[TS_MAX_DIMS];
    for (int d = 0; d < g->ndim; d++) {
        int k = d - (g->ndim - nd);
        reduce[d] = k < 0 || (shape[k] == 1 && g->shape[d] != 1);
    }
    return ts__sum_dims_into(g, reduce, 1.0f, *out);
}

static ts_status binary_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_binop op = (ts_binop)n->p.i[0];
    ts_device *d = g->storage->device;
    for (int i = 0; i < 2; i++) {
        if (!n->needs[i]) continue;
        ts_tensor *full = NULL;
        if (op == TS_BIN_MUL) {
            /* d(a*b)/da = g * b (b broadcast to g's shape) */
            const ts_tensor *other = ts__node_saved(n, 1 - i);
            int nd;
            int64_t shape[TS_MAX_DIMS], s1[TS_MAX_DIMS], s2[TS_MAX_DIMS];
            TS_TRY(broadcast("mul backward", g, other, &nd, shape, s1, s2));
            TS_TRY(ts__new(d, TS_F32, nd, shape, &full));
            ts_status st = d->k_ew->binary(TS_BIN_MUL, full, g, s1, other, s2);
            if (st != TS_OK) {
                ts_tensor_release(full);
                return st;
            }
        } else if (op == TS_BIN_DIV) {
            /* d(a/b)/da = g / b; d(a/b)/db = -g a / b^2 = -(g y) / b */
            const ts_tensor *b = ts__node_saved(n, 0);
            const ts_tensor *num = g;
            ts_tensor *gy = NULL;
            int nd;
            int64_t shape[TS_MAX_DIMS], s1[TS_MAX_DIMS], s2[TS_MAX_DIMS];
            ts_status st = TS_OK;
            if (i == 1) { /* g y: both of the output's shape */
                const ts_tensor *y = ts__node_saved(n, 1);
                st = broadcast("div backward", g, y, &nd, shape, s1, s2);
                if (st == TS_OK) st = ts__new(d, TS_F32, nd, shape, &gy);
                if (st == TS_OK) st = d->k_ew->binary(TS_BIN_MUL, gy, g, s1, y, s2);
                num = gy;
            }
            if (st == TS_OK) st = broadcast("div backward", num, b, &nd, shape, s1, s2);
            if (st == TS_OK) st = ts__new(d, TS_F32, nd, shape, &full);
            if (st == TS_OK) st = d->k_ew->binary(TS_BIN_DIV, full, num, s1, b, s2);
            if (st == TS_OK && i == 1) st = d->k_ew->scale(full, full, -1.0f);
            ts_tensor_release(gy);
            if (st != TS_OK) {
                ts_tensor_release(full);
                return st;
            }
        } else if (op == TS_BIN_SUB && i == 1) {
            TS_TRY(ts__new_like(g, &full));
            ts_status st = d->k_ew->scale(full, g, -1.0f);
            if (st != TS_OK) {
                ts_tensor_release(full);
                return st;
            }
        } else {
            full = ts_tensor_retain(g);
        }
        ts_status st = reduce_grad(n, i, full, &gin[i]);
        ts_tensor_release(full);
        TS_TRY(st);
    }
    return TS_OK;
}

typedef struct binary_args {
    const char *name;
    ts_binop op;
} binary_args;
static ts_status binary_op(const char *name, ts_binop op, const ts_tensor *a, const ts_tensor *b, ts_tensor **out);
static ts_status binary_thunk(const ts_tensor *a, const ts_tensor *b, const void *arg, ts_tensor **out) {
    const binary_args *p = arg;
    return binary_op(p->name, p->op, a, b, out);
}

/* Whether add runs on the device's bfloat16 kernel: a and b bfloat16 of one shape (the residual add of
 * bfloat16 activations; its backward passes the gradient through unchanged) */
static bool add_bf16_native(ts_binop op, const ts_tensor *a, const ts_tensor *b) {
    return op == TS_BIN_ADD && ts__bf16_kept(a) && b && b->dtype == TS_BF16 && ts__same_shape(a, b) &&
           a->storage->device == b->storage->device;
}

static ts_status binary_op(const char *name, ts_binop op, const ts_tensor *a, const ts_tensor *b, ts_tensor **out) {
    const bool native = add_bf16_native(op, a, b);
    if (!native && ts__any_half(a, b)) return ts__half_op(binary_thunk, a, b, &(binary_args){name, op}, out);
    ts__op_kind kind = op == TS_BIN_ADD   ? TS_OP_ADD
                       : op == TS_BIN_SUB ? TS_OP_SUB
                       : op == TS_BIN_MUL ? TS_OP_MUL
                                          : TS_OP_DIV;
    if (!native) {
        TS_TRY(ts__check_f32(name, "a", a));
        TS_TRY(ts__check_f32(name, "b", b));
    }
    TS_ARG(out, "%s: NULL out", name);
    TS_TRY(ts__check_same_device(name, a, b));
    int nd;
    int64_t shape[TS_MAX_DIMS], astr[TS_MAX_DIMS], bstr[TS_MAX_DIMS];
    TS_TRY(broadcast(name, a, b, &nd, shape, astr, bstr));
    ts_device *d = a->storage->device;
    ts_tensor *o = NULL;
    TS_TRY(ts__new(d, a->dtype, nd, shape, &o));
    const ts_tensor *in[2] = {a, b};
    ts_node *n = NULL;
    ts_status st = d->k_ew->binary(op, o, a, astr, b, bstr);
    if (st == TS_OK) st = ts__node_new(name, binary_backward, 2, in, &n);
    if (n) {
        n->p.i[0] = op;
        if (op == TS_BIN_MUL) {
            ts__node_save(n, a);
            ts__node_save(n, b);
        } else if (op == TS_BIN_DIV) {
            ts__node_save(n, b);
            ts__node_save(n, o); /* the quotient: gb = -g y / b */
        }
        st = ts__node_attach(n, o);
    }
    if (st == TS_OK) st = ts__trace_op(kind, 2, in, o, NULL);
    if (st != TS_OK) {
        ts_tensor_release(o);
        return st;
    }
    *out = o;
    return TS_OK;
}

ts_status ts_add(const ts_tensor *a, const ts_tensor *b, ts_tensor **out) { return binary_op("add", TS_BIN_ADD, a, b, out); }
ts_status ts_sub(const ts_tensor *a, const ts_tensor *b, ts_tensor **out) { return binary_op("sub", TS_BIN_SUB, a, b, out); }
ts_status ts_mul(const ts_tensor *a, const ts_tensor *b, ts_tensor **out) { return binary_op("mul", TS_BIN_MUL, a, b, out); }
ts_status ts_div(const ts_tensor *a, const ts_tensor *b, ts_tensor **out) { return binary_op("div", TS_BIN_DIV, a, b, out); }

/* ---- scale --------------------------------------------------------------------------------------- */
static ts_status scale_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    TS_TRY(ts__new_like(g, &gin[0]));
    return g->storage->device->k_ew->scale(gin[0], g, n->p.f[0]);
}

static ts_status scale_thunk(const ts_tensor *a, const ts_tensor *b, const void *arg, ts_tensor **out) {
    (void)b;
    return ts_scale(a, *(const float *)arg, out);
}

ts_status ts_scale(const ts_tensor *a, float s, ts_tensor **out) {
    if (ts__any_half(a, NULL)) return ts__half_op(scale_thunk, a, NULL, &s, out);
    TS_TRY(ts__check_f32("scale", "a", a));
    TS_ARG(out, "scale: NULL out");
    ts_tensor *x = NULL, *o = NULL;
    TS_TRY(ts__contiguous(a, &x));
    ts_node *n = NULL;
    ts_status st = ts__new_like(x, &o);
    if (st == TS_OK) st = x->storage->device->k_ew->scale(o, x, s);
    ts_tensor_release(x);
    if (st == TS_OK) st = ts__node_new("scale", scale_backward, 1, &a, &n);
    if (n) {
        n->p.f[0] = s;
        st = ts__node_attach(n, o);
    }
    if (st == TS_OK) st = ts__trace_op(TS_OP_SCALE, 1, &a, o, &(ts__trace_attrs){.f = {s}});
    if (st != TS_OK) {
        ts_tensor_release(o);
        return st;
    }
    *out = o;
    return TS_OK;
}

/* ---- relu ----------------------------------------------------------------------------------------- */
static ts_status relu_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    TS_TRY(ts__new_like(g, &gin[0]));
    return g->storage->device->k_ew->relu_backward(gin[0], g, ts__node_saved(n, 0));
}

static ts_status relu_thunk(const ts_tensor *a, const ts_tensor *b, const void *arg, ts_tensor **out) {
    (void)b, (void)arg;
    return ts_relu(a, out);
}

/* bfloat16 x stays bfloat16 where the device's kernels take it; other 16-bit x runs on a float32 copy */
ts_status ts_relu(const ts_tensor *x, ts_tensor **out) {
    TS_ARG(x, "relu: NULL x");
    const bool native = ts__bf16_kept(x);
    if (!native && ts__any_half(x, NULL)) return ts__half_op(relu_thunk, x, NULL, NULL, out);
    if (!native) TS_TRY(ts__check_f32("relu", "x", x));
    TS_ARG(out, "relu: NULL out");
    ts_tensor *c = NULL, *o = NULL;
    TS_TRY(ts__contiguous(x, &c));
    ts_node *n = NULL;
    ts_status st = ts__new_like(c, &o);
    if (st == TS_OK) st = c->storage->device->k_ew->relu(o, c);
    ts_tensor_release(c);
    if (st == TS_OK) st = ts__node_new("relu", relu_backward, 1, &x, &n);
    if (n) {
        ts__node_save(n, o); /* the output decides where the gradient passes */
        st = ts__node_attach(n, o);
    }
    if (st == TS_OK) st = ts__trace_op(TS_OP_RELU, 1, &x, o, NULL);
    if (st != TS_OK) {
        ts_tensor_release(o);
        return st;
    }
    *out = o;
    return TS_OK;
}

/* ---- sum and mean ------------------------------------------------------------------------------------ */
static ts_status sum_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    TS_TRY(ts__new(g->storage->device, TS_F32, n->in_ndim[0], n->in_shape[0], &gin[0]));
    return g->storage->device->k_ew->expand_scalar(gin[0], g, n->p.f[0]);
}

static ts_status reduce_all(const char *name, const ts_tensor *x, bool mean, ts_tensor **out);
static ts_status reduce_all_thunk(const ts_tensor *a, const ts_tensor *b, const void *arg, ts_tensor **out) {
    (void)b;
    return reduce_all(*(const bool *)arg ? "mean" : "sum", a, *(const bool *)arg, out);
}

static ts_status reduce_all(const char *name, const ts_tensor *x, bool mean, ts_tensor **out) {
    if (ts__any_half(x, NULL)) return ts__half_op(reduce_all_thunk, x, NULL, &mean, out);
    TS_TRY(ts__check_f32(name, "x", x));
    TS_ARG(out, "%s: NULL out", name);
    ts_tensor *c = NULL, *o = NULL;
    TS_TRY(ts__contiguous(x, &c));
    ts_device *d = c->storage->device;
    ts_status st = ts__new(d, TS_F32, 0, NULL, &o);
    if (st == TS_OK) st = d->k_ew->sum_all(o, c);
    int64_t n = ts_tensor_numel(c);
    if (st == TS_OK && mean) st = d->k_ew->scale(o, o, n ? 1.0f / (float)n : 0.0f);
    ts_tensor_release(c);
    ts_node *node = NULL;
    if (st == TS_OK) st = ts__node_new(name, sum_backward, 1, &x, &node);
    if (node) {
        node->p.f[0] = mean ? (n ? 1.0f / (float)n : 0.0f) : 1.0f;
        st = ts__node_attach(node, o);
    }
    if (st == TS_OK) st = ts__trace_op(mean ? TS_OP_MEAN : TS_OP_SUM, 1, &x, o, NULL);
    if (st != TS_OK) {
        ts_tensor_release(o);
        return st;
    }
    *out = o;
    return TS_OK;
}

ts_status ts_sum(const ts_tensor *x, ts_tensor **out) { return reduce_all("sum", x, false, out); }
ts_status ts_mean(const ts_tensor *x, ts_tensor **out) { return reduce_all("mean", x, true, out); }

/* ---- device movement -------------------------------------------------------------------------------------- */
static ts_status to_device_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_device *src = (ts_device *)n->ctx;
    TS_TRY(ts__new(src, g->dtype, g->ndim, g->shape, &gin[0]));
    return ts_tensor_copy_(gin[0], g);
}

ts_status ts_to_device(const ts_tensor *x, ts_device *dev, ts_tensor **out) {
    TS_ARG(x && dev && out, "to_device: NULL argument");
    if (x->storage->device == dev) {
        *out = ts_tensor_retain((ts_tensor *)x);
        return TS_OK;
    }
    ts_tensor *o = NULL;
    TS_TRY(ts__new(dev, x->dtype, x->ndim, x->shape, &o));
    ts_node *n = NULL;
    ts_status st = ts_tensor_copy_(o, x);
    if (st == TS_OK) st = ts__node_new("to_device", to_device_backward, 1, &x, &n);
    if (n) {
        n->ctx = x->storage->device; /* devices live for the whole process: no free_ctx */
        st = ts__node_attach(n, o);
    }
    if (st == TS_OK) st = ts__trace_op(TS_OP_TO_DEVICE, 1, &x, o, NULL);
    if (st != TS_OK) {
        ts_tensor_release(o);
        return st;
    }
    *out = o;
    return TS_OK;
}

/* ---- dtype conversion -------------------------------------------------------------------------------------- */
static ts_status cast_to(const ts_tensor *x, ts_dtype dt, ts_tensor **out) {
    ts_tensor *c = NULL, *o = NULL;
    ts_device *dev = x->storage->device;
    if (!dev->k_ew->cast)
        return ts_error(TS_ERR_UNSUPPORTED, "to_dtype: no conversion kernel on device %s", ts_device_name(dev));
    TS_TRY(ts__contiguous(x, &c));
    ts_status st = ts__new(dev, dt, x->ndim, x->shape, &o);
    if (st == TS_OK) st = dev->k_ew->cast(o, c);
    ts_tensor_release(c);
    if (st != TS_OK) {
        ts_tensor_release(o);
        return st;
    }
    *out = o;
    return TS_OK;
}

static ts_status to_dtype_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    return cast_to(g, (ts_dtype)n->p.i[0], &gin[0]);
}

ts_status ts_to_dtype(const ts_tensor *x, ts_dtype dt, ts_tensor **out) {
    TS_ARG(x && out, "to_dtype: NULL argument");
    if (!ts_dtype_is_float(x->dtype) || !ts_dtype_is_float(dt))
        return ts_error(TS_ERR_DTYPE, "to_dtype: %s to %s (want float32, float16 or bfloat16)", ts_dtype_name(x->dtype),
                        ts_dtype_name(dt));
    if (x->dtype == dt) {
        *out = ts_tensor_retain((ts_tensor *)x);
        return TS_OK;
    }
    ts_tensor *o = NULL;
    TS_TRY(cast_to(x, dt, &o));
    ts_node *n = NULL;
    ts_status st = ts__node_new("to_dtype", to_dtype_backward, 1, &x, &n);
    if (n) {
        n->p.i[0] = x->dtype; /* the gradient goes back in x's dtype */
        st = ts__node_attach(n, o);
    }
    if (st == TS_OK) st = ts__trace_op(TS_OP_CAST, 1, &x, o, &(ts__trace_attrs){.i = {(int64_t)dt}});
    if (st != TS_OK) {
        ts_tensor_release(o);
        return st;
    }
    *out = o;
    return TS_OK;
}
