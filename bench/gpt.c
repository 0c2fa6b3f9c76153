/*
 * bench/gpt.c — a GPT-2 (ts_model_gpt) training step's forward + backward (logits, cross-entropy, backward) at
 * one size, and the cached generation's tokens per second, for bench/gpt_vs_pytorch.py.
 *
 * usage: bench_gpt [N_LAYER N_HEAD N_EMBD B T VOCAB ITERS GEN_TOKENS]   (defaults 4 4 256 8 256 8192 5 128)
 * Prints one line "key=value ...": ms (the median forward + backward after a first one), tok_s (B T / ms),
 * gen_tok_s (greedy tokens per second of ts_gpt_generate from a one-token prompt, GEN_TOKENS of them),
 * params. Random weights (GPT-2's initialisation), random tokens; float32; the threads are Tessera's default
 * (OMP_NUM_THREADS / TS_NUM_THREADS).
 */
#include "tessera.h"

#include <stdio.h>
#include <stdlib.h>

static void check(ts_status s) {
    if (s != TS_OK) {
        fprintf(stderr, "bench_gpt: %s\n", ts_last_error());
        exit(1);
    }
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    long long v[8] = {4, 4, 256, 8, 256, 8192, 5, 128};
    for (int i = 1; i < argc && i <= 8; i++) v[i - 1] = atoll(argv[i]);
    ts_gpt_config c = TS_GPT_CONFIG_INIT;
    c.n_layer = v[0];
    c.n_head = v[1];
    c.n_embd = v[2];
    c.seq_len = v[4] > v[7] + 1 ? v[4] : v[7] + 1;
    c.vocab_size = v[5];
    const int64_t B = v[3], T = v[4];
    const int iters = (int)v[6];
    ts_rng r;
    ts_rng_seed(&r, 1);
    ts_module *m = NULL;
    check(ts_model_gpt(&c, &r, &m));
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(B * T) * 2);
    for (int64_t i = 0; i < 2 * B * T; i++) ids[i] = (int64_t)ts_rng_below(&r, (uint64_t)c.vocab_size);
    ts_tensor *x = NULL, *t = NULL;
    check(ts_tensor_from_data(NULL, TS_I64, 2, (int64_t[]){B, T}, ids, &x));
    check(ts_tensor_from_data(NULL, TS_I64, 1, (int64_t[]){B * T}, ids + B * T, &t));
    double *ms = malloc(sizeof(double) * (size_t)(iters + 1));
    for (int it = 0; it <= iters; it++) {
        ts_tensor *y = NULL, *y2 = NULL, *loss = NULL;
        const double t0 = ts_time_now();
        check(ts_module_forward(m, x, &y));
        check(ts_reshape(y, 2, (int64_t[]){B * T, c.vocab_size}, &y2));
        check(ts_cross_entropy(y2, t, 0.0f, &loss));
        check(ts_backward(loss, NULL, false));
        ms[it] = (ts_time_now() - t0) * 1e3;
        ts_module_zero_grad(m);
        ts_tensor_release(y);
        ts_tensor_release(y2);
        ts_tensor_release(loss);
    }
    qsort(ms + 1, (size_t)iters, sizeof(double), cmp);
    const double med = ms[1 + iters / 2];
    int64_t prompt = 0, *out = malloc(sizeof(int64_t) * (size_t)v[7]), n = 0;
    ts_gpt_sample_config sc = TS_GPT_SAMPLE_CONFIG_INIT;
    sc.max_new_tokens = v[7];
    sc.temperature = 0;
    const double g0 = ts_time_now();
    check(ts_gpt_generate(m, &prompt, 1, &sc, out, &n));
    const double gs = ts_time_now() - g0;
    printf("ms=%.2f tok_s=%.0f gen_tok_s=%.1f params=%lld threads=%d\n", med, (double)(B * T) / med * 1e3,
           (double)n / gs, (long long)ts_module_num_parameters(m), ts_get_num_threads());
    free(out);
    free(ms);
    free(ids);
    ts_tensor_release(x);
    ts_tensor_release(t);
    ts_module_free(m);
    return 0;
}
