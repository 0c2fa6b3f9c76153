/*
 * ops/linalg.c — matmul (2-D, or batched with broadcast batch dims as
 * torch.matmul), bmm and linear (x w^T + b) over the device's sgemm.
 *
 * Batched products: a (..., M, K) and b (..., K, N) are made contiguous and
 * the batch dims broadcast; each batch index gets the element offsets of its
 * a and b matrices (0 strides on broadcast dims), and one sgemm_batched call
 * does them all. Backward writes the gradient of a non-broadcast operand
 * straight into place; a broadcast operand's gradient is computed per output
 * batch and then summed over the broadcast dims (ops/reduce.h).
 */
#include "autograd/autograd.h"
#include "ops/half.h"
#include "tensor/tensor.h"
#include "device/k_blas.h"
#include "device/k_ew.h"
#include "ops/reduce.h"
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

static ts_status matmul_nd(const char *op, const ts_tensor *a_in, const ts_tensor *b_in, ts_tensor **out);
static ts_status matmul_run(const ts_tensor *a_in, const ts_tensor *b_in, ts_tensor **out);
static ts_status bmm_run(const ts_tensor *a, const ts_tensor *b, ts_tensor **out);

/* torch.matmul's vector cases through reshapes (their backward comes with them): a 1-D a (K) is
 * the matrix (1, K) and a 1-D b (K) the matrix (K, 1), and the dim each added is dropped from the
 * product: (K) x (K) -> (), (K) x (..., K, N) -> (..., N), (..., M, K) x (K) -> (..., M). */
static ts_status matmul_vec(const ts_tensor *a_in, const ts_tensor *b_in, ts_tensor **out) {
    const bool av = a_in->ndim == 1, bv = b_in->ndim == 1;
    ts_status st;
    ts_tensor *a = NULL, *b = NULL, *p = NULL;
    if (av)
        TS_CHECK_GOTO(ts_reshape(a_in, 2, (int64_t[]){1, a_in->shape[0]}, &a));
    else
        a = ts_tensor_retain((ts_tensor *)a_in);
    if (bv)
        TS_CHECK_GOTO(ts_reshape(b_in, 2, (int64_t[]){b_in->shape[0], 1}, &b));
    else
        b = ts_tensor_retain((ts_tensor *)b_in);
    if (a->shape[a->ndim - 1] != b->shape[b->ndim - 2]) {
        char x[96], y[96];
        st = ts_error(TS_ERR_SHAPE, "matmul: a %s and b %s: inner dimensions differ",
                      ts_shape_str(a_in->ndim, a_in->shape, x, sizeof x),
                      ts_shape_str(b_in->ndim, b_in->shape, y, sizeof y));
        goto fail;
    }
    TS_CHECK_GOTO(matmul_run(a, b, &p));
    int64_t shape[TS_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i < p->ndim; i++)
        if (!(av && i == p->ndim - 2) && !(bv && i == p->ndim - 1)) shape[nd++] = p->shape[i];
    TS_CHECK_GOTO(ts_reshape(p, nd, shape, out));
fail:
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(p);
    return st;
}

static ts_status matmul_thunk(const ts_tensor *a, const ts_tensor *b, const void *arg, ts_tensor **out) {
    return arg ? bmm_run(a, b, out) : matmul_run(a, b, out);
}

/* matmul and bmm: autocast casts both operands (ts__autocast); 16-bit operands run on float32 copies */
static ts_status autocast_pair(const char *op, const ts_tensor *a, const ts_tensor *b, ts_tensor **out) {
    TS_ARG(a && b && out, "%s: NULL argument", op);
    ts_tensor *ca = NULL, *cb = NULL;
    ts_status st = ts__autocast(a, &ca);
    if (st == TS_OK) st = ts__autocast(b, &cb);
    if (st == TS_OK)
        st = ts__any_half(ca, cb) ? ts__half_op(matmul_thunk, ca, cb, op[0] == 'b' ? "bmm" : NULL, out)
                                  : matmul_thunk(ca, cb, op[0] == 'b' ? "bmm" : NULL, out);
    ts_tensor_release(ca);
    ts_tensor_release(cb);
    return st;
}

