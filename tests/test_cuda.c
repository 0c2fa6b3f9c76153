/*
 * tests/test_cuda.c — CUDA devices on a machine with a GPU (skipped, exit 77,
 * with the reason, elsewhere): memory accounting and the caching allocator,
 * copies both ways and between tensors, refusals that name both devices, a
 * bf16-precision matmul, the reference CNN trained on cuda:0 against the same
 * steps on the CPU, out-of-range class and embedding indices reported from
 * the GPU at the next synchronisation (the device's deferred index checks), and
 * autocast's bfloat16 activations on the GPU against the CPU's, the input
 * pipeline's mixed decoding (nvJPEG) against its CPU decoding, and copies
 * between two GPUs (where there are two).
 * The op-by-op checks against PyTorch are test_golden_ops / test_golden_step
 * with TS_TEST_DEVICE=cuda:0.
 */
#include "test_util.h"
#include "pipeline_epoch.h"

#include <sys/stat.h> /* mkdir */
#include <unistd.h>   /* usleep, ftruncate */

static ts_device *gpu;

static ts_tensor *randn(ts_device *d, int ndim, const int64_t *shape, uint64_t seed) {
    ts_rng r;
    ts_rng_seed(&r, seed);
    ts_tensor *t = NULL;
    if (ts_tensor_empty(d, TS_F32, ndim, shape, &t) != TS_OK || ts_tensor_normal_(t, 0, 1, &r) != TS_OK) {
        fprintf(stderr, "randn on %s: %s\n", ts_device_name(d), ts_last_error());
        abort();
    }
    return t;
}

static double max_diff(const ts_tensor *a, const ts_tensor *b) {
    int64_t n = ts_tensor_numel(a);
    float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
    double m = INFINITY;
    if (x && y && ts_tensor_numel(b) == n && ts_tensor_to_host(a, x, 4 * (size_t)n) == TS_OK &&
        ts_tensor_to_host(b, y, 4 * (size_t)n) == TS_OK) {
        m = 0;
        for (int64_t i = 0; i < n; i++) m = fmax(m, isnan(x[i] - y[i]) ? INFINITY : fabs((double)x[i] - y[i]));
    }
    free(x);
    free(y);
    return m;
}

static void test_describe_and_memory(void) {
    char line[256];
    ts_device_describe(gpu, line, sizeof line);
    printf("%s: %s\n", ts_device_name(gpu), line);
    CHECK(strstr(line, "compute capability") != NULL);
    ts_device_empty_cache(gpu);
    size_t a0 = ts_device_memory_allocated(gpu);
    int64_t shape[1] = {1 << 20};
    ts_tensor *t = NULL;
    CHECK_OK(ts_tensor_empty(gpu, TS_F32, 1, shape, &t));
    CHECK(ts_device_memory_allocated(gpu) == a0 + (4u << 20));
    CHECK(ts_device_memory_reserved(gpu) >= a0 + (4u << 20));
    CHECK(ts_tensor_data(t) == NULL); /* device memory is not host-addressable */
    ts_tensor_release(t);
    CHECK(ts_device_memory_allocated(gpu) == a0);
    CHECK(ts_device_memory_reserved(gpu) >= 4u << 20); /* cached, not returned */
    size_t r0 = ts_device_memory_reserved(gpu);
    CHECK_OK(ts_tensor_empty(gpu, TS_F32, 1, shape, &t)); /* the cached block again: no cudaMalloc */
    CHECK(ts_device_memory_reserved(gpu) == r0);
    ts_tensor_release(t);
    ts_device_empty_cache(gpu);
    CHECK(ts_device_memory_reserved(gpu) == ts_device_memory_allocated(gpu) || a0 > 0);
}

static void test_copies(void) {
    int64_t shape[2] = {37, 53};
    ts_tensor *h = randn(ts_device_cpu(), 2, shape, 1), *d = NULL, *back = NULL, *d2 = NULL;
    CHECK_OK(ts_to_device(h, gpu, &d));
    CHECK(ts_tensor_device(d) == gpu);
    CHECK_OK(ts_tensor_clone(d, &d2)); /* device to device */
    CHECK_OK(ts_to_device(d2, ts_device_cpu(), &back));
    CHECK(max_diff(h, back) == 0);
    /* a strided copy on the device: the transpose */
    ts_tensor *tr = NULL, *htr = NULL;
    CHECK_OK(ts_transpose(d, 0, 1, &tr));
    CHECK_OK(ts_transpose(h, 0, 1, &htr));
    CHECK(max_diff(tr, htr) == 0);
    /* ops refuse operands on two devices, naming both */
    ts_tensor *sum = NULL;
    CHECK_STATUS(ts_add(h, d, &sum), TS_ERR_DEVICE);
    CHECK_ERR_MENTIONS("cuda:0");
    float v = 0;
    CHECK_STATUS(ts_tensor_to_host(d, &v, sizeof v), TS_ERR_INVALID_ARG); /* a buffer of the wrong size */
    CHECK(ts_tensor_item(d, 5) == ts_tensor_item(h, 5));
    ts_tensor *all[] = {h, d, back, d2, tr, htr};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ts_tensor_release(all[i]);
}

