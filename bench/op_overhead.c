/*
 * bench/op_overhead.c — the cost of one tiny op called from C, the floor under the per-op overhead that
 * bench/python_op_overhead.py measures from Python: ts_add of two 1-element tensors and ts_matmul of two
 * 64x64 matrices (each call allocates its result; released at once), grad mode off, one thread. Prints one
 * JSON line per op: the best of 7 trials of ITERS calls, in microseconds per call.
 *
 * usage: bench_op_overhead [ITERS]   (default 20000)
 */
#include "tessera.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef ts_status (*binary_fn)(const ts_tensor *, const ts_tensor *, ts_tensor **);

/* Best microseconds per call of fn(a, b) over 7 trials of iters calls; -1 on failure. */
static double best_us(binary_fn fn, const ts_tensor *a, const ts_tensor *b, long iters) {
    double best = 1e30;
    for (int trial = 0; trial < 7; trial++) {
        double t0 = now();
        for (long i = 0; i < iters; i++) {
            ts_tensor *out = NULL;
            if (fn(a, b, &out) != TS_OK) {
                fprintf(stderr, "bench_op_overhead: %s\n", ts_last_error());
                return -1;
            }
            ts_tensor_release(out);
        }
        double us = (now() - t0) * 1e6 / (double)iters;
        if (us < best) best = us;
    }
    return best;
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? strtol(argv[1], NULL, 10) : 20000;
    if (iters < 1) iters = 1;
    ts_set_num_threads(1);
    ts_grad_set_enabled(false);
    int64_t one[1] = {1}, sq[2] = {64, 64};
    ts_tensor *a1 = NULL, *b1 = NULL, *a64 = NULL, *b64 = NULL;
    if (ts_tensor_full(ts_device_cpu(), 1, one, 1.0f, &a1) != TS_OK ||
        ts_tensor_full(ts_device_cpu(), 1, one, 2.0f, &b1) != TS_OK ||
        ts_tensor_full(ts_device_cpu(), 2, sq, 0.5f, &a64) != TS_OK ||
        ts_tensor_full(ts_device_cpu(), 2, sq, 0.25f, &b64) != TS_OK) {
        fprintf(stderr, "bench_op_overhead: %s\n", ts_last_error());
        return 1;
    }
    double add = best_us(ts_add, a1, b1, iters), mm = best_us(ts_matmul, a64, b64, iters / 10 + 1);
    printf("{\"op\": \"add_1\", \"us\": %.3f}\n{\"op\": \"matmul_64\", \"us\": %.3f}\n", add, mm);
    ts_tensor_release(a1);
    ts_tensor_release(b1);
    ts_tensor_release(a64);
    ts_tensor_release(b64);
    return add < 0 || mm < 0;
}
