/*
 * bench/attention.c — ts_scaled_dot_product_attention forward + backward at one size, for
 * bench/attention_vs_pytorch.py (which runs it once per T, so each process's peak resident memory is
 * its own, beside PyTorch's F.scaled_dot_product_attention in the same way).
 *
 * usage: bench_attention T [B H D ITERS CAUSAL]      (defaults 2 8 64 5 1)
 *        bench_attention gemm N                      (sgemm GFLOP/s of an N^3 ts_matmul: the FLOP limit)
 * Prints one line "key=value ..." : ms (median forward + backward), best_ms, peak_alloc_mib (the device
 * allocator's peak during the first forward + backward beyond the inputs), peak_rss_mib (the process's
 * peak resident memory during it beyond what was resident before: /proc/self/clear_refs resets the
 * high-water mark), gflops (model FLOPs, 4 T^2 D forward + 10 T^2 D backward per head, halved when causal,
 * over the median time).
 */
#include "tessera.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(ts_status s) {
    if (s != TS_OK) {
        fprintf(stderr, "bench_attention: %s\n", ts_last_error());
        exit(1);
    }
}

/* VmRSS or VmHWM from /proc/self/status, in bytes (0 if unreadable). */
static double proc_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double v = 0;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n)) v = atof(line + n + 1) * 1024.0;
    if (f) fclose(f);
    return v;
}

static void reset_hwm(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}

static ts_tensor *rnd(ts_rng *r, int64_t B, int64_t H, int64_t T, int64_t D, bool grad) {
    ts_tensor *t = NULL;
    check(ts_tensor_empty(ts_device_cpu(), TS_F32, 4, (int64_t[]){B, H, T, D}, &t));
    check(ts_tensor_uniform_(t, -1, 1, r));
    ts_tensor_set_requires_grad(t, grad);
    return t;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void gemm_rate(int64_t N) {
    ts_rng r;
    ts_rng_seed(&r, 1);
    ts_tensor *a = NULL, *b = NULL;
    check(ts_tensor_empty(ts_device_cpu(), TS_F32, 2, (int64_t[]){N, N}, &a));
    check(ts_tensor_empty(ts_device_cpu(), TS_F32, 2, (int64_t[]){N, N}, &b));
    check(ts_tensor_uniform_(a, -1, 1, &r));
    check(ts_tensor_uniform_(b, -1, 1, &r));
    double best = 1e30;
    for (int i = 0; i < 6; i++) {
        ts_tensor *c = NULL;
        double t0 = ts_time_now();
        check(ts_matmul(a, b, &c));
        double t = ts_time_now() - t0;
        best = i && t < best ? t : best; /* the first is a warm-up */
        ts_tensor_release(c);
    }
    printf("gemm_gflops=%.1f n=%lld threads=%d library=%s\n", 2.0 * N * N * N / best / 1e9, (long long)N,
           ts_get_num_threads(), ts_cpu_gemm_library());
    ts_tensor_release(a);
    ts_tensor_release(b);
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "gemm")) {
        gemm_rate(argc > 2 ? atoll(argv[2]) : 1024);
        return 0;
    }
    if (argc < 2) {
        fprintf(stderr, "usage: bench_attention T [B H D ITERS CAUSAL] | bench_attention gemm N\n");
        return 2;
    }
    const int64_t T = atoll(argv[1]), B = argc > 2 ? atoll(argv[2]) : 2, H = argc > 3 ? atoll(argv[3]) : 8;
    const int64_t D = argc > 4 ? atoll(argv[4]) : 64;
    const int iters = argc > 5 ? atoi(argv[5]) : 5;
    const bool causal = argc > 6 ? atoi(argv[6]) != 0 : true;
    ts_rng r;
    ts_rng_seed(&r, 7);
    ts_tensor *q = rnd(&r, B, H, T, D, true), *k = rnd(&r, B, H, T, D, true), *v = rnd(&r, B, H, T, D, true);
    ts_tensor *g = rnd(&r, B, H, T, D, false);
    ts_device *dev = ts_device_cpu();
    double *ms = calloc((size_t)iters + 1, sizeof(double)), peak_alloc = 0, peak_rss = 0;
    for (int i = 0; i <= iters; i++) { /* iteration 0: the cold one, where memory is measured */
        const double rss0 = proc_kb("VmRSS:"), alloc0 = (double)ts_device_memory_allocated(dev);
        if (i == 0) {
            reset_hwm();
            ts_device_memory_reset_peak(dev);
        }
        ts_tensor *o = NULL;
        const double t0 = ts_time_now();
        check(ts_scaled_dot_product_attention(q, k, v, causal, 0.0, &o));
        check(ts_backward(o, g, false));
        ms[i] = (ts_time_now() - t0) * 1e3;
        if (i == 0) {
            peak_alloc = (double)ts_device_memory_peak(dev) - alloc0;
            peak_rss = proc_kb("VmHWM:") - rss0;
        }
        ts_tensor_release(o);
        ts_tensor *leaves[3] = {q, k, v};
        for (int j = 0; j < 3; j++) ts_tensor_zero_grad(leaves[j]);
    }
    qsort(ms + 1, (size_t)iters, sizeof(double), cmp);
    const double med = ms[1 + iters / 2], flops = (4.0 + 10.0) * (double)(T * T) * D * B * H * (causal ? 0.5 : 1.0);
    printf("T=%lld B=%lld H=%lld D=%lld causal=%d threads=%d ms=%.2f best_ms=%.2f peak_alloc_mib=%.2f "
           "peak_rss_mib=%.2f inputs_mib=%.2f gflops=%.1f\n",
           (long long)T, (long long)B, (long long)H, (long long)D, causal, ts_get_num_threads(), med, ms[1],
           peak_alloc / 1048576.0, peak_rss / 1048576.0, 4.0 * B * H * T * D * 4 / 1048576.0, flops / med / 1e6);
    free(ms);
    ts_tensor_release(q);
    ts_tensor_release(k);
    ts_tensor_release(v);
    ts_tensor_release(g);
    return 0;
}
