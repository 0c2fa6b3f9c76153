/*
 * tests/test_precision.c — 16-bit floats and loss scaling against PyTorch
 * (tests/golden/precision.tsg.gz, scripts/gen_precision_golden.py):
 * float32 -> bfloat16 / float16 rounding bit for bit (ties, subnormals,
 * overflow, NaN), every 16-bit pattern back to float32 and round again,
 * ts_to_dtype's values and gradients, 16-bit tensors in checkpoints, and the
 * grad scaler's scale and skipped steps step by step as torch.amp.GradScaler;
 * bfloat16 matmul precision (the autocast of --precision bf16): matmul, linear and
 * conv2d products from rounded operands with float32 sums, forward and backward,
 * every other op bit-identical to float32, and a small CNN's two SGD steps under
 * it no further from the float32 result than PyTorch's own bfloat16 autocast step;
 * autocast's bfloat16 kernels against the float32 ones. Those autocast tests run on
 * TS_TEST_DEVICE (cuda:0 on a GPU machine, cpu:1 for a virtual device; the CPU by
 * default), the rest on the CPU, with the CPU plane kernels' sums (BatchNorm's) bit
 * for bit in their fixed order for float32 and bfloat16 planes.
 */
#include "test_util.h"
#include "golden_io.h"
#include "ops/cpu/plane.h"

#include <math.h>

#define GOLDEN TS_TEST_DIR "/golden/precision.tsg.gz"

static ts_tensor_list golden;

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static bool is_nan16(uint16_t h, bool bf16) {
    return bf16 ? (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) : (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
}

static void test_convert_golden(void) {
    ts_tensor *x = tg_get(&golden, "convert/x"), *gb = tg_get(&golden, "convert/bf16"), *gh = tg_get(&golden, "convert/f16");
    CHECK(x && gb && gh);
    if (!x || !gb || !gh) return;
    const float *px = ts_tensor_data_f32(x);
    const int32_t *pb = ts_tensor_data(gb), *ph = ts_tensor_data(gh);
    int64_t n = ts_tensor_numel(x), bad_b = 0, bad_h = 0, nans = 0;
    for (int64_t i = 0; i < n; i++) {
        uint16_t b = ts_f32_to_bf16(px[i]), h = ts_f32_to_f16(px[i]);
        if (isnan(px[i])) { /* torch writes 0x7fc0 (scalar) or 0xffff (vectorised): only NaN-ness is defined */
            nans++;
            bad_b += !is_nan16(b, true) || !is_nan16((uint16_t)pb[i], true);
            bad_h += !is_nan16(h, false) || !is_nan16((uint16_t)ph[i], false);
            continue;
        }
        if (b != (uint16_t)pb[i] && bad_b++ < 5)
            fprintf(stderr, "  bf16(%.9g = 0x%08x): 0x%04x, torch 0x%04x\n", (double)px[i], f32_bits(px[i]), b, pb[i]);
        if (h != (uint16_t)ph[i] && bad_h++ < 5)
            fprintf(stderr, "  f16(%.9g = 0x%08x): 0x%04x, torch 0x%04x\n", (double)px[i], f32_bits(px[i]), h, ph[i]);
    }
    fprintf(stderr, "  %lld values (%lld NaN): %lld bfloat16 and %lld float16 differ from torch\n", (long long)n,
            (long long)nans, (long long)bad_b, (long long)bad_h);
    CHECK(n > 4000 && nans >= 4);
    CHECK(bad_b == 0 && bad_h == 0);
    /* the bulk conversion is the same rounding */
    uint16_t *hb = malloc(2 * (size_t)n), *hh = malloc(2 * (size_t)n);
    CHECK_OK(ts_convert(hb, TS_BF16, px, TS_F32, (size_t)n));
    CHECK_OK(ts_convert(hh, TS_F16, px, TS_F32, (size_t)n));
    int64_t diff = 0;
    for (int64_t i = 0; i < n; i++) diff += !isnan(px[i]) && (hb[i] != (uint16_t)pb[i] || hh[i] != (uint16_t)ph[i]);
    CHECK(diff == 0);
    free(hb);
    free(hh);
}

/* Every 16-bit pattern: to float32 is exact (checked against ldexp), and back gives the same bits. */
static void test_every_pattern(void) {
    int64_t bad = 0;
    for (uint32_t u = 0; u < 65536; u++) {
        uint16_t h = (uint16_t)u;
        float b = ts_bf16_to_f32(h), f = ts_f16_to_f32(h);
        /* bfloat16 */
        if (is_nan16(h, true))
            bad += !isnan(b) || !is_nan16(ts_f32_to_bf16(b), true);
        else
            bad += ts_f32_to_bf16(b) != h;
        /* float16: value from its fields */
        int e = (h >> 10) & 31, m = h & 1023;
        double want = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
        if (h & 0x8000) want = -want;
        if (is_nan16(h, false))
            bad += !isnan(f) || !is_nan16(ts_f32_to_f16(f), false);
        else
            bad += (double)f != want || ts_f32_to_f16(f) != h;
    }
    CHECK(bad == 0);
    /* float16 <-> bfloat16 through float32 */
    uint16_t one_h = 0x3c00, one_b = 0;
    CHECK_OK(ts_convert(&one_b, TS_BF16, &one_h, TS_F16, 1));
    CHECK(one_b == 0x3f80);
    CHECK_STATUS(ts_convert(&one_b, TS_I32, &one_h, TS_F16, 1), TS_ERR_DTYPE);
    ts_dtype dt;
    CHECK_OK(ts_dtype_parse("bf16", &dt));
    CHECK(dt == TS_BF16);
    CHECK_OK(ts_dtype_parse("FP16", &dt));
    CHECK(dt == TS_F16);
    CHECK_STATUS(ts_dtype_parse("float8", &dt), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("'float8'");
}

/* ts_to_dtype: values rounded as the scalar functions, gradients back in the input's dtype. */
static void test_to_dtype_op(void) {
    ts_rng r;
    ts_rng_seed(&r, 3);
    int64_t shape[2] = {37, 129};
    ts_tensor *x = tu_rand(&r, 2, shape, -300.0f, 300.0f, true), *b = NULL, *h = NULL, *back = NULL, *s = NULL;
    CHECK_OK(ts_to_dtype(x, TS_BF16, &b));
    CHECK_OK(ts_to_dtype(b, TS_F16, &h));
    CHECK_OK(ts_to_dtype(h, TS_F32, &back));
    CHECK(ts_tensor_dtype(b) == TS_BF16 && ts_tensor_dtype(h) == TS_F16 && ts_tensor_dtype(back) == TS_F32);
    const float *px = ts_tensor_data_f32(x), *pback = ts_tensor_data_f32(back);
    const uint16_t *pb = ts_tensor_data(b);
    int64_t bad = 0;
    for (int64_t i = 0; i < ts_tensor_numel(x); i++) {
        uint16_t want = ts_f32_to_bf16(px[i]);
        bad += pb[i] != want || pback[i] != ts_f16_to_f32(ts_f32_to_f16(ts_bf16_to_f32(want)));
    }
    CHECK(bad == 0);
    CHECK(ts_tensor_item(b, 5) == ts_bf16_to_f32(pb[5]));
    /* d/dx sum(3 * to_f32(to_f16(to_bf16(x)))) = 3 (the casts pass gradients through) */
    ts_tensor *t3 = NULL;
    CHECK_OK(ts_scale(back, 3.0f, &t3));
    CHECK_OK(ts_sum(t3, &s));
    CHECK_OK(ts_backward(s, NULL, false));
    ts_tensor *g = ts_tensor_grad(x);
    CHECK(g && ts_tensor_dtype(g) == TS_F32);
    bool threes = g != NULL;
    for (int64_t i = 0; g && i < ts_tensor_numel(g); i++) threes &= ts_tensor_data_f32(g)[i] == 3.0f;
    CHECK(threes);
    /* the same dtype is the same tensor; integers are refused, naming both */
    ts_tensor *same = NULL, *bad_out = NULL, *idx = NULL;
    CHECK_OK(ts_to_dtype(x, TS_F32, &same));
    CHECK(same == x);
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_I64, 1, shape, &idx));
    CHECK_STATUS(ts_to_dtype(idx, TS_BF16, &bad_out), TS_ERR_DTYPE);
    CHECK_ERR_MENTIONS("int64 to bfloat16");
    ts_tensor_release(same);
    ts_tensor_release(idx);
    ts_tensor_release(t3);
    ts_tensor_release(s);
    ts_tensor_release(back);
    ts_tensor_release(h);
    ts_tensor_release(b);
    ts_tensor_release(x);
}

