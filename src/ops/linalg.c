/*
 * ops/linalg.c — matmul and linear (x w^T + b) over the device's sgemm.
 */
#include "autograd/autograd.h"
#include "tensor/tensor.h"
#include "device/k_blas.h"
#include "device/k_ew.h"
#include "ops/trace.h"
#include "tessera/ops.h"

/* out (rows, cols) += bias (cols) broadcast over rows */
static ts_status add_row_bias(ts_tensor *out, const ts_tensor *bias) {
    int64_t ostr[2] = {out->shape[1], 1}, bstr[2] = {0, bias->stride[0]};
    return out->storage->device->k_ew->binary(TS_BIN_ADD, out, out, ostr, bias, bstr);
}

/* ---- matmul ---------------------------------------------------------------------------------- */
static ts_status matmul_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    const ts_tensor *a = ts__node_saved(n, 0), *b = ts__node_saved(n, 1);
    ts_device *d = g->storage->device;
    int64_t M = a->shape[0], K = a->shape[1], N = b->shape[1];
    if (n->needs[0]) { /* ga = g b^T: (M,N)(N,K) */
        TS_TRY(ts__new_like(a, &gin[0]));
        TS_TRY(d->k_blas->sgemm(d, false, true, M, K, N, 1.0f, ts__f32(g), N, ts__f32(b), N, 0.0f, ts__f32(gin[0]), K));
    }
    if (n->needs[1]) { /* gb = a^T g: (K,M)(M,N) */
        TS_TRY(ts__new_like(b, &gin[1]));
        TS_TRY(d->k_blas->sgemm(d, true, false, K, N, M, 1.0f, ts__f32(a), K, ts__f32(g), N, 0.0f, ts__f32(gin[1]), N));
    }
    return TS_OK;
}

ts_status ts_matmul(const ts_tensor *a_in, const ts_tensor *b_in, ts_tensor **out) {
    TS_TRY(ts__check_f32("matmul", "a", a_in));
    TS_TRY(ts__check_f32("matmul", "b", b_in));
    TS_TRY(ts__check_ndim("matmul", "a", a_in, 2));
    TS_TRY(ts__check_ndim("matmul", "b", b_in, 2));
    TS_TRY(ts__check_same_device("matmul", a_in, b_in));
    TS_ARG(out, "matmul: NULL out");
    if (a_in->shape[1] != b_in->shape[0]) {
        char x[64], y[64];
        return ts_error(TS_ERR_SHAPE, "matmul: a %s and b %s: inner dimensions differ",
                        ts_shape_str(2, a_in->shape, x, sizeof x), ts_shape_str(2, b_in->shape, y, sizeof y));
    }
    ts_status st;
    ts_tensor *a = NULL, *b = NULL, *o = NULL;
    TS_CHECK_GOTO(ts__contiguous(a_in, &a));
    TS_CHECK_GOTO(ts__contiguous(b_in, &b));
    int64_t M = a->shape[0], K = a->shape[1], N = b->shape[1];
    ts_device *d = a->storage->device;
    TS_CHECK_GOTO(ts__new(d, TS_F32, 2, (int64_t[]){M, N}, &o));
    if (K == 0)
        TS_CHECK_GOTO(d->k_ew->fill(o, 0.0f));
    else
        TS_CHECK_GOTO(d->k_blas->sgemm(d, false, false, M, N, K, 1.0f, ts__f32(a), K, ts__f32(b), N, 0.0f, ts__f32(o), N));
    const ts_tensor *in[2] = {a_in, b_in};
    ts_node *n = NULL;
    TS_CHECK_GOTO(ts__node_new("matmul", matmul_backward, 2, in, &n));
    if (n) {
        ts__node_save(n, a);
        ts__node_save(n, b);
        TS_CHECK_GOTO(ts__node_attach(n, o));
    }
    TS_CHECK_GOTO(ts__trace_op(TS_OP_MATMUL, 2, in, o, NULL));
    *out = o;
    o = NULL;
fail:
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(o);
    return st;
}