/* A matmul in float32 matches the CPU's to float rounding; under bf16 (and f16) precision both round their
 * operands to bfloat16 (float16) and the results agree to the float32 accumulation order. */
static void test_matmul_precision(void) {
    int64_t sa[2] = {64, 96}, sb[2] = {96, 80};
    ts_tensor *a = randn(ts_device_cpu(), 2, sa, 2), *b = randn(ts_device_cpu(), 2, sb, 3);
    ts_tensor *ad = NULL, *bd = NULL;
    CHECK_OK(ts_to_device(a, gpu, &ad));
    CHECK_OK(ts_to_device(b, gpu, &bd));
    for (int k = 0; k < 3; k++) {
        ts_dtype prec = k == 2 ? TS_F16 : k ? TS_BF16 : TS_F32;
        CHECK_OK(ts_set_matmul_precision(prec));
        ts_tensor *c = NULL, *cd = NULL;
        CHECK_OK(ts_matmul(a, b, &c));
        CHECK_OK(ts_matmul(ad, bd, &cd));
        double m = max_diff(c, cd);
        printf("matmul 64x96x80 %s: max |cpu - gpu| %.3g\n", ts_dtype_name(prec), m);
        CHECK(m < 1e-4);
        ts_tensor_release(c);
        ts_tensor_release(cd);
    }
    CHECK_OK(ts_set_matmul_precision(TS_F32));
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(ad);
    ts_tensor_release(bd);
}

/* max |a - b| / max |b|: the error relative to the tensor's scale */
static double rel_diff(const ts_tensor *a, const ts_tensor *b) {
    int64_t n = ts_tensor_numel(b);
    float *y = malloc(sizeof(float) * (size_t)n);
    double scale = 0;
    if (y && ts_tensor_to_host(b, y, 4 * (size_t)n) == TS_OK)
        for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)y[i]));
    free(y);
    return max_diff(a, b) / (scale > 0 ? scale : 1);
}

/* A 3x3 convolution, forward and both gradients, in float32 (within float rounding of the CPU's) and under
 * bf16 precision (cuDNN's bfloat16 convolution: operands rounded to bfloat16 like the CPU's, float32
 * accumulation, the result rounded to bfloat16 once more: within 1% of the CPU's scale). */
static void test_conv_precision(void) {
    int64_t sx[4] = {4, 16, 12, 12}, sw[4] = {32, 16, 3, 3}, sb[1] = {32};
    ts_conv2d_params p = TS_CONV2D_DEFAULT;
    p.padding[0] = p.padding[1] = 1;
    for (int k = 0; k < 3; k++) {
        ts_dtype prec = k == 2 ? TS_F16 : k ? TS_BF16 : TS_F32;
        CHECK_OK(ts_set_matmul_precision(prec));
        ts_tensor *y[2], *gx[2], *gw[2];
        for (int on = 0; on < 2; on++) {
            ts_device *d = on ? gpu : ts_device_cpu();
            ts_tensor *x = randn(d, 4, sx, 21), *w = randn(d, 4, sw, 22), *b = randn(d, 1, sb, 23);
            ts_tensor_set_requires_grad(x, true);
            ts_tensor_set_requires_grad(w, true);
            CHECK_OK(ts_conv2d(x, w, b, p, &y[on]));
            ts_tensor *gy = randn(d, 4, (int64_t[]){4, 32, 12, 12}, 24);
            CHECK_OK(ts_backward(y[on], gy, false));
            gx[on] = ts_tensor_retain(ts_tensor_grad(x));
            gw[on] = ts_tensor_retain(ts_tensor_grad(w));
            ts_tensor_release(gy);
            ts_tensor_release(x);
            ts_tensor_release(w);
            ts_tensor_release(b);
        }
        double ey = rel_diff(y[1], y[0]), ex = rel_diff(gx[1], gx[0]), ew = rel_diff(gw[1], gw[0]);
        printf("conv 3x3 16->32 %s: relative |gpu - cpu| y %.3g, gx %.3g, gw %.3g\n", ts_dtype_name(prec), ey, ex, ew);
        double tol = k == 2 ? 2e-3 : k ? 1e-2 : 1e-5; /* float16: 11-bit mantissas, the output rounded once more */
        CHECK(ey < tol && ex < tol && ew < tol);
        for (int on = 0; on < 2; on++) {
            ts_tensor_release(y[on]);
            ts_tensor_release(gx[on]);
            ts_tensor_release(gw[on]);
        }
    }
    CHECK_OK(ts_set_matmul_precision(TS_F32));
}