/* Ops on 16-bit tensors compute in float32 and round the result (PyTorch's CPU rule): each result equals
 * the float32 op on the widened inputs, rounded; mixed dtypes give float32; gradients come back in each
 * input's dtype. */
static void test_half_ops(void) {
    ts_rng r;
    ts_rng_seed(&r, 12);
    int64_t sh[2] = {7, 33};
    ts_tensor *a32 = tu_rand(&r, 2, sh, -4.0f, 4.0f, false), *b32 = tu_rand(&r, 2, sh, 0.5f, 4.0f, false);
    for (int k = 0; k < 2; k++) {
        ts_dtype dt = k ? TS_F16 : TS_BF16;
        ts_tensor *a = NULL, *b = NULL, *fa = NULL, *fb = NULL;
        CHECK_OK(ts_to_dtype(a32, dt, &a));
        CHECK_OK(ts_to_dtype(b32, dt, &b));
        ts_tensor_set_requires_grad(a, true);
        CHECK_OK(ts_to_dtype(a, TS_F32, &fa));
        CHECK_OK(ts_to_dtype(b, TS_F32, &fb));
        ts_tensor *h[6] = {NULL}, *f[6] = {NULL};
        CHECK_OK(ts_div(a, b, &h[0]));
        CHECK_OK(ts_div(fa, fb, &f[0]));
        CHECK_OK(ts_gelu(a, false, &h[1]));
        CHECK_OK(ts_gelu(fa, false, &f[1]));
        CHECK_OK(ts_softmax(a, 1, &h[2]));
        CHECK_OK(ts_softmax(fa, 1, &f[2]));
        CHECK_OK(ts_sum(a, &h[3]));
        CHECK_OK(ts_sum(fa, &f[3]));
        CHECK_STATUS(ts_matmul(a, b, &h[4]), TS_ERR_SHAPE); /* (7, 33) @ (7, 33), checked after the widening */
        CHECK_ERR_MENTIONS("matmul");
        ts_tensor *bt = NULL;
        CHECK_OK(ts_transpose(b, 0, 1, &bt));
        CHECK_OK(ts_matmul(a, bt, &h[4]));
        ts_tensor *fbt = NULL;
        CHECK_OK(ts_transpose(fb, 0, 1, &fbt));
        CHECK_OK(ts_matmul(fa, fbt, &f[4]));
        CHECK_OK(ts_mul(a, b32, &h[5])); /* mixed: float32 */
        CHECK_OK(ts_mul(fa, b32, &f[5]));
        int bad = 0;
        for (int i = 0; i < 6; i++) {
            ts_dtype want = i == 5 ? TS_F32 : dt;
            if (ts_tensor_dtype(h[i]) != want) {
                bad++;
                continue;
            }
            ts_tensor *ref = NULL;
            CHECK_OK(ts_to_dtype(f[i], want, &ref));
            for (int64_t j = 0; j < ts_tensor_numel(ref); j++)
                bad += ts_tensor_item(ref, j) != ts_tensor_item(h[i], j);
            ts_tensor_release(ref);
        }
        CHECK(bad == 0);
        /* backward through the 16-bit sum: d sum(a) / da = 1, in a's dtype */
        CHECK_OK(ts_backward(h[3], NULL, false));
        ts_tensor *g = ts_tensor_grad(a);
        CHECK(g && ts_tensor_dtype(g) == dt && ts_tensor_item(g, 5) == 1.0);
        for (int i = 0; i < 6; i++) {
            ts_tensor_release(h[i]);
            ts_tensor_release(f[i]);
        }
        ts_tensor_release(bt);
        ts_tensor_release(fbt);
        ts_tensor_release(a);
        ts_tensor_release(b);
        ts_tensor_release(fa);
        ts_tensor_release(fb);
    }
    ts_tensor_release(a32);
    ts_tensor_release(b32);
}

/* bfloat16 and float16 tensors go through a checkpoint bit for bit. */
static void test_checkpoint_16bit(void) {
    ts_rng r;
    ts_rng_seed(&r, 4);
    int64_t shape[1] = {1000};
    ts_tensor *x = tu_rand(&r, 1, shape, -2.0f, 2.0f, false), *b = NULL, *h = NULL;
    CHECK_OK(ts_to_dtype(x, TS_BF16, &b));
    CHECK_OK(ts_to_dtype(x, TS_F16, &h));
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_tensor_list_append(&l, "b", b));
    CHECK_OK(ts_tensor_list_append(&l, "h", h));
    ts_ckpt *ck = ts_ckpt_new(), *in = NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/half.ckpt", tu_tmpdir());
    CHECK_OK(ts_ckpt_add_tensors(ck, "", &l));
    CHECK_OK(ts_ckpt_save(ck, path));
    CHECK_OK(ts_ckpt_load(path, &in));
    ts_tensor *b2 = in ? ts_ckpt_find_tensor(in, "b") : NULL, *h2 = in ? ts_ckpt_find_tensor(in, "h") : NULL;
    CHECK(b2 && h2 && ts_tensor_dtype(b2) == TS_BF16 && ts_tensor_dtype(h2) == TS_F16);
    if (b2 && h2) {
        CHECK(memcmp(ts_tensor_data(b2), ts_tensor_data(b), 2000) == 0);
        CHECK(memcmp(ts_tensor_data(h2), ts_tensor_data(h), 2000) == 0);
    }
    ts_ckpt_free(ck);
    ts_ckpt_free(in);
    ts_tensor_list_clear(&l);
    ts_tensor_release(x);
    ts_tensor_release(b);
    ts_tensor_release(h);
}

/* Each golden scaler run: step s's gradient of the scaled loss sum(p + 1) is `scale` everywhere, with
 * element 1 made NaN (even s) or inf (odd s) where found_inf says so; unscale, step unless found,
 * update. The scale after every update equals torch's bit for bit, and so do the skipped steps. */
static void test_grad_scaler_golden(void) {
    for (int k = 0;; k++) {
        ts_tensor *cfg = tg_getf(&golden, "scaler%d/config", k), *found = tg_getf(&golden, "scaler%d/found_inf", k),
                  *scale = tg_getf(&golden, "scaler%d/scale", k), *stepped = tg_getf(&golden, "scaler%d/stepped", k);
        if (!cfg) {
            CHECK(k == 4);
            break;
        }
        CHECK(found && scale && stepped);
        if (!found || !scale || !stepped) return;
        const float *c = ts_tensor_data_f32(cfg);
        ts_grad_scaler gs = TS_GRAD_SCALER_INIT;
        gs.scale = c[0];
        ts_tensor *fac = tg_getf(&golden, "scaler%d/factors", k);
        CHECK(fac != NULL);
        gs.growth_factor = fac ? (double)tg_int(fac, 0) / 1000.0 : c[1];
        gs.backoff_factor = fac ? (double)tg_int(fac, 1) / 1000.0 : c[2];
        gs.growth_interval = (int64_t)c[3];
        int64_t three = 3, bad = 0;
        ts_tensor *p = NULL;
        CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_F32, 1, &three, &p));
        ts_tensor_set_requires_grad(p, true);
        ts_tensor_list l = TS_TENSOR_LIST_INIT;
        CHECK_OK(ts_tensor_list_append(&l, "p", p));
        for (int64_t s = 0; s < ts_tensor_numel(found); s++) {
            float g[3] = {gs.scale, gs.scale, gs.scale};
            if (((const int32_t *)ts_tensor_data(found))[s]) g[1] = s % 2 ? INFINITY : NAN;
            ts_tensor *gt = tu_tensor(1, &three, g);
            ts_tensor_set_grad(p, gt);
            ts_tensor_release(gt);
            bool inf = false;
            CHECK_OK(ts_grad_scaler_unscale(&gs, &l, &inf));
            ts_grad_scaler_update(&gs, inf);
            bad += (int)inf != ((const int32_t *)ts_tensor_data(found))[s];
            bad += (int)!inf != ((const int32_t *)ts_tensor_data(stepped))[s];
            bad += gs.scale != ts_tensor_data_f32(scale)[s];
            if (!inf) /* unscaled: x the float32 reciprocal (1 exactly for powers of two) */
                bad += ts_tensor_data_f32(ts_tensor_grad(p))[0] != g[0] * (1.0f / g[0]);
        }
        fprintf(stderr, "  scaler case %d: %lld steps, final scale %g (torch %g)\n", k, (long long)ts_tensor_numel(found),
                (double)gs.scale, (double)ts_tensor_data_f32(scale)[ts_tensor_numel(scale) - 1]);
        CHECK(bad == 0);
        ts_tensor_list_clear(&l);
        ts_tensor_release(p);
    }
}

