/*
 * tests/test_ops_spatial.c — conv2d, max/avg/global pooling and batchnorm2d:
 * forward values against hand-computed cases (the pooling ones agree with
 * PyTorch 1.13), conv2d against a plain direct convolution, finite-difference
 * gradchecks over stride, padding, dilation, groups, odd sizes, non-square
 * kernels and ceil_mode, running-statistics updates, eval mode, the 1- and
 * 2-thread paths agreeing, and error messages. (tests/test_golden_ops.c compares
 * the same ops with PyTorch's values.)
 */
#include "core/half.h"
#include "ops/cpu/blocked.h"
#include "test_util.h"

/* ---- helpers ------------------------------------------------------------------------------------ */
#define LEN(a) (sizeof(a) / sizeof((a)[0]))

static int64_t numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

static ts_tensor *t4(int64_t n, int64_t c, int64_t h, int64_t w, const float *data) {
    return tu_tensor(4, (int64_t[]){n, c, h, w}, data);
}

static ts_tensor *arange4(int64_t n, int64_t c, int64_t h, int64_t w) {
    ts_tensor *t = NULL;
    ts_tensor_empty(ts_device_cpu(), TS_F32, 4, (int64_t[]){n, c, h, w}, &t);
    float *p = ts_tensor_data_f32(t);
    for (int64_t i = 0; i < ts_tensor_numel(t); i++) p[i] = (float)i;
    return t;
}

/* Distinct values (a shuffled ramp, gaps of 0.05) so max pooling has no near ties. */
static ts_tensor *distinct4(ts_rng *r, int64_t n, int64_t c, int64_t h, int64_t w) {
    ts_tensor *t = tu_rand(r, 4, (int64_t[]){n, c, h, w}, 0, 1, true);
    int64_t m = ts_tensor_numel(t);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)m);
    for (int64_t i = 0; i < m; i++) idx[i] = i;
    ts_rng_shuffle_i64(r, idx, m);
    float *p = ts_tensor_data_f32(t);
    for (int64_t i = 0; i < m; i++) p[i] = 0.05f * (float)(idx[i] - m / 2);
    free(idx);
    return t;
}

static void check_values(ts_tensor *o, int ndim, const int64_t *shape, const float *want, double tol) {
    CHECK(ts_tensor_ndim(o) == ndim);
    for (int i = 0; i < ndim && i < ts_tensor_ndim(o); i++) CHECK(ts_tensor_shape(o)[i] == shape[i]);
    if (ts_tensor_numel(o) == numel(ndim, shape)) CHECK(tu_max_abs_diff(o, want) <= tol);
}

/* ---- conv2d ------------------------------------------------------------------------------------- */
typedef struct {
    ts_conv2d_params p;
} conv_ctx;

static ts_status f_conv(ts_tensor **in, void *ctx, ts_tensor **out) {
    return ts_conv2d(in[0], in[1], in[2], ((conv_ctx *)ctx)->p, out);
}

/* Direct convolution in double: the obvious loops. */
static void conv_reference(ts_tensor *x, ts_tensor *w, ts_tensor *b, ts_conv2d_params p, int64_t OH, int64_t OW,
                           float *out) {
    const int64_t *xs = ts_tensor_shape(x), *ws = ts_tensor_shape(w);
    int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], K = ws[0], Cg = ws[1], kh = ws[2], kw = ws[3];
    int64_t Kg = K / p.groups;
    const float *px = ts_tensor_data_f32(x), *pw = ts_tensor_data_f32(w), *pb = b ? ts_tensor_data_f32(b) : NULL;
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    double s = pb ? pb[k] : 0;
                    int64_t g = k / Kg;
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t i = 0; i < kh; i++)
                            for (int64_t j = 0; j < kw; j++) {
                                int64_t ih = oh * p.stride[0] - p.padding[0] + i * p.dilation[0];
                                int64_t iw = ow * p.stride[1] - p.padding[1] + j * p.dilation[1];
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                s += (double)px[((n * C + g * Cg + c) * H + ih) * W + iw] *
                                     pw[((k * Cg + c) * kh + i) * kw + j];
                            }
                    out[((n * K + k) * OH + oh) * OW + ow] = (float)s;
                }
}

typedef struct {
    const char *name;
    int64_t N, C, H, W, K, kh, kw;
    ts_conv2d_params p;
    bool bias;
} conv_case;

static const conv_case conv_cases[] = {
    {"3x3 pad 1", 2, 3, 5, 6, 4, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, true},
    {"stride 2, odd sizes, 2x3 kernel", 2, 2, 7, 5, 3, 2, 3, {{2, 2}, {1, 0}, {1, 1}, 1}, true},
    {"stride (1,2), dilation 2, pad 2", 1, 2, 6, 7, 3, 3, 2, {{1, 2}, {2, 1}, {2, 2}, 1}, true},
    {"groups 2", 2, 4, 5, 5, 6, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 2}, true},
    {"depthwise, stride 2", 1, 3, 6, 6, 3, 3, 3, {{2, 2}, {1, 1}, {1, 1}, 3}, false},
    {"1x1 pointwise, no bias", 2, 3, 4, 5, 2, 1, 1, {{1, 1}, {0, 0}, {1, 1}, 1}, false},
    {"1x1 stride 2 pad 1", 1, 2, 5, 4, 3, 1, 1, {{2, 2}, {1, 1}, {1, 1}, 1}, true},
    {"kernel = padded input", 2, 2, 3, 4, 2, 5, 6, {{1, 1}, {1, 1}, {1, 1}, 1}, true},
    {"dilation 2, same size", 2, 3, 6, 5, 4, 3, 3, {{1, 1}, {2, 2}, {2, 2}, 1}, true},
    {"2x3 pad (0,1)", 1, 2, 5, 4, 3, 2, 3, {{1, 1}, {0, 1}, {1, 1}, 1}, true},
    {"1x3 pad 1 grows H", 1, 2, 4, 5, 3, 1, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, true},
    {"5x5 pad 2", 2, 2, 4, 6, 3, 5, 5, {{1, 1}, {2, 2}, {1, 1}, 1}, false},
    {"tall kernel, one output row", 1, 2, 5, 5, 2, 7, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, true},
    {"stride (2,1) pad 1, depthwise x2", 2, 4, 7, 6, 8, 3, 3, {{2, 1}, {1, 1}, {1, 1}, 4}, true},
    /* output planes of at most 4 positions (ResNet-18's layer4 at 64x64): backward through the batched
     * im2col path and its tiny-plane gathers */
    {"2x2 plane, 3x3 pad 1", 3, 4, 2, 2, 5, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, true},
    {"3x3 stride 2 onto 2x2", 2, 3, 4, 4, 4, 3, 3, {{2, 2}, {1, 1}, {1, 1}, 1}, true},
    {"1x1 stride 2 onto 2x2", 2, 3, 4, 4, 4, 1, 1, {{2, 2}, {0, 0}, {1, 1}, 1}, false},
};

