/*
 * tests/test_softmax.c — the softmax family (softmax, log_softmax, cross-entropy: one row
 * reduction and device/k_elem.h's formulas) against float64 at the edges, where a naive
 * formula fails while PyTorch's does not:
 *  - large, close logits (1e6 + k/16): x - (m + log s) in float loses up to 0.03; ours stays
 *    within a few ulp of the float64 result, forward and backward, contiguous rows and strided
 *    ones (the dim is not the last);
 *  - long rows (2^20 elements): the sums are float64 (eight accumulators per row on the CPU):
 *    errors 1.3e-11 (softmax) and 2e-6 (log_softmax), where torch 1.13's float32 CPU kernels are
 *    off by 1.7e-9 and 1.1e-4 on such a row;
 *  - -inf entries: softmax 0 and log_softmax -inf there, the rest exact; an all -inf row, or an
 *    +inf entry, NaN as PyTorch (torch 1.13: softmax([-inf, -inf]) = softmax([inf, 0]) = [nan, nan]);
 *    cross-entropy of a -inf target is +inf with PyTorch's gradient (softmax - onehot).
 * The reference is computed here in double from the same float inputs. Runs on TS_TEST_DEVICE.
 */
#include "test_util.h"

#include <math.h>

static ts_device *dev;

/* x (rows, n) on the test device, from host values. */
static ts_tensor *on_dev(int ndim, const int64_t *shape, const float *v) {
    ts_tensor *t = NULL;
    if (ts_tensor_from_data(dev, TS_F32, ndim, shape, v, &t) != TS_OK) {
        fprintf(stderr, "on_dev: %s\n", ts_last_error());
        abort();
    }
    return t;
}

static float *to_host(const ts_tensor *t) {
    size_t n = (size_t)ts_tensor_numel(t);
    float *h = malloc(n * sizeof *h + 1);
    if (!h || ts_tensor_to_host(t, h, n * sizeof *h) != TS_OK) abort();
    return h;
}

/* The float64 reference of one row of n at stride st: max m and s = sum exp(x - m). */
static void ref_stats(const float *x, int64_t n, int64_t st, double *m, double *s) {
    *m = -INFINITY;
    for (int64_t c = 0; c < n; c++) *m = fmax(*m, x[c * st]);
    *s = 0;
    for (int64_t c = 0; c < n; c++) *s += exp((double)x[c * st] - *m);
}

/* Largest |ours - reference| of softmax (log = false) or log_softmax over rows of n at stride st
 * (rows x inner layout: row r starts at (r / inner) * n * inner + r % inner). */
static double ref_err(const float *x, const float *y, int64_t outer, int64_t n, int64_t inner, bool log_) {
    double worst = 0;
    for (int64_t r = 0; r < outer * inner; r++) {
        const int64_t base = (r / inner) * n * inner + r % inner;
        double m, s;
        ref_stats(x + base, n, inner, &m, &s);
        for (int64_t c = 0; c < n; c++) {
            const double xc = x[base + c * inner];
            const double want = log_ ? (xc - m) - log(s) : exp(xc - m) / s;
            worst = fmax(worst, fabs(y[base + c * inner] - want));
        }
    }
    return worst;
}

/* softmax and log_softmax of x (outer, n, inner) over dim 1: errors against float64, and the
 * backward of sum(w * y) for w = 1, 2, 3, ... against float64. */