/* The values of t rounded to bfloat16, as a new float32 tensor. */
static ts_tensor *rounded(const ts_tensor *t) {
    ts_tensor *b = NULL, *f = NULL;
    CHECK_OK(ts_to_dtype(t, TS_BF16, &b));
    CHECK_OK(ts_to_dtype(b, TS_F32, &f));
    ts_tensor_release(b);
    ts_tensor *d = NULL;
    CHECK_OK(ts_tensor_detach(f, &d));
    ts_tensor_release(f);
    return d;
}

/* Where the autocast tests run: TS_TEST_DEVICE (test_util.h; the CPU when unset), e.g. cuda:0 to check the
 * GPU's bfloat16 kernels against its own float32 ones, or cpu:1 (a virtual CPU device). */
static ts_device *dev;

/* t (a CPU tensor made by the test) as a leaf on dev, requires_grad kept; t is released */
static ts_tensor *on_dev(ts_tensor *t) {
    ts_tensor *o = tg_on_device(t, dev);
    ts_tensor_set_requires_grad(o, ts_tensor_requires_grad(t));
    ts_tensor_release(t);
    return o;
}

/* A CPU copy of t (t itself, retained, when it is on the CPU) */
static ts_tensor *host(const ts_tensor *t) { return tg_on_device((ts_tensor *)t, ts_device_cpu()); }

static double max_rel(const ts_tensor *ta, const ts_tensor *tb) {
    ts_tensor *a = host(ta), *b = host(tb);
    double w = 0, m = 0;
    for (int64_t i = 0; i < ts_tensor_numel(a); i++) {
        w = fmax(w, fabs((double)ts_tensor_data_f32(a)[i] - (double)ts_tensor_data_f32(b)[i]));
        m = fmax(m, fabs((double)ts_tensor_data_f32(b)[i]));
    }
    ts_tensor_release(a);
    ts_tensor_release(b);
    return w / (m > 0 ? m : 1);
}

/* f(x, w) -> y with gradients for x and w given gy: under bfloat16 precision equals the float32 op on
 * bfloat16-rounded operands (the backward products round gy and the saved operand as well) to float32
 * summation order, and differs from the float32 op by bfloat16's rounding. */
typedef ts_status (*binop_fn)(const ts_tensor *x, const ts_tensor *w, ts_tensor **y);
static ts_status do_linear(const ts_tensor *x, const ts_tensor *w, ts_tensor **y) { return ts_linear(x, w, NULL, y); }
static ts_status do_conv(const ts_tensor *x, const ts_tensor *w, ts_tensor **y) {
    ts_conv2d_params p = TS_CONV2D_DEFAULT;
    p.padding[0] = p.padding[1] = 1;
    return ts_conv2d(x, w, NULL, p, y);
}
static ts_status do_conv_s2(const ts_tensor *x, const ts_tensor *w, ts_tensor **y) {
    ts_conv2d_params p = TS_CONV2D_DEFAULT;
    p.stride[0] = p.stride[1] = 2;
    return ts_conv2d(x, w, NULL, p, y);
}

/* y, gx, gw of f under the current precision; gy fixed. */
static void run_op(binop_fn f, ts_tensor *x, ts_tensor *w, const ts_tensor *gy, ts_tensor **y, ts_tensor **gx,
                   ts_tensor **gw) {
    ts_tensor_zero_grad(x);
    ts_tensor_zero_grad(w);
    ts_tensor *out = NULL;
    CHECK_OK(f(x, w, &out));
    CHECK_OK(ts_backward(out, (ts_tensor *)gy, false));
    CHECK_OK(ts_tensor_detach(out, y));
    *gx = ts_tensor_retain(ts_tensor_grad(x));
    *gw = ts_tensor_retain(ts_tensor_grad(w));
    ts_tensor_release(out);
}

static void check_placement(const char *name, binop_fn f, int xnd, const int64_t *xs, int wnd, const int64_t *ws) {
    ts_rng r;
    ts_rng_seed(&r, 9);
    ts_tensor *x = tu_rand(&r, xnd, xs, -1.0f, 1.0f, true), *w = tu_rand(&r, wnd, ws, -1.0f, 1.0f, true);
    ts_tensor *probe = NULL;
    CHECK_OK(f(x, w, &probe));
    ts_tensor *gy = tu_rand(&r, ts_tensor_ndim(probe), ts_tensor_shape(probe), -1.0f, 1.0f, false);
    ts_tensor_release(probe);
    ts_tensor *y32, *gx32, *gw32, *yb, *gxb, *gwb, *yr, *gxr, *gwr;
    run_op(f, x, w, gy, &y32, &gx32, &gw32);
    CHECK_OK(ts_set_matmul_precision(TS_BF16));
    run_op(f, x, w, gy, &yb, &gxb, &gwb);
    CHECK_OK(ts_set_matmul_precision(TS_F32));
    /* the reference: float32 products of the rounded operands; each gradient from its own rounded pair */
    ts_tensor *xr = rounded(x), *wr = rounded(w), *gyr = rounded(gy);
    ts_tensor_set_requires_grad(xr, true);
    ts_tensor_set_requires_grad(wr, true);
    run_op(f, xr, wr, gyr, &yr, &gxr, &gwr);
    double ey = max_rel(yb, yr), egx = max_rel(gxb, gxr), egw = max_rel(gwb, gwr), d32 = max_rel(yb, y32);
    fprintf(stderr, "  %s under bf16: y %.2g, gx %.2g, gw %.2g from the rounded-operand reference; y %.2g from float32\n",
            name, ey, egx, egw, d32);
    CHECK(ey <= 2e-6 && egx <= 2e-6 && egw <= 2e-6);
    CHECK(d32 > 1e-4 && d32 < 2e-2); /* bfloat16 rounding, not noise and not garbage */
    CHECK(ts_tensor_dtype(yb) == TS_F32 && ts_tensor_dtype(gwb) == TS_F32);
    ts_tensor *all[] = {x, w, gy, y32, gx32, gw32, yb, gxb, gwb, yr, gxr, gwr, xr, wr, gyr};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ts_tensor_release(all[i]);
}