ts_status ts_matmul(const ts_tensor *a_in, const ts_tensor *b_in, ts_tensor **out) {
    return autocast_pair("matmul", a_in, b_in, out);
}

static ts_status matmul_run(const ts_tensor *a_in, const ts_tensor *b_in, ts_tensor **out) {
    TS_TRY(ts__check_f32("matmul", "a", a_in));
    TS_TRY(ts__check_f32("matmul", "b", b_in));
    TS_TRY(ts__check_same_device("matmul", a_in, b_in));
    TS_ARG(out, "matmul: NULL out");
    if (a_in->ndim < 1 || b_in->ndim < 1) {
        char x[96], y[96];
        return ts_error(TS_ERR_SHAPE, "matmul: a %s and b %s: both need at least 1 dim (a 0-dim tensor is a scalar: use mul)",
                        ts_shape_str(a_in->ndim, a_in->shape, x, sizeof x),
                        ts_shape_str(b_in->ndim, b_in->shape, y, sizeof y));
    }
    if (a_in->ndim == 1 || b_in->ndim == 1) return matmul_vec(a_in, b_in, out);
    if (a_in->ndim > 2 || b_in->ndim > 2) return matmul_nd("matmul", a_in, b_in, out);
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

/* ---- batched matmul -------------------------------------------------------------------------------- */
/* a (..., M, K) x b (..., K, N): the broadcast batch shape bshape (nb dims, B
 * products) and per product the offsets of its a, b and output matrices. */
typedef struct bgeom {
    int nb;
    int64_t bshape[TS_MAX_DIMS];
    int64_t B, M, K, N;
    int64_t *aoff, *boff, *coff; /* one allocation, B entries each; coff[i] = i M N */
} bgeom;

static void bgeom_free(bgeom *g) { free(g->aoff); }

/* Per-out-batch-dim strides of an operand with batch dims shape[0..nd) over
 * matrices of msize elements (0 where it broadcasts). */
static void batch_strides(int nb, const int64_t *bshape, int nd, const int64_t *shape, int64_t msize,
                          int64_t *str) {
    int64_t s = msize;
    for (int i = nb - 1; i >= 0; i--) {
        int k = i - (nb - nd);
        str[i] = (k >= 0 && shape[k] == bshape[i] && shape[k] != 1) ? s : 0;
        if (k >= 0) s *= shape[k];
    }
}

static ts_status bgeom_make(const char *op, const ts_tensor *a, const ts_tensor *b, bgeom *g) {
    memset(g, 0, sizeof *g);
    int an = a->ndim - 2, bn = b->ndim - 2;
    char x[96], y[96];
    g->M = a->shape[an];
    g->K = a->shape[an + 1];
    g->N = b->shape[bn + 1];
    if (b->shape[bn] != g->K)
        return ts_error(TS_ERR_SHAPE, "%s: a %s and b %s: inner dimensions differ (%lld and %lld)", op,
                        ts_shape_str(a->ndim, a->shape, x, sizeof x), ts_shape_str(b->ndim, b->shape, y, sizeof y),
                        (long long)g->K, (long long)b->shape[bn]);
    g->nb = TS_MAX(an, bn);
    g->B = 1;
    for (int i = 0; i < g->nb; i++) {
        int ia = i - (g->nb - an), ib = i - (g->nb - bn);
        int64_t sa = ia >= 0 ? a->shape[ia] : 1, sb = ib >= 0 ? b->shape[ib] : 1;
        if (sa != sb && sa != 1 && sb != 1)
            return ts_error(TS_ERR_SHAPE, "%s: the batch dims of a %s and b %s cannot be broadcast together", op,
                            ts_shape_str(a->ndim, a->shape, x, sizeof x), ts_shape_str(b->ndim, b->shape, y, sizeof y));
        g->bshape[i] = sa == 1 ? sb : sa;
        g->B *= g->bshape[i];
    }
    g->aoff = ts__malloc(sizeof(int64_t) * 3 * (size_t)TS_MAX(g->B, 1));
    if (!g->aoff) return TS_ERR_NOMEM;
    g->boff = g->aoff + g->B;
    g->coff = g->boff + g->B;
    int64_t astr[TS_MAX_DIMS], bstr[TS_MAX_DIMS], idx[TS_MAX_DIMS] = {0};
    batch_strides(g->nb, g->bshape, an, a->shape, g->M * g->K, astr);
    batch_strides(g->nb, g->bshape, bn, b->shape, g->K * g->N, bstr);
    int64_t ao = 0, bo = 0;
    for (int64_t i = 0; i < g->B; i++) { /* an odometer over the batch index: no divisions */
        g->aoff[i] = ao;
        g->boff[i] = bo;
        g->coff[i] = i * g->M * g->N;
        for (int d = g->nb - 1; d >= 0; d--) {
            ao += astr[d];
            bo += bstr[d];
            if (++idx[d] < g->bshape[d]) break;
            ao -= astr[d] * g->bshape[d];
            bo -= bstr[d] * g->bshape[d];
            idx[d] = 0;
        }
    }
    return TS_OK;
}

/* b one matrix (no batch dims, or all of size 1) and a one per product: the
 * products are one (B M, K) x (K, N) product over a's rows (torch.matmul does
 * the same), for the forward and both gradients. Call after the output shape
 * is taken from g. */
static void bgeom_fold(const ts_tensor *a, const ts_tensor *b, bgeom *g) {
    if (g->B > 1 && ts__numel(b->ndim - 2, b->shape) == 1 && ts__numel(a->ndim - 2, a->shape) == g->B) {
        g->M *= g->B;
        g->B = 1;
    }
}

/* Gradient of operand t (ndim nd, shape) given its per-product gradients, computed
 * by run(C, cstride) into C: straight into *out when t is not broadcast, else into
 * a full (bshape, rows, cols) buffer summed down to t's shape. */
typedef struct bgrad {
    ts_device *d;
    const bgeom *g;
    bool ta, tb;
    int64_t M, N, K; /* this product's sizes */
    const float *A, *B;
    int64_t lda, ldb;
    const int64_t *aoff, *boff;
} bgrad;

static ts_status bgrad_run(const bgrad *p, int nd, const int64_t *shape, ts_tensor **out) {
    const bgeom *g = p->g;
    ts_device *d = p->d;
    TS_TRY(ts__new(d, TS_F32, nd, shape, out));
    int64_t msize = p->M * p->N;
    if (p->K == 0 || msize == 0 || g->B == 0) return d->k_ew->fill(*out, 0.0f);
    if (ts__numel(nd, shape) == g->B * msize) /* one product per matrix of t, in order: no broadcasting */
        return d->k_blas->sgemm_batched(d, p->ta, p->tb, p->M, p->N, p->K, 1.0f, p->A, p->lda, p->aoff, p->B, p->ldb,
                                        p->boff, 0.0f, ts__f32(*out), p->N, msize, g->B);
    int64_t fshape[TS_MAX_DIMS + 2];
    memcpy(fshape, g->bshape, sizeof(int64_t) * (size_t)g->nb);
    fshape[g->nb] = p->M;
    fshape[g->nb + 1] = p->N;
    bool reduce[TS_MAX_DIMS + 2] = {false};
    for (int i = 0; i < g->nb; i++) {
        int k = i - (g->nb - (nd - 2));
        reduce[i] = k < 0 || shape[k] != g->bshape[i];
    }
    ts_tensor *full = NULL;
    TS_TRY(ts__new(d, TS_F32, g->nb + 2, fshape, &full));
    ts_status st = d->k_blas->sgemm_batched(d, p->ta, p->tb, p->M, p->N, p->K, 1.0f, p->A, p->lda, p->aoff, p->B,
                                            p->ldb, p->boff, 0.0f, ts__f32(full), p->N, msize, g->B);
    if (st == TS_OK) st = ts__sum_dims_into(full, reduce, 1.0f, *out);
    ts_tensor_release(full);
    return st;
}

static ts_status matmul_nd_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    const ts_tensor *a = ts__node_saved(n, 0), *b = ts__node_saved(n, 1);
    ts_tensor *gc = NULL;
    TS_TRY(ts__contiguous(g_in, &gc));
    bgeom geo;
    ts_status st = bgeom_make(n->name, a, b, &geo);
    if (st != TS_OK) {
        ts_tensor_release(gc);
        return st;
    }
    bgeom_fold(a, b, &geo);
    ts_device *d = gc->storage->device;
    const int64_t M = geo.M, K = geo.K, N = geo.N;
    if (n->needs[0]) { /* ga_i = g_i b_i^T: (M,N)(N,K) */
        bgrad p = {d, &geo, false, true, M, K, N, ts__f32(gc), ts__f32(b), N, N, geo.coff, geo.boff};
        st = bgrad_run(&p, a->ndim, a->shape, &gin[0]);
    }
    if (st == TS_OK && n->needs[1]) { /* gb_i = a_i^T g_i: (K,M)(M,N) */
        bgrad p = {d, &geo, true, false, K, N, M, ts__f32(a), ts__f32(gc), K, N, geo.aoff, geo.coff};
        st = bgrad_run(&p, b->ndim, b->shape, &gin[1]);
    }
    bgeom_free(&geo);
    ts_tensor_release(gc);
    return st;
}

