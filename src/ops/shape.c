/*
 * ops/shape.c — reshape, flatten, concat, slice, permute and transpose, with
 * their backward functions. Any dtype (gradients only flow for F32). PyTorch
 * 1.13 semantics:
 *   reshape: one -1 inferred; a view sharing storage when the input is
 *            contiguous, else a contiguous copy.
 *   flatten: dims [start_dim, ndim) merged; a 0-d tensor becomes (1).
 *   concat:  along any dim (negative counts from the end); sizes must agree
 *            elsewhere; 1-D empty tensors of shape (0) are skipped (PyTorch's
 *            legacy rule), 0-d tensors are an error.
 *   slice:   [start, end) along dim, negative values count from the end and
 *            both are clamped to [0, size] as Python slicing does; a
 *            contiguous copy.
 *   flatten_range: dims [start, end] merged (torch.flatten(x, start, end)).
 *   permute / transpose: negative dims count from the end; a contiguous copy
 *            (PyTorch returns a view); backward permutes back.
 */
#include "autograd/autograd.h"
#include "tensor/tensor.h"
#include "device/k_ew.h"
#include "device/k_misc.h"
#include "ops/trace.h"
#include "tessera/ops.h"

/* Wraps a possibly negative dim into [0, ndim); an error naming op and shape otherwise. */
static ts_status wrap_dim(const char *op, int dim, const ts_tensor *x, int ndim, int *out) {
    if (dim < -ndim || dim >= ndim) {
        char b[96];
        return ts_error(TS_ERR_INVALID_ARG, "%s: dim %d is out of range for a tensor of shape %s (expected [%d, %d])",
                        op, dim, ts_shape_str(x->ndim, x->shape, b, sizeof b), -ndim, ndim - 1);
    }
    *out = dim < 0 ? dim + ndim : dim;
    return TS_OK;
}

/* outer = prod(shape[:dim]), inner = prod(shape[dim+1:]) */
static void outer_inner(int ndim, const int64_t *shape, int dim, int64_t *outer, int64_t *inner) {
    *outer = ts__numel(dim, shape);
    *inner = ts__numel(ndim - dim - 1, shape + dim + 1);
}

/* ---- reshape / flatten ------------------------------------------------------------------------------ */
static ts_status reshape_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    ts_tensor *c = NULL;
    TS_TRY(ts__contiguous(g, &c));
    ts_status st = ts__view(c, n->in_ndim[0], n->in_shape[0], &gin[0]);
    ts_tensor_release(c);
    return st;
}

/* Reshape to a fully known shape; op names the public function for errors and the node; the
 * tracer gets kind with attributes a. */
static ts_status reshape_to(const char *op, const ts_tensor *x, int ndim, const int64_t *shape, ts__op_kind kind,
                            const ts__trace_attrs *a, ts_tensor **out) {
    ts_tensor *o = NULL;
    if (ts_tensor_is_contiguous(x)) {
        TS_TRY(ts__view(x, ndim, shape, &o));
    } else {
        ts_tensor *c = NULL;
        TS_TRY(ts__contiguous(x, &c));
        ts_status st = ts__view(c, ndim, shape, &o);
        ts_tensor_release(c);
        TS_TRY(st);
    }
    ts_node *n = NULL;
    ts_status st = ts__node_new(op, reshape_backward, 1, &x, &n);
    if (n) st = ts__node_attach(n, o);
    if (st == TS_OK) st = ts__trace_op(kind, 1, &x, o, a);
    if (st != TS_OK) {
        ts_tensor_release(o);
        return st;
    }
    *out = o;
    return TS_OK;
}