static void test_conv2d_values(void) {
    /* x = 1..9 (3x3); w = [1 0; 0 -1]: every output is x[i][j] - x[i+1][j+1] = -4, plus bias 0.5 */
    float xv[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    ts_tensor *x = t4(1, 1, 3, 3, xv), *w = t4(1, 1, 2, 2, (float[]){1, 0, 0, -1});
    ts_tensor *b = tu_tensor(1, (int64_t[]){1}, (float[]){0.5f}), *o = NULL;
    CHECK_OK(ts_conv2d(x, w, b, TS_CONV2D_DEFAULT, &o));
    check_values(o, 4, (int64_t[]){1, 1, 2, 2}, (float[]){-3.5f, -3.5f, -3.5f, -3.5f}, 1e-6);
    ts_tensor_release(o);
    /* 3x3 ones, padding 1, stride 2: sums of the 2x2 corners of x */
    ts_tensor *ones = t4(1, 1, 3, 3, (float[]){1, 1, 1, 1, 1, 1, 1, 1, 1});
    CHECK_OK(ts_conv2d(x, ones, NULL, ((ts_conv2d_params){{2, 2}, {1, 1}, {1, 1}, 1}), &o));
    check_values(o, 4, (int64_t[]){1, 1, 2, 2}, (float[]){12, 16, 24, 28}, 1e-5);
    ts_tensor_release(o);
    /* 2x2 ones with dilation 2 on 3x3: the four corners, 1 + 3 + 7 + 9 */
    ts_tensor *ones2 = t4(1, 1, 2, 2, (float[]){1, 1, 1, 1});
    CHECK_OK(ts_conv2d(x, ones2, NULL, ((ts_conv2d_params){{1, 1}, {0, 0}, {2, 2}, 1}), &o));
    check_values(o, 4, (int64_t[]){1, 1, 1, 1}, (float[]){20}, 1e-5);
    ts_tensor_release(o);
    /* groups 2: channel 0 (all 1) times 3, channel 1 (all 2) times 5 */
    ts_tensor *xg = t4(1, 2, 2, 2, (float[]){1, 1, 1, 1, 2, 2, 2, 2}), *wg = t4(2, 1, 1, 1, (float[]){3, 5});
    CHECK_OK(ts_conv2d(xg, wg, NULL, ((ts_conv2d_params){{1, 1}, {0, 0}, {1, 1}, 2}), &o));
    check_values(o, 4, (int64_t[]){1, 2, 2, 2}, (float[]){3, 3, 3, 3, 10, 10, 10, 10}, 1e-6);
    ts_tensor_release(o);
    ts_tensor *objs[] = {x, w, b, ones, ones2, xg, wg};
    for (size_t i = 0; i < LEN(objs); i++) ts_tensor_release(objs[i]);

    /* every gradcheck case against the direct convolution */
    ts_rng r;
    ts_rng_seed(&r, 10);
    for (size_t c = 0; c < LEN(conv_cases); c++) {
        const conv_case *k = &conv_cases[c];
        ts_tensor *cx = tu_rand(&r, 4, (int64_t[]){k->N, k->C, k->H, k->W}, -1, 1, false);
        ts_tensor *cw = tu_rand(&r, 4, (int64_t[]){k->K, k->C / k->p.groups, k->kh, k->kw}, -1, 1, false);
        ts_tensor *cb = k->bias ? tu_rand(&r, 1, (int64_t[]){k->K}, -1, 1, false) : NULL;
        CHECK_OK(ts_conv2d(cx, cw, cb, k->p, &o));
        if (o) {
            int64_t OH = (k->H + 2 * k->p.padding[0] - k->p.dilation[0] * (k->kh - 1) - 1) / k->p.stride[0] + 1;
            int64_t OW = (k->W + 2 * k->p.padding[1] - k->p.dilation[1] * (k->kw - 1) - 1) / k->p.stride[1] + 1;
            float *want = malloc(sizeof(float) * (size_t)(k->N * k->K * OH * OW));
            conv_reference(cx, cw, cb, k->p, OH, OW, want);
            check_values(o, 4, (int64_t[]){k->N, k->K, OH, OW}, want, 1e-5);
            free(want);
        }
        ts_tensor_release(o);
        ts_tensor_release(cx);
        ts_tensor_release(cw);
        ts_tensor_release(cb);
    }
}

static void test_conv2d_grad(void) {
    ts_rng r;
    ts_rng_seed(&r, 11);
    for (size_t c = 0; c < LEN(conv_cases); c++) {
        const conv_case *k = &conv_cases[c];
        ts_tensor *in[3] = {tu_rand(&r, 4, (int64_t[]){k->N, k->C, k->H, k->W}, -1, 1, true),
                            tu_rand(&r, 4, (int64_t[]){k->K, k->C / k->p.groups, k->kh, k->kw}, -1, 1, true),
                            k->bias ? tu_rand(&r, 1, (int64_t[]){k->K}, -1, 1, true) : NULL};
        conv_ctx ctx = {k->p};
        double worst = tu_gradcheck(k->name, f_conv, in, 3, &ctx, 1e-2, 1e-3, 1e-2);
        if (worst > 1) fprintf(stderr, "conv2d case '%s' failed gradcheck (%.3g)\n", k->name, worst);
        /* only the weight requiring grad (the first layer of a network) */
        ts_tensor_set_requires_grad(in[0], false);
        CHECK(tu_gradcheck(k->name, f_conv, in, 3, &ctx, 1e-2, 1e-3, 1e-2) <= 1);
        for (int i = 0; i < 3; i++) ts_tensor_release(in[i]);
    }
}

/* The image-parallel path (2 threads) gives the serial path's results. */
static void test_conv2d_threads_agree(void) {
    ts_rng r;
    ts_rng_seed(&r, 12);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){8, 3, 16, 16}, -1, 1, true);
    ts_tensor *w = tu_rand(&r, 4, (int64_t[]){32, 3, 3, 3}, -1, 1, true);
    ts_tensor *b = tu_rand(&r, 1, (int64_t[]){32}, -1, 1, true);
    int before = ts_get_num_threads();
    float *res[2][4] = {{0}};
    for (int t = 0; t < 2; t++) {
        ts_set_num_threads(t + 1);
        ts_tensor *o = NULL, *s = NULL, *o2 = NULL;
        CHECK_OK(ts_conv2d(x, w, b, ((ts_conv2d_params){{1, 1}, {1, 1}, {1, 1}, 1}), &o));
        CHECK_OK(ts_mul(o, o, &o2));
        CHECK_OK(ts_sum(o2, &s));
        ts_tensor_zero_grad(x);
        ts_tensor_zero_grad(w);
        ts_tensor_zero_grad(b);
        CHECK_OK(ts_backward(s, NULL, false));
        ts_tensor *outs[4] = {o, ts_tensor_grad(x), ts_tensor_grad(w), ts_tensor_grad(b)};
        for (int i = 0; i < 4; i++) {
            size_t nb = ts_tensor_nbytes(outs[i]);
            res[t][i] = malloc(nb);
            memcpy(res[t][i], ts_tensor_data_f32(outs[i]), nb);
        }
        ts_tensor_release(o);
        ts_tensor_release(o2);
        ts_tensor_release(s);
    }
    ts_set_num_threads(before);
    int64_t counts[4] = {8 * 32 * 16 * 16, 8 * 3 * 16 * 16, 32 * 27, 32};
    for (int i = 0; i < 4; i++) {
        double m = 0, scale = 0;
        for (int64_t j = 0; j < counts[i]; j++) {
            m = fmax(m, fabs((double)res[0][i][j] - res[1][i][j]));
            scale = fmax(scale, fabs((double)res[0][i][j]));
        }
        CHECK(m <= 1e-5 * (1 + scale));
        free(res[0][i]);
        free(res[1][i]);
    }
    ts_tensor_release(x);
    ts_tensor_release(w);
    ts_tensor_release(b);
}