static void check_family(const float *xv, int64_t outer, int64_t n, int64_t inner, double tol_log, double tol_soft,
                         double tol_grad, const char *what) {
    const int64_t shape[3] = {outer, n, inner};
    for (int log_ = 0; log_ < 2; log_++) {
        ts_tensor *x = on_dev(3, shape, xv), *y = NULL;
        ts_tensor_set_requires_grad(x, true);
        CHECK_OK(log_ ? ts_log_softmax(x, 1, &y) : ts_softmax(x, 1, &y));
        if (!y) {
            ts_tensor_release(x);
            continue;
        }
        float *yh = to_host(y);
        double err = ref_err(xv, yh, outer, n, inner, log_);
        printf("  %s %s: max error %.3g against float64\n", what, log_ ? "log_softmax" : "softmax", err);
        CHECK(err <= (log_ ? tol_log : tol_soft));
        /* backward: gx = dy/dx^T w with w_c = (c % 7) + 1 along the row */
        const int64_t total = outer * n * inner;
        float *wv = malloc((size_t)total * sizeof *wv);
        for (int64_t k = 0; k < total; k++) wv[k] = (float)((k / inner) % n % 7 + 1);
        ts_tensor *w = on_dev(3, shape, wv);
        CHECK_OK(ts_backward(y, w, false));
        ts_tensor *g = ts_tensor_grad(x);
        CHECK(g != NULL);
        if (g) {
            float *gh = to_host(g);
            double gerr = 0;
            for (int64_t r = 0; r < outer * inner; r++) {
                const int64_t base = (r / inner) * n * inner + r % inner;
                double m, s, dot = 0, wsum = 0;
                ref_stats(xv + base, n, inner, &m, &s);
                for (int64_t c = 0; c < n; c++) {
                    const double p = exp((double)xv[base + c * inner] - m) / s;
                    dot += p * wv[base + c * inner];
                    wsum += wv[base + c * inner];
                }
                for (int64_t c = 0; c < n; c++) {
                    const int64_t k = base + c * inner;
                    const double p = exp((double)xv[k] - m) / s;
                    const double want = log_ ? wv[k] - p * wsum : p * (wv[k] - dot);
                    gerr = fmax(gerr, fabs(gh[k] - want));
                }
            }
            printf("  %s %s backward: max error %.3g against float64\n", what, log_ ? "log_softmax" : "softmax", gerr);
            CHECK(gerr <= tol_grad);
            free(gh);
        }
        free(wv);
        free(yh);
        ts_tensor_release(w);
        ts_tensor_release(y);
        ts_tensor_release(x);
    }
}

/* 1e6 + k/16: every logit exact in float, the row's spread 2.25 */
static void test_large_close_logits(void) {
    enum { N = 1000 };
    float *x = malloc(3 * N * sizeof *x);
    for (int i = 0; i < 3 * N; i++) x[i] = 1e6f + (float)((i * 7) % 37) * 0.0625f;
    /* log_softmax values near -7 (ulp 4.8e-7); the naive float formula is off by up to 0.03 here */
    check_family(x, 3, N, 1, 4e-6, 1e-8, 2e-5, "rows of 1e6 + k/16 (contiguous)");
    check_family(x, 1, N, 3, 4e-6, 1e-8, 2e-5, "rows of 1e6 + k/16 (strided)");
    free(x);
}

static void test_long_rows(void) {
    const int64_t n = (int64_t)1 << 20;
    float *x = malloc((size_t)n * sizeof *x);
    ts_rng r;
    ts_rng_seed(&r, 7);
    ts_tensor *t = tu_rand(&r, 1, &n, -8.0f, 8.0f, false);
    memcpy(x, ts_tensor_data_f32(t), (size_t)n * sizeof *x);
    ts_tensor_release(t);
    /* softmax values up to 1.5e-5 (ulp 9e-13), whose x - m (up to 16) rounds in float: 16 ulp; log_softmax
     * near -15 (ulp 9.5e-7). torch 1.13's float32 CPU kernels on such a row: 1.7e-9 and 1.1e-4. */
    check_family(x, 1, n, 1, 8e-6, 3e-11, 1.5e-4, "one row of 2^20");
    /* the probabilities sum to one */
    ts_tensor *xt = on_dev(1, &n, x), *y = NULL;
    CHECK_OK(ts_softmax(xt, 0, &y));
    if (y) {
        float *yh = to_host(y);
        double s = 0;
        for (int64_t i = 0; i < n; i++) s += yh[i];
        printf("  softmax of 2^20 sums to 1 %+.3g\n", s - 1.0);
        CHECK(fabs(s - 1.0) < 1e-5);
        free(yh);
    }
    ts_tensor_release(y);
    ts_tensor_release(xt);
    free(x);
}

