/*
 * tests/test_attention.c — ts_scaled_dot_product_attention (src/ops/attention.c, the CPU's tiled
 * kernels in src/ops/cpu/attention.c) against:
 *  - the naive formula in float64, written here (every score, a full softmax per row, then the
 *    gradients of sum(out * gy) by the textbook formulas): causal and not, T = 1, 7, 63, 64, 65, 257
 *    (below, at and past the 64-query and 128-key tiles), D = 16 and 64, B H = 6, Tq != Tk both ways;
 *  - PyTorch's F.scaled_dot_product_attention through tests/golden/attention.tsg
 *    (scripts/gen_attention_golden.py; the file records the torch version);
 *  - float64 at the edges: scores near 1e4 apart by multiples of 1/64 (the log-sum-exp kept as max and
 *    log-sum, so backward's exp((s - m) - log l) loses nothing; m + log l rounded to float would be
 *    ~5e-4 off), rows whose scores are all equal, a causal row of 4096 keys;
 *  - bfloat16 under autocast within bfloat16's rounding of float64;
 * plus bad input, non-contiguous input, and the memory of a forward + backward growing linearly in T.
 */
#include "device/k_misc.h"
#include "golden_io.h"
#include "tensor/tensor.h"
#include "test_util.h"

#include <math.h>

#define TS_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- the float64 reference ------------------------------------------------------------------------- */
typedef struct shape5 {
    int64_t B, H, Tq, Tk, D;
} shape5;

/* out, gq, gk, gv (each may be NULL) of attention over (B H) heads, from float inputs, in double. gy NULL:
 * forward only. Rows whose index r has r % row_step != 0 (and r < Tq - 64) are skipped (forward only). */
static void ref_attention(shape5 s, const float *q, const float *k, const float *v, const float *gy, bool causal,
                          double scale, int64_t row_step, double *out, double *gq, double *gk, double *gv) {
    const int64_t D = s.D, BH = s.B * s.H;
    double *p = malloc(sizeof(double) * (size_t)s.Tk), *dp = malloc(sizeof(double) * (size_t)s.Tk);
    if (gq) memset(gq, 0, sizeof(double) * (size_t)(BH * s.Tq * D));
    if (gk) memset(gk, 0, sizeof(double) * (size_t)(BH * s.Tk * D));
    if (gv) memset(gv, 0, sizeof(double) * (size_t)(BH * s.Tk * D));
    for (int64_t h = 0; h < BH; h++) {
        const float *Q = q + h * s.Tq * D, *K = k + h * s.Tk * D, *V = v + h * s.Tk * D;
        for (int64_t i = 0; i < s.Tq; i++) {
            if (row_step > 1 && i % row_step && i < s.Tq - 64) continue;
            const int64_t n = causal ? (i + 1 < s.Tk ? i + 1 : s.Tk) : s.Tk;
            double m = -INFINITY, l = 0;
            for (int64_t j = 0; j < n; j++) {
                double d = 0;
                for (int64_t c = 0; c < D; c++) d += (double)Q[i * D + c] * K[j * D + c];
                p[j] = scale * d;
                m = fmax(m, p[j]);
            }
            for (int64_t j = 0; j < n; j++) l += (p[j] = exp(p[j] - m));
            for (int64_t j = 0; j < n; j++) p[j] /= l;
            double *o = out + (h * s.Tq + i) * D;
            for (int64_t c = 0; c < D; c++) {
                double a = 0;
                for (int64_t j = 0; j < n; j++) a += p[j] * V[j * D + c];
                o[c] = a;
            }
            if (!gy) continue;
            const float *g = gy + (h * s.Tq + i) * D;
            double dsum = 0;
            for (int64_t j = 0; j < n; j++) {
                double d = 0;
                for (int64_t c = 0; c < D; c++) d += (double)g[c] * V[j * D + c];
                dp[j] = d;
                dsum += p[j] * d;
            }
            for (int64_t j = 0; j < n; j++) {
                const double ds = p[j] * (dp[j] - dsum) * scale;
                for (int64_t c = 0; c < D; c++) {
                    gq[(h * s.Tq + i) * D + c] += ds * K[j * D + c];
                    gk[(h * s.Tk + j) * D + c] += ds * Q[i * D + c];
                    gv[(h * s.Tk + j) * D + c] += p[j] * g[c];
                }
            }
        }
    }
    free(p);
    free(dp);
}

/* ---- helpers --------------------------------------------------------------------------------------- */
/* scripts/gen_attention_golden.py's inputs: element i of seed s is (k - 2^23) 2^-23, k the top 24 bits of
 * splitmix64((s << 32) + i) (exact in float32). */
static float *golden_gen(uint64_t seed, int64_t n) {
    float *p = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)((double)((int64_t)(tg_splitmix64((seed << 32) + (uint64_t)i) >> 40) - (1 << 23)) * 0x1p-23);
    return p;
}

static ts_tensor_list golden;
static bool golden_ok;