/* ---- linear ------------------------------------------------------------------------------------- */
static ts_status linear_backward(ts_node *n, ts_tensor *g, ts_tensor **gin) {
    const ts_tensor *x = ts__node_saved(n, 0), *w = ts__node_saved(n, 1);
    ts_device *d = g->storage->device;
    int64_t N = x->shape[0], IN = x->shape[1], OUT = w->shape[0];
    if (n->needs[0]) { /* gx = g w: (N,OUT)(OUT,IN) */
        TS_TRY(ts__new_like(x, &gin[0]));
        TS_TRY(d->k_blas->sgemm(d, false, false, N, IN, OUT, 1.0f, ts__f32(g), OUT, ts__f32(w), IN, 0.0f,
                                ts__f32(gin[0]), IN));
    }
    if (n->needs[1]) { /* gw = g^T x: (OUT,N)(N,IN) */
        TS_TRY(ts__new_like(w, &gin[1]));
        TS_TRY(d->k_blas->sgemm(d, true, false, OUT, IN, N, 1.0f, ts__f32(g), OUT, ts__f32(x), IN, 0.0f,
                                ts__f32(gin[1]), IN));
    }
    if (n->needs[2]) { /* gb = column sums of g */
        TS_TRY(ts__new(d, TS_F32, 1, &OUT, &gin[2]));
        int64_t ostr[2] = {0, 1};
        TS_TRY(d->k_ew->reduce_to(gin[2], g, ostr));
    }
    return TS_OK;
}

ts_status ts_linear(const ts_tensor *x_in, const ts_tensor *w_in, const ts_tensor *b, ts_tensor **out) {
    TS_TRY(ts__check_f32("linear", "x", x_in));
    TS_TRY(ts__check_f32("linear", "weight", w_in));
    TS_TRY(ts__check_ndim("linear", "x", x_in, 2));
    TS_TRY(ts__check_ndim("linear", "weight", w_in, 2));
    TS_TRY(ts__check_same_device("linear", x_in, w_in));
    TS_ARG(out, "linear: NULL out");
    char s1[64], s2[64];
    if (x_in->shape[1] != w_in->shape[1])
        return ts_error(TS_ERR_SHAPE, "linear: input %s does not fit weight %s (in_features %lld)",
                        ts_shape_str(2, x_in->shape, s1, sizeof s1), ts_shape_str(2, w_in->shape, s2, sizeof s2),
                        (long long)w_in->shape[1]);
    if (b) {
        TS_TRY(ts__check_f32("linear", "bias", b));
        TS_TRY(ts__check_same_device("linear", x_in, b));
        if (b->ndim != 1 || b->shape[0] != w_in->shape[0])
            return ts_error(TS_ERR_SHAPE, "linear: bias %s for weight %s", ts_shape_str(b->ndim, b->shape, s1, sizeof s1),
                            ts_shape_str(2, w_in->shape, s2, sizeof s2));
    }
    ts_status st;
    ts_tensor *x = NULL, *w = NULL, *o = NULL;
    TS_CHECK_GOTO(ts__contiguous(x_in, &x));
    TS_CHECK_GOTO(ts__contiguous(w_in, &w));
    int64_t N = x->shape[0], IN = x->shape[1], OUT = w->shape[0];
    ts_device *d = x->storage->device;
    TS_CHECK_GOTO(ts__new(d, TS_F32, 2, (int64_t[]){N, OUT}, &o));
    if (IN == 0)
        TS_CHECK_GOTO(d->k_ew->fill(o, 0.0f));
    else
        TS_CHECK_GOTO(d->k_blas->sgemm(d, false, true, N, OUT, IN, 1.0f, ts__f32(x), IN, ts__f32(w), IN, 0.0f,
                                       ts__f32(o), OUT));
    if (b) TS_CHECK_GOTO(add_row_bias(o, b));
    const ts_tensor *in[3] = {x_in, w_in, b};
    ts_node *n = NULL;
    TS_CHECK_GOTO(ts__node_new("linear", linear_backward, 3, in, &n));
    if (n) {
        ts__node_save(n, x);
        ts__node_save(n, w);
        TS_CHECK_GOTO(ts__node_attach(n, o));
    }
    TS_CHECK_GOTO(ts__trace_op(TS_OP_LINEAR, 3, in, o, NULL));
    *out = o;
    o = NULL;
fail:
    ts_tensor_release(x);
    ts_tensor_release(w);
    ts_tensor_release(o);
    return st;
}
