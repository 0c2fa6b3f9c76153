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

TU_MAIN(T(test_vs_float64), T(test_cross_lengths))