/* The golden file, loaded once; false (the test skips its part, saying so) when it is missing. */
static bool load_golden(void) {
    static bool tried;
    if (!tried) {
        tried = true;
        golden_ok = tg_load(TS_TEST_DIR "/golden/attention.tsg.gz", &golden) == TS_OK;
        if (!golden_ok) fprintf(stderr, "golden: %s\n", ts_last_error());
        ts_tensor *v = tg_get(&golden, "torch_version");
        if (v) {
            char ver[64] = {0};
            const int32_t *c = (const int32_t *)ts_tensor_data(v);
            for (int64_t i = 0; i < ts_tensor_numel(v) && i < 63; i++) ver[i] = (char)c[i];
            printf("  golden values from torch %s\n", ver);
        }
    }
    CHECK(golden_ok);
    return golden_ok;
}
static ts_tensor *make(int64_t B, int64_t H, int64_t T, int64_t D, const float *data, bool grad) {
    ts_tensor *t = NULL;
    CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_F32, 4, (int64_t[]){B, H, T, D}, data, &t));
    if (t) ts_tensor_set_requires_grad(t, grad);
    return t;
}

static float *urand(ts_rng *r, int64_t n, float lo, float hi) {
    float *p = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * (float)ts_rng_uniform(r);
    return p;
}

/* max |a - b| over rows of D whose index r (of Tq per head) is checked (as ref_attention's row_step) */
static double max_err(const float *a, const double *b, int64_t heads, int64_t T, int64_t D, int64_t row_step) {
    double w = 0;
    for (int64_t h = 0; h < heads; h++)
        for (int64_t i = 0; i < T; i++) {
            if (row_step > 1 && i % row_step && i < T - 64) continue;
            for (int64_t c = 0; c < D; c++) {
                const double d = fabs(a[(h * T + i) * D + c] - b[(h * T + i) * D + c]);
                w = d > w || d != d ? d : w;
            }
        }
    return w;
}

static double max_abs(const double *b, int64_t n) {
    double w = 0;
    for (int64_t i = 0; i < n; i++) w = fmax(w, fabs(b[i]));
    return w;
}

/* A tensor's values as float32 on the host (bfloat16 widened). */
static float *host_f32(const ts_tensor *t) {
    ts_tensor *f = NULL;
    CHECK_OK(ts_to_dtype(t, TS_F32, &f));
    const int64_t n = ts_tensor_numel(f);
    float *h = malloc(sizeof(float) * (size_t)(n ? n : 1));
    CHECK_OK(ts_tensor_to_host(f, h, sizeof(float) * (size_t)n));
    ts_tensor_release(f);
    return h;
}

/* Errors of one case against float64: [0] out (absolute), [1..3] gq, gk, gv (relative to the largest
 * reference gradient, or absolute where that is below 1: a single visible key has zero gq and gk). q, k, v, gy host arrays; the op runs on float32 tensors of them. */
typedef struct errs {
    double e[4];
} errs;

static errs run_case(shape5 s, const float *q, const float *k, const float *v, const float *gy, bool causal,
                     double scale) {
    errs r = {{NAN, NAN, NAN, NAN}};
    const int64_t nq = s.B * s.H * s.Tq * s.D, nk = s.B * s.H * s.Tk * s.D;
    ts_tensor *tq = make(s.B, s.H, s.Tq, s.D, q, true), *tk = make(s.B, s.H, s.Tk, s.D, k, true);
    ts_tensor *tv = make(s.B, s.H, s.Tk, s.D, v, true), *tg = make(s.B, s.H, s.Tq, s.D, gy, false), *o = NULL;
    CHECK_OK(ts_scaled_dot_product_attention(tq, tk, tv, causal, scale, &o));
    if (o) {
        CHECK_OK(ts_backward(o, tg, false));
        double *ro = malloc(sizeof(double) * (size_t)(nq + 1)), *rq = malloc(sizeof(double) * (size_t)(nq + 1));
        double *rk = malloc(sizeof(double) * (size_t)(nk + 1)), *rv = malloc(sizeof(double) * (size_t)(nk + 1));
        ref_attention(s, q, k, v, gy, causal, scale ? scale : 1.0 / sqrt((double)s.D), 1, ro, rq, rk, rv);
        float *ho = host_f32(o);
        r.e[0] = max_err(ho, ro, s.B * s.H, s.Tq, s.D, 1);
        const ts_tensor *grads[3] = {ts_tensor_grad(tq), ts_tensor_grad(tk), ts_tensor_grad(tv)};
        const double *refs[3] = {rq, rk, rv};
        for (int i = 0; i < 3; i++) {
            CHECK(grads[i] != NULL);
            if (!grads[i]) continue;
            float *hg = host_f32(grads[i]);
            const int64_t T = i ? s.Tk : s.Tq;
            r.e[1 + i] = max_err(hg, refs[i], s.B * s.H, T, s.D, 1) / fmax(max_abs(refs[i], s.B * s.H * T * s.D), 1.0);
            free(hg);
        }
        free(ho);
        free(ro);
        free(rq);
        free(rk);
        free(rv);
    }
    ts_tensor_release(o);
    ts_tensor_release(tq);
    ts_tensor_release(tk);
    ts_tensor_release(tv);
    ts_tensor_release(tg);
    return r;
}

