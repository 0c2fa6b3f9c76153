/*
 * tests/test_ops_extra.c — div, the activations, softmax, sum/mean over dims,
 * max along a dim, permute/transpose, flatten_range, bmm and batched matmul,
 * adaptive average pooling: what the golden cases (tests/test_golden_ops.c)
 * do not reach. Shapes large enough to take the kernels' parallel and tiled
 * paths against naive loops in double, non-contiguous inputs against
 * contiguous copies, 0-d and empty tensors, the graph freeing its memory, and
 * the error messages.
 */
#include "tensor/tensor.h"
#include "test_util.h"

#include <limits.h>

static void release_all(ts_tensor **ts, int n) {
    for (int i = 0; i < n; i++) ts_tensor_release(ts[i]);
}

static bool shape_is(const ts_tensor *t, int ndim, const int64_t *shape) {
    if (ts_tensor_ndim(t) != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (ts_tensor_shape(t)[i] != shape[i]) return false;
    return true;
}

/* A view of t with dims a and b swapped (non-contiguous), made by hand. */
static ts_tensor *swapped(ts_tensor *t, int a, int b) {
    ts_tensor *v = NULL;
    if (ts_tensor_detach(t, &v) != TS_OK) abort();
    int64_t s = v->shape[a], st = v->stride[a];
    v->shape[a] = v->shape[b];
    v->stride[a] = v->stride[b];
    v->shape[b] = s;
    v->stride[b] = st;
    return v;
}

/* ---- large shapes against naive loops --------------------------------------------------------- */
/* x (A, B, C) summed over dim 1 in double */
static double sum_mid_err(ts_tensor *x, ts_tensor *y, double alpha) {
    const int64_t *s = ts_tensor_shape(x);
    const float *px = ts_tensor_data_f32(x), *py = ts_tensor_data_f32(y);
    double worst = 0;
    for (int64_t a = 0; a < s[0]; a++)
        for (int64_t c = 0; c < s[2]; c++) {
            double acc = 0;
            for (int64_t b = 0; b < s[1]; b++) acc += px[(a * s[1] + b) * s[2] + c];
            worst = fmax(worst, fabs(alpha * acc - py[a * s[2] + c]));
        }
    return worst;
}

static void test_reductions_large(void) {
    ts_rng r;
    ts_rng_seed(&r, 31);
    /* outer 1 (the kernel splits the inner dim), outer 8, inner 1 */
    const int64_t shapes[][3] = {{1, 64, 8192}, {8, 33, 1500}, {3000, 40, 1}};
    for (size_t k = 0; k < TS_ARRAY_LEN(shapes); k++) {
        ts_tensor *x = tu_rand(&r, 3, shapes[k], -1, 1, false), *y = NULL;
        CHECK_OK(ts_sum_dims(x, 1, (int[]){1}, false, &y));
        CHECK(y && sum_mid_err(x, y, 1.0) < 1e-4);
        ts_tensor_release(y);
        CHECK_OK(ts_mean_dims(x, 1, (int[]){-2}, true, &y));
        CHECK(y && shape_is(y, 3, (int64_t[]){shapes[k][0], 1, shapes[k][2]}));
        CHECK(y && sum_mid_err(x, y, 1.0 / (double)shapes[k][1]) < 1e-6);
        ts_tensor_release(y);
        ts_tensor_release(x);
    }
    /* two reduced groups: (6, 50, 7, 300) over (0, 2) = ([6], 50, [7], 300) */
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){6, 50, 7, 300}, -1, 1, true), *y = NULL;
    CHECK_OK(ts_sum_dims(x, 2, (int[]){2, 0}, false, &y));
    CHECK(y && shape_is(y, 2, (int64_t[]){50, 300}));
    const float *px = ts_tensor_data_f32(x);
    double worst = 0;
    for (int64_t b = 0; y && b < 50; b++)
        for (int64_t d = 0; d < 300; d++) {
            double acc = 0;
            for (int64_t a = 0; a < 6; a++)
                for (int64_t c = 0; c < 7; c++) acc += px[((a * 50 + b) * 7 + c) * 300 + d];
            worst = fmax(worst, fabs(acc - ts_tensor_data_f32(y)[b * 300 + d]));
        }
    CHECK(worst < 1e-4);
    /* backward: every element of x gets its column's upstream gradient */
    ts_tensor *gy = tu_rand(&r, 2, (int64_t[]){50, 300}, -1, 1, false);
    CHECK_OK(ts_backward(y, gy, false));
    ts_tensor *gx = ts_tensor_grad(x);
    bool ok = gx != NULL;
    for (int64_t i = 0; ok && i < 6 * 50 * 7 * 300; i++) {
        int64_t b = (i / (7 * 300)) % 50, d = i % 300;
        ok = ts_tensor_data_f32(gx)[i] == ts_tensor_data_f32(gy)[b * 300 + d];
    }
    CHECK(ok);
    ts_tensor *objs[] = {x, y, gy};
    release_all(objs, 3);

    /* max along a dim, rows of 1000 and inner 16; the gradient lands on the argmax */
    ts_tensor *m = tu_rand(&r, 3, (int64_t[]){40, 1000, 16}, -1, 1, true), *v = NULL, *idx = NULL;
    CHECK_OK(ts_max_dim(m, 1, false, &v, &idx));
    CHECK(v && idx && ts_tensor_dtype(idx) == TS_I64 && shape_is(idx, 2, (int64_t[]){40, 16}));
    const float *pm = ts_tensor_data_f32(m);
    ok = v && idx;
    for (int64_t a = 0; ok && a < 40; a++)
        for (int64_t c = 0; ok && c < 16; c++) {
            int64_t best = 0;
            for (int64_t b = 1; b < 1000; b++)
                if (pm[(a * 1000 + b) * 16 + c] > pm[(a * 1000 + best) * 16 + c]) best = b;
            ok = ((const int64_t *)ts_tensor_data(idx))[a * 16 + c] == best &&
                 ts_tensor_data_f32(v)[a * 16 + c] == pm[(a * 1000 + best) * 16 + c];
        }
    CHECK(ok);
    ts_tensor *ones = NULL;
    CHECK_OK(ts_tensor_full(ts_device_cpu(), 2, (int64_t[]){40, 16}, 1.0f, &ones));
    CHECK_OK(ts_backward(v, ones, false));
    ts_tensor_release(ones);
    double total = 0;
    for (int64_t i = 0; ts_tensor_grad(m) && i < 40 * 1000 * 16; i++) total += ts_tensor_data_f32(ts_tensor_grad(m))[i];
    CHECK(total == 40 * 16);
    ts_tensor *objs2[] = {m, v, idx};
    release_all(objs2, 3);

    /* ties go to the first position; a NaN wins */
    ts_tensor *t = tu_tensor(2, (int64_t[]){2, 4}, (float[]){1, 3, 3, 2, 0, NAN, 5, NAN});
    CHECK_OK(ts_max_dim(t, 1, true, NULL, &idx));
    CHECK(idx && ((const int64_t *)ts_tensor_data(idx))[0] == 1 && ((const int64_t *)ts_tensor_data(idx))[1] == 1);
    ts_tensor_release(idx);
    ts_tensor_release(t);
}