static void test_matmul_precision(void) {
    int64_t lx[2] = {37, 300}, lw[2] = {45, 300};
    check_placement("linear", do_linear, 2, lx, 2, lw);
    int64_t cx[4] = {4, 24, 10, 10}, cw[4] = {32, 24, 3, 3};
    check_placement("conv2d 3x3", do_conv, 4, cx, 4, cw);
    int64_t sx[4] = {3, 16, 11, 11}, sw[4] = {20, 16, 3, 3};
    check_placement("conv2d 3x3 stride 2", do_conv_s2, 4, sx, 4, sw);
    /* other ops are float32 whatever the setting: softmax, cross-entropy, batchnorm bit for bit */
    ts_rng r;
    ts_rng_seed(&r, 10);
    int64_t s4[4] = {4, 6, 5, 5}, tshape[1] = {4};
    ts_tensor *x = tu_rand(&r, 4, s4, -3.0f, 3.0f, false), *t = NULL, *o[2][3];
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_I64, 1, tshape, &t));
    for (int k = 0; k < 2; k++) {
        CHECK_OK(ts_set_matmul_precision(k ? TS_BF16 : TS_F32));
        ts_tensor *flat = NULL;
        CHECK_OK(ts_softmax(x, 1, &o[k][0]));
        CHECK_OK(ts_batchnorm2d(x, NULL, NULL, NULL, NULL, true, 0.1f, 1e-5f, &o[k][1]));
        CHECK_OK(ts_flatten(x, 1, &flat));
        CHECK_OK(ts_cross_entropy(flat, t, 0.0f, &o[k][2]));
        ts_tensor_release(flat);
    }
    CHECK_OK(ts_set_matmul_precision(TS_F32));
    for (int i = 0; i < 3; i++) {
        CHECK(memcmp(ts_tensor_data(o[0][i]), ts_tensor_data(o[1][i]), ts_tensor_nbytes(o[0][i])) == 0);
        ts_tensor_release(o[0][i]);
        ts_tensor_release(o[1][i]);
    }
    ts_tensor_release(x);
    ts_tensor_release(t);
    /* float16 precision (fp16 training): operands rounded to float16, products exact in float32 */
    CHECK_OK(ts_set_matmul_precision(TS_F16));
    ts_tensor *a = NULL, *b = NULL, *c = NULL;
    float av[2] = {1.0f + 0x1p-11f + 0x1p-20f, 3.0f}, bv[2] = {1.0f, 1.0f + 0x1p-11f}; /* f16 rounds these */
    CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_F32, 2, (int64_t[]){1, 2}, av, &a));
    CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_F32, 2, (int64_t[]){2, 1}, bv, &b));
    CHECK_OK(ts_matmul(a, b, &c));
    /* 1 + 2^-11 + 2^-20 -> 1 + 2^-10 (f16: 10 mantissa bits, the tie above it), 1 + 2^-11 -> 1 (tie to even) */
    if (c) CHECK(ts_tensor_item(c, 0) == (1.0f + 0x1p-10f) * 1.0f + 3.0f * 1.0f);
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(c);
    CHECK_OK(ts_set_matmul_precision(TS_F32));
    CHECK_STATUS(ts_set_matmul_precision(TS_I32), TS_ERR_INVALID_ARG);
    CHECK(ts_get_matmul_precision() == TS_F32);
}

/* The small CNN of the golden file, its parameters named as torch's nn.Sequential. */
static ts_module *small_cnn(void) {
    ts_rng r;
    ts_rng_seed(&r, 0);
    ts_module *m = NULL, *l = NULL;
    ts_conv2d_params cp = TS_CONV2D_DEFAULT;
    cp.padding[0] = cp.padding[1] = 1;
    ts_pool2d_params pp = {{2, 2}, {2, 2}, {0, 0}, {1, 1}, false, false};
    CHECK_OK(ts_nn_sequential_new(&m));
    for (int b = 0; b < 2; b++) {
        CHECK_OK(ts_nn_conv2d_new(b ? 8 : 1, b ? 16 : 8, 3, 3, cp, true, &r, &l));
        CHECK_OK(ts_nn_sequential_add(m, NULL, l));
        CHECK_OK(ts_nn_batchnorm2d_new(b ? 16 : 8, 1e-5f, 0.1f, true, true, &l));
        CHECK_OK(ts_nn_sequential_add(m, NULL, l));
        CHECK_OK(ts_nn_relu_new(&l));
        CHECK_OK(ts_nn_sequential_add(m, NULL, l));
        CHECK_OK(ts_nn_maxpool2d_new(pp, &l));
        CHECK_OK(ts_nn_sequential_add(m, NULL, l));
    }
    CHECK_OK(ts_nn_flatten_new(&l));
    CHECK_OK(ts_nn_sequential_add(m, NULL, l));
    CHECK_OK(ts_nn_linear_new(784, 10, true, &r, &l));
    CHECK_OK(ts_nn_sequential_add(m, NULL, l));
    return m;
}

/* Two SGD steps of the small CNN from torch's initial state; the float parameters and buffers after them. */
static void cnn_two_steps(ts_dtype precision, ts_dtype autocast, ts_tensor_list *out, float loss[2]) {
    ts_module *m = small_cnn();
    ts_tensor_list init = TS_TENSOR_LIST_INIT, params = TS_TENSOR_LIST_INIT;
    for (int i = 0; i < golden.n; i++)
        if (strncmp(golden.names[i], "step/init/", 10) == 0)
            CHECK_OK(ts_tensor_list_append(&init, golden.names[i] + 10, golden.tensors[i]));
    CHECK_OK(ts_module_load_state_dict(m, &init, true));
    CHECK_OK(ts_module_parameters(m, &params));
    ts_optimizer *opt = NULL;
    CHECK_OK(ts_optimizer_by_name("sgd", &params, 0.02, 0.9, 0.0, &opt));
    CHECK_OK(ts_set_matmul_precision(precision));
    CHECK_OK(ts_set_autocast(autocast));
    ts_module_train(m, true);
    for (int s = 0; s < 2; s++) {
        ts_tensor *logits = NULL, *l = NULL;
        CHECK_OK(ts_module_forward(m, tg_get(&golden, "step/x"), &logits));
        CHECK_OK(ts_cross_entropy(logits, tg_get(&golden, "step/target"), 0.0f, &l));
        loss[s] = (float)ts_tensor_item(l, 0);
        CHECK_OK(ts_backward(l, NULL, false));
        CHECK_OK(ts_optimizer_step(opt));
        ts_optimizer_zero_grad(opt);
        ts_tensor_release(l);
        ts_tensor_release(logits);
    }
    CHECK_OK(ts_set_matmul_precision(TS_F32));
    CHECK_OK(ts_set_autocast(TS_F32));
    CHECK_OK(ts_module_state_dict(m, out));
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    ts_tensor_list_clear(&init);
    ts_module_free(m);
}

/* Largest |a - ref| over the float entries of a state dict, relative to each entry's largest |ref|. */
static double sd_err(const ts_tensor_list *a, const char *ref_prefix) {
    double worst = 0;
    for (int i = 0; i < a->n; i++) {
        if (ts_tensor_dtype(a->tensors[i]) != TS_F32) continue;
        ts_tensor *ref = tg_getf(&golden, "%s%s", ref_prefix, a->names[i]);
        CHECK(ref != NULL);
        if (ref) worst = fmax(worst, max_rel(a->tensors[i], ref));
    }
    return worst;
}

static void test_bf16_step_vs_torch(void) {
    ts_tensor_list f32 = TS_TENSOR_LIST_INIT, b16 = TS_TENSOR_LIST_INIT, torch_b16 = TS_TENSOR_LIST_INIT;
    float lf[2], lb[2];
    cnn_two_steps(TS_F32, TS_F32, &f32, lf);
    cnn_two_steps(TS_BF16, TS_F32, &b16, lb);
    for (int i = 0; i < golden.n; i++) /* torch's bf16 result, named like a state dict */
        if (strncmp(golden.names[i], "step/bf16/", 10) == 0 && strcmp(golden.names[i], "step/bf16/loss") != 0)
            CHECK_OK(ts_tensor_list_append(&torch_b16, golden.names[i] + 10, golden.tensors[i]));
    double e32 = sd_err(&f32, "step/fp32/"), ours = sd_err(&b16, "step/fp32/"), theirs = sd_err(&torch_b16, "step/fp32/");
    const float *tl = ts_tensor_data_f32(tg_get(&golden, "step/bf16/loss"));
    fprintf(stderr, "  small CNN, 2 SGD steps, largest error against torch's float32 result (relative to each "
                    "tensor's largest value):\n    ours in float32 %.2g, ours in bf16 %.2g, torch's bf16 autocast %.2g; "
                    "losses %.6f %.6f (torch bf16 %.6f %.6f)\n", e32, ours, theirs, lb[0], lb[1], tl[0], tl[1]);
    CHECK(e32 <= 1e-5);                          /* the float32 path is torch's float32 step */
    CHECK(ours > 10 * e32 && ours <= 1.5 * theirs); /* bfloat16 is on, and no worse than torch's */
    CHECK(fabs(lb[1] - tl[1]) <= 2e-2 * fabs(tl[1]));
    /* autocast: bfloat16 activations between the layers, as torch's autocast keeps them */
    ts_tensor_list ac = TS_TENSOR_LIST_INIT;
    float la[2];
    cnn_two_steps(TS_BF16, TS_BF16, &ac, la);
    double eac = sd_err(&ac, "step/fp32/");
    fprintf(stderr, "    autocast (bfloat16 activations): %.2g; losses %.6f %.6f\n", eac, la[0], la[1]);
    CHECK(eac > ours && eac <= 1.5 * theirs); /* activations rounded too, and still no worse than torch's */
    CHECK(fabs(la[1] - tl[1]) <= 2e-2 * fabs(tl[1]));
    ts_tensor_list_clear(&ac);
    ts_tensor_list_clear(&f32);
    ts_tensor_list_clear(&b16);
    ts_tensor_list_clear(&torch_b16);
}