ts_status ts_reshape(const ts_tensor *x, int ndim, const int64_t *shape, ts_tensor **out) {
    TS_ARG(x, "reshape: x is NULL");
    TS_ARG(out, "reshape: NULL out");
    char a[96], b[96];
    if (ndim < 0 || ndim > TS_MAX_DIMS)
        return ts_error(TS_ERR_SHAPE, "reshape: ndim %d is out of range [0, %d] (input %s)", ndim, TS_MAX_DIMS,
                        ts_shape_str(x->ndim, x->shape, a, sizeof a));
    TS_ARG(ndim == 0 || shape, "reshape: NULL shape with ndim %d", ndim);
    int64_t s[TS_MAX_DIMS];
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < ndim; i++) {
        s[i] = shape[i];
        if (shape[i] == -1) {
            if (infer >= 0)
                return ts_error(TS_ERR_INVALID_ARG, "reshape: only one dimension can be -1, got shape %s",
                                ts_shape_str(ndim, shape, b, sizeof b));
            infer = i;
        } else if (shape[i] < 0) {
            return ts_error(TS_ERR_INVALID_ARG, "reshape: invalid size %lld in dim %d of shape %s", (long long)shape[i],
                            i, ts_shape_str(ndim, shape, b, sizeof b));
        } else {
            known *= shape[i];
        }
    }
    int64_t numel = ts_tensor_numel(x);
    if (infer >= 0) {
        if (known == 0)
            return ts_error(TS_ERR_SHAPE,
                            "reshape: cannot reshape a tensor of shape %s (%lld elements) into shape %s: the -1 "
                            "dimension is ambiguous when another dimension is 0",
                            ts_shape_str(x->ndim, x->shape, a, sizeof a), (long long)numel,
                            ts_shape_str(ndim, shape, b, sizeof b));
        if (numel % known != 0)
            return ts_error(TS_ERR_SHAPE, "reshape: shape %s is invalid for an input of shape %s (%lld elements)",
                            ts_shape_str(ndim, shape, b, sizeof b), ts_shape_str(x->ndim, x->shape, a, sizeof a),
                            (long long)numel);
        s[infer] = numel / known;
    } else if (known != numel) {
        return ts_error(TS_ERR_SHAPE, "reshape: shape %s is invalid for an input of shape %s (%lld elements)",
                        ts_shape_str(ndim, shape, b, sizeof b), ts_shape_str(x->ndim, x->shape, a, sizeof a),
                        (long long)numel);
    }
    ts__trace_attrs ta = {.i = {ndim}};
    for (int i = 0; i < ndim; i++) ta.i[1 + i] = shape[i];
    return reshape_to("reshape", x, ndim, s, TS_OP_RESHAPE, &ta, out);
}

ts_status ts_flatten(const ts_tensor *x, int start_dim, ts_tensor **out) {
    TS_ARG(x, "flatten: x is NULL");
    TS_ARG(out, "flatten: NULL out");
    int d = 0;
    /* a 0-d tensor behaves as one dim for wrapping and becomes (1) */
    TS_TRY(wrap_dim("flatten", start_dim, x, x->ndim ? x->ndim : 1, &d));
    int64_t s[TS_MAX_DIMS];
    if (x->ndim == 0) {
        s[0] = 1;
        return reshape_to("flatten", x, 1, s, TS_OP_FLATTEN, &(ts__trace_attrs){.i = {0}}, out);
    }
    for (int i = 0; i < d; i++) s[i] = x->shape[i];
    s[d] = ts__numel(x->ndim - d, x->shape + d);
    return reshape_to("flatten", x, d + 1, s, TS_OP_FLATTEN, &(ts__trace_attrs){.i = {d}}, out);
}

/* ---- concat ------------------------------------------------------------------------------------------ */
/* PyTorch 1.13 skips 1-D empty tensors in cat whatever the other shapes are. */
static bool legacy_empty(int ndim, const int64_t *shape) { return ndim == 1 && shape[0] == 0; }

static ts_status concat_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    int dim = (int)n->p.i[0];
    ts_tensor *g = NULL;
    TS_TRY(ts__contiguous(g_in, &g));
    ts_device *d = g->storage->device;
    int64_t outer, inner, total = g->shape[dim], off = 0;
    outer_inner(g->ndim, g->shape, dim, &outer, &inner);
    ts_status st = TS_OK;
    for (int i = 0; i < n->ninputs && st == TS_OK; i++) {
        bool skip = legacy_empty(n->in_ndim[i], n->in_shape[i]);
        int64_t sz = skip ? 0 : n->in_shape[i][dim];
        if (n->needs[i]) {
            st = ts__new(d, g->dtype, n->in_ndim[i], n->in_shape[i], &gin[i]);
            if (st == TS_OK && sz > 0) st = d->k_misc->narrow_copy(gin[i], sz, 0, g, total, off, sz, outer, inner);
        }
        off += sz;
    }
    ts_tensor_release(g);
    return st;
}