/* ---- against float64 on random inputs -------------------------------------------------------------- */
static void check_random(shape5 s, bool causal, double scale, double tol_out, double tol_grad) {
    ts_rng rs, *rng = &rs;
    ts_rng_seed(rng, (uint64_t)(s.Tq * 1000003 + s.Tk * 1009 + s.D * 7 + causal));
    const int64_t nq = s.B * s.H * s.Tq * s.D, nk = s.B * s.H * s.Tk * s.D;
    float *q = urand(rng, nq, -1, 1), *k = urand(rng, nk, -1, 1), *v = urand(rng, nk, -1, 1), *g = urand(rng, nq, -1, 1);
    errs e = run_case(s, q, k, v, g, causal, scale);
    bool ok = e.e[0] <= tol_out && e.e[1] <= tol_grad && e.e[2] <= tol_grad && e.e[3] <= tol_grad;
    if (!ok || s.Tq == 257)
        printf("  B %lld H %lld Tq %lld Tk %lld D %lld %s: out %.2g, gq %.2g, gk %.2g, gv %.2g (relative)\n",
               (long long)s.B, (long long)s.H, (long long)s.Tq, (long long)s.Tk, (long long)s.D,
               causal ? "causal" : "full", e.e[0], e.e[1], e.e[2], e.e[3]);
    CHECK(ok);
    free(q);
    free(k);
    free(v);
    free(g);
}

static void test_vs_float64(void) {
    static const int64_t Ts[] = {1, 7, 63, 64, 65, 257};
    static const int64_t Ds[] = {16, 64};
    for (size_t ti = 0; ti < TS_ARRAY_LEN(Ts); ti++)
        for (size_t di = 0; di < TS_ARRAY_LEN(Ds); di++)
            for (int causal = 0; causal < 2; causal++)
                check_random((shape5){2, 3, Ts[ti], Ts[ti], Ds[di]}, causal, 0.0, 1e-6, 4e-6);
}

/* Tq != Tk: unmasked, and causal with PyTorch's top-left alignment (query i sees keys 0..i) */
static void test_cross_lengths(void) {
    static const int64_t pairs[][2] = {{7, 130}, {130, 7}, {65, 200}, {200, 65}, {1, 300}};
    for (size_t i = 0; i < TS_ARRAY_LEN(pairs); i++)
        for (int causal = 0; causal < 2; causal++)
            check_random((shape5){1, 2, pairs[i][0], pairs[i][1], 32}, causal, 0.0, 1e-6, 4e-6);
    check_random((shape5){2, 1, 90, 70, 16}, true, 0.3, 1e-6, 4e-6); /* an explicit scale */
}


/* ---- float64 at the edges ------------------------------------------------------------------------------ */
/* Scores of 1e4 (plus `far` x 1e4 for every third key) + multiples of 1/64, all exact in float32: q_i = (4,
 * 4 a_i, 0, ...), k_j = (1e4 (1 + far (j % 3)) + x_j / 64, b_j, 0, ...), scale 1/4. */
static void check_close_logits(int e, bool far, bool causal) {
    const shape5 s = {1, 2, 200, 200, 16};
    const int64_t n = s.B * s.H * s.Tq * s.D;
    float *q = calloc((size_t)n, sizeof(float)), *k = calloc((size_t)n, sizeof(float));
    float *v = golden_gen(6000 + 16 * (uint64_t)e + 2, n), *g = golden_gen(6000 + 16 * (uint64_t)e + 3, n);
    for (int64_t r = 0; r < s.B * s.H * s.Tq; r++) {
        const int64_t i = r % s.Tq;
        q[r * s.D] = 4.0f;
        q[r * s.D + 1] = 4.0f * (float)(i % 3) / 8.0f;
        k[r * s.D] = 1e4f * (float)(1 + (far ? i % 3 : 0)) + (float)((i * 37) % 97) / 64.0f;
        k[r * s.D + 1] = (float)(i % 5) / 8.0f;
    }
    errs r = run_case(s, q, k, v, g, causal, 0.0);
    /* torch float32's own errors on these inputs (the golden file), the bar where they exceed a few roundings */
    const ts_tensor *tc = load_golden() ? tg_getf(&golden, "edge%d/case", e) : NULL;
    const ts_tensor *te = load_golden() ? tg_getf(&golden, "edge%d/torch_err", e) : NULL;
    CHECK(tc && te && ((const int64_t *)ts_tensor_data((ts_tensor *)tc))[0] == far &&
          ((const int64_t *)ts_tensor_data((ts_tensor *)tc))[1] == causal);
    const float *terr = te ? (const float *)ts_tensor_data((ts_tensor *)te) : NULL;
    printf("  scores 1e4 + k/64%s, %s: out %.2g, gq %.2g, gk %.2g, gv %.2g (torch float32: %.2g, %.2g, %.2g, %.2g)\n",
           far ? " (and 2e4, 3e4)" : "", causal ? "causal" : "full", r.e[0], r.e[1], r.e[2], r.e[3],
           terr ? terr[0] : NAN, terr ? terr[1] : NAN, terr ? terr[2] : NAN, terr ? terr[3] : NAN);
    for (int i = 0; i < 4 && terr; i++) CHECK(r.e[i] <= fmax(terr[i], i ? 4e-6 : 1e-6));
    if (!far) CHECK(r.e[0] <= 1e-6 && r.e[1] <= 4e-6 && r.e[2] <= 4e-6 && r.e[3] <= 4e-6);
    free(q);
    free(k);
    free(v);
    free(g);
}