/* Whether a (bfloat16) holds exactly the values of f (float32) rounded to bfloat16; prints the first miss. */
static bool same_as_rounded(const char *what, const ts_tensor *ta, const ts_tensor *tf) {
    if (ts_tensor_dtype(ta) != TS_BF16 || ts_tensor_numel(ta) != ts_tensor_numel(tf)) {
        fprintf(stderr, "  %s: dtype %s, %lld elements (want bfloat16, %lld)\n", what, ts_dtype_name(ts_tensor_dtype(ta)),
                (long long)ts_tensor_numel(ta), (long long)ts_tensor_numel(tf));
        return false;
    }
    ts_tensor *a = host(ta), *f = host(tf);
    const uint16_t *pa = ts_tensor_data(a);
    const float *pf = ts_tensor_data_f32(f);
    bool same = true;
    for (int64_t i = 0; same && i < ts_tensor_numel(a); i++)
        if (pa[i] != ts_f32_to_bf16(pf[i])) {
            fprintf(stderr, "  %s on %s [%lld]: 0x%04x, float32 op rounded 0x%04x (%.9g)\n", what, ts_device_name(dev),
                    (long long)i, pa[i], ts_f32_to_bf16(pf[i]), (double)pf[i]);
            same = false;
        }
    ts_tensor_release(a);
    ts_tensor_release(f);
    return same;
}

/* A float32 leaf holding bfloat16 tensor h's values */
static ts_tensor *widened_leaf(const ts_tensor *h) {
    ts_tensor *w = NULL, *leaf = NULL;
    CHECK_OK(ts_to_dtype(h, TS_F32, &w));
    CHECK_OK(ts_tensor_clone(w, &leaf));
    ts_tensor_release(w);
    ts_tensor_set_requires_grad(leaf, true);
    return leaf;
}

/* A bfloat16 tensor on the test device shaped like t, uniform in [-1, 1) (a gradient to feed backward) */
static ts_tensor *rand_bf16(ts_rng *r, const ts_tensor *t) {
    ts_tensor *f = on_dev(tu_rand(r, ts_tensor_ndim(t), ts_tensor_shape(t), -1.0f, 1.0f, false)), *h = NULL;
    CHECK_OK(ts_to_dtype(f, TS_BF16, &h));
    ts_tensor_release(f);
    return h;
}

/* o, the bfloat16 op's output from the bfloat16 leaf xl, given the bfloat16 gradient g; of, the float32 op's from
 * the float32 leaf xf holding the same values, given g widened: xl's gradient is xf's rounded, bit for bit */
static void same_backward(const char *what, ts_tensor *o, ts_tensor *of, ts_tensor *xl, ts_tensor *xf,
                          const ts_tensor *g) {
    ts_tensor *gf = NULL;
    CHECK_OK(ts_to_dtype(g, TS_F32, &gf));
    ts_tensor_zero_grad(xl);
    ts_tensor_zero_grad(xf);
    CHECK_OK(ts_backward(o, (ts_tensor *)g, false));
    CHECK_OK(ts_backward(of, gf, false));
    CHECK(ts_tensor_grad(xl) && ts_tensor_grad(xf));
    if (ts_tensor_grad(xl) && ts_tensor_grad(xf)) CHECK(same_as_rounded(what, ts_tensor_grad(xl), ts_tensor_grad(xf)));
    ts_tensor_release(gf);
}

/* Autocast (on the test device): conv2d and linear return bfloat16; batchnorm2d, relu, max pooling and the same-shape add
 * keep it, each output (and each input gradient) exactly the float32 op on the widened inputs, rounded once;
 * cross-entropy returns float32; parameter gradients stay float32; a bfloat16 tensor used twice gets the sum
 * of its gradients (it got garbage before: autograd summed 16-bit gradients as float32). */