static void test_permute_large(void) {
    ts_rng r;
    ts_rng_seed(&r, 32);
    /* (3, 200, 300) -> (3, 300, 200): tiled transposes; (8, 16, 32, 20) -> (0, 3, 1, 2) */
    struct {
        int nd;
        int64_t shape[4];
        int perm[4];
    } cases[] = {{3, {3, 200, 300}, {0, 2, 1}}, {4, {8, 16, 32, 20}, {0, 3, 1, 2}}, {4, {5, 6, 7, 9}, {2, 0, 3, 1}},
                 {4, {5, 6, 7, 9}, {1, 2, 0, 3}}};
    for (size_t k = 0; k < TS_ARRAY_LEN(cases); k++) {
        int nd = cases[k].nd;
        ts_tensor *x = tu_rand(&r, nd, cases[k].shape, -1, 1, false), *y = NULL;
        CHECK_OK(ts_permute(x, cases[k].perm, &y));
        if (!y) continue;
        /* walk y's elements in order, reading x at the permuted index */
        int64_t n = ts_tensor_numel(y), idx[4] = {0}, xstr[4], s = 1;
        for (int d = nd - 1; d >= 0; d--) {
            xstr[d] = s;
            s *= cases[k].shape[d];
        }
        bool ok = true;
        for (int64_t i = 0; i < n && ok; i++) {
            int64_t off = 0;
            for (int d = 0; d < nd; d++) off += idx[d] * xstr[cases[k].perm[d]];
            ok = ts_tensor_data_f32(y)[i] == ts_tensor_data_f32(x)[off];
            for (int d = nd - 1; d >= 0; d--) {
                if (++idx[d] < ts_tensor_shape(y)[d]) break;
                idx[d] = 0;
            }
        }
        CHECK(ok);
        ts_tensor_release(x);
        ts_tensor_release(y);
    }
    /* any dtype: an int64 transpose */
    int64_t data[6] = {1, 2, 3, 4, 5, 6};
    ts_tensor *xi = NULL, *yi = NULL;
    CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_I64, 2, (int64_t[]){2, 3}, data, &xi));
    CHECK_OK(ts_transpose(xi, 0, 1, &yi));
    const int64_t want[6] = {1, 4, 2, 5, 3, 6};
    CHECK(yi && ts_tensor_dtype(yi) == TS_I64 && !memcmp(ts_tensor_data(yi), want, sizeof want));
    ts_tensor_release(xi);
    ts_tensor_release(yi);
}