/* One row through softmax and log_softmax; results to the caller's arrays. */
static void row_both(const float *v, int64_t n, float *soft, float *logsoft) {
    ts_tensor *x = on_dev(1, &n, v), *a = NULL, *b = NULL;
    CHECK_OK(ts_softmax(x, 0, &a));
    CHECK_OK(ts_log_softmax(x, 0, &b));
    if (a && b) {
        CHECK_OK(ts_tensor_to_host(a, soft, (size_t)n * sizeof(float)));
        CHECK_OK(ts_tensor_to_host(b, logsoft, (size_t)n * sizeof(float)));
    }
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(x);
}

static void test_infinities(void) {
    float s[4], l[4];
    row_both((const float[]){-INFINITY, 0.0f, 1.0f, -INFINITY}, 4, s, l);
    /* torch 1.13: [0, 0.26894143, 0.7310586, 0] and [-inf, -1.3132616, -0.31326166, -inf] */
    CHECK(s[0] == 0.0f && s[3] == 0.0f && isinf(l[0]) && l[0] < 0 && isinf(l[3]) && l[3] < 0);
    CHECK_NEAR(s[1], 0.2689414213699951, 1e-7);
    CHECK_NEAR(s[2], 0.7310585786300049, 1e-7);
    CHECK_NEAR(l[1], -1.3132616875182228, 2e-7);
    CHECK_NEAR(l[2], -0.3132616875182228, 1e-7);
    row_both((const float[]){-INFINITY, -INFINITY}, 2, s, l); /* all -inf: NaN, as PyTorch */
    CHECK(isnan(s[0]) && isnan(s[1]) && isnan(l[0]) && isnan(l[1]));
    row_both((const float[]){INFINITY, 0.0f}, 2, s, l); /* +inf: NaN, as PyTorch */
    CHECK(isnan(s[0]) && isnan(s[1]) && isnan(l[0]) && isnan(l[1]));
    row_both((const float[]){NAN, 0.0f}, 2, s, l);
    CHECK(isnan(s[0]) && isnan(s[1]) && isnan(l[0]) && isnan(l[1]));

    /* cross-entropy beside a -inf logit (torch: 1.3132616, grad [0, -0.7310586, 0.7310586]) and on one
     * (torch: inf, grad [-1, 0.26894143, 0.7310586]) */
    const int64_t shape[2] = {1, 3};
    for (int tgt = 1; tgt >= 0; tgt--) {
        ts_tensor *x = on_dev(2, shape, (const float[]){-INFINITY, 0.0f, 1.0f}), *t = NULL, *loss = NULL;
        ts_tensor_set_requires_grad(x, true);
        const int64_t tv = tgt;
        CHECK_OK(ts_tensor_from_data(dev, TS_I64, 1, shape, &tv, &t));
        CHECK_OK(ts_cross_entropy(x, t, 0.0f, &loss));
        if (loss) {
            float lv = 0, g[3] = {0};
            CHECK_OK(ts_tensor_to_host(loss, &lv, sizeof lv));
            CHECK_OK(ts_backward(loss, NULL, false));
            if (ts_tensor_grad(x)) CHECK_OK(ts_tensor_to_host(ts_tensor_grad(x), g, sizeof g));
            if (tgt == 1) {
                CHECK_NEAR(lv, 1.3132616875182228, 2e-7);
                CHECK(g[0] == 0.0f);
                CHECK_NEAR(g[1], -0.7310585786300049, 1e-7);
            } else {
                CHECK(isinf(lv) && lv > 0);
                CHECK(g[0] == -1.0f);
                CHECK_NEAR(g[1], 0.2689414213699951, 1e-7);
            }
            CHECK_NEAR(g[2], 0.7310585786300049, 1e-7);
        }
        ts_tensor_release(loss);
        ts_tensor_release(t);
        ts_tensor_release(x);
    }
}

