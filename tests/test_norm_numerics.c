/* Norm kernels at the edges against float64: layer_norm over rows of 1,024 .. 2^17 elements, group_norm
 * over groups of 2^15 .. 2^17, batchnorm2d (training) with channels at mean/std 1e4 and 1e5 and 224x224
 * planes — output, input gradient, weight and bias gradients, running statistics — each against a float64
 * reference computed here in C doubles from the same float32 inputs, and held to PyTorch float32's own
 * error on those inputs (tests/golden/norm_numerics.tsg, written by scripts/gen_norm_golden.py, which
 * draws the inputs with the generator norm_gen repeats bit for bit): every figure within twice torch's,
 * or a few float32 roundings of an O(1) result where torch's is smaller than that.
 *
 * What the kernels do for this (src/ops/cpu/norm.c, plane.c, spatial.c; the CUDA kernels mirror them):
 * sums in float lanes of at most 256 elements totalled in double (flat error as rows grow: the float
 * lanes over the whole row made layer_norm's error at 2^16 elements 1.45e-4), the variance about a
 * float mean (no E[x^2] - E[x]^2), and the affine maps centred: (x - mean) invstd w + b, never
 * x a + (b - mean a), whose x a is |mean| / std times the output and cancels (BatchNorm at mean
 * 1000, std 0.01 was 4.6e-3 off in its output and 0.02 in its input gradient).
 *
 * TS_TEST_DEVICE=cuda:0 runs the same cases on the CUDA kernels. */
#include "golden_io.h"
#include "test_util.h"

#define GOLDEN TS_TEST_DIR "/golden/norm_numerics.tsg"
#define EPS 1e-5
#define SQRT3 1.7320508075688772
#define FLOOR 1e-6 /* 16 float32 roundings of an O(1) result: the bar where torch's own error is below it */
#define FACTOR 2.0

static ts_device *dev;
static ts_tensor_list golden;

/* ---- the inputs: scripts/gen_norm_golden.py's gen() ------------------------------------------------ */
/* dst[i] = float32(centre[c] + half[c] * u(seed, i)) with c = (i / HW) % C (C = 1: one centre), u in [-1, 1)
 * from the top 24 bits of splitmix64((seed << 32) + i); the product rounded before the sum (no FMA). */
static void norm_gen(float *dst, int64_t n, uint64_t seed, const double *centre, const double *half, int64_t HW,
                     int64_t C) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t k = (int64_t)(tg_splitmix64((seed << 32) + (uint64_t)i) >> 40);
        const double u = (double)(k - (1 << 23)) * 0x1p-23;
        const int64_t c = C > 1 ? (i / HW) % C : 0;
        volatile double t = half[c] * u;
        dst[i] = (float)(centre[c] + t);
    }
}

static float *gen_alloc(int64_t n, uint64_t seed, double centre, double half) {
    float *p = malloc(sizeof(float) * (size_t)n);
    norm_gen(p, n, seed, &centre, &half, 1, 1);
    return p;
}

static ts_tensor *on_dev(int ndim, const int64_t *shape, const float *data, bool grad) {
    ts_tensor *t = NULL;
    CHECK_OK(ts_tensor_from_data(dev, TS_F32, ndim, shape, data, &t));
    if (t) ts_tensor_set_requires_grad(t, grad);
    return t;
}

/* t's values in a new host array */
static float *host(const ts_tensor *t) {
    const int64_t n = t ? ts_tensor_numel(t) : 0;
    float *p = calloc((size_t)(n ? n : 1), sizeof(float));
    if (t) CHECK_OK(ts_tensor_to_host(t, p, sizeof(float) * (size_t)n));
    return p;
}

/* max |a - b| over n, divided by max |b| when rel */
static double err(const float *a, const double *b, int64_t n, bool rel) {
    double d = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs(b[i]));
    }
    return rel ? (m > 0 ? d / m : d) : d;
}