static void test_autocast_ops(void) {
    CHECK(ts_get_autocast() == TS_F32);
    CHECK_STATUS(ts_set_autocast(TS_F16), TS_ERR_INVALID_ARG);
    ts_rng r;
    ts_rng_seed(&r, 21);
    int64_t xs[4] = {4, 6, 10, 10}, ws[4] = {8, 6, 3, 3}, bs[1] = {8}, cs[1] = {8};
    ts_tensor *x = on_dev(tu_rand(&r, 4, xs, -2.0f, 2.0f, false)), *w = on_dev(tu_rand(&r, 4, ws, -0.3f, 0.3f, true)),
              *b = on_dev(tu_rand(&r, 1, bs, -0.5f, 0.5f, true)), *gamma = on_dev(tu_rand(&r, 1, cs, 0.5f, 1.5f, true)),
              *beta = on_dev(tu_rand(&r, 1, cs, -0.5f, 0.5f, true));
    ts_conv2d_params cp = TS_CONV2D_DEFAULT;
    cp.padding[0] = cp.padding[1] = 1;
    ts_pool2d_params pp = {{2, 2}, {2, 2}, {0, 0}, {1, 1}, false, false};

    /* conv2d: bfloat16 out, the float32 conv of bfloat16-rounded operands within a rounding */
    CHECK_OK(ts_set_autocast(TS_BF16));
    CHECK(ts_get_autocast() == TS_BF16);
    ts_tensor *y = NULL;
    CHECK_OK(ts_conv2d(x, w, b, cp, &y));
    CHECK_OK(ts_set_autocast(TS_F32));
    CHECK(y && ts_tensor_dtype(y) == TS_BF16);
    ts_tensor *xr = NULL, *xr32 = NULL, *yref = NULL, *y32 = NULL;
    CHECK_OK(ts_to_dtype(x, TS_BF16, &xr));
    CHECK_OK(ts_to_dtype(xr, TS_F32, &xr32));
    CHECK_OK(ts_set_matmul_precision(TS_BF16));
    CHECK_OK(ts_conv2d(xr32, w, b, cp, &yref));
    CHECK_OK(ts_set_matmul_precision(TS_F32));
    CHECK_OK(ts_to_dtype(y, TS_F32, &y32));
    if (y32 && yref) CHECK(max_rel(y32, yref) <= 1.0 / 128); /* a bfloat16 rounding of the largest */

    /* batchnorm2d, relu, maxpool, add: bit for bit the float32 op on the widened input, rounded; backward too */
    ts_tensor *yl = widened_leaf(y), *rm = NULL, *rv = NULL, *rm32 = NULL, *rv32 = NULL;
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 1, cs, &rm));
    CHECK_OK(ts_tensor_full(dev, 1, cs, 1.0f, &rv));
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 1, cs, &rm32));
    CHECK_OK(ts_tensor_full(dev, 1, cs, 1.0f, &rv32));
    ts_tensor *yb = NULL;
    CHECK_OK(ts_to_dtype(yl, TS_BF16, &yb)); /* bfloat16, with a graph back to yl */
    ts_tensor *h[5] = {NULL}, *f[5] = {NULL};
    CHECK_OK(ts_batchnorm2d(yb, gamma, beta, rm, rv, true, 0.1f, 1e-5f, &h[0]));
    CHECK_OK(ts_batchnorm2d(yl, gamma, beta, rm32, rv32, true, 0.1f, 1e-5f, &f[0]));
    CHECK(same_as_rounded("batchnorm2d", h[0], f[0]));
    {
        ts_tensor *hm = host(rm), *hm32 = host(rm32), *hv = host(rv), *hv32 = host(rv32);
        CHECK(memcmp(ts_tensor_data(hm), ts_tensor_data(hm32), 8 * sizeof(float)) == 0 &&
              memcmp(ts_tensor_data(hv), ts_tensor_data(hv32), 8 * sizeof(float)) == 0);
        ts_tensor *hl[] = {hm, hm32, hv, hv32};
        for (int i = 0; i < 4; i++) ts_tensor_release(hl[i]);
    }
    /* each op from the rounded values the bfloat16 chain has (graph-less float32 copies), for the exact checks;
     * the float32 chain f[] goes on from f[0] for the gradients' comparison below */
    ts_tensor *e[3] = {widened_leaf(h[0]), NULL, NULL}, *eo[3] = {NULL, NULL, NULL};
    CHECK_OK(ts_relu(h[0], &h[1]));
    CHECK_OK(ts_relu(e[0], &eo[0]));
    CHECK(same_as_rounded("relu", h[1], eo[0]));
    CHECK_OK(ts_maxpool2d(h[1], pp, &h[2]));
    e[1] = widened_leaf(h[1]);
    CHECK_OK(ts_maxpool2d(e[1], pp, &eo[1]));
    CHECK(same_as_rounded("maxpool2d", h[2], eo[1]));
    CHECK_OK(ts_add(h[2], h[2], &h[3])); /* one tensor used twice: its gradient is the sum of both */
    e[2] = widened_leaf(h[2]);
    CHECK_OK(ts_add(e[2], e[2], &eo[2]));
    CHECK(same_as_rounded("add", h[3], eo[2]));
    for (int i = 0; i < 3; i++) {
        ts_tensor_release(e[i]);
        ts_tensor_release(eo[i]);
    }
    CHECK_OK(ts_relu(f[0], &f[1]));
    CHECK_OK(ts_maxpool2d(f[1], pp, &f[2]));
    CHECK_OK(ts_add(f[2], f[2], &f[3]));
    /* a float32 loss of each: sum of squares with fixed weights, through mean of (out * c) */
    ts_tensor *c = on_dev(tu_rand(&r, 4, (int64_t[]){4, 8, 5, 5}, -1.0f, 1.0f, false)), *cb = NULL, *lh = NULL, *lf = NULL,
              *mh = NULL, *mf = NULL;
    CHECK_OK(ts_to_dtype(c, TS_BF16, &cb));
    CHECK_OK(ts_mul(h[3], cb, &mh));
    CHECK_OK(ts_mul(f[3], c, &mf));
    CHECK_OK(ts_sum(mh, &lh));
    CHECK_OK(ts_sum(mf, &lf));
    CHECK_OK(ts_backward(lh, NULL, false));
    ts_tensor *ghb = ts_tensor_grad(yl); /* through the bfloat16 chain, back to float32 at the cast */
    ts_tensor *gh = NULL;
    if (ghb) CHECK_OK(ts_tensor_clone(ghb, &gh));
    ts_tensor *ggh = NULL, *gbh = NULL;
    if (ts_tensor_grad(gamma)) CHECK_OK(ts_tensor_clone(ts_tensor_grad(gamma), &ggh));
    if (ts_tensor_grad(beta)) CHECK_OK(ts_tensor_clone(ts_tensor_grad(beta), &gbh));
    CHECK(gh && ggh && gbh && ts_tensor_dtype(ggh) == TS_F32);
    ts_tensor_zero_grad(yl);
    ts_tensor_zero_grad(gamma);
    ts_tensor_zero_grad(beta);
    CHECK_OK(ts_backward(lf, NULL, false));
    if (gh && ts_tensor_grad(yl)) /* bfloat16 gradients at every op vs float32 ones: within bfloat16's rounding */
        CHECK(max_rel(gh, ts_tensor_grad(yl)) <= 0.05);
    if (ggh && ts_tensor_grad(gamma)) CHECK(max_rel(ggh, ts_tensor_grad(gamma)) <= 0.05);
    if (gbh && ts_tensor_grad(beta)) CHECK(max_rel(gbh, ts_tensor_grad(beta)) <= 0.05);
    fprintf(stderr, "  autocast gradients vs float32: input %.2g, gamma %.2g, beta %.2g\n",
            gh && ts_tensor_grad(yl) ? max_rel(gh, ts_tensor_grad(yl)) : -1.0,
            ggh && ts_tensor_grad(gamma) ? max_rel(ggh, ts_tensor_grad(gamma)) : -1.0,
            gbh && ts_tensor_grad(beta) ? max_rel(gbh, ts_tensor_grad(beta)) : -1.0);

    /* each op's input gradient: bit for bit the float32 backward on the widened gradient, rounded */
    {
        ts_tensor *in = widened_leaf(h[1]), *inb = NULL, *inl = NULL, *o[4] = {NULL}, *of[4] = {NULL}, *g[3] = {NULL};
        CHECK_OK(ts_to_dtype(in, TS_BF16, &inb));
        CHECK_OK(ts_tensor_clone(inb, &inl));
        ts_tensor_set_requires_grad(inl, true); /* a bfloat16 leaf */
        CHECK_OK(ts_maxpool2d(inl, pp, &o[0]));
        CHECK_OK(ts_maxpool2d(in, pp, &of[0]));
        g[0] = rand_bf16(&r, of[0]);
        same_backward("maxpool2d backward", o[0], of[0], inl, in, g[0]);
        /* overlapping windows (3x3, stride 2, ResNet's stem pool): an input takes several gradients */
        ts_pool2d_params op = {{3, 3}, {2, 2}, {1, 1}, {1, 1}, false, false};
        CHECK_OK(ts_maxpool2d(inl, op, &o[1]));
        CHECK_OK(ts_maxpool2d(in, op, &of[1]));
        CHECK(same_as_rounded("maxpool2d 3x3 stride 2", o[1], of[1]));
        g[1] = rand_bf16(&r, of[1]);
        same_backward("maxpool2d 3x3 stride 2 backward", o[1], of[1], inl, in, g[1]);
        /* relu backward and batchnorm backward (the same gradient) */
        CHECK_OK(ts_relu(inl, &o[2]));
        CHECK_OK(ts_relu(in, &of[2]));
        g[2] = rand_bf16(&r, of[2]);
        same_backward("relu backward", o[2], of[2], inl, in, g[2]);
        CHECK_OK(ts_batchnorm2d(inl, gamma, beta, NULL, NULL, true, 0.1f, 1e-5f, &o[3]));
        CHECK_OK(ts_batchnorm2d(in, gamma, beta, NULL, NULL, true, 0.1f, 1e-5f, &of[3]));
        CHECK(same_as_rounded("batchnorm2d (no running statistics)", o[3], of[3]));
        same_backward("batchnorm2d backward", o[3], of[3], inl, in, g[2]);
        ts_tensor *tl[] = {in, inb, inl, o[0], o[1], o[2], o[3], of[0], of[1], of[2], of[3], g[0], g[1], g[2]};
        for (size_t i = 0; i < sizeof tl / sizeof tl[0]; i++) ts_tensor_release(tl[i]);
    }

    /* linear returns bfloat16 under autocast, cross-entropy float32; the weights' gradients float32 */
    CHECK_OK(ts_set_autocast(TS_BF16));
    ts_tensor *lw = on_dev(tu_rand(&r, 2, (int64_t[]){10, 200}, -0.1f, 0.1f, true)), *flat = NULL, *logits = NULL, *loss = NULL;
    ts_tensor *t = NULL, *z[3] = {NULL, NULL, NULL};
    CHECK_OK(ts_tensor_zeros(dev, TS_I64, 1, (int64_t[]){4}, &t));
    CHECK_OK(ts_conv2d(x, w, b, cp, &z[0]));
    CHECK_OK(ts_relu(z[0], &z[1]));
    CHECK_OK(ts_maxpool2d(z[1], pp, &z[2]));
    CHECK(z[2] && ts_tensor_dtype(z[2]) == TS_BF16);
    CHECK_OK(ts_flatten(z[2], 1, &flat));
    CHECK_OK(ts_linear(flat, lw, NULL, &logits));
    CHECK(logits && ts_tensor_dtype(logits) == TS_BF16);
    CHECK_OK(ts_cross_entropy(logits, t, 0.0f, &loss));
    CHECK(loss && ts_tensor_dtype(loss) == TS_F32);
    CHECK_OK(ts_backward(loss, NULL, false));
    CHECK(ts_tensor_grad(lw) && ts_tensor_dtype(ts_tensor_grad(lw)) == TS_F32);
    CHECK(ts_tensor_grad(w) && ts_tensor_dtype(ts_tensor_grad(w)) == TS_F32);
    CHECK_OK(ts_set_autocast(TS_F32));

    ts_tensor *all[] = {x,  w,  b,  gamma, beta, y,  xr, xr32, yref, y32,  yl,     rm,   rv, rm32, rv32, yb, c,
                        cb, lh, lf, mh,    mf,   gh, ggh, gbh, lw,   flat, logits, loss, t,  z[0], z[1], z[2]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ts_tensor_release(all[i]);
    for (int i = 0; i < 5; i++) {
        ts_tensor_release(h[i]);
        ts_tensor_release(f[i]);
    }
}