/* a: (..., M, K), b: (..., K, N), both F32 with ndim >= 2, on one device. */
static ts_status matmul_nd(const char *op, const ts_tensor *a_in, const ts_tensor *b_in, ts_tensor **out) {
    bgeom geo;
    TS_TRY(bgeom_make(op, a_in, b_in, &geo));
    ts_status st;
    ts_tensor *a = NULL, *b = NULL, *o = NULL;
    TS_CHECK_GOTO(ts__contiguous(a_in, &a));
    TS_CHECK_GOTO(ts__contiguous(b_in, &b));
    ts_device *d = a->storage->device;
    int64_t shape[TS_MAX_DIMS];
    memcpy(shape, geo.bshape, sizeof(int64_t) * (size_t)geo.nb);
    shape[geo.nb] = geo.M;
    shape[geo.nb + 1] = geo.N;
    TS_CHECK_GOTO(ts__new(d, TS_F32, geo.nb + 2, shape, &o));
    bgeom_fold(a, b, &geo);
    if (geo.K == 0)
        TS_CHECK_GOTO(d->k_ew->fill(o, 0.0f));
    else
        TS_CHECK_GOTO(d->k_blas->sgemm_batched(d, false, false, geo.M, geo.N, geo.K, 1.0f, ts__f32(a), geo.K, geo.aoff,
                                               ts__f32(b), geo.N, geo.boff, 0.0f, ts__f32(o), geo.N,
                                               geo.M * geo.N, geo.B));
    const ts_tensor *in[2] = {a_in, b_in};
    ts_node *n = NULL;
    TS_CHECK_GOTO(ts__node_new(op, matmul_nd_backward, 2, in, &n));
    if (n) {
        ts__node_save(n, a);
        ts__node_save(n, b);
        TS_CHECK_GOTO(ts__node_attach(n, o));
    }
    TS_CHECK_GOTO(ts__trace_op(TS_OP_MATMUL, 2, in, o, NULL)); /* ONNX MatMul broadcasts batch dims alike */
    *out = o;
    o = NULL;
fail:
    bgeom_free(&geo);
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(o);
    return st;
}