static void test_matmul_large(void) {
    ts_rng r;
    ts_rng_seed(&r, 33);
    /* (16, 3, 64, 32) x (32, 48): 48 small products, one per thread at a time */
    ts_tensor *a = tu_rand(&r, 4, (int64_t[]){16, 3, 64, 32}, -1, 1, false);
    ts_tensor *b = tu_rand(&r, 2, (int64_t[]){32, 48}, -1, 1, false), *y = NULL;
    CHECK_OK(ts_matmul(a, b, &y));
    CHECK(y && shape_is(y, 4, (int64_t[]){16, 3, 64, 48}));
    double worst = 0;
    const float *pa = ts_tensor_data_f32(a), *pb = ts_tensor_data_f32(b);
    for (int64_t i = 0; y && i < 48 * 64; i++)
        for (int64_t n = 0; n < 48; n++) {
            double acc = 0;
            for (int64_t k = 0; k < 32; k++) acc += (double)pa[i * 32 + k] * pb[k * 48 + n];
            worst = fmax(worst, fabs(acc - ts_tensor_data_f32(y)[i * 48 + n]));
        }
    CHECK(worst < 1e-4);
    ts_tensor_release(y);
    /* bmm agrees with one matmul per batch */
    ts_tensor *x = tu_rand(&r, 3, (int64_t[]){5, 20, 30}, -1, 1, false);
    ts_tensor *w = tu_rand(&r, 3, (int64_t[]){5, 30, 10}, -1, 1, false);
    CHECK_OK(ts_bmm(x, w, &y));
    for (int i = 0; y && i < 5; i++) {
        ts_tensor *xi = NULL, *wi = NULL, *yi = NULL, *xs = NULL, *ws = NULL;
        CHECK_OK(ts_slice(x, 0, i, i + 1, &xs));
        CHECK_OK(ts_slice(w, 0, i, i + 1, &ws));
        CHECK_OK(ts_reshape(xs, 2, (int64_t[]){20, 30}, &xi));
        CHECK_OK(ts_reshape(ws, 2, (int64_t[]){30, 10}, &wi));
        CHECK_OK(ts_matmul(xi, wi, &yi));
        CHECK(yi && tu_max_abs_diff(yi, ts_tensor_data_f32(y) + i * 200) == 0);
        ts_tensor *o[] = {xi, wi, yi, xs, ws};
        release_all(o, 5);
    }
    /* K = 0: zeros, and zero gradients */
    ts_tensor *e1 = NULL, *e2 = NULL, *ez = NULL;
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_F32, 3, (int64_t[]){2, 3, 0}, &e1));
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_F32, 3, (int64_t[]){2, 0, 4}, &e2));
    ts_tensor_set_requires_grad(e1, true);
    CHECK_OK(ts_bmm(e1, e2, &ez));
    CHECK(ez && shape_is(ez, 3, (int64_t[]){2, 3, 4}));
    for (int i = 0; ez && i < 24; i++) CHECK(ts_tensor_data_f32(ez)[i] == 0);
    ts_tensor *gz = NULL;
    CHECK_OK(ts_tensor_full(ts_device_cpu(), 3, (int64_t[]){2, 3, 4}, 1.0f, &gz));
    CHECK_OK(ts_backward(ez, gz, false));
    CHECK(ts_tensor_grad(e1) && shape_is(ts_tensor_grad(e1), 3, (int64_t[]){2, 3, 0}));
    ts_tensor_release(gz);
    ts_tensor *objs[] = {a, b, y, x, w, e1, e2, ez};
    release_all(objs, 8);
}

/* ---- non-contiguous inputs against contiguous copies ------------------------------------------ */
typedef ts_status (*op1_fn)(ts_tensor *x, ts_tensor **out);
static ts_status op_gelu(ts_tensor *x, ts_tensor **o) { return ts_gelu(x, false, o); }
static ts_status op_sigmoid(ts_tensor *x, ts_tensor **o) { return ts_sigmoid(x, o); }
static ts_status op_softmax(ts_tensor *x, ts_tensor **o) { return ts_softmax(x, 1, o); }
static ts_status op_sum02(ts_tensor *x, ts_tensor **o) { return ts_sum_dims(x, 2, (int[]){0, 2}, true, o); }
static ts_status op_max1(ts_tensor *x, ts_tensor **o) { return ts_max_dim(x, 1, false, o, NULL); }
static ts_status op_permute(ts_tensor *x, ts_tensor **o) { return ts_permute(x, (int[]){2, 0, 1}, o); }
static ts_status op_adaptive(ts_tensor *x, ts_tensor **o) {
    ts_tensor *v = NULL; /* the (3, 5, 4) view as a (C, H, W) input */
    ts_status st = ts_adaptive_avgpool2d(x, 2, 3, &v);
    if (st != TS_OK) return st;
    st = ts_scale(v, 1.0f, o);
    ts_tensor_release(v);
    return st;
}
static ts_status op_matmul(ts_tensor *x, ts_tensor **o) {
    ts_tensor *w = NULL;
    ts_status st = ts_tensor_full(ts_device_cpu(), 2, (int64_t[]){4, 2}, 0.5f, &w);
    if (st == TS_OK) st = ts_matmul(x, w, o);
    ts_tensor_release(w);
    return st;
}