/* The reference CNN, the same initial weights and batch, trained 3 SGD steps (momentum, weight decay) on the CPU
 * and on the GPU under the process's current precision and autocast settings: each side's losses, the largest
 * |cpu - gpu| over the parameters afterwards (INFINITY when the parameter lists differ), and each side's dtype of
 * the first conv's output (act; bfloat16 under autocast). */
static double cnn_steps_cpu_gpu(double loss[2][3], ts_dtype act[2]) {
    ts_module *m[2] = {NULL, NULL};
    ts_optimizer *opt[2] = {NULL, NULL};
    ts_tensor_list params[2] = {TS_TENSOR_LIST_INIT, TS_TENSOR_LIST_INIT};
    ts_device *devs[2] = {ts_device_cpu(), gpu};
    int64_t xs[4] = {16, 1, 28, 28}, n = 16;
    ts_tensor *x = randn(ts_device_cpu(), 4, xs, 7), *y = NULL;
    CHECK_OK(ts_tensor_empty(ts_device_cpu(), TS_I64, 1, &n, &y));
    int64_t *yy = ts_tensor_data(y);
    for (int i = 0; i < n; i++) yy[i] = (i * 7) % 10;
    for (int k = 0; k < 2; k++) {
        ts_rng r;
        ts_rng_seed(&r, 11);
        act[k] = TS_F32;
        CHECK_OK(ts_model_reference_cnn(&r, &m[k]));
        CHECK_OK(ts_module_to(m[k], devs[k]));
        ts_module_train(m[k], true);
        CHECK_OK(ts_module_parameters(m[k], &params[k]));
        ts_sgd_config cfg = TS_SGD_CONFIG_INIT;
        cfg.lr = 0.05f;
        cfg.momentum = 0.9f;
        cfg.weight_decay = 5e-4f;
        CHECK_OK(ts_optim_sgd_new(&params[k], &cfg, &opt[k]));
        ts_tensor *xd = NULL, *yd = NULL, *h = NULL;
        CHECK_OK(ts_to_device(x, devs[k], &xd));
        CHECK_OK(ts_to_device(y, devs[k], &yd));
        CHECK_OK(ts_conv2d(xd, params[k].tensors[0], params[k].tensors[1], (ts_conv2d_params)TS_CONV2D_DEFAULT, &h));
        if (h) act[k] = ts_tensor_dtype(h);
        ts_tensor_release(h);
        for (int step = 0; step < 3; step++) {
            ts_tensor *logits = NULL, *l = NULL;
            ts_optimizer_zero_grad(opt[k]);
            CHECK_OK(ts_module_forward(m[k], xd, &logits));
            CHECK_OK(ts_cross_entropy(logits, yd, 0.0f, &l));
            loss[k][step] = l ? ts_tensor_item(l, 0) : NAN;
            CHECK_OK(ts_backward(l, NULL, false));
            CHECK_OK(ts_optimizer_step(opt[k]));
            ts_tensor_release(logits);
            ts_tensor_release(l);
        }
        ts_tensor_release(xd);
        ts_tensor_release(yd);
    }
    double worst = params[0].n == params[1].n ? 0 : INFINITY;
    for (int i = 0; i < params[0].n && i < params[1].n; i++)
        worst = fmax(worst, max_diff(params[0].tensors[i], params[1].tensors[i]));
    for (int k = 0; k < 2; k++) {
        ts_optimizer_free(opt[k]);
        ts_tensor_list_clear(&params[k]);
        ts_module_free(m[k]);
    }
    ts_tensor_release(x);
    ts_tensor_release(y);
    return worst;
}

/* In float32 the two runs end within 1e-4 of each other in every parameter. */
static void test_cnn_steps_match_cpu(void) {
    double loss[2][3];
    ts_dtype act[2];
    double worst = cnn_steps_cpu_gpu(loss, act);
    for (int s = 0; s < 3; s++) {
        printf("step %d: loss cpu %.7f gpu %.7f\n", s, loss[0][s], loss[1][s]);
        CHECK_NEAR(loss[0][s], loss[1][s], 1e-4);
    }
    printf("after 3 steps: max |cpu - gpu| over the parameters %.3g\n", worst);
    CHECK(worst < 1e-4);
}

