/*
 * bench/spatial_ops.c — times forward + backward of the reference CNN's two
 * conv blocks (conv 3x3 pad 1 + bias, batchnorm2d train, relu, maxpool 2) at
 * batch 64 on 1x28x28 inputs, each block alone and the two chained, at 1 and
 * 2 threads. Prints the median and best ms per iteration. bench/spatial_ops.py
 * does the same with PyTorch.
 *
 * usage: bench_spatial_ops [ITERS] [THREADS]   (both 1 and 2 threads unless THREADS is given)
 */
#include "tessera.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct {
    ts_tensor *w, *b, *g, *beta, *rm, *rv;
} block;

static void block_init(block *k, int cin, int cout, ts_rng *r) {
    ts_tensor_empty(ts_device_cpu(), TS_F32, 4, (int64_t[]){cout, cin, 3, 3}, &k->w);
    ts_tensor_uniform_(k->w, -0.3f, 0.3f, r);
    ts_tensor_empty(ts_device_cpu(), TS_F32, 1, (int64_t[]){cout}, &k->b);
    ts_tensor_uniform_(k->b, -0.1f, 0.1f, r);
    ts_tensor_full(ts_device_cpu(), 1, (int64_t[]){cout}, 1.0f, &k->g);
    ts_tensor_zeros(ts_device_cpu(), TS_F32, 1, (int64_t[]){cout}, &k->beta);
    ts_tensor_zeros(ts_device_cpu(), TS_F32, 1, (int64_t[]){cout}, &k->rm);
    ts_tensor_full(ts_device_cpu(), 1, (int64_t[]){cout}, 1.0f, &k->rv);
    ts_tensor *ps[] = {k->w, k->b, k->g, k->beta};
    for (int i = 0; i < 4; i++) ts_tensor_set_requires_grad(ps[i], true);
}

static void block_free(block *k) {
    ts_tensor *ps[] = {k->w, k->b, k->g, k->beta, k->rm, k->rv};
    for (int i = 0; i < 6; i++) ts_tensor_release(ps[i]);
}

static void check(ts_status s) {
    if (s != TS_OK) {
        fprintf(stderr, "bench_spatial_ops: %s\n", ts_last_error());
        exit(1);
    }
}

static ts_tensor *block_fwd(block *k, ts_tensor *x) {
    ts_tensor *c = NULL, *n = NULL, *a = NULL, *p = NULL;
    check(ts_conv2d(x, k->w, k->b, (ts_conv2d_params){{1, 1}, {1, 1}, {1, 1}, 1}, &c));
    check(ts_batchnorm2d(c, k->g, k->beta, k->rm, k->rv, true, 0.1f, 1e-5f, &n));
    check(ts_relu(n, &a));
    check(ts_maxpool2d(a, (ts_pool2d_params){{2, 2}, {2, 2}, {0, 0}, {1, 1}, false, false}, &p));
    ts_tensor_release(c);
    ts_tensor_release(n);
    ts_tensor_release(a);
    return p;
}

static void zero_grads(block *k) {
    ts_tensor_zero_grad(k->w);
    ts_tensor_zero_grad(k->b);
    ts_tensor_zero_grad(k->g);
    ts_tensor_zero_grad(k->beta);
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* which: 1 = block 1, 2 = block 2, 3 = both chained */
static void run(int which, int iters, block *b1, block *b2, ts_tensor *x1, ts_tensor *x2, ts_tensor *seed1,
                ts_tensor *seed2, double *med, double *best) {
    double *t = malloc(sizeof(double) * (size_t)iters);
    for (int i = -3; i < iters; i++) {
        zero_grads(b1);
        zero_grads(b2);
        ts_tensor_zero_grad(x2);
        double t0 = ts_time_now();
        ts_tensor *out;
        if (which == 1) {
            out = block_fwd(b1, x1);
            check(ts_backward(out, seed1, false));
        } else if (which == 2) {
            out = block_fwd(b2, x2);
            check(ts_backward(out, seed2, false));
        } else {
            ts_tensor *h = block_fwd(b1, x1);
            out = block_fwd(b2, h);
            ts_tensor_release(h);
            check(ts_backward(out, seed2, false));
        }
        ts_tensor_release(out);
        if (i >= 0) t[i] = (ts_time_now() - t0) * 1e3;
    }
    qsort(t, (size_t)iters, sizeof *t, cmp);
    *med = t[iters / 2];
    *best = t[0];
    free(t);
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 30;
    int tlo = argc > 2 ? atoi(argv[2]) : 1, thi = argc > 2 ? atoi(argv[2]) : 2;
    if (iters < 1) iters = 1;
    ts_rng r;
    ts_rng_seed(&r, 1);
    block b1, b2;
    block_init(&b1, 1, 32, &r);
    block_init(&b2, 32, 64, &r);
    ts_tensor *x1 = NULL, *x2 = NULL, *s1 = NULL, *s2 = NULL;
    ts_tensor_empty(ts_device_cpu(), TS_F32, 4, (int64_t[]){64, 1, 28, 28}, &x1);
    ts_tensor_normal_(x1, 0, 1, &r);
    ts_tensor_empty(ts_device_cpu(), TS_F32, 4, (int64_t[]){64, 32, 14, 14}, &x2);
    ts_tensor_normal_(x2, 0, 1, &r);
    ts_tensor_set_requires_grad(x2, true); /* inside the network, block 2's input needs its gradient */
    ts_tensor_empty(ts_device_cpu(), TS_F32, 4, (int64_t[]){64, 32, 14, 14}, &s1);
    ts_tensor_normal_(s1, 0, 1, &r);
    ts_tensor_empty(ts_device_cpu(), TS_F32, 4, (int64_t[]){64, 64, 7, 7}, &s2);
    ts_tensor_normal_(s2, 0, 1, &r);
    const char *names[] = {"", "block1 conv(1->32)+bn+relu+pool", "block2 conv(32->64)+bn+relu+pool",
                           "both blocks"};
    printf("%-36s %8s %10s %10s\n", "fwd+bwd, batch 64", "threads", "median_ms", "best_ms");
    for (int threads = tlo; threads <= thi; threads++) {
        ts_set_num_threads(threads);
        for (int which = 1; which <= 3; which++) {
            double med, best;
            run(which, iters, &b1, &b2, x1, x2, s1, s2, &med, &best);
            printf("%-36s %8d %10.3f %10.3f\n", names[which], threads, med, best);
        }
    }
    block_free(&b1);
    block_free(&b2);
    ts_tensor *ts[] = {x1, x2, s1, s2};
    for (int i = 0; i < 4; i++) ts_tensor_release(ts[i]);
    return 0;
}