static void test_noncontiguous(void) {
    static const struct {
        const char *name;
        op1_fn f;
    } ops[] = {{"gelu", op_gelu},       {"sigmoid", op_sigmoid}, {"softmax", op_softmax},   {"sum_dims", op_sum02},
               {"max_dim", op_max1},    {"permute", op_permute}, {"adaptive", op_adaptive}, {"matmul", op_matmul}};
    ts_rng r;
    ts_rng_seed(&r, 34);
    for (size_t k = 0; k < TS_ARRAY_LEN(ops); k++) {
        ts_tensor *base = tu_rand(&r, 3, (int64_t[]){3, 4, 5}, -2, 2, false);
        ts_tensor *v = swapped(base, 1, 2), *c = NULL; /* (3, 5, 4), non-contiguous */
        CHECK_OK(ts_tensor_clone(v, &c));
        ts_tensor_set_requires_grad(v, true);
        ts_tensor_set_requires_grad(c, true);
        ts_tensor *o1 = NULL, *o2 = NULL;
        CHECK_OK(ops[k].f(v, &o1));
        CHECK_OK(ops[k].f(c, &o2));
        if (o1 && o2) {
            CHECK(shape_is(o1, ts_tensor_ndim(o2), ts_tensor_shape(o2)));
            CHECK(tu_max_abs_diff(o1, ts_tensor_data_f32(o2)) == 0);
            ts_tensor *g = tu_rand(&r, ts_tensor_ndim(o1), ts_tensor_shape(o1), -1, 1, false);
            CHECK_OK(ts_backward(o1, g, false));
            CHECK_OK(ts_backward(o2, g, false));
            ts_tensor *g1 = ts_tensor_grad(v), *g2 = ts_tensor_grad(c), *g1c = NULL;
            CHECK(g1 && g2);
            if (g1 && g2) {
                CHECK_OK(ts_tensor_clone(g1, &g1c));
                if (tu_max_abs_diff(g1c, ts_tensor_data_f32(g2)) != 0) {
                    tu_failures++;
                    fprintf(stderr, "%s: gradient of a non-contiguous input differs\n", ops[k].name);
                }
            }
            ts_tensor_release(g1c);
            ts_tensor_release(g);
        }
        ts_tensor *objs[] = {base, v, c, o1, o2};
        release_all(objs, 5);
    }
}

/* ---- activations over the whole float range ---------------------------------------------------- */
/* The CPU kernels use their own vectorising exp, erf and tanh (src/ops/cpu/vmath.h): check them against libm
 * in double from -100 to 100, with the infinities and a NaN; GELU's tanh form's gradient too. */
static double gelu_tanh_ref(double v) { return 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); }

static double gelu_tanh_grad_ref(double v) {
    const double u = sqrt(2 / M_PI) * (v + 0.044715 * v * v * v), t = tanh(u);
    return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * sqrt(2 / M_PI) * (1 + 3 * 0.044715 * v * v);
}