/* (far: keys also 1e4 and 2e4 above the rest, where most weights underflow to 0 and the keys' mean is 1e4 from
 * those that count: gq keeps an error of about 2^-24 1e4 sum |dS|, below torch's) */
static void test_close_logits(void) {
    for (int far = 0; far < 2; far++)
        for (int causal = 0; causal < 2; causal++) check_close_logits(2 * far + causal, far, causal);
}

/* Rows whose scores are all equal: q = 0 (every score 0), and every key the same vector (each row's scores
 * one value): out is the mean of the visible values. */
static void test_equal_scores(void) {
    const shape5 s = {2, 2, 150, 150, 32};
    const int64_t n = s.B * s.H * s.Tq * s.D;
    ts_rng rs;
    ts_rng_seed(&rs, 7);
    float *q = urand(&rs, n, -1, 1), *k = urand(&rs, n, -1, 1), *v = urand(&rs, n, -1, 1), *g = urand(&rs, n, -1, 1);
    float *zero = calloc((size_t)n, sizeof(float));
    for (int64_t r = 0; r < s.B * s.H * s.Tk; r++) memcpy(k + r * s.D, k, sizeof(float) * (size_t)s.D);
    for (int causal = 0; causal < 2; causal++) {
        errs a = run_case(s, zero, k, v, g, causal, 0.0), b = run_case(s, q, k, v, g, causal, 0.0);
        printf("  equal scores %s: q = 0: out %.2g, grads %.2g %.2g %.2g; one key vector: out %.2g, grads %.2g %.2g "
               "%.2g\n",
               causal ? "causal" : "full", a.e[0], a.e[1], a.e[2], a.e[3], b.e[0], b.e[1], b.e[2], b.e[3]);
        for (int i = 0; i < 4; i++) CHECK(a.e[i] <= (i ? 4e-6 : 1e-6) && b.e[i] <= (i ? 4e-6 : 1e-6));
    }
    free(q);
    free(k);
    free(v);
    free(g);
    free(zero);
}

/* A causal row of 4096 keys, D = 16, forward only: every 17th row and the last 64 against float64. */
static void test_long_rows(void) {
    const shape5 s = {1, 1, 4096, 4096, 16};
    const int64_t n = s.Tq * s.D;
    ts_rng rs;
    ts_rng_seed(&rs, 4096);
    float *q = urand(&rs, n, -2, 2), *k = urand(&rs, n, -2, 2), *v = urand(&rs, n, -1, 1);
    ts_tensor *tq = make(1, 1, s.Tq, s.D, q, false), *tk = make(1, 1, s.Tk, s.D, k, false);
    ts_tensor *tv = make(1, 1, s.Tk, s.D, v, false), *o = NULL;
    CHECK_OK(ts_scaled_dot_product_attention(tq, tk, tv, true, 0.0, &o));
    if (o) {
        double *ref = calloc((size_t)n, sizeof(double));
        ref_attention(s, q, k, v, NULL, true, 0.25, 17, ref, NULL, NULL, NULL);
        float *h = host_f32(o);
        const double e = max_err(h, ref, 1, s.Tq, s.D, 17);
        printf("  causal rows of up to 4096 keys, D 16: out %.2g against float64\n", e);
        CHECK(e <= 1e-6);
        free(h);
        free(ref);
    }
    ts_tensor_release(o);
    ts_tensor_release(tq);
    ts_tensor_release(tk);
    ts_tensor_release(tv);
    free(q);
    free(k);
    free(v);
}

/* ---- bfloat16 ------------------------------------------------------------------------------------------ */
/* Under autocast: float32 leaves, a bfloat16 result, float32 gradients, all within bfloat16's rounding of
 * float64 (inputs rounded to 8 significant bits: scores off by ~|s| 2^-8, the output rounded once more). */