/* Validates the whole list: wrapped dim and output shape. */
static ts_status concat_check(ts_tensor *const *xs, int n, int dim, int *wdim, int *ondim, int64_t *oshape) {
    TS_ARG(xs, "concat: NULL tensor list");
    TS_ARG(n >= 1, "concat: expected a non-empty list of tensors, got %d", n);
    const ts_tensor *ref = NULL;
    for (int i = 0; i < n; i++) {
        TS_ARG(xs[i], "concat: tensor %d is NULL", i);
        if (xs[i]->ndim == 0)
            return ts_error(TS_ERR_SHAPE, "concat: zero-dimensional tensor (at position %d) cannot be concatenated", i);
        if (xs[i]->dtype != xs[0]->dtype)
            return ts_error(TS_ERR_DTYPE, "concat: tensor %d has dtype %s but tensor 0 has dtype %s", i,
                            ts_dtype_name(xs[i]->dtype), ts_dtype_name(xs[0]->dtype));
        TS_TRY(ts__check_same_device("concat", xs[0], xs[i]));
        if (!ref && !legacy_empty(xs[i]->ndim, xs[i]->shape)) ref = xs[i];
    }
    if (!ref) ref = xs[0]; /* all are (0): the result is (0) */
    int d = 0;
    TS_TRY(wrap_dim("concat", dim, ref, ref->ndim, &d));
    int64_t total = 0;
    char a[96], b[96];
    for (int i = 0; i < n; i++) {
        const ts_tensor *x = xs[i];
        if (legacy_empty(x->ndim, x->shape)) continue;
        if (x->ndim != ref->ndim)
            return ts_error(TS_ERR_SHAPE, "concat: tensors must have the same number of dimensions: tensor %d has shape "
                            "%s, expected %d dimensions like %s",
                            i, ts_shape_str(x->ndim, x->shape, a, sizeof a), ref->ndim,
                            ts_shape_str(ref->ndim, ref->shape, b, sizeof b));
        for (int k = 0; k < ref->ndim; k++)
            if (k != d && x->shape[k] != ref->shape[k])
                return ts_error(TS_ERR_SHAPE,
                                "concat: sizes must match except in dim %d: tensor %d has shape %s, expected %s "
                                "(size %lld in dim %d, got %lld)",
                                d, i, ts_shape_str(x->ndim, x->shape, a, sizeof a),
                                ts_shape_str(ref->ndim, ref->shape, b, sizeof b), (long long)ref->shape[k], k,
                                (long long)x->shape[k]);
        total += x->shape[d];
    }
    *wdim = d;
    *ondim = ref->ndim;
    memcpy(oshape, ref->shape, sizeof(int64_t) * (size_t)ref->ndim);
    oshape[d] = total;
    return TS_OK;
}

/* Concatenates a validated list (n <= TS_NODE_MAX_INPUTS when recording) along wrapped dim d. */
static ts_status concat_run(ts_tensor *const *xs, int n, int d, int ndim, const int64_t *shape, ts_tensor **out) {
    ts_device *dev = xs[0]->storage->device;
    ts_tensor *o = NULL;
    TS_TRY(ts__new(dev, xs[0]->dtype, ndim, shape, &o));
    int64_t outer, inner, total = shape[d], off = 0;
    outer_inner(ndim, shape, d, &outer, &inner);
    ts_status st = TS_OK;
    for (int i = 0; i < n && st == TS_OK; i++) {
        const ts_tensor *x = xs[i];
        if (legacy_empty(x->ndim, x->shape)) continue;
        int64_t sz = x->shape[d];
        if (sz > 0 && outer * inner > 0) {
            ts_tensor *c = NULL;
            st = ts__contiguous(x, &c);
            if (st == TS_OK) st = dev->k_misc->narrow_copy(o, total, off, c, sz, 0, sz, outer, inner);
            ts_tensor_release(c);
        }
        off += sz;
    }
    ts_node *node = NULL;
    if (st == TS_OK) st = ts__node_new("concat", concat_backward, n, (const ts_tensor *const *)xs, &node);
    if (node) {
        node->p.i[0] = d;
        st = ts__node_attach(node, o);
    }
    if (st != TS_OK) {
        ts_tensor_release(o);
        return st;
    }
    *out = o;
    return TS_OK;
}

