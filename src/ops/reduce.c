/*
 * ops/reduce.c — sum and mean over chosen dims, and max along a dim (values
 * and indices), with their backward functions (PyTorch 1.13 semantics:
 * keepdim, negative dims, dims=[] reduces everything, a 0-d tensor takes dim 0
 * or -1, mean over nothing is nan, the max gradient goes to the first argmax).
 *
 * A reduction over several dims is done one run of adjacent dims at a time:
 * x's shape is first coalesced into groups of adjacent dims that are all
 * reduced or all kept (size-1 dims dropped), e.g. (N, C, H, W) over (2, 3)
 * is (N*C, [H*W]), over (0, 2, 3) is ([N], C, [H*W]). Each reduced group is
 * then one (outer, n, inner) pass of the sum_dim kernel, last group first, so
 * the usual cases (trailing dims, one middle dim) are one contiguous pass.
 * Backward runs the same groups the other way with expand_dim.
 */
#include "autograd/autograd.h"
#include "ops/half.h"
#include "tensor/tensor.h"
#include "device/k_ew.h"
#include "ops/reduce.h"
#include "ops/trace.h"
#include "tessera/ops.h"

/* x's shape as groups of adjacent dims, all reduced or all kept. */
typedef struct rgroups {
    int n;
    int64_t size[TS_MAX_DIMS];
    bool reduced[TS_MAX_DIMS];
} rgroups;

static void make_groups(int ndim, const int64_t *shape, const bool *reduce, rgroups *g) {
    g->n = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1) continue;
        if (g->n > 0 && g->reduced[g->n - 1] == reduce[d]) {
            g->size[g->n - 1] *= shape[d];
        } else {
            g->size[g->n] = shape[d];
            g->reduced[g->n] = reduce[d];
            g->n++;
        }
    }
}

static int64_t prod(const int64_t *v, int lo, int hi) {
    int64_t p = 1;
    for (int i = lo; i < hi; i++) p *= v[i];
    return p;
}

/* out = alpha * x (contiguous) summed over g's reduced groups, last first;
 * intermediate results live in scratch tensors. */
static ts_status sum_groups(const ts_tensor *x, const rgroups *g, float alpha, ts_tensor *out) {
    ts_device *d = x->storage->device;
    int first = 0;
    while (first < g->n && !g->reduced[first]) first++;
    if (first == g->n) return d->k_ew->scale(out, x, alpha); /* nothing to add up: a copy */
    int64_t sz[TS_MAX_DIMS];
    memcpy(sz, g->size, sizeof sz);
    const ts_tensor *cur = x;
    ts_tensor *tmp = NULL;
    ts_status st = TS_OK;
    for (int k = g->n - 1; k >= first && st == TS_OK; k--) {
        if (!g->reduced[k]) continue;
        int64_t outer = prod(sz, 0, k), inner = prod(sz, k + 1, g->n);
        ts_tensor *dst = out;
        if (k != first) st = ts__new(d, TS_F32, 1, (int64_t[]){outer * inner}, &dst);
        if (st != TS_OK) break;
        st = d->k_ew->sum_dim(dst, cur, outer, sz[k], inner, k == first ? alpha : 1.0f);
        ts_tensor_release(tmp);
        tmp = dst == out ? NULL : dst;
        cur = dst;
        sz[k] = 1;
    }
    ts_tensor_release(tmp);
    return st;
}

/* out (x's full shape) = alpha * gr (the reduced result, contiguous) repeated
 * over g's reduced groups, first group first. */
static ts_status expand_groups(const ts_tensor *gr, const rgroups *g, float alpha, ts_tensor *out) {
    ts_device *d = gr->storage->device;
    int last = g->n - 1;
    while (last >= 0 && !g->reduced[last]) last--;
    if (last < 0) return d->k_ew->scale(out, gr, alpha);
    int64_t sz[TS_MAX_DIMS];
    for (int k = 0; k < g->n; k++) sz[k] = g->reduced[k] ? 1 : g->size[k];
    const ts_tensor *cur = gr;
    ts_tensor *tmp = NULL;
    ts_status st = TS_OK;
    bool first = true;
    for (int k = 0; k <= last && st == TS_OK; k++) {
        if (!g->reduced[k]) continue;
        sz[k] = g->size[k];
        int64_t outer = prod(sz, 0, k), inner = prod(sz, k + 1, g->n);
        ts_tensor *dst = out;
        if (k != last) st = ts__new(d, TS_F32, 1, (int64_t[]){outer * sz[k] * inner}, &dst);
        if (st != TS_OK) break;
        st = d->k_ew->expand_dim(dst, cur, outer, sz[k], inner, first ? alpha : 1.0f);
        first = false;
        ts_tensor_release(tmp);
        tmp = dst == out ? NULL : dst;
        cur = dst;
    }
    ts_tensor_release(tmp);
    return st;
}

