/*
 * tests/test_precision.c — 16-bit floats and loss scaling against PyTorch
 * (tests/golden/precision.tsg.gz, scripts/gen_precision_golden.py):
 * float32 -> bfloat16 / float16 rounding bit for bit (ties, subnormals,
 * overflow, NaN), every 16-bit pattern back to float32 and round again,
 * ts_to_dtype's values and gradients, 16-bit tensors in checkpoints, and the
 * grad scaler's scale and skipped steps step by step as torch.amp.GradScaler.
 */
#include "test_util.h"
#include "golden_io.h"

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

int main(int argc, char **argv) {
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
        T(test_convert_golden), T(test_every_pattern), T(test_to_dtype_op), T(test_checkpoint_16bit),
        T(test_grad_scaler_golden),
    };
    int rc = tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    ts_tensor_list_clear(&golden);
    tu_rm_tmpdir();
    return rc;
}
