/*
 * bench/gpt.c — a GPT-2 (ts_model_gpt) training step's forward + backward (logits, cross-entropy, backward) at
 * one size, and the cached generation's tokens per second, for bench/gpt_vs_pytorch.py.
 *
 * usage: bench_gpt [N_LAYER N_HEAD N_EMBD B T VOCAB ITERS GEN_TOKENS]   (defaults 4 4 256 8 256 8192 5 128)
 * Prints one line "key=value ...": ms (the median training step after a first one: forward, cross-entropy,
 * backward and AdamW's update with GPT-2's decay groups, as nanoGPT and llm.c step), tok_s (B T / ms), fb_ms
 * (the forward + backward of those steps alone), gen_tok_s (greedy tokens per second of ts_gpt_generate from a
 * one-token prompt, GEN_TOKENS of them; 0 skips it), params. Random weights (GPT-2's initialisation), random tokens; float32; the threads are Tessera's default
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
    ts_tensor_list params = TS_TENSOR_LIST_INIT;
    check(ts_module_parameters(m, &params));
    ts_adamw_config ac = TS_ADAMW_CONFIG_INIT;
    ac.lr = 6e-4f;
    ac.beta2 = 0.95f;
    ac.weight_decay = 0.1f;
    ts_optimizer *opt = NULL;
    check(ts_optim_adamw_new(&params, &ac, &opt));
    check(ts_optimizer_set_decay_rule(opt, TS_DECAY_MATRICES));
    double *ms = malloc(sizeof(double) * (size_t)(iters + 1) * 2), *fb = ms + iters + 1;
    for (int it = 0; it <= iters; it++) {
        ts_tensor *y = NULL, *y2 = NULL, *loss = NULL;
        const double t0 = ts_time_now();
        check(ts_module_forward(m, x, &y));
        check(ts_reshape(y, 2, (int64_t[]){B * T, c.vocab_size}, &y2));
        check(ts_cross_entropy(y2, t, 0.0f, &loss));
        check(ts_backward(loss, NULL, false));
        fb[it] = (ts_time_now() - t0) * 1e3;
        check(ts_optimizer_step(opt));
        ts_optimizer_zero_grad(opt);
        ms[it] = (ts_time_now() - t0) * 1e3;
        ts_tensor_release(y);
        ts_tensor_release(y2);
        ts_tensor_release(loss);
    }
    qsort(ms + 1, (size_t)iters, sizeof(double), cmp);
    qsort(fb + 1, (size_t)iters, sizeof(double), cmp);
    const double med = ms[1 + iters / 2], fb_med = fb[1 + iters / 2];
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&params);
    int64_t prompt = 0, *out = malloc(sizeof(int64_t) * (size_t)v[7]), n = 0;
    ts_gpt_sample_config sc = TS_GPT_SAMPLE_CONFIG_INIT;
    sc.max_new_tokens = v[7];
    sc.temperature = 0;
    const double g0 = ts_time_now();
    if (sc.max_new_tokens > 0) check(ts_gpt_generate(m, &prompt, 1, &sc, out, &n));
    const double gs = ts_time_now() - g0;
    printf("ms=%.2f tok_s=%.0f fb_ms=%.2f gen_tok_s=%.1f params=%lld threads=%d\n", med,
           (double)(B * T) / med * 1e3, fb_med, n ? (double)n / gs : 0.0, (long long)ts_module_num_parameters(m),
           ts_get_num_threads());
    free(out);
    free(ms);
    free(ids);
    ts_tensor_release(x);
    ts_tensor_release(t);
    ts_module_free(m);
    return 0;
}