static void test_activations_range(void) {
    enum { N = 40003, K = 6 };
    static float xs[N];
    for (int i = 0; i < N - 3; i++) xs[i] = -100.0f + 200.0f * (float)i / (float)(N - 4);
    for (int i = 0; i < 200; i++) xs[2 * i + 1] = ldexpf((float)(i + 1) / 200.0f, -i % 24); /* near 0: tanh's cutover */
    xs[N - 3] = INFINITY;
    xs[N - 2] = -INFINITY;
    xs[N - 1] = NAN;
    ts_tensor *x = tu_tensor(1, (int64_t[]){N}, xs), *ys[K] = {NULL}, *xg = tu_tensor(1, (int64_t[]){N}, xs);
    ts_tensor_set_requires_grad(xg, true);
    CHECK_OK(ts_sigmoid(x, &ys[0]));
    CHECK_OK(ts_silu(x, &ys[1]));
    CHECK_OK(ts_gelu(x, false, &ys[2]));
    CHECK_OK(ts_tanh(x, &ys[3]));
    CHECK_OK(ts_gelu(xg, true, &ys[4]));
    static float ones[N];
    for (int i = 0; i < N; i++) ones[i] = 1.0f;
    ts_tensor *g1 = tu_tensor(1, (int64_t[]){N}, ones);
    CHECK_OK(ts_backward(ys[4], g1, false)); /* ys[5]: the derivative */
    ts_tensor_release(g1);
    ys[5] = ts_tensor_grad(xg);
    ts_tensor_retain(ys[5]);
    double worst[K] = {0};
    for (int i = 0; i < N - 1 && ys[0] && ys[1] && ys[2] && ys[3] && ys[4] && ys[5]; i++) {
        double v = xs[i], sg = 1.0 / (1.0 + exp(-v));
        /* at -inf, x * 0: nan, as PyTorch gives */
        double want[K] = {sg, v == -INFINITY ? NAN : v * sg, v == -INFINITY ? NAN : 0.5 * v * (1 + erf(v / sqrt(2))),
                          tanh(v), v == -INFINITY ? NAN : gelu_tanh_ref(v),
                          isinf(v) ? ts_tensor_data_f32(ys[5])[i] : gelu_tanh_grad_ref(v)};
        for (int k = 0; k < K; k++) {
            double got = ts_tensor_data_f32(ys[k])[i];
            double err = (got == want[k] || (isnan(got) && isnan(want[k])))
                             ? 0
                             : fabs(got - want[k]) / (1e-6 * fabs(v) + 1e-7 + 1e-6 * fabs(want[k]));
            if (!(err <= worst[k])) worst[k] = err; /* (a nan err counts) */
        }
    }
    for (int k = 0; k < K; k++) {
        if (!(worst[k] <= 1)) fprintf(stderr, "activation %d: worst %.3g of tolerance\n", k, worst[k]);
        CHECK(worst[k] <= 1);
        CHECK(ys[k] && isnan(ts_tensor_data_f32(ys[k])[N - 1]));
    }
    for (int i = 1; i < 400 && ys[3]; i += 2) /* tanh(x) = x below 4e-4, as in float */
        if (fabsf(xs[i]) < 4e-4f) CHECK(ts_tensor_data_f32(ys[3])[i] == xs[i]);
    CHECK(ys[3] && ts_tensor_data_f32(ys[3])[N - 3] == 1.0f && ts_tensor_data_f32(ys[3])[N - 2] == -1.0f);
    ts_tensor_release(xg);
    release_all(ys, K);
    /* softmax rows with -inf (masked) entries, huge logits, and a NaN */
    ts_tensor *s = tu_tensor(2, (int64_t[]){3, 4}, (float[]){0, -INFINITY, 1, -INFINITY, 1000, 999, -1000, 88.8f,
                                                              1, NAN, 2, 3}), *y = NULL;
    CHECK_OK(ts_softmax(s, 1, &y));
    const float *p = y ? ts_tensor_data_f32(y) : NULL;
    if (p) {
        double e = exp(1.0);
        CHECK_NEAR(p[0], 1 / (1 + e), 1e-6);
        CHECK(p[1] == 0 && p[3] == 0);
        CHECK_NEAR(p[2], e / (1 + e), 1e-6);
        CHECK_NEAR(p[4], 1 / (1 + exp(-1.0)), 1e-6);
        CHECK(p[6] == 0 && p[7] == 0);
        for (int i = 8; i < 12; i++) CHECK(isnan(p[i]));
    }
    ts_tensor *objs[] = {x, s, y};
    release_all(objs, 3);
}

/* ---- 0-d, empty, size-1 ------------------------------------------------------------------------------ */
static void test_edges(void) {
    ts_tensor *s = tu_tensor(0, NULL, (float[]){2.5f}), *y = NULL, *idx = NULL;
    CHECK_OK(ts_sum_dims(s, 1, (int[]){0}, false, &y));
    CHECK(y && ts_tensor_ndim(y) == 0 && ts_tensor_data_f32(y)[0] == 2.5f);
    ts_tensor_release(y);
    CHECK_OK(ts_mean_dims(s, 1, (int[]){-1}, true, &y));
    CHECK(y && ts_tensor_ndim(y) == 0 && ts_tensor_data_f32(y)[0] == 2.5f);
    ts_tensor_release(y);
    CHECK_OK(ts_max_dim(s, 0, false, &y, &idx));
    CHECK(y && idx && ts_tensor_ndim(y) == 0 && ts_tensor_data_f32(y)[0] == 2.5f &&
          ((const int64_t *)ts_tensor_data(idx))[0] == 0);
    ts_tensor_release(y);
    ts_tensor_release(idx);
    CHECK_OK(ts_transpose(s, 0, -1, &y));
    CHECK(y && ts_tensor_ndim(y) == 0);
    ts_tensor_release(y);
    CHECK_OK(ts_softmax(s, 0, &y));
    CHECK(y && ts_tensor_data_f32(y)[0] == 1.0f);
    ts_tensor_release(y);
    CHECK_OK(ts_flatten_range(s, 0, -1, &y));
    CHECK(y && shape_is(y, 1, (int64_t[]){1}));
    ts_tensor_release(y);
    /* sum over an empty dim: zeros; mean: nan (as PyTorch) */
    ts_tensor *e = NULL;
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_F32, 3, (int64_t[]){2, 0, 3}, &e));
    CHECK_OK(ts_sum_dims(e, 1, (int[]){1}, false, &y));
    CHECK(y && shape_is(y, 2, (int64_t[]){2, 3}) && ts_tensor_data_f32(y)[5] == 0);
    ts_tensor_release(y);
    CHECK_OK(ts_mean_dims(e, 1, (int[]){1}, false, &y));
    CHECK(y && isnan(ts_tensor_data_f32(y)[0]));
    ts_tensor_release(y);
    CHECK_STATUS(ts_max_dim(e, 1, false, &y, NULL), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("max_dim");
    CHECK_ERR_MENTIONS("[2, 0, 3]");
    CHECK_ERR_MENTIONS("empty");
    /* div by zero follows IEEE */
    ts_tensor *a = tu_tensor(1, (int64_t[]){3}, (float[]){1, -1, 0}), *z = tu_tensor(0, NULL, (float[]){0});
    CHECK_OK(ts_div(a, z, &y));
    CHECK(y && isinf(ts_tensor_data_f32(y)[0]) && ts_tensor_data_f32(y)[1] < 0 && isnan(ts_tensor_data_f32(y)[2]));
    ts_tensor_release(y);
    ts_tensor *objs[] = {s, e, a, z};
    release_all(objs, 4);
}