/* i64 tensor on dev with values v[0..n) */
static ts_tensor *labels(ts_device *dev, int64_t n, const int64_t *v) {
    ts_tensor *h = NULL, *d = NULL;
    if (ts_tensor_empty(ts_device_cpu(), TS_I64, 1, &n, &h) != TS_OK) abort();
    memcpy(ts_tensor_data(h), v, sizeof(int64_t) * (size_t)n);
    if (ts_to_device(h, dev, &d) != TS_OK) {
        fprintf(stderr, "labels on %s: %s\n", ts_device_name(dev), ts_last_error());
        abort();
    }
    ts_tensor_release(h);
    return d;
}

/* The mean cross-entropy of logits and labels y read back (NAN if the op or the read fails; *st says which). */
static float ce_read(ts_tensor *logits, ts_tensor *y, ts_status *st) {
    ts_tensor *l = NULL;
    float f = NAN;
    *st = ts_cross_entropy(logits, y, 0.0f, &l);
    if (*st == TS_OK) *st = ts_tensor_to_host(l, &f, sizeof f);
    ts_tensor_release(l);
    return f;
}

/* A class index out of range is found on the GPU without the host waiting for it (device/cuda.h: deferred
 * index checks): the op returns TS_OK with a NaN loss, and the next synchronisation (reading the loss)
 * fails with the CPU's message naming the target and its sample. The error is reported once; the device
 * works normally afterwards. Several bad losses before a synchronisation: the first is reported. Label
 * tensors are made before the losses: their upload is a synchronisation too. */