static void test_bf16_autocast(void) {
    const shape5 s = {2, 2, 100, 100, 32};
    const int64_t n = s.B * s.H * s.Tq * s.D;
    ts_rng rs;
    ts_rng_seed(&rs, 16);
    float *q = urand(&rs, n, -1, 1), *k = urand(&rs, n, -1, 1), *v = urand(&rs, n, -1, 1), *g = urand(&rs, n, -1, 1);
    for (int causal = 0; causal < 2; causal++) {
        ts_tensor *tq = make(s.B, s.H, s.Tq, s.D, q, true), *tk = make(s.B, s.H, s.Tk, s.D, k, true);
        ts_tensor *tv = make(s.B, s.H, s.Tk, s.D, v, true), *tg = make(s.B, s.H, s.Tq, s.D, g, false);
        ts_tensor *g16 = NULL, *o = NULL;
        CHECK_OK(ts_to_dtype(tg, TS_BF16, &g16));
        CHECK_OK(ts_set_autocast(TS_BF16));
        CHECK_OK(ts_scaled_dot_product_attention(tq, tk, tv, causal, 0.0, &o));
        CHECK_OK(ts_set_autocast(TS_F32));
        CHECK(o && ts_tensor_dtype(o) == TS_BF16);
        if (o && g16) {
            CHECK_OK(ts_backward(o, g16, false));
            float *gr = host_f32(g16); /* the gradient as fed: rounded to bfloat16 */
            double *ro = malloc(sizeof(double) * (size_t)n), *rg[3];
            for (int i = 0; i < 3; i++) rg[i] = malloc(sizeof(double) * (size_t)n);
            ref_attention(s, q, k, v, gr, causal, 1.0 / sqrt(32.0), 1, ro, rg[0], rg[1], rg[2]);
            float *ho = host_f32(o);
            double e[4] = {max_err(ho, ro, s.B * s.H, s.Tq, s.D, 1)};
            ts_tensor *leaf[3] = {tq, tk, tv};
            for (int i = 0; i < 3; i++) {
                const ts_tensor *gi = ts_tensor_grad(leaf[i]);
                CHECK(gi && ts_tensor_dtype(gi) == TS_F32);
                if (!gi) continue;
                float *hg = host_f32(gi);
                e[1 + i] = max_err(hg, rg[i], s.B * s.H, s.Tq, s.D, 1) / fmax(max_abs(rg[i], n), 1.0);
                free(hg);
            }
            printf("  bf16 autocast %s: out %.2g, gq %.2g, gk %.2g, gv %.2g against float64\n",
                   causal ? "causal" : "full", e[0], e[1], e[2], e[3]);
            CHECK(e[0] <= 8e-3 && e[1] <= 8e-3 && e[2] <= 8e-3 && e[3] <= 8e-3);
            free(ho);
            free(gr);
            free(ro);
            for (int i = 0; i < 3; i++) free(rg[i]);
        }
        ts_tensor_release(o);
        ts_tensor_release(g16);
        ts_tensor_release(tq);
        ts_tensor_release(tk);
        ts_tensor_release(tv);
        ts_tensor_release(tg);
    }
    free(q);
    free(k);
    free(v);
    free(g);
}


/* ---- against PyTorch ----------------------------------------------------------------------------------- */
/* Case `prefix`k of the golden file on our op (under autocast for "ac"): the largest differences from
 * torch's out (absolute) and gradients (relative to max(1, max |torch's|)). false when the case is absent. */
static bool golden_case(const char *prefix, int c, double *diff) {
    const ts_tensor *cs = tg_getf(&golden, "%s%d/case", prefix, c), *sc = tg_getf(&golden, "%s%d/scale", prefix, c);
    if (!cs || !sc) return false;
    const int64_t *z = (const int64_t *)ts_tensor_data((ts_tensor *)cs);
    const int64_t B = z[0], H = z[1], Tq = z[2], Tk = z[3], D = z[4];
    const bool causal = z[5] != 0, ac = prefix[0] == 'a';
    const uint64_t base = 5000 + 16 * (uint64_t)c + (ac ? 1000 : 0);
    float *in[4] = {golden_gen(base, B * H * Tq * D), golden_gen(base + 1, B * H * Tk * D),
                    golden_gen(base + 2, B * H * Tk * D), golden_gen(base + 3, B * H * Tq * D)};
    ts_tensor *t[3] = {make(B, H, Tq, D, in[0], true), make(B, H, Tk, D, in[1], true), make(B, H, Tk, D, in[2], true)};
    ts_tensor *g = make(B, H, Tq, D, in[3], false), *g16 = NULL, *o = NULL;
    if (ac) CHECK_OK(ts_set_autocast(TS_BF16));
    CHECK_OK(ts_scaled_dot_product_attention(t[0], t[1], t[2], causal, ((const float *)ts_tensor_data((ts_tensor *)sc))[0],
                                             &o));
    CHECK_OK(ts_set_autocast(TS_F32));
    if (ac) CHECK_OK(ts_to_dtype(g, TS_BF16, &g16));
    if (o) CHECK_OK(ts_backward(o, ac ? g16 : g, false));
    const char *names[4] = {"out", "gq", "gk", "gv"};
    for (int i = 0; i < 4; i++) {
        const ts_tensor *want = tg_getf(&golden, "%s%d/%s", prefix, c, names[i]);
        const ts_tensor *got = i ? ts_tensor_grad(t[i - 1]) : o;
        CHECK(want && got && ts_tensor_numel(want) == ts_tensor_numel(got));
        diff[i] = NAN;
        if (!want || !got || ts_tensor_numel(want) != ts_tensor_numel(got)) continue;
        float *h = host_f32(got);
        const float *w = (const float *)ts_tensor_data((ts_tensor *)want);
        double d = 0, m = 1;
        for (int64_t j = 0; j < ts_tensor_numel(want); j++) {
            d = fmax(d, fabs((double)h[j] - w[j]));
            m = fmax(m, fabs((double)w[j]));
        }
        diff[i] = i ? d / m : d;
        free(h);
    }
    printf("  torch %s%d (B %lld H %lld Tq %lld Tk %lld D %lld %s): out %.2g, gq %.2g, gk %.2g, gv %.2g\n", prefix, c,
           (long long)B, (long long)H, (long long)Tq, (long long)Tk, (long long)D, causal ? "causal" : "full", diff[0],
           diff[1], diff[2], diff[3]);
    ts_tensor_release(o);
    ts_tensor_release(g);
    ts_tensor_release(g16);
    for (int i = 0; i < 3; i++) ts_tensor_release(t[i]);
    for (int i = 0; i < 4; i++) free(in[i]);
    return true;
}