ts_status ts__sum_dims_into(const ts_tensor *x_in, const bool *reduce, float alpha, ts_tensor *out) {
    ts_tensor *x = NULL;
    TS_TRY(ts__contiguous(x_in, &x));
    rgroups g;
    make_groups(x->ndim, x->shape, reduce, &g);
    ts_status st = sum_groups(x, &g, alpha, out);
    ts_tensor_release(x);
    return st;
}

/* Wraps dim into [0, nd) (nd = max(ndim, 1): a 0-d tensor takes dim 0 or -1). */
static ts_status wrap_dim(const char *op, const ts_tensor *x, int dim, int *out) {
    int nd = x->ndim ? x->ndim : 1;
    if (dim < -nd || dim >= nd) {
        char b[96];
        return ts_error(TS_ERR_INVALID_ARG, "%s: dim %d is out of range for a tensor of shape %s (expected [%d, %d])",
                        op, dim, ts_shape_str(x->ndim, x->shape, b, sizeof b), -nd, nd - 1);
    }
    *out = dim < 0 ? dim + nd : dim;
    return TS_OK;
}

/* The result's shape: x's with the reduced dims set to 1 (keepdim) or removed. */
static int reduced_shape(const ts_tensor *x, const bool *reduce, bool keepdim, int64_t *shape) {
    int nd = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (!reduce[d])
            shape[nd++] = x->shape[d];
        else if (keepdim)
            shape[nd++] = 1;
    }
    return nd;
}

/* ---- sum and mean over dims ----------------------------------------------------------------------- */
/* p.i[0] = groups, p.i[1] = bit k set when group k is reduced, p.i[2 + k] = group sizes, p.i[10] = mean */
static ts_status sum_dims_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    rgroups g = {.n = (int)n->p.i[0]};
    int64_t count = 1;
    for (int k = 0; k < g.n; k++) {
        g.size[k] = n->p.i[2 + k];
        g.reduced[k] = (n->p.i[1] >> k) & 1;
        if (g.reduced[k]) count *= g.size[k];
    }
    float alpha = n->p.i[10] ? (float)(1.0 / (double)count) : 1.0f;
    ts_tensor *gc = NULL;
    TS_TRY(ts__contiguous(g_in, &gc));
    ts_status st = ts__new(gc->storage->device, TS_F32, n->in_ndim[0], n->in_shape[0], &gin[0]);
    if (st == TS_OK) st = expand_groups(gc, &g, alpha, gin[0]);
    ts_tensor_release(gc);
    return st;
}

typedef struct dims_args {
    const char *name;
    bool mean, keepdim;
    int ndims;
    const int *dims;
} dims_args;
static ts_status reduce_dims(const char *name, bool mean, const ts_tensor *x_in, int ndims, const int *dims,
                             bool keepdim, ts_tensor **out);
static ts_status dims_thunk(const ts_tensor *a, const ts_tensor *b, const void *arg, ts_tensor **out) {
    const dims_args *p = arg;
    (void)b;
    return reduce_dims(p->name, p->mean, a, p->ndims, p->dims, p->keepdim, out);
}

static ts_status reduce_dims(const char *name, bool mean, const ts_tensor *x_in, int ndims, const int *dims,
                             bool keepdim, ts_tensor **out) {
    if (ts__any_half(x_in, NULL))
        return ts__half_op(dims_thunk, x_in, NULL, &(dims_args){name, mean, keepdim, ndims, dims}, out);
    TS_TRY(ts__check_f32(name, "x", x_in));
    TS_ARG(out, "%s: NULL out", name);
    TS_ARG(ndims >= 0 && ndims <= TS_MAX_DIMS, "%s: ndims %d is out of range [0, %d]", name, ndims, TS_MAX_DIMS);
    TS_ARG(ndims == 0 || dims, "%s: NULL dims with ndims %d", name, ndims);
    bool reduce[TS_MAX_DIMS] = {false};
    for (int i = 0; i < ndims; i++) {
        int d = 0;
        TS_TRY(wrap_dim(name, x_in, dims[i], &d));
        if (x_in->ndim == 0) continue;
        if (reduce[d]) {
            char b[96];
            return ts_error(TS_ERR_INVALID_ARG, "%s: dim %d appears more than once in the dims of a tensor of shape %s",
                            name, d, ts_shape_str(x_in->ndim, x_in->shape, b, sizeof b));
        }
        reduce[d] = true;
    }
    if (ndims == 0)
        for (int d = 0; d < x_in->ndim; d++) reduce[d] = true;
    int64_t count = 1;
    for (int d = 0; d < x_in->ndim; d++)
        if (reduce[d]) count *= x_in->shape[d];
    float alpha = mean ? (float)(1.0 / (double)count) : 1.0f; /* count 0: inf, and 0 * inf = nan as in PyTorch */
    int64_t shape[TS_MAX_DIMS];
    int ond = reduced_shape(x_in, reduce, keepdim, shape);
    rgroups g;
    make_groups(x_in->ndim, x_in->shape, reduce, &g);
    ts_status st;
    ts_tensor *x = NULL, *o = NULL;
    TS_CHECK_GOTO(ts__contiguous(x_in, &x));
    TS_CHECK_GOTO(ts__new(x->storage->device, TS_F32, ond, shape, &o));
    TS_CHECK_GOTO(sum_groups(x, &g, alpha, o));
    ts_node *n = NULL;
    TS_CHECK_GOTO(ts__node_new(name, sum_dims_backward, 1, &x_in, &n));
    if (n) {
        n->p.i[0] = g.n;
        n->p.i[1] = 0;
        for (int k = 0; k < g.n; k++) {
            n->p.i[2 + k] = g.size[k];
            if (g.reduced[k]) n->p.i[1] |= (int64_t)1 << k;
        }
        n->p.i[10] = mean;
        TS_CHECK_GOTO(ts__node_attach(n, o));
    }
    ts__trace_attrs ta = {.i = {keepdim, 0}};
    for (int d = 0; d < x_in->ndim; d++)
        if (reduce[d]) ta.i[1] |= (int64_t)1 << d;
    TS_CHECK_GOTO(ts__trace_op(mean ? TS_OP_MEAN_DIMS : TS_OP_SUM_DIMS, 1, &x_in, o, &ta));
    *out = o;
    o = NULL;
fail:
    ts_tensor_release(x);
    ts_tensor_release(o);
    return st;
}