ts_status ts_concat(ts_tensor *const *xs, int n, int dim, ts_tensor **out) {
    TS_ARG(out, "concat: NULL out");
    int d = 0, ndim = 0;
    int64_t shape[TS_MAX_DIMS];
    TS_TRY(concat_check(xs, n, dim, &d, &ndim, shape));
    bool record = false;
    if (ts_grad_is_enabled())
        for (int i = 0; i < n; i++) record |= xs[i]->requires_grad;
    if (n <= TS_NODE_MAX_INPUTS || !record) {
        TS_TRY(concat_run(xs, n, d, ndim, shape, out));
        ts_status st = ts__trace_op(TS_OP_CONCAT, n, (const ts_tensor *const *)xs, *out, &(ts__trace_attrs){.i = {d}});
        if (st != TS_OK) {
            ts_tensor_release(*out);
            *out = NULL;
        }
        return st;
    }

    /* A node has at most TS_NODE_MAX_INPUTS inputs: fold the list left to
     * right, each step concatenating the running result with the next ones. */
    ts_tensor *acc = NULL;
    int k = 0;
    while (k < n) {
        ts_tensor *grp[TS_NODE_MAX_INPUTS];
        int64_t gshape[TS_MAX_DIMS];
        memcpy(gshape, shape, sizeof gshape);
        gshape[d] = 0;
        int m = 0;
        if (acc) {
            grp[m++] = acc;
            gshape[d] = acc->shape[d];
        }
        while (m < TS_NODE_MAX_INPUTS && k < n) {
            ts_tensor *x = xs[k++];
            if (!legacy_empty(x->ndim, x->shape)) gshape[d] += x->shape[d];
            grp[m++] = x;
        }
        ts_tensor *next = NULL;
        ts_status st = concat_run(grp, m, d, ndim, gshape, &next);
        ts_tensor_release(acc);
        if (st != TS_OK) return st;
        acc = next;
    }
    *out = acc;
    return TS_OK;
}

/* ---- slice ---------------------------------------------------------------------------------------------- */
static ts_status slice_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    int dim = (int)n->p.i[0];
    int64_t start = n->p.i[1];
    ts_tensor *g = NULL;
    TS_TRY(ts__contiguous(g_in, &g));
    ts_device *d = g->storage->device;
    int64_t outer, inner, len = g->shape[dim];
    outer_inner(g->ndim, g->shape, dim, &outer, &inner);
    ts_status st = ts_tensor_zeros(d, g->dtype, n->in_ndim[0], n->in_shape[0], &gin[0]);
    if (st == TS_OK && len > 0)
        st = d->k_misc->narrow_copy(gin[0], n->in_shape[0][dim], start, g, len, 0, len, outer, inner);
    ts_tensor_release(g);
    return st;
}

ts_status ts_slice(const ts_tensor *x, int dim, int64_t start, int64_t end, ts_tensor **out) {
    TS_ARG(x, "slice: x is NULL");
    TS_ARG(out, "slice: NULL out");
    if (x->ndim == 0) return ts_error(TS_ERR_SHAPE, "slice: cannot slice a 0-dimensional tensor (shape [])");
    int d = 0;
    TS_TRY(wrap_dim("slice", dim, x, x->ndim, &d));
    int64_t size = x->shape[d];
    /* Python slicing: negative counts from the end, then clamp to [0, size] */
    if (start < 0) start += size;
    if (end < 0) end += size;
    start = TS_MIN(TS_MAX(start, 0), size);
    end = TS_MIN(TS_MAX(end, start), size);
    int64_t len = end - start;
    int64_t shape[TS_MAX_DIMS];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    shape[d] = len;
    ts_device *dev = x->storage->device;
    ts_tensor *o = NULL, *c = NULL;
    TS_TRY(ts__new(dev, x->dtype, x->ndim, shape, &o));
    int64_t outer, inner;
    outer_inner(x->ndim, x->shape, d, &outer, &inner);
    ts_status st = TS_OK;
    if (len > 0 && outer * inner > 0) {
        st = ts__contiguous(x, &c);
        if (st == TS_OK) st = dev->k_misc->narrow_copy(o, len, 0, c, size, start, len, outer, inner);
        ts_tensor_release(c);
    }
    ts_node *n = NULL;
    if (st == TS_OK) st = ts__node_new("slice", slice_backward, 1, &x, &n);
    if (n) {
        n->p.i[0] = d;
        n->p.i[1] = start;
        st = ts__node_attach(n, o);
    }
    if (st == TS_OK) st = ts__trace_op(TS_OP_SLICE, 1, &x, o, &(ts__trace_attrs){.i = {d, start, end}});
    if (st != TS_OK) {
        ts_tensor_release(o);
        return st;
    }
    *out = o;
    return TS_OK;
}