ts_status ts_bmm(const ts_tensor *a, const ts_tensor *b, ts_tensor **out) { return autocast_pair("bmm", a, b, out); }

static ts_status bmm_run(const ts_tensor *a, const ts_tensor *b, ts_tensor **out) {
    TS_TRY(ts__check_f32("bmm", "a", a));
    TS_TRY(ts__check_f32("bmm", "b", b));
    TS_TRY(ts__check_ndim("bmm", "a", a, 3));
    TS_TRY(ts__check_ndim("bmm", "b", b, 3));
    TS_TRY(ts__check_same_device("bmm", a, b));
    TS_ARG(out, "bmm: NULL out");
    if (a->shape[0] != b->shape[0]) {
        char x[96], y[96];
        return ts_error(TS_ERR_SHAPE, "bmm: a %s and b %s: batch sizes differ", ts_shape_str(3, a->shape, x, sizeof x),
                        ts_shape_str(3, b->shape, y, sizeof y));
    }
    return matmul_nd("bmm", a, b, out);
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
        TS_TRY(d->k_ew->sum_dim(gin[2], g, 1, N, OUT, 1.0f));
    }
    return TS_OK;
}

static ts_status linear_run(const ts_tensor *x_in, const ts_tensor *w_in, const ts_tensor *b, ts_tensor **out);