static void test_bad_target(void) {
    int64_t s[2] = {4, 3};
    const int64_t good[4] = {0, 2, 1, 1}, bad2[4] = {0, 2, 3, 1}, bad0[4] = {7, 2, 1, 1};
    ts_tensor *logits = randn(gpu, 2, s, 9), *hl = NULL, *l = NULL;
    ts_tensor *yg = labels(gpu, 4, good), *yb2 = labels(gpu, 4, bad2), *yb0 = labels(gpu, 4, bad0);
    ts_tensor *hyg = labels(ts_device_cpu(), 4, good);
    CHECK_OK(ts_to_device(logits, ts_device_cpu(), &hl));
    CHECK_OK(ts_cross_entropy(logits, yb2, 0.0f, &l)); /* no wait: the check runs on the device */
    float v = 0;
    CHECK_STATUS(ts_tensor_to_host(l, &v, sizeof v), TS_ERR_INVALID_ARG); /* the loss's read reports it */
    CHECK_ERR_MENTIONS("cross_entropy: target 3 of sample 2 is out of range [0, 3)");
    CHECK_ERR_MENTIONS("later synchronisation");
    CHECK(isnan(v)); /* the value read is NaN, not a plausible loss */
    CHECK_OK(ts_tensor_to_host(l, &v, sizeof v)); /* reported once */
    CHECK_OK(ts_device_synchronize(gpu));
    ts_tensor_release(l);

    /* afterwards the device computes as the CPU does */
    ts_status sg, sc;
    float g = ce_read(logits, yg, &sg), c = ce_read(hl, hyg, &sc);
    CHECK_OK(sg);
    CHECK_OK(sc);
    printf("cross_entropy after a reported bad target: gpu %.7f cpu %.7f\n", g, c);
    CHECK_NEAR(g, c, 1e-5);

    /* two bad losses queued while the GPU is busy (a large matmul), then a synchronisation: the first one's
     * (sample 2) is reported. Should the GPU finish the first before the second starts, the second op
     * reports it instead, without running. */
    int64_t big[2] = {4096, 4096};
    ts_tensor *a = randn(gpu, 2, big, 12), *p = NULL, *l1 = NULL, *l2 = NULL;
    CHECK_OK(ts_matmul(a, a, &p));
    CHECK_OK(ts_cross_entropy(logits, yb2, 0.0f, &l1));
    ts_status st = ts_cross_entropy(logits, yb0, 0.0f, &l2);
    if (st == TS_OK) CHECK_STATUS(ts_device_synchronize(gpu), TS_ERR_INVALID_ARG);
    CHECK(st == TS_OK || st == TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("target 3 of sample 2");
    CHECK_OK(ts_device_synchronize(gpu));
    ts_tensor_release(l1);
    ts_tensor_release(l2);
    ts_tensor_release(p);
    ts_tensor_release(a);

    /* a bad loss that nothing synchronises after: the next checking op reports it if the GPU is done with
     * it (never waiting for it), else the next synchronisation does */
    l1 = NULL;
    CHECK_OK(ts_cross_entropy(logits, yb0, 0.0f, &l1));
    usleep(100 * 1000);
    g = ce_read(logits, yg, &st);
    if (st == TS_OK) CHECK_STATUS(ts_device_synchronize(gpu), TS_ERR_INVALID_ARG); /* it was still pending */
    CHECK(st == TS_OK || st == TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("cross_entropy: target 7 of sample 0 is out of range [0, 3)");
    ts_tensor_release(l1);
    g = ce_read(logits, yg, &st);
    CHECK_OK(st);
    CHECK_NEAR(g, c, 1e-5);

    /* embedding: the same record, the CPU's message, NaN rows */
    int64_t ws[2] = {5, 2};
    const int64_t idx[4] = {1, 4, 5, 0};
    ts_tensor *w = randn(gpu, 2, ws, 10), *id = labels(gpu, 4, idx), *e = NULL;
    CHECK_OK(ts_embedding(id, w, &e));
    float rows[8];
    CHECK_STATUS(ts_tensor_to_host(e, rows, sizeof rows), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("embedding: index 5 (at flat position 2 of the indices) is out of range [0, 5) for weight [5, 2]");
    CHECK(isnan(rows[4]) && isnan(rows[5]) && isfinite(rows[2]));
    CHECK_OK(ts_device_synchronize(gpu));

    ts_tensor *all[] = {logits, hl, yg, yb2, yb0, hyg, w, id, e};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ts_tensor_release(all[i]);
}

/* bfloat16 tensor t's bits on the host (n elements) */
static uint16_t *bits16(const ts_tensor *t, int64_t *n) {
    ts_tensor *h = NULL;
    *n = ts_tensor_numel(t);
    uint16_t *b = malloc(2 * (size_t)(*n ? *n : 1));
    if (!b || ts_tensor_dtype(t) != TS_BF16 || ts_to_device(t, ts_device_cpu(), &h) != TS_OK) {
        free(b);
        return NULL;
    }
    memcpy(b, ts_tensor_data(h), 2 * (size_t)*n);
    ts_tensor_release(h);
    return b;
}

/* Elements where two bfloat16 tensors' bits differ (-1: not both bfloat16 of one size) */
static int64_t bits_differ(const ts_tensor *a, const ts_tensor *b) {
    int64_t na = 0, nb = 0, bad = 0;
    uint16_t *x = bits16(a, &na), *y = bits16(b, &nb);
    if (!x || !y || na != nb) bad = -1;
    for (int64_t i = 0; bad >= 0 && i < na; i++) bad += x[i] != y[i];
    free(x);
    free(y);
    return bad;
}

/* Autocast on cuda:0 (bfloat16 activations through cuDNN, cuBLAS and our bfloat16 kernels) against the CPU's
 * autocast on the same inputs: relu, max pooling (2x2 and overlapping 3x3/2) and the residual add compute each
 * element in float32 and round once on both, so forward and backward agree bit for bit; batchnorm within a
 * bfloat16 rounding (sums in another order); then the reference CNN's 3 SGD steps under autocast end close to
 * the CPU's (both round every activation: within 2% of the loss, 1e-2 in every parameter). */
static void test_autocast_matches_cpu(void) {
    CHECK_OK(ts_set_autocast(TS_BF16));
    CHECK_OK(ts_set_matmul_precision(TS_BF16));
    int64_t sx[4] = {4, 8, 10, 14};
    ts_tensor *xf = randn(ts_device_cpu(), 4, sx, 31), *xb = NULL;
    CHECK_OK(ts_to_dtype(xf, TS_BF16, &xb));
    ts_tensor *in[2] = {NULL, NULL}, *out[2][6], *grad[2][3];
    memset(out, 0, sizeof out);
    memset(grad, 0, sizeof grad);
    ts_pool2d_params p2 = {{2, 2}, {2, 2}, {0, 0}, {1, 1}, false, false};
    ts_pool2d_params p3 = {{3, 3}, {2, 2}, {1, 1}, {1, 1}, false, false};
    for (int on = 0; on < 2; on++) {
        ts_device *d = on ? gpu : ts_device_cpu();
        ts_tensor *moved = NULL; /* a leaf of its own on each side: the CPU's ts_to_device returns xb itself */
        CHECK_OK(ts_to_device(xb, d, &moved));
        if (!moved) return;
        CHECK_OK(ts_tensor_detach(moved, &in[on]));
        ts_tensor_release(moved);
        if (!in[on]) return;
        ts_tensor_set_requires_grad(in[on], true);
        ts_tensor *w = NULL, *b = NULL, *rm = NULL, *rv = NULL;
        int64_t c = 8;
        CHECK_OK(ts_tensor_full(d, 1, &c, 1.5f, &w));
        CHECK_OK(ts_tensor_full(d, 1, &c, -0.25f, &b));
        ts_tensor_set_requires_grad(w, true);
        CHECK_OK(ts_tensor_zeros(d, TS_F32, 1, &c, &rm));
        CHECK_OK(ts_tensor_full(d, 1, &c, 1.0f, &rv));
        CHECK_OK(ts_relu(in[on], &out[on][0]));
        CHECK_OK(ts_maxpool2d(out[on][0], p2, &out[on][1]));
        CHECK_OK(ts_maxpool2d(in[on], p3, &out[on][2]));
        CHECK_OK(ts_add(out[on][0], in[on], &out[on][3]));
        CHECK_OK(ts_batchnorm2d(in[on], w, b, rm, rv, true, 0.1f, 1e-5f, &out[on][4]));
        /* one float32 loss over everything: sum of each output times fixed weights */
        ts_tensor *total = NULL;
        for (int k = 0; k < 5 && out[on][k]; k++) {
            ts_tensor *f = NULL, *sq = NULL, *sm = NULL, *t2 = NULL;
            CHECK_OK(ts_to_dtype(out[on][k], TS_F32, &f));
            CHECK_OK(ts_mul(f, f, &sq));
            CHECK_OK(ts_sum(sq, &sm));
            if (total) {
                CHECK_OK(ts_add(total, sm, &t2));
                ts_tensor_release(total);
                total = t2;
            } else {
                total = ts_tensor_retain(sm);
            }
            ts_tensor *rel[] = {f, sq, sm};
            for (int i = 0; i < 3; i++) ts_tensor_release(rel[i]);
        }
        CHECK_OK(ts_backward(total, NULL, false));
        grad[on][0] = ts_tensor_grad(in[on]) ? ts_tensor_retain(ts_tensor_grad(in[on])) : NULL;
        grad[on][1] = ts_tensor_grad(w) ? ts_tensor_retain(ts_tensor_grad(w)) : NULL;
        out[on][5] = rm;
        ts_tensor_release(total);
        ts_tensor_release(w);
        ts_tensor_release(b);
        ts_tensor_release(rv);
    }
    static const char *const names[] = {"relu", "maxpool 2x2", "maxpool 3x3/2", "add"};
    for (int k = 0; k < 4; k++) {
        int64_t d = out[0][k] && out[1][k] ? bits_differ(out[0][k], out[1][k]) : -1;
        printf("autocast %s: %lld of %lld bfloat16 outputs differ cpu/gpu\n", names[k], (long long)d,
               (long long)(out[0][k] ? ts_tensor_numel(out[0][k]) : 0));
        CHECK(d == 0);
    }
    if (out[0][4] && out[1][4]) {
        ts_tensor *a = NULL, *b = NULL;
        CHECK_OK(ts_to_dtype(out[0][4], TS_F32, &a));
        CHECK_OK(ts_to_dtype(out[1][4], TS_F32, &b));
        double e = a && b ? rel_diff(b, a) : 1.0, er = max_diff(out[0][5], out[1][5]);
        printf("autocast batchnorm2d: relative |gpu - cpu| %.3g, running mean %.3g\n", e, er);
        CHECK(e <= 1.0 / 128 && er < 1e-5);
        ts_tensor_release(a);
        ts_tensor_release(b);
    }
    if (grad[0][0] && grad[1][0]) { /* the input's gradient: the sum of five bfloat16 paths, rounded in each */
        ts_tensor *a = NULL, *b = NULL;
        CHECK_OK(ts_to_dtype(grad[0][0], TS_F32, &a));
        CHECK_OK(ts_to_dtype(grad[1][0], TS_F32, &b));
        double e = a && b ? rel_diff(b, a) : 1.0, ew = grad[0][1] && grad[1][1] ? rel_diff(grad[1][1], grad[0][1]) : 1.0;
        printf("autocast backward: input gradient relative |gpu - cpu| %.3g, BN weight gradient %.3g\n", e, ew);
        CHECK(e <= 2.0 / 128 && ew <= 1e-3);
        ts_tensor_release(a);
        ts_tensor_release(b);
    } else {
        CHECK(!"autocast backward gave no input gradient");
    }
    for (int on = 0; on < 2; on++) {
        ts_tensor_release(in[on]);
        for (int k = 0; k < 6; k++) ts_tensor_release(out[on][k]);
        for (int k = 0; k < 3; k++) ts_tensor_release(grad[on][k]);
    }
    ts_tensor_release(xf);
    ts_tensor_release(xb);

    /* the reference CNN under autocast: its activations are bfloat16 on the GPU too */
    double loss[2][3];
    ts_dtype act[2];
    double worst = cnn_steps_cpu_gpu(loss, act);
    CHECK(act[0] == TS_BF16 && act[1] == TS_BF16);
    for (int st = 0; st < 3; st++) {
        printf("autocast step %d: loss cpu %.6f gpu %.6f\n", st, loss[0][st], loss[1][st]);
        CHECK(fabs(loss[0][st] - loss[1][st]) <= 0.02 * fabs(loss[0][st]));
    }
    printf("autocast, after 3 steps: max |cpu - gpu| over the parameters %.3g\n", worst);
    CHECK(worst < 1e-2);
    CHECK_OK(ts_set_autocast(TS_F32));
    CHECK_OK(ts_set_matmul_precision(TS_F32));
}

/* Copies between two GPUs go device to device (cudaMemcpyPeerAsync), ordered after the work queued on the
 * source and before the work queued later on either: a result computed on cuda:0 and copied at once to
 * cuda:1 arrives whole, and cuda:0 may overwrite its source right after. Needs two GPUs. */
static void test_peer_copy(void) {
    if (ts_cuda_device_count(NULL, 0) < 2) {
        printf("SKIP part: one GPU (peer copies need two)\n");
        return;
    }
    ts_device *g1 = NULL;
    CHECK_OK(ts_device_get("cuda:1", &g1));
    int64_t shape[2] = {512, 1024};
    ts_tensor *x = randn(gpu, 2, shape, 3), *r = NULL, *y = NULL, *back = NULL;
    CHECK_OK(ts_relu(x, &r));                 /* queued on cuda:0 */
    CHECK_OK(ts_to_device(r, g1, &y));        /* cuda:0 -> cuda:1, queued behind the relu */
    CHECK_OK(ts_tensor_fill_(r, -1.0f));      /* cuda:0 reuses the source at once */
    CHECK_OK(ts_to_device(y, gpu, &back));    /* and back */
    ts_tensor *want = NULL, *xc = NULL;
    CHECK_OK(ts_to_device(x, ts_device_cpu(), &xc));
    CHECK_OK(ts_relu(xc, &want));
    printf("peer copies: cuda:0 -> cuda:1 max diff %g, and back %g\n", max_diff(y, want), max_diff(back, want));
    CHECK(max_diff(y, want) == 0 && max_diff(back, want) == 0);
    ts_tensor_release(x);
    ts_tensor_release(r);
    ts_tensor_release(y);
    ts_tensor_release(back);
    ts_tensor_release(want);
    ts_tensor_release(xc);
}

/* ---- the pipeline's mixed decoding (nvJPEG) against its CPU decoding ---------------------------- */
/* A folder of 2 classes: 13 JPEGs of assorted sizes (smooth patterns with noise), one PNG (decoded on the
 * host in a mixed batch) and one truncated JPEG (nvJPEG refuses it, the host decoder too: skipped). */
static const char *mixed_folder(void) {
    static char root[512];
    snprintf(root, sizeof root, "%s/mixed", tu_tmpdir());
    char path[700];
    mkdir(root, 0755);
    ts_rng r;
    ts_rng_seed(&r, 5);
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/class_%d", root, k);
        mkdir(path, 0755);
    }
    for (int i = 0; i < 15; i++) {
        const int w = 40 + 23 * (i % 5), h = 36 + 17 * (i % 4);
        ts_image im = TS_IMAGE_INIT;
        CHECK_OK(ts_image_alloc(&im, w, h, 3));
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++)
                for (int c = 0; c < 3; c++) {
                    double v = 128 + 90 * sin(0.11 * (x + 7 * c) + 0.07 * y * (i + 1)) + 20 * (ts_rng_uniform(&r) - 0.5);
                    im.data[((size_t)y * w + x) * 3 + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
                }
        snprintf(path, sizeof path, "%s/class_%d/img_%02d.%s", root, i % 2, i, i == 6 ? "png" : "jpg");
        CHECK_OK(i == 6 ? ts_image_write_png(&im, path) : ts_image_write_jpeg(&im, path, 92));
        if (i == 9) { /* cut the JPEG short: no end of image, half its scans */
            FILE *f = fopen(path, "r+b");
            CHECK(f && fseek(f, 0, SEEK_END) == 0);
            long n = f ? ftell(f) : 0;
            CHECK(f && ftruncate(fileno(f), n / 2) == 0);
            if (f) fclose(f);
        }
        ts_image_free(&im);
    }
    return root;
}

/* One epoch of the folder through a pipeline decoding on `decode`, batches on dev (tests/pipeline_epoch.h):
 * values into vals (malloc'd, *n floats), labels, listing indices, skipped samples. */
static void run_epoch(const char *root, ts_color color, ts_decode_device decode, ts_device *dev, float **vals,
                      int64_t *n, int64_t *labels, int64_t *idx, int64_t *skipped) {
    ts_pipeline_opts o = TS_PIPELINE_OPTS_INIT;
    o.reader.file_root = root;
    o.reader.random_shuffle = true;
    o.reader.seed = 3;
    o.batch_size = 4;
    o.num_threads = 2;
    o.device = dev;
    o.decode = decode;
    o.color = color;
    o.skip_corrupt = true;
    o.out_width = 24;
    o.out_height = 20;
    o.random_resized_crop = true;
    o.flip_prob = 0.5f;
    o.jpeg_scaled_decode = false; /* the device decodes whole images */
    for (int c = 0; c < 3; c++) {
        o.mean[c] = 120.0f + 5 * c;
        o.std[c] = 60.0f - 3 * c;
    }
    *vals = calloc(16 * (size_t)color * 24 * 20, sizeof(float)); /* 15 files */
    *n = *vals ? tp_epoch(&o, *vals, labels, idx, skipped) * (int64_t)color * 24 * 20 : 0;
}

static void test_mixed_decode_matches_cpu(void) {
    const char *root = mixed_folder();
    for (int pass = 0; pass < 2; pass++) {
        const ts_color color = pass ? TS_COLOR_GRAY : TS_COLOR_RGB;
        float *a = NULL, *b = NULL;
        int64_t na = 0, nb = 0, la[16] = {0}, lb[16] = {0}, ia[16] = {0}, ib[16] = {0}, sa = 0, sb = 0;
        run_epoch(root, color, TS_DECODE_CPU, ts_device_cpu(), &a, &na, la, ia, &sa);
        run_epoch(root, color, TS_DECODE_MIXED, gpu, &b, &nb, lb, ib, &sb);
        CHECK(na == nb && na == 14 * (int64_t)color * 24 * 20);
        CHECK(sa >= 1 && sb >= 1);
        CHECK(memcmp(la, lb, sizeof la) == 0 && memcmp(ia, ib, sizeof ia) == 0);
        /* in pixel levels (x std). nvJPEG's luma is libjpeg-turbo's (gray: 0 levels apart on an H200, 2026-11-28);
         * its chroma upsampling is not libjpeg-turbo's "fancy" one: on these pictures, whose chroma is noisy,
         * RGB was 2.76 levels apart on average and 27.6 at most */
        double worst = 0, sum = 0;
        for (int64_t i = 0; i < na && i < nb; i++) {
            double d = fabs((double)a[i] - b[i]) * 60.0;
            worst = fmax(worst, isnan(d) ? INFINITY : d);
            sum += d;
        }
        const double mean = na ? sum / (double)na : INFINITY;
        printf("mixed decoding, %s: %lld values, |gpu - cpu| mean %.3f, max %.2f pixel levels\n", pass ? "gray" : "RGB",
               (long long)na, mean, worst);
        CHECK(mean <= (pass ? 0.05 : 3.5));
        CHECK(worst <= (pass ? 1 : 36));
        free(a);
        free(b);
    }
    /* the CPU device has no image decoder */
    ts_pipeline_opts o = TS_PIPELINE_OPTS_INIT;
    o.reader.file_root = root;
    o.out_width = o.out_height = 8;
    o.decode = TS_DECODE_MIXED;
    ts_pipeline *p = NULL;
    CHECK_STATUS(ts_pipeline_new(&o, &p), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("has no image decoder");
}

int main(int argc, char **argv) {
    char why[256];
    if (ts_cuda_device_count(why, sizeof why) == 0) {
        printf("SKIP: no CUDA device: %s\n", why);
        return 77;
    }
    if (ts_device_get("cuda:0", &gpu) != TS_OK) {
        fprintf(stderr, "cuda:0: %s\n", ts_last_error());
        return 1;
    }
    static const tu_test tests[] = {T(test_describe_and_memory), T(test_copies), T(test_matmul_precision), T(test_conv_precision),
                                    T(test_cnn_steps_match_cpu), T(test_bad_target), T(test_autocast_matches_cpu),
                                    T(test_mixed_decode_matches_cpu), T(test_peer_copy)};
    return tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