/* Convolutions of tiny output planes (2x2: the batched backward) and others on bfloat16 activations:
 * gradients against the same conv run on float32 copies under bfloat16 precision (the same products,
 * float32 sums in another order): gx within its bfloat16 rounding, gw and gb to float32 summation order. */
static void test_autocast_conv_backward(void) {
    ts_rng r;
    ts_rng_seed(&r, 33);
    const struct {
        int64_t x[4], w[4];
        int stride, pad;
    } cases[] = {
        {{8, 16, 4, 4}, {24, 16, 3, 3}, 2, 1}, /* 2x2 output: the tiny-plane path */
        {{8, 16, 3, 3}, {24, 16, 3, 3}, 1, 0}, /* 1x1 output, no padding */
        {{4, 8, 6, 6}, {12, 8, 3, 3}, 1, 1},   /* 6x6: oneDNN */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        ts_tensor *x = on_dev(tu_rand(&r, 4, cases[k].x, -2.0f, 2.0f, false)),
                  *w = on_dev(tu_rand(&r, 4, cases[k].w, -0.2f, 0.2f, true));
        ts_tensor *b = on_dev(tu_rand(&r, 1, &cases[k].w[0], -0.5f, 0.5f, true));
        ts_conv2d_params cp = TS_CONV2D_DEFAULT;
        cp.stride[0] = cp.stride[1] = cases[k].stride;
        cp.padding[0] = cp.padding[1] = cases[k].pad;
        ts_tensor *xb = NULL, *xh = NULL, *xf = NULL, *yh = NULL, *yf = NULL, *gh = NULL, *gf = NULL, *g = NULL;
        CHECK_OK(ts_to_dtype(x, TS_BF16, &xb));
        CHECK_OK(ts_tensor_clone(xb, &xh));
        ts_tensor_set_requires_grad(xh, true);
        CHECK_OK(ts_to_dtype(xb, TS_F32, &xf));
        ts_tensor_set_requires_grad(xf, true);
        CHECK_OK(ts_conv2d(xh, w, b, cp, &yh));
        CHECK(yh && ts_tensor_dtype(yh) == TS_BF16);
        g = on_dev(tu_rand(&r, 4, ts_tensor_shape(yh), -1.0f, 1.0f, false));
        CHECK_OK(ts_to_dtype(g, TS_BF16, &gh));
        CHECK_OK(ts_to_dtype(gh, TS_F32, &gf));
        CHECK_OK(ts_backward(yh, gh, false));
        ts_tensor *gw_h = NULL, *gb_h = NULL, *gx_h = NULL;
        CHECK_OK(ts_tensor_clone(ts_tensor_grad(w), &gw_h));
        CHECK_OK(ts_tensor_clone(ts_tensor_grad(b), &gb_h));
        CHECK_OK(ts_to_dtype(ts_tensor_grad(xh), TS_F32, &gx_h));
        ts_tensor_zero_grad(w);
        ts_tensor_zero_grad(b);
        CHECK_OK(ts_set_matmul_precision(TS_BF16));
        CHECK_OK(ts_conv2d(xf, w, b, cp, &yf));
        CHECK_OK(ts_backward(yf, gf, false));
        CHECK_OK(ts_set_matmul_precision(TS_F32));
        double ex = max_rel(gx_h, ts_tensor_grad(xf)), ew = max_rel(gw_h, ts_tensor_grad(w)),
               eb = max_rel(gb_h, ts_tensor_grad(b));
        fprintf(stderr, "  conv %lldx%lld -> %lld, stride %d: gx %.2g, gw %.2g, gb %.2g from the float32 copies\n",
                (long long)cases[k].x[2], (long long)cases[k].x[3], (long long)cases[k].w[0], cases[k].stride, ex, ew, eb);
        CHECK(ex <= 1.0 / 128 && ew <= 1e-5 && eb <= 1e-5);
        ts_tensor *tl[] = {x, w, b, xb, xh, xf, yh, yf, gh, gf, g, gw_h, gb_h, gx_h};
        for (size_t i = 0; i < sizeof tl / sizeof tl[0]; i++) ts_tensor_release(tl[i]);
    }
}

/* A bfloat16 leaf used twice gets the sum of both gradients (autograd's 16-bit accumulation). */
static void test_half_grad_accumulation(void) {
    for (int k = 0; k < 2; k++) {
        ts_dtype dt = k ? TS_F16 : TS_BF16;
        float v[5] = {1, 2, 3, 4, 5};
        ts_tensor *a32 = NULL, *a = NULL, *y1 = NULL, *y2 = NULL, *s1 = NULL, *s2 = NULL, *s = NULL;
        CHECK_OK(ts_tensor_from_data(dev, TS_F32, 1, (int64_t[]){5}, v, &a32));
        CHECK_OK(ts_to_dtype(a32, dt, &a));
        ts_tensor_set_requires_grad(a, true);
        CHECK_OK(ts_scale(a, 2.0f, &y1));
        CHECK_OK(ts_scale(a, 3.0f, &y2));
        CHECK_OK(ts_sum(y1, &s1));
        CHECK_OK(ts_sum(y2, &s2));
        CHECK_OK(ts_add(s1, s2, &s));
        CHECK_OK(ts_backward(s, NULL, false));
        ts_tensor *g = ts_tensor_grad(a);
        CHECK(g && ts_tensor_dtype(g) == dt);
        for (int i = 0; g && i < 5; i++) CHECK(ts_tensor_item(g, i) == 5.0);
        ts_tensor *tl[] = {a32, a, y1, y2, s1, s2, s};
        for (size_t i = 0; i < sizeof tl / sizeof tl[0]; i++) ts_tensor_release(tl[i]);
    }
}

/* The bfloat16 2x2 / stride 2 max pool (the row kernels on bfloat16 rows) on wide rows (several 16-output
 * blocks and a tail), an odd width and height (a column and a row no window covers), ties and NaNs: values
 * and each input's gradient bit for bit the float32 op on the widened input. */
static void test_autocast_maxpool_2x2(void) {
    ts_rng r;
    ts_rng_seed(&r, 77);
    const int64_t shape[4] = {2, 3, 11, 75};
    ts_tensor *x = tu_rand(&r, 4, shape, -2.0f, 2.0f, false), *xb = NULL;
    float *px = ts_tensor_data_f32(x);
    for (int64_t i = 0; i < ts_tensor_numel(x); i++) px[i] = roundf(px[i] * 2.0f) / 2.0f; /* 9 values: ties */
    px[1 * 11 * 75 + 4 * 75 + 40] = NAN; /* plane 1 goes the float32 way */
    x = on_dev(x);
    CHECK_OK(ts_to_dtype(x, TS_BF16, &xb));
    ts_tensor_set_requires_grad(xb, true);
    ts_tensor *xf = widened_leaf(xb), *o = NULL, *of = NULL;
    ts_pool2d_params pp = {{2, 2}, {2, 2}, {0, 0}, {1, 1}, false, false};
    CHECK_OK(ts_maxpool2d(xb, pp, &o));
    CHECK_OK(ts_maxpool2d(xf, pp, &of));
    if (o && of) CHECK(same_as_rounded("maxpool2d 2x2 wide", o, of));
    ts_tensor *g = of ? rand_bf16(&r, of) : NULL;
    if (g) same_backward("maxpool2d 2x2 wide backward", o, of, xb, xf, g);
    ts_tensor *all[] = {x, xb, xf, o, of, g};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ts_tensor_release(all[i]);
}

/* A conv oneDNN has no primitive for (bfloat16 ones on CPUs without AVX-512: AVX2 machines) runs our own algorithm,
 * and oneDNN is asked once per geometry and pass, not on every call (each failed creation cost ~10 us of
 * every call of every step): the debug log says so at most once per pass. On a CPU with oneDNN's bfloat16
 * kernels it never says so. The results are the same either way (test_matmul_precision). */