/* ---- the graph frees what it holds ------------------------------------------------------------------- */
static void test_graph_lifetime(void) {
    size_t before = ts_device_memory_allocated(ts_device_cpu());
    ts_rng r;
    ts_rng_seed(&r, 35);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){2, 3, 7, 6}, -1, 1, true);
    ts_tensor *w = tu_rand(&r, 3, (int64_t[]){1, 12, 5}, -1, 1, true);
    ts_tensor *t[12] = {NULL};
    CHECK_OK(ts_adaptive_avgpool2d(x, 3, 4, &t[0]));            /* (2, 3, 3, 4) */
    CHECK_OK(ts_gelu(t[0], true, &t[1]));
    CHECK_OK(ts_permute(t[1], (int[]){0, 2, 1, 3}, &t[2]));      /* (2, 3, 3, 4) */
    CHECK_OK(ts_flatten_range(t[2], 2, 3, &t[3]));               /* (2, 3, 12) */
    CHECK_OK(ts_matmul(t[3], w, &t[4]));                         /* (2, 3, 5) */
    CHECK_OK(ts_softmax(t[4], -1, &t[5]));
    CHECK_OK(ts_max_dim(t[5], 1, true, &t[6], NULL));            /* (2, 1, 5) */
    CHECK_OK(ts_div(t[5], t[6], &t[7]));                         /* (2, 3, 5) */
    CHECK_OK(ts_transpose(t[7], 0, 2, &t[8]));                   /* (5, 3, 2) */
    CHECK_OK(ts_silu(t[8], &t[9]));
    CHECK_OK(ts_mean_dims(t[9], 2, (int[]){0, -1}, false, &t[10])); /* (3) */
    CHECK_OK(ts_sum_dims(t[10], 0, NULL, false, &t[11]));
    release_all(t, 11);
    CHECK_OK(ts_backward(t[11], NULL, false));
    CHECK(ts_tensor_grad(x) && ts_tensor_grad(w));
    ts_tensor *objs[] = {t[11], x, w};
    release_all(objs, 3);
    CHECK(ts_device_memory_allocated(ts_device_cpu()) == before);
}

/* ---- out of memory at every allocation ---------------------------------------------------------------- */
/* The chain of test_graph_lifetime (every op here, forward and backward) with the allocation after the first
 * n failing, for every n: a failure is reported as TS_ERR_NOMEM (never TS_OK with a gradient missing), and
 * nothing leaks. */
static ts_status chain_step(ts_tensor *x, ts_tensor *w) {
    ts_tensor *t[12] = {NULL};
    ts_status st;
    TS_CHECK_GOTO(ts_adaptive_avgpool2d(x, 3, 4, &t[0]));
    TS_CHECK_GOTO(ts_gelu(t[0], false, &t[1]));
    TS_CHECK_GOTO(ts_permute(t[1], (int[]){0, 2, 1, 3}, &t[2]));
    TS_CHECK_GOTO(ts_flatten_range(t[2], 2, 3, &t[3]));
    TS_CHECK_GOTO(ts_matmul(t[3], w, &t[4]));
    TS_CHECK_GOTO(ts_softmax(t[4], -1, &t[5]));
    TS_CHECK_GOTO(ts_max_dim(t[5], 1, true, &t[6], NULL));
    TS_CHECK_GOTO(ts_div(t[5], t[6], &t[7]));
    TS_CHECK_GOTO(ts_transpose(t[7], 0, 2, &t[8]));
    TS_CHECK_GOTO(ts_sigmoid(t[8], &t[9]));
    TS_CHECK_GOTO(ts_mean_dims(t[9], 2, (int[]){0, -1}, false, &t[10]));
    TS_CHECK_GOTO(ts_sum_dims(t[10], 0, NULL, false, &t[11]));
    st = ts_backward(t[11], NULL, false);
fail:
    release_all(t, 12);
    return st;
}