/* ---- linear on bfloat16 activations (autocast) --------------------------------------------------------- */
/* o (bfloat16, like y's shape) = the float32 y rounded */
static ts_status narrow_into(const ts_tensor *y, ts_dtype dt, ts_tensor **o) {
    TS_TRY(ts__new(y->storage->device, dt, y->ndim, y->shape, o));
    ts_status st = y->storage->device->k_ew->cast(*o, y);
    if (st != TS_OK) {
        ts_tensor_release(*o);
        *o = NULL;
    }
    return st;
}

/* saved: x (bfloat16), w (float32); g: bfloat16 (N, OUT) */
static ts_status linear_bf16_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    const ts_tensor *x = ts__node_saved(n, 0), *w = ts__node_saved(n, 1);
    ts_device *d = x->storage->device;
    const int64_t N = x->shape[0], IN = x->shape[1], OUT = w->shape[0];
    if (g_in->dtype != x->dtype)
        return ts_error(TS_ERR_DTYPE, "linear backward: a %s gradient for a %s output", ts_dtype_name(g_in->dtype),
                        ts_dtype_name(x->dtype));
    ts_tensor *g = NULL, *f = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts__contiguous(g_in, &g));
    if (n->needs[0]) { /* gx = g w: (N, OUT)(OUT, IN), bfloat16 like x */
        TS_CHECK_GOTO(ts__new(d, TS_F32, 2, x->shape, &f));
        TS_CHECK_GOTO(d->k_blas->gemm_bf16(d, false, false, N, IN, OUT, 1.0f, ts__ptr(g), TS_BF16, OUT, ts__ptr(w),
                                           TS_F32, IN, 0.0f, ts__f32(f), IN));
        TS_CHECK_GOTO(narrow_into(f, x->dtype, &gin[0]));
    }
    if (n->needs[1]) { /* gw = g^T x: (OUT, N)(N, IN), float32 */
        TS_CHECK_GOTO(ts__new_like(w, &gin[1]));
        TS_CHECK_GOTO(d->k_blas->gemm_bf16(d, true, false, OUT, IN, N, 1.0f, ts__ptr(g), TS_BF16, OUT, ts__ptr(x),
                                           TS_BF16, IN, 0.0f, ts__f32(gin[1]), IN));
    }
    if (n->needs[2]) { /* gb = column sums of g, in float32 */
        ts_tensor *gf = NULL;
        TS_CHECK_GOTO(ts__new(d, TS_F32, 2, g->shape, &gf));
        st = d->k_ew->cast(gf, g);
        if (st == TS_OK) st = ts__new(d, TS_F32, 1, &OUT, &gin[2]);
        if (st == TS_OK) st = d->k_ew->sum_dim(gin[2], gf, 1, N, OUT, 1.0f);
        ts_tensor_release(gf);
        TS_CHECK_GOTO(st);
    }