/* The golden record name's torch figures; checks its case record against want (n values). */
static const float *torch_errs(const char *prefix, const int64_t *want, int n, int64_t nerr) {
    char name[64];
    snprintf(name, sizeof name, "%s/case", prefix);
    ts_tensor *c = tg_get(&golden, name);
    snprintf(name, sizeof name, "%s/torch_err", prefix);
    ts_tensor *e = tg_get(&golden, name);
    CHECK(c && e && ts_tensor_numel(c) == n && ts_tensor_numel(e) == nerr);
    if (!c || !e || ts_tensor_numel(c) != n || ts_tensor_numel(e) != nerr) return NULL;
    const int64_t *got = ts_tensor_data(c);
    for (int i = 0; i < n; i++) CHECK(got[i] == want[i]); /* the script's case list is this file's */
    return ts_tensor_data_f32(e);
}

/* Each figure within FACTOR x torch's or its floor (FLOOR, or floors[i] when given), and the first two (the
 * output, the input gradient) within FLOOR whatever torch's: flat in the row length and in |mean| / std.
 * Prints both. */
static void check_figures(const char *what, const double *got, const float *torch, const double *floors,
                          const char *const *names, int n) {
    printf("  %-34s", what);
    for (int i = 0; i < n; i++) {
        const double fl = floors ? fmax(floors[i], FLOOR) : FLOOR;
        const double bar = i < 2 ? FLOOR : fmax(FACTOR * (double)torch[i], fl);
        printf(" %s %.2g (torch %.2g)%s", names[i], got[i], (double)torch[i], got[i] <= bar ? "" : " OVER");
        CHECK(got[i] <= bar);
    }
    printf("\n");
}

/* ---- layer_norm and group_norm: rows of D = Cg * S -------------------------------------------------- */
/* float64 reference: R rows of Cg channels of S elements, row r's channels (r % G) * Cg + c; y, gx like x,
 * gw, gb (G * Cg) */
static void ref_rows(int64_t R, int64_t G, int64_t Cg, int64_t S, const float *x, const float *w, const float *b,
                     const float *gy, double *y, double *gx, double *gw, double *gb) {
    const int64_t D = Cg * S;
    memset(gw, 0, sizeof(double) * (size_t)(G * Cg));
    memset(gb, 0, sizeof(double) * (size_t)(G * Cg));
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * D, *gr = gy + r * D;
        double mu = 0, var = 0, mh = 0, mhx = 0;
        for (int64_t i = 0; i < D; i++) mu += xr[i];
        mu /= (double)D;
        for (int64_t i = 0; i < D; i++) var += (xr[i] - mu) * (xr[i] - mu);
        const double is = 1.0 / sqrt(var / (double)D + EPS);
        for (int64_t i = 0; i < D; i++) {
            const int64_t ch = (r % G) * Cg + i / S;
            const double xh = (xr[i] - mu) * is, h = (double)gr[i] * w[ch];
            y[r * D + i] = xh * w[ch] + b[ch];
            mh += h;
            mhx += h * xh;
            gw[ch] += (double)gr[i] * xh;
            gb[ch] += gr[i];
        }
        mh /= (double)D;
        mhx /= (double)D;
        for (int64_t i = 0; i < D; i++) {
            const int64_t ch = (r % G) * Cg + i / S;
            gx[r * D + i] = is * ((double)gr[i] * w[ch] - mh - (xr[i] - mu) * is * mhx);
        }
    }
}

