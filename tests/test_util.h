/*
 * tests/test_util.h — a tiny test harness: TEST() functions registered in a
 * table, CHECK macros that report file:line and continue, a finite-difference
 * gradient checker, and helpers to make tensors. Header-only; each test_*.c
 * is one ctest executable. Exit 77 means "skipped" to ctest.
 */
#ifndef TS_TEST_UTIL_H
#define TS_TEST_UTIL_H

#include "tessera.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tu_failures;
static int tu_checks;

#define CHECK(cond)                                                                    \
    do {                                                                               \
        tu_checks++;                                                                   \
        if (!(cond)) {                                                                 \
            tu_failures++;                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);   \
        }                                                                              \
    } while (0)

#define CHECK_OK(expr)                                                                                  \
    do {                                                                                                \
        tu_checks++;                                                                                    \
        ts_status tu_s = (expr);                                                                        \
        if (tu_s != TS_OK) {                                                                            \
            tu_failures++;                                                                              \
            fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #expr, ts_status_name(tu_s), \
                    ts_last_error());                                                                   \
        }                                                                                               \
    } while (0)

#define CHECK_STATUS(expr, want)                                                                          \
    do {                                                                                                  \
        tu_checks++;                                                                                      \
        ts_status tu_s = (expr);                                                                          \
        if (tu_s != (want)) {                                                                             \
            tu_failures++;                                                                                \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s (%s)\n", __FILE__, __LINE__, #expr,       \
                    ts_status_name(tu_s), ts_status_name(want), ts_last_error());                         \
        }                                                                                                 \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                              \
    do {                                                                                                   \
        tu_checks++;                                                                                       \
        double tu_a = (a), tu_b = (b);                                                                     \
        if (!(fabs(tu_a - tu_b) <= (tol))) {                                                               \
            tu_failures++;                                                                                 \
            fprintf(stderr, "%s:%d: %s = %.9g, %s = %.9g, differ by %.3g > %.3g\n", __FILE__, __LINE__, #a, \
                    tu_a, #b, tu_b, fabs(tu_a - tu_b), (double)(tol));                                     \
        }                                                                                                  \
    } while (0)

/* The error message must mention `needle`. */
#define CHECK_ERR_MENTIONS(needle)                                                                          \
    do {                                                                                                    \
        tu_checks++;                                                                                        \
        if (!strstr(ts_last_error(), (needle))) {                                                           \
            tu_failures++;                                                                                  \
            fprintf(stderr, "%s:%d: error '%s' does not mention '%s'\n", __FILE__, __LINE__, ts_last_error(), \
                    (needle));                                                                              \
        }                                                                                                   \
    } while (0)

typedef void (*tu_test_fn)(void);
typedef struct {
    const char *name;
    tu_test_fn fn;
} tu_test;

/* Runs the tests named on the command line (or all), prints a summary and
 * returns the process exit status. */
static inline int tu_run(const tu_test *tests, int n, int argc, char **argv) {
    int failed_tests = 0, ran = 0;
    for (int i = 0; i < n; i++) {
        if (argc > 1) {
            int want = 0;
            for (int a = 1; a < argc; a++) want |= strcmp(argv[a], tests[i].name) == 0;
            if (!want) continue;
        }
        int before = tu_failures;
        double t0 = ts_time_now();
        tests[i].fn();
        ran++;
        int bad = tu_failures != before;
        failed_tests += bad;
        fprintf(stderr, "[%s] %s (%.2fs)\n", bad ? "FAIL" : " ok ", tests[i].name, ts_time_now() - t0);
    }
    printf("%d passed, %d failed\n", ran - failed_tests, failed_tests);
    return failed_tests ? 1 : 0;
}

#define TU_MAIN(...)                                                        \
    int main(int argc, char **argv) {                                       \
        static const tu_test tests[] = {__VA_ARGS__};                       \
        return tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv); \
    }
#define T(fn) {#fn, fn}

/* ---- tensor helpers ---------------------------------------------------------------- */
static inline ts_tensor *tu_tensor(int ndim, const int64_t *shape, const float *data) {
    ts_tensor *t = NULL;
    if (ts_tensor_from_data(ts_device_cpu(), TS_F32, ndim, shape, data, &t) != TS_OK) {
        fprintf(stderr, "tu_tensor: %s\n", ts_last_error());
        abort();
    }
    return t;
}

/* A tensor with values uniform in [lo, hi) from a seeded generator. */
static inline ts_tensor *tu_rand(ts_rng *r, int ndim, const int64_t *shape, float lo, float hi, bool requires_grad) {
    ts_tensor *t = NULL;
    if (ts_tensor_empty(ts_device_cpu(), TS_F32, ndim, shape, &t) != TS_OK ||
        ts_tensor_uniform_(t, lo, hi, r) != TS_OK) {
        fprintf(stderr, "tu_rand: %s\n", ts_last_error());
        abort();
    }
    ts_tensor_set_requires_grad(t, requires_grad);
    return t;
}

static inline double tu_max_abs_diff(ts_tensor *a, const float *b) {
    double m = 0;
    const float *p = ts_tensor_data_f32(a);
    for (int64_t i = 0; i < ts_tensor_numel(a); i++) m = fmax(m, fabs((double)p[i] - b[i]));
    return m;
}

/* ---- a per-process temporary directory ------------------------------------------------ */
/* The device a test runs on: TS_TEST_DEVICE (e.g. cuda:0; "cpu" when unset). A device this
 * machine cannot give (no GPU, a Tessera built without CUDA) ends the test as skipped: exit status 77
 * with the reason on stderr. */
static inline ts_device *tu_test_device(void) {
    const char *name = getenv("TS_TEST_DEVICE");
    if (!name || !*name) return ts_device_cpu();
    ts_device *d = NULL;
    if (ts_device_get(name, &d) != TS_OK) {
        fprintf(stderr, "SKIP: TS_TEST_DEVICE=%s: %s\n", name, ts_last_error());
        exit(77);
    }
    return d;
}

static char tu_dir[256];

/* Creates /tmp/ts_test_XXXXXX on first use; tu_rm_tmpdir removes it. */
static inline const char *tu_tmpdir(void) {
    if (!tu_dir[0]) {
        snprintf(tu_dir, sizeof tu_dir, "/tmp/ts_test_XXXXXX");
        if (!mkdtemp(tu_dir)) {
            perror("mkdtemp");
            abort();
        }
    }
    return tu_dir;
}

static inline void tu_rm_tmpdir(void) {
    if (!tu_dir[0]) return;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tu_dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", tu_dir);
}

/* ---- finite-difference gradient check ------------------------------------------------ */
/* f computes one output from inputs; ctx carries op parameters. */
typedef ts_status (*tu_fwd_fn)(ts_tensor **inputs, void *ctx, ts_tensor **out);

/* L = sum(out * r) for a fixed random r. */
static inline double tu_weighted_sum(ts_tensor *out, const float *r) {
    const float *p = ts_tensor_data_f32(out);
    double s = 0;
    for (int64_t i = 0; i < ts_tensor_numel(out); i++) s += (double)p[i] * r[i];
    return s;
}

/* Compares the autograd gradient of L = sum(f(inputs) * r) with central
 * differences for every input that requires grad. Returns the worst
 * violation ratio |a - n| / (atol + rtol |n|) (<= 1 passes). */
static inline double tu_gradcheck(const char *name, tu_fwd_fn f, ts_tensor **in, int nin, void *ctx, double eps,
                                  double atol, double rtol) {
    ts_tensor *out = NULL;
    if (f(in, ctx, &out) != TS_OK) {
        fprintf(stderr, "gradcheck %s: forward failed: %s\n", name, ts_last_error());
        tu_failures++;
        return INFINITY;
    }
    int64_t n = ts_tensor_numel(out);
    float *r = malloc(sizeof(float) * (size_t)(n ? n : 1));
    ts_rng rng;
    ts_rng_seed(&rng, 1234);
    for (int64_t i = 0; i < n; i++) r[i] = (float)(ts_rng_uniform(&rng) * 2 - 1);
    for (int k = 0; k < nin; k++)
        if (in[k]) ts_tensor_zero_grad(in[k]);
    ts_tensor *gr = tu_tensor(ts_tensor_ndim(out), ts_tensor_shape(out), r);
    ts_status st = ts_backward(out, gr, false);
    ts_tensor_release(gr);
    ts_tensor_release(out);
    if (st != TS_OK) {
        fprintf(stderr, "gradcheck %s: backward failed: %s\n", name, ts_last_error());
        tu_failures++;
        free(r);
        return INFINITY;
    }
    double worst = 0;
    bool prev = ts_grad_set_enabled(false);
    for (int k = 0; k < nin; k++) {
        if (!in[k] || !ts_tensor_requires_grad(in[k])) continue;
        ts_tensor *g = ts_tensor_grad(in[k]);
        float *x = ts_tensor_data_f32(in[k]);
        for (int64_t i = 0; i < ts_tensor_numel(in[k]); i++) {
            float x0 = x[i];
            x[i] = x0 + (float)eps;
            ts_tensor *o1 = NULL, *o2 = NULL;
            f(in, ctx, &o1);
            x[i] = x0 - (float)eps;
            f(in, ctx, &o2);
            x[i] = x0;
            double num = (tu_weighted_sum(o1, r) - tu_weighted_sum(o2, r)) / (2 * eps);
            ts_tensor_release(o1);
            ts_tensor_release(o2);
            double ana = g ? ts_tensor_data_f32(g)[i] : 0.0;
            double v = fabs(ana - num) / (atol + rtol * fabs(num));
            if (v > 1 && v > worst)
                fprintf(stderr, "gradcheck %s: input %d element %lld: autograd %.6g, numeric %.6g\n", name, k,
                        (long long)i, ana, num);
            worst = fmax(worst, v);
        }
    }
    ts_grad_set_enabled(prev);
    free(r);
    tu_checks++;
    if (worst > 1) tu_failures++;
    return worst;
}

#endif