fail:
    ts_tensor_release(g);
    ts_tensor_release(f);
    return st;
}

/* linear on float32 x and w; the bias (arg) goes up to float32 here when it is 16-bit */
static ts_status linear_thunk(const ts_tensor *x, const ts_tensor *w, const void *arg, ts_tensor **out) {
    const ts_tensor *b = arg;
    ts_tensor *fb = NULL;
    if (b) TS_TRY(ts_to_dtype(b, TS_F32, &fb));
    ts_status st = linear_run(x, w, fb, out);
    ts_tensor_release(fb);
    return st;
}

/* Under autocast x goes to bfloat16 first; 16-bit operands run on float32 copies, the result in x's dtype */
ts_status ts_linear(const ts_tensor *x_in, const ts_tensor *w_in, const ts_tensor *b, ts_tensor **out) {
    TS_ARG(x_in && w_in && out, "linear: NULL argument");
    ts_tensor *x = NULL;
    TS_TRY(ts__autocast(x_in, &x));
    const bool native = ts__bf16_kept(x) && w_in->dtype == TS_F32 && (!b || b->dtype == TS_F32) &&
                        x->storage->device->k_blas->gemm_bf16;
    ts_status st = native ? linear_run(x, w_in, b, out)
                   : ts__any_half(x, w_in) || ts__any_half(b, NULL)
                       ? ts__half_op_as(linear_thunk, x, w_in, b, ts__any_half(x, NULL) ? x->dtype : TS_F32, out)
                       : linear_run(x, w_in, b, out);
    ts_tensor_release(x);
    return st;
}

/* Float32 x, or bfloat16 x on a device with gemm_bf16 (ts_linear decides): y (N, OUT) in x's dtype =
 * x w^T + b, for bfloat16 the products bfloat16, the sums and the bias float32, rounded once */
static ts_status linear_run(const ts_tensor *x_in, const ts_tensor *w_in, const ts_tensor *b, ts_tensor **out) {
    const bool h = x_in->dtype == TS_BF16;
    if (!h) TS_TRY(ts__check_f32("linear", "x", x_in));
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
    ts_tensor *x = NULL, *w = NULL, *y = NULL, *o = NULL;
    TS_CHECK_GOTO(ts__contiguous(x_in, &x));
    TS_CHECK_GOTO(ts__contiguous(w_in, &w));
    int64_t N = x->shape[0], IN = x->shape[1], OUT = w->shape[0];
    ts_device *d = x->storage->device;
    TS_CHECK_GOTO(ts__new(d, TS_F32, 2, (int64_t[]){N, OUT}, h ? &y : &o));
    if (IN == 0)
        TS_CHECK_GOTO(d->k_ew->fill(h ? y : o, 0.0f));
    else if (h)
        TS_CHECK_GOTO(d->k_blas->gemm_bf16(d, false, true, N, OUT, IN, 1.0f, ts__ptr(x), TS_BF16, IN, ts__ptr(w), TS_F32,
                                           IN, 0.0f, ts__f32(y), OUT));
    else
        TS_CHECK_GOTO(d->k_blas->sgemm(d, false, true, N, OUT, IN, 1.0f, ts__f32(x), IN, ts__f32(w), IN, 0.0f,
                                       ts__f32(o), OUT));
    if (b) TS_CHECK_GOTO(add_row_bias(h ? y : o, b));
    if (h) TS_CHECK_GOTO(narrow_into(y, TS_BF16, &o));
    const ts_tensor *in[3] = {x_in, w_in, b};
    ts_node *n = NULL;
    TS_CHECK_GOTO(ts__node_new("linear", h ? linear_bf16_backward : linear_backward, 3, in, &n));
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
    ts_tensor_release(y);
    ts_tensor_release(o);
    return st;
}