static void test_vs_torch(void) {
    if (!load_golden()) return;
    const ts_tensor *top = tg_get(&golden, "causal_top_left");
    CHECK(top && ((const int32_t *)ts_tensor_data((ts_tensor *)top))[0] == 1); /* torch's is_causal: top-left */
    int n = 0;
    double d[4];
    for (int c = 0; golden_case("c", c, d); c++, n++) CHECK(d[0] <= 1e-6 && d[1] <= 4e-6 && d[2] <= 4e-6 && d[3] <= 4e-6);
    CHECK(n == 6);
}

/* bfloat16 autocast beside torch.autocast's: both round q, k, v and the result to bfloat16; torch's CPU
 * kernel also rounds the weights P to bfloat16 before P v, ours keeps them in float32. */
static void test_autocast_vs_torch(void) {
    if (!load_golden()) return;
    int n = 0;
    double d[4];
    for (int c = 0; golden_case("ac", c, d); c++, n++) CHECK(d[0] <= 1e-2 && d[1] <= 1e-2 && d[2] <= 1e-2 && d[3] <= 1e-2);
    CHECK(n == 2);
}

/* ---- arguments ----------------------------------------------------------------------------------------- */
/* A view of t (B, T, H, D) as (B, H, T, D) over the same storage (non-contiguous), made by hand. */
static ts_tensor *heads_view(ts_tensor *t) {
    ts_tensor *v = NULL;
    CHECK_OK(ts_tensor_detach(t, &v));
    if (!v) abort();
    int64_t sh = v->shape[1], st = v->stride[1];
    v->shape[1] = v->shape[2];
    v->stride[1] = v->stride[2];
    v->shape[2] = sh;
    v->stride[2] = st;
    return v;
}