/* One layer_norm (G = 0) or group_norm case: x (N, C, S) seen as rows. */
static void row_case(const char *prefix, const int64_t *casev, int ncase, uint64_t seed, int64_t N, int64_t C,
                     int64_t S, int64_t G, double mean, double sd) {
    const bool ln = G == 0;
    const int64_t n = N * C * S, P = C, R = ln ? N : N * G, Gr = ln ? 1 : G, Cg = ln ? C : C / G;
    float *x = gen_alloc(n, seed, mean, sd * SQRT3), *w = gen_alloc(P, seed + 1, 1.0, 0.5);
    float *b = gen_alloc(P, seed + 2, 0.0, 1.0), *gy = gen_alloc(n, seed + 3, 0.0, 1.0);
    double *ry = malloc(sizeof(double) * (size_t)n), *rgx = malloc(sizeof(double) * (size_t)n);
    double *rgw = malloc(sizeof(double) * (size_t)P), *rgb = malloc(sizeof(double) * (size_t)P);
    ref_rows(R, Gr, Cg, ln ? 1 : S, x, w, b, gy, ry, rgx, rgw, rgb);

    const int64_t xs[3] = {N, C, S};
    ts_tensor *tx = on_dev(ln ? 2 : 3, xs, x, true), *tw = on_dev(1, &P, w, true), *tb = on_dev(1, &P, b, true);
    ts_tensor *tg = on_dev(ln ? 2 : 3, xs, gy, false), *y = NULL;
    if (ln)
        CHECK_OK(ts_layer_norm(tx, 1, tw, tb, (float)EPS, &y));
    else
        CHECK_OK(ts_group_norm(tx, (int)G, tw, tb, (float)EPS, &y));
    if (y) CHECK_OK(ts_backward(y, tg, false));
    float *hy = host(y), *hgx = host(ts_tensor_grad(tx)), *hgw = host(ts_tensor_grad(tw));
    float *hgb = host(ts_tensor_grad(tb));
    const double got[4] = {err(hy, ry, n, false), err(hgx, rgx, n, true), err(hgw, rgw, P, true),
                           err(hgb, rgb, P, true)};
    const float *te = torch_errs(prefix, casev, ncase, 4);
    char what[96];
    snprintf(what, sizeof what, "%s %s %lld x %lld, mean %g std %g", prefix, ln ? "layer_norm" : "group_norm",
             (long long)R, (long long)(n / R), mean, sd);
    static const char *const names[4] = {"y", "gx", "gw", "gb"};
    if (te) check_figures(what, got, te, NULL, names, 4);

    free(x), free(w), free(b), free(gy), free(ry), free(rgx), free(rgw), free(rgb);
    free(hy), free(hgx), free(hgw), free(hgb);
    ts_tensor_release(tx), ts_tensor_release(tw), ts_tensor_release(tb), ts_tensor_release(tg);
    ts_tensor_release(y);
}

/* the script's LN_CASES: R, D, mean, std */
static const struct { int64_t R, D; double mean, sd; } ln_cases[] = {
    {4, 1024, 100.0, 1.0},  {2, 16384, 100.0, 1.0},   {2, 65536, 100.0, 1.0},    {2, 131072, 100.0, 1.0},
    {1, 14256, 3.0, 0.1},   {1, 131072, 3.0, 0.1},    {2, 131072, 1000.0, 0.1}, {2, 131072, 0.0, 1.0},
};

static void test_layer_norm_rows(void) {
    for (size_t k = 0; k < sizeof ln_cases / sizeof ln_cases[0]; k++) {
        char prefix[16];
        snprintf(prefix, sizeof prefix, "ln%zu", k);
        const int64_t c[4] = {ln_cases[k].R, ln_cases[k].D, llround(ln_cases[k].mean * 1e6),
                              llround(ln_cases[k].sd * 1e6)};
        row_case(prefix, c, 4, 1000 + 16 * k, ln_cases[k].R, ln_cases[k].D, 1, 0, ln_cases[k].mean, ln_cases[k].sd);
    }
}

/* the script's GN_CASES: N, C, H, W, groups, mean, std */
static const struct { int64_t N, C, H, W, G; double mean, sd; } gn_cases[] = {
    {2, 4, 128, 128, 2, 100.0, 1.0},
    {1, 2, 256, 256, 1, 1000.0, 0.1},
};

