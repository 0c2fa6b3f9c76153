/*
 * bench/ops_extra.c — times forward + backward of the ops added with
 * tests/test_ops_extra.c (softmax, GELU, SiLU, div with broadcasting, sum and
 * mean over dims, max along a dim, transpose/permute, bmm, batched matmul with
 * a broadcast weight, adaptive average pooling) at transformer- and CNN-sized
 * shapes, at 1 and 2 threads. Prints the median and best ms per iteration.
 * bench/ops_extra.py does the same with PyTorch.
 *
 * usage: bench_ops_extra [ITERS] [THREADS]   (both 1 and 2 threads unless THREADS is given)
 */
#include "tessera.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(ts_status s) {
    if (s != TS_OK) {
        fprintf(stderr, "bench_ops_extra: %s\n", ts_last_error());
        exit(1);
    }
}

static ts_tensor *rnd(ts_rng *r, int nd, const int64_t *shape, float lo, float hi, bool grad) {
    ts_tensor *t = NULL;
    check(ts_tensor_empty(ts_device_cpu(), TS_F32, nd, shape, &t));
    check(ts_tensor_uniform_(t, lo, hi, r));
    ts_tensor_set_requires_grad(t, grad);
    return t;
}

typedef enum { SOFTMAX, GELU, SILU, DIV, SUM0, MEAN_HW, MAX_LAST, TRANSPOSE, PERMUTE, BMM, MATMUL, ADAPTIVE, NOPS } opid;
static const char *const names[NOPS] = {
    "softmax (32,8,128,128) dim -1", "gelu erf (8192,1024)", "silu (8192,1024)", "div (8192,1024) / (1024)",
    "sum_dims (8192,1024) dim 0", "mean_dims (64,256,14,14) dims 2,3", "max_dim (8192,1000) dim -1",
    "transpose (32,128,8,64) 1,2", "permute (64,64,28,28) to NHWC", "bmm (256,128,64)x(256,64,128)",
    "matmul (32,128,512)x(512,512)", "adaptive_avgpool2d (64,512,7,7)->3x3"};

typedef struct {
    ts_tensor *a, *b, *gy;
} opdata;

static ts_tensor *fwd(opid op, opdata *d) {
    ts_tensor *y = NULL;
    switch (op) {
    case SOFTMAX: check(ts_softmax(d->a, -1, &y)); break;
    case GELU: check(ts_gelu(d->a, false, &y)); break;
    case SILU: check(ts_silu(d->a, &y)); break;
    case DIV: check(ts_div(d->a, d->b, &y)); break;
    case SUM0: check(ts_sum_dims(d->a, 1, (int[]){0}, false, &y)); break;
    case MEAN_HW: check(ts_mean_dims(d->a, 2, (int[]){2, 3}, false, &y)); break;
    case MAX_LAST: check(ts_max_dim(d->a, -1, false, &y, NULL)); break;
    case TRANSPOSE: check(ts_transpose(d->a, 1, 2, &y)); break;
    case PERMUTE: check(ts_permute(d->a, (int[]){0, 2, 3, 1}, &y)); break;
    case BMM: check(ts_bmm(d->a, d->b, &y)); break;
    case MATMUL: check(ts_matmul(d->a, d->b, &y)); break;
    case ADAPTIVE: check(ts_adaptive_avgpool2d(d->a, 3, 3, &y)); break;
    default: break;
    }
    return y;
}

static void setup(opid op, ts_rng *r, opdata *d) {
    memset(d, 0, sizeof *d);
    switch (op) {
    case SOFTMAX: d->a = rnd(r, 4, (int64_t[]){32, 8, 128, 128}, -3, 3, true); break;
    case GELU:
    case SILU:
    case SUM0: d->a = rnd(r, 2, (int64_t[]){8192, 1024}, -3, 3, true); break;
    case DIV:
        d->a = rnd(r, 2, (int64_t[]){8192, 1024}, -3, 3, true);
        d->b = rnd(r, 1, (int64_t[]){1024}, 0.5f, 2, true);
        break;
    case MEAN_HW: d->a = rnd(r, 4, (int64_t[]){64, 256, 14, 14}, -1, 1, true); break;
    case MAX_LAST: d->a = rnd(r, 2, (int64_t[]){8192, 1000}, -1, 1, true); break;
    case TRANSPOSE: d->a = rnd(r, 4, (int64_t[]){32, 128, 8, 64}, -1, 1, true); break;
    case PERMUTE: d->a = rnd(r, 4, (int64_t[]){64, 64, 28, 28}, -1, 1, true); break;
    case BMM:
        d->a = rnd(r, 3, (int64_t[]){256, 128, 64}, -1, 1, true);
        d->b = rnd(r, 3, (int64_t[]){256, 64, 128}, -1, 1, true);
        break;
    case MATMUL:
        d->a = rnd(r, 3, (int64_t[]){32, 128, 512}, -1, 1, true);
        d->b = rnd(r, 2, (int64_t[]){512, 512}, -1, 1, true);
        break;
    case ADAPTIVE: d->a = rnd(r, 4, (int64_t[]){64, 512, 7, 7}, -1, 1, true); break;
    default: break;
    }
    ts_tensor *y = fwd(op, d);
    d->gy = rnd(r, ts_tensor_ndim(y), ts_tensor_shape(y), -1, 1, false);
    ts_tensor_release(y);
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void run(opid op, opdata *d, int iters, double *med, double *best) {
    double *t = malloc(sizeof(double) * (size_t)iters);
    for (int i = -2; i < iters; i++) {
        ts_tensor_zero_grad(d->a);
        if (d->b) ts_tensor_zero_grad(d->b);
        double t0 = ts_time_now();
        ts_tensor *y = fwd(op, d);
        check(ts_backward(y, d->gy, false));
        ts_tensor_release(y);
        if (i >= 0) t[i] = (ts_time_now() - t0) * 1e3;
    }
    qsort(t, (size_t)iters, sizeof(double), cmp);
    *med = t[iters / 2];
    *best = t[0];
    free(t);
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 10;
    int only = argc > 2 ? atoi(argv[2]) : 0;
    if (iters < 1) iters = 1;
    ts_rng r;
    ts_rng_seed(&r, 1);
    printf("%-40s %8s %18s\n", "op (forward + backward)", "threads", "median / best ms");
    for (int op = 0; op < NOPS; op++) {
        opdata d;
        setup((opid)op, &r, &d);
        for (int th = 1; th <= 2; th++) {
            if (only && th != only) continue;
            ts_set_num_threads(th);
            double med, best;
            run((opid)op, &d, iters, &med, &best);
            printf("%-40s %8d %9.2f / %6.2f\n", names[op], th, med, best);
            fflush(stdout);
        }
        ts_tensor_release(d.a);
        ts_tensor_release(d.b);
        ts_tensor_release(d.gy);
    }
    return 0;
}