static void count_no_conv(ts_log_level level, const char *msg, void *user) {
    (void)level;
    if (strstr(msg, "oneDNN has no convolution")) ++*(int *)user;
}

static void test_bf16_conv_asks_onednn_once(void) {
    ts_rng r;
    ts_rng_seed(&r, 41);
    ts_tensor *x = tu_rand(&r, 4, (int64_t[]){2, 5, 7, 7}, -1.0f, 1.0f, true),
              *w = tu_rand(&r, 4, (int64_t[]){6, 5, 3, 3}, -0.3f, 0.3f, true);
    ts_conv2d_params cp = TS_CONV2D_DEFAULT;
    cp.padding[0] = cp.padding[1] = 1;
    int said = 0;
    const ts_log_level before = ts_log_get_level();
    ts_log_set_level(TS_LOG_DEBUG);
    ts_log_set_sink(count_no_conv, &said);
    CHECK_OK(ts_set_matmul_precision(TS_BF16));
    for (int i = 0; i < 3; i++) {
        ts_tensor *y = NULL, *l = NULL;
        CHECK_OK(ts_conv2d(x, w, NULL, cp, &y));
        if (y) CHECK_OK(ts_sum(y, &l));
        if (l) CHECK_OK(ts_backward(l, NULL, false));
        ts_tensor_release(y);
        ts_tensor_release(l);
    }
    CHECK_OK(ts_set_matmul_precision(TS_F32));
    ts_log_set_sink(NULL, NULL);
    ts_log_set_level(before);
    fprintf(stderr, "  bfloat16 conv: oneDNN said it has none %d times in 3 calls\n", said);
    CHECK(said <= 3); /* forward, backward-data, backward-weights: once each */
    ts_tensor_release(x);
    ts_tensor_release(w);
}

/* The plane kernels' sums (src/ops/cpu/plane.h: BatchNorm's statistics and backward, the conv bias gradient,
 * LayerNorm's rows) in their documented order, bit for bit, for float32 and bfloat16 planes: within each run of
 * TS_PLANE_RUN blocks of 16, float lane j starts at the run's element j and adds elements j + 16, j + 32, ...,
 * products rounded to float before the add (no FMA); at the run's end lane j goes to double lane j; the 16
 * double lanes totalled by a fixed pairwise tree, then the last n % 16 elements added in double. The ISA clone
 * this CPU runs must give exactly these bits (omp simd reductions let the vectoriser choose: 8 lanes for float32
 * and 16 for bfloat16 under AVX2, so BatchNorm's statistics of a bfloat16 input and of its float32 widening
 * differed on AVX2 machines only; the AVX-512 clone fused products into FMAs). */
static double lanes_total(const double *l) {
    double t[8];
    for (int j = 0; j < 8; j++) t[j] = l[j] + l[j + 8];
    for (int j = 0; j < 4; j++) t[j] += t[j + 4];
    for (int j = 0; j < 2; j++) t[j] += t[j + 2];
    return t[0] + t[1];
}

/* the five sums of x[0..n), g[0..n) about m in the fixed order, as plain scalar code */
static void plane_sums_ref(const float *x, const float *g, int64_t n, float m, double want[5]) {
    enum { L = TS_PLANE_LANES, RUN = L * TS_PLANE_RUN };
    float l[5][L];
    double dl[5][L], t[5] = {0};
    const int64_t whole = n / L * L;
    for (int64_t i = 0; i < n; i++) {
        const float d = x[i] - m;
        volatile float dd = d * d, gd = g[i] * d; /* rounded products: no FMA in the reference either */
        const float term[5] = {x[i], d, dd, g[i], gd};
        for (int s = 0; s < 5; s++) {
            if (i >= whole)
                t[s] += (double)term[s];
            else if (i % RUN < L)
                l[s][i % L] = term[s]; /* a run's first block starts its lanes */
            else
                l[s][i % L] += term[s];
        }
        if (i < whole && (i % RUN == RUN - 1 || i == whole - 1)) /* a run's end: to the double lanes */
            for (int s = 0; s < 5; s++)
                for (int j = 0; j < L; j++) dl[s][j] = i < RUN ? (double)l[s][j] : dl[s][j] + (double)l[s][j];
        if (i == whole - 1)
            for (int s = 0; s < 5; s++) t[s] = lanes_total(dl[s]);
    }
    for (int s = 0; s < 5; s++) want[s] = t[s];
}

static void test_plane_sums_order(void) {
    ts_rng r;
    ts_rng_seed(&r, 91);
    enum { NMAX = 1000 };
    /* [0]: float32 values over 2^-8 .. 2^8 (any other order rounds differently); [1]: float32 ones in [1, 2)
     * (products as large as the partial sums: an FMA rounds differently); [2]: [0]'s rounded to bfloat16, in
     * xh, gh too */
    static float x[3][NMAX], g[3][NMAX];
    static uint16_t xh[NMAX], gh[NMAX];
    for (int i = 0; i < NMAX; i++) {
        x[0][i] = ldexpf((float)(ts_rng_uniform(&r) * 2 - 1), (int)(ts_rng_uniform(&r) * 16) - 8);
        g[0][i] = (float)(ts_rng_uniform(&r) * 2 - 1);
        x[1][i] = (float)(1 + ts_rng_uniform(&r));
        g[1][i] = (float)(1 + ts_rng_uniform(&r));
        xh[i] = ts_f32_to_bf16(x[0][i]);
        gh[i] = ts_f32_to_bf16(g[0][i]);
        x[2][i] = ts_bf16_to_f32(xh[i]);
        g[2][i] = ts_bf16_to_f32(gh[i]);
    }
    const int64_t ns[] = {0, 1, 15, 16, 17, 49, 100, 255, 256, 257, 272, 512, 784, 999, NMAX};
    const float m = 0.3f;
    int64_t bad = 0;
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
        for (int q = 0; q < 4; q++) { /* the three sets as float32, and [2] as bfloat16 */
            const int v = q < 3 ? q : 2;
            const bool h = q == 3;
            double want[5], got[5] = {0};
            plane_sums_ref(x[v], g[v], ns[k], m, want);
            const void *px = h ? (const void *)xh : (const void *)x[v], *pg = h ? (const void *)gh : (const void *)g[v];
            got[0] = ts__cpu_plane_sum(px, ns[k], h);
            ts__cpu_plane_shifted_sums(px, ns[k], m, h, &got[1], &got[2]);
            ts__cpu_plane_dot_dev(pg, px, ns[k], m, h, &got[3], &got[4]);
            for (int s = 0; s < 5; s++)
                if (memcmp(&got[s], &want[s], sizeof(double)) != 0 && bad++ < 8)
                    fprintf(stderr, "  set %d as %s, plane of %lld, sum %d: %.17g, the fixed order gives %.17g\n", v,
                            h ? "bfloat16" : "float32", (long long)ns[k], s, got[s],
                            want[s]);
        }
    CHECK(bad == 0);
}

int main(int argc, char **argv) {
    dev = tu_test_device();
    if (dev != ts_device_cpu()) fprintf(stderr, "the autocast tests on %s\n", ts_device_name(dev));
    if (tg_load(GOLDEN, &golden) != TS_OK) {
        fprintf(stderr, "cannot read %s: %s\n", GOLDEN, ts_last_error());
        return 1;
    }
    ts_tensor *v = tg_get(&golden, "torch_version");
    if (v) {
        fprintf(stderr, "golden values from torch ");
        for (int64_t i = 0; i < ts_tensor_numel(v); i++) fputc(((const int32_t *)ts_tensor_data(v))[i], stderr);
        fputc('\n', stderr);
    }
    static const tu_test tests[] = {
        T(test_convert_golden), T(test_every_pattern), T(test_to_dtype_op), T(test_half_ops), T(test_checkpoint_16bit),
        T(test_grad_scaler_golden), T(test_matmul_precision), T(test_bf16_step_vs_torch), T(test_autocast_ops),
        T(test_half_grad_accumulation), T(test_autocast_conv_backward), T(test_autocast_maxpool_2x2),
        T(test_plane_sums_order), T(test_bf16_conv_asks_onednn_once),
    };
    int rc = tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    ts_tensor_list_clear(&golden);
    tu_rm_tmpdir();
    return rc;
}
