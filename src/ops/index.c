/*
 * ops/index.c — embedding lookup: rows of a (num, dim) weight gathered at
 * TS_I64 indices of any shape; the weight's gradient is the scatter-add of
 * the output gradient's rows (repeated indices accumulate).
 */
#include "autograd/autograd.h"
#include "tensor/tensor.h"
#include "device/k_misc.h"
#include "ops/trace.h"
#include "tessera/ops.h"

static ts_status embedding_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    ts_tensor *g = NULL;
    TS_TRY(ts__contiguous(g_in, &g));
    ts_device *d = g->storage->device;
    ts_status st = ts__new(d, TS_F32, n->in_ndim[0], n->in_shape[0], &gin[0]);
    if (st == TS_OK) st = d->k_misc->embedding_backward(gin[0], ts__node_saved(n, 0), g);
    ts_tensor_release(g);
    return st;
}

ts_status ts_embedding(const ts_tensor *idx_in, const ts_tensor *weight, ts_tensor **out) {
    TS_ARG(idx_in, "embedding: indices are NULL");
    TS_ARG(out, "embedding: NULL out");
    TS_TRY(ts__check_f32("embedding", "weight", weight));
    TS_TRY(ts__check_ndim("embedding", "weight", weight, 2));
    TS_TRY(ts__check_same_device("embedding", idx_in, weight));
    char a[96], b[96];
    if (idx_in->dtype != TS_I64)
        return ts_error(TS_ERR_DTYPE, "embedding: indices %s have dtype %s, expected int64",
                        ts_shape_str(idx_in->ndim, idx_in->shape, a, sizeof a), ts_dtype_name(idx_in->dtype));
    if (idx_in->ndim + 1 > TS_MAX_DIMS)
        return ts_error(TS_ERR_SHAPE, "embedding: indices %s with weight %s give more than %d dimensions",
                        ts_shape_str(idx_in->ndim, idx_in->shape, a, sizeof a),
                        ts_shape_str(2, weight->shape, b, sizeof b), TS_MAX_DIMS);
    int64_t shape[TS_MAX_DIMS];
    memcpy(shape, idx_in->shape, sizeof(int64_t) * (size_t)idx_in->ndim);
    shape[idx_in->ndim] = weight->shape[1];

    ts_status st;
    ts_tensor *idx = NULL, *w = NULL, *o = NULL;
    ts_device *d = weight->storage->device;
    TS_CHECK_GOTO(ts__contiguous(idx_in, &idx));
    TS_CHECK_GOTO(ts__contiguous(weight, &w));
    TS_CHECK_GOTO(ts__new(d, TS_F32, idx_in->ndim + 1, shape, &o));
    TS_CHECK_GOTO(d->k_misc->embedding(o, idx, w));
    /* the indices are not differentiable: the node's one input is the weight */
    ts_node *n = NULL;
    TS_CHECK_GOTO(ts__node_new("embedding", embedding_backward, 1, &weight, &n));
    if (n) {
        ts__node_save(n, idx);
        TS_CHECK_GOTO(ts__node_attach(n, o));
    }
    const ts_tensor *tin[2] = {idx_in, weight};
    TS_CHECK_GOTO(ts__trace_op(TS_OP_EMBEDDING, 2, tin, o, NULL));
    *out = o;
    o = NULL;
fail:
    ts_tensor_release(idx);
    ts_tensor_release(w);
    ts_tensor_release(o);
    return st;
}