ts_status ts_flatten_range(const ts_tensor *x, int start_dim, int end_dim, ts_tensor **out) {
    TS_ARG(x, "flatten_range: x is NULL");
    TS_ARG(out, "flatten_range: NULL out");
    int nd = x->ndim ? x->ndim : 1, s = 0, e = 0;
    TS_TRY(wrap_dim("flatten_range", start_dim, x, nd, &s));
    TS_TRY(wrap_dim("flatten_range", end_dim, x, nd, &e));
    if (s > e) {
        char b[96];
        return ts_error(TS_ERR_INVALID_ARG, "flatten_range: start_dim %d comes after end_dim %d for a tensor of shape %s",
                        start_dim, end_dim, ts_shape_str(x->ndim, x->shape, b, sizeof b));
    }
    int64_t shape[TS_MAX_DIMS];
    int k = 0;
    if (x->ndim == 0) {
        shape[k++] = 1;
    } else {
        for (int i = 0; i < s; i++) shape[k++] = x->shape[i];
        shape[k++] = ts__numel(e - s + 1, x->shape + s);
        for (int i = e + 1; i < x->ndim; i++) shape[k++] = x->shape[i];
    }
    /* traced as the reshape it is (the exporter keeps a batch dim symbolic) */
    ts__trace_attrs ta = {.i = {k}};
    for (int i = 0; i < k; i++) ta.i[1 + i] = shape[i];
    return reshape_to("flatten_range", x, k, shape, TS_OP_RESHAPE, &ta, out);
}

/* ---- permute / transpose ------------------------------------------------------------------------------ */
/* p.i[d] = perm[d]: the gradient is permuted back with the inverse */
static ts_status permute_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    int nd = n->in_ndim[0], inv[TS_MAX_DIMS];
    for (int d = 0; d < nd; d++) inv[n->p.i[d]] = d;
    ts_tensor *g = NULL;
    TS_TRY(ts__contiguous(g_in, &g));
    ts_status st = ts__new(g->storage->device, g->dtype, nd, n->in_shape[0], &gin[0]);
    if (st == TS_OK) st = g->storage->device->k_ew->permute(gin[0], g, inv);
    ts_tensor_release(g);
    return st;
}

/* perm: wrapped and checked */
static ts_status permute_run(const char *op, const ts_tensor *x_in, const int *perm, ts_tensor **out) {
    int64_t shape[TS_MAX_DIMS];
    for (int d = 0; d < x_in->ndim; d++) shape[d] = x_in->shape[perm[d]];
    ts_status st;
    ts_tensor *x = NULL, *o = NULL;
    TS_CHECK_GOTO(ts__contiguous(x_in, &x));
    ts_device *dev = x->storage->device;
    TS_CHECK_GOTO(ts__new(dev, x->dtype, x->ndim, shape, &o));
    TS_CHECK_GOTO(dev->k_ew->permute(o, x, perm));
    ts_node *n = NULL;
    TS_CHECK_GOTO(ts__node_new(op, permute_backward, 1, &x_in, &n));
    if (n) {
        for (int d = 0; d < x_in->ndim; d++) n->p.i[d] = perm[d];
        TS_CHECK_GOTO(ts__node_attach(n, o));
    }
    ts__trace_attrs ta = {.i = {x_in->ndim}};
    for (int d = 0; d < x_in->ndim; d++) ta.i[1 + d] = perm[d];
    TS_CHECK_GOTO(ts__trace_op(TS_OP_PERMUTE, 1, &x_in, o, &ta));
    *out = o;
    o = NULL;
fail:
    ts_tensor_release(x);
    ts_tensor_release(o);
    return st;
}

ts_status ts_permute(const ts_tensor *x, const int *perm, ts_tensor **out) {
    TS_ARG(x, "permute: x is NULL");
    TS_ARG(out, "permute: NULL out");
    TS_ARG(perm || x->ndim == 0, "permute: NULL perm for a tensor of %d dims", x->ndim);
    int p[TS_MAX_DIMS];
    bool seen[TS_MAX_DIMS] = {false};
    for (int d = 0; d < x->ndim; d++) {
        TS_TRY(wrap_dim("permute", perm[d], x, x->ndim, &p[d]));
        if (seen[p[d]]) {
            char b[96];
            return ts_error(TS_ERR_INVALID_ARG, "permute: dim %d appears more than once in the permutation of a tensor "
                            "of shape %s", p[d], ts_shape_str(x->ndim, x->shape, b, sizeof b));
        }
        seen[p[d]] = true;
    }
    return permute_run("permute", x, p, out);
}

ts_status ts_transpose(const ts_tensor *x, int dim0, int dim1, ts_tensor **out) {
    TS_ARG(x, "transpose: x is NULL");
    TS_ARG(out, "transpose: NULL out");
    int nd = x->ndim ? x->ndim : 1, a = 0, b = 0; /* a 0-d tensor takes dims 0 and -1 */
    TS_TRY(wrap_dim("transpose", dim0, x, nd, &a));
    TS_TRY(wrap_dim("transpose", dim1, x, nd, &b));
    int p[TS_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) p[d] = d;
    if (x->ndim) {
        p[a] = b;
        p[b] = a;
    }
    return permute_run("transpose", x, p, out);
}
