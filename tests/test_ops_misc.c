/*
 * tests/test_ops_misc.c — embedding, reshape, flatten, concat, slice, dropout,
 * log_softmax, cross_entropy and mse_loss: forward values against small cases
 * worked out here in double precision, finite-difference gradchecks for every
 * differentiable input over several shapes and dims, and error messages.
 */
#include "tensor/tensor.h"
#include "test_util.h"

#define GC(name, f, in, nin, ctx) CHECK(tu_gradcheck(name, f, in, nin, ctx, 1e-2, 1e-3, 1e-2) <= 1)

static ts_tensor *idx_tensor(int ndim, const int64_t *shape, const int64_t *data) {
    ts_tensor *t = NULL;
    if (ts_tensor_from_data(ts_device_cpu(), TS_I64, ndim, shape, data, &t) != TS_OK) {
        fprintf(stderr, "idx_tensor: %s\n", ts_last_error());
        abort();
    }
    return t;
}

static bool shape_is(const ts_tensor *t, int ndim, const int64_t *shape) {
    if (ts_tensor_ndim(t) != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (ts_tensor_shape(t)[i] != shape[i]) return false;
    return true;
}

/* A transposed (non-contiguous) view of a 2-D tensor, made by hand: no public transpose op yet. */
static ts_tensor *transposed(ts_tensor *t) {
    ts_tensor *v = NULL;
    if (ts_tensor_detach(t, &v) != TS_OK) abort();
    int64_t s0 = v->shape[0], st0 = v->stride[0];
    v->shape[0] = v->shape[1];
    v->stride[0] = v->stride[1];
    v->shape[1] = s0;
    v->stride[1] = st0;
    return v;
}

static void release_all(ts_tensor **ts, int n) {
    for (int i = 0; i < n; i++) ts_tensor_release(ts[i]);
}

/* The gradcheck perturbs inputs in storage order, which differs from the gradient's
 * order for a non-contiguous input; so for those, compare f on a transposed view
 * with f on a contiguous copy of it: the values and the input gradients must agree. */
static void check_noncontiguous(const char *name, tu_fwd_fn f, void *ctx) {
    ts_rng r;
    ts_rng_seed(&r, 99);
    ts_tensor *b = tu_rand(&r, 2, (int64_t[]){4, 6}, -1, 1, false);
    ts_tensor *bt = transposed(b), *bc = NULL;
    CHECK_OK(ts_tensor_clone(bt, &bc));
    ts_tensor_set_requires_grad(bt, true);
    ts_tensor_set_requires_grad(bc, true);
    ts_tensor *o1 = NULL, *o2 = NULL;
    CHECK_OK(f(&bt, ctx, &o1));
    CHECK_OK(f(&bc, ctx, &o2));
    if (!o1 || !o2) return;
    CHECK(shape_is(o1, ts_tensor_ndim(o2), ts_tensor_shape(o2)));
    CHECK(tu_max_abs_diff(o1, ts_tensor_data_f32(o2)) == 0);
    ts_tensor *g = tu_rand(&r, ts_tensor_ndim(o1), ts_tensor_shape(o1), -1, 1, false);
    CHECK_OK(ts_backward(o1, g, false));
    CHECK_OK(ts_backward(o2, g, false));
    ts_tensor *g1 = ts_tensor_grad(bt), *g2 = ts_tensor_grad(bc);
    CHECK(g1 && g2 && shape_is(g1, 2, (int64_t[]){6, 4}));
    if (g1 && g2 && tu_max_abs_diff(g1, ts_tensor_data_f32(g2)) != 0) {
        tu_failures++;
        fprintf(stderr, "%s: gradients of a non-contiguous input differ from a contiguous one\n", name);
    }
    ts_tensor *objs[] = {b, bt, bc, o1, o2, g};
    for (int i = 0; i < 6; i++) ts_tensor_release(objs[i]);
}

/* ---- reshape and flatten ------------------------------------------------------------------------- */
typedef struct {
    int ndim;
    int64_t shape[TS_MAX_DIMS];
} shape_ctx;

/* reshape and flatten return views of their input, and the gradcheck reads its
 * outputs after restoring the input: follow them with a copying op (scale by 1). */
static ts_status then_copy(ts_status st, ts_tensor **v, ts_tensor **out) {
    if (st != TS_OK) return st;
    st = ts_scale(*v, 1.0f, out);
    ts_tensor_release(*v);
    return st;
}
static ts_status f_reshape(ts_tensor **in, void *ctx, ts_tensor **out) {
    shape_ctx *c = ctx;
    ts_tensor *v = NULL;
    return then_copy(ts_reshape(in[0], c->ndim, c->shape, &v), &v, out);
}
static ts_status f_flatten(ts_tensor **in, void *ctx, ts_tensor **out) {
    ts_tensor *v = NULL;
    return then_copy(ts_flatten(in[0], *(int *)ctx, &v), &v, out);
}

static void test_reshape(void) {
    ts_rng r;
    ts_rng_seed(&r, 11);
    ts_tensor *x = tu_tensor(2, (int64_t[]){2, 3}, (float[]){1, 2, 3, 4, 5, 6});
    ts_tensor *y = NULL;
    CHECK_OK(ts_reshape(x, 3, (int64_t[]){3, -1, 1}, &y));
    CHECK(shape_is(y, 3, (int64_t[]){3, 2, 1}));
    /* contiguous: a view sharing storage, writes are visible both ways */
    CHECK(ts_tensor_data_f32(y) == ts_tensor_data_f32(x));
    ts_tensor_data_f32(y)[4] = 50;
    CHECK_NEAR(ts_tensor_data_f32(x)[4], 50, 0);
    ts_tensor_release(y);
    CHECK_OK(ts_reshape(x, 1, (int64_t[]){-1}, &y));
    CHECK(shape_is(y, 1, (int64_t[]){6}));
    ts_tensor_release(y);

    /* non-contiguous: a contiguous copy in row-major order of the view */
    ts_tensor *xt = transposed(x); /* (3, 2): [[1, 4], [2, 50], [3, 6]] */
    CHECK(!ts_tensor_is_contiguous(xt));
    CHECK_OK(ts_reshape(xt, 1, (int64_t[]){6}, &y));
    CHECK(ts_tensor_is_contiguous(y));
    CHECK(tu_max_abs_diff(y, (float[]){1, 4, 2, 50, 3, 6}) == 0);
    CHECK(ts_tensor_data_f32(y) != ts_tensor_data_f32(x));
    ts_tensor_release(y);
    ts_tensor_release(xt);

    /* 0-d <-> one element */
    ts_tensor *s = tu_tensor(0, NULL, (float[]){7});
    CHECK_OK(ts_reshape(s, 2, (int64_t[]){1, -1}, &y));
    CHECK(shape_is(y, 2, (int64_t[]){1, 1}));
    ts_tensor *z = NULL;
    CHECK_OK(ts_reshape(y, 0, NULL, &z));
    CHECK(ts_tensor_ndim(z) == 0 && ts_tensor_data_f32(z)[0] == 7);
    ts_tensor_release(y);
    ts_tensor_release(z);
    ts_tensor_release(s);

    /* gradients */
    ts_tensor *a = tu_rand(&r, 3, (int64_t[]){2, 3, 4}, -1, 1, true);
    shape_ctx c1 = {2, {4, -1}}, c2 = {4, {1, 6, 1, 4}}, c3 = {1, {24}};
    ts_tensor *in[1] = {a};
    GC("reshape (4,-1)", f_reshape, in, 1, &c1);
    GC("reshape (1,6,1,4)", f_reshape, in, 1, &c2);
    GC("reshape (24)", f_reshape, in, 1, &c3);
    shape_ctx c4 = {3, {3, -1, 2}};
    check_noncontiguous("reshape non-contiguous", f_reshape, &c4);

    /* empty tensors */
    ts_tensor *e = tu_rand(&r, 2, (int64_t[]){0, 3}, -1, 1, false);
    CHECK_OK(ts_reshape(e, 2, (int64_t[]){3, 0}, &y));
    CHECK(shape_is(y, 2, (int64_t[]){3, 0}));
    ts_tensor_release(y);
    CHECK_STATUS(ts_reshape(e, 2, (int64_t[]){0, -1}, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("ambiguous");

    /* errors name the op and the shapes */
    CHECK_STATUS(ts_reshape(a, 2, (int64_t[]){5, -1}, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("reshape");
    CHECK_ERR_MENTIONS("[2, 3, 4]");
    CHECK_ERR_MENTIONS("[5, -1]");
    CHECK_STATUS(ts_reshape(a, 2, (int64_t[]){5, 5}, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("[5, 5]");
    CHECK_STATUS(ts_reshape(a, 3, (int64_t[]){-1, -1, 4}, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("only one dimension can be -1");
    CHECK_STATUS(ts_reshape(a, 2, (int64_t[]){-2, -12}, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("-2");
    CHECK_STATUS(ts_reshape(a, 9, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 24}, &y), TS_ERR_SHAPE);
    ts_tensor *objs[] = {x, a, e};
    release_all(objs, 3);
}

static void test_flatten(void) {
    ts_rng r;
    ts_rng_seed(&r, 12);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){2, 3, 4, 5}, -1, 1, true);
    ts_tensor *y = NULL;
    struct {
        int start, ndim;
        int64_t shape[4];
    } cases[] = {{1, 2, {2, 60}}, {0, 1, {120}}, {-2, 3, {2, 3, 20}}, {-1, 4, {2, 3, 4, 5}}, {3, 4, {2, 3, 4, 5}},
                 {-4, 1, {120}}};
    for (size_t i = 0; i < TS_ARRAY_LEN(cases); i++) {
        CHECK_OK(ts_flatten(x, cases[i].start, &y));
        CHECK(shape_is(y, cases[i].ndim, cases[i].shape));
        CHECK(ts_tensor_data_f32(y) == ts_tensor_data_f32(x)); /* a view */
        ts_tensor_release(y);
    }
    ts_tensor *in[1] = {x};
    int s1 = 1, s2 = -2;
    GC("flatten 1", f_flatten, in, 1, &s1);
    GC("flatten -2", f_flatten, in, 1, &s2);
    int s0 = 0;
    check_noncontiguous("flatten non-contiguous", f_flatten, &s0);

    ts_tensor *s = tu_tensor(0, NULL, (float[]){3});
    CHECK_OK(ts_flatten(s, 0, &y));
    CHECK(shape_is(y, 1, (int64_t[]){1}));
    ts_tensor_release(y);
    CHECK_OK(ts_flatten(s, -1, &y));
    ts_tensor_release(y);
    CHECK_STATUS(ts_flatten(s, 1, &y), TS_ERR_INVALID_ARG);

    CHECK_STATUS(ts_flatten(x, 4, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("flatten");
    CHECK_ERR_MENTIONS("[2, 3, 4, 5]");
    CHECK_STATUS(ts_flatten(x, -5, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("dim -5");
    ts_tensor_release(x);
    ts_tensor_release(s);
}

/* ---- concat and slice ------------------------------------------------------------------------------- */
typedef struct {
    int n, dim;
} concat_ctx;

static ts_status f_concat(ts_tensor **in, void *ctx, ts_tensor **out) {
    concat_ctx *c = ctx;
    return ts_concat(in, c->n, c->dim, out);
}

/* Reference concat in double-free float copies: out[o, off + j, i] = x[o, j, i]. */
static void check_concat_values(ts_tensor **xs, int n, int dim, ts_tensor *y) {
    int nd = ts_tensor_ndim(y);
    int d = dim < 0 ? dim + nd : dim;
    int64_t outer = 1, inner = 1, total = ts_tensor_shape(y)[d];
    for (int k = 0; k < d; k++) outer *= ts_tensor_shape(y)[k];
    for (int k = d + 1; k < nd; k++) inner *= ts_tensor_shape(y)[k];
    int64_t off = 0;
    double worst = 0;
    for (int t = 0; t < n; t++) {
        int64_t sz = ts_tensor_shape(xs[t])[d];
        const float *px = ts_tensor_data_f32(xs[t]), *py = ts_tensor_data_f32(y);
        for (int64_t o = 0; o < outer; o++)
            for (int64_t j = 0; j < sz; j++)
                for (int64_t i = 0; i < inner; i++)
                    worst = fmax(worst, fabs(py[(o * total + off + j) * inner + i] - px[(o * sz + j) * inner + i]));
        off += sz;
    }
    CHECK(off == total);
    CHECK(worst == 0);
}

static void test_concat(void) {
    ts_rng r;
    ts_rng_seed(&r, 13);
    /* a hand case */
    ts_tensor *p = tu_tensor(2, (int64_t[]){2, 2}, (float[]){1, 2, 3, 4});
    ts_tensor *q = tu_tensor(2, (int64_t[]){2, 1}, (float[]){5, 6});
    ts_tensor *pq[2] = {p, q}, *y = NULL;
    CHECK_OK(ts_concat(pq, 2, -1, &y));
    CHECK(shape_is(y, 2, (int64_t[]){2, 3}));
    CHECK(tu_max_abs_diff(y, (float[]){1, 2, 5, 3, 4, 6}) == 0);
    ts_tensor_release(y);

    /* three tensors with different sizes along each dim of a 3-D shape */
    for (int dim = -3; dim < 3; dim++) {
        int d = dim < 0 ? dim + 3 : dim;
        ts_tensor *xs[3];
        int64_t sizes[3] = {2, 1, 3};
        for (int t = 0; t < 3; t++) {
            int64_t s[3] = {2, 3, 4};
            s[d] = sizes[t];
            xs[t] = tu_rand(&r, 3, s, -1, 1, true);
        }
        CHECK_OK(ts_concat(xs, 3, dim, &y));
        int64_t want[3] = {2, 3, 4};
        want[d] = 6;
        CHECK(shape_is(y, 3, want));
        check_concat_values(xs, 3, dim, y);
        ts_tensor_release(y);
        concat_ctx c = {3, dim};
        char name[32];
        snprintf(name, sizeof name, "concat dim %d", dim);
        GC(name, f_concat, xs, 3, &c);
        release_all(xs, 3);
    }

    /* a zero-size member, a non-contiguous member and one that needs no grad */
    ts_tensor *a = tu_rand(&r, 2, (int64_t[]){3, 2}, -1, 1, true);
    ts_tensor *b0 = tu_rand(&r, 2, (int64_t[]){3, 0}, -1, 1, true);
    ts_tensor *cb = tu_rand(&r, 2, (int64_t[]){4, 3}, -1, 1, false);
    ts_tensor *ct = transposed(cb); /* (3, 4), no grad: see check_noncontiguous */
    ts_tensor *dd = tu_rand(&r, 2, (int64_t[]){3, 1}, -1, 1, false);
    ts_tensor *mix[4] = {a, b0, ct, dd};
    CHECK_OK(ts_concat(mix, 4, 1, &y));
    CHECK(shape_is(y, 2, (int64_t[]){3, 7}));
    CHECK_NEAR(ts_tensor_data_f32(y)[2], ts_tensor_data_f32(cb)[0], 0);
    CHECK_NEAR(ts_tensor_data_f32(y)[3], ts_tensor_data_f32(cb)[3], 0);
    ts_tensor_release(y);
    concat_ctx cm = {4, 1};
    GC("concat mixed", f_concat, mix, 4, &cm);
    concat_ctx c1 = {1, 0};
    check_noncontiguous("concat non-contiguous", f_concat, &c1);

    /* PyTorch's legacy rule: 1-D empty tensors are skipped */
    ts_tensor *e1 = tu_rand(&r, 1, (int64_t[]){0}, -1, 1, true);
    ts_tensor *le[3] = {e1, a, e1};
    CHECK_OK(ts_concat(le, 3, 1, &y));
    CHECK(shape_is(y, 2, (int64_t[]){3, 2}));
    ts_tensor_release(y);
    concat_ctx cl = {3, 1};
    GC("concat legacy empty", f_concat, le, 3, &cl);
    ts_tensor *ee[2] = {e1, e1};
    CHECK_OK(ts_concat(ee, 2, 0, &y));
    CHECK(shape_is(y, 1, (int64_t[]){0}));
    ts_tensor_release(y);

    /* more tensors than a graph node has inputs */
    ts_tensor *many[11];
    for (int t = 0; t < 11; t++) /* a legacy empty (0) in the middle; one member needs no grad */
        many[t] = t == 5 ? tu_rand(&r, 1, (int64_t[]){0}, -1, 1, true)
                         : tu_rand(&r, 2, (int64_t[]){2, 1 + t % 3}, -1, 1, t != 4);
    CHECK_OK(ts_concat(many, 11, -1, &y));
    CHECK(shape_is(y, 2, (int64_t[]){2, 18}));
    ts_tensor *nonempty[10];
    for (int t = 0, k = 0; t < 11; t++)
        if (t != 5) nonempty[k++] = many[t];
    check_concat_values(nonempty, 10, 1, y);
    ts_tensor_release(y);
    concat_ctx c11 = {11, -1};
    GC("concat 11", f_concat, many, 11, &c11);
    release_all(many, 11);

    /* int64 tensors concatenate too */
    ts_tensor *i1 = idx_tensor(1, (int64_t[]){2}, (int64_t[]){1, 2});
    ts_tensor *i2 = idx_tensor(1, (int64_t[]){1}, (int64_t[]){3});
    ts_tensor *ii[2] = {i1, i2};
    CHECK_OK(ts_concat(ii, 2, 0, &y));
    CHECK(ts_tensor_dtype(y) == TS_I64 && ts_tensor_item(y, 2) == 3);
    ts_tensor_release(y);

    /* errors */
    ts_tensor *bad = tu_rand(&r, 2, (int64_t[]){4, 2}, -1, 1, false);
    ts_tensor *ab[2] = {a, bad};
    CHECK_STATUS(ts_concat(ab, 2, 1, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("concat");
    CHECK_ERR_MENTIONS("[4, 2]");
    CHECK_ERR_MENTIONS("[3, 2]");
    CHECK_OK(ts_concat(ab, 2, 0, &y)); /* fine along dim 0 */
    CHECK(shape_is(y, 2, (int64_t[]){7, 2}));
    ts_tensor_release(y);
    CHECK_STATUS(ts_concat(ab, 2, 2, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("dim 2");
    CHECK_STATUS(ts_concat(ab, 2, -3, &y), TS_ERR_INVALID_ARG);
    ts_tensor *three = tu_rand(&r, 3, (int64_t[]){3, 2, 1}, -1, 1, false);
    ts_tensor *a3[2] = {a, three};
    CHECK_STATUS(ts_concat(a3, 2, 0, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("[3, 2, 1]");
    ts_tensor *ai[2] = {a, i1};
    CHECK_STATUS(ts_concat(ai, 2, 0, &y), TS_ERR_DTYPE);
    ts_tensor *sc = tu_tensor(0, NULL, (float[]){1});
    ts_tensor *as[2] = {a, sc};
    CHECK_STATUS(ts_concat(as, 2, 0, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("zero-dimensional");
    CHECK_STATUS(ts_concat(ab, 0, 0, &y), TS_ERR_INVALID_ARG);
    ts_tensor *objs[] = {p, q, a, b0, cb, ct, dd, e1, i1, i2, bad, three, sc};
    release_all(objs, (int)TS_ARRAY_LEN(objs));
}

typedef struct {
    int dim;
    int64_t start, end;
} slice_ctx;

static ts_status f_slice(ts_tensor **in, void *ctx, ts_tensor **out) {
    slice_ctx *c = ctx;
    return ts_slice(in[0], c->dim, c->start, c->end, out);
}

static void test_slice(void) {
    ts_rng r;
    ts_rng_seed(&r, 14);
    /* x = [[0 1 2 3 4], [5 6 7 8 9]] */
    float v[10];
    for (int i = 0; i < 10; i++) v[i] = (float)i;
    ts_tensor *x = tu_tensor(2, (int64_t[]){2, 5}, v);
    struct {
        int dim;
        int64_t start, end, len;
        float want[10];
    } cases[] = {
        {1, 1, 3, 2, {1, 2, 6, 7}},
        {-1, -2, 5, 2, {3, 4, 8, 9}},        /* negative start */
        {1, 0, -1, 4, {0, 1, 2, 3, 5, 6, 7, 8}}, /* negative end */
        {1, -100, 2, 2, {0, 1, 5, 6}},       /* clamped start */
        {1, 3, 100, 2, {3, 4, 8, 9}},        /* clamped end */
        {1, 4, 2, 0, {0}},                   /* end before start: empty */
        {1, 5, 9, 0, {0}},                   /* start past the end: empty */
        {0, 1, 2, 1, {5, 6, 7, 8, 9}},       /* one row */
        {-2, -1, 100, 1, {5, 6, 7, 8, 9}},
        {1, 2, 3, 1, {2, 7}}, /* one column */
    };
    for (size_t i = 0; i < TS_ARRAY_LEN(cases); i++) {
        ts_tensor *y = NULL;
        CHECK_OK(ts_slice(x, cases[i].dim, cases[i].start, cases[i].end, &y));
        int d = cases[i].dim < 0 ? cases[i].dim + 2 : cases[i].dim;
        int64_t want[2] = {2, 5};
        want[d] = cases[i].len;
        CHECK(shape_is(y, 2, want));
        CHECK(ts_tensor_is_contiguous(y));
        CHECK(tu_max_abs_diff(y, cases[i].want) == 0);
        ts_tensor_release(y);
    }
    /* a slice is a copy */
    ts_tensor *y = NULL;
    CHECK_OK(ts_slice(x, 0, 0, 1, &y));
    ts_tensor_data_f32(y)[0] = 100;
    CHECK_NEAR(ts_tensor_data_f32(x)[0], 0, 0);
    ts_tensor_release(y);

    ts_tensor *a = tu_rand(&r, 3, (int64_t[]){3, 4, 5}, -1, 1, true);
    ts_tensor *in[1] = {a};
    slice_ctx sc[] = {{0, 1, 3}, {1, -3, -1}, {-1, 2, 100}, {2, 4, 5}, {1, 2, 2}, {-3, -1, 3}, {1, 3, 1}};
    for (size_t i = 0; i < TS_ARRAY_LEN(sc); i++) {
        char name[64];
        snprintf(name, sizeof name, "slice dim %d [%lld, %lld)", sc[i].dim, (long long)sc[i].start,
                 (long long)sc[i].end);
        GC(name, f_slice, in, 1, &sc[i]);
    }
    /* the gradient is zero outside the slice and g inside it */
    ts_tensor *s = NULL, *l = NULL;
    CHECK_OK(ts_slice(a, 1, 1, 3, &s));
    CHECK_OK(ts_sum(s, &l));
    ts_tensor_zero_grad(a);
    CHECK_OK(ts_backward(l, NULL, false));
    ts_tensor *g = ts_tensor_grad(a);
    CHECK(g && shape_is(g, 3, (int64_t[]){3, 4, 5}));
    double bad = 0;
    for (int i = 0; g && i < 60; i++) {
        int j = (i / 5) % 4;
        bad = fmax(bad, fabs(ts_tensor_data_f32(g)[i] - ((j == 1 || j == 2) ? 1.0 : 0.0)));
    }
    CHECK(bad == 0);
    ts_tensor_release(s);
    ts_tensor_release(l);

    slice_ctx snc = {-1, 1, 3};
    check_noncontiguous("slice non-contiguous", f_slice, &snc);
    ts_tensor *xt = transposed(x); /* (5, 2) */
    CHECK_OK(ts_slice(xt, 0, 1, 3, &y));
    CHECK(tu_max_abs_diff(y, (float[]){1, 6, 2, 7}) == 0);
    ts_tensor_release(y);

    CHECK_STATUS(ts_slice(a, 3, 0, 1, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("slice");
    CHECK_ERR_MENTIONS("[3, 4, 5]");
    CHECK_STATUS(ts_slice(a, -4, 0, 1, &y), TS_ERR_INVALID_ARG);
    ts_tensor *sc0 = tu_tensor(0, NULL, (float[]){1});
    CHECK_STATUS(ts_slice(sc0, 0, 0, 1, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("0-dimensional");
    ts_tensor *objs[] = {x, a, xt, sc0};
    release_all(objs, 4);
}

/* ---- embedding ---------------------------------------------------------------------------------------- */
static ts_status f_embedding(ts_tensor **in, void *ctx, ts_tensor **out) { return ts_embedding(ctx, in[0], out); }

static void test_embedding(void) {
    ts_rng r;
    ts_rng_seed(&r, 15);
    /* weight rows: [0 1 2], [10 11 12], [20 21 22], [30 31 32] */
    float wv[12];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++) wv[i * 3 + j] = (float)(10 * i + j);
    ts_tensor *w = tu_tensor(2, (int64_t[]){4, 3}, wv);
    ts_tensor_set_requires_grad(w, true);
    ts_tensor *idx = idx_tensor(2, (int64_t[]){2, 3}, (int64_t[]){3, 0, 3, 1, 3, 0});
    ts_tensor *y = NULL;
    CHECK_OK(ts_embedding(idx, w, &y));
    CHECK(shape_is(y, 3, (int64_t[]){2, 3, 3}));
    float want[18];
    const int64_t iv[6] = {3, 0, 3, 1, 3, 0};
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 3; j++) want[i * 3 + j] = wv[iv[i] * 3 + j];
    CHECK(tu_max_abs_diff(y, want) == 0);

    /* repeated indices accumulate: d sum(y) / d w[r] = count of r */
    ts_tensor *l = NULL;
    CHECK_OK(ts_sum(y, &l));
    CHECK_OK(ts_backward(l, NULL, false));
    ts_tensor *g = ts_tensor_grad(w);
    float counts[12];
    const float cnt[4] = {2, 1, 0, 3};
    for (int i = 0; i < 12; i++) counts[i] = cnt[i / 3];
    CHECK(g && tu_max_abs_diff(g, counts) == 0);
    ts_tensor_release(l);
    ts_tensor_release(y);

    ts_tensor *in[1] = {w};
    GC("embedding (2,3)", f_embedding, in, 1, idx);
    ts_tensor *w2 = tu_rand(&r, 2, (int64_t[]){6, 5}, -1, 1, true);
    ts_tensor *idx1 = idx_tensor(1, (int64_t[]){7}, (int64_t[]){5, 5, 0, 2, 5, 0, 1});
    ts_tensor *idx0 = idx_tensor(0, NULL, (int64_t[]){4});
    ts_tensor *idxe = idx_tensor(2, (int64_t[]){2, 0}, NULL);
    ts_tensor *in2[1] = {w2};
    GC("embedding (7)", f_embedding, in2, 1, idx1);
    GC("embedding ()", f_embedding, in2, 1, idx0);
    check_noncontiguous("embedding non-contiguous weight", f_embedding, idx1);
    CHECK_OK(ts_embedding(idx0, w2, &y));
    CHECK(shape_is(y, 1, (int64_t[]){5}));
    ts_tensor_release(y);
    CHECK_OK(ts_embedding(idxe, w2, &y));
    CHECK(shape_is(y, 3, (int64_t[]){2, 0, 5}));
    ts_tensor_release(y);

    /* errors name the index value and the range */
    ts_tensor *oob = idx_tensor(1, (int64_t[]){3}, (int64_t[]){1, 4, 2});
    CHECK_STATUS(ts_embedding(oob, w, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("embedding");
    CHECK_ERR_MENTIONS("index 4");
    CHECK_ERR_MENTIONS("[0, 4)");
    ts_tensor *neg = idx_tensor(1, (int64_t[]){2}, (int64_t[]){0, -1});
    CHECK_STATUS(ts_embedding(neg, w, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("index -1");
    ts_tensor *fidx = tu_tensor(1, (int64_t[]){1}, (float[]){1});
    CHECK_STATUS(ts_embedding(fidx, w, &y), TS_ERR_DTYPE);
    CHECK_ERR_MENTIONS("int64");
    ts_tensor *w1 = tu_rand(&r, 1, (int64_t[]){4}, -1, 1, false);
    CHECK_STATUS(ts_embedding(idx, w1, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("[4]");
    ts_tensor *objs[] = {w, idx, w2, idx1, idx0, idxe, oob, neg, fidx, w1};
    release_all(objs, (int)TS_ARRAY_LEN(objs));
}

/* ---- dropout -------------------------------------------------------------------------------------------- */
typedef struct {
    float p;
    uint64_t seed;
} dropout_ctx;

static ts_status f_dropout(ts_tensor **in, void *ctx, ts_tensor **out) {
    dropout_ctx *c = ctx;
    ts_rng r;
    ts_rng_seed(&r, c->seed); /* the same mask on every call */
    return ts_dropout(in[0], c->p, true, &r, out);
}

static void test_dropout(void) {
    ts_rng r;
    ts_rng_seed(&r, 16);
    const int64_t n = 200000;
    ts_tensor *x = tu_rand(&r, 2, (int64_t[]){400, 500}, 0.5f, 1.5f, true);
    const float *px = ts_tensor_data_f32(x);
    const float ps[] = {0.1f, 0.3f, 0.5f, 0.9f};
    for (size_t k = 0; k < TS_ARRAY_LEN(ps); k++) {
        float p = ps[k];
        ts_rng dr;
        ts_rng_seed(&dr, 100 + k);
        ts_tensor *y = NULL;
        CHECK_OK(ts_dropout(x, p, true, &dr, &y));
        const float *py = ts_tensor_data_f32(y);
        int64_t zeros = 0;
        double worst = 0;
        for (int64_t i = 0; i < n; i++) {
            if (py[i] == 0.0f)
                zeros++;
            else
                worst = fmax(worst, fabs(py[i] - px[i] / (1.0 - p)));
        }
        /* binomial std is sqrt(p(1-p)/n) <= 0.0012: allow 5 of them */
        CHECK_NEAR((double)zeros / (double)n, p, 0.006);
        CHECK(worst < 1e-5);

        /* the gradient flows through kept elements only, scaled the same way */
        ts_tensor *l = NULL;
        CHECK_OK(ts_sum(y, &l));
        ts_tensor_zero_grad(x);
        CHECK_OK(ts_backward(l, NULL, false));
        const float *g = ts_tensor_data_f32(ts_tensor_grad(x));
        double gbad = 0;
        for (int64_t i = 0; i < n; i++) gbad = fmax(gbad, fabs(g[i] - (py[i] == 0.0f ? 0.0 : 1.0 / (1.0 - p))));
        CHECK(gbad < 1e-6);
        ts_tensor_release(l);
        ts_tensor_release(y);
    }

    /* same seed, same mask; another seed, another mask */
    ts_rng r1, r2, r3;
    ts_rng_seed(&r1, 7);
    ts_rng_seed(&r2, 7);
    ts_rng_seed(&r3, 8);
    ts_tensor *y1 = NULL, *y2 = NULL, *y3 = NULL;
    CHECK_OK(ts_dropout(x, 0.5f, true, &r1, &y1));
    CHECK_OK(ts_dropout(x, 0.5f, true, &r2, &y2));
    CHECK_OK(ts_dropout(x, 0.5f, true, &r3, &y3));
    CHECK(memcmp(ts_tensor_data_f32(y1), ts_tensor_data_f32(y2), (size_t)n * sizeof(float)) == 0);
    CHECK(memcmp(ts_tensor_data_f32(y1), ts_tensor_data_f32(y3), (size_t)n * sizeof(float)) != 0);
    ts_tensor_release(y1);
    ts_tensor_release(y2);
    ts_tensor_release(y3);
    /* the default generator: ts_manual_seed makes it reproducible */
    ts_manual_seed(42);
    CHECK_OK(ts_dropout(x, 0.2f, true, NULL, &y1));
    ts_manual_seed(42);
    CHECK_OK(ts_dropout(x, 0.2f, true, NULL, &y2));
    CHECK(memcmp(ts_tensor_data_f32(y1), ts_tensor_data_f32(y2), (size_t)n * sizeof(float)) == 0);
    ts_tensor_release(y1);
    ts_tensor_release(y2);

    /* eval mode and p = 0 are the identity (the input itself, as PyTorch returns) */
    ts_tensor *y = NULL;
    CHECK_OK(ts_dropout(x, 0.5f, false, &r1, &y));
    CHECK(y == x);
    ts_tensor_release(y);
    CHECK_OK(ts_dropout(x, 0.0f, true, &r1, &y));
    CHECK(y == x);
    ts_tensor_release(y);
    /* p = 1 zeroes everything, and the gradient */
    CHECK_OK(ts_dropout(x, 1.0f, true, &r1, &y));
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(ts_tensor_data_f32(y)[i]));
    CHECK(m == 0);
    ts_tensor *l = NULL;
    CHECK_OK(ts_sum(y, &l));
    ts_tensor_zero_grad(x);
    CHECK_OK(ts_backward(l, NULL, false));
    m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(ts_tensor_data_f32(ts_tensor_grad(x))[i]));
    CHECK(m == 0);
    ts_tensor_release(l);
    ts_tensor_release(y);

    /* gradchecks with a fixed mask, including a non-contiguous input */
    ts_tensor *a = tu_rand(&r, 3, (int64_t[]){3, 4, 5}, -1, 1, true);
    ts_tensor *in[1] = {a};
    dropout_ctx c1 = {0.3f, 5}, c2 = {0.7f, 6};
    GC("dropout 0.3", f_dropout, in, 1, &c1);
    GC("dropout 0.7", f_dropout, in, 1, &c2);
    check_noncontiguous("dropout non-contiguous", f_dropout, &c1);

    CHECK_STATUS(ts_dropout(x, 1.5f, true, NULL, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("dropout");
    CHECK_ERR_MENTIONS("1.5");
    CHECK_STATUS(ts_dropout(x, -0.1f, true, NULL, &y), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_dropout(x, NAN, true, NULL, &y), TS_ERR_INVALID_ARG);
    ts_tensor *objs[] = {x, a};
    release_all(objs, 2);
}

/* ---- log_softmax ---------------------------------------------------------------------------------------- */
static ts_status f_log_softmax(ts_tensor **in, void *ctx, ts_tensor **out) {
    return ts_log_softmax(in[0], *(int *)ctx, out);
}

/* max |y - log_softmax(x)| along dim d, computed in double */
static double log_softmax_err(ts_tensor *x, int dim, ts_tensor *y) {
    int nd = ts_tensor_ndim(x);
    int d = dim < 0 ? dim + nd : dim;
    const int64_t *s = ts_tensor_shape(x);
    int64_t outer = 1, n = s[d], inner = 1;
    for (int k = 0; k < d; k++) outer *= s[k];
    for (int k = d + 1; k < nd; k++) inner *= s[k];
    const float *px = ts_tensor_data_f32(x), *py = ts_tensor_data_f32(y);
    double worst = 0;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            double m = -INFINITY, sum = 0;
            for (int64_t c = 0; c < n; c++) m = fmax(m, px[(o * n + c) * inner + i]);
            for (int64_t c = 0; c < n; c++) sum += exp(px[(o * n + c) * inner + i] - m);
            for (int64_t c = 0; c < n; c++) {
                int64_t k = (o * n + c) * inner + i;
                worst = fmax(worst, fabs(py[k] - (px[k] - m - log(sum))));
            }
        }
    return worst;
}

static void test_log_softmax(void) {
    ts_rng r;
    ts_rng_seed(&r, 17);
    /* a hand case: log_softmax([1, 2, 3]) = [1, 2, 3] - log(e + e^2 + e^3) */
    ts_tensor *h = tu_tensor(1, (int64_t[]){3}, (float[]){1, 2, 3});
    ts_tensor *y = NULL;
    CHECK_OK(ts_log_softmax(h, 0, &y));
    double lse = log(exp(1.0) + exp(2.0) + exp(3.0));
    CHECK_NEAR(ts_tensor_data_f32(y)[0], 1 - lse, 1e-6);
    CHECK_NEAR(ts_tensor_data_f32(y)[2], 3 - lse, 1e-6);
    ts_tensor_release(y);

    ts_tensor *x = tu_rand(&r, 3, (int64_t[]){3, 4, 5}, -3, 3, true);
    ts_tensor *in[1] = {x};
    for (int dim = -3; dim < 3; dim++) {
        CHECK_OK(ts_log_softmax(x, dim, &y));
        CHECK(shape_is(y, 3, (int64_t[]){3, 4, 5}));
        CHECK(log_softmax_err(x, dim, y) < 2e-6);
        ts_tensor_release(y);
        char name[32];
        snprintf(name, sizeof name, "log_softmax dim %d", dim);
        GC(name, f_log_softmax, in, 1, &dim);
    }
    /* numerically stable for large logits */
    ts_tensor *big = tu_tensor(2, (int64_t[]){2, 3}, (float[]){1000, 1001, 1002, -1000, -1001, -1002});
    CHECK_OK(ts_log_softmax(big, 1, &y));
    CHECK(log_softmax_err(big, 1, y) < 1e-4);
    for (int i = 0; i < 6; i++) CHECK(isfinite(ts_tensor_data_f32(y)[i]));
    ts_tensor_release(y);
    /* one class: all zeros; a 0-d tensor: zero */
    ts_tensor *one = tu_rand(&r, 2, (int64_t[]){4, 1}, -3, 3, true);
    CHECK_OK(ts_log_softmax(one, 1, &y));
    CHECK(tu_max_abs_diff(y, (float[]){0, 0, 0, 0}) == 0);
    ts_tensor_release(y);
    ts_tensor *s = tu_tensor(0, NULL, (float[]){5});
    CHECK_OK(ts_log_softmax(s, -1, &y));
    CHECK(ts_tensor_ndim(y) == 0 && ts_tensor_data_f32(y)[0] == 0);
    ts_tensor_release(y);
    /* non-contiguous input */
    int d0 = 0, d1 = -1;
    check_noncontiguous("log_softmax non-contiguous dim 0", f_log_softmax, &d0);
    check_noncontiguous("log_softmax non-contiguous dim -1", f_log_softmax, &d1);

    CHECK_STATUS(ts_log_softmax(x, 3, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("log_softmax");
    CHECK_ERR_MENTIONS("[3, 4, 5]");
    ts_tensor *xi = idx_tensor(1, (int64_t[]){1}, (int64_t[]){1});
    CHECK_STATUS(ts_log_softmax(xi, 0, &y), TS_ERR_DTYPE);
    ts_tensor *objs[] = {h, x, big, one, s, xi};
    release_all(objs, (int)TS_ARRAY_LEN(objs));
}

/* ---- cross_entropy ---------------------------------------------------------------------------------------- */
typedef struct {
    ts_tensor *target;
    float eps;
} ce_ctx;

static ts_status f_ce(ts_tensor **in, void *ctx, ts_tensor **out) {
    ce_ctx *c = ctx;
    return ts_cross_entropy(in[0], c->target, c->eps, out);
}

/* torch.nn.functional.cross_entropy(x, t, label_smoothing=eps) in double (ignore_index -100) */
static double ce_ref(ts_tensor *x, const int64_t *t, double eps) {
    int64_t N = ts_tensor_shape(x)[0], C = ts_tensor_shape(x)[1], count = 0;
    const float *p = ts_tensor_data_f32(x);
    double total = 0;
    for (int64_t i = 0; i < N; i++) {
        if (t[i] == -100) continue;
        double m = -INFINITY, s = 0, mean_neglogp = 0;
        for (int64_t c = 0; c < C; c++) m = fmax(m, p[i * C + c]);
        for (int64_t c = 0; c < C; c++) s += exp(p[i * C + c] - m);
        double lse = m + log(s);
        for (int64_t c = 0; c < C; c++) mean_neglogp += (lse - p[i * C + c]) / (double)C;
        total += (1 - eps) * (lse - p[i * C + t[i]]) + eps * mean_neglogp;
        count++;
    }
    return total / (double)count;
}

static void test_cross_entropy(void) {
    ts_rng r;
    ts_rng_seed(&r, 18);
    /* a hand case: x = [[0, 0], [0, ln 3]], t = [0, 1]:
     * nll = (ln 2 + ln(4/3)) / 2; with eps = 0.1 the smoothing term is
     * mean over classes of -log p = (ln 2 + (ln 4 + ln(4/3)) / 2) / 2 */
    ts_tensor *h = tu_tensor(2, (int64_t[]){2, 2}, (float[]){0, 0, 0, (float)log(3.0)});
    ts_tensor *ht = idx_tensor(1, (int64_t[]){2}, (int64_t[]){0, 1});
    ts_tensor *y = NULL;
    CHECK_OK(ts_cross_entropy(h, ht, 0.0f, &y));
    CHECK(ts_tensor_ndim(y) == 0);
    double nll = (log(2.0) + log(4.0 / 3.0)) / 2, smooth = (log(2.0) + (log(4.0) + log(4.0 / 3.0)) / 2) / 2;
    CHECK_NEAR(ts_tensor_data_f32(y)[0], nll, 1e-6);
    ts_tensor_release(y);
    CHECK_OK(ts_cross_entropy(h, ht, 0.1f, &y));
    CHECK_NEAR(ts_tensor_data_f32(y)[0], 0.9 * nll + 0.1 * smooth, 1e-6);
    ts_tensor_release(y);

    /* the training-loop shape against the double reference, and gradients */
    int64_t tv[64];
    for (int i = 0; i < 64; i++) tv[i] = (int64_t)ts_rng_below(&r, 10);
    ts_tensor *x = tu_rand(&r, 2, (int64_t[]){64, 10}, -4, 4, true);
    ts_tensor *t = idx_tensor(1, (int64_t[]){64}, tv);
    const float eps[] = {0.0f, 0.1f, 1.0f};
    for (size_t k = 0; k < TS_ARRAY_LEN(eps); k++) {
        CHECK_OK(ts_cross_entropy(x, t, eps[k], &y));
        CHECK_NEAR(ts_tensor_data_f32(y)[0], ce_ref(x, tv, eps[k]), 2e-6);
        ts_tensor_release(y);
    }
    ts_tensor *xs = tu_rand(&r, 2, (int64_t[]){5, 4}, -2, 2, true);
    ts_tensor *ts5 = idx_tensor(1, (int64_t[]){5}, (int64_t[]){3, 0, 3, 1, 2});
    ts_tensor *in[1] = {xs};
    ce_ctx c0 = {ts5, 0.0f}, c1 = {ts5, 0.1f};
    GC("cross_entropy eps 0", f_ce, in, 1, &c0);
    GC("cross_entropy eps 0.1", f_ce, in, 1, &c1);
    ts_tensor *inx[1] = {x};
    ce_ctx c64 = {t, 0.1f};
    GC("cross_entropy (64,10)", f_ce, inx, 1, &c64);
    /* one sample, one class */
    ts_tensor *x11 = tu_rand(&r, 2, (int64_t[]){1, 1}, -2, 2, true);
    ts_tensor *t11 = idx_tensor(1, (int64_t[]){1}, (int64_t[]){0});
    CHECK_OK(ts_cross_entropy(x11, t11, 0.1f, &y));
    CHECK_NEAR(ts_tensor_data_f32(y)[0], 0, 1e-7);
    ts_tensor_release(y);

    /* the gradient is (softmax - onehot) / N, summing to zero over each row */
    ts_tensor_set_requires_grad(h, true);
    CHECK_OK(ts_cross_entropy(h, ht, 0.0f, &y));
    CHECK_OK(ts_backward(y, NULL, false));
    const float *g = ts_tensor_data_f32(ts_tensor_grad(h));
    CHECK_NEAR(g[0], (0.5 - 1) / 2, 1e-7);
    CHECK_NEAR(g[1], 0.5 / 2, 1e-7);
    CHECK_NEAR(g[2], 0.25 / 2, 1e-7);
    CHECK_NEAR(g[3], (0.75 - 1) / 2, 1e-7);
    ts_tensor_release(y);

    /* PyTorch's default ignore_index = -100: skipped and not counted */
    int64_t tiv[5] = {3, -100, 3, -100, 2};
    ts_tensor *ti = idx_tensor(1, (int64_t[]){5}, tiv);
    CHECK_OK(ts_cross_entropy(xs, ti, 0.1f, &y));
    CHECK_NEAR(ts_tensor_data_f32(y)[0], ce_ref(xs, tiv, 0.1), 2e-6);
    ts_tensor_release(y);
    ce_ctx ci = {ti, 0.1f};
    GC("cross_entropy ignore_index", f_ce, in, 1, &ci);

    /* large logits stay finite */
    ts_tensor *big = tu_tensor(2, (int64_t[]){1, 3}, (float[]){1000, 0, -1000});
    ts_tensor *t1 = idx_tensor(1, (int64_t[]){1}, (int64_t[]){1});
    CHECK_OK(ts_cross_entropy(big, t1, 0.0f, &y));
    CHECK_NEAR(ts_tensor_data_f32(y)[0], 1000, 1e-3);
    ts_tensor_release(y);

    /* errors */
    ts_tensor *tbad = idx_tensor(1, (int64_t[]){5}, (int64_t[]){0, 1, 7, 1, 0});
    CHECK_STATUS(ts_cross_entropy(xs, tbad, 0.0f, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("cross_entropy");
    CHECK_ERR_MENTIONS("target 7 of sample 2");
    CHECK_ERR_MENTIONS("[0, 4)");
    ts_tensor *tneg = idx_tensor(1, (int64_t[]){5}, (int64_t[]){0, 1, 2, -1, 0});
    CHECK_STATUS(ts_cross_entropy(xs, tneg, 0.0f, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("target -1 of sample 3");
    CHECK_STATUS(ts_cross_entropy(xs, t, 0.0f, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("[64]");
    CHECK_ERR_MENTIONS("[5, 4]");
    ts_tensor *tf = tu_tensor(1, (int64_t[]){5}, (float[]){0, 1, 2, 3, 0});
    CHECK_STATUS(ts_cross_entropy(xs, tf, 0.0f, &y), TS_ERR_DTYPE);
    CHECK_ERR_MENTIONS("int64");
    ts_tensor *x1 = tu_rand(&r, 1, (int64_t[]){4}, -1, 1, false);
    CHECK_STATUS(ts_cross_entropy(x1, ts5, 0.0f, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("[4]");
    CHECK_STATUS(ts_cross_entropy(xs, ts5, 1.5f, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("label_smoothing");
    CHECK_STATUS(ts_cross_entropy(xs, ts5, -0.1f, &y), TS_ERR_INVALID_ARG);
    ts_tensor *objs[] = {h, ht, x, t, xs, ts5, x11, t11, ti, big, t1, tbad, tneg, tf, x1};
    release_all(objs, (int)TS_ARRAY_LEN(objs));
}

/* ---- mse_loss ---------------------------------------------------------------------------------------------- */
static ts_status f_mse(ts_tensor **in, void *ctx, ts_tensor **out) { return ts_mse_loss(in[0], in[1], out); }

static void test_mse(void) {
    ts_rng r;
    ts_rng_seed(&r, 19);
    ts_tensor *p = tu_tensor(2, (int64_t[]){2, 2}, (float[]){1, 2, 3, 4});
    ts_tensor *q = tu_tensor(2, (int64_t[]){2, 2}, (float[]){1, 0, 4, 1});
    ts_tensor *y = NULL;
    CHECK_OK(ts_mse_loss(p, q, &y));
    CHECK(ts_tensor_ndim(y) == 0);
    CHECK_NEAR(ts_tensor_data_f32(y)[0], (0 + 4 + 1 + 9) / 4.0, 1e-6);
    ts_tensor_release(y);

    ts_tensor *a = tu_rand(&r, 3, (int64_t[]){2, 3, 4}, -1, 1, true);
    ts_tensor *b = tu_rand(&r, 3, (int64_t[]){2, 3, 4}, -1, 1, true);
    ts_tensor *in[2] = {a, b};
    GC("mse", f_mse, in, 2, NULL);
    ts_tensor_set_requires_grad(b, false);
    GC("mse pred only", f_mse, in, 2, NULL);
    /* broadcasting, as PyTorch does (with a warning) */
    ts_tensor *c = tu_rand(&r, 2, (int64_t[]){1, 4}, -1, 1, true);
    ts_tensor *inc[2] = {a, c};
    GC("mse broadcast", f_mse, inc, 2, NULL);
    CHECK_OK(ts_mse_loss(a, c, &y));
    double ref = 0;
    for (int i = 0; i < 24; i++) {
        double d = ts_tensor_data_f32(a)[i] - ts_tensor_data_f32(c)[i % 4];
        ref += d * d / 24;
    }
    CHECK_NEAR(ts_tensor_data_f32(y)[0], ref, 1e-6);
    ts_tensor_release(y);

    ts_tensor *bad = tu_rand(&r, 2, (int64_t[]){3, 5}, -1, 1, false);
    CHECK_STATUS(ts_mse_loss(a, bad, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("mse_loss");
    CHECK_ERR_MENTIONS("[3, 5]");
    ts_tensor *ti = idx_tensor(1, (int64_t[]){1}, (int64_t[]){1});
    CHECK_STATUS(ts_mse_loss(a, ti, &y), TS_ERR_DTYPE);
    ts_tensor *objs[] = {p, q, a, b, c, bad, ti};
    release_all(objs, (int)TS_ARRAY_LEN(objs));
}

/* A small classifier step through every op here; releasing everything frees the graph. */
static void test_graph_lifetime(void) {
    size_t before = ts_device_memory_allocated(ts_device_cpu());
    ts_rng r;
    ts_rng_seed(&r, 20);
    ts_tensor *emb = tu_rand(&r, 2, (int64_t[]){10, 4}, -1, 1, true);
    ts_tensor *w = tu_rand(&r, 2, (int64_t[]){3, 16}, -1, 1, true);
    ts_tensor *idx = idx_tensor(2, (int64_t[]){6, 4}, (int64_t[]){1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2,
                                                                  3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4});
    ts_tensor *tg = idx_tensor(1, (int64_t[]){6}, (int64_t[]){0, 1, 2, 0, 1, 2});
    ts_tensor *e = NULL, *f = NULL, *dr = NULL, *s1 = NULL, *s2 = NULL, *cat = NULL, *logits = NULL, *l1 = NULL,
              *ls = NULL, *l2 = NULL, *loss = NULL;
    ts_rng dr_rng;
    ts_rng_seed(&dr_rng, 3);
    CHECK_OK(ts_embedding(idx, emb, &e)); /* (6, 4, 4) */
    CHECK_OK(ts_flatten(e, 1, &f));        /* (6, 16) */
    CHECK_OK(ts_dropout(f, 0.25f, true, &dr_rng, &dr));
    CHECK_OK(ts_slice(dr, 0, 0, 3, &s1));
    CHECK_OK(ts_slice(dr, 0, -3, 6, &s2));
    ts_tensor *parts[2] = {s2, s1};
    CHECK_OK(ts_concat(parts, 2, 0, &cat));
    CHECK_OK(ts_linear(cat, w, NULL, &logits));
    CHECK_OK(ts_cross_entropy(logits, tg, 0.1f, &l1));
    CHECK_OK(ts_log_softmax(logits, -1, &ls));
    CHECK_OK(ts_mse_loss(ls, logits, &l2));
    CHECK_OK(ts_add(l1, l2, &loss));
    ts_tensor *mid[] = {e, f, dr, s1, s2, cat, logits, l1, ls, l2};
    release_all(mid, (int)TS_ARRAY_LEN(mid));
    CHECK_OK(ts_backward(loss, NULL, false));
    CHECK(ts_tensor_grad(emb) && ts_tensor_grad(w));
    ts_tensor *objs[] = {loss, emb, w, idx, tg};
    release_all(objs, (int)TS_ARRAY_LEN(objs));
    CHECK(ts_device_memory_allocated(ts_device_cpu()) == before);
}

TU_MAIN(T(test_reshape), T(test_flatten), T(test_concat), T(test_slice), T(test_embedding), T(test_dropout),
        T(test_log_softmax), T(test_cross_entropy), T(test_mse), T(test_graph_lifetime))