ts_status ts_sum_dims(const ts_tensor *x, int ndims, const int *dims, bool keepdim, ts_tensor **out) {
    return reduce_dims("sum_dims", false, x, ndims, dims, keepdim, out);
}
ts_status ts_mean_dims(const ts_tensor *x, int ndims, const int *dims, bool keepdim, ts_tensor **out) {
    return reduce_dims("mean_dims", true, x, ndims, dims, keepdim, out);
}

/* ---- max along a dim -------------------------------------------------------------------------------- */
/* saved: indices; p.i[0..2] = outer, n, inner */
static ts_status max_dim_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    ts_tensor *g = NULL;
    TS_TRY(ts__contiguous(g_in, &g));
    ts_device *d = g->storage->device;
    ts_status st = ts__new(d, TS_F32, n->in_ndim[0], n->in_shape[0], &gin[0]);
    if (st == TS_OK)
        st = d->k_ew->max_dim_backward(gin[0], g, ts__node_saved(n, 0), n->p.i[0], n->p.i[1], n->p.i[2]);
    ts_tensor_release(g);
    return st;
}

ts_status ts_max_dim(const ts_tensor *x_in, int dim, bool keepdim, ts_tensor **values, ts_tensor **indices) {
    TS_TRY(ts__check_f32("max_dim", "x", x_in));
    TS_ARG(values || indices, "max_dim: values and indices are both NULL");
    int d = 0;
    TS_TRY(wrap_dim("max_dim", x_in, dim, &d));
    int64_t outer = 1, n = 1, inner = 1;
    bool reduce[TS_MAX_DIMS] = {false};
    if (x_in->ndim) {
        outer = ts__numel(d, x_in->shape);
        n = x_in->shape[d];
        inner = ts__numel(x_in->ndim - d - 1, x_in->shape + d + 1);
        reduce[d] = true;
    }
    if (n == 0) {
        char b[96];
        return ts_error(TS_ERR_SHAPE, "max_dim: dim %d of a tensor of shape %s is empty: no maximum", d,
                        ts_shape_str(x_in->ndim, x_in->shape, b, sizeof b));
    }
    int64_t shape[TS_MAX_DIMS];
    int ond = reduced_shape(x_in, reduce, keepdim, shape);
    ts_status st;
    ts_tensor *x = NULL, *v = NULL, *idx = NULL;
    TS_CHECK_GOTO(ts__contiguous(x_in, &x));
    ts_device *dev = x->storage->device;
    TS_CHECK_GOTO(ts__new(dev, TS_F32, ond, shape, &v));
    TS_CHECK_GOTO(ts__new(dev, TS_I64, ond, shape, &idx));
    TS_CHECK_GOTO(dev->k_ew->max_dim(v, idx, x, outer, n, inner));
    ts_node *node = NULL;
    TS_CHECK_GOTO(ts__node_new("max_dim", max_dim_backward, 1, &x_in, &node));
    if (node) {
        ts__node_save(node, idx);
        node->p.i[0] = outer;
        node->p.i[1] = n;
        node->p.i[2] = inner;
        TS_CHECK_GOTO(ts__node_attach(node, v));
    }
    TS_CHECK_GOTO(ts__trace_op(TS_OP_MAX_DIM, 1, &x_in, v, &(ts__trace_attrs){.i = {d, keepdim}}));
    if (values) {
        *values = v;
        v = NULL;
    }
    if (indices) {
        *indices = idx;
        idx = NULL;
    }
fail:
    ts_tensor_release(x);
    ts_tensor_release(v);
    ts_tensor_release(idx);
    return st;
}