static void test_bad_input(void) {
    ts_rng rs;
    ts_rng_seed(&rs, 3);
    float *d = urand(&rs, 4096, -1, 1);
    ts_tensor *q = make(2, 3, 8, 16, d, false), *k = make(2, 3, 10, 16, d, false), *v = make(2, 3, 10, 16, d, false);
    ts_tensor *o = NULL, *x = NULL;
    CHECK_OK(ts_tensor_from_data(ts_device_cpu(), TS_F32, 3, (int64_t[]){2, 8, 16}, d, &x));
    CHECK_STATUS(ts_scaled_dot_product_attention(x, k, v, false, 0.0, &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("q has shape [2, 8, 16], expected 4 dimensions");
    ts_tensor_release(x);
    x = make(2, 3, 10, 8, d, false); /* head dim 8 against q's 16 */
    CHECK_STATUS(ts_scaled_dot_product_attention(q, x, v, false, 0.0, &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("k [2, 3, 10, 8]");
    CHECK_ERR_MENTIONS("head dims");
    ts_tensor_release(x);
    x = make(2, 2, 10, 16, d, false); /* 2 heads against 3 */
    CHECK_STATUS(ts_scaled_dot_product_attention(q, k, x, true, 0.0, &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("v [2, 2, 10, 16]");
    CHECK_ERR_MENTIONS("batch and head dims");
    ts_tensor_release(x);
    x = make(2, 3, 9, 16, d, false); /* 9 values for 10 keys */
    CHECK_STATUS(ts_scaled_dot_product_attention(q, k, x, false, 0.0, &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("different numbers of keys");
    ts_tensor_release(x);
    x = make(2, 3, 0, 16, d, false);
    CHECK_STATUS(ts_scaled_dot_product_attention(q, x, x, false, 0.0, &o), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("no keys");
    ts_tensor_release(x);
    CHECK_OK(ts_tensor_zeros(ts_device_cpu(), TS_I64, 4, (int64_t[]){2, 3, 10, 16}, &x));
    CHECK_STATUS(ts_scaled_dot_product_attention(q, x, v, false, 0.0, &o), TS_ERR_DTYPE);
    CHECK_ERR_MENTIONS("k has dtype int64");
    ts_tensor_release(x);
    CHECK_OK(ts_to_dtype(k, TS_BF16, &x)); /* bfloat16 k beside float32 q and v */
    CHECK_STATUS(ts_scaled_dot_product_attention(q, x, v, false, 0.0, &o), TS_ERR_DTYPE);
    CHECK_ERR_MENTIONS("one dtype");
    ts_tensor_release(x);
    CHECK_STATUS(ts_scaled_dot_product_attention(q, k, v, false, INFINITY, &o), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_scaled_dot_product_attention(q, NULL, v, false, 0.0, &o), TS_ERR_INVALID_ARG);
    CHECK(o == NULL);
    /* an empty batch is fine */
    x = make(0, 3, 8, 16, d, false);
    ts_tensor *xk = make(0, 3, 10, 16, d, false);
    CHECK_OK(ts_scaled_dot_product_attention(x, xk, xk, true, 0.0, &o));
    CHECK(o && ts_tensor_numel(o) == 0);
    ts_tensor_release(o);
    ts_tensor_release(x);
    ts_tensor_release(xk);
    ts_tensor_release(q);
    ts_tensor_release(k);
    ts_tensor_release(v);
    free(d);
}

/* Non-contiguous inputs (the (B, T, H, D) layout seen as (B, H, T, D)) give what their contiguous copies give,
 * bit for bit, gradients included. */
static void test_noncontiguous(void) {
    const int64_t B = 2, T = 70, H = 3, D = 16, n = B * T * H * D;
    ts_rng rs;
    ts_rng_seed(&rs, 5);
    float *a = urand(&rs, 3 * n, -1, 1), *g = urand(&rs, n, -1, 1);
    ts_tensor *base[3], *view[3], *copy[3], *o1 = NULL, *o2 = NULL;
    for (int i = 0; i < 3; i++) {
        base[i] = make(B, T, H, D, a + i * n, false); /* (B, T, H, D) */
        view[i] = heads_view(base[i]);
        ts_tensor_set_requires_grad(view[i], true);
        CHECK(!ts_tensor_is_contiguous(view[i]));
        CHECK_OK(ts_transpose(base[i], 1, 2, &copy[i]));
        ts_tensor *c = NULL;
        CHECK_OK(ts_tensor_detach(copy[i], &c));
        ts_tensor_release(copy[i]);
        copy[i] = c;
        ts_tensor_set_requires_grad(copy[i], true);
    }
    ts_tensor *tg = make(B, H, T, D, g, false);
    CHECK_OK(ts_scaled_dot_product_attention(view[0], view[1], view[2], true, 0.0, &o1));
    CHECK_OK(ts_scaled_dot_product_attention(copy[0], copy[1], copy[2], true, 0.0, &o2));
    if (o1 && o2) {
        CHECK(memcmp(ts_tensor_data(o1), ts_tensor_data(o2), ts_tensor_nbytes(o2)) == 0);
        CHECK_OK(ts_backward(o1, tg, false));
        CHECK_OK(ts_backward(o2, tg, false));
        for (int i = 0; i < 3; i++) {
            ts_tensor *g1 = ts_tensor_grad(view[i]), *g2 = ts_tensor_grad(copy[i]), *g1c = NULL;
            CHECK(g1 && g2);
            if (!g1 || !g2) continue;
            CHECK_OK(ts_tensor_clone(g1, &g1c)); /* (contiguous, whatever layout the gradient has) */
            CHECK(g1c && memcmp(ts_tensor_data(g1c), ts_tensor_data(g2), ts_tensor_nbytes(g2)) == 0);
            ts_tensor_release(g1c);
        }
    }
    ts_tensor_release(o1);
    ts_tensor_release(o2);
    ts_tensor_release(tg);
    for (int i = 0; i < 3; i++) {
        ts_tensor_release(base[i]);
        ts_tensor_release(view[i]);
        ts_tensor_release(copy[i]);
    }
    free(a);
    free(g);
}

/* ---- other devices ------------------------------------------------------------------------------------- */
/* On TS_TEST_DEVICE (the CPU without it): a device with attention kernels gives the CPU's result and
 * gradients within float32 roundings; one without (CUDA for now) refuses with TS_ERR_UNSUPPORTED naming it. */
/* One case on the test device against the same inputs on the CPU: output and the three gradients. */
static void device_case(ts_device *dev, int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t D, bool causal) {
    const int64_t nq = B * H * Tq * D, nk = B * H * Tk * D, n[4] = {nq, nk, nk, nq}, T[4] = {Tq, Tk, Tk, Tq};
    ts_rng rs;
    ts_rng_seed(&rs, 11 + (uint64_t)(Tq + 7 * D));
    ts_tensor *c[4], *d[4], *oc = NULL, *od = NULL;
    for (int i = 0; i < 4; i++) {
        float *a = urand(&rs, n[i], -1, 1);
        c[i] = make(B, H, T[i], D, a, i < 3);
        free(a);
        CHECK_OK(ts_to_device(c[i], dev, &d[i]));
        ts_tensor *leaf = NULL; /* a leaf of its own on the device */
        CHECK_OK(ts_tensor_detach(d[i], &leaf));
        ts_tensor_release(d[i]);
        d[i] = leaf;
        if (d[i]) ts_tensor_set_requires_grad(d[i], i < 3);
    }
    CHECK_OK(ts_scaled_dot_product_attention(c[0], c[1], c[2], causal, 0.0, &oc));
    if (oc) CHECK_OK(ts_backward(oc, c[3], false));
    if (!dev->k_misc->attention_forward) {
        CHECK_STATUS(ts_scaled_dot_product_attention(d[0], d[1], d[2], causal, 0.0, &od), TS_ERR_UNSUPPORTED);
        CHECK_ERR_MENTIONS(dev->name);
        printf("  %s: %s\n", dev->name, ts_last_error());
    } else {
        CHECK_OK(ts_scaled_dot_product_attention(d[0], d[1], d[2], causal, 0.0, &od));
        if (od) CHECK_OK(ts_backward(od, d[3], false));
        const ts_tensor *pairs[4][2] = {{oc, od},
                                        {ts_tensor_grad(c[0]), ts_tensor_grad(d[0])},
                                        {ts_tensor_grad(c[1]), ts_tensor_grad(d[1])},
                                        {ts_tensor_grad(c[2]), ts_tensor_grad(d[2])}};
        for (int i = 0; i < 4; i++) {
            CHECK(pairs[i][0] && pairs[i][1]);
            if (!pairs[i][0] || !pairs[i][1]) continue;
            float *x = host_f32(pairs[i][0]), *y = host_f32(pairs[i][1]);
            double w = 0, top = 1.0; /* relative to the largest value, absolute below 1 */
            for (int64_t j = 0; j < ts_tensor_numel(pairs[i][0]); j++) {
                w = fmax(w, fabs((double)x[j] - y[j]));
                top = fmax(top, fabs((double)x[j]));
            }
            printf("  %s, Tq %lld Tk %lld D %lld%s, against the CPU: %s max difference %.2g (largest value %.3g)\n",
                   dev->name, (long long)Tq, (long long)Tk, (long long)D, causal ? " causal" : "",
                   i ? "gradient" : "output", w, top);
            CHECK(w <= 2e-6 * top);
            free(x);
            free(y);
        }
    }
    ts_tensor_release(oc);
    ts_tensor_release(od);
    for (int i = 0; i < 4; i++) {
        ts_tensor_release(c[i]);
        ts_tensor_release(d[i]);
    }
}

/* The test device's kernels (TS_TEST_DEVICE: cuda:0 on a GPU machine) against the CPU's: causal and not,
 * Tq != Tk, odd lengths, head dims below, at and between the CUDA kernel's 32-column steps; or, on a device
 * without attention kernels, the refusal naming it. */
static void test_device_kernels(void) {
    ts_device *dev = tu_test_device();
    device_case(dev, 1, 2, 70, 70, 16, true);
    device_case(dev, 2, 3, 33, 70, 64, false);
    device_case(dev, 1, 2, 129, 129, 100, true);
    device_case(dev, 1, 1, 5, 40, 256, true);
    if (dev->k_misc->attention_forward && ts_device_type_of(dev) == TS_DEVICE_CUDA) {
        ts_tensor *q = NULL, *o = NULL; /* the CUDA kernel's head dims end at 256 */
        CHECK_OK(ts_tensor_zeros(dev, TS_F32, 4, (int64_t[]){1, 1, 4, 257}, &q));
        CHECK_STATUS(ts_scaled_dot_product_attention(q, q, q, true, 0.0, &o), TS_ERR_UNSUPPORTED);
        CHECK_ERR_MENTIONS("head dim 257");
        ts_tensor_release(q);
    }
}

/* ---- memory ------------------------------------------------------------------------------------------- */
/* Peak bytes the CPU device held during a forward + backward at T beyond what it held before (the inputs);
 * the result and gradients included. */
static size_t fwd_bwd_peak(int64_t T, size_t *inputs) {
    const int64_t B = 1, H = 4, D = 32, n = B * H * T * D;
    ts_rng rs;
    ts_rng_seed(&rs, (uint64_t)T);
    float *a = urand(&rs, n, -1, 1);
    ts_tensor *q = make(B, H, T, D, a, true), *k = make(B, H, T, D, a, true), *v = make(B, H, T, D, a, true);
    ts_tensor *g = make(B, H, T, D, a, false), *o = NULL;
    ts_device *dev = ts_device_cpu();
    const size_t before = ts_device_memory_allocated(dev);
    ts_device_memory_reset_peak(dev);
    CHECK_OK(ts_scaled_dot_product_attention(q, k, v, true, 0.0, &o));
    if (o) CHECK_OK(ts_backward(o, g, false));
    const size_t peak = ts_device_memory_peak(dev) - before;
    *inputs = 4 * (size_t)n * sizeof(float);
    ts_tensor_release(o);
    ts_tensor_release(q);
    ts_tensor_release(k);
    ts_tensor_release(v);
    ts_tensor_release(g);
    free(a);
    return peak;
}

static void test_memory_linear(void) {
    size_t in1, in2;
    const size_t p1 = fwd_bwd_peak(1024, &in1), p2 = fwd_bwd_peak(2048, &in2);
    const double tt = 4.0 * 2048 * 2048 * sizeof(float); /* one (B H, T, T) float matrix at T = 2048 */
    printf("  forward + backward peak beyond the inputs: %.2f MiB at T 1024, %.2f MiB at T 2048 (x%.2f); one T x T "
           "score matrix per head at 2048 would be %.0f MiB\n",
           p1 / 1048576.0, p2 / 1048576.0, (double)p2 / (double)p1, tt / 1048576.0);
    CHECK(p1 > 0 && (double)p2 <= 2.1 * (double)p1);
    CHECK((double)p2 < 0.25 * tt);
}

TU_MAIN(T(test_vs_float64), T(test_cross_lengths), T(test_vs_torch), T(test_autocast_vs_torch), T(test_close_logits), T(test_equal_scores), T(test_long_rows),
        T(test_bf16_autocast), T(test_bad_input), T(test_noncontiguous), T(test_device_kernels),
        T(test_memory_linear))