static void test_group_norm_groups(void) {
    for (size_t k = 0; k < sizeof gn_cases / sizeof gn_cases[0]; k++) {
        char prefix[16];
        snprintf(prefix, sizeof prefix, "gn%zu", k);
        const int64_t c[7] = {gn_cases[k].N, gn_cases[k].C, gn_cases[k].H, gn_cases[k].W, gn_cases[k].G,
                              llround(gn_cases[k].mean * 1e6), llround(gn_cases[k].sd * 1e6)};
        row_case(prefix, c, 7, 2000 + 16 * k, gn_cases[k].N, gn_cases[k].C, gn_cases[k].H * gn_cases[k].W,
                 gn_cases[k].G, gn_cases[k].mean, gn_cases[k].sd);
    }
}

/* ---- batchnorm2d, training ----------------------------------------------------------------------------- */
/* the script's BN_CASES: N, C, H, W and each channel's mean, std */
#define BN_MAXC 4
static const struct { int64_t N, C, H, W; double mean[BN_MAXC], sd[BN_MAXC]; } bn_cases[] = {
    {8, 4, 16, 16, {0.0, 100.0, 10000.0, 1000.0}, {1.0, 0.01, 1.0, 0.01}},
    {2, 2, 224, 224, {10000.0, 100.0}, {1.0, 1.0}},
};

/* Channel c's six figures (the golden file's bn<k>/torch_err row), Tessera's against float64, and their
 * floors: the running statistics are float32, so half a unit in their last place is the least error any
 * float32 implementation can have (floor[4], floor[5], in the figures' units). */
static void bn_channel_figures(int64_t N, int64_t C, int64_t HW, int64_t c, const float *x, const float *w,
                               const float *b, const float *gy, const float *y, const float *gx, const float *gw,
                               const float *gb, const float *rm, const float *rv, double fig[6], double floor[6]) {
    const int64_t M = N * HW;
    double mu = 0, var = 0, sg = 0, sgx = 0, sabs = 0, ey = 0, egx = 0, mgx = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < HW; j++) mu += x[(n * C + c) * HW + j];
    mu /= (double)M;
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < HW; j++) var += (x[(n * C + c) * HW + j] - mu) * (x[(n * C + c) * HW + j] - mu);
    const double is = 1.0 / sqrt(var / (double)M + EPS);
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < HW; j++) {
            const int64_t e = (n * C + c) * HW + j;
            sg += gy[e];
            sgx += (double)gy[e] * (x[e] - mu) * is;
            sabs += fabs((double)gy[e]);
        }
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < HW; j++) {
            const int64_t e = (n * C + c) * HW + j;
            const double xh = (x[e] - mu) * is;
            const double ry = xh * w[c] + b[c], rgx = w[c] * is * (gy[e] - sg / (double)M - xh * sgx / (double)M);
            ey = fmax(ey, fabs(y[e] - ry));
            egx = fmax(egx, fabs(gx[e] - rgx));
            mgx = fmax(mgx, fabs(rgx));
        }
    const double mom = 0.1f; /* the op's float momentum (torch's figures: its double 0.1) */
    const double rrm = mom * mu, rrv = (1 - mom) + mom * var / (double)(M - 1);
    fig[0] = ey;
    fig[1] = egx / mgx;
    fig[2] = fabs(gw[c] - sgx) / sabs;
    fig[3] = fabs(gb[c] - sg) / sabs;
    fig[4] = fabs(rm[c] - rrm) / sqrt(var / (double)M);
    fig[5] = fabs(rv[c] - rrv) / rrv;
    for (int i = 0; i < 4; i++) floor[i] = 0;
    floor[4] = 0.5 * (nextafterf((float)fabs(rrm), INFINITY) - (float)fabs(rrm)) / sqrt(var / (double)M);
    floor[5] = 0.5 * (nextafterf((float)rrv, INFINITY) - (float)rrv) / rrv;
}