static void test_conv2d_errors(void) {
    ts_rng r;
    ts_rng_seed(&r, 13);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){2, 3, 5, 5}, -1, 1, false);
    ts_tensor *w4 = tu_rand(&r, 4, (int64_t[]){8, 4, 3, 3}, -1, 1, false);
    ts_tensor *w3 = tu_rand(&r, 4, (int64_t[]){8, 3, 3, 3}, -1, 1, false);
    ts_tensor *w7 = tu_rand(&r, 4, (int64_t[]){8, 3, 7, 3}, -1, 1, false);
    ts_tensor *w2 = tu_rand(&r, 4, (int64_t[]){6, 1, 3, 3}, -1, 1, false);
    ts_tensor *b5 = tu_rand(&r, 1, (int64_t[]){5}, -1, 1, false);
    ts_tensor *o = NULL;
    /* wrong channel count */
    CHECK_STATUS(ts_conv2d(x, w4, NULL, TS_CONV2D_DEFAULT, &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("conv2d");
    CHECK_ERR_MENTIONS("[2, 3, 5, 5]");
    CHECK_ERR_MENTIONS("[8, 4, 3, 3]");
    /* groups 2 does not divide 3 input channels */
    CHECK_STATUS(ts_conv2d(x, w2, NULL, ((ts_conv2d_params){{1, 1}, {0, 0}, {1, 1}, 2}), &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("conv2d");
    CHECK_ERR_MENTIONS("groups 2");
    CHECK_ERR_MENTIONS("[2, 3, 5, 5]");
    /* kernel 7 > 5 + 2*0; with padding 1 it fits */
    CHECK_STATUS(ts_conv2d(x, w7, NULL, TS_CONV2D_DEFAULT, &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("conv2d");
    CHECK_ERR_MENTIONS("[8, 3, 7, 3]");
    CHECK_ERR_MENTIONS("[2, 3, 5, 5]");
    CHECK_OK(ts_conv2d(x, w7, NULL, ((ts_conv2d_params){{1, 1}, {1, 1}, {1, 1}, 1}), &o));
    ts_tensor_release(o);
    /* dilation makes the kernel larger than the input */
    CHECK_STATUS(ts_conv2d(x, w3, NULL, ((ts_conv2d_params){{1, 1}, {0, 0}, {3, 1}, 1}), &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("conv2d");
    /* bias of the wrong length */
    CHECK_STATUS(ts_conv2d(x, w3, b5, TS_CONV2D_DEFAULT, &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("bias [5]");
    /* bad parameters and ranks */
    CHECK_STATUS(ts_conv2d(x, w3, NULL, ((ts_conv2d_params){{0, 1}, {0, 0}, {1, 1}, 1}), &o), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_conv2d(x, w3, NULL, ((ts_conv2d_params){{1, 1}, {0, 0}, {1, 1}, 0}), &o), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_conv2d(b5, w3, NULL, TS_CONV2D_DEFAULT, &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("conv2d");
    ts_tensor *objs[] = {x, w4, w3, w7, w2, b5};
    for (size_t i = 0; i < LEN(objs); i++) ts_tensor_release(objs[i]);
}

/* ---- pooling -------------------------------------------------------------------------------------- */
/* noipa: GCC 12.2 at -O2 and above with AVX-512VL (-march=native here) miscompiles a by-value
 * struct built from the constants {2, 2, 2, 2, 0, 0, 0, 0} (its SLP vectoriser broadcasts the 2),
 * so the parameters must not be constant-folded into the callers. */
__attribute__((noipa)) static ts_pool2d_params pool(int k0, int k1, int s0, int s1, int p0, int p1, int d0, int d1,
                                                    bool ceil_mode) {
    return (ts_pool2d_params){{k0, k1}, {s0, s1}, {p0, p1}, {d0, d1}, ceil_mode, false};
}

static ts_status f_maxpool(ts_tensor **in, void *ctx, ts_tensor **out) {
    return ts_maxpool2d(in[0], *(ts_pool2d_params *)ctx, out);
}
static ts_status f_avgpool(ts_tensor **in, void *ctx, ts_tensor **out) {
    return ts_avgpool2d(in[0], *(ts_pool2d_params *)ctx, out);
}
static ts_status f_global(ts_tensor **in, void *ctx, ts_tensor **out) { return ts_global_avgpool2d(in[0], out); }

static void test_maxpool_values(void) {
    ts_tensor *x4 = arange4(1, 1, 4, 4), *x5 = arange4(1, 1, 5, 5), *x56 = arange4(1, 1, 5, 6), *o = NULL;
    CHECK_OK(ts_maxpool2d(x4, pool(2, 2, 0, 0, 0, 0, 0, 0, false), &o)); /* stride 0 = kernel */
    check_values(o, 4, (int64_t[]){1, 1, 2, 2}, (float[]){5, 7, 13, 15}, 0);
    ts_tensor_release(o);
    /* ceil_mode keeps the partial windows on the right and bottom */
    CHECK_OK(ts_maxpool2d(x5, pool(2, 2, 2, 2, 0, 0, 1, 1, true), &o));
    check_values(o, 4, (int64_t[]){1, 1, 3, 3}, (float[]){6, 8, 9, 16, 18, 19, 21, 23, 24}, 0);
    ts_tensor_release(o);
    CHECK_OK(ts_maxpool2d(x5, pool(2, 2, 2, 2, 0, 0, 1, 1, false), &o));
    check_values(o, 4, (int64_t[]){1, 1, 2, 2}, (float[]){6, 8, 16, 18}, 0);
    ts_tensor_release(o);
    /* padding 1 with ceil_mode: 4 windows would fit by the division, but the last would
     * start in the right padding, so PyTorch keeps 3 */
    CHECK_OK(ts_maxpool2d(x5, pool(2, 2, 2, 2, 1, 1, 1, 1, true), &o));
    check_values(o, 4, (int64_t[]){1, 1, 3, 3}, (float[]){0, 2, 4, 10, 12, 14, 20, 22, 24}, 0);
    ts_tensor_release(o);
    /* dilation 2, stride 1, padding 1 */
    CHECK_OK(ts_maxpool2d(x5, pool(2, 2, 1, 1, 1, 1, 2, 2, false), &o));
    check_values(o, 4, (int64_t[]){1, 1, 5, 5},
                 (float[]){6, 7, 8, 9, 8, 11, 12, 13, 14, 13, 16, 17, 18, 19, 18, 21, 22, 23, 24, 23, 16, 17, 18, 19, 18},
                 0);
    ts_tensor_release(o);
    /* non-square kernel and stride with ceil_mode on 5x6 */
    CHECK_OK(ts_maxpool2d(x56, pool(3, 2, 2, 3, 1, 1, 1, 1, true), &o));
    check_values(o, 4, (int64_t[]){1, 1, 3, 3}, (float[]){6, 9, 11, 18, 21, 23, 24, 27, 29}, 0);
    ts_tensor_release(o);
    ts_tensor_release(x4);
    ts_tensor_release(x5);
    ts_tensor_release(x56);
}

static void test_avgpool_values(void) {
    ts_tensor *x4 = arange4(1, 1, 4, 4), *x5 = arange4(1, 1, 5, 5), *o = NULL;
    CHECK_OK(ts_avgpool2d(x4, pool(2, 2, 2, 2, 0, 0, 0, 0, false), &o));
    check_values(o, 4, (int64_t[]){1, 1, 2, 2}, (float[]){2.5f, 4.5f, 10.5f, 12.5f}, 1e-6);
    ts_tensor_release(o);
    /* count_include_pad: the corner window holds 0+1+4+5 and divides by 9 */
    CHECK_OK(ts_avgpool2d(x4, pool(3, 3, 2, 2, 1, 1, 0, 0, false), &o));
    check_values(o, 4, (int64_t[]){1, 1, 2, 2}, (float[]){10.0f / 9, 24.0f / 9, 51.0f / 9, 10}, 1e-5);
    ts_tensor_release(o);
    /* ceil_mode: windows past the input are clipped and divide by what is left (24 / 1) */
    CHECK_OK(ts_avgpool2d(x5, pool(2, 2, 2, 2, 0, 0, 0, 0, true), &o));
    check_values(o, 4, (int64_t[]){1, 1, 3, 3}, (float[]){3, 5, 6.5f, 13, 15, 16.5f, 20.5f, 22.5f, 24}, 1e-5);
    ts_tensor_release(o);
    /* ceil_mode with padding: clipped at H + pad, the padding still counted */
    CHECK_OK(ts_avgpool2d(x5, pool(3, 3, 2, 2, 1, 1, 0, 0, true), &o));
    check_values(o, 4, (int64_t[]){1, 1, 3, 3},
                 (float[]){12.0f / 9, 3, 24.0f / 9, 7, 12, 9, 8, 13, 84.0f / 9}, 1e-5);
    ts_tensor_release(o);
    /* global: the mean of each plane */
    ts_tensor *x2 = arange4(2, 3, 2, 2);
    CHECK_OK(ts_global_avgpool2d(x2, &o));
    check_values(o, 4, (int64_t[]){2, 3, 1, 1}, (float[]){1.5f, 5.5f, 9.5f, 13.5f, 17.5f, 21.5f}, 1e-6);
    ts_tensor_release(o);
    ts_tensor_release(x2);
    ts_tensor_release(x4);
    ts_tensor_release(x5);
}

static void test_pool_grad(void) {
    ts_rng r;
    ts_rng_seed(&r, 20);
    struct {
        const char *name;
        int64_t H, W;
        ts_pool2d_params p;
    } cases[] = {
        {"2x2", 6, 4, pool(2, 2, 0, 0, 0, 0, 0, 0, false)},
        {"2x2 odd, ceil", 5, 7, pool(2, 2, 2, 2, 0, 0, 1, 1, true)},
        {"3x3 s2 p1", 7, 6, pool(3, 3, 2, 2, 1, 1, 1, 1, false)},
        {"3x2 s(2,3) p1 ceil", 5, 6, pool(3, 2, 2, 3, 1, 1, 1, 1, true)},
        {"3x3 s1 p1 overlapping", 5, 5, pool(3, 3, 1, 1, 1, 1, 1, 1, false)},
        {"2x3 dilation 2 p1", 6, 7, pool(2, 3, 1, 2, 1, 1, 2, 2, false)},
        {"3x3 s2 p1 ceil", 6, 6, pool(3, 3, 2, 2, 1, 1, 1, 1, true)},
    };
    for (size_t c = 0; c < LEN(cases); c++) {
        ts_tensor *in[1] = {distinct4(&r, 2, 3, cases[c].H, cases[c].W)};
        CHECK(tu_gradcheck(cases[c].name, f_maxpool, in, 1, &cases[c].p, 1e-2, 1e-3, 1e-2) <= 1);
        if (cases[c].p.dilation[0] <= 1)
            CHECK(tu_gradcheck(cases[c].name, f_avgpool, in, 1, &cases[c].p, 1e-2, 1e-3, 1e-2) <= 1);
        ts_tensor_release(in[0]);
    }
    ts_tensor *in[1] = {tu_rand(&r, 4, (int64_t[]){2, 3, 3, 5}, -1, 1, true)};
    CHECK(tu_gradcheck("global_avgpool2d", f_global, in, 1, NULL, 1e-2, 1e-3, 1e-2) <= 1);
    ts_tensor_release(in[0]);

    /* max pooling sends each gradient to its window's maximum */
    ts_tensor *x = t4(1, 1, 2, 2, (float[]){1, 4, 3, 2}), *o = NULL;
    ts_tensor_set_requires_grad(x, true);
    CHECK_OK(ts_maxpool2d(x, pool(2, 2, 0, 0, 0, 0, 0, 0, false), &o));
    ts_tensor *seed = t4(1, 1, 1, 1, (float[]){7});
    CHECK_OK(ts_backward(o, seed, false));
    ts_tensor_release(seed);
    check_values(ts_tensor_grad(x), 4, (int64_t[]){1, 1, 2, 2}, (float[]){0, 7, 0, 0}, 0);
    ts_tensor_release(o);
    ts_tensor_release(x);
}

static void test_pool_errors(void) {
    ts_tensor *x = arange4(2, 3, 4, 5), *o = NULL;
    /* kernel 6 is larger than the 4 rows (with padding 1 it just fits) */
    CHECK_STATUS(ts_maxpool2d(x, pool(6, 2, 1, 1, 0, 0, 1, 1, false), &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("maxpool2d");
    CHECK_ERR_MENTIONS("[2, 3, 4, 5]");
    CHECK_STATUS(ts_avgpool2d(x, pool(2, 7, 1, 1, 0, 0, 0, 0, false), &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("avgpool2d");
    CHECK_ERR_MENTIONS("[2, 3, 4, 5]");
    CHECK_OK(ts_maxpool2d(x, pool(6, 2, 1, 1, 1, 0, 1, 1, false), &o));
    CHECK(o && ts_tensor_shape(o)[2] == 1 && ts_tensor_shape(o)[3] == 4);
    ts_tensor_release(o);
    /* dilation makes the window too large */
    CHECK_STATUS(ts_maxpool2d(x, pool(2, 2, 1, 1, 0, 0, 4, 1, false), &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("maxpool2d");
    /* padding more than half the kernel, dilation on average pooling, a bad kernel */
    CHECK_STATUS(ts_maxpool2d(x, pool(2, 2, 2, 2, 2, 0, 1, 1, false), &o), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("maxpool2d");
    CHECK_STATUS(ts_avgpool2d(x, pool(2, 2, 2, 2, 0, 0, 2, 2, false), &o), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_avgpool2d(x, pool(0, 2, 2, 2, 0, 0, 1, 1, false), &o), TS_ERR_INVALID_ARG);
    /* rank */
    ts_tensor *v = tu_tensor(1, (int64_t[]){3}, (float[]){1, 2, 3});
    CHECK_STATUS(ts_global_avgpool2d(v, &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("global_avgpool2d");
    CHECK_STATUS(ts_maxpool2d(v, pool(2, 2, 2, 2, 0, 0, 1, 1, false), &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("[3]");
    ts_tensor_release(v);
    ts_tensor_release(x);
}

/* ---- batchnorm2d ---------------------------------------------------------------------------------------- */
typedef struct {
    bool training;
    ts_tensor *rm, *rv;
} bn_ctx;

static ts_status f_bn(ts_tensor **in, void *ctx, ts_tensor **out) {
    bn_ctx *c = ctx;
    return ts_batchnorm2d(in[0], in[1], in[2], c->rm, c->rv, c->training, 0.1f, 1e-5f, out);
}

static void test_batchnorm_values(void) {
    /* x: (2, 2, 1, 2); channel 0 holds 1, 2, 3, 4 and channel 1 holds 0, 0, 2, 6 */
    ts_tensor *x = t4(2, 2, 1, 2, (float[]){1, 2, 0, 0, 3, 4, 2, 6});
    ts_tensor *w = tu_tensor(1, (int64_t[]){2}, (float[]){2, 0.5f});
    ts_tensor *b = tu_tensor(1, (int64_t[]){2}, (float[]){1, -1});
    ts_tensor *rm = tu_tensor(1, (int64_t[]){2}, (float[]){0.5f, -1});
    ts_tensor *rv = tu_tensor(1, (int64_t[]){2}, (float[]){2, 1});
    ts_tensor *o = NULL;
    const double eps = 1e-5;
    CHECK_OK(ts_batchnorm2d(x, w, b, rm, rv, true, 0.1f, (float)eps, &o));
    /* channel 0: mean 2.5, biased var 1.25, unbiased 5/3; channel 1: mean 2, biased var 6, unbiased 8 */
    double is0 = 1 / sqrt(1.25 + eps), is1 = 1 / sqrt(6 + eps);
    float want[8] = {
        (float)((1 - 2.5) * is0 * 2 + 1), (float)((2 - 2.5) * is0 * 2 + 1),
        (float)((0 - 2.0) * is1 * 0.5 - 1), (float)((0 - 2.0) * is1 * 0.5 - 1),
        (float)((3 - 2.5) * is0 * 2 + 1), (float)((4 - 2.5) * is0 * 2 + 1),
        (float)((2 - 2.0) * is1 * 0.5 - 1), (float)((6 - 2.0) * is1 * 0.5 - 1),
    };
    check_values(o, 4, (int64_t[]){2, 2, 1, 2}, want, 1e-5);
    ts_tensor_release(o);
    /* running stats: r = 0.9 r + 0.1 stat, with the unbiased variance */
    float *prm = ts_tensor_data_f32(rm), *prv = ts_tensor_data_f32(rv);
    CHECK_NEAR(prm[0], 0.9 * 0.5 + 0.1 * 2.5, 1e-6);
    CHECK_NEAR(prm[1], 0.9 * -1 + 0.1 * 2.0, 1e-6);
    CHECK_NEAR(prv[0], 0.9 * 2 + 0.1 * (5.0 / 3), 1e-6);
    CHECK_NEAR(prv[1], 0.9 * 1 + 0.1 * 8.0, 1e-6);
    /* eval uses the running stats and leaves them alone */
    float rm0 = prm[0], rm1 = prm[1], rv0 = prv[0], rv1 = prv[1];
    CHECK_OK(ts_batchnorm2d(x, w, b, rm, rv, false, 0.1f, (float)eps, &o));
    const float xs[8] = {1, 2, 0, 0, 3, 4, 2, 6};
    for (int i = 0; i < 8; i++) {
        int c = (i / 2) % 2;
        double m = c ? rm1 : rm0, v = c ? rv1 : rv0, ww = c ? 0.5 : 2, bb = c ? -1 : 1;
        want[i] = (float)((xs[i] - m) / sqrt(v + eps) * ww + bb);
    }
    check_values(o, 4, (int64_t[]){2, 2, 1, 2}, want, 1e-5);
    CHECK(prm[0] == rm0 && prv[1] == rv1);
    ts_tensor_release(o);
    /* no weight, bias or running stats: plain normalisation */
    CHECK_OK(ts_batchnorm2d(x, NULL, NULL, NULL, NULL, true, 0.1f, (float)eps, &o));
    CHECK_NEAR(ts_tensor_data_f32(o)[0], (1 - 2.5) * is0, 1e-5);
    CHECK_NEAR(ts_tensor_data_f32(o)[7], (6 - 2.0) * is1, 1e-5);
    ts_tensor_release(o);
    /* a larger batch: outputs have zero mean and unit (biased) variance per channel */
    ts_rng r;
    ts_rng_seed(&r, 30);
    ts_tensor *xl = tu_rand(&r, 4, (int64_t[]){8, 3, 7, 9}, -2, 5, false);
    CHECK_OK(ts_batchnorm2d(xl, NULL, NULL, NULL, NULL, true, 0.1f, 0.0f, &o));
    const float *p = ts_tensor_data_f32(o);
    for (int c = 0; c < 3; c++) {
        double s = 0, ss = 0;
        for (int n = 0; n < 8; n++)
            for (int i = 0; i < 63; i++) {
                double v = p[(n * 3 + c) * 63 + i];
                s += v;
                ss += v * v;
            }
        CHECK_NEAR(s / 504, 0, 1e-5);
        CHECK_NEAR(ss / 504, 1, 1e-4);
    }
    ts_tensor_release(o);
    ts_tensor *objs[] = {x, w, b, rm, rv, xl};
    for (size_t i = 0; i < LEN(objs); i++) ts_tensor_release(objs[i]);
}

static void test_batchnorm_grad(void) {
    ts_rng r;
    ts_rng_seed(&r, 31);
    int64_t shapes[][4] = {{3, 2, 3, 4}, {2, 3, 5, 1}, {1, 2, 3, 3}};
    for (size_t s = 0; s < LEN(shapes); s++) {
        int64_t C = shapes[s][1];
        ts_tensor *in[3] = {tu_rand(&r, 4, shapes[s], -2, 2, true), tu_rand(&r, 1, &C, 0.5f, 1.5f, true),
                            tu_rand(&r, 1, &C, -1, 1, true)};
        ts_tensor *rm = tu_rand(&r, 1, &C, -0.5f, 0.5f, false), *rv = tu_rand(&r, 1, &C, 0.5f, 2, false);
        bn_ctx train = {true, rm, rv}, eval = {false, rm, rv}, bare = {true, NULL, NULL};
        CHECK(tu_gradcheck("batchnorm2d train", f_bn, in, 3, &train, 1e-2, 2e-3, 2e-2) <= 1);
        CHECK(tu_gradcheck("batchnorm2d eval", f_bn, in, 3, &eval, 1e-2, 1e-3, 1e-2) <= 1);
        ts_tensor *inx[3] = {in[0], NULL, NULL}; /* no affine parameters */
        CHECK(tu_gradcheck("batchnorm2d train, no affine", f_bn, inx, 3, &bare, 1e-2, 2e-3, 2e-2) <= 1);
        for (int i = 0; i < 3; i++) ts_tensor_release(in[i]);
        ts_tensor_release(rm);
        ts_tensor_release(rv);
    }
}

static void test_batchnorm_errors(void) {
    ts_tensor *x = arange4(2, 3, 2, 2), *o = NULL;
    ts_tensor *v2 = tu_tensor(1, (int64_t[]){2}, (float[]){1, 1});
    ts_tensor *v3 = tu_tensor(1, (int64_t[]){3}, (float[]){1, 1, 1});
    ts_tensor *v3b = tu_tensor(1, (int64_t[]){3}, (float[]){1, 1, 1});
    CHECK_STATUS(ts_batchnorm2d(x, v2, NULL, NULL, NULL, true, 0.1f, 1e-5f, &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("batchnorm2d");
    CHECK_ERR_MENTIONS("weight [2]");
    CHECK_ERR_MENTIONS("[2, 3, 2, 2]");
    CHECK_STATUS(ts_batchnorm2d(x, NULL, NULL, v2, v3, true, 0.1f, 1e-5f, &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("running_mean");
    CHECK_STATUS(ts_batchnorm2d(x, NULL, NULL, NULL, NULL, false, 0.1f, 1e-5f, &o), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_batchnorm2d(x, NULL, NULL, v3, NULL, true, 0.1f, 1e-5f, &o), TS_ERR_INVALID_ARG);
    ts_tensor *x1 = arange4(1, 3, 1, 1);
    CHECK_STATUS(ts_batchnorm2d(x1, NULL, NULL, v3, v3b, true, 0.1f, 1e-5f, &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("more than 1 value per channel");
    CHECK_OK(ts_batchnorm2d(x1, NULL, NULL, v3, v3b, false, 0.1f, 1e-5f, &o)); /* fine in eval */
    ts_tensor_release(o);
    CHECK_STATUS(ts_batchnorm2d(v3, NULL, NULL, NULL, NULL, true, 0.1f, 1e-5f, &o), TS_ERR_SHAPE);
    ts_tensor *objs[] = {x, v2, v3, v3b, x1};
    for (size_t i = 0; i < LEN(objs); i++) ts_tensor_release(objs[i]);
}

/* ---- a whole conv block, and that its graph frees everything ----------------------------------------------- */
static void test_block_lifetime(void) {
    size_t before = ts_device_memory_allocated(ts_device_cpu());
    ts_rng r;
    ts_rng_seed(&r, 40);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){4, 2, 8, 8}, -1, 1, false);
    ts_tensor *w = tu_rand(&r, 4, (int64_t[]){5, 2, 3, 3}, -1, 1, true);
    ts_tensor *g = tu_rand(&r, 1, (int64_t[]){5}, 0.5f, 1.5f, true), *b = tu_rand(&r, 1, (int64_t[]){5}, -1, 1, true);
    ts_tensor *rm = NULL, *rv = NULL;
    ts_tensor_zeros(ts_device_cpu(), TS_F32, 1, (int64_t[]){5}, &rm);
    ts_tensor_full(ts_device_cpu(), 1, (int64_t[]){5}, 1.0f, &rv);
    ts_tensor *c = NULL, *n = NULL, *a = NULL, *p = NULL, *q = NULL, *s = NULL;
    CHECK_OK(ts_conv2d(x, w, NULL, ((ts_conv2d_params){{1, 1}, {1, 1}, {1, 1}, 1}), &c));
    CHECK_OK(ts_batchnorm2d(c, g, b, rm, rv, true, 0.1f, 1e-5f, &n));
    CHECK_OK(ts_relu(n, &a));
    CHECK_OK(ts_maxpool2d(a, pool(2, 2, 0, 0, 0, 0, 0, 0, false), &p));
    CHECK_OK(ts_global_avgpool2d(p, &q));
    CHECK_OK(ts_sum(q, &s));
    ts_tensor *mid[] = {c, n, a, p, q};
    for (size_t i = 0; i < LEN(mid); i++) ts_tensor_release(mid[i]);
    CHECK_OK(ts_backward(s, NULL, false));
    CHECK(ts_tensor_grad(w) != NULL && ts_tensor_grad(g) != NULL && ts_tensor_grad(b) != NULL);
    ts_tensor *objs[] = {s, x, w, g, b, rm, rv};
    for (size_t i = 0; i < LEN(objs); i++) ts_tensor_release(objs[i]);
    CHECK(ts_device_memory_allocated(ts_device_cpu()) == before);
}

/* A by-value params struct written as a constant literal reaches the op intact
 * (GCC 12 + AVX-512 miscompiled this one; CMakeLists.txt turns the SLP
 * vectoriser off for it). */
static void test_params_literal_by_value(void) {
    ts_rng r;
    ts_rng_seed(&r, 11);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){1, 1, 28, 28}, -1, 1, false), *o = NULL;
    ts_pool2d_params p = {{2, 2}, {2, 2}, {0, 0}, {0, 0}, false, false};
    CHECK_OK(ts_maxpool2d(x, p, &o));
    CHECK(o && ts_tensor_dim(o, 2) == 14 && ts_tensor_dim(o, 3) == 14);
    ts_tensor_release(o);
    ts_tensor_release(x);
}

/* Max pooling on wide planes (the vectorised path: 16 outputs at a time where windows lie inside the row,
 * the edges one by one) against the sequential rule — the max, the first position holding it, a NaN wins
 * (the last one seen) — for values with many ties and a few NaNs; the gradient lands where the rule says. */
static void test_maxpool_wide(void) {
    const int64_t N = 2, C = 3, H = 37, W = 45;
    int64_t shape[4] = {N, C, H, W};
    ts_rng r;
    ts_rng_seed(&r, 44);
    ts_tensor *x = tu_rand(&r, 4, shape, -3.0f, 3.0f, true);
    float *px = ts_tensor_data_f32(x);
    for (int64_t i = 0; i < N * C * H * W; i++) px[i] = roundf(px[i] * 2.0f) / 2.0f; /* 13 values: ties */
    px[1 * H * W + 5 * W + 20] = NAN;
    px[1 * H * W + 5 * W + 22] = NAN;
    px[4 * H * W + 30 * W + 3] = NAN;
    const ts_pool2d_params ps[] = {pool(3, 3, 2, 2, 1, 1, 1, 1, false), pool(3, 3, 1, 1, 1, 1, 1, 1, false),
                                   pool(2, 3, 1, 1, 0, 0, 1, 1, false), pool(3, 3, 2, 2, 0, 0, 1, 1, true),
                                   pool(3, 2, 2, 1, 1, 1, 1, 1, false)};
    for (size_t c = 0; c < sizeof ps / sizeof ps[0]; c++) {
        const ts_pool2d_params p = ps[c];
        ts_tensor *o = NULL, *sum = NULL;
        ts_tensor_zero_grad(x);
        CHECK_OK(ts_maxpool2d(x, p, &o));
        if (!o) continue;
        const int64_t OH = ts_tensor_dim(o, 2), OW = ts_tensor_dim(o, 3);
        const float *po = ts_tensor_data_f32(o);
        float *gref = calloc((size_t)(N * C * H * W), sizeof(float));
        int bad = 0;
        for (int64_t pl = 0; pl < N * C; pl++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    float best = -INFINITY;
                    int64_t bi = -1;
                    for (int64_t ih = oh * p.stride[0] - p.padding[0]; ih < oh * p.stride[0] - p.padding[0] + p.kernel[0]; ih++)
                        for (int64_t iw = ow * p.stride[1] - p.padding[1]; iw < ow * p.stride[1] - p.padding[1] + p.kernel[1]; iw++) {
                            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                            float v = px[pl * H * W + ih * W + iw];
                            if (bi < 0 || v > best || isnan(v)) {
                                best = v;
                                bi = ih * W + iw;
                            }
                        }
                    float got = po[(pl * OH + oh) * OW + ow];
                    bad += !(got == best || (isnan(got) && isnan(best)));
                    gref[pl * H * W + bi] += 1.0f;
                }
        CHECK_OK(ts_sum(o, &sum));
        CHECK_OK(ts_backward(sum, NULL, false));
        const float *g = ts_tensor_data_f32(ts_tensor_grad(x));
        for (int64_t i = 0; i < N * C * H * W; i++) bad += g[i] != gref[i];
        if (bad) fprintf(stderr, "  maxpool case %zu: %d mismatches\n", c, bad);
        CHECK(bad == 0);
        free(gref);
        ts_tensor_release(sum);
        ts_tensor_release(o);
    }
    ts_tensor_release(x);
}

/* NCHW <-> nChw16c (the oneDNN convolutions' layout change, ops/cpu/blocked.c) against the index formula, in both
 * element sizes, on partial channel blocks and plane tails, 1 and 2 threads: every element lands where the layout
 * says, the padding channels come out zero, and the way back restores the input. */
static void test_blocked_layout(void) {
    const int64_t dims[][3] = {{1, 1, 1}, {2, 16, 16}, {3, 20, 49}, {2, 33, 5}, {4, 32, 196}, {1, 64, 17}, {8, 40, 101}}; /* the last over PAR_MIN: threaded */
    int bad = 0;
    for (int run = 0; run < 4; run++) { /* 1 and 2 threads, AVX-512 (where cpuid has it) and portable loops */
        ts_set_num_threads(1 + run % 2);
        ts__cpu_blocked_portable(run >= 2);
        for (size_t es = 2; es <= 4; es += 2)
            for (size_t k = 0; k < LEN(dims); k++) {
                const int64_t N = dims[k][0], C = dims[k][1], HW = dims[k][2], CB = (C + 15) / 16;
                const size_t n = (size_t)(N * C * HW), nb = (size_t)(N * CB * HW * 16);
                uint8_t *a = malloc(n * es), *b = malloc(nb * es), *c = malloc(n * es);
                for (size_t i = 0; i < n * es; i++) a[i] = (uint8_t)(i * 131 + 7 + (i >> 8));
                memset(b, 0xAB, nb * es);
                memset(c, 0, n * es);
                ts__cpu_to_blocked16(a, b, N, C, HW, es);
                for (int64_t nn = 0; nn < N; nn++)
                    for (int64_t ch = 0; ch < CB * 16; ch++)
                        for (int64_t p = 0; p < HW; p++) {
                            const uint8_t *got = b + (size_t)(((nn * CB + ch / 16) * HW + p) * 16 + ch % 16) * es;
                            for (size_t e = 0; e < es; e++)
                                bad += got[e] != (ch < C ? a[(size_t)((nn * C + ch) * HW + p) * es + e] : 0);
                        }
                ts__cpu_from_blocked16(b, c, N, C, HW, es);
                bad += memcmp(a, c, n * es) != 0;
                free(a), free(b), free(c);
            }
    }
    ts_set_num_threads(0);
    ts__cpu_blocked_portable(false);
    CHECK(bad == 0);
}

/* Weights OIhw <-> oneDNN's four blocked layouts (ops/cpu/blocked.c) against the index formulas: partial blocks of
 * both channel kinds zero-padded, bfloat16 ones rounded as ts__bf16_from_f32 (ties, a NaN), float32 ones back. */
static void test_blocked_weights(void) {
    const int64_t dims[][3] = {{16, 16, 9}, {20, 3, 1}, {33, 40, 9}, {64, 32, 25}, {1, 17, 4}, {128, 64, 9}};
    const ts_wblock kinds[] = {TS_WB_16I16O, TS_WB_16O16I, TS_WB_8I16O2I, TS_WB_8O16I2O};
    int bad = 0;
    for (int run = 0; run < 4; run++) { /* 1 and 2 threads, AVX-512 (where cpuid has it) and portable loops */
        ts_set_num_threads(1 + run % 2);
        ts__cpu_blocked_portable(run >= 2);
        for (size_t k = 0; k < LEN(dims); k++)
            for (size_t q = 0; q < LEN(kinds); q++) {
                const int64_t O = dims[k][0], I = dims[k][1], KK = dims[k][2], OB = (O + 15) / 16, IB = (I + 15) / 16;
                const ts_wblock kind = kinds[q];
                const bool h = kind == TS_WB_8I16O2I || kind == TS_WB_8O16I2O;
                const size_t n = (size_t)(O * I * KK), nb = (size_t)(OB * IB * KK * 256);
                float *w = malloc(n * sizeof(float)), *back = calloc(n, sizeof(float));
                uint8_t *b = malloc(nb * 4);
                for (size_t i = 0; i < n; i++) {
                    uint32_t u = (uint32_t)(i * 2654435761u) ^ 0x3f000000u;
                    if (i % 7 == 3) u = (u & 0xffff0000u) | 0x8000u; /* a tie */
                    memcpy(&w[i], &u, 4);
                }
                w[n / 2] = NAN;
                memset(b, 0xAB, nb * 4);
                ts__cpu_weights_to_blocked(w, b, O, I, KK, kind);
                for (int64_t t = 0; t < OB * IB * KK; t++)
                    for (int o = 0; o < 16; o++)
                        for (int i = 0; i < 16; i++) {
                            const int64_t A = t / (IB * KK), B = t / KK % IB, cd = t % KK, oo = A * 16 + o, ii = B * 16 + i;
                            const size_t at = kind == TS_WB_16I16O   ? (size_t)(i * 16 + o)
                                              : kind == TS_WB_16O16I ? (size_t)(o * 16 + i)
                                              : kind == TS_WB_8I16O2I ? (size_t)((i / 2) * 32 + o * 2 + i % 2)
                                                                      : (size_t)((o / 2) * 32 + i * 2 + o % 2);
                            const float v = oo < O && ii < I ? w[(oo * I + ii) * KK + cd] : 0.0f;
                            if (h) {
                                uint16_t got;
                                memcpy(&got, b + ((size_t)t * 256 + at) * 2, 2);
                                bad += got != ts__bf16_from_f32(v);
                            } else {
                                float got;
                                memcpy(&got, b + ((size_t)t * 256 + at) * 4, 4);
                                bad += memcmp(&got, &v, 4) != 0;
                            }
                        }
                if (!h) {
                    ts__cpu_weights_from_blocked((const float *)b, back, O, I, KK, kind);
                    bad += memcmp(w, back, n * sizeof(float)) != 0;
                }
                if (bad) fprintf(stderr, "  weights %lldx%lldx%lld kind %d: %d wrong\n", (long long)O, (long long)I,
                                 (long long)KK, (int)kind, bad);
                free(w), free(back), free(b);
            }
    }
    ts_set_num_threads(0);
    ts__cpu_blocked_portable(false);
    CHECK(bad == 0);
}

TU_MAIN(T(test_params_literal_by_value), T(test_blocked_layout), T(test_blocked_weights), T(test_conv2d_values), T(test_conv2d_grad), T(test_conv2d_threads_agree), T(test_conv2d_errors),
        T(test_maxpool_values), T(test_maxpool_wide), T(test_avgpool_values), T(test_pool_grad), T(test_pool_errors),
        T(test_batchnorm_values), T(test_batchnorm_grad), T(test_batchnorm_errors), T(test_block_lifetime))