static void test_alloc_failure(void) {
    ts_rng r;
    ts_rng_seed(&r, 37);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){2, 3, 7, 6}, -1, 1, true);
    ts_tensor *w = tu_rand(&r, 3, (int64_t[]){2, 12, 5}, -1, 1, true);
    size_t before = ts_device_memory_allocated(ts_device_cpu());
    ts__alloc_fail_after(LONG_MAX);
    CHECK_OK(chain_step(x, w));
    long total = ts__alloc_count();
    ts__alloc_fail_after(-1);
    CHECK(total > 20);
    for (long n = 0; n <= total; n++) {
        ts_tensor_zero_grad(x);
        ts_tensor_zero_grad(w);
        ts__alloc_fail_once_after(n);
        ts_status st = chain_step(x, w);
        long injected = ts__alloc_failures();
        ts__alloc_fail_after(-1);
        if (injected) {
            if (st != TS_ERR_NOMEM) fprintf(stderr, "allocation %ld failing: %s (%s)\n", n, ts_status_name(st), ts_last_error());
            CHECK(st == TS_ERR_NOMEM);
        } else {
            CHECK_OK(st);
            CHECK(ts_tensor_grad(x) && ts_tensor_grad(w));
        }
    }
    ts_tensor_zero_grad(x);
    ts_tensor_zero_grad(w);
    CHECK(ts_device_memory_allocated(ts_device_cpu()) == before);
    ts_tensor_release(x);
    ts_tensor_release(w);
}