/* Cross-entropy (mean, and with label smoothing and class weights) of logits near 1e6 against float64:
 * loss = mean_i [(1 - eps) w[t] (lse - x_t) + eps / C sum_c w[c] (lse - x_c)] / mean weight, and its
 * gradient (softmax - targets) scaled. */
static void test_cross_entropy_large_logits(void) {
    enum { B = 4, C = 50 };
    float x[B * C], w[C];
    int64_t tv[B] = {3, 17, 49, 0};
    for (int i = 0; i < B * C; i++) x[i] = 1e6f + (float)((i * 11) % 23) * 0.0625f;
    for (int c = 0; c < C; c++) w[c] = 0.5f + (float)(c % 5) * 0.25f;
    const int64_t shape[2] = {B, C}, bshape[1] = {B}, cshape[1] = {C};
    for (int variant = 0; variant < 2; variant++) {
        const float eps = variant ? 0.1f : 0.0f;
        ts_tensor *xt = on_dev(2, shape, x), *t = NULL, *wt = on_dev(1, cshape, w), *loss = NULL;
        ts_tensor_set_requires_grad(xt, true);
        CHECK_OK(ts_tensor_from_data(dev, TS_I64, 1, bshape, tv, &t));
        ts_cross_entropy_opts o = TS_CROSS_ENTROPY_OPTS_INIT;
        o.label_smoothing = eps;
        if (variant) o.weight = wt;
        CHECK_OK(ts_cross_entropy_ex(xt, t, &o, &loss));
        /* reference */
        double total = 0, wsum = 0, grad[B * C];
        for (int i = 0; i < B; i++) {
            double m, s, wall = 0;
            ref_stats(x + i * C, C, 1, &m, &s);
            const double lse = m + log(s), wti = variant ? w[tv[i]] : 1.0;
            double li = (1 - eps) * wti * (lse - x[i * C + tv[i]]), sm = 0;
            for (int c = 0; c < C; c++) {
                const double wc = variant ? w[c] : 1.0;
                sm += wc * (lse - x[i * C + c]);
                wall += wc;
            }
            total += li + eps * sm / C;
            wsum += wti;
            for (int c = 0; c < C; c++) {
                const double p = exp(x[i * C + c] - lse), wc = variant ? w[c] : 1.0;
                grad[i * C + c] = ((1 - eps) * wti + eps / C * wall) * p - eps / C * wc - (c == tv[i] ? (1 - eps) * wti : 0);
            }
        }
        const double want = total / wsum;
        if (loss) {
            float lv = 0, g[B * C];
            CHECK_OK(ts_tensor_to_host(loss, &lv, sizeof lv));
            printf("  cross-entropy of logits near 1e6 (%s): %.9g, float64 %.9g\n",
                   variant ? "label smoothing 0.1, class weights" : "plain", lv, want);
            CHECK(fabs(lv - want) <= 4e-7 * fabs(want) + 1e-6);
            CHECK_OK(ts_backward(loss, NULL, false));
            if (ts_tensor_grad(xt)) {
                CHECK_OK(ts_tensor_to_host(ts_tensor_grad(xt), g, sizeof g));
                double gerr = 0;
                for (int k = 0; k < B * C; k++) gerr = fmax(gerr, fabs(g[k] - grad[k] / wsum));
                printf("  its gradient: max error %.3g against float64\n", gerr);
                CHECK(gerr <= 2e-7);
            }
        }
        ts_tensor_release(loss);
        ts_tensor_release(t);
        ts_tensor_release(wt);
        ts_tensor_release(xt);
    }
}

int main(int argc, char **argv) {
    dev = tu_test_device();
    static const tu_test tests[] = {T(test_large_close_logits), T(test_long_rows), T(test_infinities),
                                    T(test_cross_entropy_large_logits)};
    return tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