static void test_batchnorm_edges(void) {
    for (size_t k = 0; k < sizeof bn_cases / sizeof bn_cases[0]; k++) {
        const int64_t N = bn_cases[k].N, C = bn_cases[k].C, HW = bn_cases[k].H * bn_cases[k].W, n = N * C * HW;
        const uint64_t seed = 3000 + 16 * k;
        double half[BN_MAXC];
        int64_t casev[4 + 2 * BN_MAXC] = {N, C, bn_cases[k].H, bn_cases[k].W};
        for (int64_t c = 0; c < C; c++) {
            half[c] = bn_cases[k].sd[c] * SQRT3;
            casev[4 + 2 * c] = llround(bn_cases[k].mean[c] * 1e6);
            casev[5 + 2 * c] = llround(bn_cases[k].sd[c] * 1e6);
        }
        float *x = malloc(sizeof(float) * (size_t)n), *w = gen_alloc(C, seed + 1, 1.0, 0.5);
        float *b = gen_alloc(C, seed + 2, 0.0, 1.0), *gy = gen_alloc(n, seed + 3, 0.0, 1.0);
        norm_gen(x, n, seed, bn_cases[k].mean, half, HW, C);
        const int64_t xs[4] = {N, C, bn_cases[k].H, bn_cases[k].W};
        float zeros[BN_MAXC] = {0}, ones[BN_MAXC] = {1, 1, 1, 1};
        ts_tensor *tx = on_dev(4, xs, x, true), *tw = on_dev(1, &C, w, true), *tb = on_dev(1, &C, b, true);
        ts_tensor *trm = on_dev(1, &C, zeros, false), *trv = on_dev(1, &C, ones, false);
        ts_tensor *tg = on_dev(4, xs, gy, false), *y = NULL;
        CHECK_OK(ts_batchnorm2d(tx, tw, tb, trm, trv, true, 0.1f, (float)EPS, &y));
        if (y) CHECK_OK(ts_backward(y, tg, false));
        float *hy = host(y), *hgx = host(ts_tensor_grad(tx)), *hgw = host(ts_tensor_grad(tw));
        float *hgb = host(ts_tensor_grad(tb)), *hrm = host(trm), *hrv = host(trv);
        char prefix[16];
        snprintf(prefix, sizeof prefix, "bn%zu", k);
        const float *te = torch_errs(prefix, casev, (int)(4 + 2 * C), 6 * C);
        static const char *const names[6] = {"y", "gx", "gw", "gb", "rm", "rv"};
        for (int64_t c = 0; te && c < C; c++) {
            double fig[6], floor[6];
            bn_channel_figures(N, C, HW, c, x, w, b, gy, hy, hgx, hgw, hgb, hrm, hrv, fig, floor);
            char what[96];
            snprintf(what, sizeof what, "%s batchnorm2d (%lld, %lld, %lld), mean %g std %g", prefix, (long long)N,
                     (long long)C, (long long)HW, bn_cases[k].mean[c], bn_cases[k].sd[c]);
            check_figures(what, fig, te + 6 * c, floor, names, 6);
        }
        free(x), free(w), free(b), free(gy), free(hy), free(hgx), free(hgw), free(hgb), free(hrm), free(hrv);
        ts_tensor_release(tx), ts_tensor_release(tw), ts_tensor_release(tb), ts_tensor_release(trm);
        ts_tensor_release(trv), ts_tensor_release(tg), ts_tensor_release(y);
    }
}

int main(int argc, char **argv) {
    dev = tu_test_device();
    if (tg_load(GOLDEN, &golden) != TS_OK) {
        fprintf(stderr, "cannot read %s: %s\n", GOLDEN, ts_last_error());
        return 1;
    }
    ts_tensor *v = tg_get(&golden, "torch_version");
    if (v) {
        printf("torch float32's errors from torch ");
        for (int64_t i = 0; i < ts_tensor_numel(v); i++) putchar(((const int32_t *)ts_tensor_data(v))[i]);
        printf("; Tessera on %s\n", ts_device_name(dev));
    }
    static const tu_test tests[] = {T(test_layer_norm_rows), T(test_group_norm_groups), T(test_batchnorm_edges)};
    int rc = tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    ts_tensor_list_clear(&golden);
    return rc;
}