/* ---- errors ------------------------------------------------------------------------------------------------ */
static void test_errors(void) {
    ts_rng r;
    ts_rng_seed(&r, 36);
    ts_tensor *x = tu_rand(&r, 3, (int64_t[]){2, 3, 4}, -1, 1, false);
    ts_tensor *b = tu_rand(&r, 1, (int64_t[]){5}, -1, 1, false), *y = NULL;
    ts_tensor *xi = NULL;
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_I64, 1, (int64_t[]){3}, &xi));

    CHECK_STATUS(ts_div(x, b, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("div");
    CHECK_ERR_MENTIONS("[2, 3, 4]");
    CHECK_ERR_MENTIONS("[5]");
    CHECK_STATUS(ts_sigmoid(xi, &y), TS_ERR_DTYPE);
    CHECK_ERR_MENTIONS("sigmoid");
    CHECK_STATUS(ts_gelu(NULL, false, &y), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_softmax(x, 3, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("softmax");
    CHECK_ERR_MENTIONS("dim 3");
    CHECK_ERR_MENTIONS("[2, 3, 4]");

    CHECK_STATUS(ts_sum_dims(x, 2, (int[]){1, -2}, false, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("sum_dims");
    CHECK_ERR_MENTIONS("dim 1 appears more than once");
    CHECK_STATUS(ts_mean_dims(x, 1, (int[]){-4}, false, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("mean_dims");
    CHECK_ERR_MENTIONS("dim -4 is out of range");
    CHECK_STATUS(ts_sum_dims(x, 1, NULL, false, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("NULL dims");
    CHECK_STATUS(ts_sum_dims(xi, 1, (int[]){0}, false, &y), TS_ERR_DTYPE);
    CHECK_STATUS(ts_max_dim(x, 3, false, &y, NULL), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("max_dim");
    CHECK_STATUS(ts_max_dim(x, 0, false, NULL, NULL), TS_ERR_INVALID_ARG);

    CHECK_STATUS(ts_permute(x, (int[]){0, 2, -1}, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("permute");
    CHECK_ERR_MENTIONS("dim 2 appears more than once");
    CHECK_STATUS(ts_permute(x, (int[]){0, 1, 3}, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("dim 3 is out of range");
    CHECK_STATUS(ts_transpose(x, 0, -4, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("transpose");
    CHECK_STATUS(ts_flatten_range(x, 2, 1, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("start_dim 2 comes after end_dim 1");

    ts_tensor *a3 = tu_rand(&r, 3, (int64_t[]){2, 3, 4}, -1, 1, false);
    ts_tensor *b3 = tu_rand(&r, 3, (int64_t[]){3, 4, 5}, -1, 1, false);
    ts_tensor *c3 = tu_rand(&r, 3, (int64_t[]){2, 5, 6}, -1, 1, false);
    ts_tensor *m2 = tu_rand(&r, 2, (int64_t[]){4, 5}, -1, 1, false);
    CHECK_STATUS(ts_bmm(a3, b3, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("bmm");
    CHECK_ERR_MENTIONS("batch sizes differ");
    CHECK_ERR_MENTIONS("[2, 3, 4]");
    CHECK_ERR_MENTIONS("[3, 4, 5]");
    CHECK_STATUS(ts_bmm(a3, c3, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("inner dimensions differ (4 and 5)");
    CHECK_STATUS(ts_bmm(a3, m2, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("bmm");
    CHECK_STATUS(ts_matmul(a3, b3, &y), TS_ERR_SHAPE); /* batch 2 vs 3 */
    CHECK_ERR_MENTIONS("matmul: the batch dims of a [2, 3, 4] and b [3, 4, 5] cannot be broadcast together");
    CHECK_STATUS(ts_matmul(b, m2, &y), TS_ERR_SHAPE); /* (5) x (4, 5) */
    CHECK_ERR_MENTIONS("matmul: a [5] and b [4, 5]: inner dimensions differ");
    ts_tensor *s0 = NULL;
    CHECK_OK(ts_tensor_full(ts_device_cpu(), 0, NULL, 2.0f, &s0));
    CHECK_STATUS(ts_matmul(s0, m2, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("at least 1 dim");
    ts_tensor_release(s0);

    CHECK_STATUS(ts_adaptive_avgpool2d(m2, 2, 2, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("adaptive_avgpool2d");
    CHECK_ERR_MENTIONS("[4, 5]");
    CHECK_STATUS(ts_adaptive_avgpool2d(x, 0, 2, &y), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("output size (0, 2)");
    CHECK(y == NULL);
    ts_tensor *objs[] = {x, b, xi, a3, b3, c3, m2};
    release_all(objs, 7);
}

/* torch.matmul's 1-D operands: values against loops in double, shapes, and gradients */
static ts_status f_matmul2(ts_tensor **in, void *ctx, ts_tensor **out) {
    (void)ctx;
    return ts_matmul(in[0], in[1], out);
}

static void test_matmul_vectors(void) {
    ts_rng r;
    ts_rng_seed(&r, 34);
    struct {
        int an, bn;
        int64_t as[3], bs[3];
        int on;
        int64_t os[2];
    } cases[] = {
        {1, 1, {4}, {4}, 0, {0}},                  /* dot */
        {1, 2, {4}, {4, 3}, 1, {3}},               /* vector x matrix */
        {1, 3, {4}, {2, 4, 3}, 2, {2, 3}},         /* vector x batch of matrices */
        {2, 1, {3, 4}, {4}, 1, {3}},               /* matrix x vector */
        {3, 1, {2, 3, 4}, {4}, 2, {2, 3}},         /* batch of matrices x vector */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ts_tensor *in[2] = {tu_rand(&r, cases[c].an, cases[c].as, -1, 1, true),
                            tu_rand(&r, cases[c].bn, cases[c].bs, -1, 1, true)};
        ts_tensor *y = NULL;
        CHECK_OK(ts_matmul(in[0], in[1], &y));
        CHECK(y && shape_is(y, cases[c].on, cases[c].os));
        /* reference: batch B (a's or b's leading dim, or 1), rows M (1 for a vector a), columns N
         * (1 for a vector b) */
        const int64_t K = 4, B = cases[c].an == 3 ? 2 : cases[c].bn == 3 ? 2 : 1;
        const int64_t M = cases[c].an == 1 ? 1 : 3, N = cases[c].bn == 1 ? 1 : 3;
        const float *pa = ts_tensor_data_f32(in[0]), *pb = ts_tensor_data_f32(in[1]);
        double worst = 0;
        for (int64_t bi = 0; y && bi < B; bi++)
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    double acc = 0;
                    for (int64_t k = 0; k < K; k++) {
                        const int64_t ai = (cases[c].an == 3 ? bi * M * K : 0) + i * K + k;
                        const int64_t bj = (cases[c].bn == 3 ? bi * K * N : 0) + k * N + j;
                        acc += (double)pa[ai] * pb[bj];
                    }
                    worst = fmax(worst, fabs(acc - ts_tensor_data_f32(y)[(bi * M + i) * N + j]));
                }
        CHECK(worst < 1e-5);
        CHECK(tu_gradcheck("matmul 1-D", f_matmul2, in, 2, NULL, 1e-2, 1e-3, 1e-2) <= 1);
        ts_tensor_release(y);
        ts_tensor_release(in[0]);
        ts_tensor_release(in[1]);
    }
}

TU_MAIN(T(test_reductions_large), T(test_permute_large), T(test_matmul_large), T(test_matmul_vectors), T(test_noncontiguous),
        T(test_activations_range), T(test_edges),
        T(test_graph_lifetime), T(test_alloc_failure), T(test_errors))
